#!/usr/bin/python3
"""End to end: prefixd's metrics as a real Prometheus sees them.

Starts the real prefixd binary and a real Prometheus (Debian's `prometheus`)
on free ports; Prometheus scrapes the daemon every second and loads
deploy/prometheus/alerts.yml. Drives a workload whose counts are known
(workload.py) through Python gRPC stubs generated at test time, waits for a
scrape taken after the workload, then asks Prometheus' HTTP API:

  - every counter of DESIGN.md section 9 has the exact expected value, per
    tenant and reason (prefixd_rpc_* per method and code included);
  - every gauge has the expected value;
  - every PromQL expression of deploy/grafana/prefixd.json parses and returns
    data ($__rate_interval -> 1m, template variables -> .*);
  - every alert rule was loaded and evaluated without error, and its
    expression, with comparisons made `bool` so that thresholds do not
    filter, parses and returns data.

Exits 77 (skip) only when /usr/bin/prometheus is absent.

Usage: prometheus_e2e_test.py --prefixd PATH --repo DIR
"""

import json
import os
import re
import sys
import time

import harness
import workload

SCRAPE_TIMEOUT_S = 60
RULES_TIMEOUT_S = 60


def series(prom, check, name):
    """{labels without instance/job: float value} of the latest samples."""
    r = prom.query('{__name__="%s"}' % name)
    if not check(r.get("status") == "success", "query %s" % name, r):
        return {}
    out = {}
    for s in r["data"]["result"]:
        labels = tuple(sorted((k, v) for k, v in s["metric"].items()
                              if k not in ("__name__", "instance", "job")))
        out[labels] = float(s["value"][1])
    return out


def scalar_value(prom, expr):
    r = prom.query(expr)
    result = r.get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else None


def dashboard_queries(path):
    """(where, expr) for every panel target and template variable query."""
    with open(path) as f:
        dash = json.load(f)
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append(("panel %r %s" % (p["title"], t["refId"]), t["expr"]))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append(("variable %s" % v["name"], q))
    return out


def substitute(expr):
    expr = expr.replace("$__rate_interval", "1m").replace("${__rate_interval}", "1m")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def boolify(expr):
    """Turns every comparison outside label matchers and strings into a
    `bool` comparison, so that the expression returns its series whatever
    their values (an alert that is not firing still returns data)."""
    out, depth, quote, i = [], 0, None, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(expr[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
            out.append(c)
        elif c == "{":
            depth += 1
            out.append(c)
        elif c == "}":
            depth -= 1
            out.append(c)
        elif depth == 0 and c in "=!<>":
            op = expr[i:i + 2] if expr[i:i + 2] in ("==", "!=", ">=", "<=") else c
            if op in ("=", "!"):  # not a comparison (e.g. =~ cannot appear here)
                out.append(c)
            else:
                rest = expr[i + len(op):]
                out.append(op if re.match(r"\s*bool\b", rest) else op + " bool")
                i += len(op) - 1
        else:
            out.append(c)
        i += 1
    return "".join(out)


def label_values_query(expr):
    """label_values(q, label) (a Grafana function) -> (q, label)."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", expr, re.S)
    return (m.group(1), m.group(2)) if m else (expr, None)


def check_dashboard(prom, check, path):
    queries = dashboard_queries(path)
    check(len(queries) >= 20, "dashboard has %d expressions" % len(queries))
    for where, expr in queries:
        q, label = label_values_query(substitute(expr))
        r = prom.query(q)
        result = r.get("data", {}).get("result", [])
        ok = r.get("status") == "success" and len(result) > 0
        if label:
            ok = ok and all(label in s["metric"] for s in result)
        check(ok, "dashboard %s returns data" % where,
              "%s\n      -> %s" % (q, json.dumps(r)[:400]))


def check_rules(prom, check):
    def all_evaluated():
        r = prom.api("rules")
        rules = [rule for g in r["data"]["groups"] for rule in g["rules"]]
        if rules and all(rule.get("health") != "unknown" for rule in rules):
            return rules
        return None

    rules = harness.wait_for("Prometheus evaluates every rule", all_evaluated, RULES_TIMEOUT_S, 0.2)
    names = sorted(rule["name"] for rule in rules)
    check(len(rules) >= 5, "alert rules loaded: %s" % ", ".join(names))
    for rule in rules:
        check(rule["health"] == "ok", "rule %s evaluates without error" % rule["name"],
              rule.get("lastError"))
        q = boolify(rule["query"])
        r = prom.query(q)
        result = r.get("data", {}).get("result", [])
        check(r.get("status") == "success" and len(result) > 0,
              "rule %s: expression returns data" % rule["name"],
              "%s\n      -> %s" % (q, json.dumps(r)[:400]))


def check_values(prom, check, expected, what):
    by_name = {}
    for (name, labels), value in sorted(expected.items()):
        if name not in by_name:
            by_name[name] = series(prom, check, name)
        got = by_name[name].get(labels)
        check(got == value, "%s %s%s = %s" % (what, name, dict(labels), value), "got %s" % got)


def check_rpc_metrics(prom, check, client):
    errors = series(prom, check, "prefixd_rpc_errors_total")
    check(len(errors) == 14 * 16, "prefixd_rpc_errors_total: 14 methods x 16 codes pre-created",
          "%d series" % len(errors))
    wrong = {}
    for labels, value in errors.items():
        d = dict(labels)
        want = client.errors.get((d["method"], d["code"]), 0)
        if value != want:
            wrong[labels] = (value, want)
    check(not wrong, "prefixd_rpc_errors_total equals the errors the client saw (%s)"
          % dict(client.errors), wrong)
    counts = series(prom, check, "prefixd_rpc_duration_seconds_count")
    inf = {k: v for k, v in series(prom, check, "prefixd_rpc_duration_seconds_bucket").items()
           if dict(k)["le"] == "+Inf"}
    for labels, value in sorted(counts.items()):
        method = dict(labels)["method"]
        check(value == client.calls.get(method, 0),
              "prefixd_rpc_duration_seconds_count{method=%s} = %d"
              % (method, client.calls.get(method, 0)), "got %s" % value)
        check(inf.get(tuple(sorted(labels + (("le", "+Inf"),)))) == value,
              "prefixd_rpc_duration_seconds_bucket{method=%s,le=+Inf} = _count" % method)
    check(set(dict(k)["method"] for k in counts) >= set(client.calls),
          "a duration series for every method called")


def check_process(prom, check, started):
    rss = scalar_value(prom, "process_resident_memory_bytes")
    vms = scalar_value(prom, "process_virtual_memory_bytes")
    check(rss is not None and rss > 1 << 20, "process_resident_memory_bytes > 1 MiB", rss)
    check(vms is not None and rss is not None and vms >= rss, "process_virtual_memory_bytes >= resident", vms)
    start = scalar_value(prom, "process_start_time_seconds")
    check(start is not None and started - 5 <= start <= time.time(),
          "process_start_time_seconds is when prefixd started", "%s vs %s" % (start, started))
    cpu = scalar_value(prom, "process_cpu_seconds_total")
    check(cpu is not None and cpu >= 0, "process_cpu_seconds_total", cpu)
    fds = scalar_value(prom, "process_open_fds")
    max_fds = scalar_value(prom, "process_max_fds")
    check(fds is not None and max_fds is not None and 0 < fds < max_fds,
          "0 < process_open_fds < process_max_fds", "%s %s" % (fds, max_fds))


def run(args, tmp, check):
    import grpc  # Debian's python3-grpcio
    pb2, pb2_grpc = harness.load_stubs(os.path.join(args.repo, "proto"), os.path.join(tmp, "gen"))
    started = time.time()
    daemon = harness.Daemon(args.prefixd, tmp, workload.CONFIG)
    prom = None
    client = harness.Client(grpc, pb2, pb2_grpc, daemon.grpc_address)
    try:
        info = daemon.wait_ready(client)
        prom = harness.Prometheus(tmp, ["127.0.0.1:%d" % daemon.metrics_port],
                                  [os.path.join(args.repo, "deploy", "prometheus", "alerts.yml")])
        prom.wait_ready()
        harness.wait_for("Prometheus scrapes prefixd",
                         lambda: scalar_value(prom, 'up{job="prefixd"}') == 1, SCRAPE_TIMEOUT_S)

        workload.phase1(client)
        harness.wait_for(
            "a scrape shows both tenants",
            lambda: scalar_value(prom, 'sum(prefixd_match_requests_total{tenant=~"acme|beta"})') == 2,
            SCRAPE_TIMEOUT_S)

        workload.phase2(client)
        workload.wait_for_lease_expiry(client, harness.wait_for)
        final = client.call("Stats", tenant="acme")
        acme_nodes = [t.tree_nodes for t in final.tenants if t.tenant == "acme"][0]
        done = time.time()
        # The newest scrape must have started after the last call.
        harness.wait_for("a scrape taken after the workload",
                         lambda: (scalar_value(prom, "timestamp(prefixd_build_info)") or 0) > done + 0.01,
                         SCRAPE_TIMEOUT_S)

        check_values(prom, check, workload.expected_counters(), "counter")
        gauges = workload.expected_gauges(info.version)
        gauges[("prefixd_tree_nodes", (("tenant", "acme"),))] = acme_nodes
        check_values(prom, check, gauges, "gauge")
        tenants = set(dict(k).get("tenant") for k in series(prom, check, "prefixd_cached_blocks"))
        check(tenants == {"acme", "beta"}, "tenant label: exactly the tenants used", tenants)
        check_rpc_metrics(prom, check, client)
        check_process(prom, check, started)

        hit_rate = ('sum by (tenant) (rate(prefixd_match_hit_tokens_total[5m]))'
                    ' / sum by (tenant) (rate(prefixd_match_tokens_total[5m]))')
        r = prom.query(hit_rate)
        rates = {s["metric"]["tenant"]: float(s["value"][1]) for s in r["data"]["result"]}
        check(set(rates) == {"acme", "beta"} and all(0 < v <= 1 for v in rates.values()),
              "documented hit-rate PromQL gives a ratio per tenant", rates)

        check_dashboard(prom, check, os.path.join(args.repo, "deploy", "grafana", "prefixd.json"))
        check_rules(prom, check)
    except Exception:
        print("--- prefixd log ---\n" + daemon.log())
        if prom:
            print("--- prometheus log ---\n" + prom.log()[-4000:])
        raise
    finally:
        client.close()
        if prom:
            prom.stop()
        rc = daemon.stop()
    check(rc == 0, "prefixd exits 0 on SIGTERM", daemon.log() if rc else "")
    if check.failed:
        print("--- prefixd log ---\n" + daemon.log())


if __name__ == "__main__":
    sys.exit(harness.main(__doc__, harness.PROMETHEUS, "prefixd-metrics-e2e-", run))
