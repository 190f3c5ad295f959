#!/usr/bin/python3
"""The include graph must be the layer picture of docs/architecture.md.

Every .h and .cc under base/, core/, model/, index/, server/ and client/ is
scanned for #include lines. A header whose first path component is a directory of
this repository belongs to that layer ("prefixd/v1/..." are the generated
headers of proto/), except in server/, which is three layers: the daemon
(server/daemon.* and server/main.cc), the HTTP side (server/http/) and the
rest, the gRPC side (server/). Any other header is third-party and allowed,
except:

    base/          the standard library and abseil only (a header with no
                   directory, or absl/...; its tests also gtest and gmock);
    core/, index/  never gRPC, protobuf or Prometheus;
    model/         never gRPC or Prometheus; protobuf only in hf_config.cc,
                   for its JSON parser.

The layers each one may include (dependencies point one way):

    base    base
    core    core, base
    model   model, base
    index        index, core, base
    daemon       daemon, server/http, server, core, model, index, proto, base
    server/http  server/http, server, core, model, index, proto, base
    server       server, core, model, index, proto, base
    client       client, proto, model, base

Nothing includes client/, bench/ or tests/.

Prints each violation as file:line and exits 1; exits 0 when there is none.
--self_test checks on a scratch tree that violations are caught.
"""

import os
import re
import sys
import tempfile

import source_check

ALLOWED = {
    "base": {"base"},
    "core": {"core", "base"},
    "model": {"model", "base"},
    "index": {"index", "core", "base"},
    "daemon": {"daemon", "server/http", "server", "core", "model", "index",
               "proto", "base"},
    "server/http": {"server/http", "server", "core", "model", "index",
                    "proto", "base"},
    "server": {"server", "core", "model", "index", "proto", "base"},
    "client": {"client", "proto", "model", "base"},
}
# The top-level directories scanned; server/ holds three layers.
SCANNED = ("base", "core", "model", "index", "server", "client")
# Paths in server/ of the layers above the gRPC side, longest first.
SERVER_LAYERS = (
    ("server/http/", "server/http"),
    ("server/daemon.", "daemon"),
    ("server/main.cc", "daemon"),
)
# Top-level directories whose headers are ours, and the layer they are in.
PROJECT_DIRS = {
    "base": "base",
    "core": "core",
    "model": "model",
    "index": "index",
    "server": "server",
    "client": "client",
    "bench": "bench",
    "tests": "tests",
    "proto": "proto",
    "prefixd": "proto",  # prefixd/v1/*.pb.h, generated from proto/
}
NO_RPC = ("grpc/", "grpcpp/", "google/protobuf/", "prometheus/")
FORBIDDEN_THIRD_PARTY = {
    "core": NO_RPC,
    "index": NO_RPC,
    "model": ("grpc/", "grpcpp/", "prometheus/"),
}
# Files allowed a third-party prefix their layer otherwise forbids.
THIRD_PARTY_EXCEPTIONS = {
    ("model/hf_config.cc", "google/protobuf/"),
}
MODEL_PROTOBUF_ONLY_IN = "model/hf_config.cc"
# base/'s only third-party headers; its tests may add googletest's.
BASE_THIRD_PARTY = ("absl/",)
BASE_TEST_THIRD_PARTY = ("gtest/", "gmock/")

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')


def sources(root, layer):
    top = os.path.join(root, layer)
    if not os.path.isdir(top):  # index/ may not exist yet
        return
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith((".h", ".cc")):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root).replace(os.sep, "/"), path


def layer_of(path, top):
    """The layer of a repository path ("server/http/x.h") whose first
    component `top` maps to."""
    if top == "server":
        for prefix, layer in SERVER_LAYERS:
            if path.startswith(prefix):
                return layer
    return top


def check_file(rel, path, top):
    layer = layer_of(rel, top)
    problems = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            header = m.group(1)
            first = header.split("/", 1)[0] if "/" in header else None
            target = PROJECT_DIRS.get(first)
            if target is not None:
                target = layer_of(header, target)
                if target not in ALLOWED[layer]:
                    problems.append(
                        f'{rel}:{lineno}: #include "{header}": {layer}/ may '
                        f"not include {target}/ (allowed: "
                        f"{', '.join(sorted(ALLOWED[layer]))})")
                continue
            for prefix in FORBIDDEN_THIRD_PARTY.get(top, ()):
                if header.startswith(prefix):
                    problems.append(
                        f'{rel}:{lineno}: #include "{header}": {layer}/ never '
                        f"includes {prefix.rstrip('/')} headers")
            if top == "base" and not base_may_include(rel, header):
                problems.append(
                    f'{rel}:{lineno}: #include "{header}": base/ includes '
                    f"only the standard library and abseil")
            if (top == "model" and header.startswith("google/protobuf/")
                    and rel != MODEL_PROTOBUF_ONLY_IN):
                problems.append(
                    f'{rel}:{lineno}: #include "{header}": in model/ only '
                    f"{MODEL_PROTOBUF_ONLY_IN} may include protobuf")
    return problems


def base_may_include(rel, header):
    """A standard header has no directory; abseil's start with absl/."""
    if "/" not in header or header.startswith(BASE_THIRD_PARTY):
        return True
    return (rel.endswith("_test.cc")
            and header.startswith(BASE_TEST_THIRD_PARTY))


def check(root):
    problems = []
    for top in SCANNED:
        for rel, path in sources(root, top):
            problems += check_file(rel, path, top)
    return problems


def self_test():
    """Violations in a scratch tree are each reported; a clean one passes."""
    files = {
        "base/ok.h": ('#include <cstdint>\n#include "absl/status/status.h"\n'
                      '#include "base/mutex.h"\n'),
        "base/ok_test.cc": '#include "base/ok.h"\n#include "gtest/gtest.h"\n',
        "base/bad.cc": '#include "base/ok.h"\n#include "core/types.h"\n',
        "base/json.h": '#include "nlohmann/json.hpp"\n',
        "base/mock_user.cc": '#include "gmock/gmock.h"\n',
        "core/ok.h": ('#include "core/types.h"\n#include "absl/status/status.h"\n'
                      '#include "base/status_macros.h"\n'),
        "client/ok.cc": '#include "base/flag_parser.h"\n',
        "core/bad.cc": '#include "core/ok.h"\n#include "model/units.h"\n',
        "core/rpc.h": "#include <grpcpp/grpcpp.h>\n",
        "model/bad.h": '#include "core/types.h"\n',
        "model/pb.cc": '#include "google/protobuf/struct.pb.h"\n',
        "model/hf_config.cc": '#include "google/protobuf/struct.pb.h"\n',
        "server/bad.cc": '#include "index/a.h"\n#include "client/client.h"\n',
        "server/sub/bench.h": '#  include "bench/load/common.h"\n',
        "server/daemon.cc": ('#include "server/daemon.h"\n#include "server/http/m.h"\n'
                             '#include "server/server.h"\n#include "index/a.h"\n'),
        "server/main.cc": '#include "server/daemon.h"\n#include "server/flags.h"\n',
        "server/http/ok.cc": ('#include "server/http/m.h"\n#include "server/service.h"\n'
                              '#include "index/kv_index.h"\n'),
        "server/http/up.cc": '#include "server/http/m.h"\n#include "server/daemon.h"\n',
        "server/grpc.cc": '#include "server/service.h"\n#include "server/http/m.h"\n',
        "server/signals.h": '#include "server/daemon.h"\n',
        "client/bad.cc": ('#include "prefixd/v1/prefix_cache.pb.h"\n'
                          '#include "model/rope.h"\n#include "core/cache.h"\n'),
    }
    expected = [
        "base/bad.cc:2:", "base/json.h:1:", "base/mock_user.cc:1:",
        "client/bad.cc:3:", "core/bad.cc:2:", "core/rpc.h:1:",
        "model/bad.h:1:", "model/pb.cc:1:",
        "server/bad.cc:2:", "server/grpc.cc:2:", "server/http/up.cc:2:",
        "server/signals.h:1:", "server/sub/bench.h:1:",
    ]
    with tempfile.TemporaryDirectory() as root:
        source_check.write_tree(root, files)
        got = sorted(p.split(" ", 1)[0] for p in check(root))
        if got != expected:
            print(f"self test: reported {got}, expected {expected}")
            return 1
        for rel in {e.split(":", 1)[0] for e in expected}:
            os.remove(os.path.join(root, rel))
        if check(root):
            print(f"self test: a clean tree reported {check(root)}")
            return 1
    print("self test: every violation reported, a clean tree passes")
    return 0


def passed(root):
    scanned = [d for d in SCANNED if os.path.isdir(os.path.join(root, d))]
    return f"layering ok: {', '.join(d + '/' for d in scanned)}"


def main():
    return source_check.main(
        __doc__, check, self_test,
        "include(s) against the layering (docs/architecture.md, "
        "tests/layering_check.py)", passed)


if __name__ == "__main__":
    sys.exit(main())
