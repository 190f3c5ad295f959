#!/usr/bin/python3
"""Checks deploy/systemd/prefixd.service, its sysusers file and the package's
default config deploy/config/prefixd.textproto.

- the unit has the hardening and directories it promises, and agrees with
  the config (socket under RuntimeDirectory, snapshot under StateDirectory,
  User = the sysusers user);
- `systemd-analyze verify` accepts it (on a copy whose ExecStart names the
  built daemon: verify insists the binary exists), and `systemd-analyze
  security --offline` rates its exposure at most MAX_EXPOSURE;
- `systemd-sysusers --root` creates the user from the sysusers file;
- the real daemon serves with the default config (listeners moved to a free
  port and a temp dir) and exits 0 on SIGTERM.

Exit 0 pass, 1 fail, 77 skip (systemd-analyze absent; the other checks
still run and a failure among them still fails).
Usage: systemd_test.py [--repo DIR] [--prefixd PATH] [unittest args]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

MAX_EXPOSURE = 2.0  # systemd-analyze security: 0 (locked down) .. 10 (exposed)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = None

REQUIRED = {
    "User": "prefixd",
    "Group": "prefixd",
    "ExecStart": "/usr/bin/prefixd --config=/etc/prefixd/config.textproto",
    "KillSignal": "SIGTERM",
    "RuntimeDirectory": "prefixd",
    "StateDirectory": "prefixd",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "CapabilityBoundingSet": "",
}


def parse_unit(text):
    """{section: {key: [values]}}; repeated keys accumulate."""
    sections, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        m = re.match(r"^\[(.+)\]$", line)
        if m:
            current = sections.setdefault(m.group(1), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def textproto_strings(text, field):
    return re.findall(r'^\s*%s\s*:\s*"([^"]*)"' % re.escape(field), text, re.M)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


class SystemdTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.unit_path = os.path.join(ARGS.repo, "deploy", "systemd", "prefixd.service")
        cls.sysusers_path = os.path.join(ARGS.repo, "deploy", "systemd", "prefixd.sysusers")
        with open(cls.unit_path) as f:
            cls.unit_text = f.read()
        cls.unit = parse_unit(cls.unit_text)
        cls.service = cls.unit.get("Service", {})
        with open(os.path.join(ARGS.repo, "deploy", "config", "prefixd.textproto")) as f:
            cls.config = f.read()

    def test_directives(self):
        for key, want in REQUIRED.items():
            with self.subTest(key):
                self.assertEqual(self.service.get(key, [])[-1:], [want],
                                 "[Service] %s=%s" % (key, want))
        self.assertIn("TimeoutStopSec", self.service, "[Service] TimeoutStopSec is set")
        self.assertEqual(self.unit.get("Install", {}).get("WantedBy"), ["multi-user.target"],
                         "[Install] WantedBy=multi-user.target")

    def test_agrees_with_config(self):
        runtime = "/run/" + self.service.get("RuntimeDirectory", ["?"])[-1]
        state = "/var/lib/" + self.service.get("StateDirectory", ["?"])[-1]
        listen = textproto_strings(self.config, "listen")
        self.assertEqual(listen, ["127.0.0.1:50051", "unix:///run/prefixd/prefixd.sock"],
                         "config listens on 127.0.0.1:50051 and unix:///run/prefixd/prefixd.sock")
        for a in listen:
            if a.startswith("unix://"):
                self.assertEqual(os.path.dirname(a[len("unix://"):]), runtime,
                                 "the socket is in RuntimeDirectory %s" % runtime)
        snap = textproto_strings(self.config, "snapshot_path")
        self.assertTrue(len(snap) == 1 and os.path.dirname(snap[0]) == state,
                        "the snapshot is in StateDirectory %s: %s" % (state, snap))
        self.assertRegex(self.config, r"auth\s*\{\s*mode:\s*NONE\s*\}",
                         "default config: auth NONE (loopback and Unix socket only)")
        config_arg = re.search(r"--config=(\S+)", self.service["ExecStart"][-1]).group(1)
        self.assertEqual(os.path.dirname(config_arg),
                         "/etc/" + self.service.get("ConfigurationDirectory", ["?"])[-1],
                         "the config file is in ConfigurationDirectory")

    def test_sysusers(self):
        with open(self.sysusers_path) as f:
            lines = [l.split() for l in f if l.strip() and not l.startswith("#")]
        self.assertIn(["u", "prefixd"], [l[:2] for l in lines],
                      "sysusers file creates user prefixd")
        tool = shutil.which("systemd-sysusers")
        if tool is None:
            print("note  systemd-sysusers absent: not run")
            return
        with tempfile.TemporaryDirectory() as root:
            os.mkdir(os.path.join(root, "etc"))
            r = run([tool, "--root=" + root, self.sysusers_path])
            with open(os.path.join(root, "etc", "passwd")) as f:
                passwd = f.read()
            self.assertTrue(r.returncode == 0 and passwd.startswith("prefixd:"),
                            "systemd-sysusers --root creates prefixd\n" + r.stderr + passwd)

    def analyze(self, *args):
        """systemd-analyze ARGS on a copy of the unit whose ExecStart names
        the built daemon (or /bin/true); skips when systemd-analyze is absent."""
        tool = shutil.which("systemd-analyze")
        if tool is None:
            self.skipTest("systemd-analyze not found: the unit was not verified "
                          "(apt-get install systemd)")
        with tempfile.TemporaryDirectory() as tmp:
            unit = os.path.join(tmp, "prefixd.service")
            with open(unit, "w") as f:
                f.write(self.unit_text.replace("/usr/bin/prefixd", self.binary()))
            return run([tool] + list(args) + [unit])

    @staticmethod
    def binary():
        return os.path.abspath(ARGS.prefixd) if ARGS.prefixd else "/bin/true"

    def test_verify(self):
        r = self.analyze("verify")
        self.assertTrue(r.returncode == 0 and not r.stderr.strip(),
                        "systemd-analyze verify (ExecStart -> %s)\n%s"
                        % (self.binary(), r.stdout + r.stderr))

    def test_security(self):
        r = self.analyze("security", "--offline=yes", "--no-pager")
        m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout)
        self.assertTrue(m is not None and float(m.group(1)) <= MAX_EXPOSURE,
                        "systemd-analyze security: exposure %s <= %.1f\n%s"
                        % (m.group(1) if m else "?", MAX_EXPOSURE,
                           (r.stdout + r.stderr)[-2000:]))

    def test_daemon(self):
        if not ARGS.prefixd:
            print("note  --prefixd not given: the daemon is not run")
            return
        err = common.serve_config(ARGS.prefixd, self.config)
        self.assertIsNone(err, "prefixd serves with the default config, exits 0 on SIGTERM")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=REPO)
    ap.add_argument("--prefixd", help="the built daemon")
    ARGS, rest = ap.parse_known_args()
    common.unittest_main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
