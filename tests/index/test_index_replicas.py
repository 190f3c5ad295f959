#!/usr/bin/python3
"""Two replicas of the fleet index, one restarts (docs/index.md, "Deploying
the index"): the shape of deploy/k8s/index, where two prefixd daemons follow
the same engines and share nothing.

Three simulated engines (kv_publisher.py + engine_pool.py on loopback, each
a paged pool with prefix caching and LRU eviction, fed the conversation
trace of tests/data/mooncake; replay buffers of 100,000 batches, which hold
everything this test publishes) and two real prefixd daemons, replica A and
replica B, each on gRPC and metrics ports of its own, each with one
--index_source per engine.

  1. Both replicas exact: Route matched_blocks == the engine's cached prefix
     for every sampled prompt and every worker; ListWorkers' GPU blocks ==
     the engine's cached blocks, entries == their sum.
  2. From here until step 6 a thread calls Route on B without pause: every
     call must succeed and list the three workers, all LIVE.
  3. A stops (SIGTERM, exit 0); the engines go on publishing.
  4. B, after quiescence: exact.
  5. A restarts on the same ports. Its catch-up replay on connect (one per
     engine, from batch 0) rebuilds everything the engines published while
     it was away: every worker LIVE at the engines' last batch, no gap, no
     clear, exact, before any new event.
  6. The engines publish again: A and B both exact, A without a gap or a
     clear, and nothing of the replay buffers rolled over (the precondition
     of "exact" after a restart: an engine's blocks older than its replay
     buffer would be unknown to A until stored again).

Usage: test_index_replicas.py --prefixd PATH [--stubs DIR] [--requests N]
Prints one line per check and "N passed, M failed"; exit 1 on a failure,
77 (skipped) without --prefixd.
"""

import atexit
import os
import random
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__, extra=lambda ap: ap.add_argument(
    "--requests", type=int, default=300, help="trace requests fed in each of the 3 phases"))

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
POOL_BLOCKS = 1024      # the trace still evicts: removals are replayed too
BUFFER_STEPS = 100_000  # every batch this test publishes stays replayable
NAMES = ("e0", "e1", "e2")
SAMPLES = 150
RPC_TIMEOUT = 10
QUIESCE_TIMEOUT = 15
TICK_SLEEP = 0.03       # between engine steps while A is down: 2 to 3 s of publishing


class SamePortsDaemon(prefixd_fixture.Daemon):
    """prefixd_fixture.Daemon whose second start() listens on the gRPC and
    metrics ports of its first, as a restarted pod keeps its ports."""

    def start(self, timeout=prefixd_fixture.START_TIMEOUT_S):
        if self.tcp is None:
            return super().start(timeout)
        # Daemon.start() takes the gRPC port, then the metrics port, from
        # free_port(); hand it the old ones.
        ports = iter([int(self.tcp.rsplit(":", 1)[1]), int(self.metrics.rsplit(":", 1)[1])])
        saved = prefixd_fixture.free_port
        prefixd_fixture.free_port = lambda: next(ports)
        try:
            return super().start(timeout)
        finally:
            prefixd_fixture.free_port = saved


class Replica:
    def __init__(self, name, flags):
        self.name = name
        self.daemon = SamePortsDaemon(ARGS.prefixd, "", args=flags)
        atexit.register(self.daemon.kill)  # whatever happens to this script
        self.channel = None
        self.stub = None

    def start(self):
        self.daemon.start()
        self.channel = grpc.insecure_channel(self.daemon.tcp)
        self.stub = pb_grpc.PrefixIndexStub(self.channel)

    def stop(self):
        if self.channel is not None:
            self.channel.close()
            self.channel = self.stub = None
        return self.daemon.stop()

    def list_workers(self):
        return self.stub.ListWorkers(pb.ListWorkersRequest(), timeout=RPC_TIMEOUT)

    def workers(self):
        return {w.worker: w for w in self.list_workers().workers}

    def route(self, tokens):
        r = pb.RouteRequest(all_workers=True)  # every worker, matched or not
        r.tokens.extend(tokens)
        return {w.worker: w.matched_blocks
                for w in self.stub.Route(r, timeout=RPC_TIMEOUT).workers}


class RouteLoad(threading.Thread):
    """Calls Route on one replica without pause, on a channel of its own,
    until stopped; counts the calls and keeps what went wrong."""

    def __init__(self, target, prompts):
        super().__init__(daemon=True, name="route-load")
        self.target = target
        self.prompts = prompts
        self.halt = threading.Event()
        self.calls = 0
        self.failures = []   # (call number, error)
        self.not_live = []   # (call number, {worker: state}) of answers not all LIVE

    def run(self):
        rng = random.Random(7)
        with grpc.insecure_channel(self.target) as channel:
            stub = pb_grpc.PrefixIndexStub(channel)
            while not self.halt.is_set():
                req = pb.RouteRequest(all_workers=True)  # each worker's state
                req.tokens.extend(rng.choice(self.prompts))
                self.calls += 1
                try:
                    resp = stub.Route(req, timeout=RPC_TIMEOUT)
                except grpc.RpcError as e:
                    self.failures.append((self.calls, "%s %s" % (e.code(), e.details())))
                    continue
                states = {w.worker: w.state for w in resp.workers}
                if sorted(states) != list(NAMES) or any(s != pb.LIVE for s in states.values()):
                    self.not_live.append((self.calls, states))

    def stop(self):
        self.halt.set()
        self.join(timeout=RPC_TIMEOUT + 5)


class Test(common.Checker):
    def __init__(self):
        super().__init__()
        self.pubs = {n: kp.Publisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", name=n,
                                     encoding="map", hash_kind="int",
                                     buffer_steps=BUFFER_STEPS) for n in NAMES}
        self.pools = {n: ep.EnginePool(POOL_BLOCKS, BS, publisher=self.pubs[n], name=n,
                                       hash_seed=n.encode()) for n in NAMES}
        self.trace = ep.load_trace("conversation", 3 * ARGS.requests)
        self.fed = []
        self.fresh = 0
        flags = ["--index_block_size=%d" % BS]
        flags += ["--index_source=" + self.pubs[n].source_flag() for n in NAMES]
        self.a = Replica("A", flags)
        self.b = Replica("B", flags)
        self.load = None

    # ---- the engines ----

    def feed(self, reqs, per_tick=4, sleep=0.0):
        """Submits the trace requests per_tick at a time, stepping every
        engine once per tick (a conversation stays on one engine); then
        drains the pools."""
        for i, r in enumerate(reqs):
            n = NAMES[(r.hash_ids[1] if len(r.hash_ids) > 1 else i) % len(NAMES)]
            self.pools[n].submit(ep.trace_tokens(r, BS), hold_steps=r.hold_steps)
            self.fed.append(r)
            if i % per_tick == per_tick - 1 or i == len(reqs) - 1:
                for p in self.pools.values():
                    p.step()
                if sleep:
                    time.sleep(sleep)
        for p in self.pools.values():
            p.drain()
            p.check()

    def phase(self, k):
        return self.trace[k * ARGS.requests:(k + 1) * ARGS.requests]

    def samples(self):
        """SAMPLES prompts: trace prompts fed (recent and older), recent ones
        extended by fresh blocks and a partial block, recent ones diverging
        halfway, and prompts in no trace."""
        rng = random.Random(len(self.fed))
        recent = self.fed[-200:]

        def fresh(n):
            ids = list(range(self.fresh, self.fresh + n))
            self.fresh += n
            return ep.fresh_tokens(ids, BS)
        out = [ep.trace_tokens(r, BS) for r in rng.sample(recent, 60)]
        out += [ep.trace_tokens(r, BS) for r in rng.sample(self.fed, 30)]
        out += [ep.trace_tokens(r, BS) + fresh(2) + [7, 8, 9] for r in rng.sample(recent, 20)]
        for r in rng.sample(recent, 20):
            t = ep.trace_tokens(r, BS)
            k = len(t) // BS // 2
            out.append(t[:k * BS] + fresh(1) + t[(k + 1) * BS:])
        out += [fresh(3) for _ in range(SAMPLES - len(out))]
        return out

    # ---- checks ----

    def quiesce(self, replica):
        """Waits until each of the replica's workers is LIVE at its engine's
        last batch; returns the workers, or None (and why) on timeout."""
        deadline = time.monotonic() + QUIESCE_TIMEOUT
        while True:
            ws = replica.workers()
            if all(n in ws and ws[n].state == pb.LIVE and ws[n].last_seq == self.pubs[n].last_seq
                   for n in NAMES):
                return ws, ""
            if time.monotonic() > deadline:
                return None, ", ".join("%s %s last_seq %s want %d" % (
                    n, pb.WorkerState.Name(ws[n].state) if n in ws else "?",
                    ws[n].last_seq if n in ws else "?", self.pubs[n].last_seq) for n in NAMES)
            time.sleep(0.02)

    def check_exact(self, replica, what):
        """Route on every sample: matched_blocks == the engine's cached prefix,
        for every worker."""
        bad, deep, blocks, prompts = [], 0, 0, self.samples()
        try:
            for i, t in enumerate(prompts):
                got = replica.route(t)
                for n in NAMES:
                    want = self.pools[n].cached_prefix_blocks(t)
                    deep += want > 1  # every trace prompt shares block 0
                    blocks += want
                    if got.get(n) != want:
                        bad.append((i, n, got.get(n), want))
        except grpc.RpcError as e:
            return self.check(False, "%s: %s" % (replica.name, what), e)
        return self.check(not bad and deep > 0,
                          "%s: %s (%d prompts x %d workers: %d matched blocks, %d matches > 1)"
                          % (replica.name, what, len(prompts), len(NAMES), blocks, deep),
                          "%d mismatches (prompt, worker, Route, engine): %s" % (len(bad), bad[:6]))

    def check_workers(self, replica, what, ws, before=None):
        """ListWorkers: each worker's GPU blocks == its engine's cached blocks,
        entries == their sum; no gap or clear (since `before`, if given)."""
        resp = replica.list_workers()
        total = sum(len(p.cached) for p in self.pools.values())
        problems = []
        for n in NAMES:
            w = ws[n]
            b = before[n] if before else None
            gpu = {m.medium: m.blocks for m in w.mediums}
            if (gpu != {"GPU": len(self.pools[n].cached)} or w.gaps != (b.gaps if b else 0)
                    or w.clears != (b.clears if b else 0)):
                problems.append(w)
        return self.check(
            not problems and resp.entries == total,
            "%s: %s: GPU blocks == engines' cached %s, entries == %d, no gap, no clear"
            % (replica.name, what, [len(self.pools[n].cached) for n in NAMES], total),
            "entries %d; %s" % (resp.entries, problems[:2]))

    # ---- the run ----

    def start(self):
        for r in (self.a, self.b):
            try:
                r.start()
            except prefixd_fixture.DaemonFailed as e:
                return self.check(False, "replica %s serves" % r.name, e)
        ok = True
        for r in (self.a, self.b):
            deadline = time.monotonic() + 10
            ws = {}
            while time.monotonic() < deadline and sorted(ws) != list(NAMES):
                ws = r.workers()
                time.sleep(0.02)
            ok &= self.check(sorted(ws) == list(NAMES),
                             "replica %s (gRPC %s) lists e0, e1, e2" % (r.name, r.daemon.tcp), ws)
        subscribed = [n for n in NAMES if self.pubs[n].wait_for_subscriber(10, count=2)]
        return self.check(ok and subscribed == list(NAMES),
                          "both replicas subscribed to every engine (each XPUB saw 2)",
                          "subscribed twice: %s" % subscribed)

    def other(self, r):
        return self.b if r is self.a else self.a

    def run(self):
        # 1. Both replicas follow the engines.
        self.feed(self.phase(0))
        for r in (self.a, self.b):
            ws, why = self.quiesce(r)
            if self.check(ws is not None, "%s: quiescence after %d requests" % (
                    r.name, len(self.fed)), why):
                self.check_workers(r, "after phase 1", ws)
                self.check_exact(r, "exact after phase 1")
        print("      engines: %s" % "; ".join("%s %s" % (n, self.pools[n].stats())
                                               for n in NAMES))

        # 2. Route on B without pause from now on.
        self.load = RouteLoad(self.b.daemon.tcp, self.samples()[:100])
        self.load.start()

        # 3. A stops; the engines keep publishing.
        a_tcp, a_metrics = self.a.daemon.tcp, self.a.daemon.metrics
        rc = self.a.stop()
        self.check(rc == 0, "A: exits 0 on SIGTERM", "exit %s" % rc)
        seq_at_stop = {n: self.pubs[n].last_seq for n in NAMES}
        t0 = time.monotonic()
        self.feed(self.phase(1), sleep=TICK_SLEEP)
        published = {n: self.pubs[n].last_seq - seq_at_stop[n] for n in NAMES}
        print("      while A was down: %s batches published in %.1f s, %d Routes on B so far"
              % (published, time.monotonic() - t0, self.load.calls))

        # 4. B, alone, is exact.
        ws, why = self.quiesce(self.b)
        if self.check(ws is not None, "B: quiescence while A is down", why):
            self.check_workers(self.b, "while A is down", ws)
            self.check_exact(self.b, "exact while A is down")

        # 5. A restarts on its ports: its catch-up replay alone rebuilds it.
        for p in self.pubs.values():
            p._drain_subscriptions()  # A's old subscription gone or not, count from here
        subs = {n: self.pubs[n].subscriptions for n in NAMES}
        try:
            self.a.start()
        except prefixd_fixture.DaemonFailed as e:
            self.check(False, "A: restarts on %s" % a_tcp, e)
            return
        self.check((self.a.daemon.tcp, self.a.daemon.metrics) == (a_tcp, a_metrics),
                   "A: restarted on the same gRPC and metrics ports (%s, %s)" % (a_tcp, a_metrics),
                   (self.a.daemon.tcp, self.a.daemon.metrics))
        ws, why = self.quiesce(self.a)
        if self.check(ws is not None, "A: every worker LIVE at its engine's last batch after the "
                      "catch-up replay, before any new event", why):
            replays = {n: ws[n].replays for n in NAMES}
            self.check(all(v == 1 for v in replays.values()),
                       "A: one replay per worker, the catch-up on connect", replays)
            self.check_workers(self.a, "after the catch-up replay", ws)
            self.check_exact(self.a, "exact after the catch-up replay alone")
        resubscribed = [n for n in NAMES
                        if self.pubs[n].wait_for_subscriber(10, count=subs[n] + 1)]
        self.check(resubscribed == list(NAMES), "A: subscribed again to every engine",
                   resubscribed)

        # 6. The engines' next events.
        before = self.a.workers()
        self.feed(self.phase(2))
        for r in (self.a, self.b):
            ws, why = self.quiesce(r)
            if self.check(ws is not None, "%s: quiescence after the engines' next events"
                          % r.name, why):
                self.check_workers(r, "after the next events", ws,
                                   before if r is self.a else None)
                self.check_exact(r, "exact after the next events")
        self.load.stop()
        self.check(not self.load.failures and self.load.calls >= 100,
                   "B: %d Route calls from before A stopped until after it was exact again, "
                   "every one answered" % self.load.calls,
                   "%d failed: %s" % (len(self.load.failures), self.load.failures[:3]))
        self.check(not self.load.not_live,
                   "B: every answer listed e0, e1, e2, all LIVE",
                   "%d not: %s" % (len(self.load.not_live), self.load.not_live[:3]))
        first = {n: (self.pubs[n].buffered_seqs() or [None])[0] for n in NAMES}
        self.check(all(v == 0 for v in first.values()),
                   "no replay buffer rolled over (each still holds batch 0; last seqs %s)"
                   % {n: self.pubs[n].last_seq for n in NAMES}, first)

    def stop(self):
        for r in (self.a, self.b):
            rc = r.stop()
            self.check(rc == 0, "%s: exits 0 on SIGTERM" % r.name, "exit %s:\n%s" % (
                rc, r.daemon.logs()[-3000:]))

    def close(self):
        if self.load is not None and self.load.is_alive():
            self.load.stop()
        logs = []
        for r in (self.a, self.b):
            if self.failed:
                logs.append("---- replica %s logs (tail) ----\n%s" % (r.name,
                                                                     r.daemon.logs()[-3000:]))
            r.daemon.close()
        for p in self.pubs.values():
            p.close()
        if logs:
            print("\n".join(logs))


def main():
    t0 = time.monotonic()
    t = Test()
    try:
        if t.start():
            try:
                t.run()
            except Exception:
                t.check(False, "the run went to its end", traceback.format_exc(limit=5))
            t.stop()
    finally:
        t.close()
    print("(%.1f s)" % (time.monotonic() - t0))
    return t.exit_code()


if __name__ == "__main__":
    sys.exit(main())
