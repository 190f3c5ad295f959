#!/usr/bin/python3
"""SGLang workers followed by their URL (docs/index.md, "Following SGLang
workers by URL"), over real sockets: the real daemon, an HTTP server here
answering GET /server_info as SGLang's does (its `kv_events` block, as
SGLang's describe_kv_events_publisher writes it: a wildcard host, the event
port base, the block size, dp_size 2, the load port base and topic), two
ZeroMQ publishers on the event ports base and base + 1 (DP ranks 0 and 1,
replaying on replay_port + rank) and SGLang's load PUB sockets on the load
port base + rank.

Checks:
  - while /server_info answers 503 the worker is not followed, and the
    daemon logs why, once;
  - then each rank is a worker (`sg`, `sg/dp1`) fed by its own socket: a
    store on each is routed to it, and the Conductor API lists both as DP
    ranks 0 and 1 of instance `sg`;
  - a batch lost on rank 0 is replayed from replay_port;
  - rank 1's LoadStat reaches Pick as its engine's load;
  - a /server_info that changes only the load sockets leaves the ranks'
    workers and their blocks as they were;
  - a /server_info that says another block size unfollows both ranks
    (logged), and the right one follows them again;
  - under decode context parallelism (top-level page_size x dcp_size) the
    blocks are that wide, whether kv_events.block_size gives the page size
    (earlier SGLang) or the width;
  - the worker requires its --api-key, which the daemon reads from
    server_info_api_key_file and sends as a bearer token; without the file
    the 401 is logged with what is missing;
  - prefixd_index_sglang_server_info_reads_total counts the reads, ok
    and failed;
  - bad config (a server_info_url beside an endpoint, a URL that is not
    http(s), a key file that cannot be read) stops the daemon at start,
    naming the field.

Usage: test_sglang_discovery.py --prefixd PATH [--stubs DIR]
"""

import http.server
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import kv_publisher as kvp  # noqa: E402

BS = 16
API_KEY = "sk-worker-7"
DEADLINE_S = 15
TIMEOUT = 10


class ServerInfo(http.server.ThreadingHTTPServer):
    """GET /server_info answers `self.status` with `self.info` as JSON; as
    SGLang started with --api-key, 401 without `Authorization: Bearer
    <api_key>`."""

    def __init__(self, api_key):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api_key = api_key
        self.status = 200
        self.info = {}
        self.gets = 0
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server_address[1]


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        srv = self.server
        srv.gets += 1
        status = srv.status if self.path == "/server_info" else 404
        body = json.dumps(srv.info).encode()
        if self.headers.get("Authorization") != "Bearer " + srv.api_key:
            status, body = 401, b'{"error": "Unauthorized"}'
        prefixd_fixture.reply(self, status, body)

    def log_message(self, *args):
        pass


def bind_ranks():
    """Rank 0's and rank 1's publishers on consecutive ports, replaying on
    consecutive ports, and their load sockets on the two ports after the
    event ports: (publishers, event base, replay base, load sockets)."""
    for _ in range(50):
        base, replay = prefixd_fixture.free_port(), prefixd_fixture.free_port()
        pubs, loads = [], []
        try:
            for r in range(2):
                pubs.append(kvp.Publisher(
                    endpoint="tcp://127.0.0.1:%d" % (base + r),
                    replay_endpoint="tcp://127.0.0.1:%d" % (replay + r),
                    data_parallel_rank=r, bind=True))
            for r in range(2):
                s = zmq.Context.instance().socket(zmq.PUB)
                s.setsockopt(zmq.LINGER, 0)
                s.bind("tcp://127.0.0.1:%d" % (base + 2 + r))
                loads.append(s)
            return pubs, base, replay, loads
        except zmq.ZMQError:
            for p in pubs:
                p.close()
            for s in loads:
                s.close()
    raise RuntimeError("no free block of ports")


def kv_events(base, block_size=BS):
    """/server_info's kv_events, as SGLang describes tcp://*:<base>, DP 2,
    --load-publish-endpoint auto."""
    return {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": base,
            "topic": "", "block_size": block_size, "dp_size": 2,
            "load_endpoint_port_base": base + 2, "load_topic": "load"}


class SglangDiscoveryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not ARGS.prefixd:
            raise unittest.SkipTest("--prefixd not given")
        cls.pubs, cls.base, cls.replay, cls.loads = bind_ranks()
        cls.info = ServerInfo(API_KEY)
        cls.info.status = 503
        cls.key_file = os.path.join(tempfile.mkdtemp(prefix="prefixd-sglang-"), "api_key")
        with open(cls.key_file, "w") as f:
            f.write(API_KEY + "\n")
        cls.info.info = {"model_path": "m", "page_size": BS, "kv_events": kv_events(cls.base)}
        config = ('index {\n  block_size: %d\n'
                  '  sources { name: "sg" server_info_url: "%s" replay_port: %d\n'
                  '            resolve_interval: "1s" model: "m"\n'
                  '            server_info_api_key_file: "%s" }\n'
                  '  pick { engine_metrics_max_age: "5s" }\n}\n'
                  % (BS, cls.info.url, cls.replay, cls.key_file))
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False,
                                            index_http="127.0.0.1")
        cls.daemon.start()
        cls.http_port = cls.daemon.index_http_port  # the Conductor API
        cls.client = prefixd.Client(cls.daemon.tcp)

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "daemon", None) is not None:
            cls.daemon.close()
        for p in getattr(cls, "pubs", []):
            p.close()
        for s in getattr(cls, "loads", []):
            s.close()
        if getattr(cls, "info", None) is not None:
            cls.info.shutdown()
        if getattr(cls, "key_file", None) is not None:
            shutil.rmtree(os.path.dirname(cls.key_file), ignore_errors=True)

    # ---- helpers ----

    def until(self, what, cond):
        deadline = time.monotonic() + DEADLINE_S
        while True:
            got = cond()
            if got:
                return got
            if time.monotonic() > deadline:
                self.fail("%s: not within %ds\nlogs:\n%s" % (what, DEADLINE_S, self.daemon.logs()))
            time.sleep(0.05)

    def workers(self):
        return {w.worker: w for w in self.client.list_workers(timeout=TIMEOUT).workers}

    def follow(self):
        """Waits for both ranks' workers and their publishers' subscriptions."""
        self.until("both ranks followed", lambda: {"sg", "sg/dp1"} <= set(self.workers()))
        for p in self.pubs:
            p.wait_for_subscriber()

    def store(self, rank, first_token, parent=None, hash_=None):
        tokens = list(range(first_token, first_token + BS))
        h = hash_ if hash_ is not None else first_token
        self.pubs[rank].publish([kvp.block_stored([h], parent, tokens, BS)])
        return tokens

    def matched(self, tokens):
        r = self.client.route(tokens, all_workers=True, timeout=TIMEOUT)
        return {w.worker: w.matched_blocks for w in r.workers}

    def query(self, tokens):
        req = urllib.request.Request(
            "http://127.0.0.1:%d/query" % self.http_port,
            data=json.dumps({"model": "m", "token_ids": tokens, "block_size": BS}).encode())
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return json.load(r)

    # ---- tests, in order ----

    def test_1_an_unreadable_server_info_is_logged_not_followed(self):
        log = "prefixd: SGLang worker sg (%s): /server_info not read: HTTP status 503" % self.info.url
        self.until("the 503 logged", lambda: log in self.daemon.logs())
        self.until("asked again", lambda: self.info.gets >= 3)
        self.assertEqual(self.daemon.logs().count(log), 1)
        self.assertEqual(set(self.workers()), set())

    def test_2_each_rank_is_a_worker_of_its_own(self):
        self.info.status = 200
        self.follow()
        self.assertIn("prefixd: SGLang worker sg (%s): following 2 DP ranks: events at "
                      "tcp://127.0.0.1:%d..%d, load at tcp://127.0.0.1:%d..%d"
                      % (self.info.url, self.base, self.base + 1, self.base + 2, self.base + 3),
                      self.daemon.logs())
        t0 = self.store(0, 1000)
        t1 = self.store(1, 2000)
        self.until("rank 0's store", lambda: self.matched(t0).get("sg") == 1)
        self.until("rank 1's store", lambda: self.matched(t1).get("sg/dp1") == 1)
        self.assertEqual(self.matched(t0).get("sg/dp1"), 0)
        w = self.workers()
        self.assertEqual(w["sg"].endpoint, "tcp://127.0.0.1:%d" % self.base)
        self.assertEqual(w["sg/dp1"].endpoint, "tcp://127.0.0.1:%d" % (self.base + 1))
        # One instance, two DP ranks, as the Conductor API answers.
        self.assertEqual(self.query(t1)["default"]["sg"]["DP"], {"0": 0, "1": BS})

    def test_3_a_lost_batch_is_replayed_from_replay_port(self):
        self.follow()
        self.pubs[0].drop_next()
        lost = self.store(0, 3000)
        after = self.store(0, 3000 + BS, parent=3000, hash_=3001)
        self.until("the lost batch replayed",
                   lambda: self.matched(lost + after).get("sg") == 2)
        self.assertGreaterEqual(self.workers()["sg"].replays, 1)
        self.assertGreaterEqual(len(self.pubs[0].replay_requests), 1)

    def test_4_rank_1s_load_reaches_pick(self):
        self.follow()
        stat = msgpack.packb(["LoadStat", 3, 4, 250, 1000, 1])
        def read():
            self.loads[1].send_multipart([b"load", (1).to_bytes(8, "big"), stat])
            r = self.client.pick(list(range(1, 2 * BS + 1)), dry_run=True, timeout=TIMEOUT)
            c = {c.worker: c for c in r.ranked}.get("sg/dp1")
            return c if c is not None and c.load_from_engine else None
        c = self.until("rank 1's load", read)
        self.assertEqual(c.requests_in_flight, 7)
        self.assertAlmostEqual(c.kv_usage, 0.25)

    def test_5_ranks_whose_sockets_stay_keep_their_workers(self):
        self.follow()
        tokens = self.store(1, 5000)
        self.until("rank 1's store", lambda: self.matched(tokens).get("sg/dp1") == 1)
        # A worker followed anew would catch up by replay: a new time.
        before = {n: (w.events, w.last_event_unix_ms) for n, w in self.workers().items()}
        no_load = kv_events(self.base)
        del no_load["load_endpoint_port_base"], no_load["load_topic"]
        self.info.info = {"kv_events": no_load}
        self.until("the new answer followed", lambda: (
            "following 2 DP ranks: events at tcp://127.0.0.1:%d..%d\n"
            % (self.base, self.base + 1)) in self.daemon.logs())
        time.sleep(0.5)
        self.assertEqual(self.matched(tokens).get("sg/dp1"), 1)
        self.assertEqual({n: (w.events, w.last_event_unix_ms)
                          for n, w in self.workers().items()}, before)
        self.info.info = {"kv_events": kv_events(self.base)}

    def test_6_another_block_size_unfollows_and_back(self):
        self.follow()
        self.info.info = {"kv_events": kv_events(self.base, block_size=64)}
        self.until("both ranks unfollowed", lambda: not set(self.workers()))
        self.assertIn("prefixd: SGLang worker sg (%s): its blocks are of 64 tokens, the "
                      "index's of 16" % self.info.url, self.daemon.logs())
        self.info.info = {"kv_events": kv_events(self.base)}
        self.follow()

    def test_6b_decode_context_parallelism_widens_the_blocks(self):
        # --dcp-size 2 with pages of BS/2 tokens: the events store blocks
        # of BS. An SGLang that advertised the page size is followed at BS
        # all the same; one that advertises BS is too.
        self.follow()
        for advertised in (BS // 2, BS):
            self.info.info = {"page_size": BS // 2, "dcp_size": 2,
                              "kv_events": kv_events(self.base, block_size=advertised)}
            time.sleep(2.5)  # two more reads (resolve_interval 1s)
            self.assertEqual({"sg", "sg/dp1"} & set(self.workers()), {"sg", "sg/dp1"},
                             self.daemon.logs())
        self.assertNotIn("its blocks are of %d tokens" % (BS // 2), self.daemon.logs())
        tokens = self.store(0, 9000)
        self.until("a store of rank 0 routed", lambda: self.matched(tokens).get("sg") == 1)
        self.info.info = {"kv_events": kv_events(self.base)}

    def test_7_bad_config_stops_the_daemon(self):
        for source, error in (
                ('name: "sg" server_info_url: "http://127.0.0.1:1" endpoint: "tcp://127.0.0.1:2"',
                 "index.sources[sg].server_info_url: is set with endpoint or replay_endpoint"),
                ('name: "sg" server_info_url: "ftp://127.0.0.1:1"',
                 'index.sources[sg].server_info_url: "ftp://127.0.0.1:1" is not an '
                 'http(s)://HOST:PORT URL'),
                ('name: "sg" server_info_url: "http://127.0.0.1:1" type: "vLLM"',
                 'index.sources[sg].type: "vLLM" with a server_info_url'),
                ('name: "sg" server_info_url: "http://127.0.0.1:1" '
                 'server_info_api_key_file: "/nonexistent/key"',
                 'index.sources[sg].server_info_api_key_file: "/nonexistent/key" cannot '
                 'be read')):
            said = prefixd_fixture.start_error(ARGS.prefixd,
                                               "index { sources { %s } }" % source)
            self.assertIsNotNone(said, source)
            self.assertIn(error, said)

    def test_8_a_missing_api_key_is_named(self):
        config = ('index { sources { name: "nokey" server_info_url: "%s" } }' % self.info.url)
        d = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False).start()
        try:
            log = ("prefixd: SGLang worker nokey (%s): /server_info not read: HTTP status 401 "
                   "(a worker started with --api-key needs server_info_api_key_file)"
                   % self.info.url)
            self.until("the 401 logged", lambda: log in d.logs())
        finally:
            d.close()

    def test_9_reads_are_counted(self):
        with urllib.request.urlopen("http://%s/metrics" % self.daemon.metrics,
                                    timeout=TIMEOUT) as r:
            text = r.read().decode()
        family = "prefixd_index_sglang_server_info_reads_total"
        got = {result: float(n) for result, n in re.findall(
            r'^%s\{worker="sg",result="(\w+)"\} (\S+)$' % family, text, re.M)}
        # The 503s of test 1 and the block size of test 6 failed; every
        # other read was followed.
        self.assertGreaterEqual(got.get("failed", 0), 3, text)
        self.assertGreaterEqual(got.get("ok", 0), 3, text)


if __name__ == "__main__":
    common.unittest_main()
