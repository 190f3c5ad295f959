#!/usr/bin/python3
"""`promtool check rules` and `promtool test rules` on deploy/prometheus/.

Exits 77 (skip) only when /usr/bin/promtool is absent.

Usage: rules_test.py --repo DIR
"""

import argparse
import os
import subprocess
import sys

import harness


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="the source tree")
    args = parser.parse_args()
    harness.skip_unless(harness.PROMTOOL)
    check = harness.Check()
    rules = os.path.join(args.repo, "deploy", "prometheus", "alerts.yml")
    tests = os.path.join(args.repo, "deploy", "prometheus", "alerts_test.yml")
    for cmd in (["check", "rules", rules], ["test", "rules", tests]):
        r = subprocess.run([harness.PROMTOOL] + cmd, capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, "promtool %s" % " ".join(cmd[:2]), r.stdout + r.stderr)
        print(r.stdout.rstrip())
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
