#!/usr/bin/env python3
"""Prints prefixd's trace replay throughput over SGLang's RadixCache's.

  trace_replay --json --eviction_policy=lru,adaptive,shadow ... > prefixd.json
  sglang_peer.py --json ... > sglang.json
  peer_ratio.py prefixd.json sglang.json

One row per (trace, capacity, prefixd policy) that both files hold: block
ops/s of summed wall time (blk_ops/s) and of CPU time, each side's block hit
rate, and the ratios. The target (docs/performance.md) is >= 10x at every
capacity of both traces for every policy, in wall and in CPU time. Plain Python 3, no third-party
modules.
"""

import json
import sys

RATIO = 10.0


def load(path):
    try:
        with open(path) as f:
            return json.load(f)["replays"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit("peer_ratio: %s: not a --json output of trace_replay or "
                 "sglang_peer (%s)" % (path, e))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: peer_ratio.py TRACE_REPLAY_JSON SGLANG_PEER_JSON")
    ours = [r for r in load(sys.argv[1]) if r.get("path", "core") == "core"]
    peer = {(r["trace"], r["capacity"]): r for r in load(sys.argv[2])}
    print("%-13s %8s %-8s %11s %8s %11s %8s %7s %7s %s" % (
        "trace", "capacity", "policy", "prefixd/s", "hit", "sglang/s", "hit",
        "ratio", "cpu", "target"))
    missed = 0
    for r in ours:
        p = peer.get((r["trace"], r["capacity"]))
        if p is None:
            continue
        ratio = r["block_ops_per_second"] / p["block_ops_per_second"]
        cpu = r["block_ops_per_cpu_second"] / p["block_ops_per_cpu_second"]
        # Met when both ratios are: on a loaded machine either side's wall
        # time can stretch, and CPU time with it.
        ok = min(ratio, cpu) >= RATIO
        target = ">= %gx %s" % (RATIO, "met" if ok else "MISSED")
        missed += not ok
        print("%-13s %8s %-8s %11.0f %7.2f%% %11.0f %7.2f%% %6.1fx %6.1fx %s" % (
            r["trace"], r["capacity"], r["eviction_policy"],
            r["block_ops_per_second"], 100 * r["block_hit_rate"],
            p["block_ops_per_second"], 100 * p["block_hit_rate"], ratio, cpu,
            target))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
