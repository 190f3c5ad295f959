#!/usr/bin/python3
"""Pick's load from the engines' own Prometheus endpoints, over real
sockets (docs/index.md, "Load from the engines' metrics"): the real
daemon, three engines publishing KV events over ZeroMQ (kv_publisher),
and an HTTP server here serving each engine's /metrics in the shape vLLM
and SGLang serve it (HELP and TYPE lines, a series per DP rank,
histograms around the gauges).

Checks, each against the figures served:
  - a vLLM endpoint read for one DP rank (labels {engine: "1"}) and an
    SGLang one: the candidate's requests in flight are the running plus
    waiting requests, its KV usage the gauge, its load term the config's
    weights times them, and it is marked load_from_engine;
  - the scraper sends the text format's Accept header, and reads again:
    new figures reach Pick within a few intervals;
  - an endpoint that fails (HTTP 500, then 404, a malformed gauge line, a
    body over 4 MiB, a body without load gauges) leaves the worker on the index's window once
    its last reading is max_age old, and the daemon logs the first failure
    of each run with the reason (and each new reason), and the recovery; the daemon's /metrics
    counts each worker's scrapes by result;
  - an entry for a worker no source names (e9) is read and counted, never
    a candidate, and logged once;
  - loads the router passes win over the engine's;
  - prefixctl pick shows "engine" as the load's source;
  - a bad engine_metrics entry stops the daemon at start with the field
    named.

Usage: test_pick_engine_metrics.py --prefixd PATH [--prefixctl PATH] [--stubs DIR]
"""

import http.server
import os
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__, extra=lambda ap: ap.add_argument(
    "--prefixctl", help="the prefixctl binary (its check is skipped without it)"))

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import kv_publisher as kvp  # noqa: E402

import engine_load_case  # noqa: E402  (beside this file)
from engine_load_case import BS, DEADLINE_S, TIMEOUT  # noqa: E402

INTERVAL_S = 0.25
MAX_AGE_S = 1.0


def vllm_metrics(rank1_running, rank1_waiting, rank1_kv):
    """vLLM's /metrics for two DP ranks; rank 0's figures stay fixed."""
    return """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 9.0
vllm:num_requests_running{engine="1",model_name="m"} %.1f
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 9.0
vllm:num_requests_waiting{engine="1",model_name="m"} %.1f
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.99
vllm:kv_cache_usage_perc{engine="1",model_name="m"} %r
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 4.0
""" % (rank1_running, rank1_waiting, rank1_kv)


SGLANG = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
"""


class Endpoints(http.server.ThreadingHTTPServer):
    """Serves path -> (status, body); records each path's Accept headers."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pages = {}
        self.accepts = {}
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def set(self, path, body, status=200):
        with self.lock:
            self.pages[path] = (status, body)

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.server_address[1], path)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with self.server.lock:
            status, body = self.server.pages.get(self.path, (404, "no such page\n"))
            self.server.accepts.setdefault(self.path, []).append(self.headers.get("Accept"))
        prefixd_fixture.reply(self, status, body.encode(),
                              "text/plain; version=0.0.4; charset=utf-8")

    def log_message(self, *args):
        pass


class EngineMetricsTest(engine_load_case.EngineLoadCase):
    POLL_S = INTERVAL_S / 2

    @classmethod
    def setUpClass(cls):
        if not ARGS.prefixd:
            raise unittest.SkipTest("--prefixd not given")
        cls.web = Endpoints()
        cls.web.set("/vllm", vllm_metrics(3, 2, 0.5))
        cls.web.set("/sglang", SGLANG)
        cls.web.set("/down", "internal error\n", status=500)
        cls.engines = {name: kvp.Publisher(encoding="array") for name in ("e0", "e1", "e2")}
        sources = "".join('  sources { name: "%s" endpoint: "%s" replay_endpoint: "%s" }\n'
                          % (n, p.endpoint, p.replay_endpoint)
                          for n, p in sorted(cls.engines.items()))
        config = ('index {\n  block_size: %d\n%s  pick {\n'
                  '    queued_weight: 1 request_tokens: %g kv_tokens: %g churn_weight: 0\n'
                  '    engine_metrics { worker: "e0" url: "%s" labels { key: "engine" value: "1" } }\n'
                  '    engine_metrics { worker: "e1" url: "%s" }\n'
                  '    engine_metrics { worker: "e2" url: "%s" }\n'
                  '    engine_metrics { worker: "e9" url: "%s" }\n'
                  '    engine_metrics_interval: "%gs" engine_metrics_max_age: "%gs"\n  }\n}\n'
                  % (BS, sources, cls.REQUEST_TOKENS, cls.KV_TOKENS, cls.web.url("/vllm"),
                     cls.web.url("/sglang"), cls.web.url("/down"), cls.web.url("/sglang"),
                     INTERVAL_S, MAX_AGE_S))
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False).start()
        cls.client = prefixd.Client(cls.daemon.tcp)

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        if getattr(cls, "web", None) is not None:
            cls.web.shutdown()

    def test_1_engine_figures_are_charged(self):
        got = self.until("e0 and e1 read", lambda g: g["e0"].load_from_engine
                         and g["e1"].load_from_engine)
        # e0: rank 1 of the vLLM only (3 running + 2 waiting, 0.5), not rank 0's 9s.
        self.assert_engine_load(got["e0"], 5, 0.5)
        self.assert_engine_load(got["e1"], 3, 0.25)
        self.assertFalse(got["e2"].load_from_engine)  # its endpoint answers 500
        self.assertEqual(got["e2"].kv_usage, 0)
        with self.web.lock:
            accepts = set(self.web.accepts["/vllm"])
        self.assertEqual(accepts, {"text/plain;version=0.0.4"})
        self.until_logged("engine metrics of e2 (%s) not read: HTTP status 500"
                          % self.web.url("/down"))
        deadline = time.monotonic() + DEADLINE_S
        while self.scrapes()[("e2", "failed")] < 10 and time.monotonic() < deadline:
            time.sleep(INTERVAL_S)
        scrapes = self.scrapes()
        # Logged when a run starts or its reason changes, not every round
        # (a round slowed by the machine may time out: another reason).
        self.assertGreaterEqual(scrapes[("e2", "failed")], 10, scrapes)
        self.assertLess(self.daemon.logs().count("engine metrics of e2"),
                        scrapes[("e2", "failed")] / 2, scrapes)
        self.assertGreater(scrapes[("e0", "ok")], scrapes[("e0", "failed")], scrapes)
        self.assertEqual(scrapes[("e2", "ok")], 0, scrapes)
        self.assertGreater(scrapes[("e2", "failed")], 0, scrapes)

    def scrapes(self):
        return self.counter("prefixd_index_engine_scrapes_total")

    def test_1b_a_worker_the_index_lacks_is_logged_once(self):
        """e9 is read, but no source names it: logged once, never a candidate."""
        line = ("engine metrics of e9 (%s) read, but the index has no worker e9"
                % self.web.url("/sglang"))
        self.until_logged(line)
        deadline = time.monotonic() + DEADLINE_S
        while self.scrapes()[("e9", "ok")] < 5 and time.monotonic() < deadline:
            time.sleep(INTERVAL_S)
        self.assertGreaterEqual(self.scrapes()[("e9", "ok")], 5)
        self.assertEqual(self.daemon.logs().count(line), 1, self.daemon.logs())
        self.assertNotIn("e9", self.dry_pick())
        self.assertNotIn("engine metrics of e0 (%s) read, but" % self.web.url("/vllm"),
                         self.daemon.logs())

    def test_2_new_figures_reach_pick(self):
        self.web.set("/vllm", vllm_metrics(7, 4, 0.875))
        got = self.until("e0's new figures", lambda g: g["e0"].requests_in_flight == 11)
        self.assert_engine_load(got["e0"], 11, 0.875)

    def test_3_failures_age_out_and_recover(self):
        url = self.web.url("/vllm")
        for status, body, logged in (
                (404, "gone\n", "not read: HTTP status 404"),
                (200, 'vllm:num_requests_running{engine="1" 3\n',
                 "not read: line 1 (vllm:num_requests_running{engine=\\\"1\\\" 3): labels are "
                 "not separated by ','"),
                (200, "# " + "x" * (4 << 20) + "\n",
                 "not read: the response is larger than 4194304 bytes"),
                (200, "process_cpu_seconds_total 3\n",
                 'not read: no series of vllm:num_requests_running, vllm:num_requests_waiting, '
                 'sglang:num_running_reqs or sglang:num_queue_reqs with labels {engine="1"}')):
            self.web.set("/vllm", vllm_metrics(1, 1, 0.125))
            self.until("e0 read", lambda g: g["e0"].load_from_engine
                       and g["e0"].requests_in_flight == 2)
            self.web.set("/vllm", body, status=status)
            got = self.until("e0 back on the window (%s)" % logged,
                             lambda g: not g["e0"].load_from_engine)
            self.assertEqual(got["e0"].kv_usage, 0)
            self.until_logged("engine metrics of e0 (%s) %s" % (url, logged))
        self.assertGreater(self.scrapes()[("e0", "failed")], 0)
        self.web.set("/vllm", vllm_metrics(1, 1, 0.125))
        self.until("e0 read again", lambda g: g["e0"].load_from_engine)
        self.until_logged("engine metrics of e0 (%s) read again" % url)

    def test_4_router_loads_win(self):
        self.until("e1 read", lambda g: g["e1"].load_from_engine)
        got = self.dry_pick(loads={"e1": prefixd.WorkerLoad(requests_in_flight=0,
                                                            queued_prefill_tokens=0,
                                                            kv_usage=0.0)})
        self.assertTrue(got["e1"].load_from_request)
        self.assertFalse(got["e1"].load_from_engine)
        self.assertEqual(got["e1"].load_term, 0)

    def test_5_prefixctl_shows_the_source(self):
        if not ARGS.prefixctl:
            self.skipTest("--prefixctl not given")
        self.until("e1 read", lambda g: g["e1"].load_from_engine)
        tokens = ",".join(str(t) for t in range(1, 2 * BS + 1))
        r = subprocess.run([ARGS.prefixctl, "--addr", self.daemon.tcp, "pick", "--dry_run",
                            "--tokens", tokens], capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:] if line}
        self.assertIn("engine", rows["e1"], r.stdout)
        self.assertIn("window", rows["e2"], r.stdout)

    def test_6_bad_entry_stops_the_daemon(self):
        self.assert_start_fails(
            ARGS.prefixd, 'engine_metrics { worker: "e0" url: "tcp://127.0.0.1:1/metrics" }',
            'index.pick.engine_metrics[0].url: "tcp://127.0.0.1:1/metrics" is not '
            'an http:// or https:// URL')


if __name__ == "__main__":
    common.unittest_main()
