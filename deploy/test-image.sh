#!/usr/bin/env bash
# Builds the prefixd container image with buildah and proves it works:
#
#   1. a base image: $BASE_IMAGE (default debian:bookworm, as the
#      registries buildah is configured with resolve it) if it can be
#      pulled, else one made with `debootstrap --variant=minbase bookworm`
#      from $DEBIAN_MIRROR (default: the Debian archive this machine's apt
#      uses), kept as localhost/debian:bookworm-minbase for the next run;
#   2. `buildah bud --isolation=chroot --storage-driver=vfs` of the Dockerfile;
#   3. the image's metadata: non-root user, exposed ports, entrypoint,
#      health check, stop signal; no compiler in the runtime stage;
#   4. the daemon run from the image, and the image's prefixctl against it:
#      health, an insert, a match; then SIGTERM and exit 0.
#
# Takes minutes (a Release build inside the image): `make image-test`, not part
# of `make test`. Needs root and buildah (apt-get install buildah; debootstrap
# too when no base image can be pulled).
#
# Usage: deploy/test-image.sh [--keep]   (--keep: leave the image and containers)
# The build cache (the dependency layer, ~1.7 GB in vfs storage) stays for the
# next run; `buildah --storage-driver=vfs rmi --prune` frees it.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=localhost/prefixd:test
PULL_BASE=${BASE_IMAGE:-debian:bookworm}
LOCAL_BASE=localhost/debian:bookworm-minbase

# The Debian archive this machine's apt uses (deb822 or one-line sources).
apt_mirror() {
  local f
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/*.sources; do
    [[ -r "$f" ]] || continue
    awk '/^URIs:/ && $2 !~ /security/ {print $2; found=1; exit} END {exit !found}' "$f" && return
  done
  awk '$1 == "deb" && $2 !~ /security/ {print $2; found=1; exit} END {exit !found}' \
    /etc/apt/sources.list 2>/dev/null
}
MIRROR=${DEBIAN_MIRROR:-$(apt_mirror || true)}
KEEP=0
[[ "${1:-}" == "--keep" ]] && KEEP=1

bah() { buildah --storage-driver=vfs "$@"; }
log() { echo "test-image: $*"; }
fail() { echo "test-image: FAIL: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || fail "run as root (buildah with chroot isolation and vfs storage)"
# The image tools are not build dependencies, so install-deps.sh leaves them
# out; this target brings them from Debian's archive when missing.
if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  log "installing buildah and debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap ||
    fail "cannot install buildah and debootstrap"
fi

tmp=$(mktemp -d /tmp/prefixd-image.XXXXXX)
ctr=""
daemon_pid=""
cleanup() {
  if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -KILL "$daemon_pid" 2>/dev/null || true
  fi
  if [[ -n "$ctr" && $KEEP -eq 0 ]]; then bah rm "$ctr" >/dev/null 2>&1 || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# ---- 1. the base image ----
base=""
if bah inspect --type image "$PULL_BASE" >/dev/null 2>&1 || bah pull -q "$PULL_BASE" >/dev/null 2>&1; then
  base=$PULL_BASE
elif bah inspect --type image "$LOCAL_BASE" >/dev/null 2>&1; then
  base=$LOCAL_BASE
else
  command -v debootstrap >/dev/null || fail "cannot pull $PULL_BASE and debootstrap is missing"
  [[ -n "$MIRROR" ]] || fail "cannot pull $PULL_BASE and no Debian archive is known: set DEBIAN_MIRROR"
  log "cannot pull $PULL_BASE: making $LOCAL_BASE with debootstrap --variant=minbase"
  debootstrap --variant=minbase bookworm "$tmp/rootfs" "$MIRROR" >"$tmp/debootstrap.log" 2>&1 \
    || { tail -20 "$tmp/debootstrap.log"; fail "debootstrap"; }
  rm -rf "$tmp/rootfs/var/cache/apt/archives/"*.deb "$tmp/rootfs/var/lib/apt/lists/"*
  base_ctr=$(bah from scratch)
  bah copy "$base_ctr" "$tmp/rootfs" / >/dev/null
  bah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$base_ctr"
  bah commit -q "$base_ctr" "$LOCAL_BASE" >/dev/null
  bah rm "$base_ctr" >/dev/null
  rm -rf "$tmp/rootfs"
  base=$LOCAL_BASE
fi
log "base image $base"

# ---- 2. the build ----
start=$(date +%s)
# --layers: a rerun reuses the dependency layer (keyed on install-deps.sh).
bah bud --isolation=chroot --format docker --layers=true --build-arg "BASE=$base" \
  -t "$IMAGE" -f Dockerfile . >"$tmp/bud.log" 2>&1 || { tail -40 "$tmp/bud.log"; fail "buildah bud"; }
log "built $IMAGE in $(( $(date +%s) - start ))s"

# ---- 3. metadata ----
inspect() { bah inspect --type image --format "$1" "$IMAGE"; }
[[ $(inspect '{{.Docker.Config.User}}') == "65532:65532" ]] || fail "user is not 65532:65532"
ports=$(inspect '{{range $p, $_ := .Docker.Config.ExposedPorts}}{{$p}} {{end}}')
[[ "$ports" == *50051/tcp* && "$ports" == *9464/tcp* ]] || fail "exposed ports: $ports"
[[ $(inspect '{{.Docker.Config.Entrypoint}}') == "[/usr/bin/prefixd]" ]] || fail "entrypoint"
[[ $(inspect '{{.Docker.Config.Healthcheck.Test}}') == *prefixctl*health* ]] || fail "health check"
[[ $(inspect '{{.Docker.Config.StopSignal}}') == "SIGTERM" ]] || fail "stop signal"
log "metadata: user 65532, ports $ports, entrypoint prefixd, health check prefixctl health"

ctr=$(bah from -q "$IMAGE")
run() { bah run --isolation=chroot --user 65532:65532 "$ctr" -- "$@"; }
if run sh -c 'command -v c++ || command -v cmake || command -v gcc' 2>/dev/null; then
  fail "the runtime stage has a compiler"
fi
size=$(bah images --format '{{.Size}}' "$IMAGE" | head -1)
log "runtime stage: no compiler; image size $size"

# ---- 4. the daemon from the image ----
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
addr=127.0.0.1:$port
# chroot isolation shares the host's network: a free port, not 50051.
buildah --storage-driver=vfs run --isolation=chroot --user 65532:65532 "$ctr" -- \
  /usr/bin/prefixd --config=/etc/prefixd/config.textproto --listen="$addr" \
  --listen=unix:///run/prefixd/prefixd.sock --metrics_listen="127.0.0.1:$mport" \
  >"$tmp/prefixd.log" 2>&1 &
daemon_pid=$!  # buildah run: it exits with the daemon's exit code
ctl() { run /usr/bin/prefixctl --addr "$addr" --timeout 5s "$@"; }
deadline=$(( $(date +%s) + 60 ))
until out=$(ctl health 2>&1) && [[ "$out" == SERVING ]]; do
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$tmp/prefixd.log"; fail "prefixd exited"; }
  (( $(date +%s) < deadline )) || { cat "$tmp/prefixd.log"; fail "prefixd not SERVING in 60s"; }
  sleep 0.2
done
log "prefixctl health: SERVING"
[[ $(run /usr/bin/prefixctl --addr unix:///run/prefixd/prefixd.sock health) == SERVING ]] \
  || fail "health over the Unix socket"
out=$(ctl insert --tokens 1-32 --block_ids 100,101)
[[ "$out" == *"2 of 2 blocks new"* ]] || fail "insert: $out"
log "prefixctl insert: ${out%%$'\n'*}"
out=$(ctl match --tokens 1-40)
[[ "$out" == *"matched 32 of 40 tokens"* && "$out" == *100,101* ]] || fail "match: $out"
log "prefixctl match: ${out%%$'\n'*}"

# buildah run does not forward signals: find the daemon among its
# descendants (buildah-chroot-runtime, buildah-chroot-exec, prefixd) by id.
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
prefixd_pid=""
for p in $(descendants "$daemon_pid"); do
  [[ $(readlink "/proc/$p/exe" 2>/dev/null) == */usr/bin/prefixd ]] && prefixd_pid=$p
done
[[ -n "$prefixd_pid" ]] || fail "cannot find the prefixd process under buildah run ($daemon_pid)"
kill -TERM "$prefixd_pid"
rc=0
wait "$daemon_pid" || rc=$?
daemon_pid=""
grep -q "SIGTERM" "$tmp/prefixd.log" || { cat "$tmp/prefixd.log"; fail "prefixd did not see SIGTERM"; }
[[ $rc -eq 0 ]] || { cat "$tmp/prefixd.log"; fail "prefixd exited $rc on SIGTERM"; }
log "SIGTERM: drained and exited 0"
if [[ $KEEP -eq 0 ]]; then
  bah rm "$ctr" >/dev/null; ctr=""
  bah rmi "$IMAGE" >/dev/null
fi
log "PASS"
