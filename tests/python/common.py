"""Shared pieces of the Python tests: command line, stubs, import path;
unittest.main() with ctest's skip code; the pass/fail counter of the
script-style tests; stopping a process; the real daemon served once on a
given config.

    args = common.setup(__doc__)     # before importing prefixd
    ...
    common.unittest_main()           # exit 0, 1, or SKIP (77) when a test skipped

--prefixd PATH   the daemon binary (required by tests that run it)
--stubs DIR      generated stubs (client/python/gen_stubs.py); default:
                 $PREFIXD_PYTHON_STUBS, else generated into a temp dir
Remaining arguments go to unittest (e.g. -v, or a test name).
"""

import argparse
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(REPO, "client", "python")
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SKIP = 77  # ctest's SKIP_RETURN_CODE (tests/CMakeLists.txt)


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
    if not all(os.path.exists(os.path.join(args.stubs, "prefixd", "v1", m))
               for m in ("prefix_cache_pb2_grpc.py", "prefix_index_pb2_grpc.py")):
        gen_stubs.generate(args.stubs)  # none yet, or from before prefix_index.proto
    os.environ["PREFIXD_PYTHON_STUBS"] = args.stubs
    return args


def unittest_main(argv=None, defaultTest=None):
    """unittest.main() for a test ctest runs with SKIP_RETURN_CODE 77: exits
    1 when a test failed, else SKIP when one was skipped (a tool or an
    argument it needs is missing; the reasons are printed), else 0."""
    result = unittest.main(argv=argv, defaultTest=defaultTest, exit=False).result
    for test, reason in result.skipped:
        print("SKIP: %s: %s" % (test, reason))
    if not result.wasSuccessful():
        sys.exit(1)
    sys.exit(SKIP if result.skipped else 0)


class Checker:
    """Counts and prints checks, for the tests that are scripts rather than
    unittest cases: t.check(cond, what, detail) or t(cond, what, detail)
    prints "ok    what" or "FAIL  what" (and the detail) and returns cond;
    t.exit_code() prints the totals and returns 1 if any check failed."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, cond, what, detail=""):
        if cond:
            self.passed += 1
            print("ok    %s" % what)
        else:
            self.failed += 1
            print("FAIL  %s%s" % (what, ("\n      " + str(detail)) if detail else ""))
        return cond

    __call__ = check

    def exit_code(self):
        print("%d passed, %d failed" % (self.passed, self.failed))
        return 1 if self.failed else 0


def stop_process(proc, timeout=20):
    """SIGTERM, then the exit code; kills the process if it is still running
    after `timeout` seconds (the exit code is then the kill's)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def serve_config(binary, config_text):
    """Starts the real daemon `binary` on `config_text` (prefixd_fixture.Daemon:
    free ports and a temp dir replace the config's listeners and snapshot
    path), waits until it serves, stops it with SIGTERM. Returns None if it
    served and exited 0, else what went wrong (the logs included)."""
    import prefixd_fixture  # needs grpc: imported only by the tests that serve
    d = prefixd_fixture.Daemon(binary, config_text)
    try:
        d.start()
        rc = d.stop()
        return None if rc == 0 else "exit %s on SIGTERM:\n%s" % (rc, d.logs())
    except prefixd_fixture.DaemonFailed as e:
        return str(e)
    finally:
        d.close()
