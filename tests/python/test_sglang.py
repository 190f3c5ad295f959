#!/usr/bin/python3
"""prefixd.sglang.PrefixdRadixCache (SGLang's prefix-cache interface) against
the real daemon, with a paged KV allocator that refuses double frees.

The unit tests follow SGLang's own RadixCache semantics (page alignment,
prefix lengths, lock deltas, evictable/protected sizes); the scheduler test
drives the cache the way SGLang's scheduler does (match_prefix,
inc_lock_ref, alloc or evict, prefill, cache_finished_req) over Mooncake
requests and checks the page ledger: free + held by requests + cached == N,
and the cached pages equal the daemon's Dump.

Usage: test_sglang.py --prefixd PATH [--stubs DIR] [--trace FILE]
"""

import os
import unittest

import common

ARGS = common.setup(__doc__, extra=lambda ap: ap.add_argument(
    "--trace", default=os.path.join(common.REPO, "tests", "data", "mooncake",
                                    "synthetic_trace.jsonl")))

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import engine_sim  # noqa: E402
from prefixd.sglang import (EvictResult, PrefixdRadixCache, PrefixEvicted,  # noqa: E402
                            finish_request)

P = 16          # page size = prefixd block size
N_PAGES = 128   # the KV pool


class PagedAllocator:
    """SGLang's paged token_to_kv_pool_allocator, reduced: pages 1..n (0 is
    SGLang's padding page), slots page*P .. page*P+P-1; free() takes slot
    indices and frees the pages they fall in."""

    def __init__(self, n_pages, page_size):
        self.n = n_pages
        self.p = page_size
        self.free_pages = list(range(1, n_pages + 1))
        self.freed = []

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
        self.freed += pages

    def available_size(self):
        return len(self.free_pages) * self.p


class Key:
    """Like SGLang's RadixKey."""

    def __init__(self, token_ids, extra_key=None):
        self.token_ids = token_ids
        self.extra_key = extra_key


class Params:
    """Like SGLang's MatchPrefixParams / InsertParams / EvictParams."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def tokens(first_page, n_pages, tail=0):
    return [b * P + j for b in range(first_page, first_page + n_pages) for j in range(P)] + \
        [10 ** 8 + first_page * P + j for j in range(tail)]


class SglangTestCase(unittest.TestCase):
    def setUp(self):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        self.daemon = prefixd_fixture.Daemon(
            ARGS.prefixd, 'kv_budget: "%dMiB"\nblock_size: %d\n' % (N_PAGES * 2, P))
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
        cached = self.cache.cached_pages()
        self.assertFalse(free & cached, "a page both free and cached")
        self.assertEqual(len(free) + held_by_requests + len(cached), N_PAGES)
        dumped = [b for ns in [""] + self.namespaces() for b in self.client.cached_block_ids(ns)]
        self.assertEqual(sorted(dumped), sorted(cached))
        self.assertEqual(self.cache.total_size(), len(cached) * P)
        self.assertEqual(self.cache.evictable_size() + self.cache.protected_size(),
                         self.cache.total_size())

    def namespaces(self):
        return [ns for ns in self.client.dump("").namespaces if ns]


class InterfaceTest(SglangTestCase):
    def test_page_size_must_equal_block_size(self):
        with self.assertRaises(ValueError):
            PrefixdRadixCache(self.client, self.alloc, P * 2)

    def test_another_model_is_refused(self):
        with self.assertRaises(prefixd.FailedPrecondition):
            PrefixdRadixCache(self.client, self.alloc, P, model_fingerprint="0123456789abcdef")

    def test_match_returns_slots_page_aligned(self):
        kv = self.alloc.alloc(3 * P)
        self.assertEqual(self.cache.insert(Key(tokens(0, 3)), kv), 0)
        m = self.cache.match_prefix(Key(tokens(0, 2) + [7] * 5))
        self.assertEqual(m.device_indices, kv[:2 * P])
        self.assertIs(m.last_device_node, m.last_host_node)
        self.assertEqual(len(m.last_device_node), 2 * P)
        self.assertEqual(self.cache.match_prefix(tokens(0, 3)).device_indices, kv)  # a list
        self.assertEqual(self.cache.match_prefix(Params(key=Key(tokens(0, 1)))).device_indices,
                         kv[:P])
        miss = self.cache.match_prefix(Key(tokens(9, 2)))
        self.assertEqual(miss.device_indices, [])
        self.assertIs(miss.last_device_node, self.cache.root_node)
        self.assertIs(self.cache.match_prefix(Key(tokens(0, 0, tail=5))).last_device_node,
                      self.cache.root_node)

    def test_insert_returns_the_cached_prefix_length(self):
        kv = self.alloc.alloc(2 * P)
        self.assertEqual(self.cache.insert(Key(tokens(0, 2)), kv), 0)
        kv2 = self.alloc.alloc(3 * P)
        self.assertEqual(self.cache.insert(Params(key=Key(tokens(0, 3)), value=kv2)), 2 * P)
        self.alloc.free(kv2[:2 * P])  # the caller frees its duplicates, as SGLang does
        self.assertEqual(self.cache.match_prefix(Key(tokens(0, 3))).device_indices,
                         kv + kv2[2 * P:])
        self.assert_ledger()

    def test_insert_refuses_values_that_are_not_whole_pages(self):
        kv = self.alloc.alloc(2 * P)
        with self.assertRaises(ValueError):
            self.cache.insert(Key(tokens(0, 2)), kv[P:] + kv[:P][::-1])
        with self.assertRaises(ValueError):
            self.cache.insert(Key(tokens(0, 1)), [i + 1 for i in kv[:P]])

    def test_extra_key_is_a_namespace(self):
        self.prefill(tokens(0, 2), extra_key="lora-a")
        self.assertEqual(self.cache.match_prefix(Key(tokens(0, 2))).device_indices, [])
        self.assertEqual(len(self.cache.match_prefix(Key(tokens(0, 2), "lora-a"))
                             .device_indices), 2 * P)
        self.assert_ledger()

    def test_lock_refs_protect_and_report_deltas(self):
        self.prefill(tokens(0, 3))
        a = self.cache.match_prefix(Key(tokens(0, 3))).last_device_node
        b = self.cache.match_prefix(Key(tokens(0, 2))).last_device_node
        self.assertEqual(self.cache.evictable_size(), 3 * P)
        self.assertEqual(self.cache.inc_lock_ref(a), -3 * P)
        self.assertEqual(self.cache.inc_lock_ref(b), 0)  # already protected by a
        self.assertEqual((self.cache.evictable_size(), self.cache.protected_size()), (0, 3 * P))
        self.assertEqual(self.cache.evict(10 * P).num_tokens_evicted, 0)
        self.assertEqual(self.cache.dec_lock_ref(a), P)  # the third page is free to go
        self.assertEqual(self.cache.evict(Params(num_tokens=1)), EvictResult(P))
        self.assertEqual(self.cache.dec_lock_ref(b), 2 * P)
        self.assertEqual(self.cache.inc_lock_ref(self.cache.root_node), 0)
        self.assert_ledger()

    def test_evict_frees_pages_through_the_allocator(self):
        self.prefill(tokens(0, 2))
        self.prefill(tokens(10, 2))
        self.cache.match_prefix(Key(tokens(0, 2)))  # 0-1 are now the most recent
        before = len(self.alloc.free_pages)
        self.assertEqual(self.cache.evict(P + 1).num_tokens_evicted, 2 * P)
        self.assertEqual(len(self.alloc.free_pages), before + 2)
        self.assertEqual(len(self.cache.match_prefix(Key(tokens(0, 2))).device_indices), 2 * P)
        self.assertEqual(self.cache.match_prefix(Key(tokens(10, 2))).device_indices, [])
        self.assert_ledger()

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
        free = len(self.alloc.free_pages)
        self.cache.reset()  # SGLang's flush_cache clears the allocator itself
        self.assertEqual(len(self.alloc.free_pages), free)
        self.assertEqual(self.cache.total_size(), 0)
        self.assertEqual(self.client.cached_block_ids(), [])

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
