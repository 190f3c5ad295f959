"""An engine's paged KV pool with prefix caching, as vLLM v1's BlockPool
behaves, publishing its KV events (kv_publisher.Publisher): the ground truth
the fleet index (docs/index.md) must equal.

The pool has C blocks (numbered 0..C-1; vLLM's null block is left out).

- Blocks are named by a chain hash: sha256 of (parent hash, the block's
  tokens, its extra keys); the parent of the first block is the pool's seed
  (hash_seed: engines may differ, as vLLM's per-process NONE_HASH does).
  Extra keys, as vLLM: the LoRA name on every block, the cache_salt on the
  first block only; a tuple, or None when empty.
- cached: hash -> block for every cached full block; ref: how many running
  requests hold each block; free: the blocks nobody holds, in LRU order
  (head evicted first). A finished request's blocks are appended in reverse
  order (its last block first), so a request's tail is evicted before its
  head; a cache hit takes a block out of the free queue.
- Allocating pops the free queue's head; if that block was cached its hash
  leaves the cache and a BlockRemoved([hash]) is emitted.
- A request: its full blocks' hashes; the longest cached prefix (the hit);
  the rest allocated (plus one block for a partial tail); then, its prefill
  being done within the step that admitted it, BlockStored for the newly
  computed full blocks, parent_block_hash = the hash of the block before
  them (None at the root), their token_ids, lora_id/lora_name, and
  extra_keys. It then runs for hold_steps steps, holding (pinning) its
  blocks, and is freed.
- Admission is FIFO. A request that needs more blocks than are free now
  (free = free-queue length minus the hit blocks it would take out of the
  queue) waits, and the ones behind it wait too (head-of-line, like vLLM's
  FCFS scheduler). A request that needs more than C blocks in all can never
  fit: it is refused (Request.state == REFUSED) at submit().
- Because storing a request's blocks happens when it is admitted, two
  requests can never compute the same block at once, and a cached block's
  parent is always cached (a child is always ahead of its parent in the
  free queue; check() asserts it).
- recompute_last_block=True adds vLLM's cap on hits: a hit never covers a
  whole prompt (vLLM computes at least the last token), so a block-aligned
  prompt whose every block is cached recomputes its last block into a new
  block with the same hash and publishes BlockStored for it again; the pool
  then holds two blocks with one hash (the first one serves hits), and
  evicting either publishes BlockRemoved for the hash while the other stays
  cached. An exact index must count a worker's stores of a hash, or read
  remaining_copy_counts: with copy_counts=True every BlockRemoved of the
  pool carries it (newer vLLM, map form), each hash's copies left after the
  removal. Off by default (then the pool never holds two blocks with one
  hash).
- Events accumulate in the pool and go to the publisher as one batch at the
  end of every `steps_per_batch`-th step that produced any (vLLM publishes
  one batch per scheduler step that has events).

cached_prefix_blocks(tokens, salt, lora) is how many leading full blocks of
a prompt the cache holds right now. With stored_since=S it counts only
blocks whose BlockStored went out in a batch with seq >= S (stopping at the
first that did not): what an index that lost every batch before S can know
(exact without recompute_last_block; with it, the seq of the store that
began the hash's current stay in the cache).

Content keys (vLLM's extra keys beyond LoRA and salt): a request may carry
multimodal inputs mm=[(modality, mm_hash, start_token, length)] (each block
its placeholder tokens overlap keys (mm_hash, start - block start), so the
offset is negative in blocks after the first), prompt embeddings
embeds=<id> (every block keys a digest of (id, block index)), legacy keys
legacy={block: [str]} (an older engine's bare values; not in block 0 of a
raw-form engine, where the last string is the salt) and opaque_at=k (block
k carries a key no decoder knows: the index ends the chain there). A block
without content keys hashes as it would without them, so a multimodal
prompt shares the blocks before its first image with the same text alone.
keys_form chooses how events carry the keys: "raw" (vLLM's tuples) or
"typed" (the newest vLLM's {"type": ...} maps, with event_version 1).
route_extra_keys() gives Route's block_extra_keys for a prompt.

Tiers: with tier=dict(medium=, blocks=, locality=, ownership=) a block the
GPU evicts moves to a second tier of `blocks` blocks with its own LRU (a
BlockStored there, then the GPU's BlockRemoved), as an offloading connector
does; the tier's own evictions are its BlockRemoved. The tier's BlockStored
carries the block's tokens and parent (vLLM's self-describing offloading
events), or with placeholder=True only its hash: vLLM's OffloadingConnector
by default (parent_block_hash None, token_ids [], block_size 0).

Hybrid models: with sliding_window=W (tokens) the engine has two KV-cache
groups: group 0 is this pool (full attention, its events carry group_idx 0
and kv_cache_spec_kind "full_attention") and group 1 a sliding window of W
tokens with a pool of window_blocks blocks (events group_idx 1,
"sliding_window", W). Group 1 stores what a request computes that it does
not hold, and frees the blocks that fell out of the window before the
others (they are evicted first). A prefix of n blocks is usable when group
0 holds blocks 0..n-1 and group 1 the cdiv(W - 1, block_size) blocks ending
at n - 1 (fewer when n is smaller), as vLLM's hybrid cache hit decides.

route_answer(tokens, ...) is what an exact index answers for this engine:
matched (the usable prefix; any tier), full (the full-attention run) and the
run per tier, counting only blocks an index can know (not past a block
whose keys it cannot vouch for, nor, with since=S, one stored before batch
S).

RadixPool is SGLang's radix cache instead of vLLM's block pool, with
HiCache's host tier (below).

Traces: each Mooncake line's hash_ids are its blocks; block h's tokens are
[(base + h) * block_size + j for j in range(block_size)], a function of the
hash id alone (a Mooncake id already names the whole prefix up to it); base
keeps the two traces' ids apart (TRACE_ID_BASE). All tokens < 2^32.
"""

import collections
import hashlib
import json
import os

import msgpack

from prefixd import kv_publisher as kp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # client/python/prefixd
TRACE_DIR = os.path.join(REPO, "tests", "data", "mooncake")
TRACE_ID_BASE = {"conversation": 0, "synthetic": 1 << 22}
FRESH_ID_BASE = 1 << 24  # ids for prompts that are in no trace (fresh_tokens)

WAITING, RUNNING, FINISHED, REFUSED = "waiting", "running", "finished", "refused"


# ---- traces ----

TraceRequest = collections.namedtuple(
    "TraceRequest", "trace index timestamp input_length output_length hash_ids")
TraceRequest.hold_steps = property(lambda r: 1 + min(r.output_length, 1000) // 200)


def trace_path(name):
    return name if os.sep in name else os.path.join(TRACE_DIR, "%s_trace.jsonl" % name)


def load_trace(name, limit=None):
    """The requests of tests/data/mooncake/<name>_trace.jsonl (or a path), in
    file (arrival) order; the first `limit` if given."""
    out = []
    trace = os.path.basename(name).split("_trace")[0]
    with open(trace_path(name)) as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            r = json.loads(line)
            out.append(TraceRequest(trace, i, r["timestamp"], r["input_length"],
                                    r["output_length"], tuple(r["hash_ids"])))
    return out


def block_tokens(hash_id, block_size, base=0):
    first = (base + hash_id) * block_size
    return list(range(first, first + block_size))


def trace_tokens(req, block_size):
    """A trace request's prompt: one block of tokens per hash id."""
    base = TRACE_ID_BASE.get(req.trace, 0)
    out = []
    for h in req.hash_ids:
        out += block_tokens(h, block_size, base)
    return out


def fresh_tokens(ids, block_size):
    """A prompt in no trace: one block per id in `ids` (ints from 0)."""
    out = []
    for h in ids:
        out += block_tokens(h, block_size, FRESH_ID_BASE)
    return out


# ---- the pool ----

def chain_hash(parent, tokens, extra):
    """sha256 of (parent digest, tokens, extra keys): 32 bytes."""
    return hashlib.sha256(msgpack.packb([parent, list(tokens), extra],
                                        use_bin_type=True)).digest()


def mm_block_keys(mm, i, block_size):
    """The multimodal inputs block i's tokens overlap, as (modality, hash,
    block_offset): where the input starts, from the block's first token."""
    lo, hi = i * block_size, (i + 1) * block_size
    return [(m, h, start - lo) for m, h, start, length in (mm or ())
            if start < hi and start + length > lo]


def embeds_digest(embeds, i):
    """The prompt-embeds key of block i of a prompt whose embeddings are `embeds`."""
    return hashlib.sha256(_bytes(embeds) + i.to_bytes(4, "big")).digest()[:16]


def _bytes(v):
    return v.encode() if isinstance(v, str) else bytes(v)


def tier_name(medium, locality=None, ownership=None):
    """The medium Route and ListWorkers name a tier by (docs/index.md): the
    medium upper-cased, "/REMOTE" for remote blocks, "/<ownership>"."""
    name = (medium or kp.MEDIUM_GPU).upper()
    if locality and locality.upper() == "REMOTE":
        name += "/REMOTE"
    return name + ("/" + ownership if ownership else "")


class Request:
    __slots__ = ("rid", "tokens", "salt", "lora", "lora_id", "hold_steps", "hashes", "blocks",
                 "hit", "remaining", "state", "keys", "partial")

    def __init__(self, rid, tokens, salt, lora, lora_id, hold_steps, hashes, keys=None):
        self.rid = rid
        self.tokens = tokens
        self.salt = salt
        self.lora = lora
        self.lora_id = lora_id
        self.hold_steps = hold_steps
        self.hashes = hashes
        self.keys = keys or {}  # mm, embeds, legacy, opaque_at
        self.blocks = []
        self.hit = 0
        self.partial = 0
        self.remaining = 0
        self.state = WAITING

    def __repr__(self):
        return "Request(%d, %d tokens, %s, hit %d)" % (self.rid, len(self.tokens), self.state,
                                                      self.hit)


class EnginePool:
    takes_lora = True  # its events name a request's LoRA (RadixPool's may not)

    def __init__(self, num_blocks, block_size=16, publisher=None, steps_per_batch=1,
                 hash_seed=b"", medium=kp.MEDIUM_GPU, coalesce_removed=False, spec_kind=None,
                 recompute_last_block=False, name="engine", keys_form="raw", store_fields=None,
                 remove_fields=None, tier=None, sliding_window=None, window_blocks=None,
                 copy_counts=False):
        """publisher: a kv_publisher.Publisher, or None (events are kept in
        .published as (seq, events) instead). coalesce_removed: the
        BlockRemoved hashes of one allocation in one event (vLLM emits one
        event per evicted block). spec_kind: adds kv_cache_spec_kind=<it> to
        every BlockStored (a field the newest vLLM writes and an older
        decoder does not know). keys_form: "raw" or "typed" extra keys
        (typed events carry event_version 1). store_fields / remove_fields:
        more fields for every BlockStored / BlockRemoved (session_id,
        locality, ...; names no decoder knows go after the known ones).
        tier, sliding_window, window_blocks, copy_counts: see the module
        docstring."""
        if keys_form not in ("raw", "typed"):
            raise ValueError("keys_form must be raw or typed")
        if tier is not None and sliding_window is not None:
            raise ValueError("a pool has a second tier or a sliding-window group, not both")
        self.C = num_blocks
        self.bs = block_size
        self.publisher = publisher
        self.steps_per_batch = steps_per_batch
        self.seed = hashlib.sha256(b"prefixd-test-engine-seed" + hash_seed).digest()
        self.medium = medium
        self.coalesce_removed = coalesce_removed
        self.spec_kind = "full_attention" if sliding_window and not spec_kind else spec_kind
        self.recompute_last_block = recompute_last_block
        self.copy_counts = copy_counts
        self.name = name
        self.keys_form = keys_form
        self.store_fields = dict(store_fields or {})
        self.remove_fields = dict(remove_fields or {})
        if keys_form == "typed":
            self.store_fields.setdefault("event_version", 1)
            self.remove_fields.setdefault("event_version", 1)
        self.tier = dict(tier) if tier else None
        if self.tier:
            self.tier_medium = tier_name(self.tier["medium"], self.tier.get("locality"),
                                         self.tier.get("ownership"))
        self.window_tokens = sliding_window
        self.window_cap = window_blocks if window_blocks is not None else num_blocks
        self.window_need = max(1, -(-(sliding_window - 1) // block_size)) if sliding_window else 0
        self.lora_ids = {}
        self._reset_state()

    def _reset_state(self):
        self.block_hash = [None] * self.C   # the digest a block caches, or None
        self.ref = [0] * self.C
        self.free = collections.OrderedDict((b, None) for b in range(self.C))
        self.cached = {}                    # digest -> [blocks]; the first serves hits
        self.parent = {}                    # digest -> parent digest (None at the root)
        self.stored_seq = {}                # digest -> seq of the batch with its BlockStored
        self.meta = {}                      # digest -> what its BlockStored said of it
        self.opaque = set()                 # digests whose keys no decoder knows
        self.tier_lru = collections.OrderedDict()   # the second tier's digests, LRU first
        self.window = collections.OrderedDict()     # group 1's digests, LRU first
        self.waiting = collections.deque()
        self.running = []
        self.pending = []                   # events of this batch so far
        self._pending_stored = []           # digests stored in this batch so far
        self.published = []                 # (seq, events) when there is no publisher
        self._local_seq = 0
        self.steps = 0
        self._rid = 0
        self.counts = collections.Counter()

    # ---- hashing ----

    def lora_id(self, lora):
        if lora is None:
            return None
        return self.lora_ids.setdefault(lora, len(self.lora_ids) + 1)

    @staticmethod
    def extra_keys(i, salt=None, lora=None):
        keys = ([lora] if lora else []) + ([salt] if salt and i == 0 else [])
        return tuple(keys) if keys else None

    def _content(self, i, mm=None, embeds=None, legacy=None, opaque_at=None):
        """Block i's content keys: (mm triples, embeds digest, legacy values, opaque)."""
        return (mm_block_keys(mm, i, self.bs), None if embeds is None else embeds_digest(embeds, i),
                list((legacy or {}).get(i, ())), opaque_at == i)

    def block_keys(self, i, salt=None, lora=None, **keys):
        """What block i's hash covers besides its tokens and parent."""
        mm, emb, legacy, opaque = self._content(i, **keys)
        if not (mm or emb is not None or legacy or opaque):
            return self.extra_keys(i, salt, lora)
        return (lora, [[h, k] for _, h, k in mm], legacy, salt if i == 0 else None, emb, opaque)

    def event_keys(self, i, salt=None, lora=None, **keys):
        """Block i's extra_keys entry in a BlockStored, in keys_form."""
        mm, emb, legacy, opaque = self._content(i, **keys)
        salt = salt if i == 0 else None
        if self.keys_form == "typed":
            entry = kp.typed_extra_keys(lora, [(m, _bytes(h), k) for m, h, k in mm], salt, emb,
                                        legacy)
            return (entry or []) + [{"type": "kv_future", "id": i}] if opaque else entry
        return 7 if opaque else kp.raw_extra_keys(lora, mm, salt, emb, legacy)

    def route_extra_keys(self, tokens, **keys):
        """Route's block_extra_keys for a prompt: per block with content
        keys, the typed keys (str hashes here, bytes in typed events)."""
        out = {}
        for i in range(len(tokens) // self.bs):
            mm, emb, legacy, _ = self._content(i, **keys)
            typed = kp.typed_extra_keys(None, mm, None, emb, legacy)
            if typed:
                out[i] = typed
        return out

    def block_hashes(self, tokens, salt=None, lora=None, **keys):
        """The chain hashes of the prompt's full blocks."""
        out, parent = [], self.seed
        for i in range(len(tokens) // self.bs):
            parent = chain_hash(parent, tokens[i * self.bs:(i + 1) * self.bs],
                                self.block_keys(i, salt, lora, **keys))
            out.append(parent)
        return out

    # ---- the ground truth ----

    def cached_prefix_blocks(self, tokens, salt=None, lora=None, stored_since=None, **keys):
        n = 0
        for h in self.block_hashes(tokens, salt, lora, **keys):
            if h not in self.cached:
                break
            if stored_since is not None and self.stored_seq.get(h, -1) < stored_since:
                break
            n += 1
        return n

    def cached_blocks(self):
        return len(self.cached)

    def _knowable(self, hashes, since):
        """The leading hashes an index can know: not past an opaque block,
        nor (since=S) past one whose store went out before batch S."""
        n = 0
        for h in hashes:
            if h in self.opaque or (since is not None and self.stored_seq.get(h, -1) < since):
                break
            n += 1
        return hashes[:n]

    @staticmethod
    def _run(hashes, held):
        n = 0
        while n < len(hashes) and hashes[n] in held:
            n += 1
        return n

    def _usable(self, hashes):
        """The longest prefix both groups allow (hybrid) or group 0 holds."""
        full = self._run(hashes, self.cached)
        if not self.window_tokens:
            return full
        for n in range(full, 0, -1):
            if all(h in self.window for h in hashes[n - min(self.window_need, n):n]):
                return n
        return 0

    def route_answer(self, tokens, salt=None, lora=None, since=None, **keys):
        """What an exact index's Route answers for this engine: {"matched",
        "full", "mediums": {tier: run}} (module docstring)."""
        hashes = self._knowable(self.block_hashes(tokens, salt, lora, **keys), since)
        gpu = self._run(hashes, self.cached)
        mediums = {tier_name(self.medium): gpu} if gpu else {}
        if self.tier:
            run = self._run(hashes, self.tier_lru)
            if run:
                mediums[self.tier_medium] = run
            held = {h: None for h in hashes if h in self.cached or h in self.tier_lru}
            return {"matched": self._run(hashes, held), "full": self._run(hashes, held),
                    "mediums": mediums}
        return {"matched": self._usable(hashes), "full": gpu, "mediums": mediums}

    def medium_blocks(self):
        """Blocks held per tier, as an exact index's ListWorkers counts them
        (a block held in both groups of a hybrid engine once; not the blocks
        whose keys no decoder knows)."""
        out = {}
        held = (set(self.cached) | set(self.window)) - self.opaque
        if held:
            out[tier_name(self.medium)] = len(held)
        if self.tier_lru:
            out[self.tier_medium] = len(self.tier_lru)
        return out

    # ---- requests ----

    def submit(self, tokens, salt=None, lora=None, hold_steps=1, **keys):
        """Queues a request; it is admitted by step(). Refused at once when it
        needs more than C blocks. keys: mm, embeds, legacy, opaque_at (module
        docstring)."""
        self._rid += 1
        r = Request(self._rid, list(tokens), salt, lora, self.lora_id(lora), max(1, hold_steps),
                    self.block_hashes(tokens, salt, lora, **keys), keys)
        if self._blocks_needed(r) > self.C:
            r.state = REFUSED
            self.counts["refused"] += 1
        else:
            self.waiting.append(r)
        return r

    def _blocks_needed(self, r):
        return -(-len(r.tokens) // self.bs)

    def _stored_event(self, r, first, hashes, **fields):
        """BlockStored of r's blocks first.. (their hashes given)."""
        n = len(hashes)
        extra = [self.event_keys(i, r.salt, r.lora, **r.keys) for i in range(first, first + n)]
        fields = dict(self.store_fields, **fields)
        if self.spec_kind:
            fields.setdefault("kv_cache_spec_kind", self.spec_kind)
        return kp.block_stored(
            hashes, r.hashes[first - 1] if first else None,
            r.tokens[first * self.bs:(first + n) * self.bs], self.bs,
            lora_id=r.lora_id, medium=self.medium, lora_name=r.lora,
            extra_keys=extra if any(e is not None for e in extra) else None, **fields)

    def _removed_event(self, hashes, left=None, **fields):
        """BlockRemoved of the pool's hashes; left: each one's copies left
        (sent as remaining_copy_counts with copy_counts; default none)."""
        if self.copy_counts:
            fields["remaining_copy_counts"] = list(left or [0] * len(hashes))
        return kp.block_removed(hashes, medium=self.medium, **dict(self.remove_fields, **fields))

    def _admit(self, r):
        """Admits r if it fits now; True if it did."""
        usable = self._usable(r.hashes) if self.window_tokens else None
        hit = 0
        for h in r.hashes:
            if h not in self.cached:
                break
            hit += 1
        capped = False
        if self.recompute_last_block and hit * self.bs > len(r.tokens) - 1:
            hit -= 1
            capped = True
        hit_blocks = [self.cached[h][0] for h in r.hashes[:hit]]
        need = self._blocks_needed(r) - hit
        in_queue = sum(1 for b in hit_blocks if self.ref[b] == 0)
        if len(self.free) - in_queue < need:
            return False
        for b in hit_blocks:  # touch
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1
        removed, left = [], []
        new_blocks = []
        for _ in range(need):
            b, _ = self.free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:
                self.cached[h].remove(b)
                if not self.cached[h]:
                    del self.cached[h]
                    if self.tier:
                        self._to_tier(h)
                    self.parent.pop(h, None)
                    self.stored_seq.pop(h, None)
                    self.meta.pop(h, None)
                    self.opaque.discard(h)
                self.block_hash[b] = None
                removed.append(h)
                left.append(len(self.cached.get(h, ())))
                self.counts["evicted"] += 1
            self.ref[b] = 1
            new_blocks.append(b)
        group = {"group_idx": 0} if self.window_tokens else {}
        if removed:
            if self.coalesce_removed:
                self.pending.append(self._removed_event(removed, left, **group))
            else:
                self.pending += [self._removed_event([h], [n], **group)
                                 for h, n in zip(removed, left)]
        r.blocks = hit_blocks + new_blocks
        r.hit = hit
        # Prefill done: the new full blocks enter the cache.
        new_hashes = r.hashes[hit:]
        for i, h in enumerate(new_hashes):
            if h in self.cached:
                assert capped and i == 0, "a block computed twice"
                self.counts["duplicate_stores"] += 1
            b = new_blocks[i]
            self.block_hash[b] = h
            self.cached.setdefault(h, []).append(b)
            self.parent[h] = r.hashes[hit + i - 1] if hit + i > 0 else None
            self.meta[h] = (r, hit + i)
            if r.keys.get("opaque_at") is not None and hit + i >= r.keys["opaque_at"]:
                self.opaque.add(h)
        if new_hashes:
            self.pending.append(self._stored_event(r, hit, new_hashes, **group))
            self._pending_stored += new_hashes
            self.counts["stored"] += len(new_hashes)
        if self.window_tokens:
            self._window_admit(r, usable)
        self.counts["hit_blocks"] += hit
        self.counts["admitted"] += 1
        r.state = RUNNING
        r.remaining = r.hold_steps
        self.running.append(r)
        return True

    def _to_tier(self, h):
        """Moves an evicted block to the second tier (before its GPU removal)."""
        t = self.tier
        if h in self.tier_lru:
            self.tier_lru.move_to_end(h)
            return
        r, i = self.meta[h]
        where = {k: t[k] for k in ("locality", "ownership") if t.get(k)}
        fields = dict(self.store_fields, **where)
        if self.spec_kind:
            fields.setdefault("kv_cache_spec_kind", self.spec_kind)
        entry = self.event_keys(i, r.salt, r.lora, **r.keys)
        if t.get("placeholder"):
            self.pending.append(kp.block_stored(
                [h], None, [], 0, medium=t["medium"], group_idx=0,
                **{k: v for k, v in where.items() if k == "locality"}))
        else:
            self.pending.append(kp.block_stored(
                [h], self.parent.get(h), r.tokens[i * self.bs:(i + 1) * self.bs], self.bs,
                lora_id=r.lora_id, medium=t["medium"], lora_name=r.lora,
                extra_keys=None if entry is None else [entry], **fields))
        self.tier_lru[h] = None
        self.counts["offloaded"] += 1
        while len(self.tier_lru) > t["blocks"]:
            x, _ = self.tier_lru.popitem(last=False)
            self.pending.append(kp.block_removed([x], medium=t["medium"],
                                                 **dict(self.remove_fields, **where)))
            self.counts["tier_evicted"] += 1

    def _window_admit(self, r, usable):
        """Group 1 (sliding window): holds the window before the hit and
        stores what it lacks after it; the blocks that fell out of the
        window are freed first (LRU head), the rest at the end, tail first."""
        n, w = len(r.hashes), self.window_need
        lo = max(0, usable - w)
        run_start = None
        fields = {"group_idx": 1, "kv_cache_spec_kind": "sliding_window",
                  "kv_cache_spec_sliding_window": self.window_tokens}
        for i in range(lo, n + 1):
            new = i < n and r.hashes[i] not in self.window
            if new and run_start is None:
                run_start = i
            elif not new and run_start is not None:
                self.pending.append(self._stored_event(r, run_start, r.hashes[run_start:i],
                                                       **fields))
                self.counts["window_stored"] += i - run_start
                run_start = None
        mine = set(r.hashes[max(lo, n - w):])  # the window it just computed stays
        order = list(range(lo, max(lo, n - w))) + list(range(n - 1, max(lo, n - w) - 1, -1))
        for i in order:
            self.window[r.hashes[i]] = None
            self.window.move_to_end(r.hashes[i])
        evicted = []
        for h in list(self.window):
            if len(self.window) <= self.window_cap:
                break
            if h not in mine:
                del self.window[h]
                evicted.append(h)
        if evicted:
            self.pending.append(self._removed_event(evicted, group_idx=1))
            self.counts["window_evicted"] += len(evicted)

    def _free(self, r):
        for b in reversed(r.blocks):
            self.ref[b] -= 1
            assert self.ref[b] >= 0
            if self.ref[b] == 0:
                self.free[b] = None
        r.blocks = []
        r.state = FINISHED
        self.counts["finished"] += 1

    def step(self, append=()):
        """One scheduler step: admit what fits (FIFO), run, free the requests
        that are done; `append`: events added after this step's own (before
        the batch goes out). Returns the seq published, or None."""
        while self.waiting and self._admit(self.waiting[0]):
            self.waiting.popleft()
        still = []
        for r in self.running:
            r.remaining -= 1
            if r.remaining <= 0:
                self._free(r)
            else:
                still.append(r)
        self.running = still
        self.pending += list(append)
        self.steps += 1
        if self.steps % self.steps_per_batch == 0:
            return self.flush()
        return None

    def idle(self):
        return not self.waiting and not self.running

    def drain(self, max_steps=100_000):
        """Steps until nothing waits or runs; then flushes."""
        n = 0
        while not self.idle():
            self.step()
            n += 1
            assert n < max_steps, "the pool does not drain"
        return self.flush()

    def inject(self, event):
        """Adds an event (e.g. kv_publisher.unknown_event()) to the batch being built."""
        self.pending.append(event)

    def flush(self):
        """Publishes the pending events as one batch; returns its seq (None
        when there was nothing to publish)."""
        if not self.pending:
            return None
        events, stored = self.pending, self._pending_stored
        self.pending, self._pending_stored = [], []
        if self.publisher is not None:
            seq = self.publisher.publish(events)
        else:
            seq = self._local_seq
            self._local_seq += 1
            self.published.append((seq, events))
        for h in stored:
            if h in self.cached and h not in self.stored_seq:
                self.stored_seq[h] = seq
        self.counts["batches"] += 1
        return seq

    # ---- whole-pool events ----

    def reset_prefix_cache(self):
        """vLLM's reset_prefix_cache: drains the running and waiting requests
        first (vLLM refuses while blocks are in use), then forgets every
        cached hash and publishes AllBlocksCleared. Returns its batch's seq."""
        self.drain()
        for b in range(self.C):
            self.block_hash[b] = None
        for m in (self.cached, self.parent, self.stored_seq, self.meta, self.tier_lru,
                  self.window):
            m.clear()
        self.opaque.clear()
        self.pending.append(kp.all_blocks_cleared())
        return self.flush()

    def restart(self, publisher=None):
        """An engine restart: the pool comes back empty (requests lost) and
        the publisher's seq starts again at 0. publisher: the restarted
        engine's new publisher (a new process binds its sockets again),
        replacing the old one; without it the old one's seq is reset."""
        self._reset_state()
        if publisher is not None:
            self.publisher = publisher
        elif self.publisher is not None:
            self.publisher.restart()

    # ---- checks ----

    def check(self):
        """The pool's invariants (AssertionError if broken)."""
        held = {b for r in self.running for b in r.blocks}
        assert len(self.free) + len(held) == self.C, (len(self.free), len(held), self.C)
        for b in range(self.C):
            assert (b in self.free) == (self.ref[b] == 0), b
        assert sum(self.ref) == sum(len(r.blocks) for r in self.running)
        for h, blocks in self.cached.items():
            assert blocks and all(self.block_hash[b] == h for b in blocks)
            assert len(blocks) == 1 or self.recompute_last_block, "two blocks with one hash"
            p = self.parent[h]
            assert p is None or p in self.cached, "a cached block's parent was evicted"
        assert (sum(1 for h in self.block_hash if h is not None)
                == sum(len(v) for v in self.cached.values()))
        assert not self.tier or len(self.tier_lru) <= self.tier["blocks"]
        assert len(self.window) <= self.window_cap

    def stats(self):
        c = self.counts
        return ("%d admitted, %d refused, %d hit blocks, %d stored (%d again), %d evicted, "
                "%d cached, %d batches" % (c["admitted"], c["refused"], c["hit_blocks"],
                                           c["stored"], c["duplicate_stores"], c["evicted"],
                                           len(self.cached), c["batches"]))


# ---- SGLang ----

class _Node:
    """A radix node: a run of pages (blocks) and where they are."""
    __slots__ = ("hashes", "tokens", "parent", "children", "gpu", "host", "lock", "stamp",
                 "salt", "lora")

    def __init__(self, hashes, tokens, parent, gpu=True, host=False, lock=0, stamp=0,
                 salt=None, lora=None):
        self.salt = salt                # the request's cache salt (in every page's hash)
        self.lora = lora                # its LoRA adapter's name (ditto)
        self.hashes = hashes
        self.tokens = tokens            # the pages' tokens, flat
        self.parent = parent
        self.children = {}              # first page's hash -> node
        self.gpu = gpu
        self.host = host
        self.lock = lock
        self.stamp = stamp


class RadixPool(EnginePool):
    """SGLang's RadixCache (page size = block size) with HiCache's host tier,
    publishing SGLang's events: the ground truth for an SGLang worker.

    - The tree's nodes are runs of pages; a request matches the longest run
      of pages from the root (in either tier), splitting the node it ends
      in (no event), locks its path while it runs, and inserts its new
      pages as one new leaf node.
    - Its store is one BlockStored per up to `store_chunk` pages (64), each
      the child of the one before; a node's first store names the last page
      of its parent node (null below the root). medium GPU.
    - The GPU holds `num_blocks` pages (a running request's partial page
      counts). To make room it evicts unlocked GPU leaves (no child on the
      GPU), least recently used first: one BlockRemoved listing all the
      node's pages. With host_blocks > 0 (HiCache, write-back) an evicted
      node not yet on the host moves there first: its pages are stored in
      host_medium (CPU_PINNED), the host evicting its own least recently
      used host-only leaves (BlockRemoved in host_medium) to make room; a
      node that cannot get room goes with its host-only subtree.
    - A match that reaches host-only nodes loads them back (BlockStored on
      the GPU again; the host keeps its copy).
    - SGLang's events name no LoRA (lora is refused) until its newest
      releases (salt_layout "named"), whose stores name the request's
      adapter in lora_name (a LoRA's pages share no hash with others'). A
      cache salt (in every page's hash: salted prompts share no page with
      others) goes on
      the wire per `salt_layout`, in every store of the salted node:
      "metadata" (some releases): SGLang's metadata map {"cache_salt": S}
      right after medium; "extra_keys" (later ones): vLLM's positions up to
      ownership, extra_keys [["dynamo-cache-salt:S"]] (the first block's
      entry) and the metadata map after ownership; "named" (the newest):
      every store a tagged map with SGLang's own fields, the salt its
      cache_salt (kv_publisher.sglang_block_stored; the publisher's
      encoding must be "array_of_maps"). None refuses salts.
    - eagle=True: SGLang under EAGLE speculative decoding keys position j
      by the pair (token j, token j+1). A page of block_size pairs spans
      block_size + 1 tokens, its hash covers them all, a prompt of n tokens
      has (n - 1) // block_size pages, and a store's token_ids are the
      pairs, [[t_j, t_j+1], ...].
    Events go out as in EnginePool (one batch per step with events).
    """

    def __init__(self, num_blocks, block_size=16, publisher=None, host_blocks=0,
                 host_medium="CPU_PINNED", store_chunk=64, eagle=False, salt_layout=None,
                 **kw):
        if salt_layout == "named" and getattr(publisher, "encoding", None) != "array_of_maps":
            raise ValueError('salt_layout "named" is the newest SGLang\'s: its publisher\'s '
                             'encoding must be "array_of_maps"')
        self.salt_layout = salt_layout
        self.host_cap = host_blocks
        self.host_medium = host_medium
        self.store_chunk = store_chunk
        self.eagle = eagle
        self.tail = 1 if eagle else 0  # tokens a node keeps past its pages
        super().__init__(num_blocks, block_size, publisher, **kw)

    def block_hashes(self, tokens, salt=None, lora=None, **keys):
        if not self.eagle:
            return super().block_hashes(tokens, salt, lora, **keys)
        out, parent = [], self.seed
        for i in range(max(len(tokens) - 1, 0) // self.bs):
            parent = chain_hash(parent, tokens[i * self.bs:(i + 1) * self.bs + 1],
                                self.block_keys(i, salt, lora, **keys))
            out.append(parent)
        return out

    def _reset_state(self):
        super()._reset_state()
        self.root = _Node([], [], None, gpu=True)
        self.gpu_used = 0
        self.host_used = 0
        self.clock = 0

    @property
    def takes_lora(self):
        """Whether this SGLang's events can name a request's LoRA."""
        return self.salt_layout == "named"

    def submit(self, tokens, salt=None, lora=None, hold_steps=1, **keys):
        if keys or (lora and not self.takes_lora) or (salt and not self.salt_layout):
            raise ValueError("SGLang's events carry no extra keys, a LoRA only with "
                             "salt_layout \"named\", a salt only with a salt_layout")
        return super().submit(tokens, salt, lora, hold_steps=hold_steps)

    # ---- the tree ----

    def _nodes(self, node=None):
        stack = [node or self.root]
        while stack:
            n = stack.pop()
            if n is not self.root:
                yield n
            stack.extend(n.children.values())

    def _match(self, hashes, split=True):
        """(path of nodes from the root, pages matched); with split, the
        node the match ends in is split there."""
        node, i, path = self.root, 0, []
        while i < len(hashes):
            child = node.children.get(hashes[i])
            if child is None:
                break
            k, n = 0, min(len(child.hashes), len(hashes) - i)
            while k < n and child.hashes[k] == hashes[i + k]:
                k += 1
            if k < len(child.hashes):
                if not split:
                    path.append(child)
                    i += k
                    break
                child = self._split(child, k)
            path.append(child)
            node = child
            i += k
        return path, i

    def _split(self, node, k):
        head = _Node(node.hashes[:k], node.tokens[:k * self.bs + self.tail], node.parent,
                     node.gpu, node.host, node.lock, node.stamp, node.salt, node.lora)
        node.parent.children[head.hashes[0]] = head
        node.hashes, node.tokens, node.parent = node.hashes[k:], node.tokens[k * self.bs:], head
        head.children = {node.hashes[0]: node}
        self.counts["splits"] += 1
        return head

    def _parent_hash(self, node):
        return node.parent.hashes[-1] if node.parent is not self.root else None

    def _store(self, node, medium):
        parent = self._parent_hash(node)
        for a in range(0, len(node.hashes), self.store_chunk):
            hs = node.hashes[a:a + self.store_chunk]
            tokens = node.tokens[a * self.bs:(a + len(hs)) * self.bs + self.tail]
            if self.eagle:
                tokens = [[tokens[j], tokens[j + 1]] for j in range(len(tokens) - 1)]
            if self.salt_layout == "named":
                self.pending.append(kp.sglang_block_stored(
                    hs, parent, tokens, self.bs, medium=medium, cache_salt=node.salt,
                    lora_name=node.lora))
            elif node.salt is None:
                self.pending.append(kp.block_stored(
                    hs, parent, tokens, self.bs, medium=medium, **self.store_fields))
            else:
                self.pending.append(self._salted_stored(hs, parent, tokens, medium, node.salt))
            parent = hs[-1]

    def _salted_stored(self, hashes, parent, tokens, medium, salt):
        fields = [("block_hashes", list(hashes)), ("parent_block_hash", parent),
                  ("token_ids", tokens), ("block_size", self.bs), ("lora_id", None),
                  ("medium", medium)]
        if self.salt_layout == "extra_keys":
            fields += [("lora_name", None), ("extra_keys", [["dynamo-cache-salt:" + salt]]),
                       ("group_idx", None), ("kv_cache_spec_kind", None),
                       ("kv_cache_spec_sliding_window", None), ("locality", None),
                       ("ownership", None)]
        fields.append(("metadata", {"cache_salt": salt}))
        return kp.Event("BlockStored", fields)

    def _removed(self, node, medium):
        self.pending.append(kp.block_removed(node.hashes, medium=medium, **self.remove_fields))

    def _delete(self, node):
        del node.parent.children[node.hashes[0]]

    # ---- eviction ----

    def _lru(self, pred):
        best = None
        for n in self._nodes():
            if pred(n) and (best is None or n.stamp < best.stamp):
                best = n
        return best

    def _evict_host(self, pages):
        """Frees host room for `pages` by evicting host-only leaves; False
        if it cannot."""
        while self.host_used + pages > self.host_cap:
            n = self._lru(lambda n: n.host and not n.gpu and not n.children and n.lock == 0)
            if n is None:
                return False
            self._removed(n, self.host_medium)
            self.host_used -= len(n.hashes)
            self._delete(n)
            self.counts["host_evicted"] += len(n.hashes)
        return True

    def _drop_subtree(self, node):
        """Removes a GPU node that cannot move to the host, with its host-only
        descendants (leaves first)."""
        for c in list(node.children.values()):
            self._drop_subtree(c)
        if node.host:
            self._removed(node, self.host_medium)
            self.host_used -= len(node.hashes)
        if node.gpu:
            self._removed(node, self.medium)
            self.gpu_used -= len(node.hashes)
        self._delete(node)

    def _evict_gpu(self, need):
        while self.C - self.gpu_used < need:
            n = self._lru(lambda n: n.gpu and n.lock == 0
                          and not any(c.gpu for c in n.children.values()))
            if n is None:
                return False
            self.counts["evicted"] += len(n.hashes)
            if self.host_cap and (n.host or self._evict_host(len(n.hashes))):
                if not n.host:
                    self._store(n, self.host_medium)
                    n.host = True
                    self.host_used += len(n.hashes)
                    self.counts["offloaded"] += len(n.hashes)
                self._removed(n, self.medium)
                n.gpu = False
                self.gpu_used -= len(n.hashes)
            elif n.children:
                self._drop_subtree(n)
            else:
                self._removed(n, self.medium)
                self.gpu_used -= len(n.hashes)
                self._delete(n)
        return True

    # ---- requests ----

    def _admit(self, r):
        self.clock += 1
        path, hit = self._match(r.hashes)
        back = [n for n in path if not n.gpu]
        need = self._blocks_needed(r) - hit + sum(len(n.hashes) for n in back)
        for n in path:
            n.lock += 1
        if not self._evict_gpu(need):
            for n in path:
                n.lock -= 1
            return False
        for n in back:  # load back from the host
            n.gpu = True
            self.gpu_used += len(n.hashes)
            self._store(n, self.medium)
            self.counts["loaded_back"] += len(n.hashes)
        node = path[-1] if path else self.root
        if hit < len(r.hashes):
            leaf = _Node(r.hashes[hit:],
                         r.tokens[hit * self.bs:len(r.hashes) * self.bs + self.tail], node,
                         lock=1, salt=r.salt, lora=r.lora)
            node.children[leaf.hashes[0]] = leaf
            self.gpu_used += len(leaf.hashes)
            self._store(leaf, self.medium)
            self.counts["stored"] += len(leaf.hashes)
            node = leaf
        r.partial = self._blocks_needed(r) - len(r.hashes)
        self.gpu_used += r.partial
        r.blocks = [node]
        r.hit = hit
        for n in [node] + path:
            n.stamp = self.clock
        self.counts["hit_blocks"] += hit
        self.counts["admitted"] += 1
        r.state = RUNNING
        r.remaining = r.hold_steps
        self.running.append(r)
        return True

    def _free(self, r):
        self.clock += 1
        n = r.blocks[0]
        while n is not self.root:
            n.lock -= 1
            assert n.lock >= 0
            n.stamp = self.clock
            n = n.parent
        self.gpu_used -= r.partial
        r.blocks = []
        r.state = FINISHED
        self.counts["finished"] += 1

    # ---- the ground truth ----

    def _held(self, tier):
        out = {}
        for n in self._nodes():
            if tier is None or getattr(n, tier):
                out.update((h, None) for h in n.hashes)
        return out

    @property
    def cached(self):
        return self._held("gpu")

    @cached.setter
    def cached(self, value):  # EnginePool._reset_state assigns it
        pass

    def cached_prefix_blocks(self, tokens, salt=None, lora=None, stored_since=None, **keys):
        return self._match(self.block_hashes(tokens, salt, lora), split=False)[1]

    def cached_blocks(self):
        return sum(len(n.hashes) for n in self._nodes())

    def route_answer(self, tokens, salt=None, lora=None, since=None, **keys):
        hashes = self.block_hashes(tokens, salt, lora)
        matched = self._match(hashes, split=False)[1]
        mediums = {}
        for tier, name in (("gpu", tier_name(self.medium)), ("host", tier_name(self.host_medium))):
            run = self._run(hashes, self._held(tier))
            if run:
                mediums[name] = run
        return {"matched": matched, "full": matched, "mediums": mediums}

    def medium_blocks(self):
        out = {}
        for tier, name in (("gpu", tier_name(self.medium)), ("host", tier_name(self.host_medium))):
            n = sum(len(x.hashes) for x in self._nodes() if getattr(x, tier))
            if n:
                out[name] = n
        return out

    def reset_prefix_cache(self):
        self.drain()
        self.root = _Node([], [], None)
        self.gpu_used = self.host_used = 0
        self.pending.append(kp.all_blocks_cleared())
        return self.flush()

    def check(self):
        gpu = host = 0
        for n in self._nodes():
            assert n.gpu or n.host, "a node in no tier"
            assert n.parent.children.get(n.hashes[0]) is n
            assert not n.gpu or n.parent is self.root or n.parent.gpu, "a GPU node under a host one"
            assert n.lock >= 0
            assert len(n.tokens) == len(n.hashes) * self.bs + self.tail, "a node's tokens"
            gpu += len(n.hashes) if n.gpu else 0
            host += len(n.hashes) if n.host else 0
        assert gpu + sum(r.partial for r in self.running) == self.gpu_used <= self.C
        assert host == self.host_used <= max(self.host_cap, 0)
        locks = collections.Counter()
        for r in self.running:
            n = r.blocks[0]
            while n is not self.root:
                locks[id(n)] += 1
                n = n.parent
        assert all(n.lock == locks[id(n)] for n in self._nodes()), "locks"
