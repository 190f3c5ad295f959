#!/usr/bin/python3
"""What the real prefixd says about the start-up mistakes a first user makes:
one line each, naming the address or the flag and what to change, not a
library's words.

Usage: startup_errors_test.py --prefixd PATH [unittest args]
"""

import argparse
import os
import socket
import subprocess
import sys
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


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefixd", required=True)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
