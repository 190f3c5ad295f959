#!/usr/bin/python3
"""`make run` builds only what it runs; `make test` builds everything.

A first `make run` that compiled every test, benchmark and fuzz target took
about 7 minutes on 2 cores before the daemon started. This reads the
commands make would run (`make -n`, nothing is built) and checks that every
`cmake --build` of `make run` names its targets, only prefixd and prefixctl
(the README's second terminal uses prefixctl), and that `make test` builds
the whole tree. With --build, the names are checked to be real targets of
that configured build tree.

Usage: make_run_test.py [--repo DIR] [--build DIR]
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_TARGETS = {"prefixd", "prefixctl"}
ARGS = None


def build_commands(goal):
    """The `cmake --build` commands of `make -n GOAL`, each split into words."""
    r = subprocess.run(["make", "-n", "-C", ARGS.repo, goal, "BUILD_DIR=/nonexistent-build"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("make -n %s failed: %s" % (goal, r.stderr))
    return [shlex.split(line) for line in r.stdout.splitlines()
            if re.match(r"\s*cmake --build ", line)]


def targets(words):
    """The --target names of one `cmake --build` command."""
    out, i = [], 0
    while i < len(words):
        if words[i] == "--target":
            i += 1
            while i < len(words) and not words[i].startswith("-"):
                out.append(words[i])
                i += 1
            continue
        if words[i].startswith("--target="):
            out.append(words[i].split("=", 1)[1])
        i += 1
    return out


class MakeRunTest(unittest.TestCase):
    def test_run_builds_only_the_daemon_and_prefixctl(self):
        cmds = build_commands("run")
        self.assertTrue(cmds, "make run builds nothing?")
        built = set()
        for words in cmds:
            names = targets(words)
            self.assertTrue(names, "make run builds the whole tree: %s" % " ".join(words))
            built.update(names)
        self.assertEqual(built, RUN_TARGETS)

    def test_run_starts_the_daemon_it_built(self):
        r = subprocess.run(["make", "-n", "-C", ARGS.repo, "run", "BUILD_DIR=bd"],
                           capture_output=True, text=True, timeout=60)
        self.assertIn("./bd/server/prefixd", r.stdout)

    def test_test_builds_everything(self):
        cmds = build_commands("test")
        self.assertTrue(cmds)
        self.assertTrue(any(not targets(w) for w in cmds),
                        "make test must build every target: %s" % cmds)

    def test_run_targets_exist(self):
        if not ARGS.build:
            self.skipTest("no --build tree given")
        # The Makefile generator's help target lists every target ("... name").
        r = subprocess.run(["cmake", "--build", ARGS.build, "--target", "help"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        listed = set(re.findall(r"^\.\.\. (\S+)", r.stdout, re.M))
        self.assertTrue(RUN_TARGETS <= listed, RUN_TARGETS - listed)


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repo", default=REPO)
    ap.add_argument("--build")
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
