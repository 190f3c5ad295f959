#!/usr/bin/python3
"""`pip install client/python` into a virtual environment, then a real call.

Engines run in virtual environments, not on Debian's system Python. This
makes one with `/usr/bin/python3 -m venv --system-site-packages` (Debian's
grpcio, protobuf, setuptools and grpc-tools), installs the package offline
(`pip install --no-index --no-build-isolation`) from a copy of the committed
client/python and proto/ (so the build leaves nothing in the source tree),
and from a directory outside the repository, with no PYTHONPATH nor
$PREFIXD_PYTHON_STUBS, imports prefixd and calls a real daemon: the stubs
must come from the installed package itself. Also checks the declared
dependencies and that the version is the daemon's.

Usage: python_install_test.py --prefixd PATH [--repo DIR]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
ARGS = None

# Run by the venv's python from the temp dir: insert, match, the stubs' origin.
CALL = r"""
import json, sys
import prefixd, prefixd.v1.prefix_cache_pb2 as pb
with prefixd.Client(sys.argv[1]) as c:
    ins = c.insert(list(range(1, 33)), [100, 101])
    m = c.match(list(range(1, 41)))
    print(json.dumps({"package": prefixd.__file__, "stubs": pb.__file__,
                      "health": c.health(), "cached": ins.cached_tokens,
                      "matched": m.matched_tokens, "ids": list(m.block_ids)}))
"""


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kw)
    if r.returncode != 0:
        raise AssertionError("%s: exit %d\n%s%s" % (" ".join(cmd), r.returncode, r.stdout,
                                                    r.stderr))
    return r.stdout


class PythonInstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmpdir = tempfile.TemporaryDirectory(prefix="prefixd-pip-")
        t = cls.tmpdir.name
        src = os.path.join(t, "src")
        shutil.copytree(os.path.join(ARGS.repo, "client", "python"),
                        os.path.join(src, "client", "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        shutil.copytree(os.path.join(ARGS.repo, "proto"), os.path.join(src, "proto"))
        cls.env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTHONPATH", "PREFIXD_PYTHON_STUBS")}
        cls.env.update(HOME=t, XDG_CACHE_HOME=os.path.join(t, "cache"),
                       PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        venv = os.path.join(t, "venv")
        run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], env=cls.env)
        cls.python = os.path.join(venv, "bin", "python")
        cls.install_log = run([cls.python, "-m", "pip", "install", "--no-index",
                               "--no-build-isolation", os.path.join(src, "client", "python")],
                              env=cls.env, cwd=t)
        cls.venv = venv
        cls.cwd = t

    @classmethod
    def tearDownClass(cls):
        cls.tmpdir.cleanup()

    def test_installed_package_calls_a_daemon(self):
        import prefixd_fixture
        with prefixd_fixture.Daemon(ARGS.prefixd, 'kv_budget: "64MiB"') as d:
            out = run([self.python, "-c", CALL, d.unix], env=self.env, cwd=self.cwd)
        got = json.loads(out)
        site = os.path.join(self.venv, "lib")
        self.assertTrue(got["package"].startswith(site), got)
        self.assertTrue(got["stubs"].startswith(site), got)  # shipped, not generated
        self.assertEqual(got["health"], "SERVING")
        self.assertEqual(got["cached"], 0)
        self.assertEqual((got["matched"], got["ids"]), (32, [100, 101]))

    def test_metadata(self):
        show = run([self.python, "-m", "pip", "show", "prefixd"], env=self.env, cwd=self.cwd)
        self.assertRegex(show, r"(?m)^Requires: grpcio, protobuf$")
        with open(os.path.join(ARGS.repo, "CMakeLists.txt")) as f:
            version = re.search(r"project\(prefixd VERSION (\S+)", f.read()).group(1)
        self.assertIn("Version: %s\n" % version, show)

    def test_what_the_docs_install_in_the_tree_is_git_ignored(self):
        """The README's (and docs/index.md's) venv goes into the repository's
        root; it, and what pip builds in client/python, must not show up
        as untracked files."""
        if shutil.which("git") is None or not os.path.exists(os.path.join(ARGS.repo, ".git")):
            self.skipTest("not a git checkout")
        venvs = set()
        for doc in ("README.md", os.path.join("docs", "index.md")):
            with open(os.path.join(ARGS.repo, doc)) as f:
                venvs.update(re.findall(r"-m venv --system-site-packages (\S+)$", f.read(),
                                        re.M))
        self.assertEqual(venvs, {"venv"})  # the docs agree; a new one needs a look
        for path in ("venv/bin/python", "venv/lib/python3/site-packages/prefixd/client.py",
                     "client/python/build/lib/prefixd/client.py",
                     "client/python/prefixd.egg-info/PKG-INFO"):
            r = subprocess.run(["git", "-C", ARGS.repo, "check-ignore", "-q", "--no-index",
                                path], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, "%s is not git-ignored" % path)

    def test_source_tree_untouched(self):
        src = os.path.join(ARGS.repo, "client", "python", "prefixd", "v1")
        self.assertFalse(os.path.exists(src), "generated stubs in the source tree")


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prefixd", required=True)
    ap.add_argument("--repo", default=REPO)
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
