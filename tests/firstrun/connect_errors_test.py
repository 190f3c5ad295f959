#!/usr/bin/python3
"""Connection errors are one actionable line, in prefixctl (the C++ client)
and in the Python client, against real daemons.

Three real prefixd processes: plaintext, TOKEN with TLS, and MTLS (a CA,
server and client certificates made here with openssl). Then each mistake a
new user makes, through prefixctl and through prefixd.Client:

- a file path as the address (gRPC took it for a host name: a DNS error):
  the answer names unix:///that/path;
- plaintext to the TLS port ("Socket closed"): connect with TLS, --tls_ca;
- TLS without a client certificate to the MTLS port: give one;
- TLS to the plaintext port: it does not serve TLS;
- no daemon on the port, or no socket file ("Connection refused"): is the
  daemon running at ADDR?

Each answer is one line naming the address. A working call on each daemon is
the control: the daemons are up, only the client's mistake fails.

Usage: connect_errors_test.py --prefixd PATH --prefixctl PATH [--stubs DIR]
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import common  # noqa: E402  (tests/python/common.py)
from pki import make_pki  # noqa: E402  (tests/python/pki.py)

ARGS = None
TOKEN = "connect-errors-test-token"
TOKEN_SHA256 = hashlib.sha256(TOKEN.encode()).hexdigest()
START_TIMEOUT_S = 30


class Daemon:
    """The real prefixd on a free TCP port and a Unix socket; ready when
    health answers SERVING on the (always plaintext) Unix socket."""

    def __init__(self, name, config, tmp):
        import prefixd_fixture
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir)
        self.tcp = "127.0.0.1:%d" % prefixd_fixture.free_port()
        self.unix = "unix://" + os.path.join(self.dir, "prefixd.sock")
        path = os.path.join(self.dir, "prefixd.textproto")
        with open(path, "w") as f:
            f.write(config)
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.proc = subprocess.Popen(
            [ARGS.prefixd, "--config=" + path, "--listen=" + self.tcp, "--listen=" + self.unix,
             "--metrics_listen=127.0.0.1:%d" % prefixd_fixture.free_port()],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError("%s exited: %s" % (name, self.log.read()))
            try:
                if prefixd_fixture.health_status(self.unix, timeout=1.0) == 1:
                    return
            except Exception:  # grpc.RpcError: not up yet
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def stop(self):
        common.stop_process(self.proc)
        self.log.close()


class ConnectErrorsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmpdir = tempfile.TemporaryDirectory(prefix="prefixd-connect-")
        t = cls.tmp = cls.tmpdir.name
        make_pki(t)
        pem = lambda n: os.path.join(t, n)  # noqa: E731
        cls.plain = Daemon("plain", "", t)
        cls.tls = Daemon("tls", 'auth { mode: TOKEN tls_cert_path: "%s" tls_key_path: "%s" }\n'
                         'principals { name: "ops" role: ADMIN token_sha256: "%s" }\n'
                         % (pem("server.pem"), pem("server.key"), TOKEN_SHA256), t)
        cls.mtls = Daemon("mtls", 'auth { mode: MTLS tls_cert_path: "%s" tls_key_path: "%s" '
                          'client_ca_path: "%s" }\n'
                          'principals { name: "engine-0" role: ADMIN cert_subject: "engine-0" }\n'
                          % (pem("server.pem"), pem("server.key"), pem("ca.pem")), t)
        cls.ca = pem("ca.pem")
        cls.cert = ["--tls_cert", pem("client.pem"), "--tls_key", pem("client.key")]
        import prefixd_fixture
        cls.nobody = "127.0.0.1:%d" % prefixd_fixture.free_port()

    @classmethod
    def tearDownClass(cls):
        for d in (cls.plain, cls.tls, cls.mtls):
            d.stop()
        cls.tmpdir.cleanup()

    # ---- helpers ----

    def ctl(self, addr, *args, command="info"):
        r = subprocess.run([ARGS.prefixctl, "--addr", addr, "--timeout", "5s"] + list(args)
                           + [command], capture_output=True, text=True, timeout=30)
        return r.returncode, r.stdout, r.stderr

    def assert_one_line(self, text, *needles):
        lines = text.strip().split("\n")
        self.assertEqual(len(lines), 1, text)
        for n in needles:
            self.assertIn(n, lines[0])

    def py_error(self, addr, **kw):
        import prefixd
        c = prefixd.Client(addr, deadline=5.0, **kw)
        try:
            with self.assertRaises(prefixd.Unavailable) as e:
                c.info()
            return str(e.exception)
        finally:
            c.close()

    # ---- the controls: every daemon answers a correct client ----

    def test_controls(self):
        import prefixd
        self.assertEqual(self.ctl(self.plain.tcp)[0], 0)
        self.assertEqual(self.ctl(self.tls.tcp, "--tls_ca", self.ca, "--token", TOKEN)[0], 0)
        self.assertEqual(self.ctl(self.mtls.tcp, "--tls_ca", self.ca, *self.cert)[0], 0)
        with prefixd.Client(self.mtls.tcp, tls_ca_file=self.ca,
                            tls_cert_file=os.path.join(self.tmp, "client.pem"),
                            tls_key_file=os.path.join(self.tmp, "client.key")) as c:
            self.assertEqual(c.health(), "SERVING")

    # ---- a file path as the address ----

    def test_bare_path(self):
        path = self.plain.unix[len("unix://"):]
        rc, _, err = self.ctl(path)
        self.assertEqual(rc, 2, err)
        self.assert_one_line(err, "is a file path", "unix://" + path)
        import prefixd
        with self.assertRaises(ValueError) as e:
            prefixd.Client(path)
        self.assertIn("unix://" + path, str(e.exception))
        # and the suggested address works
        self.assertEqual(self.ctl("unix://" + path)[0], 0)

    # ---- plaintext to TLS, TLS to plaintext, mTLS without a certificate ----

    def test_plaintext_to_tls_port(self):
        for command in ("info", "health"):
            rc, _, err = self.ctl(self.tls.tcp, "--token", TOKEN, command=command)
            self.assertEqual(rc, 1, err)
            self.assert_one_line(err, "cannot connect to " + self.tls.tcp, "serves TLS",
                                 "--tls_ca")
        self.assertIn("tls_ca_file=", self.py_error(self.tls.tcp, token=TOKEN))

    def test_mtls_without_a_client_certificate(self):
        rc, _, err = self.ctl(self.mtls.tcp, "--tls_ca", self.ca)
        self.assertEqual(rc, 1, err)
        self.assert_one_line(err, "cannot connect to " + self.mtls.tcp,
                             "requires a client certificate", "--tls_cert")
        self.assertIn("requires a client certificate",
                      self.py_error(self.mtls.tcp, tls_ca_file=self.ca))

    def test_plaintext_client_to_mtls_port(self):
        rc, _, err = self.ctl(self.mtls.tcp)
        self.assertEqual(rc, 1, err)
        self.assert_one_line(err, "cannot connect to " + self.mtls.tcp, "serves TLS")

    def test_tls_to_plaintext_port(self):
        rc, _, err = self.ctl(self.plain.tcp, "--tls_ca", self.ca)
        self.assertEqual(rc, 1, err)
        self.assert_one_line(err, "cannot connect to " + self.plain.tcp,
                             "does not serve TLS")
        self.assertIn("does not serve TLS", self.py_error(self.plain.tcp, tls_ca_file=self.ca))

    # ---- nobody there ----

    def test_daemon_not_running(self):
        for command in ("info", "health"):
            rc, _, err = self.ctl(self.nobody, command=command)
            self.assertEqual(rc, 1, err)
            self.assert_one_line(err, "connection refused",
                                 "is the daemon running at %s?" % self.nobody)
        self.assertIn("is the daemon running at %s?" % self.nobody, self.py_error(self.nobody))

    def test_no_socket_file(self):
        addr = "unix://" + os.path.join(self.tmp, "absent.sock")
        rc, _, err = self.ctl(addr)
        self.assertEqual(rc, 1, err)
        self.assert_one_line(err, "no such socket file", "is the daemon running at %s?" % addr)
        self.assertIn("is the daemon running at %s?" % addr, self.py_error(addr))


def main():
    global ARGS
    ARGS = common.setup(__doc__, extra=lambda ap: ap.add_argument("--prefixctl", required=True))
    unittest.main()


if __name__ == "__main__":
    main()
