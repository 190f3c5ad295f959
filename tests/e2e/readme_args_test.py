#!/usr/bin/python3
"""README's `make run ARGS="..."` example, followed literally: every file the
arguments name exists in the repository, and prefixd starts with them and
serves (the Makefile's comment names the same file).

Only the addresses and the snapshot path are moved to a temp dir and free
ports, so that the test runs beside other tests and a daemon already on the
default ports; the config file is the one README names.

Usage: readme_args_test.py --repo DIR --prefixd PATH --prefixctl PATH
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_args(path):
    """The ARGS="..." of `make run` in the file at `path`."""
    with open(path) as f:
        text = f.read()
    found = re.findall(r'make run ARGS="([^"]*)"', text) or re.findall(
        r'\(ARGS="([^"]*)"', text)
    if not found:
        sys.exit("no make run ARGS=\"...\" example in %s" % path)
    return found[0].split()


def serves(prefixctl, addr, deadline):
    while time.monotonic() < deadline:
        r = subprocess.run([prefixctl, "--addr", addr, "health"], capture_output=True,
                           text=True, timeout=10)
        if r.returncode == 0 and r.stdout == "SERVING\n":
            return True
        time.sleep(0.2)
    return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--prefixd", required=True)
    parser.add_argument("--prefixctl", required=True)
    args = parser.parse_args()

    readme_args = run_args(os.path.join(args.repo, "README.md"))
    makefile_args = run_args(os.path.join(args.repo, "Makefile"))
    failures = []
    if readme_args != makefile_args:
        failures.append("README's ARGS %s differ from the Makefile's %s"
                        % (readme_args, makefile_args))
    for arg in readme_args:
        m = re.fullmatch(r"--config=(.+)", arg)
        if m and not os.path.isfile(os.path.join(args.repo, m.group(1))):
            failures.append("README's ARGS name %s, which is not in the repository"
                            % m.group(1))
    if failures:
        print("\n".join("FAIL  " + f for f in failures))
        return 1

    with tempfile.TemporaryDirectory(prefix="prefixd-readme-") as tmp:
        addr = "127.0.0.1:%d" % free_port()
        err = open(os.path.join(tmp, "prefixd.err"), "w+")
        # `make run` starts prefixd from the repository root.
        proc = subprocess.Popen(
            [args.prefixd] + readme_args +
            ["--listen", addr, "--listen", "unix://" + os.path.join(tmp, "p.sock"),
             "--metrics_listen", "127.0.0.1:%d" % free_port(),
             "--snapshot_path", os.path.join(tmp, "snapshot.bin")],
            cwd=args.repo, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        ok = serves(args.prefixctl, addr, time.monotonic() + 30)
        proc.terminate()
        rc = proc.wait(timeout=30)
        err.seek(0)
        logs = err.read()
    if not ok or rc != 0:
        print("FAIL  prefixd %s: serving %s, exit %s\n%s" % (" ".join(readme_args), ok, rc,
                                                              logs))
        return 1
    print("ok    prefixd %s serves and exits 0 on SIGTERM" % " ".join(readme_args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
