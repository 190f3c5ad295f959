#!/usr/bin/python3
"""The fleet index (docs/index.md) end to end: the real prefixd binary
subscribed over ZeroMQ to five simulated engines that publish KV events
exactly as stock vLLM and SGLang do (kv_publisher.py), each engine a paged
pool with prefix caching and LRU eviction (engine_pool.py) fed the Mooncake
traces in tests/data/mooncake. The index must answer Route with exactly
how many leading blocks each engine's cache holds.

Engines (one --index_source each; the engine's PUB binds, the daemon connects):
  e0  array encoding (SGLang, older vLLM), signed 64-bit hashes, medium null
  e1  array encoding, unsigned 64-bit hashes, dp rank 0, replay buffer of 8
      batches, evictions coalesced into one BlockRemoved
  e2  map encoding (newer vLLM), unsigned 64-bit hashes, dp rank 0,
      kv_cache_spec_kind, vLLM's last-block recompute (a hash stored twice,
      then removed twice), each removal with remaining_copy_counts (the
      copies of the hash left)
  e3  map encoding, 32-byte sha256 hashes, two steps per batch, last-block
      recompute without remaining_copy_counts (older vLLM)
  e4  array encoding, publishes a block_size 32 event (the index's is 16)

Scenarios, in order, each with exact numbers: exactness after the first
--requests requests of each trace, for ~200 prompts x 4 workers; Route's
fields, worker filter, tokens_le32 and RouteBatch; ListWorkers counters; a
dropped batch (gap, replay, exact again); a replay buffer that rolled over
(cleared, never a false hit, exact for what is stored after); an engine
restart (seq back to 0: cleared, exact again); AllBlocksCleared; a garbage
payload (cleared once, goes on; a block stored under a forgotten parent is
not indexed); unknown event types (skipped); a hash stored twice and
removed once (kept while remaining_copy_counts says a copy is left; without
it dropped: holders are a set); cache_salt and LoRA isolation; a block size
mismatch (ERROR naming both sizes).

The daemon behaviour this test assumes (beyond the .proto's comments):
- --index_block_size=16 and one --index_source=NAME=PUB,REPLAY per engine;
  the worker is named NAME and ListWorkers' endpoint is PUB as given. The
  daemon subscribes to every topic ("").
- The first batch a worker sees starts its stream. Then seq == last+1 is
  applied; seq > last+1 is a gap (gaps += 1): the daemon asks the engine's
  replay ROUTER (replays += 1) from last+1 and applies what comes back in
  order. If the replay cannot fill the gap (the buffer has rolled over: the
  first seq returned is past last+1), the worker is cleared (clears += 1)
  and goes on from what it has (the replayed batches and/or the live one).
  seq <= last is an engine restart: the worker is cleared (clears += 1) and
  that batch is applied as the start of a new stream.
- A payload that does not decode: the worker is cleared (clears += 1, once
  per such payload), its seq counts as consumed (no gap for it), and the
  next batch is applied normally (state LIVE again).
- Index keys are token chains: the hash of the parent's key and the block's
  tokens, the root's parent being the namespace (lora_name, and the
  cache_salt: the string left in the first block's extra_keys once the
  LoRA name is set aside). A BlockStored whose parent_block_hash the worker
  never stored (or the index forgot) is not indexed (dropped_blocks).
- A worker's holders are a set: storing a hash it already holds changes
  nothing and one BlockRemoved ends it, unless its remaining_copy_counts
  gives the hash a copy left (vLLM stores a hash twice when it recomputes a
  fully cached prompt's last block and removes it once per copy: without
  the counts the index then misses that block until it is stored again,
  which is allowed; a false hit is not). A BlockRemoved of a hash the
  worker does not hold is ignored.
- AllBlocksCleared forgets the worker's blocks (clears += 1).
- Unknown event types and unknown fields are skipped; nothing else changes.
- A BlockStored with block_size != --index_block_size puts the worker in
  state ERROR with a state_detail naming both sizes.
- Route lists the workers holding the prompt's first block, sorted by
  matched_blocks descending then name; with all_workers every worker (a
  worker holding nothing: matched_blocks 0), with a workers filter every
  named worker, in the same order; best_worker is the first
  when it holds at least one block, else ""; prompt_blocks is
  len(tokens) // 16. ListWorkers' last_seq is the seq of the last batch
  applied, and Route/ListWorkers see every batch applied before it.
  ListWorkers' mediums list {"GPU": number of blocks the worker holds}
  (medium null is GPU); entries is the sum over workers.

Usage: test_index_e2e.py --prefixd PATH [--stubs DIR] [--requests N]
Prints one line per check and "N passed, M failed"; exit 1 on a failure,
77 (skipped) without --prefixd.
"""

import atexit
import os
import random
import struct
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__, extra=lambda ap: ap.add_argument(
    "--requests", type=int, default=1000, help="requests of each trace fed first"))

if not ARGS.prefixd:
    print("--prefixd not given: skipped")
    sys.exit(77)

import grpc  # noqa: E402

import prefixd  # noqa: E402,F401  (makes the generated prefixd.v1 importable)
import prefixd_fixture  # noqa: E402
from prefixd.v1 import prefix_index_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_index_pb2_grpc as pb_grpc  # noqa: E402

from prefixd import engine_pool as ep  # noqa: E402
from prefixd import kv_publisher as kp  # noqa: E402

BS = 16
POOL_BLOCKS = 256
SAMPLES = 200
RPC_TIMEOUT = 10
QUIESCE_TIMEOUT = 10
ROUTE_CHUNK = 40


class Engine:
    """One simulated engine: its publisher, its pool, and what the index can
    know of it: since = (lo, hi) seqs such that every block stored (with its
    whole chain) in a batch >= hi is known, and none stored before lo is;
    (None, None) while the index knows everything."""

    def __init__(self, name, pub_kw, pool_kw):
        self.name = name
        self.pub = kp.Publisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", name=name, **pub_kw)
        self.pool = ep.EnginePool(POOL_BLOCKS, BS, publisher=self.pub, name=name,
                                  hash_seed=name.encode(), **pool_kw)
        self.since = (None, None)

    def expect(self, tokens, salt=None, lora=None):
        """(lowest, highest) matched_blocks the index may answer, and the
        engine's actual cached prefix."""
        actual = self.pool.cached_prefix_blocks(tokens, salt, lora)
        lo, hi = self.since
        if lo is None:
            return actual, actual, actual
        return (self.pool.cached_prefix_blocks(tokens, salt, lora, stored_since=hi),
                self.pool.cached_prefix_blocks(tokens, salt, lora, stored_since=lo), actual)


class Fleet(common.Checker):
    def __init__(self):
        super().__init__()
        self.engines = [
            Engine("e0", dict(encoding="array", hash_kind="int64"), dict(medium=None)),
            Engine("e1", dict(encoding="array", hash_kind="int", data_parallel_rank=0,
                              buffer_steps=8), dict(coalesce_removed=True)),
            Engine("e2", dict(encoding="map", hash_kind="int", data_parallel_rank=0),
                   dict(spec_kind="full_attention", recompute_last_block=True,
                        copy_counts=True)),
            Engine("e3", dict(encoding="map", hash_kind="bytes"),
                   dict(steps_per_batch=2, recompute_last_block=True)),
        ]
        self.by_name = {e.name: e for e in self.engines}
        self.e4 = kp.Publisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", encoding="array",
                               name="e4")
        conv = ep.load_trace("conversation")
        syn = ep.load_trace("synthetic")
        n = ARGS.requests
        self.first = sorted(conv[:n] + syn[:n], key=lambda r: (r.timestamp, r.trace))
        self.rest = sorted(conv[n:] + syn[n:], key=lambda r: (r.timestamp, r.trace))
        self.rr = 0
        self.fed = []          # trace requests fed, in order
        self.fresh = 0         # next fresh block id
        self.daemon = None
        self.stub = None

    # ---- the engines ----

    def assign(self, r):
        if r.trace == "conversation" and len(r.hash_ids) > 1:
            return self.engines[r.hash_ids[1] % len(self.engines)]
        self.rr += 1
        return self.engines[self.rr % len(self.engines)]

    def feed(self, reqs, engines=None, per_tick=4, append=None):
        """Submits the trace requests, per_tick at a time, stepping every
        engine (or those given) once per tick; every 8th request of an
        engine with last-block recompute comes back two ticks later, fully
        cached. append(engine): extra events for an engine's step."""
        engines = engines or self.engines
        later = []
        for i, r in enumerate(reqs):
            e = self.assign(r) if len(engines) > 1 else engines[0]
            if e not in engines:
                e = engines[i % len(engines)]
            tokens = ep.trace_tokens(r, BS)
            e.pool.submit(tokens, hold_steps=r.hold_steps)
            self.fed.append(r)
            if e.pool.recompute_last_block and i % 8 == 0:
                later.append((i // per_tick + 2, e, tokens))
            if i % per_tick == per_tick - 1 or i == len(reqs) - 1:
                tick = i // per_tick
                for t, le, lt in [x for x in later if x[0] <= tick]:
                    le.pool.submit(lt)
                later = [x for x in later if x[0] > tick]
                for x in engines:
                    x.pool.step(append=append(x) if append else ())
        for _, le, lt in later:
            le.pool.submit(lt)
        for x in engines:
            x.pool.drain()
            x.pool.check()

    def take(self, n):
        out, self.rest = self.rest[:n], self.rest[n:]
        return out

    def fresh_tokens(self, n_blocks):
        ids = list(range(self.fresh, self.fresh + n_blocks))
        self.fresh += n_blocks
        return ep.fresh_tokens(ids, BS)

    def samples(self, extra=()):
        """~SAMPLES prompts (tokens, salt, lora): recent and older trace
        prompts, recent ones extended by fresh blocks and a partial block,
        recent ones diverging halfway, prompts in no trace, plus `extra`."""
        rng = random.Random(len(self.fed))
        recent = self.fed[-400:]
        out = [(ep.trace_tokens(r, BS), None, None) for r in rng.sample(recent, 90)]
        out += [(ep.trace_tokens(r, BS), None, None) for r in rng.sample(self.fed, 40)]
        for r in rng.sample(recent, 30):
            out.append((ep.trace_tokens(r, BS) + self.fresh_tokens(2) + [7, 8, 9], None, None))
        for r in rng.sample(recent, 30):
            t = ep.trace_tokens(r, BS)
            k = len(t) // BS // 2
            out.append((t[:k * BS] + self.fresh_tokens(1) + t[(k + 1) * BS:], None, None))
        out += [(self.fresh_tokens(3), None, None) for _ in range(SAMPLES - len(out))]
        return out + list(extra)

    # ---- the daemon ----

    def list_workers(self):
        return self.stub.ListWorkers(pb.ListWorkersRequest(), timeout=RPC_TIMEOUT)

    def workers(self):
        return {w.worker: w for w in self.list_workers().workers}

    def quiesce(self, engines=None, until=None):
        """Waits until every worker's last_seq is its engine's last seq (and
        until(workers) holds); returns the workers, or None on timeout."""
        engines = engines or self.engines
        deadline = time.monotonic() + QUIESCE_TIMEOUT
        while True:
            ws = self.workers()
            if all(e.name in ws and ws[e.name].last_seq == e.pub.last_seq for e in engines) \
                    and (until is None or until(ws)):
                return ws
            if time.monotonic() > deadline:
                self.last_wait = ", ".join("%s last_seq %s want %d" % (
                    e.name, ws[e.name].last_seq if e.name in ws else "?", e.pub.last_seq)
                    for e in engines)
                return None
            time.sleep(0.02)

    def request(self, tokens, salt=None, lora=None, workers=(), le32=False, all_workers=False):
        r = pb.RouteRequest(cache_salt=salt or "", lora_name=lora or "", workers=list(workers),
                            all_workers=all_workers)
        if le32:
            r.tokens_le32 = struct.pack("<%dI" % len(tokens), *tokens)
        else:
            r.tokens.extend(tokens)
        return r

    def route_all(self, samples, all_workers=False):
        """RouteResponses for every sample (RouteBatch, in chunks); raises
        if an item failed."""
        out = []
        for i in range(0, len(samples), ROUTE_CHUNK):
            reqs = [self.request(*s, all_workers=all_workers)
                    for s in samples[i:i + ROUTE_CHUNK]]
            resp = self.stub.RouteBatch(pb.RouteBatchRequest(requests=reqs), timeout=RPC_TIMEOUT)
            if len(resp.responses) != len(reqs):
                raise AssertionError("RouteBatch answered %d of %d" % (len(resp.responses),
                                                                      len(reqs)))
            for k, item in enumerate(resp.responses):
                if item.code != 0:
                    raise AssertionError("RouteBatch item %d: code %d %s"
                                         % (i + k, item.code, item.message))
                out.append(item.response)
        return out

    @staticmethod
    def matched(resp):
        return {w.worker: w.matched_blocks for w in resp.workers}

    def compare(self, samples, engines=None, exact_only=False):
        """Mismatches [(sample, worker, got, (lo, hi, actual))] of Route
        against the engines, and how many (sample, worker) pairs hold > 0."""
        engines = engines or self.engines
        bad, nonzero = [], 0
        for i, (resp, s) in enumerate(zip(self.route_all(samples), samples)):
            m = self.matched(resp)
            for e in engines:
                lo, hi, actual = e.expect(*s)
                got = m.get(e.name, 0)
                nonzero += actual > 0
                if not (lo <= got <= hi and got <= actual) or (exact_only and got != actual):
                    bad.append((i, e.name, got, (lo, hi, actual)))
        return bad, nonzero

    def check_exact(self, what, extra=(), engines=None):
        try:
            bad, nonzero = self.compare(self.samples(extra), engines)
        except (grpc.RpcError, AssertionError) as e:
            return self.check(False, what, e)
        return self.check(not bad, "%s (%d prompts, %d worker matches > 0)" % (
            what, SAMPLES + len(extra), nonzero),
            "%d mismatches (sample, worker, got, (lowest, highest, engine)): %s"
            % (len(bad), bad[:6]))

    # ---- the run ----

    def start(self):
        flags = ["--index_block_size=%d" % BS]
        flags += ["--index_source=" + e.pub.source_flag() for e in self.engines]
        flags.append("--index_source=" + self.e4.source_flag())
        self.daemon = prefixd_fixture.Daemon(ARGS.prefixd, "", args=flags)
        atexit.register(self.daemon.kill)  # whatever happens to this script
        try:
            self.daemon.start()
        except prefixd_fixture.DaemonFailed as e:
            self.check(False, "prefixd serves with 5 --index_source flags", e)
            return False
        self.check(True, "prefixd serves with 5 --index_source flags")
        self.channel = grpc.insecure_channel(self.daemon.tcp)
        self.stub = pb_grpc.PrefixIndexStub(self.channel)
        names = ["e0", "e1", "e2", "e3", "e4"]
        pubs = {e.name: e.pub for e in self.engines}
        pubs["e4"] = self.e4
        deadline = time.monotonic() + 10
        resp = None
        while time.monotonic() < deadline:
            try:
                resp = self.list_workers()
            except grpc.RpcError as e:
                return self.check(False, "ListWorkers answers", e)
            if sorted(w.worker for w in resp.workers) == names:
                break
            time.sleep(0.05)
        ok = (resp is not None and sorted(w.worker for w in resp.workers) == names
              and resp.block_size == BS
              and all(w.endpoint == pubs[w.worker].endpoint for w in resp.workers))
        self.check(ok, "ListWorkers lists e0..e4 with their PUB endpoints; block_size 16", resp)
        subscribed = [n for n in names if pubs[n].wait_for_subscriber(10)]
        return self.check(subscribed == names,
                          "the daemon subscribed to every engine (XPUB saw it)",
                          "subscribed: %s" % subscribed)

    def stage_exact(self):
        t0 = time.monotonic()
        self.feed(self.first)
        ws = self.quiesce()
        if not self.check(ws is not None, "quiescence after %d requests (%.1f s): every worker "
                          "applied its engine's last batch" % (len(self.first),
                                                              time.monotonic() - t0),
                          getattr(self, "last_wait", "")):
            return
        evicted = [e.pool.counts["evicted"] for e in self.engines]
        dups = [e.pool.counts["duplicate_stores"] for e in self.engines]
        print("      engines: evicted %s, stored again (recompute) %s" % (evicted, dups))
        self.check_exact("exact: Route == every engine's cached prefix, 4 workers")

    def stage_route_fields(self):
        samples = self.samples()[:60]
        try:
            resps = self.route_all(samples, all_workers=True)
            matched_only = self.route_all(samples)
            problems, some_unmatched = [], 0
            for (t, _, _), r, m in zip(samples, resps, matched_only):
                names = [w.worker for w in r.workers]
                order = sorted(r.workers, key=lambda w: (-w.matched_blocks, w.worker))
                best = order[0].worker if order and order[0].matched_blocks > 0 else ""
                held = [(w.worker, w.matched_blocks) for w in order if w.matched_blocks > 0]
                some_unmatched += len(held) < len(order)
                if (r.prompt_blocks != len(t) // BS or r.block_size != BS
                        or names != [w.worker for w in order] or r.best_worker != best
                        or sorted(names) != ["e0", "e1", "e2", "e3", "e4"]
                        or [(w.worker, w.matched_blocks) for w in m.workers] != held
                        or (m.best_worker, m.prompt_blocks) != (best, r.prompt_blocks)):
                    problems.append((len(t), r, m))
            self.check(not problems and some_unmatched > 0,
                       "Route: prompt_blocks, block_size 16, every worker listed with "
                       "all_workers, only those with a match without it (%d answers), sorted, "
                       "best_worker" % some_unmatched, problems[:2])
            t = samples[0][0]
            full = self.matched(self.stub.Route(self.request(t), timeout=RPC_TIMEOUT))
            le32 = self.matched(self.stub.Route(self.request(t, le32=True), timeout=RPC_TIMEOUT))
            only = self.stub.Route(self.request(t, workers=["e1", "e3"]), timeout=RPC_TIMEOUT)
            full = {k: full.get(k, 0) for k in ("e0", "e1", "e2", "e3", "e4")}
            le32 = {k: le32.get(k, 0) for k in full}
            ok = (full == le32 == self.matched(resps[0])
                  and sorted(w.worker for w in only.workers) == ["e1", "e3"]
                  and self.matched(only) == {k: full[k] for k in ("e1", "e3")})
            self.check(ok, "Route: tokens_le32 == tokens == RouteBatch; workers filter",
                       (full, le32, self.matched(only)))
        except grpc.RpcError as e:
            self.check(False, "Route fields", e)

    def check_clean_workers(self, what, engines):
        ws = self.workers()
        resp = self.list_workers()
        problems = []
        for e in engines:
            w = ws[e.name]
            gpu = {m.medium: m.blocks for m in w.mediums}
            if (w.state != pb.LIVE or w.gaps or w.clears or not w.events
                    or gpu != {"GPU": len(e.pool.cached)} or w.last_seq != e.pub.last_seq):
                problems.append(w)
        total = sum(len(e.pool.cached) for e in self.engines)
        self.check(not problems and resp.entries == total,
                   "%s: LIVE, events > 0, no gaps or clears, GPU blocks == engine's cached (%s), "
                   "entries == %d" % (what, [len(e.pool.cached) for e in engines], total),
                   "entries %d; %s" % (resp.entries, problems[:2]))

    def stage_drop(self):
        e = self.by_name["e0"]
        before = self.workers()["e0"]
        asked = len(e.pub.replay_requests)
        e.pub.drop_next(1)
        dropped_seq = e.pub.next_seq
        self.feed(self.take(40), engines=[e], per_tick=1)
        ws = self.quiesce()
        w = ws and ws["e0"]
        starts = [s for s in e.pub.replay_requests[asked:] if s is not None]
        self.check(w is not None and w.gaps >= before.gaps + 1 and w.replays >= before.replays + 1
                   and w.clears == before.clears and w.state == pb.LIVE
                   and starts and min(starts) <= dropped_seq,
                   "dropped batch %d on e0: gap seen, replay asked from <= %d, not cleared"
                   % (dropped_seq, dropped_seq),
                   "worker %s; replay starts %s; %s" % (w, starts, getattr(self, "last_wait", "")))
        self.check_exact("exact after the replay")

    def stage_rollover(self):
        e = self.by_name["e1"]
        before = self.workers()["e1"]
        n_drop = 3 * e.pub.buffer_steps
        e.pub.drop_next(n_drop)
        first_dropped = e.pub.next_seq
        reqs = iter(self.take(400))
        while e.pub.next_seq < first_dropped + n_drop:
            e.pool.submit(ep.trace_tokens(next(reqs), BS))
            e.pool.step()
        trigger = None
        while trigger is None:  # the first batch sent after the dropped ones
            e.pool.submit(ep.trace_tokens(next(reqs), BS))
            trigger = e.pool.step()
        e.since = (trigger - e.pub.buffer_steps + 1, trigger + 1)
        ws = self.quiesce([e], until=lambda ws: ws["e1"].clears > before.clears)
        self.check(ws is not None and ws["e1"].clears >= before.clears + 1,
                   "replay buffer rolled over on e1 (%d batches lost, buffer %d): cleared"
                   % (n_drop, e.pub.buffer_steps),
                   "%s %s" % (ws and ws["e1"], getattr(self, "last_wait", "")))
        # More traffic, and prompts whose whole chain is stored after the clear.
        self.feed(list(reqs)[:200])
        fresh = [self.fresh_tokens(4) for _ in range(10)]
        for t in fresh:
            e.pool.submit(t)
        e.pool.drain()
        ws = self.quiesce()
        known = sum(1 for t in fresh if e.pool.cached_prefix_blocks(t, stored_since=trigger + 1))
        self.check(ws is not None and known == 10,
                   "quiescence after the clear; e1 holds the 10 new prompts", known)
        self.check_exact("after the clear: never a false hit, exact for what e1 stored after",
                         extra=[(t, None, None) for t in fresh])

    def stage_restart(self):
        e = self.by_name["e2"]
        before = self.workers()["e2"]
        e.pool.restart()
        self.feed(self.take(60), engines=[e], per_tick=1)
        ws = self.quiesce(until=lambda ws: ws["e2"].clears > before.clears)
        self.check(ws is not None and ws["e2"].clears == before.clears + 1
                   and ws["e2"].state == pb.LIVE
                   and {m.medium: m.blocks for m in ws["e2"].mediums} == {
                       "GPU": len(e.pool.cached)},
                   "engine restart on e2 (seq back to 0): cleared once, LIVE, GPU blocks == %d"
                   % len(e.pool.cached), "%s %s" % (ws and ws["e2"],
                                                    getattr(self, "last_wait", "")))
        self.check_exact("exact after the restart")

    def stage_all_blocks_cleared(self):
        e = self.by_name["e3"]
        before = self.workers()["e3"]
        e.pool.reset_prefix_cache()
        ws = self.quiesce(until=lambda ws: ws["e3"].clears > before.clears)
        ok = ws is not None and ws["e3"].clears == before.clears + 1
        try:
            bad, _ = self.compare(self.samples(), [e], exact_only=True)
            anything = [m for m in bad if m[2] > 0]
        except grpc.RpcError as err:
            anything = [err]
        self.check(ok and not anything and len(e.pool.cached) == 0
                   and sum(m.blocks for m in ws["e3"].mediums) == 0,
                   "AllBlocksCleared on e3: cleared once, nothing of e3 matches",
                   "%s %s" % (ws and ws["e3"], anything[:3]))
        self.feed(self.take(200))
        self.quiesce()
        self.check_exact("exact after AllBlocksCleared and more traffic")

    def stage_garbage(self):
        e = self.by_name["e0"]
        before = self.workers()["e0"]
        F1, F2 = self.fresh_tokens(1), self.fresh_tokens(2)
        e.pool.submit(F1)  # stored before the garbage: the index forgets it
        e.pool.step()
        g = e.pub.send_raw(b"\xc1\xc1 not msgpack \xc1")
        e.since = (g + 1, g + 1)
        e.pool.submit(F1 + F2)  # F2 stored under F1, a parent the index no longer has
        e.pool.step()
        ws = self.quiesce([e])
        w = ws and ws["e0"]
        self.check(w is not None and w.clears == before.clears + 1 and w.state == pb.LIVE
                   and w.gaps == before.gaps,
                   "garbage payload (seq %d) on e0: cleared once, no gap, LIVE, the next "
                   "batch applied" % g, "%s %s" % (w, getattr(self, "last_wait", "")))
        got = [self.matched(self.stub.Route(self.request(t), timeout=RPC_TIMEOUT)).get("e0", 0)
               for t in (F1 + F2, F2)]
        want = [e.pool.cached_prefix_blocks(t) for t in (F1 + F2, F2)]
        dropped = self.workers()["e0"].dropped_blocks - before.dropped_blocks
        self.check(got == [0, 0] and want == [3, 0] and dropped >= 2,
                   "2 blocks stored under a forgotten parent: not indexed (dropped_blocks "
                   "+2), no false hit at the root", "got %s, engine holds %s, dropped_blocks +%d"
                   % (got, want, dropped))
        self.feed(self.take(120))
        self.quiesce()
        self.check_exact("exact for what e0 stored after the garbage")

    def stage_unknown_events(self):
        e0, e2 = self.by_name["e0"], self.by_name["e2"]
        before = self.workers()
        for e in (e0, e2):
            e.pool.inject(kp.unknown_event("BlockPromoted", block_hashes=[1, 2], medium="CPU"))

        def append(e):
            if e in (e0, e2):
                return [kp.unknown_event("KVCacheCompacted", group_idx=0),
                        kp.unknown_event("BlockPromoted", block_hashes=[3])]
            return []
        self.feed(self.take(120), append=append)
        ws = self.quiesce()
        ok = ws is not None and all(
            ws[n].gaps == before[n].gaps and ws[n].clears == before[n].clears
            and ws[n].state == pb.LIVE for n in ("e0", "e2"))
        self.check(ok, "unknown event types in e0 (array) and e2 (map) batches: skipped, no "
                   "gap, no clear", ws and [ws["e0"], ws["e2"]])
        self.check_exact("exact after batches with unknown events")

    def stage_recompute(self):
        """vLLM's last-block recompute on e2 and e3: a fully cached prompt
        stores its last block's hash again in a second block; evicting the
        first copy publishes BlockRemoved for the hash while the second
        stays cached. e2's removal says so (remaining_copy_counts [1]), e3's
        cannot."""
        got = {}
        for e in (self.by_name["e2"], self.by_name["e3"]):
            D = self.fresh_tokens(4)
            e.pool.submit(D)
            e.pool.step()
            e.pool.submit(D)
            e.pool.step()
            e.pool.drain()
            last = e.pool.block_hashes(D)[-1]
            first, second = e.pool.cached[last]
            ahead = list(e.pool.free).index(second)  # the first copy is among these
            e.pool.submit(self.fresh_tokens(ahead))
            e.pool.drain()
            ws = self.quiesce()
            route = self.stub.Route(self.request(D), timeout=RPC_TIMEOUT)
            got[e.name] = (ws is not None and e.pool.cached[last] == [second],
                           self.matched(route).get(e.name, 0),
                           e.pool.cached_prefix_blocks(D))
        self.check(got["e2"] == (True, 4, 4),
                   "a hash stored twice on e2, its first copy evicted with "
                   "remaining_copy_counts [1]: the index keeps the block (4 of 4)",
                   "(second copy left, Route, engine) %s" % (got["e2"],))
        # Holders are a set (docs/index.md): without the counts the second
        # store of a hash changes nothing and the first removal ends it, so
        # the index under-reports the recomputed copy's block, never the
        # reverse.
        self.check(got["e3"] == (True, 3, 4),
                   "the same on e3, whose removal has no counts: the index drops the "
                   "block (3 of the engine's 4: a miss, never a false hit)",
                   "(second copy left, Route, engine) %s" % (got["e3"],))

    def stage_isolation(self):
        e0, e2, e3 = self.by_name["e0"], self.by_name["e2"], self.by_name["e3"]
        P, Q = self.fresh_tokens(6), self.fresh_tokens(3)
        e2.pool.submit(P, salt="tenant-a")
        e2.pool.step()
        e2.pool.submit(P + Q, salt="tenant-a")  # stored under P's last block: no extra keys
        e3.pool.submit(P)
        e0.pool.submit(P[:3 * BS], salt="tenant-b")
        for e in (e0, e2, e3):
            e.pool.drain()
        self.quiesce()
        cases = [("tenant-a", {"e2": 9}), ("tenant-b", {"e0": 3}), (None, {"e3": 6}),
                 ("tenant-c", {})]
        problems = []
        for salt, want in cases:
            got = self.matched(self.stub.Route(self.request(P + Q, salt, all_workers=True),
                                               timeout=RPC_TIMEOUT))
            want_all = {n: want.get(n, 0) for n in ("e0", "e1", "e2", "e3", "e4")}
            engines = {e.name: e.pool.cached_prefix_blocks(P + Q, salt) for e in self.engines}
            if got != want_all or any(engines[n] != want_all[n] for n in engines):
                problems.append((salt, got, want_all, engines))
        self.check(not problems, "cache_salt isolation: salt A matches 9 blocks on e2 only, "
                   "salt B 3 on e0, no salt 6 on e3, salt C nothing", problems)
        R = self.fresh_tokens(4)
        e2.pool.submit(R, lora="adapter-1")
        e2.pool.submit(Q + R, salt="tenant-a", lora="adapter-1")
        e2.pool.drain()
        self.quiesce()
        cases = [(R, None, "adapter-1", 4), (R, None, None, 0), (R, None, "adapter-2", 0),
                 (Q + R, "tenant-a", "adapter-1", 7), (Q + R, "tenant-a", None, 0),
                 (Q + R, None, "adapter-1", 0)]
        problems = []
        for t, salt, lora, want in cases:
            got = self.matched(self.stub.Route(self.request(t, salt, lora),
                                               timeout=RPC_TIMEOUT)).get("e2", 0)
            if got != want or e2.pool.cached_prefix_blocks(t, salt, lora) != want:
                problems.append((len(t) // BS, salt, lora, got, want))
        self.check(not problems, "LoRA isolation: lora_name adapter-1 matches 4 and, with salt "
                   "A, 7; no LoRA or another LoRA nothing", problems)

    def stage_block_size(self):
        self.e4.publish([kp.block_stored([11, 12], None, list(range(64)), 32)])
        deadline = time.monotonic() + QUIESCE_TIMEOUT
        w = None
        while time.monotonic() < deadline:
            w = self.workers()["e4"]
            if w.state == pb.ERROR:
                break
            time.sleep(0.02)
        self.check(w is not None and w.state == pb.ERROR and "16" in w.state_detail
                   and "32" in w.state_detail,
                   "block_size 32 on e4: state ERROR, state_detail names 16 and 32", w)
        self.feed(self.take(80))
        self.quiesce()
        self.check_exact("the other workers still exact at the end")

    def stop(self):
        self.channel.close()
        rc = self.daemon.stop()
        self.check(rc == 0, "prefixd exits 0 on SIGTERM", "exit %s:\n%s" % (
            rc, self.daemon.logs()[-3000:]))

    def close(self):
        """Stops the daemon (killed if still running) before anything that
        could raise, then the engines; prints the daemon's logs on failure."""
        logs = ""
        if self.daemon is not None:
            try:
                logs = self.daemon.logs()[-4000:] if self.failed else ""
            finally:
                self.daemon.close()
                self.daemon = None
        for e in self.engines:
            e.pub.close()
        self.e4.close()
        if logs:
            print("---- prefixd logs (tail) ----\n%s" % logs)


def main():
    t0 = time.monotonic()
    f = Fleet()
    try:
        if f.start():
            for stage in (f.stage_exact, f.stage_route_fields,
                          lambda: f.check_clean_workers("ListWorkers after a clean run",
                                                        f.engines),
                          f.stage_drop, f.stage_rollover, f.stage_restart,
                          f.stage_all_blocks_cleared, f.stage_garbage, f.stage_unknown_events,
                          f.stage_recompute, f.stage_isolation, f.stage_block_size):
                try:
                    stage()
                except Exception:  # a stage that cannot finish fails, the next runs
                    f.check(False, "%s ran to its end" % getattr(
                        stage, "__name__", "stage"), traceback.format_exc(limit=4))
            f.stop()
    finally:
        f.close()
    print("(%.1f s)" % (time.monotonic() - t0))
    return f.exit_code()


if __name__ == "__main__":
    sys.exit(main())
