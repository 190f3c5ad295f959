#!/usr/bin/python3
"""Generates the Python gRPC stubs of prefixd.v1 into a build directory.

    /usr/bin/python3 client/python/gen_stubs.py --out build/python-stubs
    export PREFIXD_PYTHON_STUBS=$PWD/build/python-stubs

writes OUT/prefixd/v1/prefix_cache_pb2.py, prefix_cache_pb2_grpc.py and the
fleet index's prefix_index_pb2.py, prefix_index_pb2_grpc.py. The
`prefixd` package (client/python/prefixd) finds them through
$PREFIXD_PYTHON_STUBS; they are never committed.

Uses protoc with grpc_python_plugin (protobuf-compiler,
protobuf-compiler-grpc), or else `python3 -m grpc_tools.protoc`. protoc
comes first: the protos use proto3 `optional` (Retention.priority), which
Debian 12's python3-grpc-tools, bundling protoc 3.5, cannot compile.
Files are written to a temporary directory and renamed into place, so
concurrent runs never leave a half-written module.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROTO_ROOT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "proto")
PROTOS = ["prefixd/v1/prefix_cache.proto", "prefixd/v1/prefix_index.proto"]


def have_grpc_tools(python):
    r = subprocess.run([python, "-c", "import grpc_tools.protoc"], capture_output=True)
    return r.returncode == 0


def protoc_command(python, proto_root, out):
    protoc, plugin = shutil.which("protoc"), shutil.which("grpc_python_plugin")
    if protoc and plugin:
        return [protoc, "-I" + proto_root, "--python_out=" + out, "--grpc_python_out=" + out,
                "--plugin=protoc-gen-grpc_python=" + plugin]
    if have_grpc_tools(python):
        return [python, "-m", "grpc_tools.protoc", "-I" + proto_root, "--python_out=" + out,
                "--grpc_python_out=" + out]
    raise RuntimeError("no protobuf compiler for Python: apt-get install protobuf-compiler "
                       "protobuf-compiler-grpc")


def generate(out, proto_root=DEFAULT_PROTO_ROOT, python=sys.executable):
    """Writes the stubs under `out`; returns `out`."""
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".gen-", dir=out)
    try:
        cmd = protoc_command(python, proto_root, tmp)
        cmd += [os.path.join(proto_root, p) for p in PROTOS]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("%s failed:\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
        for pkg in ("prefixd", "prefixd/v1"):
            os.makedirs(os.path.join(out, pkg), exist_ok=True)
        open(os.path.join(tmp, "prefixd", "v1", "__init__.py"), "w").close()
        for name in sorted(os.listdir(os.path.join(tmp, "prefixd", "v1"))):
            os.replace(os.path.join(tmp, "prefixd", "v1", name),
                       os.path.join(out, "prefixd", "v1", name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory to write the stubs under")
    ap.add_argument("--proto_root", default=DEFAULT_PROTO_ROOT,
                    help="directory holding prefixd/v1/*.proto (default: the repository's)")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter whose grpc_tools to use (default: this one)")
    args = ap.parse_args()
    try:
        generate(args.out, args.proto_root, args.python)
    except RuntimeError as e:
        print("gen_stubs: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
