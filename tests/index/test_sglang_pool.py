#!/usr/bin/python3
"""A pool of SGLang workers behind one host name (docs/index.md, "A pool of
SGLang workers"), over real sockets: the real daemon follows
`server_info_url: "http://sglang-pool:PORT"` with `server_info_pool`, where
sglang-pool is, in the test's own /etc/hosts (tests/python/
hosts_namespace.py), first 127.0.0.1, then 127.0.0.1 and 127.0.0.2, then
127.0.0.2 alone, as a Kubernetes headless Service's name is while pods
come and go. One HTTP server here answers GET /server_info on both
addresses, each as its own SGLang worker does (a wildcard event host, its
own event ports): pod A on 127.0.0.1 with one DP rank, pod B on 127.0.0.2
with two, each rank a ZeroMQ publisher bound to its pod's address.

Checks:
  - pod A is the worker sg/127.0.0.1:PORT, its store routed to it, its
    address label its own URL;
  - when the name resolves to pod B too, pod B's ranks are the workers
    sg/127.0.0.2:PORT and sg/127.0.0.2:PORT/dp1, each fed by its own
    socket, and pod A's worker is left as it was;
  - when pod A's address is gone, its worker leaves the index and pod B's
    stay, their blocks intact; the resolutions are logged;
  - prefixd_index_sglang_server_info_reads_total counts each pod's reads,
    pod A's still after it left;
  - a pool whose name resolves to nothing (NXDOMAIN from the test's own
    DNS server, tests/python/dns_server.py) is logged so, and has no
    worker;
  - a URL whose host resolves to several addresses is a pool without
    server_info_pool (each address read on its own), even with an
    instance_id, which its workers then do not take;
  - a server_info_pool with an instance_id stops the daemon at start,
    naming the field;
  - pods over https whose certificate names the pool's host alone (no
    address) are read under that name, each connected to its address.

Usage: test_sglang_pool.py --prefixd PATH [--stubs DIR]
"""

import os
import re
import sys
import tempfile
import time
import unittest
import urllib.request

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import prefixd  # noqa: E402
import dns_server  # noqa: E402  (tests/python/dns_server.py)
import hosts_namespace  # noqa: E402  (tests/python/hosts_namespace.py)
import prefixd_fixture  # noqa: E402
from pki import make_pki  # noqa: E402  (tests/python/pki.py)
from sglang_pods import Pod, ServerInfo  # noqa: E402  (tests/python/sglang_pods.py)
from prefixd import kv_publisher as kvp  # noqa: E402
from prefixd.v1 import prefix_index_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_index_pb2_grpc as pb_grpc  # noqa: E402

BS = 16
DEADLINE_S = 15
POD_A, POD_B = "127.0.0.1", "127.0.0.2"


def hosts(*pods):
    """sglang-pool at `pods`; sglang-auto and sglang-tls always at both
    addresses."""
    return ("127.0.0.1 localhost\n"
            + "".join("%s sglang-auto sglang-tls\n" % p for p in (POD_A, POD_B))
            + "".join("%s sglang-pool\n" % p for p in pods))


class SglangPoolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.hosts = hosts_namespace.mount(hosts(POD_A))
        cls.pod_a, cls.pod_b = Pod(POD_A, 1, BS), Pod(POD_B, 2, BS)
        cls.http = ServerInfo([cls.pod_a, cls.pod_b])
        cls.auto_http = ServerInfo([])  # no pod: every read fails, and is logged
        # Pods over https whose certificate names the Service alone, as a
        # cluster's certificates do: no pod address is in it. The CA is
        # the namespace's only trusted one.
        pki = tempfile.mkdtemp(prefix="prefixd-sglang-tls-")
        make_pki(pki, server_names="DNS:sglang-tls")
        hosts_namespace.mount(open(os.path.join(pki, "ca.pem")).read(),
                              "/etc/ssl/certs/ca-certificates.crt")
        cls.tls_pods = [Pod(POD_A, 1, BS), Pod(POD_B, 1, BS)]
        cls.tls_http = ServerInfo(cls.tls_pods, tls=(os.path.join(pki, "server.pem"),
                                                     os.path.join(pki, "server.key")))
        cls.port = cls.http.server_address[1]
        cls.a = "sg/%s:%d" % (POD_A, cls.port)
        cls.b = "sg/%s:%d" % (POD_B, cls.port)
        config = ('index {\n  block_size: %d\n'
                  '  sources { name: "sg" server_info_url: "http://sglang-pool:%d"\n'
                  '            server_info_pool: true resolve_interval: "1s" }\n'
                  '  sources { name: "ghost" server_info_url: "http://ghost-pool.invalid:1"\n'
                  '            server_info_pool: true }\n'
                  '  sources { name: "auto" server_info_url: "http://sglang-auto:%d"\n'
                  '            instance_id: "one" }\n'
                  '  sources { name: "tls" server_info_url: "https://sglang-tls:%d"\n'
                  '            server_info_pool: true }\n}\n'
                  % (BS, cls.port, cls.auto_http.server_address[1],
                     cls.tls_http.server_address[1]))
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False).start()
        cls.client = prefixd.Client(cls.daemon.tcp)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()
        for srv in (cls.http, cls.auto_http, cls.tls_http):
            srv.shutdown()
            srv.server_close()
        for pod in [cls.pod_a, cls.pod_b] + cls.tls_pods:
            pod.close()

    def until(self, what, cond, get):
        return prefixd_fixture.wait_for(what, cond, get, self.daemon, DEADLINE_S, poll=0.1)

    def workers(self):
        return prefixd_fixture.workers_by_name(self.client)

    def sg_workers(self, ws):
        """The names of pool sg's workers in `ws`."""
        return sorted(w for w in ws if w.startswith("sg/"))

    def store(self, publisher, first_token):
        """Publishes one block on a rank until its worker holds it (the
        first may go before the daemon's subscription is up)."""
        tokens = list(range(first_token, first_token + BS))
        deadline = time.monotonic() + DEADLINE_S
        while True:
            publisher.publish([kvp.block_stored([first_token], None, tokens, BS)])
            time.sleep(0.2)
            route = self.client.route(tokens)
            held = {w.worker: w.matched_blocks for w in route.workers}
            if held:
                return held
            self.assertLess(time.monotonic(), deadline, self.daemon.logs())

    def reads(self):
        with urllib.request.urlopen("http://%s/metrics" % self.daemon.metrics, timeout=5) as r:
            text = r.read().decode()
        return {(m.group(1), m.group(2)): float(m.group(3)) for m in re.finditer(
            r'^prefixd_index_sglang_server_info_reads_total\{worker="([^"]*)",'
            r'result="([^"]*)"\} (\S+)$', text, re.M)}

    def test_1_the_one_address_is_a_worker(self):
        self.until("pod A followed", lambda ws: self.a in ws, self.workers)
        self.assertEqual(self.store(self.pod_a.ranks[0], 1000), {self.a: 1})
        ws = self.client.list_workers().workers
        self.assertEqual(self.sg_workers(w.worker for w in ws), [self.a])
        with grpc.insecure_channel(self.daemon.tcp) as channel:
            raw = pb_grpc.PrefixIndexStub(channel).ListWorkers(pb.ListWorkersRequest(),
                                                               timeout=DEADLINE_S)
        labels = {w.worker: w.labels for w in raw.workers}[self.a]
        self.assertEqual((labels.instance_id, labels.address),
                         (self.a, "http://%s:%d" % (POD_A, self.port)))

    def test_2_a_new_address_is_followed(self):
        self.until("pod A followed", lambda ws: self.a in ws, self.workers)
        before = self.workers()[self.a]
        hosts_namespace.rewrite(self.hosts, hosts(POD_A, POD_B))
        ws = self.until("pod B's ranks followed",
                        lambda ws: {self.b, self.b + "/dp1"} <= set(ws), self.workers)
        self.assertEqual(self.store(self.pod_b.ranks[0], 2000), {self.b: 1})
        self.assertEqual(self.store(self.pod_b.ranks[1], 3000), {self.b + "/dp1": 1})
        ws = self.workers()
        self.assertEqual(self.sg_workers(ws), sorted([self.a, self.b, self.b + "/dp1"]))
        self.assertEqual((ws[self.a].events, ws[self.a].last_seq),
                         (before.events, before.last_seq))  # pod A left as it was

    def test_3_a_gone_address_leaves(self):
        self.until("pod B followed", lambda ws: self.b + "/dp1" in ws, self.workers)
        b_before = self.workers()[self.b]
        hosts_namespace.rewrite(self.hosts, hosts(POD_B))
        ws = self.until("pod A gone", lambda ws: self.a not in ws, self.workers)
        self.assertEqual(self.sg_workers(ws), sorted([self.b, self.b + "/dp1"]))
        self.assertEqual((ws[self.b].events, ws[self.b].last_seq),
                         (b_before.events, b_before.last_seq))
        self.assertEqual({w.worker for w in self.client.route(list(range(2000, 2000 + BS)))
                          .workers}, {self.b})
        logs = self.daemon.logs()
        self.assertIn("SGLang pool sg (http://sglang-pool:%d): sglang-pool resolves to 2 "
                      "addresses: %s, %s" % (self.port, POD_A, POD_B), logs)
        self.assertIn("sglang-pool resolves to 1 address: %s" % POD_B, logs)

    def test_4_reads_are_counted_per_address(self):
        self.until("pod B followed", lambda ws: self.b in ws, self.workers)
        reads = self.reads()
        self.assertGreaterEqual(reads.get((self.a, "ok"), 0), 1, reads)
        self.assertGreaterEqual(reads.get((self.b, "ok"), 0), 1, reads)

    def test_5_a_name_that_resolves_to_nothing_is_logged(self):
        logged = ("SGLang pool ghost (http://ghost-pool.invalid:1): ghost-pool.invalid "
                  "resolves to 0 addresses")
        self.until("ghost's resolution logged", lambda logs: logged in logs, self.daemon.logs)
        self.assertNotIn("ghost", "".join(self.workers()))

    def test_6_a_name_of_several_addresses_is_a_pool(self):
        port = self.auto_http.server_address[1]
        for pod in (POD_A, POD_B):
            logged = ("SGLang worker auto/%s:%d (http://%s:%d): /server_info not read"
                      % (pod, port, pod, port))
            self.until("auto's member at %s" % pod, lambda logs: logged in logs,
                       self.daemon.logs)

    def test_7_an_instance_id_is_refused(self):
        err = prefixd_fixture.start_error(
            ARGS.prefixd, 'index { sources { name: "sg" server_info_url: '
            '"http://sglang-pool:1" server_info_pool: true instance_id: "i" } }')
        self.assertIn('index.sources[sg].instance_id: "i" names one worker', err)

    def test_8_https_pods_are_read_under_the_pools_name(self):
        port = self.tls_http.server_address[1]
        names = ["tls/%s:%d" % (pod, port) for pod in (POD_A, POD_B)]
        self.until("both https pods followed", lambda ws: set(names) <= set(ws), self.workers)
        for i, (name, pod) in enumerate(zip(names, self.tls_pods)):
            self.assertEqual(self.store(pod.ranks[0], 4000 + 1000 * i), {name: 1})
        reads = self.reads()
        for name in names:
            self.assertGreaterEqual(reads.get((name, "ok"), 0), 1, reads)


if __name__ == "__main__":
    if not ARGS.prefixd:
        print("SKIP: --prefixd not given")
        sys.exit(common.SKIP)
    hosts_namespace.enter(ARGS)
    # Names not in the hosts file (ghost-pool.invalid) are NXDOMAIN here,
    # with or without a network.
    dns_server.start({})
    common.unittest_main()
