#!/usr/bin/python3
"""bench/index_replay on a small workload (docs/performance.md, "Fleet index
at Dynamo's definition"): its exactness checks pass, and fail when a batch
is left out; its JSON adds up; bad flags get exit 2 and a message naming the
flag. A few seconds. Exit 77 (skip) when the trace data is missing.

    check_index_replay.py path/to/index_replay
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(os.path.dirname(HERE), "tests", "data", "mooncake",
                     "synthetic_trace.jsonl")
SMALL = ["--trace=synthetic", "--max_requests=200", "--duplication=2",
         "--workers=8", "--gpu_blocks=2000", "--window_ms=300",
         "--final_checks=100", "--progress=false"]


def run(binary, args):
    return subprocess.run([binary] + args, capture_output=True, text=True,
                          timeout=120)


def expect(cond, what, proc=None):
    if not cond:
        detail = ""
        if proc is not None:
            detail = "\n--- stdout\n%s\n--- stderr\n%s" % (proc.stdout, proc.stderr)
        sys.exit("FAIL: %s%s" % (what, detail))


def check_passing_run(binary):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.json")
        p = run(binary, SMALL + ["--json=" + path, "--decode_floor_every=1"])
        expect(p.returncode == 0, "the small replay exits 0", p)
        expect("exactness: PASS" in p.stdout, "the small replay passes", p)
        with open(path) as f:
            r = json.load(f)
    t = r["totals"]
    expect(r["exact"] and r["failures"] == [], "JSON: exact, no failures")
    expect(t["requests"] == 400, "JSON: 200 requests x 2 copies")
    expect(t["block_ops"] == t["request_blocks"] + t["stored_blocks"] +
           t["removed_blocks"], "JSON: block ops = request + stored + removed")
    expect(t["logical_ops"] == t["requests"] + t["stored_events"] +
           t["removed_events"], "JSON: logical ops = requests + events")
    expect(t["stored_blocks"] > 0 and t["removed_blocks"] > 0,
           "the pools of 2000 blocks evict")
    seq = r["sequential_check"]
    expect(seq["routes_checked"] == t["requests"] and
           seq["payloads_compared"] == t["batches"] and
           seq["route_mismatches"] == 0,
           "JSON: the sequential check saw every Route and payload")
    expect(r["final_check"]["routes"] == 100 and
           r["final_check"]["mismatches"] == 0, "JSON: 100 final Routes")
    expect(r["achieved_block_ops_per_sec"] > 0 and
           r["query_service"]["p50_ns"] > 0, "JSON: rates and latencies")
    # The decode floor, of every batch: each batch's stored and removed
    # blocks counted once, a time per block for both parses, the ceiling
    # the corpus's block ops over the parse's time on the machine's cores.
    f = r["decode_floor"]
    expect(f["batches"] == t["batches"] and
           f["blocks"] == t["stored_blocks"] + t["removed_blocks"],
           "JSON: the decode floor parsed every batch's blocks")
    expect(f["parse_ns_per_block"] > 0 and f["decode_ns_per_block"] > 0,
           "JSON: the decode floor timed both parses")
    ceiling = t["block_ops"] / (f["blocks"] * f["parse_ns_per_block"] * 1e-9
                                / f["cores"])
    expect(abs(f["parse_ceiling_block_ops_per_sec"] - ceiling) <= 1e-6 * ceiling,
           "JSON: the ceiling is block ops / (blocks x parse ns / cores)")
    expect("msgpack::parse, a visitor that keeps nothing" in p.stdout,
           "the decode floor is printed", p)


def check_failing_run(binary):
    p = run(binary, SMALL + ["--sequential_check=false", "--drop_batch=5"])
    expect(p.returncode == 1, "a replay missing a batch exits 1", p)
    expect("exactness: FAIL" in p.stdout, "and says FAIL", p)


def check_flags(binary):
    bad = [
        (["--window_ms=0"], "--window_ms=0"),
        (["--block_size=100"], "--trace_block_size=512"),
        (["--duplication=0"], "--duplication=0"),
        (["--event_threads=9", "--workers=8"], "--event_threads=9"),
        (["--check_every=0"], "--check_every"),
        (["--traces=synthetic"], "use --trace"),
        (["--trace=no_such"], "cannot open"),
        (["--trace=synthetic", "stray"], "unexpected argument 'stray'"),
    ]
    for args, message in bad:
        p = run(binary, args)
        expect(p.returncode == 2 and message in p.stderr,
               "%s: exit 2 naming %r" % (" ".join(args), message), p)
    p = run(binary, ["--help"])
    for flag in ("--window_ms", "--duplication", "--length_factor",
                 "--workers", "--json", "--trace_dir",
                 "--decode_floor_every"):
        expect(flag in p.stdout + p.stderr, "--help lists " + flag, p)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if not os.path.exists(TRACE):
        print("skipped: no %s" % TRACE)
        sys.exit(77)
    check_passing_run(sys.argv[1])
    check_failing_run(sys.argv[1])
    check_flags(sys.argv[1])
    print("PASS")


if __name__ == "__main__":
    main()
