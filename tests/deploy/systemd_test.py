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
still run first and a failure among them still fails).
Usage: systemd_test.py [--repo DIR] [--prefixd PATH]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
MAX_EXPOSURE = 2.0  # systemd-analyze security: 0 (locked down) .. 10 (exposed)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import common  # noqa: E402  (tests/python/common.py)

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


class SystemdTest(common.Checker):
    def __init__(self, repo):
        super().__init__()
        self.unit_path = os.path.join(repo, "deploy", "systemd", "prefixd.service")
        self.sysusers_path = os.path.join(repo, "deploy", "systemd", "prefixd.sysusers")
        self.config_path = os.path.join(repo, "deploy", "config", "prefixd.textproto")
        with open(self.unit_path) as f:
            self.unit_text = f.read()
        self.unit = parse_unit(self.unit_text)
        self.service = self.unit.get("Service", {})
        with open(self.config_path) as f:
            self.config = f.read()

    def test_directives(self):
        for key, want in REQUIRED.items():
            got = self.service.get(key, [])
            self.check(got and got[-1] == want, "[Service] %s=%s" % (key, want), got)
        self.check("TimeoutStopSec" in self.service, "[Service] TimeoutStopSec is set")
        self.check(self.unit.get("Install", {}).get("WantedBy") == ["multi-user.target"],
                   "[Install] WantedBy=multi-user.target")

    def test_agrees_with_config(self):
        runtime = "/run/" + self.service.get("RuntimeDirectory", ["?"])[-1]
        state = "/var/lib/" + self.service.get("StateDirectory", ["?"])[-1]
        listen = textproto_strings(self.config, "listen")
        self.check(listen == ["127.0.0.1:50051", "unix:///run/prefixd/prefixd.sock"],
                   "config listens on 127.0.0.1:50051 and unix:///run/prefixd/prefixd.sock",
                   listen)
        for a in listen:
            if a.startswith("unix://"):
                self.check(os.path.dirname(a[len("unix://"):]) == runtime,
                           "the socket is in RuntimeDirectory %s" % runtime, a)
        snap = textproto_strings(self.config, "snapshot_path")
        self.check(len(snap) == 1 and os.path.dirname(snap[0]) == state,
                   "the snapshot is in StateDirectory %s" % state, snap)
        self.check(re.search(r"auth\s*\{\s*mode:\s*NONE\s*\}", self.config) is not None,
                   "default config: auth NONE (loopback and Unix socket only)")
        config_arg = re.search(r"--config=(\S+)", self.service["ExecStart"][-1]).group(1)
        self.check(os.path.dirname(config_arg) == "/etc/" +
                   self.service.get("ConfigurationDirectory", ["?"])[-1],
                   "the config file is in ConfigurationDirectory")

    def test_sysusers(self):
        with open(self.sysusers_path) as f:
            lines = [l.split() for l in f if l.strip() and not l.startswith("#")]
        self.check(any(l[:2] == ["u", "prefixd"] for l in lines),
                   "sysusers file creates user prefixd", lines)
        tool = shutil.which("systemd-sysusers")
        if tool is None:
            print("note  systemd-sysusers absent: not run")
            return
        with tempfile.TemporaryDirectory() as root:
            os.mkdir(os.path.join(root, "etc"))
            r = run([tool, "--root=" + root, self.sysusers_path])
            with open(os.path.join(root, "etc", "passwd")) as f:
                passwd = f.read()
            self.check(r.returncode == 0 and passwd.startswith("prefixd:"),
                       "systemd-sysusers --root creates prefixd", r.stderr + passwd)

    def test_verify(self, prefixd):
        """False when systemd-analyze is absent."""
        tool = shutil.which("systemd-analyze")
        if tool is None:
            return False
        with tempfile.TemporaryDirectory() as tmp:
            unit = os.path.join(tmp, "prefixd.service")
            binary = os.path.abspath(prefixd) if prefixd else "/bin/true"
            with open(unit, "w") as f:
                f.write(self.unit_text.replace("/usr/bin/prefixd", binary))
            r = run([tool, "verify", unit])
            self.check(r.returncode == 0 and not r.stderr.strip(),
                       "systemd-analyze verify (ExecStart -> %s)" % binary,
                       r.stdout + r.stderr)
            r = run([tool, "security", "--offline=yes", "--no-pager", unit])
            m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout)
            self.check(m is not None and float(m.group(1)) <= MAX_EXPOSURE,
                       "systemd-analyze security: exposure %s <= %.1f"
                       % (m.group(1) if m else "?", MAX_EXPOSURE),
                       (r.stdout + r.stderr)[-2000:])
        return True

    def test_daemon(self, prefixd):
        err = common.serve_config(prefixd, self.config)
        self.check(err is None, "prefixd serves with the default config, exits 0 on SIGTERM",
                   err)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=REPO)
    ap.add_argument("--prefixd", help="the built daemon")
    args = ap.parse_args()
    t = SystemdTest(args.repo)
    t.test_directives()
    t.test_agrees_with_config()
    t.test_sysusers()
    if args.prefixd:
        t.test_daemon(args.prefixd)
    verified = t.test_verify(args.prefixd)
    if t.exit_code():
        return 1
    if not verified:
        print("SKIP: systemd-analyze not found: the unit was not verified (apt-get install systemd)")
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())
