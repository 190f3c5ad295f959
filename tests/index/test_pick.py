#!/usr/bin/python3
"""PrefixIndex/Pick over the wire (docs/index.md, "Pick"): the real daemon,
three engines publishing KV events over ZeroMQ (kv_publisher), a fourth
worker registered and unregistered through the Conductor API, and the
Python client. Every cost term of every candidate is recomputed here from
the pick config below and what the engines published:

  credited  = tier-weighted leading blocks held (GPU 1, CPU 0.5; not LIVE: 0)
              + the further leading blocks earlier picks sent the worker
              (from the first for a worker not LIVE)
  prefill   = max(len(prompt) - credited x BS, 0)
  load      = queued x 1 + in_flight x REQUEST_TOKENS + kv_usage x KV_TOKENS
              (the request's loads, else the daemon's window of picks)
  affinity  = -AFFINITY_TOKENS for one candidate per prompt (rendezvous
              hashing of its first AFFINITY_BLOCKS blocks), else 0
  churn     = CHURN_WEIGHT x prefill tokens of the worker's picks within
              CHURN_WINDOW_S
  cost      = prefill + load + churn + affinity

Checks: ties (fewer in flight, then the affinity winner, then the name),
a cold prompt (no candidate holds anything: the affinity winner, stable
whatever the candidates' order, kept when another candidate leaves), tier
credits, predicted blocks (seen by a sibling, never by Route, extended,
confirmed by the engine's events, kept when the engine evicts them before
it runs the prompt, lapsing after the TTL), the window load
(counted per pick, lapsing), the churn term (each pick's prefill tokens
within the churn window), loads from the request, PickBatch (each item
sees the ones before it; a bad item fails alone), a worker leaving
(/unregister), a worker whose socket dropped (CONNECTING, its blocks kept:
credited only what Pick sent it), dry runs changing nothing, an index with
no worker, and bad input (INVALID_ARGUMENT naming the field, changing
nothing).

Usage: test_pick.py --prefixd PATH [--prefixctl PATH] [--stubs DIR]
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__, extra=lambda ap: ap.add_argument(
    "--prefixctl", help="the prefixctl binary (its checks are skipped without it)"))
if not ARGS.prefixd:
    print("--prefixd not given: skipped")
    sys.exit(77)

import grpc  # noqa: E402

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import kv_publisher as kvp  # noqa: E402

BS = 4
REQUEST_TOKENS = 10.0
KV_TOKENS = 100.0
AFFINITY_TOKENS = 3.0
AFFINITY_BLOCKS = 2
TTL_S = 1.5
WINDOW_S = 2.5
CHURN_WEIGHT = 0.01  # small: the churn term never outweighs the affinity's
CHURN_WINDOW_S = 2.0  # shorter than WINDOW_S: window()'s first sleep clears both
TIMEOUT = 10
DEADLINE_S = 20
EPS = 1e-6


def prompt(first, blocks, tail=0):
    """Tokens of `blocks` whole blocks and `tail` more, distinct per `first`."""
    return list(range(first, first + blocks * BS + tail))


class Engine:
    def __init__(self, name):
        self.name = name
        self.pub = kvp.Publisher(encoding="array")
        self.next_hash = 1000 * (1 + len(name))

    def store(self, tokens, blocks, medium="GPU"):
        """Publishes the first `blocks` blocks of `tokens` as one chain."""
        hashes = list(range(self.next_hash, self.next_hash + blocks))
        self.next_hash += blocks
        self.pub.publish([kvp.block_stored(hashes, None, tokens[:blocks * BS], BS,
                                           medium=medium)])
        return hashes


class Test(common.Checker):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="prefixd-pick-")
        self.http_port = prefixd_fixture.free_port()
        self.engines = [Engine("e0"), Engine("e1"), Engine("e2")]
        self.extra = kvp.Publisher(encoding="map")
        self.daemon = None
        self.client = None
        self.picks = {}  # worker -> [(time, prefill tokens)] of recorded picks

    def config(self):
        sources = "".join('  sources { name: "%s" endpoint: "%s" replay_endpoint: "%s" }\n'
                          % (e.name, e.pub.endpoint, e.pub.replay_endpoint)
                          for e in self.engines)
        return ('index {\n  block_size: %d\n  http_listen: "127.0.0.1:%d"\n%s'
                '  pick { queued_weight: 1 request_tokens: %g kv_tokens: %g affinity_tokens: %g '
                'affinity_blocks: %d predicted_ttl: "%gs" load_window: "%gs" '
                'churn_weight: %g churn_window: "%gs" }\n}\n'
                % (BS, self.http_port, sources, REQUEST_TOKENS, KV_TOKENS, AFFINITY_TOKENS,
                   AFFINITY_BLOCKS, TTL_S, WINDOW_S, CHURN_WEIGHT, CHURN_WINDOW_S))

    # ---- plumbing ----

    def workers(self):
        return {w.worker: w for w in self.client.list_workers(timeout=TIMEOUT).workers}

    def wait_until(self, holds, what):
        """Checks that holds(ListWorkers' workers by name) comes true within
        DEADLINE_S."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if holds(self.workers()):
                return self.check(True, what)
            time.sleep(0.02)
        return self.check(False, what, self.workers())

    def wait_live(self, what):
        return self.wait_until(
            lambda ws: all(e.name in ws and ws[e.name].state == prefixd.WorkerState.LIVE
                           and ws[e.name].last_seq == e.pub.last_seq for e in self.engines),
            what)

    def pick(self, tokens, **kw):
        r = self.client.pick(tokens, timeout=TIMEOUT, **kw)
        if not kw.get("dry_run"):
            cost = {c.worker: c for c in r.ranked}[r.worker]
            self.picks.setdefault(r.worker, []).append((time.monotonic(), cost.prefill_tokens))
        return r

    def refused(self, what, want, fn):
        try:
            fn()
        except prefixd.InvalidArgument as e:
            return self.check(want in str(e), what, "message: %s" % e)
        except prefixd.PrefixdError as e:
            return self.check(False, what, "%s: %s" % (type(e).__name__, e))
        return self.check(False, what, "accepted")

    def window_of(self, worker, window_s=WINDOW_S):
        """(picks, prefill tokens) of `worker` in the window now (the
        daemon's clock runs a little after ours: picks near the edge are
        skipped by the callers)."""
        now = time.monotonic()
        live = [p for t, p in self.picks.get(worker, []) if now - t < window_s]
        return len(live), sum(live)

    def costs_agree(self, r, tokens, held, predicted, loads=None, what=""):
        """Every candidate's terms against the model. held: worker -> credited
        engine blocks; predicted: worker -> predicted blocks."""
        loads = loads or {}
        bad = []
        winners = [c.worker for c in r.ranked if c.affinity_term < 0]
        for c in r.ranked:
            credited = held.get(c.worker, 0) + predicted.get(c.worker, 0)
            prefill = max(len(tokens) - credited * BS, 0)
            if c.worker in loads:
                l = loads[c.worker]
                load = (l.queued_prefill_tokens + l.requests_in_flight * REQUEST_TOKENS
                        + l.kv_usage * KV_TOKENS)
                from_request = True
            else:  # the window's figures (checked against the picks in window())
                load = c.queued_prefill_tokens + c.requests_in_flight * REQUEST_TOKENS
                from_request = False
            aff = -AFFINITY_TOKENS if c.worker in winners else 0.0
            churn = CHURN_WEIGHT * c.churn_tokens  # the tokens: checked in window()
            want = (credited, prefill, load, from_request, churn, prefill + load + churn + aff)
            got = (c.credited_blocks, c.prefill_tokens, c.load_term, c.load_from_request,
                   c.churn_term, c.cost)
            if any(abs(a - b) > EPS for a, b in zip(want, got)) or \
                    c.predicted_blocks != predicted.get(c.worker, 0):
                bad.append((c.worker, "want", want, "got", got, c.predicted_blocks))
        blocks = len(tokens) // BS
        ok_aff = len(winners) == (1 if blocks > 0 else 0)
        ordered = all(a.cost <= b.cost + EPS for a, b in zip(r.ranked, r.ranked[1:]))
        return self.check(not bad and ok_aff and ordered and r.worker == r.ranked[0].worker,
                          what, (bad, winners, [(c.worker, c.cost) for c in r.ranked]))

    # ---- scenarios ----

    def start(self):
        self.daemon = prefixd_fixture.Daemon(ARGS.prefixd, self.config(), snapshot=False,
                                             tmp=self.tmp).start()
        self.client = prefixd.Client(self.daemon.tcp)
        for e in self.engines:
            e.pub.wait_for_subscriber()

    def no_workers(self):
        with prefixd_fixture.Daemon(ARGS.prefixd, 'index { listen: "tcp://127.0.0.1:%d" }'
                                    % prefixd_fixture.free_port(), snapshot=False) as d:
            c = prefixd.Client(d.tcp)
            try:
                c.pick(prompt(1, 2), timeout=TIMEOUT)
                self.check(False, "an index with no worker: Pick is FAILED_PRECONDITION",
                           "accepted")
            except prefixd.FailedPrecondition as e:
                self.check("no worker" in str(e),
                           "an index with no worker: Pick is FAILED_PRECONDITION", str(e))
            c.close()

    def ties(self):
        # Shorter than a block: nothing held, no affinity, no load yet. Ties
        # go to the name.
        p = prompt(7, 0, tail=3)
        r = self.pick(p, dry_run=True)
        self.check([c.worker for c in r.ranked] == ["e0", "e1", "e2"] and r.worker == "e0"
                   and r.decision_id == 0,
                   "ties: equal costs rank by name; a dry run has no decision id",
                   [(c.worker, c.cost) for c in r.ranked])
        self.costs_agree(r, p, {}, {}, what="ties: every term of a sub-block prompt")
        # Then fewer requests in flight, before the name: e0 and e1 cost the
        # same, e0 has more in flight.
        loads = {"e0": prefixd.WorkerLoad(requests_in_flight=2),
                 "e1": prefixd.WorkerLoad(queued_prefill_tokens=20)}
        r = self.pick(p, loads=loads, dry_run=True)
        self.check([c.worker for c in r.ranked] == ["e2", "e1", "e0"],
                   "ties: at equal cost, fewer requests in flight first",
                   [(c.worker, c.cost, c.requests_in_flight) for c in r.ranked])
        self.costs_agree(r, p, {}, {}, loads, "ties: loads from the request")

    def cold(self):
        p = prompt(100, 6)
        r = self.pick(p, dry_run=True)
        self.costs_agree(r, p, {}, {}, what="cold prompt: every candidate's terms")
        winner = r.worker
        self.check(r.ranked[0].affinity_term == -AFFINITY_TOKENS,
                   "cold prompt: the affinity winner is chosen (%s)" % winner, r.ranked)
        r2 = self.pick(p, candidates=["e2", "e1", "e0"], dry_run=True)
        self.check(r2.worker == winner, "cold prompt: the same winner whatever the order",
                   r2.worker)
        others = [w for w in ("e0", "e1", "e2") if w != winner]
        r3 = self.pick(p, candidates=[winner, others[0]], dry_run=True)
        self.check(r3.worker == winner and len(r3.ranked) == 2,
                   "cold prompt: the winner stays when another candidate is left out",
                   r3.ranked)
        # A sibling sharing the first AFFINITY_BLOCKS blocks has the same winner.
        sib = p[:AFFINITY_BLOCKS * BS] + prompt(5000, 3)
        r4 = self.pick(sib, dry_run=True)
        self.check(r4.worker == winner, "cold prompt: a sibling prompt has the same winner",
                   r4.worker)
        return p, winner

    def predicted(self, p, winner):
        before = self.client.route(p, all_workers=True, timeout=TIMEOUT)
        r = self.pick(p)
        self.check(r.worker == winner and r.decision_id > 0,
                   "Pick records a decision (id %d) for %s" % (r.decision_id, winner), r)
        route = self.client.route(p, all_workers=True, timeout=TIMEOUT)
        self.check([(w.worker, w.matched_blocks) for w in route.workers]
                   == [(w.worker, w.matched_blocks) for w in before.workers]
                   and all(w.matched_blocks == 0 for w in route.workers),
                   "predicted blocks are never reported by Route",
                   [(w.worker, w.matched_blocks) for w in route.workers])
        # A sibling sharing 4 blocks sees them predicted on the winner.
        sib = p[:4 * BS] + prompt(9000, 2)
        r = self.pick(sib, dry_run=True)
        self.costs_agree(r, sib, {}, {winner: 4},
                         what="a sibling sees 4 predicted blocks on %s" % winner)
        c = {c.worker: c for c in r.ranked}[winner]
        self.check(c.requests_in_flight == 1 and c.queued_prefill_tokens == len(p),
                   "the window charges %s the pick and its %d prefill tokens"
                   % (winner, len(p)), c)
        # The engine's events confirm the first 3: matched 3, predicted 3 more.
        eng = next(e for e in self.engines if e.name == winner)
        eng.store(p, 3)
        self.wait_live("%s's store of 3 blocks is applied" % winner)
        r = self.pick(p, dry_run=True)
        self.costs_agree(r, p, {winner: 3}, {winner: 3},
                         what="confirmed blocks count as matched, the rest as predicted")
        time.sleep(TTL_S + 0.3)
        r = self.pick(p, dry_run=True)
        self.costs_agree(r, p, {winner: 3}, {},
                         what="after the TTL only the confirmed blocks count")
        return eng

    def evicted(self):
        # e2 holds 3 of the prompt's 6 blocks when Pick sends it there, then
        # evicts them before it runs the prompt: it computes them again, so
        # a sibling still sees all 6 predicted on e2 (not 0: were the 3 the
        # events reported dropped from the prediction, none would lead).
        p = prompt(1100, 6)
        eng = self.engines[2]
        hashes = eng.store(p, 3)
        self.wait_live("e2's store of 3 blocks is applied")
        r = self.pick(p, candidates=["e2"])
        self.check(r.worker == "e2" and r.ranked[0].matched_blocks == 3,
                   "a pick sends the prompt to e2, which holds 3 of its blocks", r.ranked)
        eng.pub.publish([kvp.block_removed(hashes)])
        self.wait_live("e2's removal of the 3 blocks is applied")
        r = self.pick(p, dry_run=True)
        self.costs_agree(r, p, {}, {"e2": 6},
                         what="blocks evicted before the prompt runs stay predicted")

    def behind(self):
        # e0 holds the first 2 blocks of a 4-block prompt, then its socket
        # drops: CONNECTING, its blocks kept but not vouched for. Pick
        # credits it none of them, so the blocks it sends e0 count from the
        # prompt's first: 2 predicted for the 2-block prefix it holds whole
        # (not 0: no prediction when the events report the whole prompt),
        # then 4 for the prompt (not 2: a run after the reported blocks).
        # Last: e0 stays disconnected.
        p = prompt(1300, 4)
        eng = self.engines[0]
        eng.store(p, 2)
        self.wait_live("e0's store of 2 blocks is applied")
        eng.pub.close()
        if not self.wait_until(lambda ws: ws["e0"].state == prefixd.WorkerState.CONNECTING,
                               "e0 is CONNECTING once its socket drops"):
            return
        for blocks in (2, 4):
            q = p[:blocks * BS]
            r = self.pick(q, candidates=["e0"])
            c = r.ranked[0]
            self.check(c.state == prefixd.WorkerState.CONNECTING and c.matched_blocks == 2,
                       "a disconnected e0 keeps its 2 blocks, picked for a %d-block prompt"
                       % blocks, c)
            r = self.pick(q, candidates=["e0"], dry_run=True)
            self.costs_agree(r, q, {}, {"e0": blocks},
                             what="a worker not LIVE is credited the %d blocks Pick sent it, "
                             "from the first" % blocks)

    def tiers(self):
        # e1 holds 4 blocks on CPU then 2 more on GPU? No: a CPU run of 4
        # and a GPU run of 2 (the first 2 on both): GPU 2 x 1 + CPU 2 x 0.5.
        # e2 holds 4 in SGLang's HiCache host tier, CPU_PINNED: a CPU tier.
        p = prompt(300, 6)
        e1 = self.engines[1]
        e1.store(p, 4, medium="CPU")
        e1.store(p, 2)
        self.engines[2].store(p, 4, medium="CPU_PINNED")
        self.wait_live("e1's CPU and GPU stores and e2's CPU_PINNED one are applied")
        r = self.pick(p, dry_run=True)
        self.costs_agree(r, p, {"e1": 3.0, "e2": 2.0}, {},
                         what="tier credits: 2 GPU blocks x 1 + 2 CPU blocks x 0.5 = 3; "
                         "4 CPU_PINNED blocks x 0.5 = 2")

    def window(self):
        # Records picks; the window charges them per worker, then forgets.
        p = prompt(400, 2, tail=1)
        time.sleep(WINDOW_S + 0.2)  # earlier picks lapse
        self.picks = {}
        chosen = [self.pick(p).worker for _ in range(4)]
        r = self.pick(p, dry_run=True)
        self.check(len(set(chosen)) >= 2,
                   "the window's load spreads repeated cold picks (%s)" % chosen)
        want = {w: self.window_of(w) for w in ("e0", "e1", "e2")}
        got = {c.worker: (c.requests_in_flight, c.queued_prefill_tokens) for c in r.ranked}
        self.check(all(got[w] == (n, round(q)) for w, (n, q) in want.items()),
                   "the window counts each worker's picks and their prefill tokens",
                   (got, want))
        want = {w: self.window_of(w, CHURN_WINDOW_S)[1] for w in ("e0", "e1", "e2")}
        got = {c.worker: c.churn_tokens for c in r.ranked}
        self.check(all(abs(got[w] - want[w]) < EPS for w in want) and sum(want.values()) > 0,
                   "the churn term counts the prefill tokens of each worker's picks",
                   (got, want))
        self.costs_agree(r, p, {}, {c.worker: c.predicted_blocks for c in r.ranked},
                         what="the churn term is churn_weight x those tokens, in the cost")
        # r's predicted blocks: the blocks picks sent each worker.
        time.sleep(max(WINDOW_S, TTL_S) + 0.2)
        r = self.pick(p, dry_run=True)
        self.check(all(c.requests_in_flight == 0 and c.queued_prefill_tokens == 0
                       and c.predicted_blocks == 0 and c.churn_tokens == 0 for c in r.ranked),
                   "after the windows and the TTL, no load, churn or predicted block remain",
                   r.ranked)
        self.picks = {}

    def loads(self):
        p = prompt(500, 3)
        loads = {"e0": prefixd.WorkerLoad(requests_in_flight=2, queued_prefill_tokens=100,
                                          kv_usage=0.5),
                 "e2": prefixd.WorkerLoad()}
        r = self.pick(p, loads=loads, dry_run=True)
        self.costs_agree(r, p, {}, {}, loads, "loads from the request replace the window's")
        c0 = {c.worker: c for c in r.ranked}["e0"]
        self.check(abs(c0.load_term - (100 + 2 * REQUEST_TOKENS + 0.5 * KV_TOKENS)) < EPS
                   and c0.load_from_request and r.worker != "e0",
                   "e0's load term is 100 + 2 x %g + 0.5 x %g and it is not chosen"
                   % (REQUEST_TOKENS, KV_TOKENS), c0)

    def batch(self):
        a = prompt(600, 5)
        b = a[:3 * BS] + prompt(7000, 2)
        items = self.client.pick_batch([a, [], b], timeout=TIMEOUT)
        ok_a = isinstance(items[0], prefixd.PickResult)
        self.check(isinstance(items[1], prefixd.InvalidArgument)
                   and "requests[1]: prompt has no tokens" in str(items[1]),
                   "PickBatch: an empty prompt fails alone, named by its item", items[1])
        if ok_a and isinstance(items[2], prefixd.PickResult):
            cb = {c.worker: c for c in items[2].ranked}[items[0].worker]
            self.check(cb.predicted_blocks == 3,
                       "PickBatch: item 2 sees the 3 blocks item 0 sent to %s"
                       % items[0].worker, items[2].ranked)
        else:
            self.check(False, "PickBatch: items 0 and 2 answered", items)

    def bad_input(self):
        p = prompt(800, 2)
        before = self.pick(p, dry_run=True)

        def dry(**kw):
            return lambda: self.client.pick(p, timeout=TIMEOUT, **kw)

        def live(**kw):  # not a dry run: a rejected one must record nothing
            return lambda: self.client.pick(p, timeout=TIMEOUT, **kw)

        L = prefixd.WorkerLoad
        self.refused("an unknown candidate is INVALID_ARGUMENT naming it",
                     'candidates[1] "nope" is not a worker of the index',
                     live(candidates=["e0", "nope"]))
        self.refused("a candidate named twice", 'candidates[1] "e0" is named twice',
                     live(candidates=["e0", "e0"]))
        self.refused("a negative requests_in_flight",
                     'loads[0] ("e0").requests_in_flight is -1; it must be >= 0',
                     live(loads={"e0": L(requests_in_flight=-1)}))
        self.refused("a negative queued_prefill_tokens",
                     'loads[0] ("e1").queued_prefill_tokens is -5; it must be >= 0',
                     live(loads={"e1": L(queued_prefill_tokens=-5)}))
        self.refused("a kv_usage above 1", 'loads[0] ("e2").kv_usage is 1.5; it must be in',
                     live(loads={"e2": L(kv_usage=1.5)}))
        self.refused("a kv_usage NaN", "kv_usage is nan", live(loads={"e2": L(kv_usage=float("nan"))}))
        self.refused("a load of a worker that is not a candidate",
                     'loads[0] names "e2", which is not a candidate',
                     live(candidates=["e0", "e1"], loads={"e2": L()}))
        self.refused("an empty prompt", "prompt has no tokens",
                     lambda: self.client.pick([], timeout=TIMEOUT))
        self.refused("a replay time without index.pick.replay_clock",
                     "replay_time_ms is 5000 but index.pick.replay_clock is off",
                     live(replay_time_ms=5000))
        after = self.pick(p, dry_run=True)
        self.check([(c.worker, c.cost, c.requests_in_flight) for c in before.ranked]
                   == [(c.worker, c.cost, c.requests_in_flight) for c in after.ranked],
                   "rejected Picks changed nothing (same ranking, loads and costs)",
                   (before.ranked, after.ranked))
        del dry

    def leaving(self):
        body = {"endpoint": self.extra.endpoint, "replay_endpoint": self.extra.replay_endpoint,
                "type": "vLLM", "modelname": "m", "lora_name": None, "tenant_id": "default",
                "instance_id": "vx", "block_size": BS, "dp_rank": 0}
        status, answer = self.post("/register", body)
        self.check(status == 200, "/register adds a fourth worker", answer)
        name = next(w for w, i in self.workers().items() if i.endpoint == self.extra.endpoint)
        p = prompt(900, 2)
        r = self.pick(p, dry_run=True)
        self.check(name in [c.worker for c in r.ranked],
                   "Pick with no candidates ranks every worker, %s too" % name,
                   [c.worker for c in r.ranked])
        status, answer = self.post("/unregister", {k: body[k] for k in (
            "type", "modelname", "lora_name", "tenant_id", "instance_id", "block_size",
            "dp_rank")})
        self.check(status == 200, "/unregister removes it", answer)
        r = self.pick(p, dry_run=True)
        self.check(name not in [c.worker for c in r.ranked],
                   "a worker that left is no longer ranked", [c.worker for c in r.ranked])
        self.refused("a worker that left is an unknown candidate",
                     'candidates[0] "%s" is not a worker of the index' % name,
                     lambda: self.client.pick(p, candidates=[name], timeout=TIMEOUT))

    def prefixctl(self):
        ctl = ARGS.prefixctl
        if not ctl:
            print("--prefixctl not given: its checks skipped")
            return
        p = prompt(1000, 2)
        out = subprocess.run([ctl, "--addr", self.daemon.tcp, "pick", "--dry_run",
                              "--candidates", "e1,e2", "--loads", "e1=3/40/0.25",
                              "--tokens", ",".join(map(str, p))],
                             capture_output=True, text=True, timeout=TIMEOUT)
        r = self.client.pick(p, candidates=["e1", "e2"],
                             loads={"e1": prefixd.WorkerLoad(3, 40, 0.25)}, dry_run=True,
                             timeout=TIMEOUT)
        self.check(out.returncode == 0 and out.stdout.splitlines()[0].split()[-1] == r.worker
                   and "e1" in out.stdout and "e2" in out.stdout,
                   "prefixctl pick prints the choice and the ranked candidates",
                   (out.returncode, out.stdout, out.stderr))
        bad = subprocess.run([ctl, "--addr", self.daemon.tcp, "pick", "--loads", "e1=-3",
                              "--tokens", "1,2,3,4"], capture_output=True, text=True,
                             timeout=TIMEOUT)
        self.check(bad.returncode != 0 and "requests_in_flight is -3" in bad.stderr,
                   "prefixctl pick reports the daemon's INVALID_ARGUMENT",
                   (bad.returncode, bad.stderr))

    def metrics(self):
        """Pick's and PickBatch's calls are in prefixd_rpc_*, as every RPC's."""
        text = urllib.request.urlopen("http://%s/metrics" % self.daemon.metrics,
                                      timeout=TIMEOUT).read().decode()
        series = {}
        for line in text.splitlines():
            if line.startswith("prefixd_rpc_"):
                name, value = line.rsplit(" ", 1)
                series[name] = float(value)
        calls = series.get('prefixd_rpc_duration_seconds_count{method="Pick"}', 0)
        self.check(calls >= 10, "prefixd_rpc_duration_seconds counts the Picks made", calls)
        batches = series.get('prefixd_rpc_duration_seconds_count{method="PickBatch"}', 0)
        self.check(batches >= 1, "prefixd_rpc_duration_seconds counts the PickBatch made",
                   batches)
        errors = series.get('prefixd_rpc_errors_total{code="INVALID_ARGUMENT",method="Pick"}', 0)
        self.check(errors >= 9, "prefixd_rpc_errors_total counts the Picks refused", errors)

    def post(self, path, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=TIMEOUT)
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read()
        conn.close()
        return resp.status, json.loads(text)

    def run(self):
        self.no_workers()
        self.start()
        for e in self.engines:  # an empty batch each: LIVE with last_seq 0
            e.pub.publish([])
        self.wait_live("the three engines are LIVE")
        self.ties()
        p, winner = self.cold()
        self.predicted(p, winner)
        self.evicted()
        self.tiers()
        self.loads()
        self.batch()
        self.window()
        self.bad_input()
        self.metrics()
        self.leaving()
        self.prefixctl()
        self.behind()

    def close(self):
        for e in self.engines:
            e.pub.close()
        self.extra.close()
        if self.client is not None:
            self.client.close()
        if self.daemon is not None:
            self.daemon.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def main():
    t = Test()
    try:
        t.run()
    except (prefixd_fixture.DaemonFailed, OSError, grpc.RpcError, prefixd.PrefixdError,
            ValueError, KeyError, TypeError, StopIteration) as e:
        logs = t.daemon.logs()[-3000:] if t.daemon is not None else ""
        t.check(False, "the run completed", "%s: %s\n%s" % (type(e).__name__, e, logs))
    finally:
        t.close()
    return t.exit_code()


if __name__ == "__main__":
    sys.exit(main())
