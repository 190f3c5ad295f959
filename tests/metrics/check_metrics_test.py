#!/usr/bin/python3
"""`promtool check metrics` on a scrape of the real prefixd after traffic.

Starts prefixd on free ports, drives the known workload (workload.py:
hits, misses, inserts, every eviction reason, leases, errors), scrapes
/metrics and feeds it to promtool, which must report nothing: names, types,
help text, units and suffixes all follow Prometheus' conventions. Also checks
that the scrape has help text on every family and the families of
docs/metrics.md.

Exits 77 (skip) only when /usr/bin/promtool is absent.

Usage: check_metrics_test.py --prefixd PATH --repo DIR
"""

import os
import re
import subprocess
import sys

import harness
import workload

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


def run(args, tmp, check):
    import grpc  # Debian's python3-grpcio
    pb2, pb2_grpc = harness.load_stubs(os.path.join(args.repo, "proto"), os.path.join(tmp, "gen"))
    daemon = harness.Daemon(args.prefixd, tmp, workload.CONFIG)
    client = harness.Client(grpc, pb2, pb2_grpc, daemon.grpc_address)
    try:
        daemon.wait_ready(client)
        workload.phase1(client)
        workload.phase2(client)
        workload.wait_for_lease_expiry(client, harness.wait_for)
        text = harness.http_get(daemon.metrics_url)
    finally:
        client.close()
        rc = daemon.stop()
    check(rc == 0, "prefixd exits 0 on SIGTERM", daemon.log() if rc else "")

    r = subprocess.run([harness.PROMTOOL, "check", "metrics"], input=text,
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "",
          "promtool check metrics reports nothing",
          "exit %d\n%s%s" % (r.returncode, r.stdout, r.stderr))

    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    for family in types:
        check(helps.get(family, "").strip() != "", "help text on %s" % family)
    for kind, names in SECTION_9.items():
        for name in names:
            check(types.get(name) == kind, "%s is a %s" % (name, kind), types.get(name))
    check('prefixd_match_hit_tokens_total{tenant="acme"} 144' in text,
          "the scrape shows acme's 144 hit tokens")


if __name__ == "__main__":
    sys.exit(harness.main(__doc__, harness.PROMTOOL, "prefixd-check-metrics-", run))
