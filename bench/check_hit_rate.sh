#!/bin/sh
# Checks that prefixd's block hit rate equals the independent leaf-LRU
# simulator's (bench/lru_sim.py) exactly, capacity by capacity; evicted blocks
# and refused inserts must agree too.
#
#   check_hit_rate.sh TRACE_REPLAY [TRACE_DIR] [TRACES] [CAPACITIES]
#
# TRACE_DIR defaults to the repository's tests/data/mooncake,
# TRACES to "synthetic" (space-separated names), CAPACITIES to a list that
# includes capacities below the longest request (refused inserts). Exits 77
# (ctest: skipped) when the trace data is missing.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
replay=${1:?usage: check_hit_rate.sh TRACE_REPLAY [TRACE_DIR] [TRACES] [CAPACITIES]}
dir=${2:-$here/../tests/data/mooncake}
traces=${3:-synthetic}
caps=${4:-64,200,1000,3000,10000,50000,infinite}
python=${PYTHON:-python3}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for t in $traces; do
  file="$dir/${t}_trace.jsonl"
  if [ ! -f "$file" ]; then
    echo "SKIP: $file not found"
    exit 77
  fi
  "$replay" --trace_dir="$dir" --traces="$t" --capacities="$caps" \
    --memory_blocks=0 --runs=1 --progress=false --json >"$tmp/replay.json"
  "$python" "$here/lru_sim.py" --trace="$file" --capacities="$caps" \
    --json >"$tmp/sim.json"
  "$python" - "$t" "$tmp/replay.json" "$tmp/sim.json" <<'PY'
import json, sys
name, replay_path, sim_path = sys.argv[1:]
replay = {r["capacity"]: r for r in json.load(open(replay_path))["replays"]}
sim = {r["capacity"]: r for r in json.load(open(sim_path))["results"]}
keys = ("blocks", "hit_blocks", "evicted_blocks", "refused_inserts")
bad = 0
print("%-12s %-9s %10s %10s %12s %12s  %s" % ("trace", "capacity", "blocks",
      "hit_blocks", "prefixd", "simulator", "result"))
for cap, s in sim.items():
    p = replay.get(cap)
    same = p is not None and all(p[k] == s[k] for k in keys)
    bad += not same
    print("%-12s %-9s %10d %10d %11.6f%% %11.6f%%  %s" % (
        name, cap, s["blocks"], s["hit_blocks"],
        100.0 * p["hit_blocks"] / p["blocks"] if p else float("nan"),
        100.0 * s["hit_blocks"] / s["blocks"], "ok" if same else "MISMATCH"))
    if not same:
        print("  prefixd:   %s" % ({k: p[k] for k in keys} if p else None))
        print("  simulator: %s" % {k: s[k] for k in keys})
sys.exit(1 if bad else 0)
PY
done
