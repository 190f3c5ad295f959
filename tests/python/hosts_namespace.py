"""A test's own /etc/hosts: the script runs itself again in a mount
namespace of its own (unshare -m), where a file of the test's is mounted
over /etc/hosts. The machine's own file is untouched, and the daemon the
test starts resolves names through the test's file.

    common.setup(__doc__)
    ...
    if __name__ == "__main__":
        hosts_namespace.enter(ARGS)          # SKIP where not allowed
        hosts = hosts_namespace.mount("127.0.0.1 localhost\\n")
        hosts_namespace.rewrite(hosts, ...)  # later lookups see it

Needs unshare(1) and mount(8) and the right to make a mount namespace
(root, or a user namespace); without them the test exits with ctest's SKIP.
"""

import os
import subprocess
import sys
import tempfile

import common

_INSIDE = "PREFIXD_TEST_HOSTS_NAMESPACE"


def enter(args):
    """Returns in the namespace: at once when this process is already in
    it, else after running the script again there (and exiting with its
    code)."""
    if os.environ.get(_INSIDE) == "1":
        return
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        print("SKIP: no mount namespace here (unshare -m: %s)"
              % probe.stderr.decode().strip())
        sys.exit(common.SKIP)
    argv = [sys.executable, os.path.abspath(sys.modules["__main__"].__file__),
            "--prefixd", args.prefixd, "--stubs", args.stubs] + sys.argv[1:]
    env = dict(os.environ, **{_INSIDE: "1"})
    sys.exit(subprocess.run(["unshare", "-m", "--propagation", "private"] + argv,
                            env=env).returncode)


def mount(text, target="/etc/hosts"):
    """Mounts a file holding `text` over `target` (/etc/hosts, or
    /etc/resolv.conf for tests/python/dns_server.py); returns its path."""
    path = os.path.join(tempfile.mkdtemp(prefix="prefixd-hosts-"),
                        os.path.basename(target))
    with open(path, "w") as f:
        f.write(text)
    subprocess.run(["mount", "--bind", path, target], check=True)
    return path


def rewrite(path, text):
    """Replaces the mounted file's text in place (the same file, so the
    mount shows it): the next lookup of any process in the namespace reads
    it."""
    with open(path, "r+") as f:
        f.truncate(0)
        f.write(text)
