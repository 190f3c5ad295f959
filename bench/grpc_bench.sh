#!/usr/bin/env bash
# The over-the-wire benchmarks (docs/performance.md, targets 6-9,
# and the fleet index's Route), each a single run of its binary so that every
# ratio comes from one run:
#
#   T6/T7  load: bare RPC vs Match of a cached 2k-token prompt, over TCP and
#          the Unix socket of one prefixd_bench_server
#   T8a    load: unary Match vs MatchBatch of 32 for 64-token prompts
#   T8b    load: the bare RPC and unary Match (2k tokens), each closed loop,
#          then open loop at 0.1, 0.25 and 0.5 of the rate it reached; the
#          bare calls over 1 ms are split into where their time went
#   T9     redis_peer: llm-d-style Redis vs prefixd on the Mooncake trace
#   T10    load: bare RPC vs Route of a 2k-token prompt over 16 workers
#          (prefixd_bench_server's fleet index), over TCP
#   T10b   load: unary Route vs RouteBatch of 32 for 64-token prompts, over
#          TCP (as T8a for Match)
#   T10c   load: unary Route vs Pick of the same 2k-token prompts over 16
#          workers (every worker a candidate, each Pick recorded), over TCP
#
# Usage: bench/grpc_bench.sh BUILD_DIR [T6 T8a T8b T9 T10 T10b T10c]
#        (default: all)
# Environment: ROUNDS (3), DURATION (3s), WARMUP (1s), CONCURRENCY (16),
# RESULTS (BUILD_DIR/bench-results: the JSON lines and logs).
set -euo pipefail

BUILD=${1:?usage: bench/grpc_bench.sh BUILD_DIR [T6 T8a T8b T9 T10 T10b T10c]}
shift
SCENARIOS=("$@")
[[ ${#SCENARIOS[@]} -eq 0 ]] && SCENARIOS=(T6 T8a T8b T9 T10 T10b T10c)
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3s}
WARMUP=${WARMUP:-1s}
CONCURRENCY=${CONCURRENCY:-16}
RESULTS=${RESULTS:-$BUILD/bench-results}
mkdir -p "$RESULTS"

LOAD=$BUILD/bench/load
SERVER=$BUILD/bench/prefixd_bench_server
PEER=$BUILD/bench/redis_peer
PREFIXD=$BUILD/server/prefixd
COMMON=(--rounds="$ROUNDS" --duration="$DURATION" --warmup="$WARMUP"
        --concurrency="$CONCURRENCY")

run() {
  local name=$1
  shift
  echo "== $name: $*"
  echo "   load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  "$@" 2>&1 | tee "$RESULTS/$name.log"
}

for s in "${SCENARIOS[@]}"; do
  case $s in
    T6|T7)
      run T6 "$LOAD" --server="$SERVER" --prompt_tokens=2048 --mix=match \
        --json="$RESULTS/T6.jsonl" "${COMMON[@]}" ;;
    T8a)
      run T8a "$LOAD" --server="$SERVER" --prompt_tokens=64 \
        --mix='match;batch' --batch_size=32 --baseline=false \
        --json="$RESULTS/T8a.jsonl" "${COMMON[@]}" ;;
    T8b)
      run T8b "$LOAD" --server="$SERVER" --prompt_tokens=2048 \
        --mix='bare;match' --rate_fractions=0.1,0.25,0.5 --baseline=false \
        --json="$RESULTS/T8b.jsonl" "${COMMON[@]}" ;;
    T9)
      if [[ ! -x $PEER ]]; then
        echo "== T9 skipped: $PEER not built (needs libhiredis-dev)"
      elif ! command -v redis-server >/dev/null; then
        echo "== T9 skipped: redis-server is not installed"
      else
        run T9 "$PEER" --prefixd="$PREFIXD" --depth=32 \
          --json="$RESULTS/T9.jsonl" "${COMMON[@]}"
      fi ;;
    T10)
      run T10 "$LOAD" --server="$SERVER" --transports=tcp --prompt_tokens=2048 \
        --mix=route --index_workers=16 \
        --json="$RESULTS/T10.jsonl" "${COMMON[@]}" ;;
    T10b)
      run T10b "$LOAD" --server="$SERVER" --transports=tcp --prompt_tokens=64 \
        --mix='route;routebatch' --batch_size=32 --index_workers=16 \
        --baseline=false --json="$RESULTS/T10b.jsonl" "${COMMON[@]}" ;;
    T10c)
      run T10c "$LOAD" --server="$SERVER" --transports=tcp --prompt_tokens=2048 \
        --mix='route;pick' --index_workers=16 \
        --baseline=false --json="$RESULTS/T10c.jsonl" "${COMMON[@]}" ;;
    *) echo "unknown scenario $s (T6 T8a T8b T9 T10 T10b T10c)" >&2; exit 2 ;;
  esac
done
