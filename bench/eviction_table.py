#!/usr/bin/python3
"""Every eviction policy against LRU and the offline optimum, per trace.

Runs bench/trace_replay (core path, one run, every policy) and bench/belady
on the same traces and capacities, and prints one Markdown table per trace:
each policy's block hit rate, Belady's, the share of the LRU-to-Belady gap
each policy closes, and its distance from LRU. Then the two targets of
docs/performance.md ("Eviction"): a policy closes >= 25 % of the gap at the
two smaller of --target_capacities on both traces, and is never more than
0.2 points below LRU at any capacity.

  eviction_table.py --build=build [--policies=lru,adaptive,shadow]
                    [--capacities=64,256,1953,5859,19531,60000,97656,infinite]

Exit status 0 whether or not a target holds (it is a report); 1 if a tool
fails.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="the CMake build dir")
    ap.add_argument("--traces", default="conversation,synthetic")
    ap.add_argument("--policies", default="lru,adaptive,shadow")
    ap.add_argument("--capacities",
                    default="64,256,1953,5859,19531,60000,97656,infinite")
    ap.add_argument("--target_capacities", default="1953,5859",
                    help="where a policy must close >= 25%% of the gap")
    ap.add_argument("--reuse_oracle", action="store_true",
                    help="add lru_sim.py --policy=reuse_oracle's column (LRU "
                    "that knows which blocks are never used again; about a "
                    "minute of Python)")
    args = ap.parse_args()

    policies = args.policies.split(",")
    replay = run_json([
        os.path.join(args.build, "bench", "trace_replay"),
        "--traces=" + args.traces, "--capacities=" + args.capacities,
        "--eviction_policy=" + args.policies, "--runs=1",
        "--memory_blocks=0", "--progress=false", "--json"])
    belady = run_json([
        os.path.join(args.build, "bench", "belady"),
        "--traces=" + args.traces, "--capacities=" + args.capacities,
        "--json"])

    rate = {}
    for r in replay["replays"]:
        rate[(r["trace"], r["eviction_policy"].lower(), r["capacity"])] = (
            100.0 * r["hit_blocks"] / r["blocks"])
    for r in belady["results"]:
        rate[(r["trace"], "belady", r["capacity"])] = (
            100.0 * r["hit_blocks"] / r["blocks"])

    if args.reuse_oracle:
        trace_dir = os.path.join(HERE, "..", "tests", "data", "mooncake")
        for trace in args.traces.split(","):
            out = run_json([
                sys.executable, os.path.join(HERE, "lru_sim.py"),
                "--trace=" + os.path.join(trace_dir, trace + "_trace.jsonl"),
                "--capacities=" + args.capacities, "--policy=reuse_oracle",
                "--json"])
            for r in out["results"]:
                rate[(trace, "reuse_oracle", r["capacity"])] = (
                    100.0 * r["hit_blocks"] / r["blocks"])

    others = [p for p in policies if p != "lru"]
    worst = {p: (None, 1e9) for p in others}   # (where, points vs LRU)
    closed = {p: [] for p in others}           # (where, share) at targets
    targets = args.target_capacities.split(",")
    for trace in args.traces.split(","):
        print("\n%s (block hit rate, %%)\n" % trace)
        head = ["capacity"] + [p.upper() for p in policies]
        if args.reuse_oracle:
            head.append("reuse oracle")
        head.append("Belady")
        head += ["%s gap closed" % p.upper() for p in others]
        head += ["%s - LRU" % p.upper() for p in others]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for cap in args.capacities.split(","):
            lru = rate[(trace, "lru", cap)]
            opt = rate[(trace, "belady", cap)]
            cells = [cap] + ["%.2f" % rate[(trace, p, cap)] for p in policies]
            if args.reuse_oracle:
                cells.append("%.2f" % rate[(trace, "reuse_oracle", cap)])
            cells.append("%.2f" % opt)
            for p in others:
                gap = opt - lru
                share = (rate[(trace, p, cap)] - lru) / gap if gap > 0 else 0
                cells.append("%.0f %%" % (100 * share) if gap > 0 else "-")
                if cap in targets:
                    closed[p].append(("%s %s" % (trace, cap), share))
            for p in others:
                d = rate[(trace, p, cap)] - lru
                cells.append("%+.2f" % d)
                if d < worst[p][1]:
                    worst[p] = ("%s %s" % (trace, cap), d)
            print("| " + " | ".join(cells) + " |")
    print()
    for p in others:
        least = min(closed[p], key=lambda x: x[1]) if closed[p] else None
        gap_ok = least is not None and least[1] >= 0.25
        lru_ok = worst[p][1] >= -0.2
        print("%s: closes >= 25%% of the gap at %s: %s (least %.0f %% at %s); "
              "never > 0.2 points below LRU: %s (worst %+.2f at %s)" % (
                  p.upper(), args.target_capacities,
                  "yes" if gap_ok else "no",
                  100 * least[1] if least else 0, least[0] if least else "-",
                  "yes" if lru_ok else "no", worst[p][1], worst[p][0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
