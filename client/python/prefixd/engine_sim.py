"""An inference engine's KV-block bookkeeping, driven by a real trace, using
prefixd exactly as an engine would (docs/integration.md walks through it).

The engine owns a paged pool of N block IDs. At start-up it Handshakes (the
daemon must serve the engine's model geometry) and Resets its tenant (what
the daemon holds names slots of a previous engine process). For each request:

  1. Match(prompt, pin=True): the cached prefix; its blocks are pinned by a
     lease, the request reads them instead of computing them.
  2. Allocate blocks for the rest of the prompt and for decoding. When the
     allocator runs dry: Evict(shortfall) and free what comes back; if that
     is not enough (the pool is pinned by running requests), wait for the
     oldest running request to finish.
  3. After prefill: Insert(the prompt's whole blocks, matched IDs + new IDs,
     pin=True). The new blocks now belong to the cache. Free every ID in
     redundant_block_ids (another request cached the same blocks first; the
     Insert lease pins the cached copies) and in evicted_block_ids. Release
     the Match lease: the Insert lease covers the whole path.
  4. Every step: KeepAlive every lease still held.
  5. When the request finishes: Release its lease; free its private blocks
     (the partial last prompt block, the decode blocks, redundant copies).

  On an epoch change (the daemon lost its state), every block the cache held
  is reclaimed: freed at once if no running request reads it, else when the
  last one finishes; the leases are gone; the engine Handshakes again.

Each block has a reference count (running requests reading it) and a
`cached` flag (prefixd owns it). The ledger, checked after every step:
free + held by running requests + held by the cache == N, with the free list
exactly the blocks nobody holds.

Requests come from a Mooncake trace (tests/data/mooncake, one JSON object
per line; every hash id is one block of 512 tokens, expanded into block_size
synthetic tokens that depend only on the id).

    python3 -m prefixd.engine_sim --addr unix:///run/prefixd/prefixd.sock \\
        --blocks 2048 --requests 1000
"""

import argparse
import collections
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Optional

import prefixd

TRACE_BLOCK_TOKENS = 512  # Mooncake: tokens per hash id
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
DEFAULT_TRACE = os.path.join(REPO, "tests", "data", "mooncake", "synthetic_trace.jsonl")


@dataclass
class TraceRequest:
    index: int
    input_length: int
    output_length: int
    hash_ids: List[int]


def read_trace(path: str, limit: Optional[int] = None) -> Iterator[TraceRequest]:
    with open(path) as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                return
            r = json.loads(line)
            yield TraceRequest(i, r["input_length"], r["output_length"], r["hash_ids"])


class LedgerError(AssertionError):
    pass


class BlockPool:
    """The engine's paged KV pool: IDs base..base+n-1, a free list, and per
    block a reference count and whether prefixd owns it."""

    def __init__(self, n: int, base: int = 1):
        self.n = n
        self.ids = range(base, base + n)
        self.free_list = collections.deque(self.ids)
        self.ref: Dict[int, int] = {b: 0 for b in self.ids}
        self.cached = set()

    def allocate(self, k: int) -> Optional[List[int]]:
        if k > len(self.free_list):
            return None
        out = [self.free_list.popleft() for _ in range(k)]
        for b in out:
            self.ref[b] = 1
        return out

    def hold(self, b: int) -> None:
        self.ref[b] += 1

    def drop(self, b: int) -> None:
        if self.ref[b] <= 0:
            raise LedgerError("block %d dropped with no holder" % b)
        self.ref[b] -= 1
        self._free_if_unused(b)

    def adopt(self, b: int) -> None:
        """prefixd now owns b (Insert adopted it)."""
        self.cached.add(b)

    def uncache(self, b: int) -> None:
        """prefixd handed b back (evicted, invalidated, or its state lost)."""
        if b not in self.cached:
            raise LedgerError("prefixd returned block %d, which it did not hold" % b)
        self.cached.remove(b)
        self._free_if_unused(b)

    def _free_if_unused(self, b: int) -> None:
        if self.ref[b] == 0 and b not in self.cached:
            self.free_list.append(b)

    def held_by_running(self) -> int:
        return sum(1 for b in self.ids if self.ref[b] > 0 and b not in self.cached)

    def check(self) -> None:
        """The ledger: every block exactly once in free, running or cache."""
        free = set(self.free_list)
        if len(free) != len(self.free_list):
            raise LedgerError("a block is on the free list twice")
        unused = {b for b in self.ids if self.ref[b] == 0 and b not in self.cached}
        if free != unused:
            raise LedgerError("free list %d blocks, unused blocks %d: lost %s, in use %s"
                              % (len(free), len(unused), sorted(unused - free)[:5],
                                 sorted(free - unused)[:5]))
        total = len(free) + self.held_by_running() + len(self.cached)
        if total != self.n:
            raise LedgerError("free %d + running %d + cached %d = %d != %d"
                              % (len(free), self.held_by_running(), len(self.cached), total,
                                 self.n))


@dataclass
class Running:
    req: TraceRequest
    blocks: List[int]                    # every block it holds a reference on
    leases: List[prefixd.Lease] = field(default_factory=list)
    steps_left: int = 1
    prompt: List[int] = field(default_factory=list)      # its whole blocks' tokens
    insert_ids: List[int] = field(default_factory=list)  # what to Insert after prefill


@dataclass
class Report:
    requests: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    saved_tokens: int = 0      # prefill tokens not computed thanks to a match
    matched_blocks: int = 0
    prompt_blocks: int = 0     # whole prompt blocks offered to Match
    inserted_blocks: int = 0
    redundant_blocks: int = 0
    evicted_by_insert: int = 0
    evicted_by_request: int = 0
    evict_calls: int = 0
    waits: int = 0             # times admission waited for a running request
    insert_refused: int = 0    # RESOURCE_EXHAUSTED: pinned blocks fill the budget
    epoch_changes: int = 0
    reclaimed_blocks: int = 0
    evicted_in_use: int = 0    # only possible after an epoch change dropped leases
    free: int = 0
    running: int = 0
    cached: int = 0

    @property
    def hit_rate(self) -> float:
        return self.matched_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    def summary(self) -> str:
        return ("%d requests (%d rejected): %d of %d prefill tokens saved (%.1f%% of whole "
                "prompt blocks hit); %d blocks inserted, %d redundant, %d evicted by Insert, "
                "%d by Evict (%d calls), %d waits, %d epoch changes (%d blocks reclaimed); "
                "ledger free %d + running %d + cached %d"
                % (self.requests, self.rejected, self.saved_tokens, self.prompt_tokens,
                   100 * self.hit_rate, self.inserted_blocks, self.redundant_blocks,
                   self.evicted_by_insert, self.evicted_by_request, self.evict_calls,
                   self.waits, self.epoch_changes, self.reclaimed_blocks, self.free,
                   self.running, self.cached))


class EngineSim:
    def __init__(self, client: prefixd.Client, n_blocks: int, *, namespace: str = "",
                 batch: int = 4, max_running: int = 16, block_id_base: int = 1,
                 check_every_step: bool = True, engine_id: str = "engine-sim",
                 model_fingerprint: Optional[str] = None):
        """`model_fingerprint`: the engine's own (model/kv_geometry.h); the
        simulator has no model, so by default it takes the daemon's."""
        self.client = client
        self.engine_id = engine_id
        self.ns = namespace
        self.batch = batch
        self.max_running = max_running
        self.check_every_step = check_every_step
        self.pool = BlockPool(n_blocks, block_id_base)
        info = client.info()
        self.block_size = info.block_size
        self.fingerprint = model_fingerprint or info.model_fingerprint
        client.handshake(engine_id, self.fingerprint)  # FailedPrecondition: wrong model
        # A new engine process has a new, empty KV pool: whatever prefixd
        # still holds for this tenant names slots of the previous process.
        # Drop it; the IDs that come back mean nothing to this pool.
        self.stale_on_start = len(client.reset())
        self.running: List[Running] = []
        self.report = Report()
        self.steps = 0
        # Called with the simulator after every step (tests look inside here).
        self.step_hook: Optional[Callable[["EngineSim"], None]] = None
        self._chain = client.on_epoch_change
        client.on_epoch_change = self._on_epoch_change

    # ---- what prefixd hands back ----

    def _on_epoch_change(self, old: int, new: int) -> None:
        """The daemon lost its state: everything it held comes back."""
        self.report.epoch_changes += 1
        lost = list(self.pool.cached)
        self.report.reclaimed_blocks += len(lost)
        for b in lost:
            self.pool.uncache(b)
        for r in self.running:  # their leases died with the old state
            for lease in r.leases:
                lease.detach()
            r.leases.clear()
        self.client.handshake(self.engine_id, self.fingerprint)
        if self._chain is not None:
            self._chain(old, new)

    def _handed_back(self, ids: Iterable[int]) -> None:
        """Evicted (or invalidated) IDs: ours again, free unless in use."""
        for b in ids:
            if b not in self.pool.cached:
                raise LedgerError("prefixd returned block %d, which it did not hold" % b)
            if self.pool.ref[b] > 0:
                self.report.evicted_in_use += 1
            self.pool.uncache(b)

    @staticmethod
    def _release(lease: Optional[prefixd.Lease]) -> None:
        try:
            if lease:
                lease.release()
        except prefixd.NotFound:
            pass  # expired, or the daemon restarted: the lease died with its state

    # ---- the request path ----

    def tokens(self, hash_ids: List[int]) -> List[int]:
        bs = self.block_size
        return [h * bs + j for h in hash_ids for j in range(bs)]

    def run(self, requests: Iterable[TraceRequest]) -> Report:
        """Replays `requests` in batches: admit (Match, allocate) up to
        `batch` of them, prefill them together, Insert each, then one step
        of decoding for everything running."""
        pending = collections.deque(requests)
        while pending or self.running:
            admitted = []
            while (pending and len(admitted) < self.batch and
                   len(self.running) < self.max_running):
                run = self.admit(pending[0])
                if run is not None:
                    pending.popleft()
                    admitted.append(run)
                elif self.running:
                    break  # wait for running requests to finish
                else:
                    pending.popleft()  # cannot fit even in an empty pool
                    self.report.rejected += 1
            for run in admitted:  # prefill done: offer the new blocks
                if run.insert_ids:
                    self.insert(run, run.prompt, run.insert_ids)
            self.step()
            self.steps += 1
            if self.step_hook is not None:
                self.step_hook(self)
        self.finish_all()
        return self.final_report()

    def admit(self, req: TraceRequest) -> Optional[Running]:
        """Match and allocate; None when the blocks are not there yet."""
        whole = req.input_length // TRACE_BLOCK_TOKENS  # the partial last block is private
        total = -(-(req.input_length + req.output_length) // TRACE_BLOCK_TOKENS)
        prompt = self.tokens(req.hash_ids[:whole])
        m = (self.client.match(prompt, namespace=self.ns, pin=True)
             if whole else prefixd.MatchResult(0, 0, []))
        matched = m.block_ids
        for b in matched:
            if b not in self.pool.cached:
                raise LedgerError("Match returned block %d, which the cache does not hold" % b)
            self.pool.hold(b)  # before allocating: an epoch change may reclaim them
        fresh = self.allocate(total - len(matched))
        if fresh is None:
            self._release(m.lease)
            for b in matched:
                self.pool.drop(b)
            return None
        run = Running(req, matched + fresh, steps_left=1 + req.output_length // 256,
                      prompt=prompt)
        if m.lease:
            run.leases.append(m.lease)
        self.running.append(run)
        rep = self.report
        rep.requests += 1
        rep.prompt_tokens += req.input_length
        rep.prompt_blocks += whole
        rep.matched_blocks += len(matched)
        rep.saved_tokens += len(matched) * TRACE_BLOCK_TOKENS
        if len(matched) < whole:
            run.insert_ids = matched + fresh[:whole - len(matched)]
        return run

    def allocate(self, k: int) -> Optional[List[int]]:
        """k blocks, evicting the shortfall from the cache; None if the pool
        is held by running requests."""
        short = k - len(self.pool.free_list)
        if short > 0:
            self.report.evict_calls += 1
            evicted = self.client.evict(short)
            self.report.evicted_by_request += len(evicted)
            self._handed_back(evicted)
        got = self.pool.allocate(k)
        if got is None:
            self.report.waits += 1
        return got

    def insert(self, run: Running, prompt: List[int], ids: List[int]) -> None:
        try:
            r = self.client.insert(prompt, ids, namespace=self.ns, pin=True)
        except prefixd.ResourceExhausted:
            self.report.insert_refused += 1  # the blocks stay private to the request
            return
        redundant = set(r.redundant_block_ids)
        for b in ids:
            if b not in redundant and b not in self.pool.cached:
                self.pool.adopt(b)
                self.report.inserted_blocks += 1
        self.report.evicted_by_insert += len(r.evicted_block_ids)
        self._handed_back(r.evicted_block_ids)
        if redundant:
            self.swap_redundant(run, prompt, ids, redundant)
        for lease in run.leases:  # the Insert lease covers the whole path
            self._release(lease)
        run.leases = [r.lease] if r.lease else []

    def swap_redundant(self, run: Running, prompt: List[int], ids: List[int],
                       redundant: set) -> None:
        """Another request cached some of these blocks first: read its copies
        (the Insert lease pins them) and free ours."""
        self.report.redundant_blocks += len(redundant)
        cached_path = self.client.match(prompt, namespace=self.ns).block_ids
        for i, b in enumerate(ids):
            if b in redundant:
                if i < len(cached_path):
                    self.pool.hold(cached_path[i])
                    run.blocks.append(cached_path[i])
                run.blocks.remove(b)
                self.pool.drop(b)

    def step(self) -> None:
        """One engine step: renew leases, retire finished requests, check."""
        self.keepalive()
        for r in list(self.running):
            r.steps_left -= 1
            if r.steps_left <= 0:
                self.finish(r)
        if self.check_every_step:
            self.pool.check()

    def keepalive(self) -> None:
        leases = [l for r in self.running for l in r.leases]
        if not leases:
            return
        try:
            self.client.keepalive([l.id for l in leases])
        except prefixd.NotFound:
            # KeepAlive carries no epoch: ask for it (a change calls back and
            # drops every lease); else some lease expired: renew one by one.
            self.client.info()
            for r in self.running:
                for lease in list(r.leases):
                    try:
                        lease.keepalive()
                    except prefixd.NotFound:
                        r.leases.remove(lease)

    def finish(self, run: Running) -> None:
        for lease in run.leases:
            self._release(lease)
        for b in run.blocks:
            self.pool.drop(b)
        self.running.remove(run)

    def finish_all(self) -> None:
        for r in list(self.running):
            self.finish(r)
        self.pool.check()

    def final_report(self) -> Report:
        self.report.free = len(self.pool.free_list)
        self.report.running = self.pool.held_by_running()
        self.report.cached = len(self.pool.cached)
        return self.report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Replay a Mooncake trace through prefixd as an "
                                 "engine would, and report the prefill saved.")
    ap.add_argument("--addr", default="unix:///tmp/prefixd.sock",
                    help="prefixd address (host:port or unix:///path)")
    ap.add_argument("--tenant", default=None)
    ap.add_argument("--token", default=os.environ.get("PREFIXD_TOKEN"))
    ap.add_argument("--namespace", default="")
    ap.add_argument("--trace", default=DEFAULT_TRACE,
                    help="Mooncake JSONL trace (default: tests/data/mooncake/"
                    "synthetic_trace.jsonl from the repository root)")
    ap.add_argument("--requests", type=int, default=None, help="replay only the first N")
    ap.add_argument("--blocks", type=int, default=None,
                    help="engine pool size N (default: the daemon's budget_blocks)")
    ap.add_argument("--batch", type=int, default=4, help="requests admitted per step")
    ap.add_argument("--max_running", type=int, default=16)
    ap.add_argument("--fingerprint", default=None,
                    help="the engine's model fingerprint for Handshake (default: the daemon's)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    client = prefixd.Client(args.addr, tenant=args.tenant, token=args.token)
    n = args.blocks or client.info().budget_blocks
    sim = EngineSim(client, n, namespace=args.namespace, batch=args.batch,
                    max_running=args.max_running, model_fingerprint=args.fingerprint)
    report = sim.run(read_trace(args.trace, args.requests))
    if args.json:
        d = dict(report.__dict__, hit_rate=report.hit_rate)
        print(json.dumps(d, sort_keys=True))
    else:
        print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
