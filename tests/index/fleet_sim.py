#!/usr/bin/python3
"""Fleet routing on a simulated fleet: does routing by the fleet index
(docs/index.md) save as much prefill as routing by the engines' exact cache
state, and how much more than the usual load-only policies? And how do the peer
routers' rules and Pick's cost model compare, light and heavy load?

The fleet. N engine processes (multiprocessing, spawned), each owning an
engine_pool.EnginePool of C blocks of 16 tokens (a paged vLLM-like pool with
prefix caching and LRU eviction) and a kv_publisher.Publisher (vLLM's map
encoding, an XPUB on loopback TCP with a ROUTER replay socket). One real
prefixd subscribes to all of them (one --index_source=eK=PUB,REPLAY per
engine, --index_block_size=16). The router is this process: it takes the
requests of a Mooncake trace (tests/data/mooncake) in arrival order, each
hash id one block of 16 tokens (engine_pool.trace_tokens), and sends each to
one engine.

The light regime's engine (simulated time, deterministic). Time is counted
in ticks of TICK_MS = 50 ms; a request arrives at tick floor(timestamp /
50 ms). Per tick an engine
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
batches (a seeded random.Random per engine): every policy that reads no
index is exactly reproducible; the others depend on how far the index lags
(below). At the traces' own rates these engines hardly queue: load barely
matters in this regime.

The heavy regime's engine (--compare, --regimes heavy) is busy: most of a
request's TTFT is time spent queued. Time is in milliseconds and the engine
runs one scheduler step after another (vLLM v1's loop), a step taking
HEAVY["step_base_ms"] (5) + 0.02 ms per prompt block of the decoding
requests + 12 ms per prefill block computed in it. A step
  1. gives its prefill budget (4 blocks) to the request under prefill, then
     to the queue's head, FIFO: a waiting request is scheduled (its blocks
     allocated as in the light regime: BlockStored, evictions) only when
     its first chunk fits the step and fewer than 64 run; until then it
     counts as waiting (vllm:num_requests_waiting);
  2. decodes one token of every request whose prefill is done (the first
     token comes out of the step that finishes the prefill); a request
     finishes after output_length steps of decode.
An engine prefills at most about 75 uncached blocks a second (4 per 53 ms
step), and decode slows every step a little. The arrivals are the trace's,
rescaled: the timestamps are multiplied so that each engine receives, on
average over the requests run, HEAVY_RATES[trace][C] requests per second
(--heavy_rate overrides). For each trace and capacity that is the rate at
which least-loaded routing spends about 70-80 % of its mean TTFT queued
(before its first chunk; chosen on the whole traces at N = 4; 57-77 %
over the --full matrix, N = 8 smoothing the bursts) while its queues still
drain between bursts (0.2 requests/s more doubles to quadruples its mean
TTFT). The conversation trace's longer outputs hold
requests, and their blocks, longer: its rates are lower. A cache-aware
policy computes less and so queues less at the same rate.

Policies (the same engines, fresh pools and an AllBlocksCleared before each
policy, the same requests; fleet_policies.py states each rule and where it
comes from):
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
           A failed Route counts as no match anywhere: least loaded;
  oracle   the same rule on every engine's cache read directly
           (EnginePool.cached_prefix_blocks at the moment of routing): the
           bound for routing from exact state. Not a strict upper bound of
           hit rates: the rule is greedy, and one pick made otherwise
           changes every later cache, so a run that differs in a single
           pick can land a few tenths of a point either side of it;
  dynamo, llmd, sglang (--compare) the peer routers' published rules:
           NVIDIA Dynamo's KV router cost with predicted entries, llm-d's
           weighted scorers with speculative entries, SGLang's cache-aware
           router with its balance thresholds. Dynamo and llm-d read the KV
           events (here through the same daemon's Route); SGLang keeps its
           own tree of what it sent;
  pick     the daemon's own Pick RPC with its shipped defaults, the router
           passing the load it knows itself (its requests in flight, the
           prefill tokens Pick's answers predicted for the requests it sent
           until their first token, the engines' KV usage;
           fleet_policies.Pick). The daemon runs with
           index.pick.replay_clock: each Pick carries the request's
           simulated time (each run starting REPLAY_EPOCH_MS past the last),
           so the predicted blocks' TTL and the window age in simulated
           time. pick-window (--compare) passes no load: the daemon's
           window of its own picks stands in;
  pickpy   (--compare) fleet_policies.PickModel, the same cost model in
           Python over Route's answers (knobs: --pick; pickpy-window:
           without the router's load), for tuning knobs without a build;
  pick-model (only when asked for, --policies) pick, with pickpy's model
           asked the same before each Pick on the same state (Route's
           view; the daemon's choice is then recorded in the model too):
           counts the requests where the two chose differently, and how
           many of those the model saw as an exact tie;
  prefixd+drop (--full only) prefixd again with 1% of the event batches
           dropped in transit (kv_publisher.drop_next at random, seeded;
           the daemon sees the gap and replays it from the ROUTER), run
           --runs times (3; seeds seed, seed+1, ...): the median run counts,
           the table gives the lowest and highest too (pick+drop likewise,
           in --full --compare; pickpy+drop when asked for);
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

Metrics per (regime, trace, N, C) row:
  hit rate  fleet prefill tokens saved / prompt tokens (the hit at
            admission, which can be lower than at routing: eviction in
            between);
  vs rr     a policy's hit rate / round robin's;
  load CV   coefficient of variation (population std / mean) of the number
            of requests each engine served: 0 is perfectly even;
  TTFT      mean (and p99) time to first token in simulated seconds
            (arrival to end of prefill); heavy: the share of the mean spent
            queued, before the first chunk;
  Route     p50 / p99 latency of Route as the router sees it (client call,
            TCP loopback), milliseconds;
  unused    (each row's details) the picks that went to an engine holding
            fewer of the prompt's blocks than another, and how many blocks
            they left unused.

Usage:
  fleet_sim.py --prefixd PATH [--stubs DIR]       # the short test (ctest)
  fleet_sim.py --prefixd PATH --full               # the whole matrix
  fleet_sim.py --prefixd PATH --full --compare     # every policy, both regimes
Flags: --requests (per trace; short default 2000, full default all),
--load_slack, --drop_rate (of --full's drop run), --seed, --engine_names
(the engines' names' prefix, "e"), --speedup
(light: arrivals N times faster than the trace), --heavy_rate, --pick
(pickpy's knobs; a policy named pickpy@knob=value@... runs a variant beside
it), --pick_config (the daemon's index.pick settings, for pick and
pick-window, e.g. 'churn_weight: 0.005'), --json (every run's figures to a file), and --policies, --regimes,
--traces, --fleets, --capacities to run part of a matrix.
The short mode (2000 requests of the synthetic trace, N = 4, C = 4096, no
drop, light regime; about 15 s) checks prefixd and pick >= oracle - 1 point
and prefixd > round robin; --full (both traces whole, N = 4 and 8, C = 1024
and 8192, with the drop run; about 10 minutes) checks prefixd and pick >=
oracle - 0.5 points and, with drops, prefixd >= oracle - 1 point on every
row. --compare runs rr, ll, session, prefixd, dynamo, llmd, sglang, pick,
pick-window, pickpy and oracle (with --full, pick+drop too) in both regimes
on the mode's rows and checks Pick's targets for pick and pickpy on every
row: saved prefill >= the best of the first seven's - 0.2 points; heavy:
mean and p99 TTFT <= the best of theirs + 5 %, load CV <= least loaded's +
0.05; pick+drop within 0.5 points of pick (--full --compare: about 45
minutes on 2 busy cores).
Prints the tables, one line per check and "N passed, M failed"; exit 1 on a
failure, 77 (skipped) without --prefixd.
"""

import atexit
import collections
import functools
import heapq
import json
import math
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

from prefixd import engine_pool as ep  # noqa: E402
from prefixd import kv_publisher as kp  # noqa: E402

import fleet_policies as fp  # noqa: E402  (beside this file)

BS = 16
TICK_MS = 50
PREFILL_BLOCKS_PER_TICK = 32
DECODE_TOKENS_PER_TICK = 2
MAX_RUNNING = 16

# The heavy regime's engine (the module docstring): milliseconds a step
# takes, and its limits.
HEAVY = dict(step_base_ms=5.0, decode_ms_per_block=0.02, prefill_ms_per_block=12.0,
             prefill_blocks_per_step=4, max_running=64)
# The heavy regime's arrivals, requests per engine per second, per trace and
# C (the module docstring says how they were chosen); another C takes the
# nearest one's.
HEAVY_RATES = {"conversation": {1024: 1.8, 8192: 2.0}, "synthetic": {1024: 2.0, 8192: 2.6}}

REGIMES = ("light", "heavy")
SHORT = dict(traces=("synthetic",), fleets=(4,), capacities={"synthetic": (4096,)},
             requests=2000, drop=False)
FULL = dict(traces=("conversation", "synthetic"), fleets=(4, 8),
            capacities={"conversation": (1024, 8192), "synthetic": (1024, 8192)},
            requests=None, drop=True)
POLICIES = ("rr", "ll", "session", "prefixd", "pick", "oracle")  # the default run's
PEERS = ("rr", "ll", "session", "prefixd", "dynamo", "llmd", "sglang")  # Pick's rivals
COMPARE = PEERS + ("pick", "pick-window", "pickpy", "oracle")  # --compare's

# Policy pick's replay clock: each run's simulated milliseconds start this
# far past the previous run's (longer than any run: the conversation trace
# spans about 3.5e6 ms).
REPLAY_EPOCH_MS = 10 ** 10

QUIESCE_TIMEOUT = 30
ROUTE_DEADLINE = 2.0


# ---- the engines (each runs in its own process) ----

def prompt_tokens(trace, ids):
    base = ep.TRACE_ID_BASE.get(trace, 0)
    out = []
    for h in ids:
        first = (base + h) * BS
        out.extend(range(first, first + BS))
    return out


class SimEngine(ep.EnginePool):
    """EnginePool stepped in simulated time: the light regime's engine (the
    module docstring's model). Time is the tick (TICK_MS)."""

    def __init__(self, capacity, name, publisher, drop_rate, seed, memo):
        super().__init__(capacity, BS, publisher=publisher, hash_seed=name.encode(), name=name)
        self.tick = 0
        self.work = {}          # rid -> [prefill blocks left, decode tokens left, arrival, ttft]
        self.drop_rate = drop_rate
        self.rng = random.Random("%s/%s" % (seed, name))
        self.memo = memo        # (trace, hash id) -> digest: a Mooncake id names its prefix
        self.sim = collections.Counter()
        self.ttft = []          # per finished request, milliseconds
        self.events = []        # (router's rid, FIRST_TOKEN or FINISHED) since the last reply
        self.rids = {}          # the pool's rid -> the router's

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

    def submit_ids(self, rid, trace, ids, output_length, arrival):
        self._rid += 1
        r = ep.Request(self._rid, prompt_tokens(trace, ids), None, None, None, 1,
                       self.hashes(trace, ids))
        self.sim["requests"] += 1
        self.sim["prompt_blocks"] += len(ids)
        if self._blocks_needed(r) > self.C:
            r.state = ep.REFUSED
            self.counts["refused"] += 1
            self.events.append((rid, fp.FINISHED))
            return
        self.rids[r.rid] = rid
        self.work[r.rid] = [0, max(1, output_length), arrival, None]
        self.waiting.append(r)

    def admitted(self, r):
        """r left the queue: its prefill starts."""
        self.work[r.rid][0] = self._blocks_needed(r) - r.hit

    def load(self):
        return len(self.running) + len(self.waiting)

    def kv_usage(self):
        """vLLM's kv_cache_usage_perc: the share of blocks some request holds."""
        return 1.0 - len(self.free) / self.C

    def step(self, append=()):
        self.tick += 1
        while (self.waiting and len(self.running) < MAX_RUNNING
               and self._admit(self.waiting[0])):
            r = self.waiting.popleft()
            self.admitted(r)
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
                    self.events.append((self.rids[r.rid], fp.FIRST_TOKEN))
                still.append(r)
                continue
            if w[3] is None:  # wholly cached: first token in the admitting tick
                w[3] = self.tick - w[2]
                self.events.append((self.rids[r.rid], fp.FIRST_TOKEN))
            w[1] -= DECODE_TOKENS_PER_TICK
            if w[1] <= 0:
                self.ttft.append(w[3] * TICK_MS)
                self.events.append((self.rids.pop(r.rid), fp.FINISHED))
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

    def now(self):
        return self.tick

    def advance(self, tick):
        while self.tick < tick:
            if self.idle():
                self.tick = tick
                break
            self.step()

    def drain(self, max_steps=10_000_000):
        end = self.steps + max_steps
        while not self.idle():
            self.step()
            assert self.steps < end, "the engine does not drain"

    def stats(self):
        c = self.counts
        return dict(requests=self.sim["requests"], prompt_blocks=self.sim["prompt_blocks"],
                    hit_blocks=c["hit_blocks"], refused=c["refused"], evicted=c["evicted"],
                    batches=c["batches"], dropped_batches=self.sim["dropped_batches"],
                    ttft=self.ttft, last_seq=self.publisher.last_seq)


class HeavyEngine(SimEngine):
    """The heavy regime's engine: one scheduler iteration per step, whose
    duration grows with the work in it (the module docstring's model).
    Time is in milliseconds."""

    def __init__(self, *a):
        super().__init__(*a)
        self.clock = 0.0
        self.prefilling = None   # the admitted request whose prefill is under way
        self.decoding = []       # heap of (step of its last token, rid)
        self.context = 0         # prompt blocks of the decoding requests
        self.by_rid = {}
        self.waits = []          # per admitted request: arrival to its first chunk, ms

    def next_prefill(self):
        """The request the step's prefill budget goes to next: the one under
        way, else the head of the queue if it can be scheduled now (vLLM's
        scheduler takes a waiting request only when its first chunk fits
        the step: blocks allocated, then counted as running)."""
        if self.prefilling is not None:
            return self.prefilling
        if not (self.waiting and len(self.running) < HEAVY["max_running"]
                and self._admit(self.waiting[0])):
            return None
        r = self.waiting.popleft()
        self.admitted(r)
        self.by_rid[r.rid] = r
        self.waits.append(self.clock - self.work[r.rid][2])
        self.prefilling = r
        return r

    def step(self, append=()):
        budget = HEAVY["prefill_blocks_per_step"]
        done = []
        while budget > 0:
            r = self.next_prefill()
            if r is None:
                break
            w = self.work[r.rid]
            n = min(budget, w[0])
            budget -= n
            w[0] -= n
            if w[0] == 0:
                done.append(r)
                self.prefilling = None
        chunk = HEAVY["prefill_blocks_per_step"] - budget
        self.clock += (HEAVY["step_base_ms"] + HEAVY["decode_ms_per_block"] * self.context
                       + HEAVY["prefill_ms_per_block"] * chunk)
        step = self.steps
        for r in done:  # the first token comes out of this step
            w = self.work[r.rid]
            w[3] = self.clock - w[2]
            self.events.append((self.rids[r.rid], fp.FIRST_TOKEN))
            heapq.heappush(self.decoding, (step + w[1] - 1, r.rid))
            self.context += len(r.hashes)
        while self.decoding and self.decoding[0][0] <= step:
            rid = heapq.heappop(self.decoding)[1]
            r = self.by_rid.pop(rid)
            self.context -= len(r.hashes)
            self.ttft.append(self.work.pop(rid)[3])
            self.events.append((self.rids.pop(r.rid), fp.FINISHED))
            self._free(r)
            self.running.remove(r)
        self.steps += 1
        return self.flush()

    def now(self):
        return self.clock

    def advance(self, t):
        while self.clock < t:
            if self.idle():
                self.clock = t
                break
            self.step()

    def stats(self):
        out = super().stats()
        out["waits"] = self.waits
        return out


def engine_main(conn, name):
    """One engine process: a publisher, and an engine per policy run,
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
            if op == "advance":  # (op, time, submit or None, query or None)
                _, t, submit, query = msg
                if submit is not None:
                    eng.submit_ids(*submit)
                eng.advance(t)
                conn.send((eng.load(), len(eng.waiting), eng.kv_usage(),
                           eng.prefix(*query) if query is not None else None,
                           pub.last_seq, eng.events))
                eng.events = []
            elif op == "reset":  # (op, regime, capacity, drop_rate, seed)
                cls = HeavyEngine if msg[1] == "heavy" else SimEngine
                eng = cls(msg[2], name, pub, msg[3], msg[4], memo)
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

def percentile(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


Req = collections.namedtuple("Req", "i ids now_ms")


class View:
    """What the policies see of the fleet for one request (fleet_policies)."""
    __slots__ = ("inflight", "waiting", "kv_usage", "truth", "route")


def heavy_scale(trace, reqs, n, capacity, args):
    """The factor from a trace timestamp (ms) to the heavy regime's
    arrival (ms): each of the n engines receives heavy_rate() requests per
    second on average over `reqs`."""
    span_ms = max(reqs[-1].timestamp - reqs[0].timestamp, 1)
    trace_rate = 1000.0 * max(len(reqs) - 1, 1) / span_ms  # requests per second
    return trace_rate / (heavy_rate(trace, capacity, args) * n)


def arrival(regime, scale, timestamp_ms, args):
    """A request's arrival in the regime's time: the light regime's tick
    (--speedup), the heavy regime's milliseconds (heavy_scale)."""
    if regime == "heavy":
        return timestamp_ms * scale
    return int(timestamp_ms / args.speedup) // TICK_MS


def heavy_rate(trace, capacity, args):
    """The heavy regime's requests per engine per second."""
    if args.heavy_rate is not None:
        return args.heavy_rate
    rates = HEAVY_RATES[trace]
    return rates[min(rates, key=lambda c: abs(math.log2(c) - math.log2(capacity)))]


class Fleet:
    def __init__(self, n, binary, args):
        self.n = n
        self.binary = binary
        self.args = args
        self.names = ["%s%d" % (args.engine_names, k) for k in range(n)]
        self.procs, self.conns = [], []
        self.daemon = None
        self.client = None
        self.epoch_ms = 0  # the replay clock's start of the current run

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
            # replay_clock: pick's Picks carry simulated time (REPLAY_EPOCH_MS).
            self.daemon = prefixd_fixture.Daemon(
                self.binary, "index { pick { replay_clock: true %s } }"
                % self.args.pick_config,
                args=["--index_block_size=%d" % BS]
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

    def reset(self, regime, capacity, drop_rate, seed):
        for c in self.conns:
            c.send(("reset", regime, capacity, drop_rate, seed))
        seqs = [c.recv() for c in self.conns]
        # Each run's simulated time starts past the last one's, so the
        # daemon's replay clock only runs forward and a run starts with no
        # prediction or window pick of the one before live.
        self.epoch_ms += REPLAY_EPOCH_MS
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

    def route(self, trace, ids, view, replies, st):
        """Route over the daemon into view.route: per engine (matched
        blocks, state); every engine (0, 0) when the call fails. Counts the
        lag figures into `st` (the module docstring)."""
        s = time.perf_counter()
        try:
            res = self.client.route(prompt_tokens(trace, ids), all_workers=True)
        except Exception:  # prefixd.PrefixdError: the policy sees no match anywhere
            st["errors"] += 1
            view.route = [(0, 0)] * self.n
            return
        finally:
            st["lat"].append(time.perf_counter() - s)
        got = {w.worker: w for w in res.workers}
        view.route = [(got[nm].matched_blocks, int(got[nm].state)) if nm in got else (0, 0)
                      for nm in self.names]
        st["not_live"] += sum(1 for _, state in view.route if state != fp.LIVE)
        if any(nm not in got or got[nm].last_seq < x[4] for nm, x in zip(self.names, replies)):
            st["behind"] += 1
        raw = [m for m, _ in view.route]
        if raw != view.truth:
            st["stale"] += 1
        # What lag and skipping did to today's rule's pick (prefixd's figures).
        rule = functools.partial(fp.bounded_most_matched, view.inflight, names=self.names,
                                 slack=self.args.load_slack)
        live = [m if state == fp.LIVE else 0 for m, state in view.route]
        if raw != view.truth and rule(view.truth) != rule(raw):
            st["changed"] += 1
        if live != raw and rule(live) != rule(raw):
            st["skip_changed"] += 1

    def pick(self, trace, req, candidates, loads, st):
        """The daemon's Pick for policy pick (fleet_policies.Pick): its
        PickResult, or None when the call failed (counted in `st`)."""
        import prefixd
        s = time.perf_counter()
        try:
            return self.client.pick(
                prompt_tokens(trace, req.ids), candidates=candidates,
                loads=None if loads is None else {
                    w: prefixd.WorkerLoad(l.requests_in_flight,
                                          int(round(l.queued_prefill_tokens)), l.kv_usage)
                    for w, l in loads.items()},
                replay_time_ms=self.epoch_ms + int(req.now_ms) + 1)
        except Exception:  # prefixd.PrefixdError: the policy falls back on least loaded
            st["errors"] += 1
            return None
        finally:
            st["lat"].append(time.perf_counter() - s)

    def run(self, policy, regime, trace, reqs, capacity, drop_rate=0.0, seed=None):
        """One policy over the requests; returns its figures."""
        seed = self.args.seed if seed is None else seed
        before = self.reset(regime, capacity, drop_rate, seed)
        n, names = self.n, self.names
        pol = fp.make(policy, names, seed, self.args, len(reqs))
        uses_index = pol.uses_index
        calls_pick = getattr(pol, "calls_pick", False)
        owner = {}  # router rid -> engine, until it finishes
        pending = None  # (engine, submit) of the previous request
        st = collections.Counter()
        st["lat"] = []
        if calls_pick:
            pol.call = lambda req, candidates, loads: self.pick(trace, req, candidates,
                                                                loads, st)
        scale = heavy_scale(trace, reqs, n, capacity, self.args)
        t0 = time.monotonic()
        for i, r in enumerate(reqs):
            t = arrival(regime, scale, r.timestamp, self.args)
            query = (trace, r.hash_ids)  # every engine's cached prefix, for the figures
            for k, c in enumerate(self.conns):
                c.send(("advance", t, pending[1] if pending and pending[0] == k else None,
                        query))
            replies = [c.recv() for c in self.conns]
            now_ms = t if regime == "heavy" else t * TICK_MS
            for x in replies:
                for rid, kind in x[5]:
                    pol.event(rid, kind, owner[rid], now_ms)
                    if kind == fp.FINISHED:
                        del owner[rid]
            view = View()
            view.inflight = [x[0] for x in replies]
            view.waiting = [x[1] for x in replies]
            view.kv_usage = [x[2] for x in replies]
            view.truth = [x[3] for x in replies]
            view.route = None
            if uses_index:
                self.route(trace, r.hash_ids, view, replies, st)
            req = Req(i, r.hash_ids, now_ms)
            k = pol.choose(req, view)
            lost = max(view.truth) - view.truth[k]  # cached blocks left unused elsewhere
            st["forgone"] += lost > 0
            st["forgone_blocks"] += lost
            pol.routed(req, k, view)
            owner[i] = k
            pending = (k, (i, trace, r.hash_ids, r.output_length, t))
        if pending:
            self.conns[pending[0]].send(("advance", pending[1][4], pending[1], None))
            self.conns[pending[0]].recv()
        for c in self.conns:
            c.send(("drain",))
        stats = [c.recv() for c in self.conns]
        wall = time.monotonic() - t0
        after = self.workers() if uses_index or calls_pick else None
        reqs_per = [s["requests"] for s in stats]
        mean = statistics.mean(reqs_per)
        ttft = [x / 1000.0 for s in stats for x in s["ttft"]]
        waits = [x for s in stats for x in s.get("waits", ())]
        out = dict(
            policy=policy, regime=regime, trace=trace, n=n, capacity=capacity,
            requests=len(reqs), seed=seed,
            hit=100.0 * sum(s["hit_blocks"] for s in stats)
            / max(1, sum(s["prompt_blocks"] for s in stats)),
            cv=statistics.pstdev(reqs_per) / mean if mean else 0.0,
            per_engine=reqs_per,
            ttft=statistics.mean(ttft) if ttft else 0.0,
            ttft_p99=percentile(ttft, 99),
            wait=statistics.mean(waits) / 1000.0 if waits else 0.0,
            refused=sum(s["refused"] for s in stats),
            evicted=sum(s["evicted"] for s in stats),
            batches=sum(s["batches"] for s in stats),
            dropped=sum(s["dropped_batches"] for s in stats),
            forgone=st["forgone"], forgone_blocks=st["forgone_blocks"],
            wall=wall)
        if hasattr(pol, "notes"):
            out["notes"] = pol.notes()
        if uses_index:
            lat = st["lat"]
            out.update(p50=1000 * percentile(lat, 50), p99=1000 * percentile(lat, 99),
                       behind=st["behind"], stale=st["stale"], changed=st["changed"],
                       not_live=st["not_live"], skip_changed=st["skip_changed"],
                       errors=st["errors"],
                       gaps=sum(after[m].gaps - before[m].gaps for m in names),
                       replays=sum(after[m].replays - before[m].replays for m in names),
                       clears=sum(after[m].clears - before[m].clears for m in names))
        elif calls_pick:
            lat = st["lat"]
            out.update(p50=1000 * percentile(lat, 50), p99=1000 * percentile(lat, 99),
                       errors=st["errors"],
                       gaps=sum(after[m].gaps - before[m].gaps for m in names),
                       replays=sum(after[m].replays - before[m].replays for m in names))
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
    return (r["regime"], r["trace"], r["n"], r["capacity"])


def hit_cell(r):
    """A hit rate; of several runs, the median and (the lowest - the highest)."""
    hits = r.get("hits", [r["hit"]])
    if len(hits) == 1:
        return "%.2f" % r["hit"]
    return "%.2f (%.2f - %.2f)" % (r["hit"], min(hits), max(hits))


def rows_of(results):
    rows = collections.OrderedDict()
    for r in results:
        rows.setdefault(row_key(r), {})[r["policy"]] = r
    return rows


def table(hdr, lines):
    print()
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for cells in lines:
        print("| " + " | ".join(cells) + " |")


def print_tables(results, policies):
    """The hit-rate table (with prefixd against the oracle and round robin),
    the load table, then each row's details; one set per regime."""
    rows = rows_of(results)
    for regime in REGIMES:
        mine = [(key[1:], by) for key, by in rows.items() if key[0] == regime]
        if not mine:
            continue
        print("\n%s regime" % regime)
        hdr = ["trace", "N", "C", "reqs"] + ["%s hit %%" % p for p in policies] + [
            "prefixd - oracle", "prefixd / rr", "Route p50 / p99 ms"]
        drop = "prefixd+drop" in policies
        if drop:
            hdr += ["drop - oracle", "drop Route p50 / p99 ms"]
        lines = []
        for (trace, n, c), by in mine:
            cells = [trace, str(n), str(c), str(next(iter(by.values()))["requests"])]
            cells += [hit_cell(by[p]) if p in by else "-" for p in policies]
            px, orc, rr = by.get("prefixd"), by.get("oracle"), by.get("rr")
            cells.append("%+.2f" % (px["hit"] - orc["hit"]) if px and orc else "-")
            cells.append("%.2fx" % (px["hit"] / rr["hit"]) if px and rr and rr["hit"] else "-")
            cells.append("%.2f / %.2f" % (px["p50"], px["p99"]) if px else "-")
            if drop:
                d = by.get("prefixd+drop")
                cells.append("%+.2f" % (d["hit"] - orc["hit"]) if d and orc else "-")
                cells.append("%.2f / %.2f" % (d["p50"], d["p99"]) if d else "-")
            lines.append(cells)
        table(hdr, lines)
        table(["trace", "N", "C"] + ["%s CV / TTFT s" % p for p in policies],
              [[trace, str(n), str(c)]
               + ["%.2f / %.2f" % (by[p]["cv"], by[p]["ttft"]) if p in by else "-"
                  for p in policies] for (trace, n, c), by in mine])
        print()
        for (trace, n, c), by in mine:
            print("  %s %s N=%d C=%d:" % (regime, trace, n, c))
            for p in policies:
                r = by.get(p)
                if r is None:
                    continue
                print("    %-13s requests per engine %s, %d blocks evicted, %d refused, %d "
                      "picks left %d cached blocks unused elsewhere; %.1f s"
                      % (p, r["per_engine"], r["evicted"], r["refused"], r["forgone"],
                         r["forgone_blocks"], r["wall"]))
                if "notes" in r:
                    print("    %-13s %s" % ("", r["notes"]))
                if "stale" in r:
                    print("    %-13s %d Routes: %d behind an engine's last batch, %d stale (%d "
                          "changed the pick), %d worker entries not LIVE (skipping them "
                          "changed %d picks), %d Route errors; %d batches, %d dropped, %d "
                          "gaps, %d replays, %d clears"
                          % ("", r["requests"], r["behind"], r["stale"], r["changed"],
                             r["not_live"], r["skip_changed"], r["errors"], r["batches"],
                             r["dropped"], r["gaps"], r["replays"], r["clears"]))
    print()


def print_comparison(results, policies):
    """--compare's table: per regime and row, every policy's saved prefill,
    mean and p99 TTFT, the share of the mean TTFT spent queued (heavy), and
    the load spread."""
    rows = rows_of(results)
    for regime in REGIMES:
        mine = [(key[1:], by) for key, by in rows.items() if key[0] == regime]
        if not mine:
            continue
        print("\n%s regime: saved prefill %% / mean TTFT s / p99 TTFT s / load CV%s"
              % (regime, " (queued share of the mean TTFT)" if regime == "heavy" else ""))
        lines = []
        for (trace, n, c), by in mine:
            cells = [trace, str(n), str(c)]
            for p in policies:
                r = by.get(p)
                if r is None:
                    cells.append("-")
                    continue
                cell = "%.2f / %.2f / %.2f / %.2f" % (r["hit"], r["ttft"], r["ttft_p99"], r["cv"])
                if regime == "heavy" and r["ttft"]:
                    cell += " (%.0f%%)" % (100.0 * r["wait"] / r["ttft"])
                cells.append(cell)
            lines.append(cells)
        table(["trace", "N", "C"] + policies, lines)
    print()


def check_targets(checks, results, full):
    """The light regime's checks of today's rule against the oracle and
    round robin (docs/performance.md), and, when pickpy ran with the peers,
    its targets: saved prefill >= the best peer's - 0.2 points on every row;
    under heavy load, mean and p99 TTFT <= the best peer's + 5 % and load
    spread <= least loaded's + 0.05."""
    margin = 0.5 if full else 1.0
    for (regime, trace, n, c), row in rows_of(results).items():
        where = "%s %s N=%d C=%d" % (regime, trace, n, c)
        px, orc, rr = row.get("prefixd"), row.get("oracle"), row.get("rr")
        if regime == "light" and px and orc:
            checks.check(px["hit"] >= orc["hit"] - margin,
                         "%s: prefixd hit rate %.2f%% >= oracle %.2f%% - %.1f"
                         % (where, px["hit"], orc["hit"], margin))
        if regime == "light" and px and rr:
            checks.check(px["hit"] > rr["hit"], "%s: prefixd %.2f%% > round robin %.2f%% (%.2fx)"
                         % (where, px["hit"], rr["hit"], px["hit"] / max(rr["hit"], 1e-9)))
        d = row.get("prefixd+drop")
        if regime == "light" and d and orc:
            checks.check(d["hit"] >= orc["hit"] - 1.0,
                         "%s: with 1%% of the batches dropped (%d of %d in the median run, %d "
                         "replays), prefixd %.2f%% (median of runs %s) >= oracle %.2f%% - 1"
                         % (where, d["dropped"], d["batches"], d["replays"], d["hit"],
                            ", ".join("%.2f" % h for h in d["hits"]), orc["hit"]))
        pk = row.get("pick")
        if regime == "light" and pk and orc:
            checks.check(pk["hit"] >= orc["hit"] - margin,
                         "%s: pick's hit rate %.2f%% >= oracle %.2f%% - %.1f"
                         % (where, pk["hit"], orc["hit"], margin))
        d = row.get("pick+drop")
        if pk and d:
            checks.check(abs(d["hit"] - pk["hit"]) <= 0.5,
                         "%s: with 1%% of the batches dropped (%d of %d in the median run, %d "
                         "replays), pick saves %.2f%% (median of runs %s), within 0.5 of its "
                         "clean run's %.2f%%"
                         % (where, d["dropped"], d["batches"], d["replays"], d["hit"],
                            ", ".join("%.2f" % h for h in d["hits"]), pk["hit"]))
        peers = [row[p] for p in PEERS if p in row]
        for name in ("pick", "pickpy"):
            if name in row and len(peers) == len(PEERS):
                check_against_peers(checks, where, regime, row, name, peers)
        for p, r in row.items():
            if "errors" in r:
                checks.check(r["errors"] == 0, "%s %s: every %s answered"
                             % (where, p, "Pick" if p.startswith("pick") and not p.startswith("pickpy")
                                else "Route"),
                             "%d errors" % r["errors"])


def check_against_peers(checks, where, regime, row, name, peers):
    """Pick's targets for policy `name` (pick, or its model pickpy) on one
    row: saved prefill >= the best peer's - 0.2 points; under heavy load,
    mean and p99 TTFT <= the best peer's + 5 % and load spread <= least
    loaded's + 0.05."""
    pk = row[name]
    best = max(peers, key=lambda r: r["hit"])
    checks.check(pk["hit"] >= best["hit"] - 0.2,
                 "%s: %s saves %.2f%% >= the best peer's (%s %.2f%%) - 0.2"
                 % (where, name, pk["hit"], best["policy"], best["hit"]))
    if regime != "heavy":
        return
    for key, what in (("ttft", "mean"), ("ttft_p99", "p99")):
        best = min(peers, key=lambda r: r[key])
        checks.check(pk[key] <= best[key] * 1.05,
                     "%s: %s's %s TTFT %.3f s <= the best peer's (%s %.3f s) + 5%%"
                     % (where, name, what, pk[key], best["policy"], best[key]))
    checks.check(pk["cv"] <= row["ll"]["cv"] + 0.05,
                 "%s: %s's load spread %.3f <= least loaded's %.3f + 0.05"
                 % (where, name, pk["cv"], row["ll"]["cv"]))


def main():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import common  # tests/python/common.py

    def extra(ap):
        ap.add_argument("--full", action="store_true", help="the whole matrix (make bench)")
        ap.add_argument("--compare", action="store_true",
                        help="every policy of %s, both regimes, with pickpy's targets "
                        "checked (on --full's rows with --full)" % ",".join(COMPARE))
        ap.add_argument("--requests", type=int, help="requests per trace (default: short "
                        "%d, full: all)" % SHORT["requests"])
        ap.add_argument("--load_slack", type=int, default=2,
                        help="prefixd/oracle: engines within this many requests of the "
                        "least loaded are candidates")
        ap.add_argument("--drop_rate", type=float, default=0.01,
                        help="share of event batches dropped in the +drop runs")
        ap.add_argument("--runs", type=int, default=3,
                        help="runs per row of the +drop policies and oracle~K (seeds seed, "
                        "seed+1, ...); the median run counts")
        ap.add_argument("--seed", type=int, default=1)
        ap.add_argument("--engine_names", default="e",
                        help="the engines are named this followed by 0 ... N-1; the names "
                        "feed the hashes that break ties (Pick's rendezvous, the peers' by name)")
        ap.add_argument("--speedup", type=float, default=1.0,
                        help="light regime: arrivals this many times faster than the trace's")
        ap.add_argument("--heavy_rate", type=float, default=None,
                        help="heavy regime: requests per engine per second (default: per "
                        "trace and C, %s)" % "; ".join(
                            "%s %s" % (t, ", ".join("C=%d %g" % kv for kv in rates.items()))
                            for t, rates in HEAVY_RATES.items()))
        ap.add_argument("--pick", default="",
                        help="pickpy's knobs, key=value,... (default: %s)"
                        % ",".join("%s=%g" % kv for kv in fp.PICK_DEFAULTS.items()))
        ap.add_argument("--pick_config", default="",
                        help="the daemon's index.pick settings besides replay_clock, in its "
                        "config's text format (e.g. 'churn_weight: 0.005'): pick and "
                        "pick-window use them; default none, the shipped defaults")
        ap.add_argument("--policies", default=None,
                        help="comma-separated subset of %s (and prefixd+drop, pick+drop, pickpy+drop, "
                        "oracle~K, pickpy@knob=value@...)" % ",".join(COMPARE))
        ap.add_argument("--regimes", default=None,
                        help="comma-separated subset of %s, overrides the mode's"
                        % ",".join(REGIMES))
        ap.add_argument("--traces", default=None, help="comma-separated, overrides the mode's")
        ap.add_argument("--fleets", default=None, help="comma-separated N, overrides the mode's")
        ap.add_argument("--capacities", default=None,
                        help="comma-separated C for every trace, overrides the mode's")
        ap.add_argument("--json", default=None,
                        help="also write every run's figures to this file (a JSON list)")
    args = common.setup(__doc__, extra=extra)
    if sys.argv[1:]:
        print("fleet_sim: unknown arguments %s" % sys.argv[1:])
        return 2
    if not args.prefixd:
        print("--prefixd not given: skipped")
        return 77
    fp.pick_knobs(args.pick)  # a bad --pick fails here, before anything starts
    mode = FULL if args.full else SHORT
    if args.compare:
        policies = list(COMPARE) + (["pick+drop"] if mode["drop"] else [])
        regimes = list(REGIMES)
    else:
        policies = list(POLICIES) + (["prefixd+drop"] if mode["drop"] else [])
        regimes = ["light"]
    if args.policies:
        policies = [p for p in args.policies.split(",") if p]
    if args.regimes:
        regimes = [x for x in args.regimes.split(",") if x]
    traces = args.traces.split(",") if args.traces else mode["traces"]
    fleets = [int(x) for x in args.fleets.split(",")] if args.fleets else mode["fleets"]
    limit = args.requests if args.requests is not None else mode["requests"]
    checks = common.Checker()
    results = []
    t0 = time.monotonic()
    print("fleet_sim: %s mode%s, regimes %s, traces %s, N %s, load_slack %d, speedup %g, "
          "seed %d, pickpy %s" % ("full" if args.full else "short",
                                  " (compare)" if args.compare else "", ",".join(regimes),
                                  ",".join(traces), fleets, args.load_slack, args.speedup,
                                  args.seed, args.pick or "defaults"))
    for n in fleets:
        fleet = Fleet(n, args.prefixd, args)
        try:
            ts = time.monotonic()
            fleet.start()
            print("  N=%d: %d engine processes and prefixd up, subscribed (%.1f s)"
                  % (n, n, time.monotonic() - ts))
            for regime in regimes:
                for trace in traces:
                    reqs = ep.load_trace(trace, limit)
                    caps = ([int(x) for x in args.capacities.split(",")] if args.capacities
                            else mode["capacities"].get(trace, (1024,)))
                    for cap in caps:
                        for p in policies:
                            results.append(run_policy(fleet, p, regime, trace, reqs, cap, args))
            if fleet.client is not None:
                checks.check(fleet.selfcheck(traces[0], ep.load_trace(traces[0], 1)[0].hash_ids),
                             "N=%d: the engines' memoized hashes are engine_pool's" % n)
        finally:
            ts = time.monotonic()
            rc = fleet.close()
            print("  N=%d: engines and prefixd stopped (%.1f s)" % (n, time.monotonic() - ts))
        checks.check(rc == 0, "N=%d: prefixd exits 0 on SIGTERM" % n, "exit %s" % rc)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print_tables(results, policies)
    if args.compare:
        print_comparison(results, policies)
    check_targets(checks, results, args.full)
    print("(%.1f s)" % (time.monotonic() - t0))
    return checks.exit_code()


def run_policy(fleet, p, regime, trace, reqs, cap, args):
    """One policy on one row: a single run, or --runs of them (the +drop
    policies, oracle~K) of which the median counts."""
    drop = p.endswith("+drop")
    runs = []
    for j in range(args.runs if drop or p.startswith("oracle~") else 1):
        r = fleet.run(p, regime, trace, reqs, cap, args.drop_rate if drop else 0.0,
                      args.seed + j)
        runs.append(r)
        print("  %-12s %-5s %-12s N=%d C=%-6d seed %d  hit %6.2f%%  CV %.3f  TTFT %.2f s "
              "p99 %.2f s (queued %.2f s)  %.1f s%s" % (
                  p, regime, trace, fleet.n, cap, r["seed"], r["hit"], r["cv"], r["ttft"],
                  r["ttft_p99"], r["wait"], r["wall"], "  %s p50 %.2f p99 %.2f ms" % (
                      "Pick" if p.startswith("pick") and not p.startswith("pickpy")
                      else "Route", r["p50"], r["p99"]) if "p50" in r else ""))
        sys.stdout.flush()
    runs.sort(key=lambda x: x["hit"])
    r = runs[len(runs) // 2]  # the median run
    r["hits"] = [x["hit"] for x in runs]
    if "errors" in r:
        r["errors"] = sum(x["errors"] for x in runs)
    return r


if __name__ == "__main__":
    sys.exit(main())
