#!/usr/bin/env bash
# The README's two commands in a fresh clone: `git clone` of the committed
# HEAD into an empty temporary directory, nothing beside it, then
#   - `make run`: it builds prefixd and prefixctl only, serves, and the
#     README's prefixctl commands work against it;
#   - the fast subset of `make test` that needs only those two binaries:
#     the end-to-end test, the Python client's tests (the engine simulator
#     reads the vendored traces), every config the docs show, the pip
#     install, the connection errors, docs/index.md's five-minute demo, the
#     layering check.
# A test, bench or doc that reaches outside the repository fails here.
# A few minutes on 2 cores (the build is most of it).
#
# Usage: .ci/clean_clone.sh [REV]   (default HEAD; CMAKE_ARGS and JOBS pass on)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rev=${1:-HEAD}
work=$(mktemp -d "${TMPDIR:-/tmp}/prefixd-clone.XXXXXX")
run_pid=
cleanup() {
  if [[ -n "$run_pid" ]] && kill -0 "$run_pid" 2>/dev/null; then
    kill -TERM -- "-$run_pid" 2>/dev/null || true
    wait "$run_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

log() { echo "clean_clone: $*"; }
fail() { echo "clean_clone: FAIL: $*" >&2; exit 1; }

# --no-local: a real clone (no hard links into the source's .git), and the
# committed tree only: nothing uncommitted or ignored comes along.
git clone --quiet --no-local "$repo" "$work/prefixd"
git -C "$work/prefixd" checkout --quiet --detach "$(git -C "$repo" rev-parse "$rev")"
[[ "$(ls -A "$work")" == "prefixd" ]] || fail "the clone's directory is not alone"
cd "$work/prefixd"
log "clone of $(git rev-parse --short HEAD) in $work/prefixd"

# Nothing may point outside the repository (the word is split so that this
# line does not match itself).
if git grep -n -e '\.\./shar''ed' -e 'DESI''GN\.md'; then
  fail "files above refer to something outside the repository"
fi
# Nor to the tracker's issue numbers, which a reader of the clone cannot
# look up (the vendored data keeps its own words).
if git grep -n -i -E '\bissu''es? ?#?[0-9]+' -- . ':!tests/data'; then
  fail "files above cite issue numbers; cite the docs that hold the rule"
fi

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
sock="$work/prefixd.sock"
ARGS="--listen=127.0.0.1:$(free_port) --listen=unix://$sock --metrics_listen=127.0.0.1:$(free_port)"

# make run, as the README says, in its own process group so that the
# daemon it starts is stopped with it.
start=$SECONDS
setsid make run ARGS="$ARGS" >"$work/run.log" 2>&1 &
run_pid=$!
until grep -q "serving, epoch" "$work/run.log"; do
  kill -0 "$run_pid" 2>/dev/null || { cat "$work/run.log"; fail "make run exited"; }
  (( SECONDS - start < 1800 )) || fail "make run did not serve within 30 minutes"
  sleep 2
done
log "make run served after $(( SECONDS - start ))s"

built=$(find build -name '*_test' -type f -perm -u+x | head -5)
[[ -z "$built" ]] || fail "make run built tests: $built"
ctl=build/client/prefixctl
$ctl --addr "unix://$sock" insert --tokens 1-32 --block_ids 100,101
$ctl --addr "unix://$sock" match --tokens 1-40 | grep -q "matched 32 of 40 tokens" \
  || fail "the README's match does not match 32 of 40 tokens"
kill -TERM -- "-$run_pid"
wait "$run_pid" || true
run_pid=

# The fast subset of `make test`: only tests of the two binaries built.
ctest --test-dir build --output-on-failure -j"${JOBS:-2}" -R \
  '^(e2e_test|python_.*|firstrun_(docs_config|make_run|python_install|connect_errors|five_minutes)_test|layering_check)$'
log "passed in $(( SECONDS - start ))s"
