#!/usr/bin/python3
"""bench/belady must equal the independent Python Belady (lru_sim.py).

Runs `belady --json` and lru_sim.simulate(..., "belady") on each trace and capacity
and requires the same hit blocks, evicted blocks and refused inserts. Also
requires Belady's hit rate to be at least LRU's (lru_sim.simulate) at every
capacity: an optimum below LRU would be a broken optimum. Exits 77 (ctest:
skipped) when the trace data is missing.

  check_belady.py BELADY_BINARY [--traces=synthetic,conversation]
                  [--capacities=64,1953,5859,infinite]
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lru_sim  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("belady")
    ap.add_argument("--trace_dir",
                    default=os.path.join(HERE, "..", "tests", "data",
                                         "mooncake"))
    ap.add_argument("--traces", default="synthetic,conversation")
    ap.add_argument("--capacities", default="64,1953,5859,infinite")
    args = ap.parse_args()

    bad = 0
    print("%-13s %-9s %10s %10s %10s %10s  %s" % (
        "trace", "capacity", "belady", "simulator", "lru", "blocks", "result"))
    for name in args.traces.split(","):
        path = os.path.join(args.trace_dir, name + "_trace.jsonl")
        if not os.path.exists(path):
            print("SKIP: %s not found" % path)
            return 77
        out = subprocess.run(
            [args.belady, "--trace_dir=" + args.trace_dir, "--traces=" + name,
             "--capacities=" + args.capacities, "--json"],
            check=True, capture_output=True, text=True).stdout
        got = {r["capacity"]: r for r in json.loads(out)["results"]}
        requests = lru_sim.load(path)
        for c in args.capacities.split(","):
            cap = float("inf") if c == "infinite" else int(c)
            hits, total, evicted, refused = lru_sim.simulate(
                requests, cap, "belady")
            lru_hits = lru_sim.simulate(requests, cap)[0]
            r = got.get(c)
            same = r is not None and (
                r["hit_blocks"], r["blocks"], r["evicted_blocks"],
                r["refused_inserts"]) == (hits, total, evicted, refused)
            ok = same and hits >= lru_hits
            bad += not ok
            print("%-13s %-9s %10s %10d %10d %10d  %s" % (
                name, c, r["hit_blocks"] if r else "-", hits, lru_hits, total,
                "ok" if ok else ("BELOW LRU" if same else "MISMATCH")))
            if not same:
                print("  belady:    %s" % r)
                print("  simulator: %s" % {
                    "hit_blocks": hits, "blocks": total,
                    "evicted_blocks": evicted, "refused_inserts": refused})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
