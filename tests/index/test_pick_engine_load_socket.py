#!/usr/bin/python3
"""Pick's load pushed by SGLang's load sockets, over real sockets
(docs/index.md, "Load pushed by SGLang"): the real daemon, two engines
publishing KV events over ZeroMQ (kv_publisher), and here a ZeroMQ PUB
socket sending e0's load as SGLang's scheduler does with
--load-publish-endpoint: frames [b"load", seq as 8-byte big-endian,
msgpack ["LoadStat", num_running_reqs, num_waiting_reqs, num_tokens,
max_total_num_tokens, attn_dp_rank]], re-sent while unchanged.

Checks, each against the figures sent:
  - e0's requests in flight are the running plus waiting requests, its KV
    usage num_tokens / max_total_num_tokens, its load term the config's
    weights times them, and it is marked load_from_engine; e1, which has
    no socket, is charged the index's window;
  - new figures reach Pick;
  - messages that do not decode (another tag, two frames, a negative
    count) are counted as failed on the daemon's /metrics, logged when a
    run of them starts or its reason changes, and the next good one is
    logged as read again;
  - once the socket goes quiet, e0 is back on the window after max_age;
  - a load socket on an IPv6 address is read too;
  - a load socket endpoint that is not tcp://HOST:PORT stops the daemon
    at start with the field named.

Usage: test_pick_engine_load_socket.py --prefixd PATH [--stubs DIR]
"""

import os
import sys
import threading
import time
import unittest

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import kv_publisher as kvp  # noqa: E402

import engine_load_case  # noqa: E402  (beside this file)
from engine_load_case import BS, DEADLINE_S  # noqa: E402

MAX_AGE_S = 1.0
RESEND_S = 0.05


def load_stat(running, waiting, tokens, capacity, rank=0):
    """SGLang's LoadStat payload (msgspec, array_like, tag, every field)."""
    return msgpack.packb(["LoadStat", running, waiting, tokens, capacity, rank])


class LoadSocket:
    """SGLang's load PUB socket: sends the current frames every RESEND_S
    (SGLang re-sends an unchanged reading every second; faster here)."""

    def __init__(self, host="127.0.0.1"):
        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.sock.setsockopt(zmq.IPV6, 1)
        port = self.sock.bind_to_random_port("tcp://" + host)
        self.endpoint = "tcp://%s:%d" % (host, port)
        self.lock = threading.Lock()
        self.frames = None
        self.seq = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def send(self, payload=None, frames=None):
        """From now on: [b"load", seq, payload], or these frames; None:
        nothing (the engine went quiet)."""
        with self.lock:
            self.frames = frames if payload is None else ("load", payload)

    def _run(self):
        while not self.stop.wait(RESEND_S):
            with self.lock:
                frames = self.frames
                self.seq += 1
                seq = self.seq.to_bytes(8, "big")
            if frames is None:
                continue
            if frames and frames[0] == "load":
                self.sock.send_multipart([b"load", seq, frames[1]])
            else:
                self.sock.send_multipart(list(frames))

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close(linger=0)


class EngineLoadSocketTest(engine_load_case.EngineLoadCase):
    POLL_S = RESEND_S

    @classmethod
    def setUpClass(cls):
        if not ARGS.prefixd:
            raise unittest.SkipTest("--prefixd not given")
        cls.load = LoadSocket()
        cls.load.send(load_stat(3, 2, 2500, 10000))
        cls.engines = {name: kvp.Publisher(encoding="array") for name in ("e0", "e1")}
        sources = "".join('  sources { name: "%s" endpoint: "%s" replay_endpoint: "%s" }\n'
                          % (n, p.endpoint, p.replay_endpoint)
                          for n, p in sorted(cls.engines.items()))
        config = ('index {\n  block_size: %d\n%s  pick {\n'
                  '    queued_weight: 1 request_tokens: %g kv_tokens: %g churn_weight: 0\n'
                  '    engine_load_sockets { worker: "e0" endpoint: "%s" }\n'
                  '    engine_metrics_max_age: "%gs"\n  }\n}\n'
                  % (BS, sources, cls.REQUEST_TOKENS, cls.KV_TOKENS, cls.load.endpoint,
                     MAX_AGE_S))
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False).start()
        cls.client = prefixd.Client(cls.daemon.tcp)

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        if getattr(cls, "load", None) is not None:
            cls.load.close()

    def messages(self):
        return self.counter("prefixd_index_engine_load_messages_total")

    def test_1_pushed_figures_are_charged(self):
        got = self.until("e0 read", lambda g: g["e0"].load_from_engine)
        self.assert_engine_load(got["e0"], 5, 0.25)
        self.assertFalse(got["e1"].load_from_engine)  # no socket: the window
        self.assertEqual(got["e1"].kv_usage, 0)
        self.assertGreater(self.messages()[("e0", "ok")], 0)

    def test_2_new_figures_reach_pick(self):
        self.load.send(load_stat(7, 4, 875, 1000))
        got = self.until("e0's new figures", lambda g: g["e0"].requests_in_flight == 11)
        self.assert_engine_load(got["e0"], 11, 0.875)

    def test_3_bad_messages_are_counted_and_logged(self):
        where = "load of e0 (%s)" % self.load.endpoint
        for frames, logged in (
                (("load", msgpack.packb(["KvStat", 1, 2, 3, 4, 0])),
                 'not read: LoadStat: the first element is not the str "LoadStat"'),
                ((b"load", b"\0" * 8), "not read: a message of 2 frames; want 3"),
                (("load", msgpack.packb(["LoadStat", -1, 0, 0, 0, 0])),
                 "not read: LoadStat: num_running_reqs is -1; want >= 0")):
            before = self.messages().get(("e0", "failed"), 0)
            self.load.send(frames=frames)
            self.until_logged("%s %s" % (where, logged))
            deadline = time.monotonic() + DEADLINE_S
            while self.messages()[("e0", "failed")] < before + 5:
                self.assertLess(time.monotonic(), deadline, self.messages())
                time.sleep(RESEND_S)
        # Logged when a run starts or its reason changes, not per message.
        self.assertLess(self.daemon.logs().count(where + " not read"),
                        self.messages()[("e0", "failed")] / 2)
        self.load.send(load_stat(1, 1, 1, 8))
        got = self.until("e0 read again", lambda g: g["e0"].load_from_engine
                         and g["e0"].requests_in_flight == 2)
        self.assert_engine_load(got["e0"], 2, 0.125)
        self.until_logged(where + " read again")

    def test_4_a_quiet_socket_ages_out(self):
        self.load.send(load_stat(2, 0, 0, 0))
        self.until("e0 read", lambda g: g["e0"].load_from_engine
                   and g["e0"].requests_in_flight == 2)
        self.load.send(None)
        quiet = time.monotonic()
        got = self.until("e0 back on the window", lambda g: not g["e0"].load_from_engine)
        self.assertGreaterEqual(time.monotonic() - quiet, MAX_AGE_S * 0.9)
        self.assertEqual(got["e0"].kv_usage, 0)

    def test_5_an_ipv6_socket_is_read(self):
        load = LoadSocket("[::1]")
        engine = kvp.Publisher(encoding="array")
        config = ('index {\n  block_size: %d\n'
                  '  sources { name: "e6" endpoint: "%s" }\n'
                  '  pick { engine_load_sockets { worker: "e6" endpoint: "%s" } }\n}\n'
                  % (BS, engine.endpoint, load.endpoint))
        daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False)
        try:
            load.send(load_stat(4, 1, 0, 0))
            daemon.start()
            client = prefixd.Client(daemon.tcp)
            deadline = time.monotonic() + DEADLINE_S
            while True:
                r = client.pick(list(range(1, 2 * BS + 1)), dry_run=True, timeout=DEADLINE_S)
                c = {c.worker: c for c in r.ranked}.get("e6")
                if c is not None and c.load_from_engine:
                    break
                self.assertLess(time.monotonic(), deadline, "%s\n%s" % (r, daemon.logs()))
                time.sleep(RESEND_S)
            self.assertEqual(c.requests_in_flight, 5)
        finally:
            daemon.close()
            engine.close()
            load.close()

    def test_6_bad_endpoint_stops_the_daemon(self):
        self.assert_start_fails(
            ARGS.prefixd, 'engine_load_sockets { worker: "e0" endpoint: "http://127.0.0.1:1/load" }',
            'index.pick.engine_load_sockets[0].endpoint: "http://127.0.0.1:1/load" is not '
            'tcp://HOST:PORT')


if __name__ == "__main__":
    common.unittest_main()
