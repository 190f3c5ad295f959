#!/usr/bin/env python3
"""Checks bench/sglang_peer.py's command line without SGLang's source or torch.

CI has neither (docs/performance.md, "SGLang RadixCache as a peer"), so this
runs the real script on what it must handle before it needs them: --help,
a --sglang_src without radix_cache.py, and bad flag values. A `torch` package
that aborts on import is put first on PYTHONPATH, so each case also proves
that it gets its answer before importing torch.

  check_sglang_peer_cli.py [PATH_TO_SGLANG_PEER_PY]
"""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "sglang_peer.py")
POISON = "check_sglang_peer_cli: torch was imported"
FLAGS = ("--sglang_src", "--traces", "--capacities", "--trace_dir",
         "--block_size", "--eviction_policy", "--runs", "--json",
         "--no_progress")


class SglangPeerCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        torch_dir = os.path.join(cls.tmp.name, "poison", "torch")
        os.makedirs(torch_dir)
        with open(os.path.join(torch_dir, "__init__.py"), "w") as f:
            f.write("raise SystemExit(%r)\n" % POISON)
        cls.env = dict(os.environ, PYTHONPATH=os.path.dirname(torch_dir))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_peer(self, *args):
        p = subprocess.run([sys.executable, SCRIPT] + list(args),
                           env=self.env, capture_output=True, text=True,
                           timeout=60)
        self.assertNotIn(POISON, p.stderr)
        return p

    def test_help_lists_every_flag(self):
        p = self.run_peer("--help")
        self.assertEqual(p.returncode, 0, p.stderr)
        for flag in FLAGS:
            self.assertIn(flag, p.stdout)
        self.assertIn("RadixCache", p.stdout)

    def test_missing_radix_cache_is_named(self):
        empty = os.path.join(self.tmp.name, "empty")
        os.makedirs(empty, exist_ok=True)
        p = self.run_peer("--sglang_src=" + empty, "--capacities=64")
        self.assertEqual(p.returncode, 1, p.stderr)
        want = os.path.join(empty, "sglang", "srt", "mem_cache",
                            "radix_cache.py")
        self.assertIn("--sglang_src=" + empty, p.stderr)
        self.assertIn("no " + want, p.stderr)

    def test_sglang_src_is_required(self):
        p = self.run_peer("--capacities=64")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--sglang_src", p.stderr)

    def test_bad_capacity_is_named(self):
        p = self.run_peer("--sglang_src=" + self.tmp.name,
                          "--capacities=1953,12x")
        self.assertEqual(p.returncode, 2)
        self.assertIn("'12x'", p.stderr)

    def test_bad_block_size_is_named(self):
        p = self.run_peer("--sglang_src=" + self.tmp.name, "--block_size=0")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--block_size=0", p.stderr)


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        SCRIPT = sys.argv.pop(1)
    unittest.main()
