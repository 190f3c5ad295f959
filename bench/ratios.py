#!/usr/bin/env python3
"""Prints the core targets' ratios (docs/performance.md) from one core_bench run.

  core_bench --benchmark_out=core.json --benchmark_out_format=json
  ratios.py core.json

All figures use CPU time per iteration (robust on a shared machine; manual-
time benchmarks: the timed call's own time) from the same run, so each ratio compares benchmarks that ran minutes apart at most.
Plain Python 3, no third-party modules.
"""

import json
import sys

LENGTHS = (512, 2048, 8192, 32768)
TREES = ("deep", "bushy1e3", "bushy1e5", "bushy1e6")


def load(path):
    with open(path) as f:
        data = json.load(f)
    out, medians = {}, {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") != "median":
                continue
            target = medians  # with --benchmark_repetitions: the median
            b = dict(b, name=b["run_name"])
        else:
            target = out
        # Manual-time benchmarks time only the call under test: their
        # real_time is that, their cpu_time includes the untimed set-up.
        manual = b["name"].endswith("/manual_time")
        name = b["name"].replace("/manual_time", "")
        scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[b["time_unit"]]
        target[name] = b["real_time" if manual else "cpu_time"] * scale
    out.update(medians)
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ratios.py CORE_BENCH_JSON")
    t = load(sys.argv[1])

    def get(name):
        return t.get(name)

    print("Match vs memcmp token throughput (target at 8k: >= 0.50)")
    print("  %-9s %6s %11s %11s %7s" % ("tree", "tokens", "match_ns",
                                       "memcmp_ns", "ratio"))
    for tree in TREES:
        for n in LENGTHS:
            m, c = get("Match/%s/%d" % (tree, n)), get("Memcmp/%s/%d" % (tree, n))
            if m is None or c is None:
                continue
            print("  %-9s %6d %11.0f %11.0f %7.3f" % (tree, n, m, c, c / m))

    print("\nMatch at 10^6 cached prefixes vs at 10^3 (target: <= 2.0)")
    print("  %-26s %11s %11s %7s" % ("benchmark", "1e3_ns", "1e6_ns", "ratio"))
    names = ["Match/%s/" + str(n) for n in LENGTHS]
    names.append("MatchRandomPrefix/%s/512")
    for pattern in names:
        a, b = get(pattern % "bushy1e3"), get(pattern % "bushy1e6")
        if a is None or b is None:
            continue
        print("  %-26s %11.0f %11.0f %7.2f" % (pattern % "*", a, b, b / a))
    d = get("DramLoad")
    if d is not None:
        print("\nOne dependent DRAM load: %.0f ns" % d)
        a, b = get("MatchRandomPrefix/bushy1e3/512"), \
            get("MatchRandomPrefix/bushy1e6/512")
        if a is not None and b is not None:
            print("  cold Match at 1e6 costs %.1f DRAM loads more than at 1e3"
                  % ((b - a) / d))

    print("\nInsert and Evict")
    for tree in TREES:
        for n in (2048, 8192):
            c = get("InsertConfirm/%s/%d" % (tree, n))
            h = get("InsertHalfNew/%s/%d" % (tree, n))
            m = get("Match/%s/%d" % (tree, n))
            if None in (c, h, m):
                continue
            print("  %-9s %6d  InsertConfirm %6.2fx Match   InsertHalfNew "
                  "%7.0f ns per new block" % (tree, n, c / m,
                                             h / (n // 2 // 16)))
    for leaf in (1, 16):
        e = get("Evict/leaf_blocks/%d" % leaf)
        if e is not None:
            print("  Evict from %2d-block leaves: %.0f ns per block "
                  "(%.2f M blocks/s)" % (leaf, e / 1024, 1024 / e * 1e3))

    print("\nInvalidate (time per removed block; 1.0 = linear)")
    a, b = get("Invalidate/beside_leases/0"), \
        get("Invalidate/beside_leases/65536")
    if a is not None and b is not None:
        print("  8,192 leaves beside 65,536 leases / beside none: %.2fx "
              "(%.0f vs %.0f ns per block)" % (b / a, b / 8192, a / 8192))
    a, b = get("Invalidate/tail_first/1024"), get("Invalidate/tail_first/32768")
    if a is not None and b is not None:
        print("  one node tail first, per ID at 32,768 / at 1,024 blocks: "
              "%.2fx (%.0f vs %.0f ns per block)"
              % ((b / 32768) / (a / 1024), b / 32768, a / 1024))


if __name__ == "__main__":
    main()
