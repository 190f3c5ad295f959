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
  cached. An exact index must count a worker's stores of a hash. Off by
  default (then the pool never holds two blocks with one hash).
- Events accumulate in the pool and go to the publisher as one batch at the
  end of every `steps_per_batch`-th step that produced any (vLLM publishes
  one batch per scheduler step that has events).

cached_prefix_blocks(tokens, salt, lora) is how many leading full blocks of
a prompt the cache holds right now. With stored_since=S it counts only
blocks whose BlockStored went out in a batch with seq >= S (stopping at the
first that did not): what an index that lost every batch before S can know
(exact without recompute_last_block; with it, the seq of the store that
began the hash's current stay in the cache).

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


class Request:
    __slots__ = ("rid", "tokens", "salt", "lora", "lora_id", "hold_steps", "hashes", "blocks",
                 "hit", "remaining", "state")

    def __init__(self, rid, tokens, salt, lora, lora_id, hold_steps, hashes):
        self.rid = rid
        self.tokens = tokens
        self.salt = salt
        self.lora = lora
        self.lora_id = lora_id
        self.hold_steps = hold_steps
        self.hashes = hashes
        self.blocks = []
        self.hit = 0
        self.remaining = 0
        self.state = WAITING

    def __repr__(self):
        return "Request(%d, %d tokens, %s, hit %d)" % (self.rid, len(self.tokens), self.state,
                                                      self.hit)


class EnginePool:
    def __init__(self, num_blocks, block_size=16, publisher=None, steps_per_batch=1,
                 hash_seed=b"", medium=kp.MEDIUM_GPU, coalesce_removed=False, spec_kind=None,
                 recompute_last_block=False, name="engine"):
        """publisher: a kv_publisher.Publisher, or None (events are kept in
        .published as (seq, events) instead). coalesce_removed: the
        BlockRemoved hashes of one allocation in one event (vLLM emits one
        event per evicted block). spec_kind: adds kv_cache_spec_kind=<it> to
        every BlockStored (a field the newest vLLM writes and an older
        decoder does not know)."""
        self.C = num_blocks
        self.bs = block_size
        self.publisher = publisher
        self.steps_per_batch = steps_per_batch
        self.seed = hashlib.sha256(b"prefixd-test-engine-seed" + hash_seed).digest()
        self.medium = medium
        self.coalesce_removed = coalesce_removed
        self.spec_kind = spec_kind
        self.recompute_last_block = recompute_last_block
        self.name = name
        self.lora_ids = {}
        self._reset_state()

    def _reset_state(self):
        self.block_hash = [None] * self.C   # the digest a block caches, or None
        self.ref = [0] * self.C
        self.free = collections.OrderedDict((b, None) for b in range(self.C))
        self.cached = {}                    # digest -> [blocks]; the first serves hits
        self.parent = {}                    # digest -> parent digest (None at the root)
        self.stored_seq = {}                # digest -> seq of the batch with its BlockStored
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

    def block_hashes(self, tokens, salt=None, lora=None):
        """The chain hashes of the prompt's full blocks."""
        out, parent = [], self.seed
        for i in range(len(tokens) // self.bs):
            parent = chain_hash(parent, tokens[i * self.bs:(i + 1) * self.bs],
                                self.extra_keys(i, salt, lora))
            out.append(parent)
        return out

    # ---- the ground truth ----

    def cached_prefix_blocks(self, tokens, salt=None, lora=None, stored_since=None):
        n = 0
        for h in self.block_hashes(tokens, salt, lora):
            if h not in self.cached:
                break
            if stored_since is not None and self.stored_seq.get(h, -1) < stored_since:
                break
            n += 1
        return n

    def cached_blocks(self):
        return len(self.cached)

    # ---- requests ----

    def submit(self, tokens, salt=None, lora=None, hold_steps=1):
        """Queues a request; it is admitted by step(). Refused at once when it
        needs more than C blocks."""
        self._rid += 1
        r = Request(self._rid, list(tokens), salt, lora, self.lora_id(lora), max(1, hold_steps),
                    self.block_hashes(tokens, salt, lora))
        if self._blocks_needed(r) > self.C:
            r.state = REFUSED
            self.counts["refused"] += 1
        else:
            self.waiting.append(r)
        return r

    def _blocks_needed(self, r):
        return -(-len(r.tokens) // self.bs)

    def _admit(self, r):
        """Admits r if it fits now; True if it did."""
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
        removed = []
        new_blocks = []
        for _ in range(need):
            b, _ = self.free.popitem(last=False)
            h = self.block_hash[b]
            if h is not None:
                self.cached[h].remove(b)
                if not self.cached[h]:
                    del self.cached[h]
                    self.parent.pop(h, None)
                    self.stored_seq.pop(h, None)
                self.block_hash[b] = None
                removed.append(h)
                self.counts["evicted"] += 1
            self.ref[b] = 1
            new_blocks.append(b)
        if removed:
            if self.coalesce_removed:
                self.pending.append(kp.block_removed(removed, medium=self.medium))
            else:
                self.pending += [kp.block_removed([h], medium=self.medium) for h in removed]
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
        if new_hashes:
            extra = [self.extra_keys(i, r.salt, r.lora) for i in range(hit, len(r.hashes))]
            fields = {"kv_cache_spec_kind": self.spec_kind} if self.spec_kind else {}
            self.pending.append(kp.block_stored(
                new_hashes, r.hashes[hit - 1] if hit else None,
                r.tokens[hit * self.bs:len(r.hashes) * self.bs], self.bs,
                lora_id=r.lora_id, medium=self.medium, lora_name=r.lora,
                extra_keys=extra if any(e is not None for e in extra) else None, **fields))
            self._pending_stored += new_hashes
            self.counts["stored"] += len(new_hashes)
        self.counts["hit_blocks"] += hit
        self.counts["admitted"] += 1
        r.state = RUNNING
        r.remaining = r.hold_steps
        self.running.append(r)
        return True

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
        self.cached.clear()
        self.parent.clear()
        self.stored_seq.clear()
        self.pending.append(kp.all_blocks_cleared())
        return self.flush()

    def restart(self):
        """An engine restart: the pool comes back empty (requests lost) and
        the publisher's seq starts again at 0."""
        self._reset_state()
        if self.publisher is not None:
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

    def stats(self):
        c = self.counts
        return ("%d admitted, %d refused, %d hit blocks, %d stored (%d again), %d evicted, "
                "%d cached, %d batches" % (c["admitted"], c["refused"], c["hit_blocks"],
                                           c["stored"], c["duplicate_stores"], c["evicted"],
                                           len(self.cached), c["batches"]))
