#!/usr/bin/python3
"""What the real prefixd says about the start-up mistakes a first user makes:
one line each, naming the address or the flag and what to change, not a
library's words.

Usage: startup_errors_test.py --prefixd PATH [unittest args]
"""

import argparse
import socket
import subprocess
import sys
import tempfile
import unittest

ARGS = None
TIMEOUT_S = 30


def prefixd(*args):
    return subprocess.run([ARGS.prefixd] + list(args), capture_output=True, text=True,
                          timeout=TIMEOUT_S)


class BusyPorts(unittest.TestCase):
    """A port another process listens on: one line naming it and the flag."""

    def setUp(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.addCleanup(self.sock.close)
        self.busy = "127.0.0.1:%d" % self.sock.getsockname()[1]

    def test_grpc_port(self):
        r = prefixd("--listen=" + self.busy, "--metrics_listen=127.0.0.1:0")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stderr, "prefixd: cannot start: %s: address already in use (is "
                         "another prefixd running? change --listen or listen in the config)\n"
                         % self.busy)

    def test_metrics_port(self):
        r = prefixd("--listen=127.0.0.1:0", "--metrics_listen=" + self.busy)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stderr, "prefixd: cannot serve metrics: %s: address already in use "
                         "(is another prefixd running? change --metrics_listen or "
                         "metrics_listen in the config)\n" % self.busy)

    def test_conductor_port(self):
        r = prefixd("--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                    "--index_http_listen=" + self.busy)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stderr, "prefixd: cannot serve the Conductor API: %s: address "
                         "already in use (is another prefixd running? change "
                         "--index_http_listen or index.http_listen in the config)\n"
                         % self.busy)


class IndexListenExposure(unittest.TestCase):
    """An index `listen` socket other hosts can reach takes unauthenticated
    events: said at start-up and by --check_config, for such addresses only."""

    WARNING = ("WARNING: index listen %s takes KV events from every host that can reach it, "
               "unauthenticated: any of them can add or clear blocks of any worker name. Keep "
               "it on a private network (docs/index.md, Limits)")

    def check_config(self, endpoint):
        with tempfile.NamedTemporaryFile("w", suffix=".textproto") as f:
            r = prefixd("--check_config=" + f.name, "--index_listen=" + endpoint)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_check_config(self):
        for endpoint in ("tcp://0.0.0.0:5557", "tcp://*:5557", "tcp://10.0.0.5:5557"):
            self.assertIn("\n# " + self.WARNING % endpoint + "\n", self.check_config(endpoint))
        for endpoint in ("tcp://127.0.0.1:5557", "ipc:///tmp/prefixd-index.sock"):
            self.assertNotIn("WARNING", self.check_config(endpoint))

    def test_start_up_banner(self):
        endpoint = "tcp://0.0.0.0:*"  # a free port, for the moment the daemon runs
        p = subprocess.Popen([ARGS.prefixd, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                              "--index_listen=" + endpoint], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        banner = []
        try:
            for line in p.stdout:  # the banner ends with the auth warning (auth is off)
                banner.append(line.rstrip("\n"))
                if line.startswith("WARNING: authentication is OFF"):
                    break
        finally:
            p.terminate()
            p.communicate(timeout=TIMEOUT_S)
        self.assertIn(self.WARNING % endpoint, banner)


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefixd", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
