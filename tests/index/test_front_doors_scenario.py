#!/usr/bin/python3
"""One fleet, end to end, through the index's four front doors (docs/index.md,
"As a Mooncake Conductor" and "As sgl-router's KV indexer"): after every
step, Route (gRPC PrefixIndex), POST /query (token ids), POST /query_by_hash
(rolling hashes computed here) and MatchExternalKvPrefix (kv_indexer.v1,
client generated from the schema text at test time) must answer what an
independent model of the fleet says, and so agree with each other.

The fleet (real ZeroMQ publishers, prefixd.kv_publisher):
  sg0, sg1  SGLang: array-encoded batches [ts, events, attn_dp_rank], tagged
            arrays ["BlockStored", hashes, parent, tokens, block_size,
            lora_id, medium], signed 64-bit page hashes, replay answered
            ["", seq, payload]; configured as `sources`, the two DP ranks of
            instance sglang-a, each with its address
  store     a Mooncake store: RFC #1527 map events (event_type "stored" /
            "removed", seq_hashes = the Conductor's rolling hashes, no token
            ids, medium "cpu" or "disk"), registered by POST /register
            type "Mooncake"
  vllm      vLLM: map-encoded batches, unsigned int hashes, replay answered
            ["", topic, seq, payload], registered by POST /register
The registrations get their addresses from ConfigureExpectedWorkers, as a
router's bridge gives them.

The model: per worker and medium, the set of block chains (a chain is a
prompt's first k blocks) it holds, with the index's placement rules: an
engine's store needs its parent held by the same worker (else dropped); a
store's keys place a block only where the tree has it (some worker holds it
or a block under it), else the keys are dropped. From it: per worker the
longest prefix held in any medium and per medium (Route), per instance,
medium and DP rank in tokens (/query, /query_by_hash), and, for
MatchExternalKvPrefix by one engine family's hashes, the prefix a worker
holds as far as some worker of that family holds each block (a page hash
names a block only through a worker that published it).

Steps: (1) stores on every publisher, prompts sharing prefixes, GPU, CPU,
disk; (2) removals and an SGLang HiCache move (a store in CPU_PINNED, a
removal from GPU); (3) a gap: sg0 loses a batch in transit, the next one
depends on it, the daemon replays it; (4) sg1's process restarts (new
sockets on its ports, sequence from 0) and stores a subset; (5) POST
/unregister of vLLM; (6) the daemon restarts on the same config and state
directory: the registrations are kept, the engines' replay buffers rebuild
the index, then the store's replay places its keys where the engines' blocks
are (its replay is held until the engines have caught up: a store's
catch-up that comes first places nothing, a documented limit).

One unittest test runs the steps in order, each a subTest (a step that
fails ends the run: the next ones build on it); the four doors' agreement
with the model is a subTest per step and door. Exit 1 on a failure, 77
(skipped) without --prefixd.

Usage: test_front_doors_scenario.py --prefixd PATH [--stubs DIR] [unittest args]
"""

import collections
import hashlib
import http.client
import json
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import grpc  # noqa: E402
import zmq  # noqa: E402

import prefixd_fixture  # noqa: E402
from prefixd import kv_publisher as kvp  # noqa: E402
from prefixd.v1 import prefix_index_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_index_pb2_grpc as pb_grpc  # noqa: E402

import upstream  # noqa: E402  (tests/index/upstream.py)

kv, kv_grpc = upstream.kv_indexer_stubs()

BS = 4
MODEL = "deepseek"
DEADLINE_S = 20
TIMEOUT = 10

# ---- hashes, independently of prefixd ----

def conductor_hashes(tokens):
    """The Conductor's rolling hashes of the whole blocks of `tokens` (no
    salt)."""
    return upstream.conductor_hashes(tokens, BS)


def _digest(family, chain):
    return hashlib.sha256(family + struct.pack("<%dI" % len(chain), *chain)).digest()


def sglang_hash(chain):
    """An SGLang page hash: signed 64 bits, a function of the whole prefix,
    equal on every SGLang engine."""
    return int.from_bytes(_digest(b"sglang", chain)[:8], "big", signed=True)


def vllm_hash(chain):
    """A vLLM block hash in its int form: unsigned 64 bits."""
    return int.from_bytes(_digest(b"vllm", chain)[:8], "big")


def signed(h):
    return h - (1 << 64) if h >= 1 << 63 else h


def chain(prompt, k):
    """The chain of a prompt's first k blocks."""
    return tuple(prompt[:k * BS])


# ---- the prompts: shared prefixes ----

SYS = list(range(100, 108))                                  # 2 blocks
P_A = SYS + list(range(200, 212)) + [1, 2]                   # 5 blocks + 2 tokens
P_B = SYS + list(range(300, 308))                            # 4 blocks
P_C = SYS + list(range(200, 204)) + list(range(400, 408))    # 5 blocks, 3 shared with P_A
P_D = list(range(500, 512))                                  # 3 blocks
P_E = list(range(600, 616))                                  # 4 blocks
P_NONE = list(range(700, 716))                               # never stored
PROMPTS = {"A": P_A, "B": P_B, "C": P_C, "D": P_D, "E": P_E, "none": P_NONE}


# ---- the independent model ----

class Model:
    """Per worker and medium, the chains it holds (see the module docstring)."""

    def __init__(self):
        self.hold = {}      # worker -> {medium: set of chains}
        self.family = {}    # worker -> "sglang" | "vllm" | "keys"
        self.labels = {}    # worker -> (instance, dp_rank)
        self.address = {}   # worker -> address ("" none)
        self.drops = collections.Counter()

    def add_worker(self, worker, family, instance, rank, address=""):
        self.hold[worker] = {}
        self.family[worker] = family
        self.labels[worker] = (instance, rank)
        self.address[worker] = address

    def remove_worker(self, worker):
        for d in (self.hold, self.family, self.labels, self.address):
            d.pop(worker, None)

    def clear(self, worker):
        self.hold[worker] = {}

    def held_any(self, worker, c):
        return any(c in chains for chains in self.hold[worker].values())

    def exists(self, c):
        """The tree has the block: some worker holds it or a block under it."""
        n = len(c)
        return any(h[:n] == c for m in self.hold.values() for chains in m.values()
                   for h in chains)

    def engine_store(self, worker, prompt, lo, hi, medium):
        if lo > 0 and not self.held_any(worker, chain(prompt, lo)):
            self.drops[worker] += hi - lo  # unknown parent
            return
        held = self.hold[worker].setdefault(medium, set())
        for k in range(lo + 1, hi + 1):
            held.add(chain(prompt, k))

    def keyed_store(self, worker, prompt, lo, hi, medium):
        for k in range(lo + 1, hi + 1):
            c = chain(prompt, k)
            if self.exists(c):
                self.hold[worker].setdefault(medium, set()).add(c)
            else:
                self.drops[worker] += 1  # unknown hash

    def remove(self, worker, prompt, blocks, medium):
        held = self.hold[worker].get(medium, set())
        for b in blocks:
            held.discard(chain(prompt, b + 1))

    def run(self, worker, prompt, medium=None):
        """Longest prefix of whole blocks `worker` holds (in `medium`, or in
        any medium block by block)."""
        n = 0
        while n < len(prompt) // BS:
            c = chain(prompt, n + 1)
            if not (self.held_any(worker, c) if medium is None
                    else c in self.hold[worker].get(medium, ())):
                break
            n += 1
        return n

    # ---- what each front door must answer ----

    def route(self, prompt):
        out = {}
        for w, media in self.hold.items():
            per = {m: self.run(w, prompt, m) for m in media}
            out[w] = (self.run(w, prompt), {m: n for m, n in per.items() if n > 0})
        return out

    def query(self, prompt):
        inst = {}
        for w, (matched, per) in self.route(prompt).items():
            instance, rank = self.labels[w]
            e = inst.setdefault(instance, {"longest_matched": 0, "GPU": 0, "CPU": 0,
                                           "DISK": 0, "DP": {}})
            e["longest_matched"] = max(e["longest_matched"], matched * BS)
            for m, n in per.items():
                e[m] = max(e.get(m, 0), n * BS)
            e["DP"][str(rank)] = max(e["DP"].get(str(rank), 0), matched * BS)
        return {"default": inst} if inst else {}

    def match_prefix(self, prompt, family):
        """MatchExternalKvPrefix by `family`'s hashes of `prompt`: worker ->
        blocks, for the workers with an address and a matched block."""
        named = 0  # blocks whose hash some worker of the family holds
        while named < len(prompt) // BS and any(
                self.family[w] == family and self.held_any(w, chain(prompt, named + 1))
                for w in self.hold):
            named += 1
        out = {}
        for w in self.hold:
            n = min(named, self.run(w, prompt))
            if n > 0 and self.address[w]:
                out[w] = n
        return out

    def medium_blocks(self, worker):
        return {m: len(c) for m, c in self.hold[worker].items() if c}


FAMILY_HASHES = {
    "sglang": lambda p: [sglang_hash(chain(p, k + 1)) for k in range(len(p) // BS)],
    "vllm": lambda p: [signed(vllm_hash(chain(p, k + 1))) for k in range(len(p) // BS)],
    "keys": lambda p: [signed(h) for h in conductor_hashes(p)],
}


# ---- the publishers ----

class Engine:
    """One publisher and its worker in the model. family: "sglang" and
    "vllm" publish BlockStored/BlockRemoved with their engine hashes and
    token ids; "keys" (the Mooncake store) publishes RFC #1527 events."""

    def __init__(self, name, family, pub, instance, rank, address):
        self.name = name
        self.family = family
        self.pub = pub
        self.instance = instance
        self.rank = rank
        self.address = address
        self.worker = None  # its worker's name, once the index lists it
        self.log = []       # the store's ops, in order (replayed after a daemon restart)

    def hash(self, c):
        return sglang_hash(c) if self.family == "sglang" else vllm_hash(c)

    def stored(self, model, prompt, lo, hi, medium):
        """An event storing blocks lo..hi-1 of `prompt` (and its effect on
        the model)."""
        if self.family == "keys":
            self.log.append(("stored", prompt, lo, hi, medium))
            model.keyed_store(self.worker, prompt, lo, hi, medium.upper())
            keys = conductor_hashes(prompt[:hi * BS])
            return {"event_type": "stored", "model_name": MODEL, "block_size": BS,
                    "tenant_id": "default", "backend_id": self.instance, "medium": medium,
                    "dp_rank": self.rank, "seq_hashes": keys[lo:hi], "base_block_idx": lo,
                    "parent_hash": keys[lo - 1] if lo > 0 else None, "token_ids": None}
        model.engine_store(self.worker, prompt, lo, hi, medium)
        hashes = [self.hash(chain(prompt, k + 1)) for k in range(lo, hi)]
        parent = self.hash(chain(prompt, lo)) if lo > 0 else None
        return kvp.block_stored(hashes, parent, prompt[lo * BS:hi * BS], BS, medium=medium)

    def removed(self, model, prompt, blocks, medium):
        if self.family == "keys":
            self.log.append(("removed", prompt, blocks, medium))
            model.remove(self.worker, prompt, blocks, medium.upper())
            keys = conductor_hashes(prompt)
            return {"event_type": "removed", "model_name": MODEL, "block_size": BS,
                    "tenant_id": "default", "backend_id": self.instance, "medium": medium,
                    "dp_rank": self.rank, "seq_hashes": [keys[b] for b in blocks]}
        model.remove(self.worker, prompt, blocks, medium)
        return kvp.block_removed([self.hash(chain(prompt, b + 1)) for b in blocks],
                                 medium=medium)

    def replay_log(self, model):
        """The store's events once more, in order, against the model as it is
        (what the index does with its replay after a daemon restart)."""
        model.clear(self.worker)
        for op in self.log:
            if op[0] == "stored":
                model.keyed_store(self.worker, op[1], op[2], op[3], op[4].upper())
            else:
                model.remove(self.worker, op[1], op[2], op[3].upper())


def sglang_publisher(rank, endpoint="tcp://127.0.0.1:*", replay="tcp://127.0.0.1:*"):
    return kvp.Publisher(endpoint, replay, encoding="array", hash_kind="int64",
                         replay_framing="seq", data_parallel_rank=rank, bind=True)


def rebind(old, rank):
    """sg1's new process: a new publisher on the old one's ports (retried
    while the old sockets let go of them)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return sglang_publisher(rank, old.endpoint, old.replay_endpoint)
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class ReplayGate:
    """Holds a publisher's replay answers until opened: its replay thread
    waits here before reading the buffer."""

    def __init__(self, pub):
        self.open = threading.Event()
        self.open.set()
        buffered = pub._buffered

        def gated():
            self.open.wait(DEADLINE_S)
            return buffered()
        pub._buffered = gated


# ---- the test ----

# What ends the run as an error (the daemon's logs say why).
RUN_ERRORS = (prefixd_fixture.DaemonFailed, OSError, grpc.RpcError, ValueError, KeyError,
              TypeError)


class FrontDoorsScenario(unittest.TestCase):
    def setUp(self):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        self.tmp = tempfile.mkdtemp(prefix="prefixd-scenario-")
        self.http_port = None  # the Conductor API's, picked at each start
        self.daemon = None
        self.channel = None
        self.model = Model()
        self.sg0 = Engine("sg0", "sglang", sglang_publisher(0), "sglang-a", 0, "10.0.0.1:30000")
        self.sg1 = Engine("sg1", "sglang", sglang_publisher(1), "sglang-a", 1, "10.0.0.2:30000")
        self.vllm = Engine("vllm", "vllm",
                           kvp.Publisher(encoding="map", hash_kind="int",
                                         replay_framing="topic"),
                           "vllm-b", 0, "10.0.0.3:8000")
        self.store = Engine("store", "keys", kvp.Publisher(encoding="array"), "store-0", 0,
                            "10.0.0.4:9000")
        self.engines = [self.sg0, self.sg1, self.vllm, self.store]
        self.gate = ReplayGate(self.store.pub)
        self.addCleanup(self.close)

    def config(self):
        sources = "".join(
            'sources { name: "%s" endpoint: "%s" replay_endpoint: "%s" type: "SGLang" '
            'instance_id: "%s" dp_rank: %d model: "%s" address: "%s" }\n'
            % (e.name, e.pub.endpoint, e.pub.replay_endpoint, e.instance, e.rank, MODEL,
               e.address) for e in (self.sg0, self.sg1))
        return ('index {\n  block_size: %d\n  replay_timeout: "%ds"\n'
                '  state_dir: "%s"\n%s}\n'
                % (BS, DEADLINE_S, os.path.join(self.tmp, "state"), sources))

    # ---- plumbing ----

    def start_daemon(self):
        self.daemon = prefixd_fixture.Daemon(ARGS.prefixd, self.config(), snapshot=False,
                                             tmp=self.tmp, index_http="127.0.0.1").start()
        self.http_port = self.daemon.index_http_port
        self.channel = grpc.insecure_channel(self.daemon.tcp)
        self.index = pb_grpc.PrefixIndexStub(self.channel)
        self.kvi = kv_grpc.KVIndexerStub(self.channel)

    def post(self, path, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=TIMEOUT)
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read()
        conn.close()
        return resp.status, json.loads(text)

    def workers(self):
        return {w.worker: w for w in
                self.index.ListWorkers(pb.ListWorkersRequest(), timeout=TIMEOUT).workers}

    def wait(self, cond, what):
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if cond(self.workers()):
                return
            time.sleep(0.02)
        self.fail("%s: timed out; workers: %s" % (what, {
            n: (pb.WorkerState.Name(w.state), w.last_seq, w.state_detail)
            for n, w in self.workers().items()}))

    def caught_up(self, ws, *engines):
        for e in engines:
            w = ws.get(e.worker)
            if w is None or w.state != pb.LIVE or w.last_seq != e.pub.last_seq:
                return False
        return True

    def publish(self, engine, events):
        engine.pub.publish(events)

    def register(self, e):
        body = {"endpoint": e.pub.endpoint, "replay_endpoint": e.pub.replay_endpoint,
                "type": "Mooncake" if e.family == "keys" else "vLLM", "modelname": MODEL,
                "lora_name": None, "tenant_id": "default", "instance_id": e.instance,
                "block_size": BS, "dp_rank": e.rank}
        status, answer = self.post("/register", body)
        self.assertTrue(status == 200 and answer.get("instance_id") == e.instance,
                        "/register %s (%s): %s" % (e.name, body["type"], (status, answer)))
        return body

    def configure_addresses(self, engines):
        r = self.kvi.ConfigureExpectedWorkers(kv.ConfigureExpectedWorkersRequest(workers=[
            kv.ExpectedWorker(worker_id=e.worker, worker_address=e.address) for e in engines]),
            timeout=TIMEOUT)
        self.assertEqual(r.total_workers, len(engines),
                         "ConfigureExpectedWorkers gives %s their addresses"
                         % ", ".join(e.worker for e in engines))
        for e in engines:
            self.model.address[e.worker] = e.address

    # ---- the comparison after every step ----

    def answers(self, prompt):
        """What the four front doors answer for `prompt`."""
        # Every worker, matched or not, as the model lists them.
        r = self.index.Route(pb.RouteRequest(tokens=prompt, all_workers=True),
                             timeout=TIMEOUT)
        route = {m.worker: (m.matched_blocks, {x.medium: x.matched_blocks for x in m.mediums})
                 for m in r.workers}
        _, query = self.post("/query", {"model": MODEL, "lora_name": None, "token_ids": prompt,
                                        "tenant_id": "default", "block_size": BS})
        _, by_hash = self.post("/query_by_hash", {"model": MODEL, "block_size": BS,
                                                  "seq_hashes": conductor_hashes(prompt)})
        prefix = {}
        for family, hashes in FAMILY_HASHES.items():
            m = self.kvi.MatchExternalKvPrefix(
                kv.MatchExternalKvPrefixRequest(hashes=hashes(prompt)), timeout=TIMEOUT)
            prefix[family] = [(x.worker_id, x.worker_address, x.matched_prefix_blocks)
                              for x in m.matches]
        return route, query, by_hash, prefix

    def agree(self, step):
        model = self.model
        bad = collections.defaultdict(list)
        nonzero = set()
        for name, p in PROMPTS.items():
            route, query, by_hash, prefix = self.answers(p)
            want_route = model.route(p)
            nonzero.update(w for w, (n, _) in want_route.items() if n > 0)
            if route != want_route:
                bad["Route"].append((name, route, want_route))
            want_query = model.query(p)
            if query != want_query:
                bad["/query"].append((name, query, want_query))
            if by_hash != want_query:
                bad["/query_by_hash"].append((name, by_hash, want_query))
            for family in FAMILY_HASHES:
                want = model.match_prefix(p, family)
                want = [(w, model.address[w], n)
                        for w, n in sorted(want.items(), key=lambda x: (-x[1], x[0]))]
                if prefix[family] != want:
                    bad["MatchExternalKvPrefix"].append((name, family, prefix[family], want))
        ws = self.workers()
        listed = {w: {m.medium: m.blocks for m in ws[w].mediums if m.blocks}
                  for w in ws}
        want_listed = {w: model.medium_blocks(w) for w in model.hold}
        self.assertGreaterEqual(len(nonzero), 2, "%s: the model expects matches (%s)"
                                % (step, sorted(nonzero)))
        with self.subTest(door="ListWorkers"):
            self.assertEqual(listed, want_listed, "%s: ListWorkers lists the model's workers and "
                             "their blocks per medium" % step)
        for door in ("Route", "/query", "/query_by_hash", "MatchExternalKvPrefix"):
            with self.subTest(door=door):
                self.assertTrue(not bad[door], "%s: %s agrees with the model on %d prompts\n%s"
                                % (step, door, len(PROMPTS),
                                   "\n      ".join(map(str, bad[door][:3]))))

    # ---- the steps ----

    def setup_fleet(self):
        self.start_daemon()
        for e in (self.sg0, self.sg1):
            self.assertTrue(e.pub.wait_for_subscriber(DEADLINE_S),
                            "the daemon subscribes to %s" % e.name)
        self.vllm_body = self.register(self.vllm)
        self.register(self.store)
        for e in (self.vllm, self.store):
            self.assertTrue(e.pub.wait_for_subscriber(DEADLINE_S),
                            "the daemon subscribes to %s" % e.name)
        self.wait(lambda ws: len(ws) == 4 and all(w.state == pb.LIVE for w in ws.values()),
                  "four LIVE workers")
        by_endpoint = {w.endpoint: n for n, w in self.workers().items()}
        for e in self.engines:
            e.worker = by_endpoint.get(e.pub.endpoint)
            self.model.add_worker(e.worker, e.family, e.instance, e.rank,
                                  e.address if e.family == "sglang" else "")
        ws = self.workers()
        self.assertTrue(all(e.worker is not None for e in self.engines)
                        and ws[self.sg1.worker].labels.instance_id == "sglang-a"
                        and ws[self.sg1.worker].labels.dp_rank == 1
                        and ws[self.sg1.worker].labels.address == self.sg1.address
                        and ws[self.store.worker].labels.hashes_are_keys,
                        "every publisher is a worker with its labels: %s"
                        % {e.name: e.worker for e in self.engines})
        self.configure_addresses([self.vllm, self.store])

    def step_stores(self):
        m, sg0, sg1, vllm, store = self.model, self.sg0, self.sg1, self.vllm, self.store
        self.publish(sg0, [sg0.stored(m, P_A, 0, 5, "GPU"), sg0.stored(m, P_B, 2, 4, "GPU")])
        self.publish(sg1, [sg1.stored(m, P_C, 0, 5, "GPU")])
        self.publish(sg1, [sg1.stored(m, P_D, 0, 3, "GPU")])
        self.publish(vllm, [vllm.stored(m, P_A, 0, 3, "GPU"), vllm.stored(m, P_B, 2, 4, "GPU")])
        self.wait(lambda ws: self.caught_up(ws, sg0, sg1, vllm), "step 1: the engines' stores "
                  "are applied")
        # The store's keys name blocks the engines stored: after theirs.
        self.publish(store, [store.stored(m, P_A, 0, 5, "cpu"), store.stored(m, P_C, 0, 5, "disk"),
                             store.stored(m, P_D, 0, 3, "cpu")])
        self.wait(lambda ws: self.caught_up(ws, store), "step 1: the store's stores are applied")
        self.agree("step 1 (stores)")

    def step_removals(self):
        m, sg0, sg1, vllm, store = self.model, self.sg0, self.sg1, self.vllm, self.store
        # HiCache: blocks 3-4 of A move from GPU to host memory.
        self.publish(sg0, [sg0.stored(m, P_A, 3, 5, "CPU_PINNED"),
                           sg0.removed(m, P_A, [3, 4], "GPU"), sg0.removed(m, P_B, [2, 3], "GPU")])
        self.publish(sg1, [sg1.removed(m, P_D, [1, 2], "GPU")])
        self.publish(vllm, [vllm.removed(m, P_A, [2], "GPU")])
        self.publish(store, [store.removed(m, P_A, [4], "cpu"),
                             store.removed(m, P_C, [3, 4], "disk")])
        self.wait(lambda ws: self.caught_up(ws, *self.engines), "step 2: the removals are applied")
        self.agree("step 2 (removals)")

    def step_gap(self):
        m, sg0 = self.model, self.sg0
        before = self.workers()[sg0.worker]
        sg0.pub.drop_next(1)  # lost in transit; kept in the replay buffer
        self.publish(sg0, [sg0.stored(m, P_E, 0, 3, "GPU")])
        # The next batch extends the lost one's chain: applied before it, its
        # first event would be dropped as an unknown parent.
        self.publish(sg0, [sg0.stored(m, P_E, 3, 4, "GPU"), sg0.stored(m, P_C, 3, 5, "GPU")])
        self.assertEqual(sg0.pub.dropped, [sg0.pub.last_seq - 1], "step 3: sg0 lost a batch")
        self.wait(lambda ws: self.caught_up(ws, sg0) and ws[sg0.worker].gaps == before.gaps + 1
                  and ws[sg0.worker].replays > before.replays,
                  "step 3: the daemon sees the gap, replays it and is caught up")
        w = self.workers()[sg0.worker]
        self.assertEqual((w.clears, w.dropped_blocks), (before.clears, before.dropped_blocks),
                         "step 3: the replayed batch filled the gap (no clear, nothing dropped; "
                         "last_error %r)" % w.last_error)
        self.agree("step 3 (gap)")

    def step_engine_restart(self):
        m, sg1 = self.model, self.sg1
        before = self.workers()[sg1.worker]
        old = sg1.pub
        old.close()
        sg1.pub = rebind(old, sg1.rank)
        m.clear(sg1.worker)
        self.assertTrue(sg1.pub.wait_for_subscriber(DEADLINE_S),
                        "step 4: the daemon reconnects to sg1's new process")
        self.publish(sg1, [sg1.stored(m, P_C, 0, 3, "GPU")])
        self.publish(sg1, [sg1.stored(m, P_D, 0, 2, "GPU")])
        self.wait(lambda ws: self.caught_up(ws, sg1) and ws[sg1.worker].clears > before.clears,
                  "step 4: sg1 is cleared and follows the new stream (seq from 0)")
        self.agree("step 4 (engine restart)")

    def step_unregister(self):
        body = {k: self.vllm_body[k] for k in ("type", "modelname", "lora_name", "tenant_id",
                                               "instance_id", "block_size", "dp_rank")}
        status, answer = self.post("/unregister", body)
        self.assertTrue(status == 200 and answer.get("removed_instances") == [self.vllm.worker],
                        "step 5: /unregister removes vLLM's worker: %s" % ((status, answer),))
        self.model.remove_worker(self.vllm.worker)
        self.agree("step 5 (unregister)")

    def step_daemon_restart(self):
        self.channel.close()
        self.assertEqual(self.daemon.stop(), 0, "step 6: the daemon stops cleanly on SIGTERM")
        self.daemon.close()
        self.gate.open.clear()  # the store's replay waits for the engines'
        self.start_daemon()
        engines = (self.sg0, self.sg1)
        self.wait(lambda ws: self.caught_up(ws, *engines),
                  "step 6: the SGLang sources catch up from their replay buffers")
        ws = self.workers()
        self.assertEqual(sorted(ws), sorted([self.sg0.worker, self.sg1.worker, self.store.worker]),
                         "step 6: the store's registration is kept, vLLM's is not")
        self.gate.open.set()
        self.wait(lambda ws: self.caught_up(ws, self.store),
                  "step 6: the store catches up from its replay buffer")
        self.model.drops[self.store.worker] = 0
        self.store.replay_log(self.model)
        w = self.workers()[self.store.worker]
        self.assertEqual(w.dropped_blocks, self.model.drops[self.store.worker],
                         "step 6: the store's keys of blocks no engine holds any more are dropped "
                         "(%d)" % self.model.drops[self.store.worker])
        # ConfigureExpectedWorkers' addresses live in memory: the bridge gives
        # them again.
        self.configure_addresses([self.store])
        self.agree("step 6 (daemon restart)")

    def test_one_fleet_through_the_four_doors(self):
        for step in (self.setup_fleet, self.step_stores, self.step_removals, self.step_gap,
                     self.step_engine_restart, self.step_unregister, self.step_daemon_restart):
            finished = False
            with self.subTest(step=step.__name__):
                try:
                    step()
                except RUN_ERRORS as e:
                    logs = self.daemon.logs()[-3000:] if self.daemon is not None else ""
                    self.fail("the run completed: %s: %s\n%s" % (type(e).__name__, e, logs))
                finished = True
            if not finished:
                break  # the next steps build on this one

    def close(self):
        self.gate.open.set()
        for e in self.engines:
            e.pub.close()
        if self.channel is not None:
            self.channel.close()
        if self.daemon is not None:
            self.daemon.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


if __name__ == "__main__":
    common.unittest_main()
