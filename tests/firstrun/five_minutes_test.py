#!/usr/bin/python3
"""docs/index.md's "Try it in five minutes", run verbatim.

Every `$ ` line of the section's code blocks is a command (a line ending in
a backslash goes on with the next one); the lines after it, up to the next
command, are the output the doc shows. The commands run in order with bash,
from a copy of the repository whose build/server/prefixd and
build/client/prefixctl are the binaries given, with no PYTHONPATH nor
PREFIXD_PYTHON_STUBS (the venv's package is what runs). A command ending in
`&` runs in the background: the test waits until its output begins with
what the doc shows, then goes on. A command in the foreground must exit 0
and print what the doc shows; since the daemon catches up with the engines
in the background, a foreground command whose output differs is run again
for up to CATCH_UP_S seconds, as a reader would look again. In both,
`...` stands for any lines, whitespace runs are one space, and what differs
from run to run is masked on both sides: durations (`1.5s`, `12ms`) and
16-hex-digit epochs. Every http://127.0.0.1 address the section names must
answer 200. Then the background processes get SIGTERM (the doc's `kill`)
and must exit 0.

The doc uses fixed ports (the daemon's defaults, 5557-5560) and the
daemon's default Unix socket /tmp/prefixd.sock, so the test runs in a
private network namespace with its own loopback and a private /tmp
(`unshare --net --mount`, as root or in a user namespace): PrivateNamespace
runs this script again there, where FiveMinutes runs the steps (each step,
address and stop a subTest). Where namespaces are not allowed the test is
skipped (exit 77).

Usage: five_minutes_test.py --prefixd PATH --prefixctl PATH [--repo DIR] [--show]
       [unittest args]
(--show prints each command's output and waits 3 s at most for each, for
writing the doc.)
"""

import argparse
import fcntl
import io
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import time
import unittest
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = None
SECTION = "## Try it in five minutes"
DOC = os.path.join("docs", "index.md")
IN_NAMESPACE = "PREFIXD_FIVE_MINUTES_NAMESPACE"
WORK = "/tmp/prefixd"          # inside the private /tmp
CATCH_UP_S = 20                # a foreground command's output may take this long to be right
BACKGROUND_S = 60              # a background command's shown output must appear within this
COMMAND_TIMEOUT_S = 180        # the pip install is the longest
DURATION = re.compile(r"\b(\d+h)?(\d+m)?\d+(\.\d+)?(ns|us|ms|s)\b")
EPOCH = re.compile(r"\b[0-9a-f]{16}\b")
URL = re.compile(r"http://127\.0\.0\.1:\d+/[^\s)`]*")
EXCLUDED_TOP = (".git", ".cache", "venv")  # and build*: what a build or the doc adds


# ---- the doc ----

class Step:
    def __init__(self, command):
        self.command = command
        self.expected = []

    @property
    def background(self):
        return self.command.rstrip().endswith("&")

    def shell(self):
        """The command as bash runs it (a background one without its `&`)."""
        return self.command.rstrip()[:-1].rstrip() if self.background else self.command


def read_section(text):
    start = text.index(SECTION + "\n")
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end >= 0 else len(text)]


def extract_steps(section):
    """The section's commands with the output shown under each."""
    steps, in_block, continues = [], False, False
    for line in section.splitlines():
        if line.startswith("```"):
            in_block, continues = not in_block, False
        elif not in_block:
            continue
        elif continues:
            steps[-1].command += "\n" + line
            continues = line.endswith("\\")
        elif line.startswith("$ "):
            steps.append(Step(line[2:]))
            continues = line.endswith("\\")
        elif steps:
            steps[-1].expected.append(line)
    return steps


def normalize(line):
    return " ".join(EPOCH.sub("<epoch>", DURATION.sub("<duration>", line)).split())


def lines_match(expected, actual, prefix=False):
    """Whether `actual` is `expected` ("..." lines standing for any run of
    lines); with prefix, whether it begins so."""
    exp = [normalize(l) for l in expected]
    act = [normalize(l) for l in actual]
    memo = {}

    def at(i, j):
        if (i, j) not in memo:
            if i == len(exp):
                ok = prefix or j == len(act)
            elif exp[i] == "...":
                ok = any(at(i + 1, k) for k in range(j, len(act) + 1))
            else:
                ok = j < len(act) and exp[i] == act[j] and at(i + 1, j + 1)
            memo[(i, j)] = ok
        return memo[(i, j)]
    return at(0, 0)


# ---- the private namespace ----

def namespace_command():
    """`unshare --net --mount`, with --map-root-user where only a user
    namespace allows it; None where namespaces are not allowed here."""
    for extra in ([], ["--map-root-user"]):
        unshare = ["unshare", "--net", "--mount"] + extra
        if subprocess.run(unshare + ["true"], capture_output=True).returncode == 0:
            return unshare
    return None


def loopback_up():
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = fcntl.ioctl(s, siocgifflags, struct.pack("16sh", b"lo", 0))
        flags = struct.unpack("16sh", ifreq)[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def stage(args):
    """The repository (tracked sources, no build trees) and the binaries, in
    memory: /tmp is about to be replaced, and they may live under it."""
    def keep(ti):
        parts = os.path.normpath(ti.name).split("/")
        top = parts[0]
        if top in EXCLUDED_TOP or top.startswith("build") or "__pycache__" in parts or \
                parts[-1].endswith(".egg-info") or parts[:3] == ["client", "python", "build"]:
            return None
        return ti

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(args.repo, arcname=".", filter=keep)
    binaries = {}
    for rel, path in (("build/server/prefixd", args.prefixd),
                      ("build/client/prefixctl", args.prefixctl)):
        with open(path, "rb") as f:
            binaries[rel] = f.read()
    return buf.getvalue(), binaries


def unpack(tar_bytes, binaries):
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/tmp"], check=True)
    os.makedirs(WORK)
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        tar.extractall(WORK)
    for rel, data in binaries.items():
        path = os.path.join(WORK, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o755)
    home = os.path.join(WORK, ".home")
    os.makedirs(home)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PREFIXD_PYTHON_STUBS", IN_NAMESPACE)}
    env.update(HOME=home, XDG_CACHE_HOME=os.path.join(home, ".cache"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


# ---- running the steps ----

class Runner:
    def __init__(self, env, show):
        self.env = env
        self.show = show
        self.background = []   # (step, Popen, log path)

    def output(self, path):
        with open(path, errors="replace") as f:
            return f.read().splitlines()

    def run_background(self, step, n):
        """Starts `step` and waits until its output begins as the doc shows;
        whether it did, and what differs."""
        log = os.path.join(WORK, ".bg%d.log" % n)
        with open(log, "w") as out:
            p = subprocess.Popen(["bash", "-c", "exec " + step.shell()], cwd=WORK, env=self.env,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.background.append((step, p, log))
        deadline = time.monotonic() + (3 if self.show else BACKGROUND_S)
        while True:
            lines = self.output(log)
            if lines_match(step.expected, lines, prefix=True):
                break
            if p.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if self.show:
            print("---- %s &\n%s" % (step.shell(), "\n".join(lines)))
        return lines_match(step.expected, lines, prefix=True), diff(step.expected, lines, p.poll())

    def run_foreground(self, step):
        """Runs `step` (again while its output differs, for CATCH_UP_S);
        whether it exited 0 and printed what the doc shows, and what differs."""
        deadline = time.monotonic() + (3 if self.show else CATCH_UP_S)
        while True:
            r = subprocess.run(["bash", "-c", step.command], cwd=WORK, env=self.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=COMMAND_TIMEOUT_S)
            lines = r.stdout.splitlines()
            ok = r.returncode == 0 and (not step.expected or lines_match(step.expected, lines))
            if ok or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if self.show:
            print("---- %s\n%s" % (step.command, r.stdout.rstrip()))
        return ok, diff(step.expected, lines, r.returncode)

    def stop_background(self):
        """SIGTERM to the background commands, the last first (the doc's
        `kill %N`): (step, whether it still ran, its exit code, its last lines)."""
        out = []
        for step, p, log in reversed(self.background):
            running = p.poll() is None
            if running:
                p.terminate()
            try:
                rc = p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                rc = None
            out.append((step, running, rc, "\n".join(self.output(log)[-20:])))
        return out

    def kill_all(self):
        for _, p, _ in self.background:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def diff(expected, actual, rc):
    return "exit %s\n  doc shows:\n    %s\n  printed:\n    %s" % (
        rc, "\n    ".join(expected), "\n    ".join(actual))


def fetch(url):
    """(HTTP status or the error, Content-Type)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", "")
    except OSError as e:
        return e, ""


# ---- the tests ----

class PrivateNamespace(unittest.TestCase):
    """Outside the namespace: runs this script again in a private one."""

    def test_five_minutes_in_a_private_namespace(self):
        if os.environ.get(IN_NAMESPACE) == "1":
            self.skipTest("already in the private namespace")
        if shutil.which("unshare") is None:
            self.skipTest("no unshare (util-linux)")
        unshare = namespace_command()
        if unshare is None:
            self.skipTest("cannot make a network namespace here (unshare --net)")
        env = dict(os.environ, **{IN_NAMESPACE: "1"})
        r = subprocess.run(unshare + ["--", sys.executable, os.path.abspath(__file__)]
                           + sys.argv[1:], env=env)
        self.assertEqual(r.returncode, 0, "the steps in the private namespace pass (their "
                         "report is above)")


class FiveMinutes(unittest.TestCase):
    """In the namespace: the section's steps in order, each a subTest (a
    step that fails does not stop the next)."""

    @classmethod
    def setUpClass(cls):
        if os.environ.get(IN_NAMESPACE) != "1":
            raise unittest.SkipTest("runs in its private namespace only (PrivateNamespace)")
        with open(os.path.join(ARGS.repo, DOC)) as f:
            cls.text = f.read()

    def test_try_it_in_five_minutes(self):
        self.assertTrue(SECTION + "\n" in self.text, "%s has a section %r" % (DOC, SECTION))
        section = read_section(self.text)
        steps = extract_steps(section)
        self.assertTrue(len(steps) >= 6 and any(s.background for s in steps),
                        "%s: %s has commands, some in the background: %d"
                        % (DOC, SECTION, len(steps)))
        loopback_up()
        runner = Runner(unpack(*stage(ARGS)), ARGS.show)
        self.addCleanup(runner.kill_all)
        for n, step in enumerate(steps):
            with self.subTest(step=n, command=step.shell()):
                if step.background:
                    ok, differs = runner.run_background(step, n)
                    self.assertTrue(ok, "`%s &` prints what the doc shows\n%s"
                                    % (step.shell(), differs))
                else:
                    ok, differs = runner.run_foreground(step)
                    self.assertTrue(ok, "`%s` exits 0%s\n%s"
                                    % (step.command, " and prints what the doc shows"
                                       if step.expected else "", differs))
        for url in sorted(set(u.rstrip(".,;:") for u in URL.findall(section))):
            with self.subTest(url=url):
                status, kind = fetch(url)
                self.assertEqual(status, 200, "%s answers 200 (%s)" % (url, kind))
        for step, running, rc, tail in runner.stop_background():
            with self.subTest("runs until stopped", command=step.shell()):
                self.assertTrue(running, "`%s` runs until stopped: exit %s" % (step.shell(), rc))
            with self.subTest("exits 0 on SIGTERM", command=step.shell()):
                self.assertEqual(rc, 0, "`%s` exits 0 on SIGTERM\n%s" % (step.shell(), tail))


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefixd", required=True)
    ap.add_argument("--prefixctl", required=True)
    ap.add_argument("--repo", default=REPO)
    ap.add_argument("--show", action="store_true", help="print every command's output")
    ARGS, rest = ap.parse_known_args()
    inside = os.environ.get(IN_NAMESPACE) == "1"
    common.unittest_main(argv=[sys.argv[0]] + rest,
                         defaultTest="FiveMinutes" if inside else "PrivateNamespace")


if __name__ == "__main__":
    main()
