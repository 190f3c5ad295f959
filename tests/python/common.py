"""Shared set-up of the Python tests: command line, stubs, import path.

    args = common.setup(__doc__)     # before importing prefixd

--prefixd PATH   the daemon binary (required by tests that run it)
--stubs DIR      generated stubs (client/python/gen_stubs.py); default:
                 $PREFIXD_PYTHON_STUBS, else generated into a temp dir
Remaining arguments go to unittest (e.g. -v, or a test name).
"""

import argparse
import atexit
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(REPO, "client", "python")
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def setup(doc, extra=None):
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--prefixd", help="the prefixd binary")
    ap.add_argument("--stubs", default=os.environ.get("PREFIXD_PYTHON_STUBS"))
    if extra:
        extra(ap)
    args, rest = ap.parse_known_args()
    sys.argv = [sys.argv[0]] + rest
    for d in (PYTHON_DIR, TESTS_DIR):
        if d not in sys.path:
            sys.path.insert(0, d)
    if not args.stubs:
        args.stubs = tempfile.mkdtemp(prefix="prefixd-stubs-")
        atexit.register(shutil.rmtree, args.stubs, True)
    sys.path.insert(0, PYTHON_DIR)
    import gen_stubs  # client/python/gen_stubs.py
    if not os.path.exists(os.path.join(args.stubs, "prefixd", "v1", "prefix_cache_pb2_grpc.py")):
        gen_stubs.generate(args.stubs)
    os.environ["PREFIXD_PYTHON_STUBS"] = args.stubs
    return args
