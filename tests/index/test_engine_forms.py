#!/usr/bin/python3
"""The fleet index against every form the engines ship: the real
prefixd binary subscribed over real ZeroMQ sockets to publishers of each
form (prefixd.kv_publisher), each fed by an engine model
(prefixd.engine_pool) whose caches are the truth every Route answer and
every worker's state and counters are checked against.

Scenarios (one daemon each; --scenarios=a,b picks some):
  replay  replay framing per version: v25 answers replays ["", seq, payload]
          / ["", -1, ""] (SGLang, vLLM <= 0.25), v26 ["", topic, seq,
          payload] / ["", "", -1, ""] (vLLM >= 0.26; the other scenarios'
          publishers answer in the 3-frame form, so that each scenario shows
          its own form's failures on an older daemon). History published
          before the daemon starts (v25's all in the buffer, v26's rolled
          past it: a late join), a lost batch (a gap the replay fills), a
          buffer that rolled over (cleared, then exact for what came after),
          an engine restart (seq back to 0), an engine process restart (new
          sockets on the same ports: cleared on reconnect, last_seq -1).
  keys    extra keys raw (vLLM's tuples: LoRA name, [mm_hash, offset],
          salt in block 0, embeds digest) and typed (event_version 1:
          {"type": ...} maps), the same requests on both: LoRA, salt,
          images, prompt embeddings, legacy keys; Route with the prompts'
          block_extra_keys, without them, with another image; a key no
          decoder knows ends the chain (extra_keys drops).
  fields  the newest fields (kv_cache_spec_kind, locality, ownership,
          session_id, event_version) in vLLM's declaration order (array
          form) and by name (map form), each engine with a second tier: CPU
          owned by "lmcache" (CPU/lmcache), and remote CPU (CPU/REMOTE).
  sglang  SGLang's radix cache with HiCache: signed int64 hashes,
          attn_dp_rank as the batch's third element, stores of up to 64
          pages per event, one BlockRemoved per evicted node, GPU ->
          CPU_PINNED moves, load-backs; rank 1 on port + 1; a gap.
  eagle   SGLang under EAGLE speculative decoding: token_ids pairs
          [t, next t], a page spanning its tokens and the one after; a plain
          SGLang engine gets the same prompts (same tokens, other blocks),
          some salted; every page boundary of recent prompts, with and
          without the token after it.
  sglang_salt
          SGLang's cache salt in the three layouts it shipped (its metadata
          map in lora_name's slot; later extra_keys ["dynamo-cache-salt:S"]
          with the map past ownership; newest, tagged-map events in the
          positional batch with a named cache_salt), in every store of a
          salted request.
  dp      data parallelism with one source per rank (vLLM map form, ranks
          0-2 on port + r; SGLang array form, ranks 0-1):
          history before the daemon starts, no worker that no stream feeds,
          <name>/dp<r> LIVE once caught up, a gap counted once.
  offload vLLM's OffloadingConnector placeholders (map form, int and bytes
          hashes): a block copied to the CPU named by its hash alone, no
          tokens, no parent, block_size 0; the index holds the block it
          stored on the GPU in tier CPU too, until the CPU evicts it.
  hybrid  a hybrid model (group 0 full attention, group 1 a sliding window
          of 48 tokens, its own pool) beside a plain engine fed the same
          prompts: matched_blocks is the usable prefix, full_attention_blocks
          the full group's run; ListWorkers lists the groups.

At each checkpoint: every worker LIVE once its stream has caught up (its
last_seq the publisher's), no other worker listed, state_detail empty (or
naming the late join), last_error keeping the reason of the last clear,
gaps / replays (ok, failed) / clears per reason (metrics) / dropped blocks
per reason exact, blocks per medium equal to the engine's, and for every
sample prompt every worker's matched_blocks, full_attention_blocks and
mediums equal to the engine model's route_answer(), the workers sorted and
best_worker the first LIVE one holding the first block. Dropped blocks are
counted by a reference of the index's parent rule over the batches applied
(a store whose parent the worker does not hold is dropped whole).

One unittest test per scenario (EngineForms.test_replay, ...); each check
is a subTest tagged with the form it is about, so a scenario goes on past a
failed checkpoint.

Usage: test_engine_forms.py --prefixd PATH [--stubs DIR] [--full]
       [--scenarios=replay,keys,...] [unittest args]
Exit 1 on a failure, 77 (skipped) without --prefixd. --full runs more
requests per scenario (minutes).
"""

import atexit
import collections
import os
import random
import sys
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)


def _flags(ap):
    ap.add_argument("--full", action="store_true", help="more requests per scenario")
    ap.add_argument("--scenarios", default="", help="comma-separated; default: all")


ARGS = common.setup(__doc__, extra=_flags)

import zmq  # noqa: E402

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import engine_pool as ep  # noqa: E402
from prefixd import kv_publisher as kp  # noqa: E402

BS = 16
SCALE = 4 if ARGS.full else 1
QUIESCE_TIMEOUT = 6
ROUTE_CHUNK = 50
LOCAL = "tcp://127.0.0.1:*"
CLEAR_REASONS = ("all_blocks_cleared", "restart", "replay_failed", "undecodable", "block_size",
                 "reconnect")


# ---- the index's parent rule, for the dropped-block counters ----

class DropReference:
    """What the index drops of the batches it applies: a store whose parent
    the worker does not hold (in any tier or group) is dropped whole
    (unknown_parent); blocks from the first whose keys no decoder knows
    are dropped (extra_keys); a placeholder (token_ids []) of a hash the
    worker does not hold is dropped (unknown_hash). clear() empties the
    worker."""

    def __init__(self):
        self.held = collections.defaultdict(set)  # hash -> {(tier, group)}
        self.drops = collections.Counter()

    def clear(self):
        self.held.clear()

    @staticmethod
    def _tier(ev):
        return (ep.tier_name(ev.get("medium"), ev.get("locality"), ev.get("ownership")),
                ev.get("group_idx") or 0)

    @staticmethod
    def _vouched(entry):
        if entry is None:
            return True
        if not isinstance(entry, (list, tuple)):
            return False
        known = ("lora", "cache_salt", "mm", "prompt_embeds", "legacy")
        return all(not isinstance(k, dict) or k.get("type") in known for k in entry)

    def mediums(self):
        """Blocks held per tier (a block in several groups of one tier once)."""
        out = collections.Counter()
        for tiers in self.held.values():
            for name in {tier for tier, _ in tiers}:
                out[name] += 1
        return dict(out)

    def apply(self, events):
        for ev in events:
            if ev.type == "AllBlocksCleared":
                self.clear()
            elif ev.type == "BlockRemoved":
                tier = self._tier(ev)
                for h in ev.get("block_hashes"):
                    self.held[h].discard(tier)
                    if not self.held[h]:
                        del self.held[h]
            elif ev.type == "BlockStored" and ev.get("token_ids") == []:
                for h in ev.get("block_hashes"):
                    if h in self.held:
                        self.held[h].add(self._tier(ev))
                    else:
                        self.drops["unknown_hash"] += 1
            elif ev.type == "BlockStored":
                hashes = ev.get("block_hashes")
                keys = ev.get("extra_keys") or []
                chain = len(hashes)
                for i, entry in enumerate(keys[:len(hashes)]):
                    if not self._vouched(entry):
                        chain = i
                        break
                self.drops["extra_keys"] += len(hashes) - chain
                parent = ev.get("parent_block_hash")
                if chain == 0:
                    continue
                if parent is not None and parent not in self.held:
                    self.drops["unknown_parent"] += chain
                    continue
                for h in hashes[:chain]:
                    self.held[h].add(self._tier(ev))


# ---- one engine ----

class Engine:
    """A publisher, its engine model and what the index should show of it.
    worker: the index's name for it; source: its --index_source name.
    since: the first batch the index has applied since it last lost track
    (None: every batch). log: (seq, events) of every batch since the last
    restart; ref: the parent rule over the batches the index applied."""

    def __init__(self, worker, pool, pub, source=None):
        self.worker = worker
        self.source = source or worker
        self.pool = pool
        self.pub = pub
        self.since = None
        self.log = []
        self.applied_to = -1     # the last batch fed to ref
        self.ref = DropReference()
        self.exp = dict(gaps=0, replays_ok=0, replays_failed=0, clears=collections.Counter())
        self.check_full = False  # compare full_attention_blocks too
        self.detail = ""         # expected state_detail prefix once LIVE
        self.error = ""          # expected last_error prefix
        self._wrap(pub)

    def _wrap(self, pub):
        publish = pub.publish

        def logged(events, ts=None):
            seq = publish(events, ts)
            self.log.append((seq, list(events)))
            return seq
        pub.publish = logged

    def flag(self):
        return "--index_source=" + self.pub.source_flag(self.source)

    def feed_ref(self, upto=None):
        """Applies the logged batches up to `upto` (default: all) to ref."""
        upto = self.pub.last_seq if upto is None else upto
        for seq, events in self.log:
            if self.applied_to < seq <= upto and (self.since is None or seq >= self.since):
                self.ref.apply(events)
                self.applied_to = seq

    def index_lost_track(self, resume_at, upto_before=None):
        """The index cleared this worker after applying batches up to
        upto_before and goes on from batch resume_at."""
        if upto_before is not None:
            self.feed_ref(upto_before)
        self.ref.clear()
        self.since = resume_at
        self.applied_to = resume_at - 1

    def restarted(self, pub=None):
        """The engine restarted (seq from 0): the index starts over."""
        self.feed_ref()
        self.pool.restart(pub)
        if pub is not None:
            self.pub = pub
            self._wrap(pub)
        self.log = []
        self.ref.clear()
        self.since = None
        self.applied_to = -1

    def answer(self, prompt):
        return self.pool.route_answer(prompt.tokens, prompt.salt, prompt.lora, since=self.since,
                                      **prompt.keys)


Prompt = collections.namedtuple("Prompt", "tokens salt lora keys")


def plain(tokens):
    return Prompt(list(tokens), None, None, {})


class Workload:
    """Prompts that share prefixes as chat traffic does: system prompts,
    conversations growing turn by turn, some with a partial last block.
    With variety, conversations get a LoRA, a salt, an image, prompt
    embeddings or legacy keys; with salts, a salt only (and a LoRA too with
    loras)."""

    def __init__(self, seed, base, variety=False, systems=5, salts=False, loras=False):
        self.rng = random.Random(seed)
        self.next_id = base
        self.variety = variety
        self.salts = salts
        self.loras = loras
        self.systems = [self.fresh(self.rng.randint(2, 5)) for _ in range(systems)]
        self.convs = []
        self.sent = []

    def fresh(self, n):
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ep.fresh_tokens(ids, BS)

    def _namespace(self):
        rng = self.rng
        if self.salts:
            lora = rng.choice([None, None, "sql-adapter"]) if self.loras else None
            return rng.choice([None, None, "acme", "globex"]), lora, {}
        if not self.variety:
            return None, None, {}
        salt = rng.choice([None, None, "acme", "globex"])
        lora = rng.choice([None, None, "sql-adapter", "chat-adapter"])
        keys = {}
        r = rng.random()
        if r < 0.3:
            keys["embeds"] = "emb-%d" % rng.randrange(1 << 30)
        elif r < 0.45:
            keys["legacy"] = {rng.randint(1, 3): ["old-mm-%d" % rng.randrange(4)]}
        return salt, lora, keys

    def request(self):
        rng = self.rng
        if self.convs and rng.random() < 0.45:
            conv = rng.choice(self.convs)
            conv["tokens"] += self.fresh(rng.randint(1, 3))
        else:
            salt, lora, keys = self._namespace()
            conv = {"tokens": rng.choice(self.systems) + self.fresh(rng.randint(1, 3)),
                    "salt": salt, "lora": lora, "keys": keys}
            self.convs.append(conv)
            if self.variety and rng.random() < 0.4:
                self.add_image(conv)
        if len(conv["tokens"]) > 40 * BS:  # a long conversation starts over
            self.convs.remove(conv)
        tail = [7, 8, 9] if rng.random() < 0.2 else []
        p = Prompt(conv["tokens"] + tail, conv["salt"], conv["lora"], dict(conv["keys"]))
        self.sent.append(p)
        return p

    def add_image(self, conv):
        """An image whose placeholder tokens follow the conversation's last
        block, anywhere in the block, spanning 1-3 blocks."""
        start = len(conv["tokens"]) + self.rng.randrange(BS)
        length = self.rng.randint(8, 40)
        conv["tokens"] += self.fresh(-(-(start + length) // BS) - len(conv["tokens"]) // BS + 1)
        mm = list(conv["keys"].get("mm", [])) + [
            ("image", "img-%04d" % self.rng.randrange(6), start, length)]
        conv["keys"] = dict(conv["keys"], mm=mm)

    def samples(self, n=60):
        """Prompts for Route: recent and older requests, prefixes of them cut
        at every kind of boundary, extensions, and prompts nobody holds; with
        variety also without their images, and with another image."""
        rng = random.Random(len(self.sent))
        pool = self.sent[-200:]
        out = [rng.choice(pool) for _ in range(n // 3)]
        out += [rng.choice(self.sent) for _ in range(n // 6)]
        for _ in range(n // 4):
            p = rng.choice(pool)
            k = rng.randint(1, max(1, len(p.tokens) // BS))
            out.append(p._replace(tokens=p.tokens[:k * BS]))
        for _ in range(n // 12):
            p = rng.choice(pool)
            out.append(p._replace(tokens=p.tokens[:len(p.tokens) // BS * BS] + self.fresh(1)))
        with_mm = [p for p in pool if p.keys.get("mm")]
        for p in rng.sample(with_mm, min(len(with_mm), n // 6)):
            keys = {k: v for k, v in p.keys.items() if k != "mm"}
            out.append(p._replace(keys=keys))
            other = [(m, h + "-other", s, n_) for m, h, s, n_ in p.keys["mm"]]
            out.append(p._replace(keys=dict(p.keys, mm=other)))
        out += [plain(self.fresh(3)) for _ in range(3)]
        return out


def bind_consecutive(n, **kw):
    """n publishers on ports P, P+1, ... (event) and R, R+1, ... (replay),
    as a DP engine's ranks bind them."""
    for _ in range(50):
        base = prefixd_fixture.free_port()
        replay = prefixd_fixture.free_port()
        if abs(base - replay) < n:
            continue
        pubs = []
        try:
            for r in range(n):
                pubs.append(kp.Publisher("tcp://127.0.0.1:%d" % (base + r),
                                         "tcp://127.0.0.1:%d" % (replay + r), bind=True,
                                         data_parallel_rank=r, **kw))
            return pubs
        except zmq.ZMQError:
            for p in pubs:
                p.close()
    raise RuntimeError("no %d consecutive free ports" % n)


def rebind(old, **kw):
    """A restarted engine process: a new publisher on the old one's ports
    (retried while the old sockets let go of them)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return kp.Publisher(old.endpoint, old.replay_endpoint, bind=True, **kw)
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# ---- the test: a scenario each ----

class EngineForms(unittest.TestCase):
    """One daemon on some engines per test. form: what the scenario's checks
    are about (a subTest parameter); forms: the form of a worker's own
    checks (default: form)."""

    @classmethod
    def setUpClass(cls):
        if not ARGS.prefixd:
            raise unittest.SkipTest("--prefixd not given")

    def setUp(self):
        self.name = self.form = self._testMethodName[len("test_"):]
        self.forms = {}
        self.engines = []
        self.daemon = None
        self.client = None
        self.wl = None
        self.addCleanup(self.close)

    def tearDown(self):
        if self.client is not None:
            self.client.close()  # an open channel would hold up the drain
            self.client = None
            rc = self.daemon.stop()
            self.assertEqual(rc, 0, "%s: prefixd exits 0 on SIGTERM\n%s"
                             % (self.name, self.daemon.logs()[-3000:]))

    def start(self):
        flags = ["--index_block_size=%d" % BS]
        flags += sorted({e.flag() for e in self.engines})
        self.daemon = prefixd_fixture.Daemon(ARGS.prefixd, "", args=flags)
        atexit.register(self.daemon.kill)
        try:
            self.daemon.start()
        except prefixd_fixture.DaemonFailed as e:
            self.fail("%s: prefixd serves: %s" % (self.name, e))
        self.client = prefixd.Client(self.daemon.tcp, deadline=10)
        pubs = {id(e.pub): e.pub for e in self.engines}
        ok = [p.wait_for_subscriber(10) for p in pubs.values()]
        self.assertTrue(all(ok), "%s: the daemon subscribed to all %d publishers"
                        % (self.name, len(pubs)))

    def form_of(self, e):
        return self.forms.get(e.worker, self.form)

    def close(self):
        if self.client is not None:
            self.client.close()
        if self.daemon is not None:
            self.daemon.close()
        for e in self.engines:
            e.pub.close()

    # ---- the daemon's view ----

    def workers(self):
        return {w.worker: w for w in self.client.list_workers().workers}

    def metrics(self):
        """{(family, worker, label): value} for the index's per-worker counters."""
        text = urllib.request.urlopen("http://%s/metrics" % self.daemon.metrics,
                                      timeout=10).read().decode()
        out = {}
        for line in text.splitlines():
            if not line.startswith(("prefixd_index_clears_total{",
                                    "prefixd_index_replays_total{")):
                continue
            name, rest = line.split("{", 1)
            labels, value = rest.rsplit("} ", 1)
            kv = dict(p.split("=", 1) for p in labels.split(","))
            kv = {k: v.strip('"') for k, v in kv.items()}
            out[(name, kv.get("worker"), kv.get("reason") or kv.get("result"))] = float(value)
        return out

    def wait(self, cond, timeout=QUIESCE_TIMEOUT):
        """Polls ListWorkers until cond(workers) holds; the workers, or None."""
        deadline = time.monotonic() + timeout
        while True:
            ws = self.workers()
            if cond(ws):
                return ws
            if time.monotonic() > deadline:
                self.last_seen = ws
                return None
            time.sleep(0.02)

    def caught_up(self, engines=None):
        engines = engines or self.engines
        return self.wait(lambda ws: all(
            e.worker in ws and ws[e.worker].state == prefixd.WorkerState.LIVE
            and ws[e.worker].last_seq == e.pub.last_seq for e in engines))

    # ---- checkpoints: each check a subTest, the scenario goes on ----

    def checkpoint(self, label, samples=None):
        """Caught up, counters, then every Route answer."""
        ws = self.caught_up()
        with self.subTest(label, form=self.form):
            self.assertIsNotNone(ws, "%s: every worker LIVE with its publisher's last seq (%s)\n%s"
                                 % (label, ", ".join("%s %d" % (e.worker, e.pub.last_seq)
                                                     for e in self.engines),
                                    ws is None and {n: (str(w.state), w.last_seq, w.state_detail)
                                                    for n, w in self.last_seen.items()}))
        self.check_workers(label)
        self.check_routes(label, samples if samples is not None else self.wl.samples())

    def check_workers(self, label):
        ws = self.workers()
        names = sorted(e.worker for e in self.engines)
        with self.subTest(label, form=self.form):
            self.assertEqual(sorted(ws), names, "%s: the workers are exactly %s (no worker that "
                             "no stream feeds)" % (label, names))
        m = self.metrics()
        for e in self.engines:
            e.feed_ref()
            w = ws.get(e.worker)
            with self.subTest(label, form=self.form_of(e), worker=e.worker):
                self.assertIsNotNone(w, "%s: %s counters: not listed" % (label, e.worker))
                want, got = self.expected_counters(e), self.counters(w, e, m)
                bad = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
                self.assertTrue(not bad, "%s: %s state, counters, blocks per medium (%s)\n"
                                "(got, want): %s; drops by reason %s"
                                % (label, e.worker, e.pool.medium_blocks(), bad,
                                   dict(e.ref.drops)))

    @staticmethod
    def expected_counters(e):
        want = {"gaps": e.exp["gaps"], "replays": e.exp["replays_ok"] + e.exp["replays_failed"],
                "clears": sum(e.exp["clears"].values()),
                "dropped_blocks": sum(e.ref.drops.values()),
                "mediums": e.pool.medium_blocks() if e.since is None else e.ref.mediums(),
                "last_seq": e.pub.last_seq,
                "state": prefixd.WorkerState.LIVE, "state_detail": e.detail,
                "last_error": e.error}
        for reason in CLEAR_REASONS:
            want["clears:" + reason] = e.exp["clears"][reason]
        for result in ("ok", "failed"):
            want["replays:" + result] = e.exp["replays_" + result]
        want.update(getattr(e, "more", {}))
        return want

    @staticmethod
    def counters(w, e, m):
        """What ListWorkers (w) and the metrics (m) show of engine e."""
        got = {"gaps": w.gaps, "replays": w.replays, "clears": w.clears,
               "dropped_blocks": w.dropped_blocks, "mediums": w.mediums,
               "last_seq": w.last_seq, "state": w.state,
               "state_detail": w.state_detail[:len(e.detail)] if e.detail else w.state_detail,
               "last_error": w.last_error[:len(e.error)]}
        for reason in CLEAR_REASONS:
            got["clears:" + reason] = int(m.get(("prefixd_index_clears_total", e.worker,
                                                 reason), 0))
        for result in ("ok", "failed"):
            got["replays:" + result] = int(m.get(("prefixd_index_replays_total", e.worker,
                                                  result), 0))
        for k in getattr(e, "more", {}):
            got[k] = getattr(w, k)
        return got

    def route(self, samples):
        out = []
        for i in range(0, len(samples), ROUTE_CHUNK):
            chunk = samples[i:i + ROUTE_CHUNK]
            # all_workers: each engine's answer is checked, matched or not.
            qs = [prefixd.RouteQuery(p.tokens, lora_name=p.lora, cache_salt=p.salt,
                                     block_extra_keys=self.engines[0].pool.route_extra_keys(
                                         p.tokens, **p.keys), all_workers=True)
                  for p in chunk]
            for p, item in zip(chunk, self.client.route_batch(qs)):
                if isinstance(item, Exception):
                    raise item
                out.append(item)
        return out

    def check_routes(self, label, samples):
        try:
            answers = self.route(samples)
        except Exception as err:  # noqa: BLE001 (a failed call fails the check)
            with self.subTest(label, form=self.form):
                self.fail("%s: RouteBatch answers %d prompts: %s" % (label, len(samples), err))
            return
        names = sorted(e.worker for e in self.engines)
        shape = []
        for p, r in zip(samples, answers):
            listed = [w.worker for w in r.workers]
            order = sorted(r.workers, key=lambda w: (-w.matched_blocks, w.worker))
            live = [w for w in order if w.matched_blocks > 0
                    and w.state == prefixd.WorkerState.LIVE]
            best = live[0].worker if live and live[0].matched_blocks == order[0].matched_blocks \
                else (live[0].worker if live else "")
            if (sorted(listed) != names or listed != [w.worker for w in order]
                    or r.best_worker != best or r.prompt_blocks != len(p.tokens) // BS):
                shape.append((len(p.tokens) // BS, listed, r.best_worker))
        with self.subTest(label, form=self.form):
            self.assertTrue(not shape, "%s: Route with all_workers lists every worker, sorted, "
                            "best_worker the first LIVE holder (%d prompts): %s"
                            % (label, len(samples), shape[:3]))
        for e in self.engines:
            bad, held = [], 0
            for i, (p, r) in enumerate(zip(samples, answers)):
                want = e.answer(p)
                w = next((w for w in r.workers if w.worker == e.worker), None)
                got = w and {"matched": w.matched_blocks, "full": w.full_attention_blocks,
                             "mediums": w.mediums}
                if got and not e.check_full:  # a field of its own: the hybrid scenario's
                    got["full"] = want["full"]
                held += want["matched"] > 0
                if got != want or w.last_seq != e.pub.last_seq:
                    bad.append((i, len(p.tokens) // BS, p.salt, p.lora, sorted(p.keys), got,
                                want, w and w.last_seq))
            with self.subTest(label, form=self.form_of(e), worker=e.worker):
                self.assertTrue(not bad, "%s: %s Route == the engine model (%d prompts, %d held)\n"
                                "%d differ (sample, blocks, salt, lora, keys, got, want, "
                                "last_seq): %s" % (label, e.worker, len(samples), held, len(bad),
                                                   bad[:4]))

    # ---- traffic ----

    def feed(self, n, engines=None, same=False, per_step=2):
        """n requests of the workload: spread over the engines (or the same
        prompt to each with same=True), stepping them every per_step."""
        engines = engines or self.engines
        for i in range(n):
            p = self.wl.request()
            for e in (engines if same else [engines[i % len(engines)]]):
                # An engine whose events cannot name a LoRA serves it as the base.
                lora = p.lora if e.pool.takes_lora else None
                e.pool.submit(p.tokens, p.salt, lora, hold_steps=1 + i % 3, **p.keys)
            if i % per_step == per_step - 1:
                for e in engines:
                    e.pool.step()
        for e in engines:
            e.pool.drain()
            e.pool.check()

    @staticmethod
    def sglang_engine(worker, encoding="array", **pool):
        """An SGLang engine model (radix cache with HiCache, `pool` its
        options) on a publisher of its own, caught up by a replay."""
        pub = kp.Publisher(LOCAL, LOCAL, encoding=encoding, hash_kind="int64")
        e = Engine(worker, ep.RadixPool(96, BS, pub, host_blocks=80, name=worker,
                                        hash_seed=worker.encode(), **pool), pub)
        e.exp["replays_ok"] = 1
        return e

    # ---- the scenarios ----

    def test_replay(self):
        v25 = Engine("v25", ep.EnginePool(160, BS, name="v25", hash_seed=b"v25"),
                     kp.Publisher(LOCAL, LOCAL, encoding="array", hash_kind="int", buffer_steps=16,
                                  replay_framing="seq"))
        v26 = Engine("v26", ep.EnginePool(160, BS, name="v26", hash_seed=b"v26",
                                          spec_kind="full_attention"),
                     kp.Publisher(LOCAL, LOCAL, encoding="map", hash_kind="bytes", buffer_steps=16,
                                  replay_framing="topic", topic="kv@v26@llama"))
        for e in (v25, v26):
            e.pool.publisher = e.pub
        self.engines = [v25, v26]
        self.forms = {"v25": "replay-3", "v26": "replay-4"}
        self.wl = Workload(1, 1000)
        # History: v25's batches all buffered; v26's rolled past its 16.
        self.feed(20, engines=[v25], per_step=2)
        self.feed(80, engines=[v26], per_step=2)
        v26.index_lost_track(v26.pub.last_seq - 15)
        v26.detail = "joined at batch %d" % (v26.pub.last_seq - 15)
        for e in self.engines:
            e.exp["replays_ok"] += 1
        self.start()
        self.checkpoint("catch-up of %d and %d batches"
                        % (v25.pub.last_seq + 1, v26.pub.last_seq + 1))
        self.feed(30 * SCALE)
        self.checkpoint("live traffic")
        v26.detail = ""  # the next replay is a gap's: LIVE again says nothing

        for e in self.engines:  # a lost batch: the gap is replayed
            e.pub.drop_next(1)
            e.exp["gaps"] += 1
            e.exp["replays_ok"] += 1
        self.feed(16)
        self.checkpoint("a lost batch, replayed")

        for e in self.engines:  # a gap past the replay buffer: cleared
            before = e.pub.last_seq
            e.pub.drop_next(3 * e.pub.buffer_steps)
            while not e.pub.sent or e.pub.sent[-1] <= before:  # the first batch sent after them
                self.feed(1, engines=[e], per_step=1)
            e.exp["gaps"] += 1
            e.exp["replays_failed"] += 1
            e.exp["clears"]["replay_failed"] += 1
            e.error = "replay_failed: batch %d is gone" % (before + 1)
            e.index_lost_track(e.pub.last_seq - e.pub.buffer_steps + 1, upto_before=before)
            ws = self.wait(lambda ws, e=e: ws[e.worker].clears >= 1
                           and ws[e.worker].last_seq == e.pub.last_seq)
            with self.subTest(form=self.form_of(e), worker=e.worker):
                self.assertIsNotNone(ws, "%s: a gap past the replay buffer clears the worker: %s"
                                     % (e.worker, getattr(self, "last_seen", {}).get(e.worker)))
        self.feed(30)
        self.checkpoint("after a gap past the replay buffer")

        for e in self.engines:  # an engine restart: seq back to 0
            e.restarted()
            e.exp["clears"]["restart"] += 1
            e.error = "restart: sequence went back"
        self.feed(30)
        self.checkpoint("after an engine restart (seq back to 0)")

        for e in self.engines:  # an engine process restart: new sockets, same ports
            old = e.pub
            kw = dict(encoding=old.encoding, hash_kind=old.hash_kind, buffer_steps=16,
                      replay_framing=old.replay_framing, topic=old.topic)
            old.close()
            e.restarted(rebind(old, **kw))
            e.exp["clears"]["reconnect"] += 1
            e.exp["replays_ok"] += 1
            e.error = "reconnect: reconnected to"
            with self.subTest(form=self.form_of(e), worker=e.worker):
                self.assertTrue(e.pub.wait_for_subscriber(10), "%s: the daemon reconnects to the "
                                "new sockets" % e.worker)
            ws = self.wait(lambda ws, e=e: ws[e.worker].clears >= 3
                           and ws[e.worker].state == prefixd.WorkerState.LIVE
                           and ws[e.worker].replays >= 4)
            w = (ws or self.last_seen)[e.worker]
            with self.subTest(form=self.form_of(e), worker=e.worker):
                self.assertTrue(ws is not None and w.last_seq == -1 and w.state_detail == ""
                                and sum(w.mediums.values()) == 0,
                                "%s: after the process restart LIVE, last_seq -1, state_detail "
                                "empty, no blocks: %s" % (e.worker, (str(w.state), w.last_seq,
                                                                     w.state_detail, w.mediums,
                                                                     w.last_error)))
        self.checkpoint("a restarted process, before its first batch")
        self.feed(30)
        self.checkpoint("a restarted process, after traffic")

    def test_keys(self):
        raw = Engine("raw", ep.EnginePool(200, BS, name="raw", hash_seed=b"raw", keys_form="raw"),
                     kp.Publisher(LOCAL, LOCAL, encoding="array", hash_kind="int"))
        typed = Engine("typed", ep.EnginePool(200, BS, name="typed", hash_seed=b"typed",
                                              keys_form="typed", spec_kind="full_attention"),
                       kp.Publisher(LOCAL, LOCAL, encoding="map", hash_kind="bytes"))
        for e in (raw, typed):
            e.pool.publisher = e.pub
            e.exp["replays_ok"] = 1
        typed.more = {"event_version": 1}
        raw.more = {"event_version": 0}
        self.engines = [raw, typed]
        self.forms = {"raw": "keys-raw", "typed": "keys-typed"}
        self.wl = Workload(2, 200000, variety=True)
        self.start()
        self.form = "keys"
        self.caught_up()
        self.feed(60 * SCALE, same=True)
        self.checkpoint("raw and typed extra keys: LoRA, salt, images, embeds, legacy")
        self.form, forms, self.forms = "mm", self.forms, {}
        mm = [p for p in self.wl.sent[-150:] if p.keys.get("mm")]
        self.check_routes("prompts with images, with and without block_extra_keys, with another "
                          "image", self.wl.samples(90) + mm[:30])
        self.forms = forms
        # A key no decoder knows: the chain ends before that block.
        self.form = "keys"
        P = self.wl.fresh(6)
        for e in self.engines:
            e.pool.submit(P, opaque_at=3)
            e.pool.drain()
        self.checkpoint("a block with a key no decoder knows ends the chain",
                        samples=[Prompt(P, None, None, {"opaque_at": 3}), plain(P[:3 * BS])])
        self.feed(20 * SCALE, same=True)
        self.checkpoint("more traffic")

    def test_fields(self):
        fields = dict(session_id="sess-7", locality="LOCAL", event_version=1)
        arr = Engine("arr", ep.EnginePool(96, BS, name="arr", hash_seed=b"arr",
                                          spec_kind="full_attention", store_fields=fields,
                                          remove_fields=dict(locality="LOCAL", event_version=1),
                                          tier=dict(medium="CPU", blocks=128, ownership="lmcache")),
                     kp.Publisher(LOCAL, LOCAL, encoding="array", hash_kind="int"))
        remote = Engine("remote", ep.EnginePool(96, BS, name="remote", hash_seed=b"remote",
                                                spec_kind="full_attention",
                                                store_fields=dict(session_id="sess-8"),
                                                tier=dict(medium="cpu", blocks=96,
                                                          locality="REMOTE")),
                        kp.Publisher(LOCAL, LOCAL, encoding="map", hash_kind="int"))
        for e in (arr, remote):
            e.pool.publisher = e.pub
            e.exp["replays_ok"] = 1
        arr.more = {"event_version": 1}
        self.engines = [arr, remote]
        self.wl = Workload(3, 400000)
        self.start()
        self.form = "fields"
        self.caught_up()
        self.feed(80 * SCALE)
        self.checkpoint("newest fields; tiers CPU/lmcache and CPU/REMOTE")
        self.feed(40 * SCALE)
        self.checkpoint("more traffic")

    def test_offload(self):
        # vLLM's OffloadingConnector by default: a block copied to the CPU is
        # announced by its hash alone (token_ids [], block_size 0, no parent);
        # map form as vLLM sends it, int and bytes hashes.
        engines = []
        for name, kind in (("offload", "int"), ("offload-bytes", "bytes")):
            e = Engine(name, ep.EnginePool(96, BS, name=name, hash_seed=name.encode(),
                                           tier=dict(medium="CPU", blocks=128,
                                                     placeholder=True)),
                       kp.Publisher(LOCAL, LOCAL, encoding="map", hash_kind=kind))
            e.pool.publisher = e.pub
            e.exp["replays_ok"] = 1
            engines.append(e)
        self.engines = engines
        self.wl = Workload(5, 500000)
        self.start()
        self.form = "offload"
        self.caught_up()
        self.feed(80 * SCALE)
        self.checkpoint("CPU placeholders: the GPU's blocks by hash, in tier CPU")
        self.feed(40 * SCALE)
        self.checkpoint("more traffic, CPU evictions")

    def test_sglang(self):
        pubs = bind_consecutive(2, encoding="array", hash_kind="int64")
        self.engines = [Engine("sgl" if r == 0 else "sgl-r1/dp1",
                               ep.RadixPool(96, BS, pub, host_blocks=80, name="sgl%d" % r,
                                            hash_seed=b"sgl%d" % r),
                               pub, source="sgl" if r == 0 else "sgl-r1")
                        for r, pub in enumerate(pubs)]
        for e in self.engines:
            e.exp["replays_ok"] = 1
        self.wl = Workload(4, 600000)
        long_prompt = self.wl.fresh(70)  # one node of 70 pages: stores of 64 + 6
        for e in self.engines:
            e.pool.submit(long_prompt)
            e.pool.drain()
        self.start()
        self.form = "sglang"
        self.checkpoint("a 70-page node published before the daemon started (caught up)",
                        samples=[plain(long_prompt), plain(long_prompt[:40 * BS])])
        self.feed(90 * SCALE)
        self.checkpoint("radix nodes, HiCache moves GPU -> CPU_PINNED, load-backs")
        e = self.engines[1]
        e.pub.drop_next(1)
        e.exp["gaps"] += 1
        e.exp["replays_ok"] += 1
        self.feed(30 * SCALE)
        self.checkpoint("a lost batch on rank 1, replayed")
        moved = sum(x.pool.counts["offloaded"] for x in self.engines)
        back = sum(x.pool.counts["loaded_back"] for x in self.engines)
        splits = sum(x.pool.counts["splits"] for x in self.engines)
        self.assertTrue(moved > 0 and back > 0 and splits > 0, "the traffic moved pages to the "
                        "host (%d), loaded some back (%d) and split nodes (%d)"
                        % (moved, back, splits))

    def test_eagle(self):
        # SGLang under EAGLE speculative decoding: token_ids are pairs [t, next t]
        # and a page's hash covers the token after it. A plain SGLang engine
        # gets the same prompts: the same tokens, other blocks. Some requests
        # are salted (SGLang's later layout).
        self.engines = [self.sglang_engine(name, eagle=eagle, salt_layout="extra_keys")
                        for name, eagle in (("sgl-eagle", True), ("sgl-plain", False))]
        self.wl = Workload(4, 700000, salts=True)
        self.start()
        self.form = "eagle"
        self.caught_up()
        self.feed(60 * SCALE, same=True)
        # Every page boundary of recent prompts, and one token past it: a
        # bigram page is matched only with the token after it.
        prefixes = [p._replace(tokens=p.tokens[:k * BS + extra])
                    for p in self.wl.sent[-8:] for k in range(1, len(p.tokens) // BS)
                    for extra in (0, 1)]
        self.checkpoint("bigram pages beside plain ones of the same prompts",
                        samples=self.wl.samples() + prefixes)
        self.feed(40 * SCALE)
        self.checkpoint("more traffic, HiCache moves and load-backs")
        stored = self.engines[0].pool.counts["stored"]
        self.assertTrue(stored > 0, "the EAGLE engine stored pages (%d)" % stored)

    def test_sglang_salt(self):
        # SGLang's cache salt in the three layouts it shipped: its metadata
        # map right after medium; (later) extra_keys
        # [["dynamo-cache-salt:S"]] with the map past ownership; (newest)
        # tagged-map events in the positional batch, the salt their named
        # field cache_salt. In every store of a salted request, root or not.
        # Some requests name a LoRA, which only the newest names (lora_name):
        # the others serve them as the base model.
        self.engines = [self.sglang_engine("sgl-salt-" + name.replace("_", "-"),
                                           encoding=encoding, salt_layout=name)
                        for name, encoding in (("metadata", "array"), ("extra_keys", "array"),
                                               ("named", "array_of_maps"))]
        self.wl = Workload(6, 900000, salts=True, loras=True)
        self.start()
        self.form = "sglang_salt"
        self.caught_up()
        self.feed(80 * SCALE, same=True)
        self.checkpoint("salted and plain requests, the same on both layouts")
        self.feed(40 * SCALE)
        self.checkpoint("more traffic, HiCache moves and load-backs")
        salted = [p for p in self.wl.sent if p.salt]
        self.assertTrue(salted, "the workload sent salted requests")
        named = self.engines[2].pool
        held = [p for p in self.wl.samples()
                if p.lora and named.route_answer(p.tokens, p.salt, p.lora)["matched"]]
        self.assertTrue(held, "the newest layout's engine holds LoRA pages that samples "
                        "route to")

    def test_dp(self):
        vpubs = bind_consecutive(3, encoding="map", hash_kind="int", topic="kv@vllm@llama")
        spubs = bind_consecutive(2, encoding="array", hash_kind="int64")
        for name, pubs, mk in (
                ("vllm", vpubs, lambda r: ep.EnginePool(96, BS, hash_seed=b"v%d" % r)),
                ("sgl", spubs, lambda r: ep.RadixPool(96, BS, hash_seed=b"s%d" % r))):
            for r, pub in enumerate(pubs):
                pool = mk(r)
                pool.publisher = pub
                src = name if r == 0 else "%s-r%d" % (name, r)
                e = Engine(src if r == 0 else "%s/dp%d" % (src, r), pool, pub, src)
                self.engines.append(e)
        self.wl = Workload(5, 800000)
        self.feed(40)  # history every rank published before the daemon started
        for e in self.engines:
            e.exp["replays_ok"] = 1
        self.start()
        self.form = "dp"
        self.checkpoint("one source per rank, caught up from each rank's buffer")
        e = self.engines[1]
        e.pub.drop_next(1)
        e.exp["gaps"] += 1
        e.exp["replays_ok"] += 1
        self.feed(40 * SCALE)
        self.checkpoint("a lost batch on vllm rank 1: one gap, one replay")

    def test_hybrid(self):
        hyb = Engine("hybrid", ep.EnginePool(128, BS, name="hybrid", hash_seed=b"h",
                                             sliding_window=48, window_blocks=40),
                     kp.Publisher(LOCAL, LOCAL, encoding="map", hash_kind="int"))
        flat = Engine("plain", ep.EnginePool(128, BS, name="plain", hash_seed=b"p"),
                      kp.Publisher(LOCAL, LOCAL, encoding="array", hash_kind="int"))
        for e in (hyb, flat):
            e.pool.publisher = e.pub
            e.exp["replays_ok"] = 1
        hyb.more = {"groups": {0: ("full_attention", 0), 1: ("sliding_window", 3)}}
        hyb.check_full = flat.check_full = True
        self.engines = [hyb, flat]
        self.wl = Workload(6, 1000000)
        self.start()
        self.form = "hybrid"
        self.caught_up()
        self.feed(60 * SCALE, same=True)
        # Every prefix of recent prompts: each boundary by the window rule.
        prefixes = []
        for p in self.wl.sent[-12:]:
            prefixes += [p._replace(tokens=p.tokens[:k * BS])
                         for k in range(1, len(p.tokens) // BS)]
        self.checkpoint("usable prefix per the window rule; every prefix of 12 prompts",
                        samples=self.wl.samples() + prefixes)
        differ = sum(1 for p in self.wl.samples() + prefixes
                     if hyb.answer(p)["matched"] != hyb.answer(p)["full"])
        with self.subTest(form=self.form):
            self.assertGreater(differ, 0, "the samples include prefixes the full group holds but "
                               "the window group does not allow (%d)" % differ)
        self.feed(40 * SCALE, same=True)
        self.checkpoint("more traffic")


if __name__ == "__main__":
    common.unittest_main(sys.argv + ["EngineForms.test_" + name
                                     for name in ARGS.scenarios.split(",") if name])
