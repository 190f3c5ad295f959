#!/usr/bin/python3
"""Pools through a DNS outage (docs/index.md, "Pools and DNS"), over real
sockets: the real daemon follows an event pool (`endpoint:
"tcp://evpool.test:P"` with `replay_port`) and an SGLang pool
(`server_info_url: "http://sgpool.test:P"` with `server_info_pool`), both
names answered by a DNS server of the test's own (tests/python/
dns_server.py) in a mount namespace of its own (tests/python/
hosts_namespace.py), as a cluster's DNS answers for headless Services.

Checks:
  - each name's one address is a worker, LIVE with its engine's blocks;
  - while the DNS server answers SERVFAIL (the resolver cannot answer:
    "Temporary failure in name resolution"), both workers stay as they
    were and keep following their engines; the failure is logged once;
  - when it answers again, the same workers go on, with no new catch-up,
    and that is logged;
  - when it answers NXDOMAIN (the name has no address: every pod gone),
    both workers leave the index;
  - prefixd_index_pool_lookups_total counts each pool's failed and
    answered lookups, prefixd_index_pool_addresses the last answer's size.

Without the outage rule a failed lookup read as "no addresses": every
worker of both pools was retired at the first failure.

Usage: test_pool_dns.py --prefixd PATH [--stubs DIR]
"""

import os
import re
import sys
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import prefixd  # noqa: E402
import dns_server  # noqa: E402  (tests/python/dns_server.py)
import hosts_namespace  # noqa: E402  (tests/python/hosts_namespace.py)
import prefixd_fixture  # noqa: E402
from sglang_pods import Pod, ServerInfo  # noqa: E402  (tests/python/sglang_pods.py)
from prefixd import kv_publisher as kvp  # noqa: E402

BS = 16
DEADLINE_S = 15
POD = "127.0.0.1"
RECORDS = {"evpool.test": [POD], "sgpool.test": [POD]}
DNS = None  # the server, started in the namespace before the tests


class PoolDnsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.engine = kvp.Publisher("tcp://%s:*" % POD, "tcp://%s:*" % POD)
        cls.engine.publish([kvp.block_stored([1], None, list(range(BS)), BS)])
        cls.pod = Pod(POD, 1, BS)
        cls.http = ServerInfo([cls.pod])
        port = prefixd_fixture.port_of(cls.engine.endpoint)
        cls.ev = "ev/%s:%d" % (POD, port)
        cls.sg = "sg/%s:%d" % (POD, cls.http.server_address[1])
        config = ('index {\n  block_size: %d\n'
                  '  sources { name: "ev" endpoint: "tcp://evpool.test:%d"\n'
                  '            replay_port: %d resolve_interval: "200ms" }\n'
                  '  sources { name: "sg" server_info_url: "http://sgpool.test:%d"\n'
                  '            server_info_pool: true resolve_interval: "200ms" }\n}\n'
                  % (BS, port, prefixd_fixture.port_of(cls.engine.replay_endpoint),
                     cls.http.server_address[1]))
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False).start()
        cls.client = prefixd.Client(cls.daemon.tcp)
        cls.pod_token = 1000

    @classmethod
    def tearDownClass(cls):
        DNS.failing = False
        cls.client.close()
        cls.daemon.close()
        cls.http.shutdown()
        cls.http.server_close()
        cls.pod.close()
        cls.engine.close()

    def until(self, what, cond, get):
        return prefixd_fixture.wait_for(what, cond, get, self.daemon, DEADLINE_S, poll=0.1)

    def workers(self):
        return prefixd_fixture.workers_by_name(self.client)

    def pool_metrics(self):
        """{(family, source, result or None): value} of the pools' families
        on /metrics."""
        with urllib.request.urlopen("http://%s/metrics" % self.daemon.metrics, timeout=5) as r:
            text = r.read().decode()
        out = {}
        for m in re.finditer(r'^prefixd_index_pool_(lookups_total|addresses)'
                             r'\{source="([^"]*)"(?:,result="([^"]*)")?\} (\S+)$', text, re.M):
            out[(m.group(1), m.group(2), m.group(3))] = float(m.group(4))
        return out

    def held(self, tokens):
        return {w.worker: w.matched_blocks for w in self.client.route(tokens).workers}

    def store_on_pod(self):
        """Publishes a new block on the SGLang pod until its worker holds it
        (the first may go before the daemon's subscription is up)."""
        self.pod_token += BS
        tokens = list(range(self.pod_token, self.pod_token + BS))
        deadline = time.monotonic() + DEADLINE_S
        while self.held(tokens) != {self.sg: 1}:
            self.assertLess(time.monotonic(), deadline, self.daemon.logs())
            self.pod.ranks[0].publish([kvp.block_stored([self.pod_token], None, tokens, BS)])
            time.sleep(0.2)

    def following(self):
        self.until("both pools followed, ev caught up",
                   lambda ws: self.sg in ws and self.ev in ws and ws[self.ev].last_seq >= 0
                   and ws[self.ev].state == prefixd.WorkerState.LIVE, self.workers)
        self.store_on_pod()

    def test_1_each_address_is_a_worker(self):
        self.following()
        self.assertEqual(sorted(self.workers()), sorted([self.ev, self.sg]))
        self.assertEqual(self.held(list(range(BS))), {self.ev: 1})

    def test_2_an_outage_changes_nothing(self):
        self.following()
        before = self.workers()
        DNS.failing = True
        try:
            failed = {h: DNS.servfails[h] for h in RECORDS}
            self.until("three failed lookups of each name",  # A and AAAA each
                       lambda n: all(n.get(h, 0) >= failed[h] + 6 for h in RECORDS),
                       lambda: dict(DNS.servfails))
            self.assertEqual(sorted(self.workers()), sorted(before))
            ev_port = prefixd_fixture.port_of(self.engine.endpoint)
            for pool, host in (("pool ev (tcp://evpool.test:%d)" % ev_port, "evpool.test"),
                               ("SGLang pool sg (http://sgpool.test:%d)"
                                % self.http.server_address[1], "sgpool.test")):
                self.assertIn('prefixd: %s: resolving "%s": Temporary failure in name '
                              'resolution; its last answer (1 address: %s) stands until it '
                              'resolves' % (pool, host, POD), self.daemon.logs())
            self.engine.publish([kvp.block_stored([2], 1, list(range(BS, 2 * BS)), BS)])
            self.until("ev's next batch applied", lambda ws: ws[self.ev].last_seq == 1,
                       self.workers)
            self.store_on_pod()
            after = self.workers()
            self.assertEqual(sorted(after), sorted(before))
            self.assertEqual(after[self.ev].replays, before[self.ev].replays)
            self.assertEqual(self.held(list(range(2 * BS))), {self.ev: 2})
            self.assertEqual(self.daemon.logs().count("Temporary failure"), 2)
            m = self.pool_metrics()
            for source in ("ev", "sg"):
                self.assertGreaterEqual(m[("lookups_total", source, "failed")], 3, m)
                self.assertGreaterEqual(m[("lookups_total", source, "answered")], 1, m)
                self.assertEqual(m[("addresses", source, None)], 1, m)
        finally:
            DNS.failing = False
        for host in ("evpool.test", "sgpool.test"):
            logged = "%s resolves again, to 1 address: %s" % (host, POD)
            self.until("%s's answer logged" % host, lambda logs: logged in logs,
                       self.daemon.logs)
        again = self.workers()
        self.assertEqual(sorted(again), sorted(before))
        self.assertEqual(again[self.ev].replays, before[self.ev].replays)
        self.assertEqual(self.held(list(range(2 * BS))), {self.ev: 2})

    def test_3_nxdomain_retires_the_workers(self):
        self.following()
        DNS.records.clear()
        try:
            self.until("both pools' workers gone", lambda ws: not ws, self.workers)
            for host in ("evpool.test", "sgpool.test"):
                self.assertIn("%s resolves to 0 addresses" % host, self.daemon.logs())
            m = self.pool_metrics()
            self.assertEqual((m[("addresses", "ev", None)], m[("addresses", "sg", None)]),
                             (0, 0), m)
            self.assertEqual(self.held(list(range(BS))), {})
        finally:
            DNS.records.update(RECORDS)


if __name__ == "__main__":
    if not ARGS.prefixd:
        print("SKIP: --prefixd not given")
        sys.exit(common.SKIP)
    hosts_namespace.enter(ARGS)
    hosts_namespace.mount("127.0.0.1 localhost\n")
    DNS = dns_server.start(RECORDS)
    common.unittest_main()
