#!/usr/bin/python3
"""Fleet routing on a simulated fleet: does routing by the fleet index
(docs/index.md) save as much prefill as routing by the engines' exact cache
state, and how much more than the usual load-only policies?

The fleet. N engine processes (multiprocessing, spawned), each owning an
engine_pool.EnginePool of C blocks of 16 tokens (a paged vLLM-like pool with
prefix caching and LRU eviction) and a kv_publisher.Publisher (vLLM's map
encoding, an XPUB on loopback TCP with a ROUTER replay socket). One real
prefixd subscribes to all of them (one --index_source=eK=PUB,REPLAY per
engine, --index_block_size=16). The router is this process: it takes the
requests of a Mooncake trace (tests/data/mooncake) in arrival order, each
hash id one block of 16 tokens (engine_pool.trace_tokens), and sends each to
one engine.

The engine model (simulated time, deterministic). Time is counted in ticks
of TICK_MS = 50 ms; a request arrives at tick floor(timestamp / 50 ms). Per
tick an engine
  1. admits waiting requests FIFO while they fit in the pool (engine_pool's
     rule: the hit blocks are taken out of the free queue, the rest
     allocated, evicting LRU blocks; head-of-line blocking) and fewer than
     MAX_RUNNING = 16 run (vLLM's max_num_seqs). Admission
     publishes BlockStored for the newly computed blocks and BlockRemoved
     for the evicted ones, one batch per tick (as vLLM publishes per
     scheduler step, when it caches the blocks it schedules);
  2. prefills up to PREFILL_BLOCKS_PER_TICK (32 blocks = 512 tokens) of the
     uncached blocks of its admitted requests, FIFO (chunked prefill: a
     shared budget, so a busy engine prefills later);
  3. decodes DECODE_TOKENS_PER_TICK (2) tokens of every request whose
     prefill is done; a request with output_length tokens decoded finishes
     and its blocks go back to the free queue (still cached).
So a request's service time is its queueing + prefill of its uncached
blocks + output_length / 2 ticks of decode, and an engine's *load* is its
running + waiting requests (what a router counts as in flight). An idle
engine skips to the next arrival. Nothing is random except the dropped
batches (a seeded random.Random per engine): every policy but prefixd is
exactly reproducible; prefixd depends on how far the index lags (below).

Policies (the same engines, fresh pools and an AllBlocksCleared before each
policy, the same requests):
  rr       round robin;
  ll       least loaded (fewest requests in flight; ties: name);
  session  crc32 of the first block's hash id, mod N (a session-affinity
           hash; note that every request of the conversation trace has the
           same first block, 0, so there it sends everything to one engine);
  prefixd  Route over the real daemon (the Python client), then the rule:
           among the engines whose load is <= the least load + --load_slack
           (default 2 requests), the one with the most matched blocks; ties:
           least loaded, then name. A worker that is not LIVE counts as 0
           matched blocks (docs/index.md: skip workers that may be behind).
           A failed Route falls back to least loaded;
  oracle   the same rule on every engine's cache read directly
           (EnginePool.cached_prefix_blocks at the moment of routing): the
           bound for routing from exact state. Not a strict upper bound of
           hit rates: the rule is greedy, and one pick made otherwise
           changes every later cache, so a run that differs in a single
           pick can land a few tenths of a point either side of it;
  prefixd+drop (--full only) prefixd again with 1% of the event batches
           dropped in transit (kv_publisher.drop_next at random, seeded;
           the daemon sees the gap and replays it from the ROUTER), run
           --runs times (3; seeds seed, seed+1, ...): the median run counts,
           the table gives the lowest and highest too;
  oracle~K (only when asked for, --policies) the oracle with K picks, chosen
           by the seed, sent to the rule's runner-up instead, --runs times:
           how far a handful of different picks moves the hit rate (the
           noise floor of comparing prefixd with the oracle).

No waiting for the index. Before each request the router tells every engine
to advance to the request's arrival tick (each publishes that tick's
batches before it answers), then Routes at once: no quiescence wait, no
sleep. Whatever the daemon has not applied by then is the index's lag,
which a real router would see too (here the window is a few hundred
microseconds, against the trace's hundreds of milliseconds between
arrivals in real life: the simulation is the harsher case). To tell lag
from routing, each prefixd Route is also compared with the engines' exact
state at that moment (the engines do not move while the router decides):
"behind" counts Routes where some worker's last_seq was older than its
engine's last batch, "stale" those where some worker's matched_blocks
differed from the engine's cache, and "changed" those where the rule would
have picked another engine on exact state than on the index's answer;
"not LIVE" counts the worker entries the rule skipped (a REPLAYING worker,
just after a gap), and how many picks that skipping changed.

Metrics per (trace, N, C) row:
  hit rate  fleet prefill tokens saved / prompt tokens (the hit at
            admission, which can be lower than at routing: eviction in
            between);
  vs rr     a policy's hit rate / round robin's;
  load CV   coefficient of variation (population std / mean) of the number
            of requests each engine served: 0 is perfectly even;
  TTFT      mean time to first token in simulated seconds (arrival to end
            of prefill), the cost of an uneven load;
  Route     p50 / p99 latency of Route as the router sees it (client call,
            TCP loopback), milliseconds.

Usage:
  fleet_sim.py --prefixd PATH [--stubs DIR]       # the short test (ctest)
  fleet_sim.py --prefixd PATH --full               # the whole matrix
Flags: --requests (per trace; short default 2000, full default all),
--load_slack, --drop_rate (of --full's drop run), --seed, --speedup
(arrivals N times faster than the trace: a busier fleet), and --policies,
--traces, --fleets, --capacities to run part of a matrix.
The short mode (2000 requests of the synthetic trace, N = 4, C = 4096, no
drop; about 15 s) checks prefixd >= oracle - 1 point and prefixd > round
robin; --full (both traces whole, N = 4 and 8, C = 1024 and 8192, with the
drop run; about 10 minutes) checks prefixd >= oracle - 0.5 points and, with
drops, >= oracle - 1 point on every row.
Prints the table, one line per check and "N passed, M failed"; exit 1 on a
failure, 77 (skipped) without --prefixd.
"""

import atexit
import collections
import os
import random
import statistics
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

from prefixd import engine_pool as ep  # noqa: E402
from prefixd import kv_publisher as kp  # noqa: E402

BS = 16
TICK_MS = 50
PREFILL_BLOCKS_PER_TICK = 32
DECODE_TOKENS_PER_TICK = 2
MAX_RUNNING = 16

SHORT = dict(traces=("synthetic",), fleets=(4,), capacities={"synthetic": (4096,)},
             requests=2000, drop=False)
FULL = dict(traces=("conversation", "synthetic"), fleets=(4, 8),
            capacities={"conversation": (1024, 8192), "synthetic": (1024, 8192)},
            requests=None, drop=True)
POLICIES = ("rr", "ll", "session", "prefixd", "oracle")

QUIESCE_TIMEOUT = 30
ROUTE_DEADLINE = 2.0


# ---- the engine (runs in its own process) ----

def prompt_tokens(trace, ids):
    base = ep.TRACE_ID_BASE.get(trace, 0)
    out = []
    for h in ids:
        first = (base + h) * BS
        out.extend(range(first, first + BS))
    return out


class SimEngine(ep.EnginePool):
    """EnginePool stepped in simulated time (the module docstring's model)."""

    def __init__(self, capacity, name, publisher, drop_rate, seed, memo):
        super().__init__(capacity, BS, publisher=publisher, hash_seed=name.encode(), name=name)
        self.tick = 0
        self.work = {}          # rid -> [prefill blocks left, decode tokens left, arrival, ttft]
        self.drop_rate = drop_rate
        self.rng = random.Random("%s/%s" % (seed, name))
        self.memo = memo        # (trace, hash id) -> digest: a Mooncake id names its prefix
        self.sim = collections.Counter()
        self.ttft = []

    def hashes(self, trace, ids):
        """block_hashes(prompt_tokens(trace, ids)), memoized per hash id."""
        out, parent = [], self.seed
        for h in ids:
            d = self.memo.get((trace, h))
            if d is None:
                d = ep.chain_hash(parent, prompt_tokens(trace, (h,)), None)
                self.memo[(trace, h)] = d
            out.append(d)
            parent = d
        return out

    def prefix(self, trace, ids):
        n = 0
        for d in self.hashes(trace, ids):
            if d not in self.cached:
                break
            n += 1
        return n

    def submit_ids(self, trace, ids, output_length, arrival):
        self._rid += 1
        r = ep.Request(self._rid, prompt_tokens(trace, ids), None, None, None, 1,
                       self.hashes(trace, ids))
        self.sim["requests"] += 1
        self.sim["prompt_blocks"] += len(ids)
        if self._blocks_needed(r) > self.C:
            r.state = ep.REFUSED
            self.counts["refused"] += 1
            return
        self.work[r.rid] = [0, max(1, output_length), arrival, None]
        self.waiting.append(r)

    def load(self):
        return len(self.running) + len(self.waiting)

    def step(self, append=()):
        self.tick += 1
        while (self.waiting and len(self.running) < MAX_RUNNING
               and self._admit(self.waiting[0])):
            r = self.waiting.popleft()
            self.work[r.rid][0] = self._blocks_needed(r) - r.hit
        budget = PREFILL_BLOCKS_PER_TICK
        still = []
        for r in self.running:
            w = self.work[r.rid]
            if w[0] > 0:
                n = min(budget, w[0])
                budget -= n
                w[0] -= n
                if w[0] == 0:
                    w[3] = self.tick - w[2]
                still.append(r)
                continue
            if w[3] is None:  # wholly cached: first token in the admitting tick
                w[3] = self.tick - w[2]
            w[1] -= DECODE_TOKENS_PER_TICK
            if w[1] <= 0:
                self.ttft.append(w[3])
                del self.work[r.rid]
                self._free(r)
            else:
                still.append(r)
        self.running = still
        self.steps += 1
        return self.flush()

    def flush(self):
        if self.pending and self.drop_rate and self.rng.random() < self.drop_rate:
            self.publisher.drop_next(1)
            self.sim["dropped_batches"] += 1
        return super().flush()

    def advance(self, tick):
        while self.tick < tick:
            if self.idle():
                self.tick = tick
                break
            self.step()

    def drain(self, max_ticks=10_000_000):
        end = self.tick + max_ticks
        while not self.idle():
            self.step()
            assert self.tick < end, "the engine does not drain"

    def stats(self):
        c = self.counts
        return dict(requests=self.sim["requests"], prompt_blocks=self.sim["prompt_blocks"],
                    hit_blocks=c["hit_blocks"], refused=c["refused"], evicted=c["evicted"],
                    batches=c["batches"], dropped_batches=self.sim["dropped_batches"],
                    ttft_ticks=sum(self.ttft), finished=len(self.ttft),
                    last_seq=self.publisher.last_seq)


def engine_main(conn, name):
    """One engine process: a publisher, and a SimEngine per policy run,
    driven by the router's messages over `conn`."""
    pub = kp.Publisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", encoding="map",
                       hash_kind="int", name=name)
    conn.send(pub.source_flag())
    memo = {}
    eng = None
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the router is gone
                break
            op = msg[0]
            if op == "advance":  # (op, tick, submit or None, query or None)
                _, tick, submit, query = msg
                if submit is not None:
                    eng.submit_ids(*submit)
                eng.advance(tick)
                conn.send((eng.load(), eng.prefix(*query) if query is not None else None,
                           pub.last_seq))
            elif op == "reset":  # (op, capacity, drop_rate, seed)
                eng = SimEngine(msg[1], name, pub, msg[2], msg[3], memo)
                pub.all_blocks_cleared()
                conn.send(pub.last_seq)
            elif op == "drain":
                eng.drain()
                eng.check()
                conn.send(eng.stats())
            elif op == "subscribed":
                conn.send(pub.wait_for_subscriber(msg[1]))
            elif op == "selfcheck":  # the memoized hashes are engine_pool's
                trace, ids = msg[1], msg[2]
                conn.send(eng.hashes(trace, ids)
                          == eng.block_hashes(prompt_tokens(trace, ids)))
            elif op == "stop":
                break
    finally:
        pub.close()
        conn.close()


# ---- the router ----

def pick(loads, matched, names, slack):
    """The routing rule: the most matched blocks among the engines within
    `slack` of the least load; ties: least loaded, then name."""
    bound = min(loads) + slack
    best = None
    for k in range(len(loads)):
        if loads[k] > bound:
            continue
        key = (-matched[k], loads[k], names[k])
        if best is None or key < best[0]:
            best = (key, k)
    return best[1]


def percentile(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


class Fleet:
    def __init__(self, n, binary, args):
        self.n = n
        self.binary = binary
        self.args = args
        self.names = ["e%d" % k for k in range(n)]
        self.procs, self.conns = [], []
        self.daemon = None
        self.client = None

    def start(self):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")  # no fork of a process with gRPC threads
        for name in self.names:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=engine_main, args=(child, name), name=name, daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        flags = [c.recv() for c in self.conns]
        if self.binary:
            import prefixd
            import prefixd_fixture
            self.daemon = prefixd_fixture.Daemon(
                self.binary, "", args=["--index_block_size=%d" % BS]
                + ["--index_source=" + f for f in flags])
            atexit.register(self.daemon.kill)  # whatever happens to this script
            self.daemon.start()
            self.client = prefixd.Client(self.daemon.tcp, deadline=ROUTE_DEADLINE)
            for c in self.conns:
                c.send(("subscribed", 10.0))
            subscribed = [c.recv() for c in self.conns]
            if not all(subscribed):
                raise RuntimeError("the daemon did not subscribe to every engine: %s"
                                   % subscribed)

    def workers(self):
        return {w.worker: w for w in self.client.list_workers().workers}

    def reset(self, capacity, drop_rate, seed):
        for c in self.conns:
            c.send(("reset", capacity, drop_rate, seed))
        seqs = [c.recv() for c in self.conns]
        if self.client is None:
            return None
        # Setup, not routing: the index must start each policy empty and LIVE.
        deadline = time.monotonic() + QUIESCE_TIMEOUT
        while True:
            ws = self.workers()
            if all(n in ws and ws[n].last_seq == s and not sum(ws[n].mediums.values())
                   and ws[n].state == 2 for n, s in zip(self.names, seqs)):
                return ws
            if time.monotonic() > deadline:
                raise RuntimeError("the index did not quiesce after a reset: %s" % ws)
            time.sleep(0.02)

    def run(self, policy, trace, reqs, capacity, drop_rate=0.0, seed=None):
        """One policy over the requests; returns its figures."""
        seed = self.args.seed if seed is None else seed
        before = self.reset(capacity, drop_rate, seed)
        n, names, slack = self.n, self.names, self.args.load_slack
        uses_index = policy.startswith("prefixd")
        want_truth = uses_index or policy.startswith("oracle")
        perturb = set()
        if policy.startswith("oracle~"):  # K picks (chosen by the seed) go to the runner-up
            perturb = set(random.Random(seed).sample(range(len(reqs)),
                                                     min(len(reqs), int(policy[7:]))))
        pending = None  # (engine, submit) of the previous request
        rr = 0
        lat, behind, stale, changed, not_live, skip_changed, errors = [], 0, 0, 0, 0, 0, 0
        t0 = time.monotonic()
        for i, r in enumerate(reqs):
            tick = int(r.timestamp / self.args.speedup) // TICK_MS
            query = (trace, r.hash_ids) if want_truth else None
            for k, c in enumerate(self.conns):
                c.send(("advance", tick, pending[1] if pending and pending[0] == k else None,
                        query))
            replies = [c.recv() for c in self.conns]
            loads = [x[0] for x in replies]
            if policy == "rr":
                k = rr % n
                rr += 1
            elif policy == "ll":
                k = min(range(n), key=lambda j: (loads[j], names[j]))
            elif policy == "session":
                k = zlib.crc32(str(r.hash_ids[0]).encode()) % n
            elif policy.startswith("oracle"):
                truth = [x[1] for x in replies]
                k = pick(loads, truth, names, slack)
                if i in perturb and n > 1:
                    truth[k] = -1
                    k = pick(loads, truth, names, slack)
            else:
                truth = [x[1] for x in replies]
                tokens = prompt_tokens(trace, r.hash_ids)
                s = time.perf_counter()
                try:
                    # Every engine, matched or not: the staleness check
                    # below reads each one's last_seq and state.
                    res = self.client.route(tokens, all_workers=True)
                except Exception:  # prefixd.PrefixdError: route by load
                    errors += 1
                    res = None
                lat.append(time.perf_counter() - s)
                if res is None:
                    k = min(range(n), key=lambda j: (loads[j], names[j]))
                else:
                    got = {w.worker: w for w in res.workers}
                    matched = []
                    for name in names:
                        w = got.get(name)
                        if w is not None and w.state != 2:
                            not_live += 1
                        matched.append(w.matched_blocks if w is not None and w.state == 2
                                       else 0)
                    k = pick(loads, matched, names, slack)
                    if any(nm not in got or got[nm].last_seq < x[2]
                           for nm, x in zip(names, replies)):
                        behind += 1
                    raw = [got[nm].matched_blocks if nm in got else 0 for nm in names]
                    if matched != raw and pick(loads, raw, names, slack) != k:
                        skip_changed += 1
                    if raw != truth:
                        stale += 1
                        if pick(loads, truth, names, slack) != pick(loads, raw, names, slack):
                            changed += 1
            pending = (k, (trace, r.hash_ids, r.output_length, tick))
        if pending:
            self.conns[pending[0]].send(("advance", pending[1][3], pending[1], None))
            self.conns[pending[0]].recv()
        for c in self.conns:
            c.send(("drain",))
        stats = [c.recv() for c in self.conns]
        wall = time.monotonic() - t0
        after = self.workers() if uses_index else None
        reqs_per = [s["requests"] for s in stats]
        mean = statistics.mean(reqs_per)
        out = dict(
            policy=policy, trace=trace, n=n, capacity=capacity, requests=len(reqs), seed=seed,
            hit=100.0 * sum(s["hit_blocks"] for s in stats)
            / max(1, sum(s["prompt_blocks"] for s in stats)),
            cv=statistics.pstdev(reqs_per) / mean if mean else 0.0,
            per_engine=reqs_per,
            ttft=TICK_MS / 1000.0 * sum(s["ttft_ticks"] for s in stats)
            / max(1, sum(s["finished"] for s in stats)),
            refused=sum(s["refused"] for s in stats),
            evicted=sum(s["evicted"] for s in stats),
            batches=sum(s["batches"] for s in stats),
            dropped=sum(s["dropped_batches"] for s in stats),
            wall=wall)
        if uses_index:
            out.update(p50=1000 * percentile(lat, 50), p99=1000 * percentile(lat, 99),
                       behind=behind, stale=stale, changed=changed, not_live=not_live,
                       skip_changed=skip_changed, errors=errors,
                       gaps=sum(after[m].gaps - before[m].gaps for m in names),
                       replays=sum(after[m].replays - before[m].replays for m in names),
                       clears=sum(after[m].clears - before[m].clears for m in names))
        return out

    def selfcheck(self, trace, ids):
        self.conns[0].send(("selfcheck", trace, ids))
        return self.conns[0].recv()

    def close(self):
        for c, p in zip(self.conns, self.procs):
            try:
                if p.is_alive():
                    c.send(("stop",))
            except (OSError, EOFError):
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        rc = None
        if self.daemon is not None:
            rc = self.daemon.stop()
            self.daemon.close()
        return rc


# ---- the report ----

def row_key(r):
    return (r["trace"], r["n"], r["capacity"])


def hit_cell(r):
    """A hit rate; of several runs, the median and (the lowest - the highest)."""
    hits = r.get("hits", [r["hit"]])
    if len(hits) == 1:
        return "%.2f" % r["hit"]
    return "%.2f (%.2f - %.2f)" % (r["hit"], min(hits), max(hits))


def print_tables(results, policies):
    rows = collections.OrderedDict()
    for r in results:
        rows.setdefault(row_key(r), {})[r["policy"]] = r
    hdr = ["trace", "N", "C", "reqs"] + ["%s hit %%" % p for p in policies] + [
        "prefixd - oracle", "prefixd / rr", "Route p50 / p99 ms"]
    if "prefixd+drop" in policies:
        hdr += ["drop - oracle", "drop Route p50 / p99 ms"]
    print()
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for (trace, n, c), by in rows.items():
        cells = [trace, str(n), str(c), str(by[policies[0]]["requests"])]
        cells += [hit_cell(by[p]) if p in by else "-" for p in policies]
        px, orc, rr = by.get("prefixd"), by.get("oracle"), by.get("rr")
        cells.append("%+.2f" % (px["hit"] - orc["hit"]) if px and orc else "-")
        cells.append("%.2fx" % (px["hit"] / rr["hit"]) if px and rr and rr["hit"] else "-")
        cells.append("%.2f / %.2f" % (px["p50"], px["p99"]) if px else "-")
        if "prefixd+drop" in policies:
            d = by.get("prefixd+drop")
            cells.append("%+.2f" % (d["hit"] - orc["hit"]) if d and orc else "-")
            cells.append("%.2f / %.2f" % (d["p50"], d["p99"]) if d else "-")
        print("| " + " | ".join(cells) + " |")
    print()
    hdr = ["trace", "N", "C"] + ["%s CV / TTFT s" % p for p in policies]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for (trace, n, c), by in rows.items():
        cells = [trace, str(n), str(c)]
        cells += ["%.2f / %.2f" % (by[p]["cv"], by[p]["ttft"]) if p in by else "-"
                  for p in policies]
        print("| " + " | ".join(cells) + " |")
    print()
    for (trace, n, c), by in rows.items():
        print("  %s N=%d C=%d:" % (trace, n, c))
        for p in policies:
            r = by.get(p)
            if r is None:
                continue
            print("    %-12s requests per engine %s, %d blocks evicted, %d refused; %.1f s"
                  % (p, r["per_engine"], r["evicted"], r["refused"], r["wall"]))
            if "stale" in r:
                print("    %-12s %d Routes: %d behind an engine's last batch, %d stale (%d "
                      "changed the pick), %d worker entries not LIVE (skipping them changed %d "
                      "picks), %d Route errors; %d batches, %d dropped, %d gaps, %d replays, "
                      "%d clears"
                      % ("", r["requests"], r["behind"], r["stale"], r["changed"],
                         r["not_live"], r["skip_changed"], r["errors"], r["batches"],
                         r["dropped"], r["gaps"], r["replays"], r["clears"]))
    print()


def main():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import common  # tests/python/common.py

    def extra(ap):
        ap.add_argument("--full", action="store_true", help="the whole matrix (make bench)")
        ap.add_argument("--requests", type=int, help="requests per trace (default: short "
                        "%d, full: all)" % SHORT["requests"])
        ap.add_argument("--load_slack", type=int, default=2,
                        help="prefixd/oracle: engines within this many requests of the "
                        "least loaded are candidates")
        ap.add_argument("--drop_rate", type=float, default=0.01,
                        help="share of event batches dropped in --full's drop run")
        ap.add_argument("--runs", type=int, default=3,
                        help="runs per row of prefixd+drop and oracle~K (seeds seed, seed+1, "
                        "...); the median run counts")
        ap.add_argument("--seed", type=int, default=1)
        ap.add_argument("--speedup", type=float, default=1.0,
                        help="arrivals this many times faster than the trace's timestamps")
        ap.add_argument("--policies", default=None,
                        help="comma-separated subset of %s (and prefixd+drop)"
                        % ",".join(POLICIES))
        ap.add_argument("--traces", default=None, help="comma-separated, overrides the mode's")
        ap.add_argument("--fleets", default=None, help="comma-separated N, overrides the mode's")
        ap.add_argument("--capacities", default=None,
                        help="comma-separated C for every trace, overrides the mode's")
    args = common.setup(__doc__, extra=extra)
    if sys.argv[1:]:
        print("fleet_sim: unknown arguments %s" % sys.argv[1:])
        return 2
    if not args.prefixd:
        print("--prefixd not given: skipped")
        return 77
    mode = FULL if args.full else SHORT
    policies = list(POLICIES) + (["prefixd+drop"] if mode["drop"] else [])
    if args.policies:
        policies = [p for p in args.policies.split(",") if p]
    traces = args.traces.split(",") if args.traces else mode["traces"]
    fleets = [int(x) for x in args.fleets.split(",")] if args.fleets else mode["fleets"]
    limit = args.requests if args.requests is not None else mode["requests"]
    checks = common.Checker()
    results = []
    t0 = time.monotonic()
    print("fleet_sim: %s mode, traces %s, N %s, load_slack %d, speedup %g, seed %d" % (
        "full" if args.full else "short", ",".join(traces), fleets, args.load_slack,
        args.speedup, args.seed))
    for n in fleets:
        fleet = Fleet(n, args.prefixd, args)
        try:
            ts = time.monotonic()
            fleet.start()
            print("  N=%d: %d engine processes and prefixd up, subscribed (%.1f s)"
                  % (n, n, time.monotonic() - ts))
            for trace in traces:
                reqs = ep.load_trace(trace, limit)
                caps = ([int(x) for x in args.capacities.split(",")] if args.capacities
                        else mode["capacities"].get(trace, (1024,)))
                for cap in caps:
                    for p in policies:
                        drop = p == "prefixd+drop"
                        runs = []
                        for j in range(args.runs if drop or p.startswith("oracle~") else 1):
                            r = fleet.run(p, trace, reqs, cap, args.drop_rate if drop else 0.0,
                                          args.seed + j)
                            runs.append(r)
                            print("  %-12s %-12s N=%d C=%-6d seed %d  hit %6.2f%%  CV %.3f  "
                                  "TTFT %.2f s  %.1f s%s" % (
                                      p, trace, n, cap, r["seed"], r["hit"], r["cv"], r["ttft"],
                                      r["wall"], "  Route p50 %.2f p99 %.2f ms" % (
                                          r["p50"], r["p99"]) if "p50" in r else ""))
                            sys.stdout.flush()
                        runs.sort(key=lambda x: x["hit"])
                        r = runs[len(runs) // 2]  # the median run
                        r["hits"] = [x["hit"] for x in runs]
                        if "errors" in r:
                            r["errors"] = sum(x["errors"] for x in runs)
                        results.append(r)
            if fleet.client is not None:
                checks.check(fleet.selfcheck(traces[0], ep.load_trace(traces[0], 1)[0].hash_ids),
                             "N=%d: the engines' memoized hashes are engine_pool's" % n)
        finally:
            ts = time.monotonic()
            rc = fleet.close()
            print("  N=%d: engines and prefixd stopped (%.1f s)" % (n, time.monotonic() - ts))
        checks.check(rc == 0, "N=%d: prefixd exits 0 on SIGTERM" % n, "exit %s" % rc)
    print_tables(results, policies)
    by = collections.defaultdict(dict)
    for r in results:
        by[row_key(r)][r["policy"]] = r
    margin = 0.5 if args.full else 1.0
    for (trace, n, c), row in by.items():
        px, orc, rr = row.get("prefixd"), row.get("oracle"), row.get("rr")
        where = "%s N=%d C=%d" % (trace, n, c)
        if px and orc:
            checks.check(px["hit"] >= orc["hit"] - margin,
                         "%s: prefixd hit rate %.2f%% >= oracle %.2f%% - %.1f"
                         % (where, px["hit"], orc["hit"], margin))
        if px and rr:
            checks.check(px["hit"] > rr["hit"], "%s: prefixd %.2f%% > round robin %.2f%% (%.2fx)"
                         % (where, px["hit"], rr["hit"], px["hit"] / max(rr["hit"], 1e-9)))
        d = row.get("prefixd+drop")
        if d and orc:
            checks.check(d["hit"] >= orc["hit"] - 1.0,
                         "%s: with 1%% of the batches dropped (%d of %d in the median run, %d "
                         "replays), prefixd %.2f%% (median of runs %s) >= oracle %.2f%% - 1"
                         % (where, d["dropped"], d["batches"], d["replays"], d["hit"],
                            ", ".join("%.2f" % h for h in d["hits"]), orc["hit"]))
        for p, r in row.items():
            if "errors" in r:
                checks.check(r["errors"] == 0, "%s %s: every Route answered" % (where, p),
                             "%d errors" % r["errors"])
    print("(%.1f s)" % (time.monotonic() - t0))
    return checks.exit_code()


if __name__ == "__main__":
    sys.exit(main())
