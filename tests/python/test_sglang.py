#!/usr/bin/python3
"""prefixd.sglang.PrefixdRadixCache (SGLang's prefix-cache interface) against
the real daemon, with a paged KV allocator that refuses double frees.

SemanticsCase runs at page sizes 1, 2 and 4, once per generation of SGLang's
interface: the older one (keys, insert returns an int) and the newer one
(MatchPrefixParams, InsertParams, EvictParams; insert returns an
InsertResult). It covers SGLang's RadixCache semantics (page-aligned match
lengths, sizes, lock deltas, eviction, extra_key and cache_salt isolation,
value=None), the diagnostics SGLang's scheduler calls when memory runs out
(pretty_print, all_values_flatten, available_and_evictable_str), and
cache_finished_req / cache_unfinished_req on stand-ins with the fields of
SGLang's Req and req_to_token_pool, checking the page ledger after each
step: free + held by requests + cached == the pool, and the cached pages
are exactly the daemon's Dump.

InterfaceTest (its own daemon per test) covers start-up, reset and epoch
changes; SchedulerTest drives the cache the way SGLang's scheduler does over
Mooncake requests.

Usage: test_sglang.py --prefixd PATH [--stubs DIR] [--trace FILE]
"""

import contextlib
import io
import os
import unittest
from dataclasses import dataclass
from typing import Any

import common

ARGS = common.setup(__doc__, extra=lambda ap: ap.add_argument(
    "--trace", default=os.path.join(common.REPO, "tests", "data", "mooncake",
                                    "synthetic_trace.jsonl")))

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import engine_sim  # noqa: E402
from prefixd.sglang import (EvictResult, InsertResult, PrefixdRadixCache,  # noqa: E402
                            PrefixEvicted, finish_request, namespace_of)

TOKEN_KIB = 128  # KV bytes per token of the daemon's default model (Llama-3-8B fp16)


def daemon_config(page_size, pool_pages):
    """Twice the pool, so that only evict() evicts."""
    return 'kv_budget: "%dKiB"\nblock_size: %d\n' % (2 * pool_pages * page_size * TOKEN_KIB,
                                                    page_size)


class PagedAllocator:
    """SGLang's paged token_to_kv_pool_allocator, reduced: pages 1..n (0 is
    SGLang's padding page), slots page*P .. page*P+P-1; free() takes slot
    indices and frees the pages they fall in."""

    def __init__(self, n_pages, page_size):
        self.n = n_pages
        self.p = page_size
        self.free_pages = list(range(1, n_pages + 1))

    def alloc(self, n_tokens):
        k = -(-n_tokens // self.p)
        if k > len(self.free_pages):
            return None
        pages, self.free_pages = self.free_pages[:k], self.free_pages[k:]
        return [pg * self.p + j for pg in pages for j in range(self.p)][:n_tokens]

    def free(self, indices):
        pages = sorted({i // self.p for i in indices})
        for pg in pages:
            assert 1 <= pg <= self.n, "page %d is not in the pool" % pg
            assert pg not in self.free_pages, "page %d freed twice" % pg
        self.free_pages += pages

    def available_size(self):
        return len(self.free_pages) * self.p


# ---- stand-ins for SGLang's classes, with the fields the cache reads ----

class RadixKey:
    def __init__(self, token_ids, extra_key=None, cache_salt=None):
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.cache_salt = cache_salt


@dataclass
class MatchPrefixParams:
    key: Any
    req: Any = None


@dataclass
class InsertParams:
    key: Any = None
    value: Any = None
    chunked: bool = False
    priority: int = 0


@dataclass
class EvictParams:
    num_tokens: int = 0


class ReqToTokenPool:
    """req_to_token[row, :n] (a 2-D tensor in SGLang), write((row, slice),
    values), free(row)."""

    def __init__(self, rows, width):
        self.rows = [[0] * width for _ in range(rows)]
        self.freed_rows = []

    class _Rows:
        def __init__(self, rows):
            self.rows = rows

        def __getitem__(self, index):
            row, cols = index
            return self.rows[row][cols]

    @property
    def req_to_token(self):
        return self._Rows(self.rows)

    def write(self, index, values):
        row, cols = index
        self.rows[row][cols] = list(values)

    def free(self, row):
        self.freed_rows.append(row)


class OlderReq:
    """SGLang's Req as older caches read it: the prefix it got is
    prefix_indices; the cache frees its req_to_token row."""

    def __init__(self, row, origin_input_ids, extra_key=None):
        self.req_pool_idx = row
        self.origin_input_ids = list(origin_input_ids)
        self.output_ids = []
        self.fill_ids = list(origin_input_ids)
        self.extra_key = extra_key
        self.last_node = None
        self.prefix_indices = []


class NewerReq(OlderReq):
    """Newer SGLang: cache_protected_len and pop_committed_kv_cache(); its
    caller frees the row."""

    def __init__(self, row, origin_input_ids, extra_key=None, cache_salt=None):
        super().__init__(row, origin_input_ids, extra_key)
        self.cache_salt = cache_salt
        self.cache_protected_len = 0
        self.kv_committed_len = 0
        self.kv_committed_freed = False

    def pop_committed_kv_cache(self):
        assert not self.kv_committed_freed, "committed KV popped twice"
        self.kv_committed_freed = True
        return self.kv_committed_len


class Older:
    """SGLang's older calls: keys, insert -> int, evict(int)."""
    name = "Older"
    Req = OlderReq

    @staticmethod
    def match(cache, key):
        return cache.match_prefix(key)

    @staticmethod
    def insert(test, cache, key, value):
        r = cache.insert(key, value)
        test.assertIs(type(r), int)
        return r

    @staticmethod
    def evict(cache, n):
        return cache.evict(n)


class Newer:
    """SGLang's newer calls: parameter objects, insert -> InsertResult."""
    name = "Newer"
    Req = NewerReq

    @staticmethod
    def match(cache, key):
        return cache.match_prefix(MatchPrefixParams(key=key))

    @staticmethod
    def insert(test, cache, key, value):
        r = cache.insert(InsertParams(key=key, value=value))
        test.assertIsInstance(r, InsertResult)
        return r.prefix_len

    @staticmethod
    def evict(cache, n):
        return cache.evict(EvictParams(num_tokens=n))


class SemanticsCase:
    """Mixed into one unittest class per (page size, generation) below."""
    P = 0
    GEN = None
    POOL = 48  # pages

    @classmethod
    def setUpClass(cls):
        if not ARGS.prefixd:
            raise unittest.SkipTest("--prefixd not given")
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, daemon_config(cls.P, cls.POOL))
        cls.daemon.start()
        cls.client = prefixd.Client(cls.daemon.unix, deadline=10,
                                    channel_options=prefixd_fixture.FAST_RECONNECT)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()

    def setUp(self):
        self.alloc = PagedAllocator(self.POOL, self.P)
        self.pool = ReqToTokenPool(8, 16 * self.P)
        self.cache = PrefixdRadixCache(self.client, self.alloc, self.P,
                                       req_to_token_pool=self.pool)
        self.filled = {}  # request row -> slots written

    def tokens(self, first, n_pages, tail=0):
        """n_pages pages of tokens unique to `first`, then `tail` more."""
        return [first * 1000 + i for i in range(n_pages * self.P + tail)]

    def insert(self, key, value):
        return self.GEN.insert(self, self.cache, key, value)

    def match(self, key):
        return self.GEN.match(self.cache, key)

    def cache_new(self, key):
        """Allocates the key's slots and inserts them (nothing cached yet)."""
        kv = self.alloc.alloc(len(key.token_ids))
        self.assertEqual(self.insert(key, kv), 0)
        return kv

    def assert_ledger(self, held=()):
        """free + held by requests + cached == the pool; cached == Dump."""
        p = self.P
        cached = {s // p for s in self.cache.all_values_flatten()}
        free, held = set(self.alloc.free_pages), set(held)
        self.assertFalse(free & cached or free & held or held & cached, "a page counted twice")
        self.assertEqual(len(free) + len(held) + len(cached), self.POOL)
        self.assertEqual(len(cached), len(self.cache.cached_pages()))
        names = set(self.client.dump("").namespaces) | {""}
        dumped = [b for ns in names for b in self.client.cached_block_ids(ns)]
        self.assertEqual(sorted(dumped), sorted(self.cache.cached_pages()))
        self.assertEqual(self.cache.total_size(), len(cached) * p)
        self.assertEqual(self.cache.evictable_size() + self.cache.protected_size(),
                         self.cache.total_size())

    # ---- match, insert, sizes ----

    def test_match_lengths_are_page_aligned(self):
        p = self.P
        kv = self.cache_new(RadixKey(self.tokens(1, 3)))
        self.assertEqual((self.cache.total_size(), self.cache.evictable_size()), (3 * p, 3 * p))
        m = self.match(RadixKey(self.tokens(1, 2) + [7] * (p + 1)))
        self.assertEqual(m.device_indices, kv[:2 * p])
        self.assertIs(m.last_device_node, m.last_host_node)
        self.assertEqual(len(m.last_device_node), 2 * p)
        self.assertEqual(self.match(RadixKey(self.tokens(1, 3, tail=p - 1))).device_indices, kv)
        self.assertEqual(self.match(RadixKey(self.tokens(1, 1))).device_indices, kv[:p])
        miss = self.match(RadixKey(self.tokens(2, 2)))
        self.assertEqual(miss.device_indices, [])
        self.assertIs(miss.last_device_node, self.cache.root_node)
        self.assertIs(self.match(RadixKey([])).last_device_node, self.cache.root_node)
        self.assert_ledger()

    def test_insert_returns_the_cached_prefix_length(self):
        p = self.P
        kv = self.cache_new(RadixKey(self.tokens(1, 2)))
        kv2 = self.alloc.alloc(3 * p)
        self.assertEqual(self.insert(RadixKey(self.tokens(1, 3)), kv2), 2 * p)
        self.alloc.free(kv2[:2 * p])  # the caller frees its duplicates, as SGLang does
        self.assertEqual(self.match(RadixKey(self.tokens(1, 3))).device_indices,
                         kv + kv2[2 * p:])
        self.assertEqual(self.insert(RadixKey(self.tokens(1, 3)), kv + kv2[2 * p:]), 3 * p)
        self.assert_ledger()

    def test_only_whole_pages_are_cached(self):
        p = self.P
        kv = self.alloc.alloc(2 * p + p - 1)  # two pages and a partial one
        self.assertEqual(self.insert(RadixKey(self.tokens(1, 2, tail=p - 1)), kv), 0)
        self.assertEqual(self.cache.total_size(), 2 * p)
        self.alloc.free(kv[2 * p:])  # the tail stays the caller's
        self.assertEqual(self.match(RadixKey(self.tokens(1, 2, tail=p - 1))).device_indices,
                         kv[:2 * p])
        self.assert_ledger()

    def test_insert_without_value_caches_the_token_ids(self):
        """SGLang: value=None means the token ids are the values (its
        simulated caches); repeated tokens repeat values, which must not
        clash as prefixd block IDs, within a namespace or across them."""
        cache = PrefixdRadixCache(self.client, None, self.P)
        p = self.P
        toks = [5 + i % p for i in range(2 * p)] + [9] * (p - 1)
        for extra in (None, "a"):
            key = RadixKey(toks, extra)
            r = cache.insert(InsertParams(key=key) if self.GEN is Newer else key)
            self.assertEqual(r.prefix_len if self.GEN is Newer else r, 0)
            self.assertEqual(self.match_on(cache, RadixKey(toks, extra)).device_indices,
                             toks[:2 * p])
        self.assertEqual(cache.total_size(), 4 * p)
        self.assertEqual(sorted(cache.all_values_flatten()), sorted(toks[:2 * p] * 2))
        self.assertEqual(self.GEN.evict(cache, 4 * p).num_tokens_evicted, 4 * p)  # frees nothing
        self.assertEqual(cache.total_size(), 0)

    def match_on(self, cache, key):
        return self.GEN.match(cache, key)

    def test_insert_refuses_a_value_of_another_length(self):
        kv = self.alloc.alloc(2 * self.P)
        with self.assertRaisesRegex(ValueError, r"%d tokens but %d values"
                                    % (2 * self.P, 2 * self.P - 1)):
            self.insert(RadixKey(self.tokens(1, 2)), kv[1:])
        self.assertEqual(self.cache.total_size(), 0)
        self.assertEqual(self.client.cached_block_ids(), [])
        self.alloc.free(kv)
        self.assert_ledger()

    # ---- namespaces ----

    def test_extra_key_isolates(self):
        """Each extra key (None and "" included) is its own tree."""
        p = self.P
        kvs = {extra: self.cache_new(RadixKey(self.tokens(1, 2), extra))
               for extra in ("key1", "key2", None, "")}
        for extra, kv in kvs.items():
            self.assertEqual(self.match(RadixKey(self.tokens(1, 2), extra)).device_indices, kv)
        self.assertEqual(self.match(RadixKey(self.tokens(1, 2), "other")).device_indices, [])
        self.assertEqual(self.cache.total_size(), 8 * p)
        self.assert_ledger()

    def test_cache_salt_partitions_like_the_extra_key(self):
        """Same extra_key, different salts: separate trees; same salt:
        shared. A salt without an extra key is not the extra key."""
        t = self.tokens(1, 2)
        a = self.cache_new(RadixKey(t, "lora", cache_salt="alice"))
        b = self.cache_new(RadixKey(t, "lora", cache_salt="bob"))
        self.assertNotEqual(a, b)
        self.assertEqual(self.match(RadixKey(t, "lora", cache_salt="alice")).device_indices, a)
        self.assertEqual(self.match(RadixKey(t, "lora", cache_salt="bob")).device_indices, b)
        for other in (RadixKey(t, "lora"), RadixKey(t, cache_salt="lora"),
                      RadixKey(t, "lora", cache_salt="carol")):
            self.assertEqual(self.match(other).device_indices, [])
        self.assertEqual(self.insert(RadixKey(t, "lora", cache_salt="bob"), b), 2 * self.P)
        self.assert_ledger()

    def test_namespaces_are_valid_for_any_key(self):
        """Spaces, non-ASCII and very long keys still name a namespace the
        daemon accepts, each its own."""
        t = self.tokens(1, 1)
        keys = [("a b", None), ("ü,s=x", None), ("a b", "ü"), ("x" * 500, None),
                ("x" * 500, "y")]
        kvs = [self.cache_new(RadixKey(t, e, cache_salt=s)) for e, s in keys]
        for (e, s), kv in zip(keys, kvs):
            self.assertEqual(self.match(RadixKey(t, e, cache_salt=s)).device_indices, kv)
        self.assertEqual(len({namespace_of(e, s) for e, s in keys}), len(keys))
        self.assert_ledger()

    # ---- locks and eviction ----

    def test_lock_refs_protect_and_report_deltas(self):
        p = self.P
        self.cache_new(RadixKey(self.tokens(1, 3)))
        a = self.match(RadixKey(self.tokens(1, 3))).last_device_node
        b = self.match(RadixKey(self.tokens(1, 2))).last_device_node
        self.assertEqual(self.cache.inc_lock_ref(a), -3 * p)
        self.assertEqual(self.cache.inc_lock_ref(b), 0)  # already protected by a
        self.assertEqual((self.cache.evictable_size(), self.cache.protected_size()), (0, 3 * p))
        self.assertEqual(self.GEN.evict(self.cache, 10 * p), EvictResult(0))
        self.assertEqual(self.cache.dec_lock_ref(a), p)  # the third page is free to go
        self.assertEqual(self.GEN.evict(self.cache, 1), EvictResult(p))
        self.assertEqual(self.cache.dec_lock_ref(b), 2 * p)
        self.assertEqual(self.cache.inc_lock_ref(self.cache.root_node), 0)
        self.assertEqual((self.cache.evictable_size(), self.cache.protected_size()), (2 * p, 0))
        self.assert_ledger()

    def test_evict_frees_the_least_recent_pages_through_the_allocator(self):
        p = self.P
        old = self.cache_new(RadixKey(self.tokens(1, 2)))
        recent = self.cache_new(RadixKey(self.tokens(2, 2)))
        self.match(RadixKey(self.tokens(1, 2)))  # now the most recent
        r = self.GEN.evict(self.cache, p + 1)
        self.assertIsInstance(r, EvictResult)
        self.assertEqual(r.num_tokens_evicted, 2 * p)
        self.assertEqual(sorted(self.alloc.free_pages[-2:]), sorted({s // p for s in recent}))
        self.assertEqual(self.match(RadixKey(self.tokens(1, 2))).device_indices, old)
        self.assertEqual(self.match(RadixKey(self.tokens(2, 2))).device_indices, [])
        self.assert_ledger()

    # ---- diagnostics ----

    def test_diagnostics_for_out_of_memory_and_leak_checks(self):
        p = self.P
        kv = self.cache_new(RadixKey(self.tokens(1, 3)))
        kv2 = self.cache_new(RadixKey(self.tokens(1, 1) + self.tokens(2, 1), "lora"))
        self.cache.inc_lock_ref(self.match(RadixKey(self.tokens(1, 1))).last_device_node)
        self.assertEqual(sorted(self.cache.all_values_flatten()), sorted(kv + kv2))
        available = self.alloc.available_size()
        self.assertEqual(self.cache.available_and_evictable_str(),
                         "Available tokens: %d (available_size=%d + evictable_size=%d, "
                         "protected_size=%d)\n" % (available + 4 * p, available, 4 * p, p))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertIsNone(self.cache.pretty_print())
        t = self.tokens(1, 3)
        # The lock split the default tree's node at its first page.
        self.assertEqual(out.getvalue(), "".join([
            "namespace '':\n",
            "    %d %s pages=1 pins=1\n" % (p, t[:p][:10]),
            "      %d %s pages=2 pins=0\n" % (2 * p, t[p:][:10]),
            "namespace %r:\n" % namespace_of("lora"),
            "    %d %s pages=2 pins=0\n" % (2 * p, (self.tokens(1, 1) + self.tokens(2, 1))[:10]),
            "#tokens: %d\n" % (5 * p)]))

    # ---- SGLang's request objects ----

    def start(self, row, prompt, fill=None, extra_key=None):
        """A request admitted as SGLang's scheduler admits it: match, lock,
        fill its req_to_token row with the cached prefix and new slots for
        the rest of its first chunk (`fill` tokens; all by default)."""
        req = self.GEN.Req(row, prompt, extra_key)
        m = self.match(RadixKey(prompt, extra_key))
        req.prefix_indices, req.last_node = list(m.device_indices), m.last_device_node
        if hasattr(req, "cache_protected_len"):
            req.cache_protected_len = len(m.device_indices)
        self.cache.inc_lock_ref(req.last_node)
        self.pool.write((row, slice(0, len(req.prefix_indices))), req.prefix_indices)
        self.filled[row] = len(req.prefix_indices)
        return self.extend(req, prompt[:fill])

    def grow(self, req, n):
        """n more slots in the request's row. Like SGLang's paged allocator,
        a partly filled last page is filled first: page i holds the row's
        tokens [i*P, (i+1)*P)."""
        row, p = req.req_pool_idx, self.P
        have = self.filled[row]
        slots = []
        if have % p:
            last = self.pool.rows[row][have - 1]
            slots = [last + 1 + i for i in range(min(n, p - have % p))]
        more = self.alloc.alloc(n - len(slots))
        self.assertIsNotNone(more, "the pool is too small for the test")
        slots += more
        self.pool.write((row, slice(have, have + n)), slots)
        self.filled[row] = have + n

    def extend(self, req, fill_ids):
        """The next chunk of prefill: fill_ids (a longer prefix of the prompt)."""
        self.grow(req, len(fill_ids) - self.filled[req.req_pool_idx])
        req.fill_ids = list(fill_ids)
        return req

    def finish(self, req, output_ids, is_insert=True):
        """Decoding produced output_ids (all but the last have KV)."""
        self.grow(req, len(output_ids) - 1)
        req.output_ids = list(output_ids)
        req.kv_committed_len = self.filled[req.req_pool_idx]
        self.cache.cache_finished_req(req, is_insert=is_insert)
        self.assertEqual(self.pool.freed_rows, [req.req_pool_idx] if self.GEN is Older else [])
        self.pool.freed_rows.clear()
        del self.filled[req.req_pool_idx]

    def held(self):
        """Pages the running requests hold that the cache does not."""
        p = self.P
        rows = {s // p for r, n in self.filled.items() for s in self.pool.rows[r][:n]}
        return rows - {s // p for s in self.cache.all_values_flatten()}

    def aligned(self, n):
        return n // self.P * self.P

    def test_cache_finished_req(self):
        prompt = self.tokens(1, 3, tail=1)
        committed = len(prompt) + 2  # three output tokens, the last without KV
        a = self.start(0, prompt)
        b = self.start(1, prompt)  # the same prompt, admitted before a finishes
        self.assert_ledger(self.held())
        self.finish(a, [7, 8, 9])  # the whole pages of its KV are cached
        self.assertEqual(self.cache.total_size(), self.aligned(committed))
        self.assert_ledger(self.held())
        self.finish(b, [7, 8, 9])  # its copies of a's pages are freed
        self.assertEqual(self.cache.total_size(), self.aligned(committed))
        self.assertEqual(self.cache.protected_size(), 0)
        self.assert_ledger()
        c = self.start(2, prompt)  # hits a's pages, and keeps them locked
        self.assertEqual(len(c.prefix_indices), self.aligned(len(prompt)))
        self.assertEqual(self.cache.protected_size(), self.aligned(len(prompt)))
        self.assert_ledger(self.held())
        self.finish(c, [5, 6], is_insert=False)
        self.assertEqual(self.cache.protected_size(), 0)
        self.assertEqual(self.cache.total_size(), self.aligned(committed))
        self.assert_ledger()

    def test_cache_unfinished_req_chunked_prefill(self):
        p = self.P
        prompt = self.tokens(1, 5, tail=1)
        chunk = 2 * p + 1
        k = self.aligned(chunk)  # what the first chunk caches
        a = self.start(0, prompt, fill=chunk)
        b = self.start(1, prompt, fill=chunk)
        b_own = self.pool.rows[1][:k]
        self.cache.cache_unfinished_req(a)
        a_slots = self.pool.rows[0][:k]
        self.assertEqual(a.prefix_indices, self.pool.rows[0][:chunk])
        self.assertEqual(len(a.last_node), k)
        self.assertEqual(self.cache.protected_size(), k)
        self.cache.cache_unfinished_req(b)  # a cached these pages first
        self.assertNotEqual(b_own, a_slots)
        self.assertEqual(self.pool.rows[1][:k], a_slots)  # b's row now points at them
        self.assertEqual(b.prefix_indices[:k], a_slots)
        self.assertEqual(len(b.prefix_indices), chunk)
        if self.GEN is Newer:
            self.assertEqual((a.cache_protected_len, b.cache_protected_len), (k, k))
        self.assertEqual(self.cache.protected_size(), k)
        self.assert_ledger(self.held())
        for req in (a, b):  # the second chunk: the whole prompt
            self.extend(req, prompt)
            self.cache.cache_unfinished_req(req)
            self.assertEqual(len(req.last_node), self.aligned(len(prompt)))
        whole = self.aligned(len(prompt))
        self.assertEqual(self.pool.rows[1][:whole], self.pool.rows[0][:whole])
        self.assertEqual(self.cache.protected_size(), self.aligned(len(prompt)))
        self.assert_ledger(self.held())
        self.finish(a, [3, 4])
        self.finish(b, [3, 4])
        self.assertEqual(self.cache.protected_size(), 0)
        self.assert_ledger()


for _p in (1, 2, 4):
    for _gen in (Older, Newer):
        _name = "Semantics%sP%d" % (_gen.name, _p)
        globals()[_name] = type(_name, (SemanticsCase, unittest.TestCase),
                                {"P": _p, "GEN": _gen})


# ---- start-up, reset, epoch changes: a daemon per test ----

P = 16          # page size = prefixd block size
N_PAGES = 128   # the KV pool


class Key:
    def __init__(self, token_ids, extra_key=None):
        self.token_ids = token_ids
        self.extra_key = extra_key


def tokens(first_page, n_pages, tail=0):
    return [b * P + j for b in range(first_page, first_page + n_pages) for j in range(P)] + \
        [10 ** 8 + first_page * P + j for j in range(tail)]


class SglangTestCase(unittest.TestCase):
    def setUp(self):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        self.daemon = prefixd_fixture.Daemon(ARGS.prefixd, daemon_config(P, N_PAGES // 2))
        self.addCleanup(self.daemon.close)
        self.daemon.start()
        self.client = prefixd.Client(self.daemon.unix, deadline=10,
                                     channel_options=prefixd_fixture.FAST_RECONNECT)
        self.addCleanup(self.client.close)
        self.alloc = PagedAllocator(N_PAGES, P)
        fingerprint = self.client.info().model_fingerprint
        self.cache = PrefixdRadixCache(self.client, self.alloc, P, model_fingerprint=fingerprint)

    def prefill(self, key_tokens, extra_key=None):
        """One request, start to finish, as SGLang's scheduler runs it."""
        key = Key(key_tokens, extra_key)
        m = self.cache.match_prefix(key)
        self.cache.inc_lock_ref(m.last_device_node)
        own = self.alloc.alloc(len(key_tokens) - len(m.device_indices))
        self.assertIsNotNone(own)
        kv = m.device_indices + own
        finish_request(self.cache, key, kv, len(m.device_indices), m.last_device_node)
        return m

    def assert_ledger(self, held_by_requests=0):
        free = set(self.alloc.free_pages)
        cached = {s // P for s in self.cache.all_values_flatten()}
        self.assertFalse(free & cached, "a page both free and cached")
        self.assertEqual(len(free) + held_by_requests + len(cached), N_PAGES)
        names = set(self.client.dump("").namespaces) | {""}
        dumped = [b for ns in names for b in self.client.cached_block_ids(ns)]
        self.assertEqual(sorted(dumped), sorted(self.cache.cached_pages()))
        self.assertEqual(self.cache.total_size(), len(cached) * P)
        self.assertEqual(self.cache.evictable_size() + self.cache.protected_size(),
                         self.cache.total_size())


class InterfaceTest(SglangTestCase):
    def test_page_size_must_equal_block_size(self):
        with self.assertRaisesRegex(ValueError, "page_size 32 != prefixd block_size 16"):
            PrefixdRadixCache(self.client, self.alloc, P * 2)

    def test_another_model_is_refused(self):
        with self.assertRaises(prefixd.FailedPrecondition):
            PrefixdRadixCache(self.client, self.alloc, P, model_fingerprint="0123456789abcdef")

    def test_locking_an_evicted_path_fails_loudly(self):
        self.prefill(tokens(0, 2))
        node = self.cache.match_prefix(Key(tokens(0, 2))).last_device_node
        self.cache.evict(2 * P)
        with self.assertRaises(PrefixEvicted):
            self.cache.inc_lock_ref(node)
        self.assertEqual(node.lock_ref, 0)

    def test_reset_forgets_everything_and_frees_nothing(self):
        self.prefill(tokens(0, 2))
        self.prefill(tokens(5, 1))
        locked = self.cache.match_prefix(Key(tokens(0, 2))).last_device_node
        self.cache.inc_lock_ref(locked)
        free = len(self.alloc.free_pages)
        self.cache.reset()  # SGLang's flush_cache clears the allocator itself
        self.assertEqual(len(self.alloc.free_pages), free)
        self.assertEqual(self.cache.total_size(), 0)
        self.assertEqual(self.client.cached_block_ids(), [])
        # A lock taken before the reset counts nothing after it.
        self.assertEqual(self.cache.dec_lock_ref(locked), 0)
        self.assertEqual((self.cache.evictable_size(), self.cache.protected_size()), (0, 0))
        with self.assertRaises(PrefixEvicted):
            self.cache.inc_lock_ref(locked)

    def test_a_new_engine_starts_from_an_empty_cache(self):
        self.prefill(tokens(0, 2))  # the previous engine process
        fresh = PagedAllocator(N_PAGES, P)
        cache = PrefixdRadixCache(self.client, fresh, P)
        self.assertEqual(cache.match_prefix(Key(tokens(0, 2))).device_indices, [])
        self.assertEqual(len(fresh.free_pages), N_PAGES)
        self.assertEqual(self.client.cached_block_ids(), [])

    def test_epoch_change_frees_cached_pages_and_locked_ones_on_unlock(self):
        self.prefill(tokens(0, 2))
        self.prefill(tokens(5, 2))
        locked = self.cache.match_prefix(Key(tokens(0, 2))).last_device_node
        self.cache.inc_lock_ref(locked)
        self.daemon.kill()  # no snapshot: the restarted daemon has a new epoch
        self.daemon.start()
        self.assertEqual(self.cache.match_prefix(Key(tokens(5, 2))).device_indices, [])
        self.assertEqual(len(self.alloc.free_pages), N_PAGES - 2)  # 5-6 freed, 0-1 locked
        self.assertEqual(self.cache.total_size(), 0)
        self.cache.dec_lock_ref(locked)
        self.assertEqual(len(self.alloc.free_pages), N_PAGES)
        self.assert_ledger()

    def test_indices_come_in_the_engines_type(self):
        """indices= (SGLang: a torch tensor) shapes every list of slots the
        cache hands out: matches, all_values_flatten, frees."""
        freed = []
        self.alloc.free = lambda slots: freed.append(slots)
        cache = PrefixdRadixCache(self.client, self.alloc, P, indices=tuple)
        kv = self.alloc.alloc(2 * P)
        cache.insert(Key(tokens(0, 2)), kv)
        self.assertEqual(cache.match_prefix(Key(tokens(0, 2))).device_indices, tuple(kv))
        self.assertEqual(cache.all_values_flatten(), tuple(kv))
        cache.evict(2 * P)
        self.assertEqual(len(freed), 1)  # one free() of both pages, leaf first
        self.assertIs(type(freed[0]), tuple)
        self.assertEqual(sorted(freed[0]), kv)

    def test_pretty_print_survives_an_unreachable_daemon(self):
        """The scheduler prints the tree when things go wrong: a daemon that
        is down then is reported, not raised."""
        self.prefill(tokens(0, 2))
        self.daemon.kill()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.cache.pretty_print()
        self.assertIn("prefixd tree unavailable", out.getvalue())
        self.assertTrue(out.getvalue().endswith("#tokens: %d\n" % (2 * P)))


class SchedulerTest(SglangTestCase):
    def test_scheduler_loop_keeps_the_page_ledger(self):
        """Mooncake requests (one page per hash id, plus an unaligned tail)
        in batches of 4; a batch finishes after the next one is admitted, so
        locks overlap and identical prompts race to insert."""
        self.assertTrue(os.path.exists(ARGS.trace), "trace %s missing" % ARGS.trace)
        reqs = [r for r in engine_sim.read_trace(ARGS.trace, 300)
                if len(r.hash_ids) <= N_PAGES // 8]
        reqs = reqs[:120] + reqs[:4]  # a repeat of the first batch: it should hit
        running, hits, evicted, waits = [], 0, 0, 0
        for start in range(0, len(reqs), 4):
            batch = []
            for r in reqs[start:start + 4]:
                key = Key([h * P + j for h in r.hash_ids for j in range(P)] +
                          [10 ** 8 + r.index * 8 + j for j in range(5)])
                m = self.cache.match_prefix(key)
                self.cache.inc_lock_ref(m.last_device_node)
                need = len(key.token_ids) - len(m.device_indices)
                own = self.alloc.alloc(need)
                while own is None:
                    short = need - self.alloc.available_size()
                    got = self.cache.evict(short).num_tokens_evicted
                    evicted += got
                    if got == 0:  # everything left is locked: finish running requests
                        waits += 1
                        self.assertTrue(running, "a request larger than the pool")
                        finish_request(self.cache, *running.pop(0))
                    own = self.alloc.alloc(need)
                hits += len(m.device_indices)
                batch.append((key, m.device_indices + own, len(m.device_indices),
                              m.last_device_node))
            for req in running:
                finish_request(self.cache, *req)
            running = batch
            held = sum(len({i // P for i in kv[prot:]}) for _, kv, prot, _ in running)
            self.assert_ledger(held_by_requests=held)
        for req in running:
            finish_request(self.cache, *req)
        self.assert_ledger()
        print("\n  %d requests: %d tokens hit, %d evicted, %d waits"
              % (len(reqs), hits, evicted, waits))
        self.assertGreater(evicted, 0, "the pool never ran dry")
        self.assertGreater(hits, 0)
        (t,) = self.client.stats().tenants
        self.assertEqual((t.pinned_blocks, t.active_leases), (0, 0))
        self.assertEqual(self.cache.protected_size(), 0)


if __name__ == "__main__":
    unittest.main()
