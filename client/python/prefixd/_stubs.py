"""Finds the generated prefixd.v1 modules and makes them `prefixd.v1`.

An installed package (`pip install client/python`, see pyproject.toml)
carries them as its own subpackage prefixd/v1, and nothing is looked up.
In a source checkout they live in a build directory, never in the source
tree (see client/python/gen_stubs.py), and are looked up, in order:

1. $PREFIXD_PYTHON_STUBS: a directory holding prefixd/v1/prefix_cache_pb2.py
   (and prefix_index_pb2.py, the fleet index's);
2. in a source checkout (../../proto exists), a per-user cache keyed by the
   .protos' hash, generated on first use: ~/.cache/prefixd/python-stubs/<hash>.

The directory's prefixd/ is appended to this package's __path__, so the
generated code's own `from prefixd.v1 import prefix_cache_pb2` resolves.
"""

import hashlib
import os
import subprocess
import sys

ENV = "PREFIXD_PYTHON_STUBS"
_HERE = os.path.dirname(os.path.abspath(__file__))
_PYTHON_DIR = os.path.dirname(_HERE)
_PROTO_DIR = os.path.join(os.path.dirname(os.path.dirname(_PYTHON_DIR)), "proto", "prefixd", "v1")
_PROTO = os.path.join(_PROTO_DIR, "prefix_cache.proto")
# The protos gen_stubs.py compiles (its PROTOS), and one module each must exist.
_PROTOS = ("prefix_cache.proto", "prefix_index.proto")
_MODULES = tuple(os.path.join("prefixd", "v1", p[:-len(".proto")] + "_pb2_grpc.py")
                 for p in _PROTOS)


def _cache_dir():
    h = hashlib.sha256()
    for p in _PROTOS:
        with open(os.path.join(_PROTO_DIR, p), "rb") as f:
            h.update(f.read())
    digest = h.hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "prefixd", "python-stubs", digest)


def stubs_dir():
    """The directory holding prefixd/v1/*_pb2*.py; generates it if needed."""
    env = os.environ.get(ENV)
    if env:
        missing = [m for m in _MODULES if not os.path.exists(os.path.join(env, m))]
        if missing:  # none, or stubs from before a proto was added
            raise ImportError("%s=%s holds no %s; generate it: %s %s --out %s"
                              % (ENV, env, missing[0], sys.executable,
                                 os.path.join(_PYTHON_DIR, "gen_stubs.py"), env))
        return env
    if not os.path.exists(_PROTO):
        raise ImportError("prefixd's gRPC stubs are not generated: run client/python/"
                          "gen_stubs.py --out DIR and set %s=DIR" % ENV)
    out = _cache_dir()
    if not all(os.path.exists(os.path.join(out, m)) for m in _MODULES):
        r = subprocess.run([sys.executable, os.path.join(_PYTHON_DIR, "gen_stubs.py"),
                            "--out", out], capture_output=True, text=True)
        if r.returncode != 0:
            raise ImportError("generating prefixd's gRPC stubs failed: %s" % r.stderr.strip())
    return out


def shipped():
    """Whether this package was built with its stubs (setup.py's build_py)."""
    return all(os.path.exists(os.path.join(_HERE, os.path.relpath(m, "prefixd")))
               for m in _MODULES)


def install(package_path):
    """Appends the stubs' prefixd/ directory to the package's __path__,
    unless the package ships its own prefixd.v1."""
    if shipped():
        return
    d = os.path.join(stubs_dir(), "prefixd")
    if d not in package_path:
        package_path.append(d)
