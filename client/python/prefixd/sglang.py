"""SGLang's prefix-cache interface on top of prefixd.

SGLang's scheduler talks to its RadixCache through a handful of calls; this
class answers them from prefixd, so the radix tree, LRU order, pins and
budget live in the daemon (shared with tools, metrics and the other
engines' isolation rules) instead of in the scheduler's process.

Two generations of SGLang's interface are served, told apart by the
argument each call gets:

    older (keys)                         newer (parameter objects)
    match_prefix(key)     -> MatchResult   match_prefix(MatchPrefixParams) -> MatchResult
    insert(key, value)    -> int           insert(InsertParams)  -> InsertResult(prefix_len)
    evict(num_tokens)     -> EvictResult   evict(EvictParams)    -> EvictResult

(older SGLang ignores what evict returns). Both: inc_lock_ref(node) and
dec_lock_ref(node) -> change of evictable tokens; evictable_size(),
protected_size(), total_size(); reset() (at start-up too); pretty_print(),
all_values_flatten(), available_and_evictable_str() (the scheduler's
out-of-memory and leak-check paths); cache_finished_req(req) and
cache_unfinished_req(req) on SGLang's Req and req_to_token_pool.

Keys are token lists or objects with `token_ids`, `extra_key` and (newer)
`cache_salt`; extra_key and salt together choose the prefixd namespace
(namespace_of), so requests that differ in either never share a prefix.

Values are the engine's KV slot indices, one per token (value=None: the
token ids themselves, as SGLang does). prefixd caches whole blocks, so
SGLang's page_size must equal the daemon's block_size; each page of a value
becomes one block under an ID this cache assigns, and the cache remembers
the page's slots: matches return them, and evicted pages are freed through
`token_to_kv_pool_allocator.free`. Only whole pages are cached: the tail of
a key that does not fill a page is not (SGLang's own callers insert
page-aligned keys). Indices are returned as plain lists, or through the
`indices` callable given to the constructor (SGLang: a torch tensor).

Ownership follows SGLang: the cache frees what it evicts, and insert() does
not free duplicates: its caller frees kv_indices[cache_protected_len:
prefix_len], as SGLang's cache_finished_req does (those are prefixd's
redundant IDs). `finish_request()` below is that caller on plain lists.

Locks are leases: inc_lock_ref(node) pins the node's path with Match(pin),
dec_lock_ref releases it. Pinned pages are counted here, per page, to
report SGLang's evictable/protected sizes exactly.

Epoch change (the daemon lost its state): every cached page comes back;
unlocked ones are freed at once, locked ones when their last lock drops.

Not provided: hierarchical (host) caching, SGLang's KV events from the
tree (prefixd's WatchEvents or its fleet wire serve them), the lock
receipts (IncLockRefResult) of SGLang's newest unified cache.
"""

import collections
import hashlib
import itertools
import sys
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import prefixd

MAX_NAMESPACE_BYTES = 128  # the daemon's default max_namespace_bytes


@dataclass(eq=False)
class PrefixdNode:
    """A matched path: SGLang's last_node. Identity matters (a request
    locks and unlocks the node it was given), not equality."""
    tokens: Tuple[int, ...] = ()
    block_ids: Tuple[int, ...] = ()
    namespace: str = ""
    lock_ref: int = 0
    lease: Optional[prefixd.Lease] = field(default=None, repr=False)
    generation: int = 0  # the cache's reset count when it was matched

    def __len__(self) -> int:
        return len(self.tokens)


class MatchResult(NamedTuple):
    """SGLang's MatchResult (a NamedTuple there too). Without hierarchical
    caching the host node is the device node and nothing hits on the host."""
    device_indices: Any
    last_device_node: PrefixdNode
    last_host_node: PrefixdNode
    best_match_node: Optional[PrefixdNode] = None
    host_hit_length: int = 0

    @property
    def prefix_len(self) -> int:
        return len(self.device_indices)


@dataclass
class InsertResult:
    prefix_len: int


@dataclass
class EvictResult:
    num_tokens_evicted: int = 0


class PrefixEvicted(RuntimeError):
    """inc_lock_ref on a node whose path is no longer (wholly) cached."""


def namespace_of(extra_key: Optional[str], cache_salt: Optional[str] = None) -> str:
    """The prefixd namespace of SGLang's (extra_key, cache_salt): "" when
    both are None (SGLang's default tree), else "x=<extra_key>,s=<salt>"
    with each part percent-encoded and present only if not None, so that
    distinct pairs (None and "" included, as in SGLang) never share a name
    and the name is printable ASCII without spaces, as the daemon requires.
    A name longer than the daemon's limit becomes "sha256:<hex digest>"."""
    parts = []
    if extra_key is not None:
        parts.append("x=" + urllib.parse.quote(str(extra_key), safe=""))
    if cache_salt is not None:
        parts.append("s=" + urllib.parse.quote(str(cache_salt), safe=""))
    name = ",".join(parts)
    if len(name) > MAX_NAMESPACE_BYTES:
        name = "sha256:" + hashlib.sha256(name.encode()).hexdigest()
    return name


def _ints(values: Any) -> List[int]:
    """A list of ints from a list or a tensor (torch's tolist, no import)."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(v) for v in values]


def _is_params(arg: Any) -> bool:
    """Newer SGLang passes MatchPrefixParams / InsertParams (with `key`)."""
    return hasattr(arg, "key") and not hasattr(arg, "token_ids")


class _NsKey:
    """A key whose namespace is already known (token_ids + namespace)."""

    def __init__(self, token_ids: List[int], namespace: str):
        self.token_ids = token_ids
        self.namespace = namespace


def _key_of(arg: Any) -> Tuple[List[int], str]:
    """(token ids, namespace) from a list, a RadixKey or a params object."""
    key = arg.key if _is_params(arg) else arg
    if isinstance(key, _NsKey):
        return key.token_ids, key.namespace
    tokens = getattr(key, "token_ids", key)
    ns = namespace_of(getattr(key, "extra_key", None), getattr(key, "cache_salt", None))
    return _ints(tokens), ns


class PrefixdRadixCache:
    def __init__(self, client: prefixd.Client, token_to_kv_pool_allocator: Any,
                 page_size: int, *, req_to_token_pool: Any = None, disable: bool = False,
                 engine_id: str = "sglang", model_fingerprint: Optional[str] = None,
                 indices: Callable[[List[int]], Any] = list):
        """`token_to_kv_pool_allocator`: anything with free(indices) (and
        available_size(), for available_and_evictable_str); None frees
        nothing (a simulation, as SGLang's create_simulated).
        `req_to_token_pool`: SGLang's, for cache_finished_req and
        cache_unfinished_req. `indices`: turns a list of slot indices into
        what the engine passes around (SGLang: a torch int64 tensor on its
        device). `model_fingerprint`: the engine's; given, the cache
        Handshakes with it now and after every epoch change
        (FailedPrecondition: the daemon serves another model geometry)."""
        self.client = client
        self.engine_id = engine_id
        self.fingerprint = model_fingerprint
        if model_fingerprint:
            client.handshake(engine_id, model_fingerprint)
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.req_to_token_pool = req_to_token_pool
        self.page_size = page_size
        self.disable = disable
        self.indices = indices
        block_size = client.info().block_size
        if block_size != page_size:
            raise ValueError("SGLang page_size %d != prefixd block_size %d: a page must be "
                             "one block" % (page_size, block_size))
        self.root_node = PrefixdNode()
        self._values: Dict[int, Tuple[int, ...]] = {}  # cached block -> its page's slots
        self._pins: Dict[int, int] = collections.Counter()  # block -> locks on it
        self._orphans: Dict[int, Tuple[int, ...]] = {}  # locked blocks the daemon forgot
        self._ids = itertools.count(1)  # never reused: an ID names one page for good
        self._generation = 0
        self._chain = client.on_epoch_change
        client.on_epoch_change = self._on_epoch_change
        self.reset()  # as SGLang's RadixCache does: a new engine starts empty

    @property
    def allocator(self) -> Any:
        return self.token_to_kv_pool_allocator

    def _free(self, slots: Sequence[int]) -> None:
        if slots and self.allocator is not None:
            self.allocator.free(self.indices(list(slots)))

    # ---- SGLang's interface ----

    def reset(self) -> None:
        """Drops this tenant's trees in prefixd and forgets them, freeing
        nothing: as in SGLang, the pool is cleared by the caller (flush_cache
        clears the allocator right after; at start-up the pages prefixd held
        belong to a previous engine process and mean nothing to this pool).
        Nodes matched before a reset lock nothing afterwards."""
        self.client.reset()
        self._values.clear()
        self._pins.clear()
        self._orphans.clear()
        self._generation += 1

    def match_prefix(self, key: Any, **_) -> MatchResult:
        tokens, ns = _key_of(key)
        aligned = len(tokens) // self.page_size * self.page_size
        if self.disable or aligned == 0:
            return self._miss()
        m = self.client.match(tokens[:aligned], namespace=ns)
        blocks = list(itertools.takewhile(self._values.__contains__, m.block_ids))
        if not blocks:
            return self._miss()
        n = len(blocks) * self.page_size
        node = PrefixdNode(tuple(tokens[:n]), tuple(blocks), ns, generation=self._generation)
        slots = [s for b in blocks for s in self._values[b]]
        return MatchResult(self.indices(slots), node, node, node)

    def _miss(self) -> MatchResult:
        return MatchResult(self.indices([]), self.root_node, self.root_node, self.root_node)

    def insert(self, key: Any, value: Any = None, **_) -> Any:
        """Caches the whole pages of key with their slots. Returns how many
        leading tokens were cached already (the caller frees its own copies
        of those beyond what it had locked): an int for older SGLang (a key
        argument), an InsertResult for newer (InsertParams)."""
        prefix_len = 0 if self.disable else self._insert(key, value)
        return InsertResult(prefix_len) if _is_params(key) else prefix_len

    def _insert(self, key: Any, value: Any) -> int:
        if _is_params(key):
            value = key.value
        tokens, ns = _key_of(key)
        value = list(tokens) if value is None else _ints(value)
        if len(value) != len(tokens):
            raise ValueError("insert: %d tokens but %d values (one KV slot per token)"
                             % (len(tokens), len(value)))
        p = self.page_size
        n_pages = len(tokens) // p
        if n_pages == 0:
            return 0
        ids = [next(self._ids) for _ in range(n_pages)]
        r = self.client.insert(tokens[:n_pages * p], ids, namespace=ns)
        redundant = set(r.redundant_block_ids)
        for i, b in enumerate(ids):
            if b not in redundant:
                self._values[b] = tuple(value[i * p:(i + 1) * p])
        self._handed_back(r.evicted_block_ids)
        return r.cached_tokens

    def evict(self, num_tokens: Any) -> EvictResult:
        """Evicts at least num_tokens (whole pages, LRU, never locked ones)
        and frees them through the allocator. `num_tokens`: an int or
        EvictParams."""
        num_tokens = int(getattr(num_tokens, "num_tokens", num_tokens))
        if self.disable or num_tokens <= 0:
            return EvictResult()
        evicted = self.client.evict(-(-num_tokens // self.page_size))
        self._handed_back(evicted)
        return EvictResult(len(evicted) * self.page_size)

    def inc_lock_ref(self, node: PrefixdNode) -> int:
        if self.disable or node is self.root_node or not node.block_ids:
            return 0
        node.lock_ref += 1
        if node.lock_ref == 1:
            try:
                self._pin(node)
            except BaseException:
                node.lock_ref -= 1
                raise
        delta = 0
        for b in node.block_ids:
            self._pins[b] += 1
            if self._pins[b] == 1:
                delta -= self.page_size
        return delta

    def _pin(self, node: PrefixdNode) -> None:
        if node.generation != self._generation:
            raise PrefixEvicted("the node was matched before the cache's last reset")
        m = self.client.match(list(node.tokens), namespace=node.namespace, pin=True)
        if tuple(m.block_ids) != node.block_ids:
            if m.lease:
                m.lease.release()
            raise PrefixEvicted("the path of %d tokens holds %d of its %d pages now"
                                % (len(node.tokens), len(m.block_ids), len(node.block_ids)))
        node.lease = m.lease

    def dec_lock_ref(self, node: PrefixdNode, *_, **__) -> int:
        """Extra arguments (newer SGLang's lock receipts) are ignored."""
        if self.disable or node is self.root_node or not node.block_ids:
            return 0
        if node.lock_ref <= 0:
            raise RuntimeError("dec_lock_ref on a node that is not locked")
        node.lock_ref -= 1
        if node.lock_ref == 0 and node.lease:
            try:
                node.lease.release()
            except prefixd.NotFound:
                pass  # expired, or the daemon restarted
            node.lease = None
        if node.generation != self._generation:
            return 0  # reset since: its pages are no longer counted
        delta = 0
        for b in node.block_ids:
            self._pins[b] -= 1
            if self._pins[b] == 0:
                del self._pins[b]
                delta += self.page_size
                self._free(self._orphans.pop(b, ()))
        return delta

    def evictable_size(self) -> int:
        return sum(1 for b in self._values if b not in self._pins) * self.page_size

    def protected_size(self) -> int:
        return sum(1 for b in self._values if b in self._pins) * self.page_size

    def total_size(self) -> int:
        return len(self._values) * self.page_size

    def cached_pages(self) -> Set[int]:
        """The block IDs prefixd holds for this cache."""
        return set(self._values)

    # ---- diagnostics: SGLang's out-of-memory and leak-check paths ----

    def all_values_flatten(self) -> Any:
        """Every KV slot the cache holds (SGLang's leak check compares them
        with the allocator's free list)."""
        return self.indices([s for slots in self._values.values() for s in slots])

    def available_and_evictable_str(self) -> str:
        available = 0
        if self.allocator is not None and hasattr(self.allocator, "available_size"):
            available = int(self.allocator.available_size())
        evictable = self.evictable_size()
        return ("Available tokens: %d (available_size=%d + evictable_size=%d, "
                "protected_size=%d)\n" % (available + evictable, available, evictable,
                                          self.protected_size()))

    def pretty_print(self, file: Any = None) -> None:
        """Prints the daemon's trees of this tenant (Dump), one line a node:
        its tokens (the first ten), pages and pins; then the cached total.
        Called when things have gone wrong, so a daemon that cannot be asked
        is printed as such rather than raised."""
        out = file or sys.stdout
        try:
            names = sorted(set(self.client.dump("").namespaces) | {""})
            for ns in names:
                nodes = self.client.dump(ns).nodes
                if nodes:
                    print("namespace %r:" % ns, file=out)
                for n in nodes:
                    print("%s%d %s pages=%d pins=%d" % (
                        "  " * (n.depth + 1), len(n.tokens), list(n.tokens[:10]),
                        len(n.block_ids), n.pins), file=out)
        except prefixd.PrefixdError as e:
            print("prefixd tree unavailable: %s" % e, file=out)
        print("#tokens: %d" % self.total_size(), file=out)

    # ---- SGLang's request objects ----

    def cache_finished_req(self, req: Any, is_insert: bool = True, **_) -> None:
        """SGLang's cache_finished_req on its Req (origin_input_ids,
        output_ids, req_pool_idx, extra_key, last_node, and
        pop_committed_kv_cache() with cache_protected_len in newer SGLang;
        prefix_indices in older) and req_to_token_pool (req_to_token[row,
        :n], free(row) in older SGLang, whose cache freed the row itself)."""
        newer = hasattr(req, "pop_committed_kv_cache")
        all_ids = list(req.origin_input_ids) + list(req.output_ids)
        # Older SGLang: the last output token has no KV yet.
        committed = req.pop_committed_kv_cache() if newer else max(len(all_ids) - 1, 0)
        tokens = all_ids[:committed]
        kv = self._row(req, len(tokens))
        if self.disable:
            self._free(kv)
        else:
            _finish(self, tokens, self._req_namespace(req), kv, self._protected_len(req),
                    req.last_node, is_insert)
        if not newer:
            self.req_to_token_pool.free(req.req_pool_idx)

    def cache_unfinished_req(self, req: Any, chunked: bool = False, **_) -> None:
        """SGLang's cache_unfinished_req (a chunk of prefill done): caches
        req.fill_ids' whole pages, points the request's row at the cached
        slots, moves its lock to the new node and updates last_node,
        prefix_indices and (newer SGLang) cache_protected_len."""
        if self.disable:
            return
        tokens = list(req.fill_ids)
        kv = self._row(req, len(tokens))
        aligned = len(tokens) // self.page_size * self.page_size
        ns = self._req_namespace(req)
        protected = self._protected_len(req)
        key = _NsKey(tokens[:aligned], ns)
        new_prefix_len = self._insert(key, kv[:aligned])
        self._free(kv[protected:new_prefix_len])
        m = self.match_prefix(key)
        new = _ints(m.device_indices)
        if len(new) != aligned:
            raise PrefixEvicted("cache_unfinished_req: %d of %d tokens cached right after "
                                "insert" % (len(new), aligned))
        self.req_to_token_pool.write((req.req_pool_idx, slice(protected, len(new))),
                                     self.indices(new[protected:]))
        if hasattr(req, "cache_protected_len"):
            req.cache_protected_len = len(new)
        # Lock the new path before unlocking the old one: no window in which
        # the shared pages are evictable.
        self.inc_lock_ref(m.last_device_node)
        self.dec_lock_ref(req.last_node)
        req.prefix_indices = self.indices(new + kv[len(new):])
        req.last_node = m.last_device_node

    def _protected_len(self, req: Any) -> int:
        """Tokens of the request's row that the cache gave it (and owns):
        cache_protected_len (newer SGLang), else prefix_indices, whose
        partial last page (after cache_unfinished_req) is the request's own,
        not the cache's."""
        protected = getattr(req, "cache_protected_len", None)
        if protected is None:
            protected = len(req.prefix_indices)
        return int(protected) // self.page_size * self.page_size

    def _row(self, req: Any, n: int) -> List[int]:
        return _ints(self.req_to_token_pool.req_to_token[req.req_pool_idx, :n])

    def _req_namespace(self, req: Any) -> str:
        """The namespace the request's match used: its node's, or, after a
        miss, its extra_key and (where the Req carries one) cache_salt."""
        node = getattr(req, "last_node", None)
        if isinstance(node, PrefixdNode) and node is not self.root_node:
            return node.namespace
        return namespace_of(getattr(req, "extra_key", None), getattr(req, "cache_salt", None))

    # ---- what prefixd hands back ----

    def _handed_back(self, blocks: Sequence[int]) -> None:
        free = []
        for b in blocks:
            slots = self._values.pop(b, None)
            if slots is None:
                continue  # not ours (another writer in this tenant)
            if b in self._pins:
                self._orphans[b] = slots  # freed by the last dec_lock_ref
            else:
                free.extend(slots)
        self._free(free)

    def _on_epoch_change(self, old: int, new: int) -> None:
        self._handed_back(list(self._values))
        if self.fingerprint:
            self.client.handshake(self.engine_id, self.fingerprint)
        if self._chain is not None:
            self._chain(old, new)




def _finish(cache: PrefixdRadixCache, tokens: List[int], ns: str, kv: List[int],
            protected: int, last_node: PrefixdNode, is_insert: bool = True) -> None:
    """A finished request: cache its whole pages, free its copies of what
    was cached already (beyond the `protected` tokens it got from the
    cache) and its unaligned tail, unlock its node."""
    aligned = min(len(tokens), len(kv)) // cache.page_size * cache.page_size
    if is_insert:
        new_prefix_len = cache._insert(_NsKey(tokens[:aligned], ns), kv[:aligned])
    else:
        new_prefix_len = aligned  # nothing adopted: all of it is the request's
    cache._free(kv[protected:new_prefix_len])
    cache._free(kv[aligned:])
    cache.dec_lock_ref(last_node)


def finish_request(cache: PrefixdRadixCache, key: Any, kv_indices: Sequence[int],
                   cache_protected_len: int, last_node: PrefixdNode) -> None:
    """SGLang's cache_finished_req on plain lists (engines without SGLang's
    request objects): `key` as for insert, `kv_indices` the request's slots."""
    tokens, ns = _key_of(key)
    _finish(cache, tokens, ns, _ints(kv_indices), cache_protected_len, last_node)
