#!/usr/bin/python3
"""prefixd, prefixctl and `prefixctl plan` share one command-line parser and
one set of exit codes (base/flag_parser.h, docs/client.md): 0 ok, 1 the
work failed, 2 usage error. Each case runs the real binaries.

Usage: cli_exit_codes_test.py --prefixd PATH --prefixctl PATH
"""

import argparse
import socket
import subprocess
import sys
import tempfile
import unittest

ARGS = None
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def run(binary, *args):
    r = subprocess.run([binary] + list(args), capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout, r.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UsageErrorsExit2(unittest.TestCase):
    """The parser's errors: exit 2, the flag (and the value) named."""

    def check(self, binary, args, message):
        rc, out, err = run(binary, *args)
        self.assertEqual(rc, EXIT_USAGE, "%s: %s" % (args, err))
        self.assertIn(message, err, args)
        self.assertEqual(out, "", args)

    def test_prefixd(self):
        self.check(ARGS.prefixd, ["--lisen=127.0.0.1:1"],
                   "unknown flag --lisen; did you mean --listen?")
        # vLLM's and SGLang's dashed spelling gets the underscored one.
        self.check(ARGS.prefixd, ["--index-source=e0=tcp://127.0.0.1:5557"],
                   "unknown flag --index-source: flags are spelled with underscores, "
                   "--index_source")
        self.check(ARGS.prefixd, ["--kv_budget"], "--kv_budget needs a value (--kv_budget=SIZE)")
        self.check(ARGS.prefixd, ["serve"], 'unexpected argument "serve"; flags start with --')
        self.check(ARGS.prefixd, ["--block_size", "0"], "--block_size=0: want a positive integer")
        self.check(ARGS.prefixd, ["--help=yes"],
                   '--help takes no value (or true or false), not "yes"')

    def test_prefixctl(self):
        self.check(ARGS.prefixctl, ["--bogus", "stats"], "unknown flag --bogus")
        self.check(ARGS.prefixctl, ["--adr=127.0.0.1:1", "stats"],
                   "unknown flag --adr; did you mean --addr?")
        self.check(ARGS.prefixctl, ["stats", "--addr"], "--addr needs a value (--addr=ADDR)")
        self.check(ARGS.prefixctl, ["stats", "extra"],
                   'unexpected argument "extra"; flags start with --')
        self.check(ARGS.prefixctl, ["--json=maybe", "stats"],
                   '--json takes no value (or true or false), not "maybe"')

    def test_prefixctl_plan(self):
        self.check(ARGS.prefixctl, ["plan", "--bogus"], "unknown flag --bogus")
        self.check(ARGS.prefixctl, ["plan", "--hf-config=x.json"],
                   "unknown flag --hf-config: flags are spelled with underscores, --hf_config")
        self.check(ARGS.prefixctl, ["plan", "--model"], "--model needs a value (--model=PRESET|FILE)")
        self.check(ARGS.prefixctl, ["plan", "stray"], 'unexpected argument "stray"')


class FailuresExit1(unittest.TestCase):
    """A well-formed command line whose work fails: exit 1."""

    def test_prefixd_config_that_does_not_load(self):
        # At start-up as under --check_config: the config, not the command
        # line, is wrong.
        with tempfile.TemporaryDirectory(prefix="prefixd-cli-") as tmp:
            path = tmp + "/bad.textproto"
            with open(path, "w") as f:
                f.write('kv_budget: "4 parsecs"\n')
            for args in (["--config=" + path, "--listen=127.0.0.1:0",
                          "--metrics_listen=127.0.0.1:0"],
                         ["--check_config=" + path]):
                rc, _, err = run(ARGS.prefixd, *args)
                self.assertEqual(rc, EXIT_FAILURE, "%s: %s" % (args, err))
                self.assertIn("4 parsecs", err, args)

    def test_prefixctl_rpc_error(self):
        rc, _, err = run(ARGS.prefixctl, "--addr", "127.0.0.1:%d" % free_port(),
                         "--timeout", "5s", "info")
        self.assertEqual(rc, EXIT_FAILURE, err)
        self.assertIn("UNAVAILABLE", err)

    def test_prefixctl_plan_impossible(self):
        rc, _, err = run(ARGS.prefixctl, "plan", "--model", "llama-3-70b", "--gpus",
                         "H100-80GB", "--weights", "140GB")
        self.assertEqual(rc, EXIT_FAILURE, err)
        self.assertIn("exceed GPU memory", err)


class HelpExits0AndStatesTheCodes(unittest.TestCase):

    def test_every_help(self):
        for binary, args, flags in (
                (ARGS.prefixd, ["--help"], ["--config=FILE", "--index_source=", "--version"]),
                (ARGS.prefixd, ["-h"], ["--check_config=FILE"]),
                (ARGS.prefixctl, ["--help"], ["--addr=ADDR", "--tokens=LIST", "--gpus=GPUS"]),
                (ARGS.prefixctl, ["insert", "--help"], ["--block_ids_file=FILE", "--timeout="]),
                (ARGS.prefixctl, ["plan", "--help"], ["--kv_dtype=DTYPE", "--max_seq_len=N"])):
            rc, out, err = run(binary, *args)
            self.assertEqual(rc, EXIT_OK, "%s: %s" % (args, err))
            for flag in flags:
                self.assertIn(flag, out, args)
            if args != ["insert", "--help"]:
                self.assertRegex(out, r"Exit codes: 0 .*, 1 [^\n]*(\n[^\n]*)?2 usage error",
                                 args)
        # --json's two conventions, said where a script writer looks first.
        _, out, _ = run(ARGS.prefixctl, "--help")
        self.assertIn("--json print JSON (one object per line) instead of tables: protobuf's "
                      "JSON mapping, so 64-bit numbers are strings", " ".join(out.split()))
        _, out, _ = run(ARGS.prefixctl, "plan", "--help")
        self.assertIn("--json print JSON for scripts instead of tables (numbers as numbers, "
                      "exact integers)", " ".join(out.split()))
        rc, out, _ = run(ARGS.prefixd, "--version")
        self.assertEqual(rc, EXIT_OK)
        self.assertTrue(out.startswith("prefixd "), out)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefixd", required=True)
    parser.add_argument("--prefixctl", required=True)
    ARGS, rest = parser.parse_known_args()
    return 0 if unittest.main(argv=[sys.argv[0]] + rest, exit=False).result.wasSuccessful() \
        else 1


if __name__ == "__main__":
    sys.exit(main())
