#!/usr/bin/env bash
# Installs the Debian 12 packages prefixd needs to build and test: the one
# list of dependencies, used by `make run`, `make test`, CI and the
# Dockerfile. Only missing packages are installed; when everything is
# present it returns at once without touching the network.
#
# Usage: deploy/install-deps.sh [--check] [--sglang-peer]
#   --check        list what is missing, exit 1 if any
#   --sglang-peer  also python3-torch, which only bench/sglang_peer.py needs
#                  (docs/performance.md, "SGLang RadixCache as a peer"); no
#                  build or test does, so the default list leaves it out
set -euo pipefail

PACKAGES=(
  # toolchain and build
  build-essential cmake pkg-config clang libclang-rt-14-dev
  # gRPC, protobuf, abseil, metrics, TLS
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libssl-dev openssl
  # the HTTP listener of /metrics and the status page (server/http/http_listener.h)
  libcivetweb-dev
  # the Conductor API's HTTPS (server/http/https_listener.h): Debian's
  # civetweb cannot serve TLS with OpenSSL 3; libmicrohttpd does, with GnuTLS
  libmicrohttpd-dev libgnutls28-dev
  # the fleet index: KV events over ZeroMQ, msgpack payloads, xxHash keys
  # (also the eviction history's block fingerprints, core/fingerprints.cc),
  # JSON of the Mooncake Conductor API
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libxxhash-dev nlohmann-json3-dev
  # names off the wire are checked as UTF-8 (index/wire_names.h)
  libutfcpp-dev
  # Pick reads the engines' own /metrics over HTTP (server/engine_scraper.h)
  libcurl4-openssl-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev libhiredis-dev
  # Python client and its tests (Debian's /usr/bin/python3); `pip install
  # client/python` into a venv made with --system-site-packages, offline
  python3-grpcio python3-grpc-tools python3-protobuf
  python3-venv python3-setuptools python3-wheel
  # .ci/clean_clone.sh: the README's commands in a fresh clone
  git
  # engine-event publishers in the index tests; a DNS server of a test's own
  # (tests/python/dns_server.py)
  python3-zmq python3-msgpack python3-dnspython
  # the status page and KV calculator in a real browser (tests/python/test_web_ui.py)
  chromium chromium-driver python3-selenium
  # deploy checks: Prometheus rules (promtool), manifests (kubectl and YAML),
  # the Redis benchmark peer, CPack's dependency scan (file)
  prometheus redis-server kubernetes-client python3-yaml file
)

CHECK=0
for arg in "$@"; do
  case "$arg" in
    --check) CHECK=1 ;;
    --sglang-peer) PACKAGES+=(python3-torch) ;;
    *) echo "install-deps: unknown argument '$arg' (--check, --sglang-peer)" >&2; exit 2 ;;
  esac
done

# A package whose command is already installed from another package counts
# as present: kubectl from Kubernetes' own repository ships /usr/bin/kubectl
# too, and the two cannot be installed side by side.
declare -A SATISFIED_BY_COMMAND=([kubernetes-client]=kubectl)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" == "installed" ]]; then
    continue
  fi
  cmd=${SATISFIED_BY_COMMAND[$pkg]:-}
  if [[ -n "$cmd" ]] && command -v "$cmd" >/dev/null; then
    continue
  fi
  missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
if [[ $CHECK -eq 1 ]]; then
  echo "install-deps: missing: ${missing[*]}"
  exit 1
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then
    SUDO=(sudo)
  else
    echo "install-deps: missing ${missing[*]}; run this script as root" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
