#!/usr/bin/python3
"""Engines named by a host name of both families, over real sockets
(docs/index.md, "Configuration"): the real daemon and a vLLM-shaped publisher
bound to tcp://0.0.0.0:PORT (IPv4 only, as vLLM's tcp://*:PORT binds),
named tcp://localhost:PORT where localhost is both ::1 and 127.0.0.1, as
Debian's stock /etc/hosts has it.

The script runs itself again in a mount namespace of its own (unshare -m)
and there mounts such a hosts file over /etc/hosts; the machine's own file
is untouched. Where mount namespaces are not allowed it is skipped.

Checks:
  - a source on tcp://localhost:P with its replay endpoint on
    tcp://localhost:R is one worker, named as the source, not a pool of
    two: it catches up on what was published before the daemon started
    (a replay over IPv4) and goes LIVE with those blocks;
  - a batch lost in transit is replayed from the same endpoint;
  - Pick reads the engine's load socket named tcp://localhost:L.

Usage: test_dual_stack_names.py --prefixd PATH [--stubs DIR]
"""

import os
import socket
import sys
import threading
import unittest

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import prefixd  # noqa: E402
import hosts_namespace  # noqa: E402  (tests/python/hosts_namespace.py)
import prefixd_fixture  # noqa: E402
from prefixd import kv_publisher as kvp  # noqa: E402

BS = 16
DEADLINE_S = 10
HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"


def check_both_families():
    families = {a[0] for a in socket.getaddrinfo("localhost", None, type=socket.SOCK_STREAM)}
    if families != {socket.AF_INET, socket.AF_INET6}:
        sys.exit("localhost did not resolve to both families: %s" % families)


class LoadSocket:
    """SGLang's load PUB socket bound to IPv4 only, re-sending its LoadStat
    [b"load", seq, ["LoadStat", running, waiting, tokens, capacity, rank]]."""

    def __init__(self, running, waiting):
        self.sock = zmq.Context.instance().socket(zmq.PUB)
        self.port = self.sock.bind_to_random_port("tcp://0.0.0.0")
        self.payload = msgpack.packb(["LoadStat", running, waiting, 0, 0, 0])
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        seq = 0
        while not self.stop.wait(0.05):
            seq += 1
            self.sock.send_multipart([b"load", seq.to_bytes(8, "big"), self.payload])

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close(linger=0)


class DualStackNameTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.engine = kvp.Publisher("tcp://0.0.0.0:*", "tcp://0.0.0.0:*", encoding="array")
        cls.load = LoadSocket(running=3, waiting=1)
        # Before the daemon starts: only the replay on connect brings it.
        cls.engine.publish([kvp.block_stored([1], None, list(range(BS)), BS)])
        config = ('index {\n  block_size: %d\n'
                  '  sources { name: "vllm-0" endpoint: "tcp://localhost:%d"\n'
                  '            replay_endpoint: "tcp://localhost:%d" }\n'
                  '  pick { engine_load_sockets { worker: "vllm-0"'
                  ' endpoint: "tcp://localhost:%d" } }\n}\n'
                  % (BS, prefixd_fixture.port_of(cls.engine.endpoint),
                     prefixd_fixture.port_of(cls.engine.replay_endpoint),
                     cls.load.port))
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False).start()
        cls.client = prefixd.Client(cls.daemon.tcp)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()
        cls.load.close()
        cls.engine.close()

    def until(self, what, cond, get):
        return prefixd_fixture.wait_for(what, cond, get, self.daemon, DEADLINE_S)

    def workers(self):
        return prefixd_fixture.workers_by_name(self.client)

    def test_1_one_worker_caught_up_by_replay(self):
        got = self.until("vllm-0 LIVE with its first block",
                         lambda ws: "vllm-0" in ws and ws["vllm-0"].last_seq == 0
                         and ws["vllm-0"].state == prefixd.WorkerState.LIVE, self.workers)
        self.assertEqual(sorted(got), ["vllm-0"])  # not vllm-0/[::1]:P and vllm-0/127...
        self.assertGreaterEqual(got["vllm-0"].replays, 1)

    def test_2_a_lost_batch_is_replayed(self):
        self.until("vllm-0 LIVE", lambda ws: "vllm-0" in ws and ws["vllm-0"].last_seq == 0,
                   self.workers)
        replays = self.workers()["vllm-0"].replays
        self.engine.drop_next()
        self.engine.publish([kvp.block_stored([2], 1, list(range(BS, 2 * BS)), BS)])
        self.engine.publish([kvp.block_stored([3], 2, list(range(2 * BS, 3 * BS)), BS)])
        got = self.until("the lost batch replayed",
                         lambda ws: ws["vllm-0"].last_seq == 2, self.workers)
        self.assertEqual(got["vllm-0"].gaps, 1)
        self.assertGreater(got["vllm-0"].replays, replays)
        route = self.client.route(list(range(3 * BS)))
        self.assertEqual({w.worker: w.matched_blocks for w in route.workers}, {"vllm-0": 3})

    def test_3_pick_reads_the_load_socket(self):
        def ranked():
            r = self.client.pick(list(range(2 * BS)), dry_run=True, timeout=DEADLINE_S)
            return {c.worker: c for c in r.ranked}
        got = self.until("vllm-0's load read from its socket",
                         lambda c: "vllm-0" in c and c["vllm-0"].load_from_engine, ranked)
        self.assertEqual(got["vllm-0"].requests_in_flight, 4)


if __name__ == "__main__":
    if not ARGS.prefixd:
        print("SKIP: --prefixd not given")
        sys.exit(common.SKIP)
    hosts_namespace.enter(ARGS)
    hosts_namespace.mount(HOSTS)
    check_both_families()
    common.unittest_main()
