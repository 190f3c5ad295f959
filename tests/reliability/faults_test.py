#!/usr/bin/python3
"""Faults against the real daemon (docs/operations.md):

- a client that dies holding leases: they expire on their short TTL and the
  blocks they pinned become evictable;
- SIGTERM with no load: the restart restores the same epoch, and Stats and
  every Dump are byte-identical;
- SIGTERM in the middle of load: every call ends OK, with an expected error,
  or UNAVAILABLE once the drain began, never cut off; the restart has the
  same epoch and caches exactly what the clients' ledger says;
- a start that fails (the gRPC or the metrics port is taken) after the
  snapshot was restored: the snapshot is put back for the next start;
- a second daemon on the same snapshot_path: refuses to start, naming the
  first's pid, and the first keeps its cache;
- SIGHUP: new principals from the config file without losing the cache; a
  bad config refused with one log line while the old principals stay;
- SIGHUP with TLS: a new CA-signed certificate and key are served to new
  connections and the cache stays; a broken certificate file is refused
  with one log line and the old certificate keeps being served;
- SIGKILL after a restore: the snapshot was consumed, so the restart is empty
  with a new epoch (trusted once);
- a corrupt snapshot and one for another model: moved aside with one log
  line, the daemon starts empty with a new epoch.

Usage: faults_test.py --prefixd PATH [--stubs DIR]
"""

import glob
import hashlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import grpc  # noqa: E402

import load  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd.v1 import prefix_cache_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_cache_pb2_grpc as pb_grpc  # noqa: E402

BLOCK = 16
BUDGET_BLOCKS = 512
TENANTS = ["t0", "t1", "t2", "t3"]
CONFIG = ('kv_budget: "%dMiB"\nblock_size: %d\ndrain_timeout: "10s"\n'
          % (BUDGET_BLOCKS * 2, BLOCK))


def tokens(first_block, n_blocks):
    return [b * BLOCK + j for b in range(first_block, first_block + n_blocks)
            for j in range(BLOCK)]


def wait_for(predicate, timeout, what):
    """Polls `predicate` until it holds; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))


class FaultTest(unittest.TestCase):
    def setUp(self):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        self.daemon = prefixd_fixture.Daemon(ARGS.prefixd, CONFIG)
        self.addCleanup(self.daemon.close)
        self.daemon.start()
        self.snapshot = os.path.join(self.daemon.tmp, "snapshot.bin")

    def stub(self):
        ch = load.channel(self.daemon.tcp)
        self.addCleanup(ch.close)
        return pb_grpc.PrefixCacheStub(ch)

    def epoch(self):
        return self.stub().GetInfo(pb.GetInfoRequest(), timeout=10).epoch

    def stats(self, tenant):
        s = self.stub().Stats(pb.StatsRequest(), metadata=load.metadata(tenant), timeout=10)
        return s.tenants[0] if s.tenants else None

    def restart(self, sig):
        """Stops the daemon with `sig` and starts it again on the same paths."""
        if sig == signal.SIGTERM:
            self.assertEqual(self.daemon.stop(), 0, self.daemon.logs())
        else:
            self.daemon.kill()
        self.daemon.start()

    # ---- a client dies holding leases ----

    def test_leases_of_a_dead_client_expire_and_free_its_blocks(self):
        script = textwrap.dedent("""
            import os, signal, sys
            sys.path.insert(0, %r)
            import grpc
            from prefixd.v1 import prefix_cache_pb2 as pb, prefix_cache_pb2_grpc as pb_grpc
            stub = pb_grpc.PrefixCacheStub(grpc.insecure_channel(%r))
            md = (("x-prefixd-tenant", "dying"),)
            toks = %r
            r = stub.Insert(pb.InsertRequest(tokens=toks, block_ids=[71, 72, 73, 74], pin=True,
                                             lease_ttl_ms=700), metadata=md, timeout=10)
            m = stub.Match(pb.MatchRequest(tokens=toks[:32], pin=True, lease_ttl_ms=700),
                           metadata=md, timeout=10)
            print(r.lease_id, m.lease_id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)   # no Release, no goodbye
        """) % (ARGS.stubs, self.daemon.tcp, tokens(0, 4))
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, -signal.SIGKILL, p.stderr)
        leases = [int(x) for x in p.stdout.split()]
        self.assertEqual(len(leases), 2)
        self.assertTrue(all(leases))
        # The TTL is 700 ms; whether they are still there depends on how long
        # the child took, so check only what must hold eventually.
        wait_for(lambda: self.stats("dying").active_leases == 0, 10, "the leases to expire")
        t = self.stats("dying")
        self.assertEqual(t.pinned_blocks, 0)
        self.assertEqual(t.lease_expired, 2)
        self.assertEqual(t.cached_blocks, 4)
        stub = self.stub()
        with self.assertRaises(grpc.RpcError) as e:
            stub.Release(pb.ReleaseRequest(lease_id=leases[0]), metadata=load.metadata("dying"),
                         timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        r = stub.Evict(pb.EvictRequest(blocks=10), metadata=load.metadata("dying"), timeout=10)
        self.assertEqual(sorted(r.evicted_block_ids), [71, 72, 73, 74])

    # ---- clean restarts ----

    def test_sigterm_restores_the_same_epoch_stats_and_trees(self):
        ledger = load.Ledger()
        load.run_load(self.daemon.tcp, TENANTS, 4, 3, ledger, BLOCK)
        stub = self.stub()
        # Leases survive too: pin something with a long TTL.
        lease = stub.Match(pb.MatchRequest(tokens=tokens(0, 2), pin=True),
                           metadata=load.metadata("t0"), timeout=10)
        ins = stub.Insert(pb.InsertRequest(tokens=tokens(1000, 3), block_ids=[1, 2, 3], pin=True),
                          metadata=load.metadata("t0"), timeout=10)
        ledger.hand_in([1, 2, 3])
        ledger.hand_back(ins.redundant_block_ids)
        ledger.hand_back(ins.evicted_block_ids)
        epoch, before = self.epoch(), load.state(stub, TENANTS)

        self.restart(signal.SIGTERM)
        self.assertIn("snapshot written to " + self.snapshot, self.daemon.logs())
        self.assertIn("restored snapshot " + self.snapshot, self.daemon.logs())
        self.assertEqual(self.epoch(), epoch)
        stub = self.stub()
        self.assertEqual(load.state(stub, TENANTS), before)
        self.assertEqual(ledger.check(load.dump_all(stub, TENANTS)), [])
        self.assertFalse(os.path.exists(self.snapshot), "the snapshot must be consumed")
        stub.KeepAlive(pb.KeepAliveRequest(lease_ids=[ins.lease_id]),
                       metadata=load.metadata("t0"), timeout=10)
        if lease.lease_id:
            stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id),
                         metadata=load.metadata("t0"), timeout=10)

    def test_sigterm_under_load_then_sigkill(self):
        ledger = load.Ledger()
        workers = [load.Worker(i, self.daemon.tcp, TENANTS[i % 4], ledger, BLOCK,
                               time.monotonic() + 120, 77 + i, stop_on_unavailable=True)
                   for i in range(8)]
        for w in workers:
            w.start()
        wait_for(lambda: ledger.ok_calls() > 2000, 60, "load to build up")
        epoch = self.epoch()
        self.daemon.proc.send_signal(signal.SIGTERM)
        for w in workers:
            w.join(60)
            self.assertFalse(w.is_alive(), w.name)
            self.assertIsNone(w.error, "%s: %r" % (w.name, w.error))
            self.assertTrue(w.stopped_by_daemon, w.name)
        self.assertEqual(self.daemon.proc.wait(30), 0, self.daemon.logs())
        print("sigterm under load: %s" % ledger.summary())
        # In-flight calls completed: nothing but documented codes, and calls
        # the draining daemon refused (UNAVAILABLE, or CANCELLED by gRPC for
        # calls that never reached a handler). The ledger check after the
        # restart proves those had no effect.
        self.assertEqual([u for u in ledger.unexpected
                          if u[1] not in ("UNAVAILABLE", "CANCELLED")], [])

        self.daemon.start()
        self.assertEqual(self.epoch(), epoch)
        stub = self.stub()
        self.assertEqual(ledger.check(load.dump_all(stub, TENANTS)), [],
                         "the restored daemon must cache exactly what the clients know")

        # Trusted once: the snapshot was consumed, so a crash now loses it.
        self.restart(signal.SIGKILL)
        self.assertNotEqual(self.epoch(), epoch)
        stats = self.stub().Stats(pb.StatsRequest(all_tenants=True), timeout=10)
        self.assertEqual(sum(t.cached_blocks for t in stats.tenants), 0)
        self.assertIn("no snapshot at " + self.snapshot, self.daemon.logs())

    def test_a_start_that_fails_keeps_the_snapshot(self):
        self.stub().Insert(pb.InsertRequest(tokens=tokens(0, 2), block_ids=[1, 2]), timeout=10)
        epoch = self.epoch()
        self.assertEqual(self.daemon.stop(), 0, self.daemon.logs())
        # The TCP port is taken: the daemon restores, cannot listen, and puts
        # the snapshot back, since it served nothing from it.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            p = subprocess.run(
                [ARGS.prefixd, "--listen=127.0.0.1:%d" % taken.getsockname()[1],
                 "--metrics_listen=127.0.0.1:0", "--block_size=%d" % BLOCK,
                 "--kv_budget=%dMiB" % (BUDGET_BLOCKS * 2), "--snapshot_path=" + self.snapshot],
                capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("restored snapshot", p.stderr)
        self.assertIn("cannot start", p.stderr)
        self.assertTrue(os.path.exists(self.snapshot), p.stderr)
        self.assertFalse(os.path.exists(self.snapshot + ".consumed"))
        self.daemon.start()
        self.assertEqual(self.epoch(), epoch)
        self.assertEqual(self.stats("default").cached_blocks, 2)

    def test_a_start_that_fails_on_the_metrics_port_keeps_the_snapshot(self):
        self.stub().Insert(pb.InsertRequest(tokens=tokens(0, 2), block_ids=[1, 2]), timeout=10)
        epoch = self.epoch()
        self.assertEqual(self.daemon.stop(), 0, self.daemon.logs())
        # gRPC listens, but the metrics port is taken: the daemon fails after
        # the server started, and the restored cache must survive that too.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            p = subprocess.run(
                [ARGS.prefixd, "--listen=127.0.0.1:0",
                 "--metrics_listen=127.0.0.1:%d" % taken.getsockname()[1],
                 "--block_size=%d" % BLOCK, "--kv_budget=%dMiB" % (BUDGET_BLOCKS * 2),
                 "--snapshot_path=" + self.snapshot],
                capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("restored snapshot", p.stderr)
        self.assertIn("cannot serve metrics", p.stderr)
        self.assertTrue(os.path.exists(self.snapshot), p.stderr)
        self.assertFalse(os.path.exists(self.snapshot + ".consumed"))
        self.daemon.start()
        self.assertEqual(self.epoch(), epoch)
        self.assertEqual(self.stats("default").cached_blocks, 2)

    def test_a_second_daemon_on_the_same_snapshot_path_refuses_to_start(self):
        self.stub().Insert(pb.InsertRequest(tokens=tokens(0, 2), block_ids=[1, 2]), timeout=10)
        epoch = self.epoch()
        try:
            p = subprocess.run(
                [ARGS.prefixd, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                 "--block_size=%d" % BLOCK, "--kv_budget=%dMiB" % (BUDGET_BLOCKS * 2),
                 "--snapshot_path=" + self.snapshot],
                capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired as e:
            self.fail("a second daemon on %s kept running: %s" % (self.snapshot, e.stderr))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("another prefixd (pid %d) uses snapshot_path %s"
                      % (self.daemon.proc.pid, self.snapshot), p.stderr)
        # The first daemon is untouched: it still serves, and its stop
        # writes the snapshot the next start restores.
        self.assertEqual(self.stats("default").cached_blocks, 2)
        self.restart(signal.SIGTERM)
        self.assertEqual(self.epoch(), epoch)
        self.assertEqual(self.stats("default").cached_blocks, 2)

    def test_sighup_rotates_principals_and_refuses_a_bad_config(self):
        def config(*principals):
            return CONFIG + 'auth { mode: TOKEN }\ndynamic_tenants { enabled: true }\n' + "".join(
                'principals { name: "%s" role: ENGINE tenants: "*" token_sha256: "%s" }\n'
                % (name, hashlib.sha256(token.encode()).hexdigest())
                for name, token in principals)

        def md(token):
            return [("authorization", "Bearer " + token), ("x-prefixd-tenant", "t0")]

        daemon = prefixd_fixture.Daemon(ARGS.prefixd, config(("old", "old-token-0123")))
        self.addCleanup(daemon.close)
        daemon.start()
        ch = load.channel(daemon.tcp)
        self.addCleanup(ch.close)
        stub = pb_grpc.PrefixCacheStub(ch)
        stub.Insert(pb.InsertRequest(tokens=tokens(0, 2), block_ids=[1, 2]),
                    metadata=md("old-token-0123"), timeout=10)
        epoch = stub.GetInfo(pb.GetInfoRequest(), metadata=md("old-token-0123"), timeout=10).epoch

        def rotate(text, line):
            with open(os.path.join(daemon.tmp, "prefixd.textproto"), "w") as f:
                f.write(text)
            seen = daemon.logs().count(line)
            daemon.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: daemon.logs().count(line) > seen, 10, line)

        rotate(config(("new", "new-token-4567")), "prefixd: SIGHUP: principals reloaded")
        stats = stub.Stats(pb.StatsRequest(), metadata=md("new-token-4567"), timeout=10)
        self.assertEqual(stats.tenants[0].cached_blocks, 2)  # the cache stayed
        with self.assertRaises(grpc.RpcError) as e:
            stub.Stats(pb.StatsRequest(), metadata=md("old-token-0123"), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        # A principal named twice: refused with one line, the old table stays.
        rotate(config(("new", "new-token-4567"), ("new", "other-token-89")),
               "prefixd: SIGHUP: configuration refused, the old one stays in force:")
        self.assertIn("names must be unique", daemon.logs().splitlines()[-1])
        self.assertEqual(stub.GetInfo(pb.GetInfoRequest(), metadata=md("new-token-4567"),
                                      timeout=10).epoch, epoch)

    def test_sighup_rotates_the_tls_certificate_and_keeps_the_cache(self):
        pki = os.path.join(self.daemon.tmp, "pki")
        os.mkdir(pki)

        def openssl(*args):
            subprocess.run(["openssl"] + list(args), cwd=pki, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def issue(name):  # a key and a certificate for 127.0.0.1 signed by the CA
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key",
                    "-subj", "/CN=" + name, "-out", name + ".csr")
            with open(os.path.join(pki, "san.ext"), "w") as f:
                f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
            openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", name + ".pem")
            with open(os.path.join(pki, name + ".pem")) as f:
                return f.read()

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                "-subj", "/CN=test-ca", "-days", "2", "-out", "ca.pem")
        first, second = issue("first"), issue("second")

        def install(name):  # where the config points: server.pem, server.key
            for ext in (".pem", ".key"):
                with open(os.path.join(pki, name + ext)) as src, \
                        open(os.path.join(pki, "server" + ext), "w") as dst:
                    dst.write(src.read())

        install("first")
        token = "rotate-token-0123"
        port = prefixd_fixture.free_port()
        config = os.path.join(self.daemon.tmp, "tls.textproto")
        with open(config, "w") as f:
            f.write(CONFIG + 'auth { mode: TOKEN tls_cert_path: "%s" tls_key_path: "%s" }\n'
                    'principals { name: "e" role: ENGINE tenants: "*" token_sha256: "%s" }\n'
                    'dynamic_tenants { enabled: true }\n'
                    % (os.path.join(pki, "server.pem"), os.path.join(pki, "server.key"),
                       hashlib.sha256(token.encode()).hexdigest()))
        err = open(os.path.join(self.daemon.tmp, "tls.err"), "w+")
        self.addCleanup(err.close)
        proc = subprocess.Popen([ARGS.prefixd, "--config=" + config,
                                 "--listen=127.0.0.1:%d" % port,
                                 "--metrics_listen=127.0.0.1:%d" % prefixd_fixture.free_port()],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)

        def logs():
            with open(err.name) as f:
                return f.read()

        with open(os.path.join(pki, "ca.pem"), "rb") as f:
            ca = f.read()
        md = [("authorization", "Bearer " + token), ("x-prefixd-tenant", "t0")]

        def new_stub():  # a new connection: a new TLS handshake
            ch = grpc.secure_channel("127.0.0.1:%d" % port, grpc.ssl_channel_credentials(ca))
            self.addCleanup(ch.close)
            return pb_grpc.PrefixCacheStub(ch)

        def served():  # the certificate a new TLS connection is shown, as PEM
            ctx = ssl.create_default_context(cadata=ca.decode())
            ctx.set_alpn_protocols(["h2"])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                    return ssl.DER_cert_to_PEM_cert(tls.getpeercert(binary_form=True))

        def same(a, b):
            return ssl.PEM_cert_to_DER_cert(a) == ssl.PEM_cert_to_DER_cert(b)

        stub = new_stub()
        stub.GetInfo(pb.GetInfoRequest(), metadata=md, timeout=15, wait_for_ready=True)
        stub.Insert(pb.InsertRequest(tokens=tokens(0, 2), block_ids=[1, 2]), metadata=md,
                    timeout=10)
        epoch = stub.GetInfo(pb.GetInfoRequest(), metadata=md, timeout=10).epoch
        self.assertTrue(same(served(), first))

        def sighup(line):
            seen = logs().count(line)
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: logs().count(line) > seen, 10, line)

        install("second")
        sighup("prefixd: SIGHUP: principals reloaded")
        wait_for(lambda: same(served(), second), 10, "the second certificate served")
        stub = new_stub()
        self.assertEqual(stub.Match(pb.MatchRequest(tokens=tokens(0, 2)), metadata=md,
                                    timeout=10).matched_tokens, len(tokens(0, 2)))
        self.assertEqual(stub.GetInfo(pb.GetInfoRequest(), metadata=md, timeout=10).epoch, epoch)

        # A certificate file that is not PEM: refused, the second one stays.
        with open(os.path.join(pki, "server.pem"), "w") as f:
            f.write("not a certificate\n")
        sighup("prefixd: SIGHUP: configuration refused, the old one stays in force:")
        self.assertIn("auth.tls_cert_path: %s: no PEM certificate" % os.path.join(pki, "server.pem"),
                      logs().splitlines()[-1])
        time.sleep(2.5)  # two refreshes of the certificate watcher
        self.assertTrue(same(served(), second))
        self.assertEqual(new_stub().Match(pb.MatchRequest(tokens=tokens(0, 2)), metadata=md,
                                          timeout=10).matched_tokens, len(tokens(0, 2)))

    # ---- snapshots that cannot be used ----

    def test_a_corrupt_snapshot_is_moved_aside(self):
        self.stub().Insert(pb.InsertRequest(tokens=tokens(0, 2), block_ids=[1, 2]), timeout=10)
        epoch = self.epoch()
        self.assertEqual(self.daemon.stop(), 0, self.daemon.logs())
        with open(self.snapshot, "r+b") as f:
            f.seek(20)
            b = f.read(1)
            f.seek(20)
            f.write(bytes([b[0] ^ 0xFF]))
        self.daemon.start()
        self.assertNotEqual(self.epoch(), epoch)
        self.assertIsNone(self.stats("default"))
        aside = glob.glob(self.snapshot + ".bad-*")
        self.assertEqual(len(aside), 1, os.listdir(self.daemon.tmp))
        lines = [l for l in self.daemon.logs().splitlines() if "is unusable" in l]
        self.assertEqual(len(lines), 1, self.daemon.logs())
        self.assertIn("checksum", lines[0])
        self.assertIn(aside[0], lines[0])

    def test_a_snapshot_of_another_model_is_moved_aside(self):
        self.stub().Insert(pb.InsertRequest(tokens=tokens(0, 2), block_ids=[1, 2]), timeout=10)
        epoch = self.epoch()
        self.assertEqual(self.daemon.stop(), 0, self.daemon.logs())
        self.daemon.config_text = CONFIG + 'kv_dtype: "fp8"\n'
        self.daemon.start()
        self.assertNotEqual(self.epoch(), epoch)
        self.assertIsNone(self.stats("default"))
        self.assertEqual(len(glob.glob(self.snapshot + ".bad-*")), 1)
        self.assertRegex(self.daemon.logs(),
                         r"is unusable: it was written for model fingerprint [0-9a-f]{16}, "
                         r"this daemon serves [0-9a-f]{16}")


if __name__ == "__main__":
    unittest.main()
