#!/usr/bin/python3
"""`promtool check rules` and `promtool test rules` on deploy/prometheus/.

Exits 77 (skip) only when /usr/bin/promtool is absent.

Usage: rules_test.py --repo DIR [unittest args]
"""

import os
import subprocess
import unittest

import harness
import common  # tests/python/common.py, on the path harness sets

ARGS = None


class RulesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        harness.skip_unless(harness.PROMTOOL)

    def promtool(self, *cmd):
        r = subprocess.run([harness.PROMTOOL] + list(cmd), capture_output=True, text=True,
                           timeout=120)
        print(r.stdout.rstrip())
        self.assertEqual(r.returncode, 0, "promtool %s\n%s" % (" ".join(cmd[:2]),
                                                               r.stdout + r.stderr))

    def test_check_rules(self):
        self.promtool("check", "rules",
                      os.path.join(ARGS.repo, "deploy", "prometheus", "alerts.yml"))

    def test_test_rules(self):
        self.promtool("test", "rules",
                      os.path.join(ARGS.repo, "deploy", "prometheus", "alerts_test.yml"))


def main():
    global ARGS
    ARGS, argv = harness.parse_flags(__doc__, "repo")
    common.unittest_main(argv=argv)


if __name__ == "__main__":
    main()
