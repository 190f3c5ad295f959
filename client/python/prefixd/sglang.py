"""SGLang's prefix-cache interface on top of prefixd.

SGLang's scheduler talks to its RadixCache through a handful of calls; this
class answers them from prefixd, so the radix tree, LRU order, pins and
budget live in the daemon (shared with tools, metrics and the other
engines' isolation rules) instead of in the scheduler's process:

    match_prefix(key)      -> MatchResult(device_indices, last_device_node, last_host_node)
    insert(key, value)     -> prefix length already cached, in tokens
    evict(num_tokens)      -> EvictResult(num_tokens_evicted); frees through the allocator
    inc_lock_ref(node)     -> change of evictable tokens (<= 0)
    dec_lock_ref(node)     -> change of evictable tokens (>= 0)
    evictable_size(), protected_size(), total_size()
    reset()                -> drops the tenant's trees (at start-up too), frees nothing

Keys are token lists, objects with `token_ids` (and `extra_key`, which
becomes the prefixd namespace: LoRA id, cache salt), or parameter objects
with `key` (newer SGLang passes MatchPrefixParams / InsertParams /
EvictParams). Values and device indices are per-token KV slot indices, as in
SGLang; plain lists here (wrap them in tensors at the call site).

Mapping. SGLang's page_size must equal the daemon's block_size. A page's
token slots are [p * page_size, (p + 1) * page_size), so a page is prefixd
block ID p, and the slots of block p are recomputed from p. insert() checks
that every page it is given has that shape.

Ownership follows SGLang: the cache frees what it evicts (through
`token_to_kv_pool_allocator.free`), and insert() does not free duplicates:
its caller frees kv_indices[cache_protected_len:prefix_len] exactly as
SGLang's cache_finished_req does (those are prefixd's redundant IDs).
`finish_request()` below is that caller, for engines without SGLang.

Locks are leases: inc_lock_ref(node) pins the node's path with Match(pin),
dec_lock_ref releases it. Pinned pages are counted here, per page, to
report SGLang's evictable/protected sizes exactly.

Epoch change (the daemon lost its state): every cached page comes back;
unlocked ones are freed at once, locked ones when their last lock drops.

Not provided: cache_finished_req / cache_unfinished_req (they need SGLang's
Req and req_to_token_pool; finish_request() is the same logic on plain
lists), hierarchical (host) caching, KV events.
"""

import collections
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import prefixd


@dataclass(eq=False)
class PrefixdNode:
    """A matched path: SGLang's last_node. Identity matters (a request
    locks and unlocks the node it was given), not equality."""
    tokens: Tuple[int, ...] = ()
    block_ids: Tuple[int, ...] = ()
    namespace: str = ""
    lock_ref: int = 0
    lease: Optional[prefixd.Lease] = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class MatchResult:
    device_indices: List[int]
    last_device_node: PrefixdNode
    last_host_node: PrefixdNode


@dataclass
class EvictResult:
    num_tokens_evicted: int = 0


class PrefixEvicted(RuntimeError):
    """inc_lock_ref on a node whose path is no longer (wholly) cached."""


def _key_of(arg: Any) -> Tuple[List[int], str]:
    """(token ids, namespace) from a list, a RadixKey or a params object."""
    key = getattr(arg, "key", arg)
    tokens = getattr(key, "token_ids", key)
    extra = getattr(key, "extra_key", None)
    return [int(t) for t in tokens], "" if extra is None else str(extra)


class PrefixdRadixCache:
    def __init__(self, client: prefixd.Client, token_to_kv_pool_allocator: Any,
                 page_size: int, *, disable: bool = False, engine_id: str = "sglang",
                 model_fingerprint: Optional[str] = None):
        """`token_to_kv_pool_allocator`: anything with free(indices).
        `model_fingerprint`: the engine's; given, the cache Handshakes with
        it now and after every epoch change (FailedPrecondition: the daemon
        serves another model geometry)."""
        self.client = client
        self.engine_id = engine_id
        self.fingerprint = model_fingerprint
        if model_fingerprint:
            client.handshake(engine_id, model_fingerprint)
        self.allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = disable
        block_size = client.info().block_size
        if block_size != page_size:
            raise ValueError("SGLang page_size %d != prefixd block_size %d: a page must be "
                             "one block" % (page_size, block_size))
        self.root_node = PrefixdNode()
        self._cached: Set[int] = set()                     # pages prefixd holds for us
        self._pins: Dict[int, int] = collections.Counter()  # page -> locks on it
        self._orphans: Set[int] = set()  # locked pages the daemon forgot (epoch change)
        self._chain = client.on_epoch_change
        client.on_epoch_change = self._on_epoch_change
        self.reset()  # as SGLang's RadixCache does: a new engine starts empty

    # ---- page <-> slot mapping ----

    def _slots(self, block_ids: Sequence[int]) -> List[int]:
        p = self.page_size
        return [b * p + j for b in block_ids for j in range(p)]

    def _pages(self, value: Sequence[int], n_pages: int) -> List[int]:
        p = self.page_size
        pages = []
        for i in range(n_pages):
            first = int(value[i * p])
            page = [int(v) for v in value[i * p:(i + 1) * p]]
            if first % p or page != list(range(first, first + p)):
                raise ValueError("page %d of the value is not one KV page: slots %s" % (i, page))
            pages.append(first // p)
        return pages

    def _free_pages(self, pages: Sequence[int]) -> None:
        if pages:
            self.allocator.free(self._slots(pages))

    # ---- SGLang's interface ----

    def reset(self) -> None:
        """Drops this tenant's trees in prefixd and forgets them, freeing
        nothing: as in SGLang, the pool is cleared by the caller (flush_cache
        clears the allocator right after; at start-up the pages prefixd held
        belong to a previous engine process and mean nothing to this pool)."""
        self.client.reset()
        self._cached.clear()
        self._pins.clear()
        self._orphans.clear()

    def match_prefix(self, key: Any, **_) -> MatchResult:
        tokens, ns = _key_of(key)
        aligned = len(tokens) // self.page_size * self.page_size
        if self.disable or aligned == 0:
            return MatchResult([], self.root_node, self.root_node)
        m = self.client.match(tokens[:aligned], namespace=ns)
        if not m.matched_tokens:
            return MatchResult([], self.root_node, self.root_node)
        node = PrefixdNode(tuple(tokens[:m.matched_tokens]), tuple(m.block_ids), ns)
        return MatchResult(self._slots(node.block_ids), node, node)

    def insert(self, key: Any, value: Optional[Sequence[int]] = None, **_) -> int:
        """Caches the page-aligned part of key; returns how many leading
        tokens were cached already (the caller frees its own copies of
        those beyond what it had locked)."""
        if self.disable:
            return 0
        value = getattr(key, "value", value)
        tokens, ns = _key_of(key)
        if value is None:
            raise ValueError("insert needs the KV slot indices (value)")
        n_pages = min(len(tokens), len(value)) // self.page_size
        if n_pages == 0:
            return 0
        pages = self._pages(value, n_pages)
        r = self.client.insert(tokens[:n_pages * self.page_size], pages, namespace=ns)
        redundant = set(r.redundant_block_ids)
        for b in pages:
            if b not in redundant:
                self._cached.add(b)
                self._orphans.discard(b)
        self._handed_back(r.evicted_block_ids)
        return r.cached_tokens

    def evict(self, num_tokens: Any) -> EvictResult:
        """Evicts at least num_tokens (whole pages, LRU, never locked ones)
        and frees them through the allocator."""
        num_tokens = getattr(num_tokens, "num_tokens", num_tokens)
        if self.disable or num_tokens <= 0:
            return EvictResult()
        pages = -(-int(num_tokens) // self.page_size)
        evicted = self.client.evict(pages)
        self._handed_back(evicted)
        return EvictResult(len(evicted) * self.page_size)

    def inc_lock_ref(self, node: PrefixdNode) -> int:
        if self.disable or node is self.root_node or not node.block_ids:
            return 0
        node.lock_ref += 1
        if node.lock_ref == 1:
            m = self.client.match(list(node.tokens), namespace=node.namespace, pin=True)
            if tuple(m.block_ids) != node.block_ids:
                if m.lease:
                    m.lease.release()
                node.lock_ref -= 1
                raise PrefixEvicted("the path of %d tokens holds %d of its %d pages now"
                                    % (len(node.tokens), len(m.block_ids),
                                       len(node.block_ids)))
            node.lease = m.lease
        delta = 0
        for b in node.block_ids:
            self._pins[b] += 1
            if self._pins[b] == 1:
                delta -= self.page_size
        return delta

    def dec_lock_ref(self, node: PrefixdNode) -> int:
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
        delta = 0
        for b in node.block_ids:
            self._pins[b] -= 1
            if self._pins[b] == 0:
                del self._pins[b]
                delta += self.page_size
                if b in self._orphans:
                    self._orphans.discard(b)
                    self._free_pages([b])
        return delta

    def evictable_size(self) -> int:
        return sum(1 for b in self._cached if b not in self._pins) * self.page_size

    def protected_size(self) -> int:
        return sum(1 for b in self._cached if b in self._pins) * self.page_size

    def total_size(self) -> int:
        return len(self._cached) * self.page_size

    def cached_pages(self) -> Set[int]:
        """The pages (block IDs) prefixd holds for this cache."""
        return set(self._cached)

    # ---- what prefixd hands back ----

    def _handed_back(self, pages: Sequence[int]) -> None:
        free = []
        for b in pages:
            self._cached.discard(b)
            if b in self._pins:
                self._orphans.add(b)  # freed by the last dec_lock_ref
            else:
                free.append(b)
        self._free_pages(free)

    def _on_epoch_change(self, old: int, new: int) -> None:
        lost = list(self._cached)
        self._handed_back(lost)
        if self.fingerprint:
            self.client.handshake(self.engine_id, self.fingerprint)
        if self._chain is not None:
            self._chain(old, new)


def finish_request(cache: PrefixdRadixCache, key: Any, kv_indices: Sequence[int],
                   cache_protected_len: int, last_node: PrefixdNode) -> None:
    """SGLang's cache_finished_req on plain lists: insert the request's
    page-aligned tokens, free its copies of what was already cached (beyond
    the `cache_protected_len` tokens it got from the cache) and its unaligned
    tail, and unlock its node."""
    tokens, _ = _key_of(key)
    aligned = min(len(tokens), len(kv_indices)) // cache.page_size * cache.page_size
    new_prefix_len = cache.insert(key, list(kv_indices[:aligned]))
    duplicates = list(kv_indices[cache_protected_len:new_prefix_len])
    if duplicates:
        cache.allocator.free(duplicates)
    tail = list(kv_indices[aligned:])
    if tail:
        cache.allocator.free(tail)
    cache.dec_lock_ref(last_node)
