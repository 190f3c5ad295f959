#!/usr/bin/python3
"""`promtool check metrics` on a scrape of the real prefixd after traffic.

Starts prefixd on free ports, drives the known workload (workload.py:
hits, misses, inserts, every eviction reason, leases, errors), scrapes
/metrics and feeds it to promtool, which must report nothing: names, types,
help text, units and suffixes all follow Prometheus' conventions. Also checks
that the scrape has help text on every family and the families of
docs/metrics.md.

Exits 77 (skip) only when /usr/bin/promtool is absent.

Usage: check_metrics_test.py --prefixd PATH --repo DIR [unittest args]
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

import harness
import common  # tests/python/common.py, on the path harness sets
import workload

ARGS = None

SECTION_9 = {
    "counter": ["prefixd_match_requests_total", "prefixd_match_tokens_total",
                "prefixd_match_hit_tokens_total", "prefixd_insert_requests_total",
                "prefixd_inserted_blocks_total", "prefixd_redundant_blocks_total",
                "prefixd_evicted_blocks_total", "prefixd_evicted_bytes_total",
                "prefixd_lease_expired_total", "prefixd_rpc_errors_total",
                "process_cpu_seconds_total"],
    "gauge": ["prefixd_cached_blocks", "prefixd_cached_bytes", "prefixd_pinned_blocks",
              "prefixd_tree_nodes", "prefixd_active_leases", "prefixd_budget_bytes",
              "prefixd_block_bytes", "prefixd_tenant_reserved_bytes",
              "prefixd_tenant_limit_bytes", "prefixd_build_info",
              "process_resident_memory_bytes", "process_virtual_memory_bytes",
              "process_open_fds", "process_max_fds", "process_start_time_seconds"],
    "histogram": ["prefixd_rpc_duration_seconds"],
}


class CheckMetricsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        harness.skip_unless(harness.PROMTOOL)
        import grpc  # Debian's python3-grpcio
        cls.tmp = tempfile.mkdtemp(prefix="prefixd-check-metrics-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        pb2, pb2_grpc = harness.load_stubs(os.path.join(ARGS.repo, "proto"),
                                           os.path.join(cls.tmp, "gen"))
        daemon = harness.Daemon(ARGS.prefixd, cls.tmp, workload.CONFIG)
        client = harness.Client(grpc, pb2, pb2_grpc, daemon.grpc_address)
        try:
            daemon.wait_ready(client)
            workload.phase1(client)
            workload.phase2(client)
            workload.wait_for_lease_expiry(client, harness.wait_for)
            cls.text = harness.http_get(daemon.metrics_url)
        finally:
            client.close()
            cls.rc = daemon.stop()
            cls.log = daemon.log()
        cls.types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", cls.text, re.M))
        cls.helps = dict(re.findall(r"^# HELP (\S+) (.*)$", cls.text, re.M))

    def test_exit_on_sigterm(self):
        self.assertEqual(self.rc, 0, "prefixd exits 0 on SIGTERM\n" + self.log)

    def test_promtool_check_metrics(self):
        r = subprocess.run([harness.PROMTOOL, "check", "metrics"], input=self.text,
                           capture_output=True, text=True, timeout=60)
        self.assertTrue(r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "",
                        "promtool check metrics reports nothing: exit %d\n%s%s"
                        % (r.returncode, r.stdout, r.stderr))

    def test_help_text(self):
        for family in self.types:
            with self.subTest(family=family):
                self.assertNotEqual(self.helps.get(family, "").strip(), "",
                                    "help text on %s" % family)

    def test_section_9_types(self):
        for kind, names in SECTION_9.items():
            for name in names:
                with self.subTest(name=name):
                    self.assertEqual(self.types.get(name), kind, "%s is a %s" % (name, kind))

    def test_acme_hit_tokens(self):
        self.assertTrue('prefixd_match_hit_tokens_total{tenant="acme"} 144' in self.text,
                        "the scrape shows acme's 144 hit tokens")


def main():
    global ARGS
    ARGS, argv = harness.parse_flags(__doc__, "prefixd", "repo")
    common.unittest_main(argv=argv)


if __name__ == "__main__":
    main()
