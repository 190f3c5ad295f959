#!/usr/bin/python3
"""End to end: prefixd's metrics as a real Prometheus sees them.

Starts the real prefixd binary and a real Prometheus (Debian's `prometheus`)
on free ports; Prometheus scrapes the daemon every second and loads
deploy/prometheus/alerts.yml. Drives a workload whose counts are known
(workload.py) through Python gRPC stubs generated at test time, waits for a
scrape taken after the workload, then asks Prometheus' HTTP API:

  - every counter of docs/metrics.md has the exact expected value, per
    tenant and reason (prefixd_rpc_* per method and code included);
  - every gauge has the expected value;
  - every PromQL expression of deploy/grafana/prefixd.json parses and returns
    data ($__rate_interval -> 1m, template variables -> .*);
  - every alert rule was loaded and evaluated without error, and its
    expression, with comparisons made `bool` so that thresholds do not
    filter, parses and returns data.

When the daemon has the fleet index (`--index_source` in its --help), it also
runs it (docs/index.md): the test plays a vLLM engine's KV-event publisher
(a ZeroMQ PUB socket and a replay ROUTER socket, msgpack batches as vLLM
encodes them); after the index's catch-up replay on connecting, it publishes
batches with a lost one that the index must replay, an AllBlocksCleared and
a new chain, Routes prompts, and checks the Route answers and the exact
prefixd_index_* values. Without the index, the
dashboard's and rules' index expressions are only checked to parse.

Exits 77 (skip) only when /usr/bin/prometheus is absent.

Usage: prometheus_e2e_test.py --prefixd PATH --repo DIR [unittest args]
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

import harness
import common  # tests/python/common.py, on the path harness sets
import workload

ARGS = None

SCRAPE_TIMEOUT_S = 60
RULES_TIMEOUT_S = 60


def scalar_value(prom, expr):
    r = prom.query(expr)
    result = r.get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else None


def dashboard_queries(path):
    """(where, expr) for every panel target and template variable query."""
    with open(path) as f:
        dash = json.load(f)
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append(("panel %r %s" % (p["title"], t["refId"]), t["expr"]))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append(("variable %s" % v["name"], q))
    return out


def substitute(expr):
    expr = expr.replace("$__rate_interval", "1m").replace("${__rate_interval}", "1m")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def boolify(expr):
    """Turns every comparison outside label matchers and strings into a
    `bool` comparison, so that the expression returns its series whatever
    their values (an alert that is not firing still returns data)."""
    out, depth, quote, i = [], 0, None, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(expr[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
            out.append(c)
        elif c == "{":
            depth += 1
            out.append(c)
        elif c == "}":
            depth -= 1
            out.append(c)
        elif depth == 0 and c in "=!<>":
            op = expr[i:i + 2] if expr[i:i + 2] in ("==", "!=", ">=", "<=") else c
            if op in ("=", "!"):  # not a comparison (e.g. =~ cannot appear here)
                out.append(c)
            else:
                rest = expr[i + len(op):]
                out.append(op if re.match(r"\s*bool\b", rest) else op + " bool")
                i += len(op) - 1
        else:
            out.append(c)
        i += 1
    return "".join(out)


def label_values_query(expr):
    """label_values(q, label) (a Grafana function) -> (q, label)."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", expr, re.S)
    return (m.group(1), m.group(2)) if m else (expr, None)


INDEX_METRICS = "prefixd_index_"
# Families a daemon has only when its config names their sources (the
# engines' /metrics, SGLang's load sockets and workers by URL,
# index.pick.engine_metrics, engine_load_sockets, sources with a
# server_info_url, and pools), which this test's daemon does not: a
# dashboard expression or an alert rule over them is only checked to parse
# (tests/index/test_pool_dns.py reads the pools' on a real daemon).
CONFIGURED_METRICS = ("prefixd_index_engine_scrapes_total",
                      "prefixd_index_engine_load_messages_total",
                      "prefixd_index_sglang_server_info_reads_total",
                      "prefixd_index_pool_")


# ---- the fleet index (docs/index.md) ----------------------------------------

INDEX_BLOCK_SIZE = 16
INDEX_MAX_ENTRIES = 1000
INDEX_WORKER = "vllm-0"
INDEX_TIMEOUT_S = 30


def index_supported(prefixd):
    r = subprocess.run([prefixd, "--help"], capture_output=True, text=True, timeout=30)
    return "index_source" in r.stdout + r.stderr


def index_config(engine):
    return """
index {
  block_size: %d
  max_entries: %d
  sources { name: "%s" endpoint: "tcp://127.0.0.1:%d" replay_endpoint: "tcp://127.0.0.1:%d" }
}
""" % (INDEX_BLOCK_SIZE, INDEX_MAX_ENTRIES, INDEX_WORKER, engine.pub_port, engine.replay_port)


class FakeVllmPublisher:
    """A vLLM engine's KV-event publisher, as --kv-events-config with
    publisher zmq, a wildcard endpoint and a replay_endpoint sets it up: a
    bound PUB socket sending [topic, seq (8 bytes big-endian), msgpack
    payload], and a ROUTER socket that answers a start sequence number with
    every buffered (seq, payload) from there, then seq -1. The PUB is an
    XPUB so the test sees prefixd subscribe before it publishes (no
    slow-joiner loss). A batch can be "lost": buffered for replay, never
    published."""

    TOPIC = b"kv@vllm-0@llama-3-8b"

    def __init__(self, zmq, msgpack):
        self.zmq, self.msgpack = zmq, msgpack
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.replay = self.ctx.socket(zmq.ROUTER)
        self.replay_port = self.replay.bind_to_random_port("tcp://127.0.0.1")
        self.buffer = {}  # seq -> payload
        self.lock = threading.Lock()
        self.replay_requests = []  # start sequence numbers asked for
        self.next_seq = 0
        self.running = True
        self.thread = threading.Thread(target=self._serve_replay, daemon=True)
        self.thread.start()

    def wait_subscribed(self, timeout_s):
        if not self.pub.poll(int(timeout_s * 1000)):
            raise TimeoutError("prefixd did not subscribe to the fake engine's events "
                               "within %ss" % timeout_s)
        self.pub.recv()  # b"\x01" + the topic prefix

    @staticmethod
    def stored(hashes, parent, tokens):
        # vLLM's BlockStored, array-like, omit_defaults: block_hashes,
        # parent_block_hash, token_ids, block_size, lora_id, medium, lora_name.
        return ["BlockStored", hashes, parent, tokens, INDEX_BLOCK_SIZE, None, "GPU", None]

    def publish(self, events, lost=False):
        seq = self.next_seq
        self.next_seq += 1
        payload = self.msgpack.packb([time.time(), events], use_bin_type=True)
        with self.lock:
            self.buffer[seq] = payload
        if not lost:
            self.pub.send_multipart([self.TOPIC, seq.to_bytes(8, "big"), payload])
        return seq

    def _serve_replay(self):
        while self.running:
            if not self.replay.poll(50):
                continue
            frames = self.replay.recv_multipart()
            envelope, start = frames[:-1], int.from_bytes(frames[-1], "big", signed=True)
            self.replay_requests.append(start)
            with self.lock:
                batches = sorted((s, p) for s, p in self.buffer.items() if s >= start)
            for seq, payload in batches:
                self.replay.send_multipart(envelope + [seq.to_bytes(8, "big"), payload])
            self.replay.send_multipart(envelope + [(-1).to_bytes(8, "big", signed=True), b""])

    def close(self):
        self.running = False
        self.thread.join(5)
        self.pub.close(0)
        self.replay.close(0)
        self.ctx.term()


def load_index_stubs(proto_dir, out_dir):
    """prefix_index_pb2(_grpc), generated next to harness.load_stubs' output."""
    import importlib
    subprocess.run(
        harness.protoc_command(proto_dir, out_dir)
        + [os.path.join(proto_dir, "prefixd", "v1", "prefix_index.proto")],
        check=True)
    return (importlib.import_module("prefixd.v1.prefix_index_pb2"),
            importlib.import_module("prefixd.v1.prefix_index_pb2_grpc"))


class IndexClient:
    """PrefixIndex calls, counted in the cache client's call and error
    counters (in case prefixd_rpc_* counts the index's methods too)."""

    def __init__(self, grpc_module, pb2, pb2_grpc, channel, counted):
        self.grpc, self.pb2, self.counted = grpc_module, pb2, counted
        self.stub = pb2_grpc.PrefixIndexStub(channel)

    def call(self, method, request):
        self.counted.calls[method] += 1
        try:
            return getattr(self.stub, method)(request, timeout=10)
        except self.grpc.RpcError as e:
            self.counted.errors[(method, e.code().name)] += 1
            raise

    def route(self, tokens):
        return self.call("Route", self.pb2.RouteRequest(tokens=tokens))

    def worker(self):
        r = self.call("ListWorkers", self.pb2.ListWorkersRequest())
        return {w.worker: w for w in r.workers}.get(INDEX_WORKER)

    def wait_live(self, what, last_seq=None, replays=None):
        live = self.pb2.WorkerState.Value("LIVE")

        def ready():
            w = self.worker()
            if w is None or w.state != live:
                return None
            if last_seq is not None and w.last_seq != last_seq:
                return None
            if replays is not None and w.replays != replays:
                return None
            return w
        return harness.wait_for("index worker %s LIVE (%s)" % (INDEX_WORKER, what),
                                ready, INDEX_TIMEOUT_S, 0.05)


def run_index_workload(engine, index):
    """Plays the engine's side. Returns the prefixd_index_* values the
    workload implies, and what the index answered on the way, by step
    (test_index_answers checks it)."""
    toks = workload.toks
    seen = {}
    engine.wait_subscribed(INDEX_TIMEOUT_S)
    # On connecting, the index first replays what the engine buffers (here
    # nothing yet): one replay, ok.
    w = index.wait_live("after its catch-up replay", replays=1)
    seen["catch-up"] = (list(engine.replay_requests), w)
    # Batches 0 and 1: a chain of 3 blocks (tokens 0..47) from the root.
    engine.publish([engine.stored([101, 102], None, toks(0, 32))])
    s = engine.publish([engine.stored([103], 102, toks(32, 16))])
    index.wait_live("a 3-block chain", last_seq=s)
    # Route 1: 4 prompt blocks, the worker holds the first 3.
    seen["route 3 of 4"] = index.route(toks(0, 64))
    # Batch 2 is lost (only in the replay buffer); batch 3 reveals the gap,
    # and the index must replay 2 before applying 3.
    engine.publish([engine.stored([104], 103, toks(48, 16))], lost=True)
    s = engine.publish([engine.stored([105], 104, toks(64, 16))])
    w = index.wait_live("the gap replayed", last_seq=s, replays=2)
    seen["gap"] = (list(engine.replay_requests), w)
    # Route 2: all 5 blocks, block 4 from the replay.
    seen["route after the replay"] = index.route(toks(0, 80))
    # Batch 4: AllBlocksCleared; batch 5: a new chain of 3 blocks.
    engine.publish([["AllBlocksCleared"]])
    s = engine.publish([engine.stored([201, 202, 203], None, toks(0, 48))])
    index.wait_live("cleared, then a new chain", last_seq=s)
    # Route 3: 2 whole blocks (+8 tokens), both held. Route 4: nobody.
    seen["route 2 of 2"] = index.route(toks(0, 40))
    seen["route unknown"] = index.route(toks(1000, 32))

    def of(**labels):  # the label tuple check_values compares (sorted, no instance/job)
        return tuple(sorted(dict(labels, worker=INDEX_WORKER).items()))
    expected = {
        ("prefixd_index_events_total", of(type="BlockStored")): 5,
        ("prefixd_index_events_total", of(type="BlockRemoved")): 0,
        ("prefixd_index_events_total", of(type="AllBlocksCleared")): 1,
        ("prefixd_index_events_total", of(type="unknown")): 0,
        ("prefixd_index_gaps_total", of()): 1,
        ("prefixd_index_replays_total", of(result="ok")): 2,  # catch-up, gap
        ("prefixd_index_replays_total", of(result="failed")): 0,
        ("prefixd_index_clears_total", of(reason="all_blocks_cleared")): 1,
        ("prefixd_index_clears_total", of(reason="restart")): 0,
        ("prefixd_index_clears_total", of(reason="replay_failed")): 0,
        ("prefixd_index_clears_total", of(reason="undecodable")): 0,
        ("prefixd_index_clears_total", of(reason="block_size")): 0,
        ("prefixd_index_blocks", of(medium="GPU")): 3,
        ("prefixd_index_entries", ()): 3,
        ("prefixd_index_max_entries", ()): INDEX_MAX_ENTRIES,
        ("prefixd_index_route_requests_total", ()): 4,
        ("prefixd_index_route_prompt_blocks_total", ()): 4 + 5 + 2 + 2,
        ("prefixd_index_route_matched_blocks_total", ()): 3 + 5 + 2 + 0,
    }
    for state in ("CONNECTING", "LIVE", "REPLAYING", "ERROR"):
        expected[("prefixd_index_worker_state", of(state=state))] = 1 if state == "LIVE" else 0
    return expected, seen


# ---- the test ----------------------------------------------------------------

class PrometheusE2ETest(unittest.TestCase):
    """One run of the daemon, Prometheus and the workload (setUpClass);
    each test asks Prometheus about one part of it."""

    @classmethod
    def setUpClass(cls):
        harness.skip_unless(harness.PROMETHEUS)
        import grpc  # Debian's python3-grpcio
        tmp = tempfile.mkdtemp(prefix="prefixd-metrics-e2e-")
        cls.addClassCleanup(shutil.rmtree, tmp, True)
        pb2, pb2_grpc = harness.load_stubs(os.path.join(ARGS.repo, "proto"),
                                           os.path.join(tmp, "gen"))
        cls.index_on = index_supported(ARGS.prefixd)
        cls.engine = None
        config = workload.CONFIG
        if cls.index_on:
            import msgpack  # Debian's python3-msgpack
            import zmq  # Debian's python3-zmq
            cls.engine = FakeVllmPublisher(zmq, msgpack)
            config += index_config(cls.engine)
        else:
            print("note  this prefixd has no fleet index (no --index_source): "
                  "index expressions are only checked to parse")
        cls.started = time.time()
        cls.daemon = harness.Daemon(ARGS.prefixd, tmp, config)
        cls.prom = None
        cls.client = harness.Client(grpc, pb2, pb2_grpc, cls.daemon.grpc_address)
        try:
            cls.run_workload(tmp, grpc)
        except Exception:
            print("--- prefixd log ---\n" + cls.daemon.log())
            if cls.prom:
                print("--- prometheus log ---\n" + cls.prom.log()[-4000:])
            cls.stop()
            raise

    @classmethod
    def run_workload(cls, tmp, grpc):
        """Drives the workload and waits for a scrape taken after it."""
        daemon, client = cls.daemon, cls.client
        cls.info = daemon.wait_ready(client)
        prom = cls.prom = harness.Prometheus(
            tmp, ["127.0.0.1:%d" % daemon.metrics_port],
            [os.path.join(ARGS.repo, "deploy", "prometheus", "alerts.yml")])
        prom.wait_ready()
        harness.wait_for("Prometheus scrapes prefixd",
                         lambda: scalar_value(prom, 'up{job="prefixd"}') == 1, SCRAPE_TIMEOUT_S)

        workload.phase1(client)
        harness.wait_for(
            "a scrape shows both tenants",
            lambda: scalar_value(prom, 'sum(prefixd_match_requests_total{tenant=~"acme|beta"})') == 2,
            SCRAPE_TIMEOUT_S)

        cls.index_expected, cls.index_seen = {}, {}
        if cls.index_on:
            ipb2, ipb2_grpc = load_index_stubs(os.path.join(ARGS.repo, "proto"),
                                               os.path.join(tmp, "gen"))
            index = IndexClient(grpc, ipb2, ipb2_grpc, client.channel, client)
            cls.index_expected, cls.index_seen = run_index_workload(cls.engine, index)
            index_done = time.time()
            # rate() in the dashboard needs two scrapes of the new series.
            harness.wait_for("two scrapes after the index workload",
                             lambda: (scalar_value(prom, "timestamp(prefixd_build_info)") or 0)
                             > index_done + 1.05, SCRAPE_TIMEOUT_S)

        workload.phase2(client)
        workload.wait_for_lease_expiry(client, harness.wait_for)
        final = client.call("Stats", tenant="acme")
        cls.acme_nodes = [t.tree_nodes for t in final.tenants if t.tenant == "acme"][0]
        done = time.time()
        # The newest scrape must have started after the last call.
        harness.wait_for("a scrape taken after the workload",
                         lambda: (scalar_value(prom, "timestamp(prefixd_build_info)") or 0) > done + 0.01,
                         SCRAPE_TIMEOUT_S)

    @classmethod
    def stop(cls):
        """Stops everything; prefixd's exit code."""
        cls.client.close()
        if cls.prom:
            cls.prom.stop()
        rc = cls.daemon.stop()
        if cls.engine:
            cls.engine.close()
        return rc

    @classmethod
    def tearDownClass(cls):
        rc = cls.stop()
        if rc != 0:
            raise AssertionError("prefixd exits 0 on SIGTERM: exit %s\n%s" % (rc, cls.daemon.log()))

    # ---- asking Prometheus ----

    def series(self, name):
        """{labels without instance/job: float value} of the latest samples."""
        r = self.prom.query('{__name__="%s"}' % name)
        self.assertEqual(r.get("status"), "success", "query %s: %s" % (name, r))
        out = {}
        for s in r["data"]["result"]:
            labels = tuple(sorted((k, v) for k, v in s["metric"].items()
                                  if k not in ("__name__", "instance", "job")))
            out[labels] = float(s["value"][1])
        return out

    def check_values(self, expected, what):
        by_name = {}
        for (name, labels), value in sorted(expected.items()):
            if name not in by_name:
                by_name[name] = self.series(name)
            with self.subTest(name=name, labels=dict(labels)):
                self.assertEqual(by_name[name].get(labels), value,
                                 "%s %s%s = %s" % (what, name, dict(labels), value))

    # ---- the values ----

    def test_counters(self):
        self.check_values(workload.expected_counters(), "counter")

    def test_gauges(self):
        gauges = workload.expected_gauges(self.info.version)
        gauges[("prefixd_tree_nodes", (("tenant", "acme"),))] = self.acme_nodes
        self.check_values(gauges, "gauge")

    def test_tenant_label(self):
        tenants = set(dict(k).get("tenant") for k in self.series("prefixd_cached_blocks"))
        self.assertEqual(tenants, {"acme", "beta"}, "tenant label: exactly the tenants used")

    def test_rpc_metrics(self):
        client = self.client
        errors = self.series("prefixd_rpc_errors_total")
        self.assertEqual(len(errors), 26 * 16,
                         "prefixd_rpc_errors_total: 26 methods x 16 codes pre-created")
        wrong = {}
        for labels, value in errors.items():
            d = dict(labels)
            want = client.errors.get((d["method"], d["code"]), 0)
            if value != want:
                wrong[labels] = (value, want)
        self.assertEqual(wrong, {}, "prefixd_rpc_errors_total equals the errors the client saw "
                         "(%s)" % dict(client.errors))
        counts = self.series("prefixd_rpc_duration_seconds_count")
        inf = {k: v for k, v in self.series("prefixd_rpc_duration_seconds_bucket").items()
               if dict(k)["le"] == "+Inf"}
        for labels, value in sorted(counts.items()):
            method = dict(labels)["method"]
            with self.subTest(method=method):
                self.assertEqual(value, client.calls.get(method, 0),
                                 "prefixd_rpc_duration_seconds_count{method=%s} = %d"
                                 % (method, client.calls.get(method, 0)))
                self.assertEqual(inf.get(tuple(sorted(labels + (("le", "+Inf"),)))), value,
                                 "prefixd_rpc_duration_seconds_bucket{method=%s,le=+Inf} = _count"
                                 % method)
        self.assertGreaterEqual(set(dict(k)["method"] for k in counts), set(client.calls),
                                "a duration series for every method called")

    def test_index_values(self):
        if not self.index_on:
            return  # said in setUpClass
        self.check_values(self.index_expected, "index")

    def test_index_answers(self):
        """What the index answered while the engine published (run_index_workload)."""
        if not self.index_on:
            return  # said in setUpClass
        seen = self.index_seen
        requests, w = seen["catch-up"]
        self.assertTrue(requests == [0] and w.last_seq == -1,
                        "on connecting, the index asked the replay socket for everything from "
                        "seq 0: %s" % ((requests, w),))
        r = seen["route 3 of 4"]
        self.assertTrue(r.best_worker == INDEX_WORKER and r.prompt_blocks == 4
                        and r.block_size == 16
                        and [(w.worker, w.matched_blocks) for w in r.workers]
                        == [(INDEX_WORKER, 3)]
                        and [(m.medium, m.matched_blocks) for m in r.workers[0].mediums]
                        == [("GPU", 3)],
                        "Route: %s holds 3 of 4 prompt blocks, on GPU: %s" % (INDEX_WORKER, r))
        requests, w = seen["gap"]
        self.assertEqual(requests, [0, 2], "on the gap, the index asked for seq 2 on")
        self.assertTrue(w.gaps == 1 and w.clears == 0, "ListWorkers: 1 gap, no clear: %s" % w)
        r = seen["route after the replay"]
        self.assertTrue(r.best_worker == INDEX_WORKER and r.prompt_blocks == 5
                        and r.workers[0].matched_blocks == 5,
                        "Route after the replay: all 5 blocks (the lost one replayed): %s" % r)
        r = seen["route 2 of 2"]
        self.assertTrue(r.prompt_blocks == 2 and r.workers[0].matched_blocks == 2,
                        "Route: 2 of 2 blocks: %s" % r)
        r = seen["route unknown"]
        self.assertTrue(r.best_worker == "" and r.prompt_blocks == 2 and not r.workers,
                        "Route of an unknown prompt: no best worker, no worker listed: %s" % r)

    def test_process(self):
        prom = self.prom
        rss = scalar_value(prom, "process_resident_memory_bytes")
        vms = scalar_value(prom, "process_virtual_memory_bytes")
        self.assertTrue(rss is not None and rss > 1 << 20,
                        "process_resident_memory_bytes > 1 MiB: %s" % rss)
        self.assertTrue(vms is not None and rss is not None and vms >= rss,
                        "process_virtual_memory_bytes >= resident: %s" % vms)
        start = scalar_value(prom, "process_start_time_seconds")
        self.assertTrue(start is not None and self.started - 5 <= start <= time.time(),
                        "process_start_time_seconds is when prefixd started: %s vs %s"
                        % (start, self.started))
        cpu = scalar_value(prom, "process_cpu_seconds_total")
        self.assertTrue(cpu is not None and cpu >= 0, "process_cpu_seconds_total: %s" % cpu)
        fds = scalar_value(prom, "process_open_fds")
        max_fds = scalar_value(prom, "process_max_fds")
        self.assertTrue(fds is not None and max_fds is not None and 0 < fds < max_fds,
                        "0 < process_open_fds < process_max_fds: %s %s" % (fds, max_fds))

    def test_hit_rate_promql(self):
        hit_rate = ('sum by (tenant) (rate(prefixd_match_hit_tokens_total[5m]))'
                    ' / sum by (tenant) (rate(prefixd_match_tokens_total[5m]))')
        r = self.prom.query(hit_rate)
        rates = {s["metric"]["tenant"]: float(s["value"][1]) for s in r["data"]["result"]}
        self.assertTrue(set(rates) == {"acme", "beta"} and all(0 < v <= 1 for v in rates.values()),
                        "documented hit-rate PromQL gives a ratio per tenant: %s" % rates)

    # ---- the dashboard and the alert rules ----

    def test_dashboard(self):
        queries = dashboard_queries(os.path.join(ARGS.repo, "deploy", "grafana", "prefixd.json"))
        self.assertGreaterEqual(len(queries), 20, "dashboard has %d expressions" % len(queries))
        for where, expr in queries:
            q, label = label_values_query(substitute(expr))
            r = self.prom.query(q)
            result = r.get("data", {}).get("result", [])
            answer = "%s\n      -> %s" % (q, json.dumps(r)[:400])
            with self.subTest(where):
                if ((INDEX_METRICS in q and not self.index_on)
                        or any(m in q for m in CONFIGURED_METRICS)):
                    self.assertEqual(r.get("status"), "success",
                                     "dashboard %s parses (no data: no index, or a family "
                                     "this daemon is not configured for)\n%s"
                                     % (where, answer))
                    continue
                ok = r.get("status") == "success" and len(result) > 0
                if label:
                    ok = ok and all(label in s["metric"] for s in result)
                self.assertTrue(ok, "dashboard %s returns data\n%s" % (where, answer))

    def test_rules(self):
        def all_evaluated():
            r = self.prom.api("rules")
            rules = [rule for g in r["data"]["groups"] for rule in g["rules"]]
            if rules and all(rule.get("health") != "unknown" for rule in rules):
                return rules
            return None

        rules = harness.wait_for("Prometheus evaluates every rule", all_evaluated,
                                 RULES_TIMEOUT_S, 0.2)
        names = sorted(rule["name"] for rule in rules)
        self.assertGreaterEqual(len(rules), 5, "alert rules loaded: %s" % ", ".join(names))
        for rule in rules:
            with self.subTest(rule["name"]):
                self.assertEqual(rule["health"], "ok", "rule %s evaluates without error: %s"
                                 % (rule["name"], rule.get("lastError")))
                q = boolify(rule["query"])
                r = self.prom.query(q)
                result = r.get("data", {}).get("result", [])
                answer = "%s\n      -> %s" % (q, json.dumps(r)[:400])
                if ((INDEX_METRICS in q and not self.index_on)
                        or any(m in q for m in CONFIGURED_METRICS)):
                    self.assertEqual(r.get("status"), "success",
                                     "rule %s: expression parses (no data: no index, or a "
                                     "family this daemon is not configured for)\n%s"
                                     % (rule["name"], answer))
                    continue
                self.assertTrue(r.get("status") == "success" and len(result) > 0,
                                "rule %s: expression returns data\n%s" % (rule["name"], answer))


def main():
    global ARGS
    ARGS, argv = harness.parse_flags(__doc__, "prefixd", "repo")
    common.unittest_main(argv=argv)


if __name__ == "__main__":
    main()
