#!/usr/bin/python3
"""Builds the Debian package with CPack (what `make package` does) into a
temporary directory and checks it with dpkg-deb: metadata, file list and
modes, conffiles, maintainer scripts, that the packaged unit, sysusers file
and config are the repository's, that Depends names the Debian package of
every shared library the binaries link (libzmq5 when the daemon has the
fleet index), and that the packaged (stripped) daemon serves the packaged
config and exits 0 on SIGTERM.

Exit 0 pass, 1 fail, 77 skip (dpkg-deb or cpack absent).
Usage: package_test.py --build DIR --version X.Y.Z [--cpack PATH] [--repo DIR]
       [unittest args]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = None

FILES = {  # path in the package -> mode
    "./usr/bin/prefixd": 0o755,
    "./usr/bin/prefixctl": 0o755,
    "./usr/lib/systemd/system/prefixd.service": 0o644,
    "./usr/lib/sysusers.d/prefixd.conf": 0o644,
    "./etc/prefixd/config.textproto": 0o644,
    "./usr/share/doc/prefixd/deploy.md": 0o644,
    "./usr/share/doc/prefixd/img/status.png": 0o644,
    "./usr/share/doc/prefixd/img/plan.png": 0o644,
}
SAME_AS_REPO = {
    "usr/lib/systemd/system/prefixd.service": "deploy/systemd/prefixd.service",
    "usr/lib/sysusers.d/prefixd.conf": "deploy/systemd/prefixd.sysusers",
    "etc/prefixd/config.textproto": "deploy/config/prefixd.textproto",
}


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 50),
                          **kw)


def mode_of(ls_line):
    perms = ls_line.split()[0]
    bits = 0
    for ch in perms[1:10]:
        bits = bits * 2 + (ch != "-")
    return bits


def path_variants(path):
    """`path` and its real path, each also with /usr added or taken away:
    with merged /usr, dpkg may know a library under /lib or /usr/lib."""
    out = []
    for p in (path, os.path.realpath(path)):
        out += [p, p[len("/usr"):] if p.startswith("/usr/") else "/usr" + p]
    return out


def read_bytes(path):
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read()


class PackageTest(unittest.TestCase):
    """cpack once (setUpClass), into a temporary directory; each test
    checks one part of the .deb."""

    @classmethod
    def setUpClass(cls):
        if shutil.which("dpkg-deb") is None or not ARGS.cpack:
            raise unittest.SkipTest("dpkg-deb or cpack not found")
        config = os.path.abspath(os.path.join(ARGS.build, "CPackConfig.cmake"))
        if not os.path.exists(config):
            raise AssertionError("check failed: %s exists (configure ran)" % config)
        cls.tmp = tempfile.mkdtemp(prefix="prefixd-pkg-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        r = run([ARGS.cpack, "--config", config, "-B", cls.tmp], cwd=ARGS.build)
        debs = [f for f in os.listdir(cls.tmp) if f.endswith(".deb")]
        if r.returncode != 0 or len(debs) != 1:
            raise AssertionError("check failed: cpack builds one .deb\n%s%s"
                                 % (r.stdout[-2000:], r.stderr[-2000:]))
        cls.deb_name = debs[0]
        cls.deb = os.path.join(cls.tmp, debs[0])
        cls.arch = run(["dpkg", "--print-architecture"]).stdout.strip()
        cls.root = os.path.join(cls.tmp, "root")
        run(["dpkg-deb", "-x", cls.deb, cls.root])

    def field(self, name):
        return run(["dpkg-deb", "-f", self.deb, name]).stdout.strip()

    def test_file_name(self):
        want = "prefixd_%s_%s.deb" % (ARGS.version, self.arch)
        self.assertEqual(self.deb_name, want, "file name %s" % want)

    def test_metadata(self):
        field = self.field
        self.assertEqual(field("Package"), "prefixd", "Package: prefixd")
        self.assertEqual(field("Version"), ARGS.version, "Version: %s" % ARGS.version)
        self.assertEqual(field("Architecture"), self.arch, "Architecture: %s" % self.arch)
        self.assertIn("@", field("Maintainer"), "Maintainer set")
        self.assertTrue(field("Section") and field("Priority"), "Section and Priority set")
        self.assertGreater(len(field("Description").splitlines()), 1,
                           "a summary and a long description")
        deps = field("Depends")
        for lib in ("libgrpc++", "libprotobuf", "libabsl", "libprometheus-cpp", "libc6"):
            with self.subTest(lib):
                self.assertIn(lib, deps, "Depends names %s (dpkg-shlibdeps)" % lib)

    def test_contents(self):
        lines = run(["dpkg-deb", "-c", self.deb]).stdout.splitlines()
        listed = {l.split()[-1]: l for l in lines}
        for path, mode in FILES.items():
            with self.subTest(path):
                line = listed.get(path)
                self.assertIsNotNone(line, "contains %s" % path[1:])
                self.assertEqual(mode_of(line), mode, "%s mode %o: %s" % (path[1:], mode, line))
                self.assertIn(" root/root ", line, "%s owned by root" % path[1:])
        unexpected = [p for p in listed if not p.endswith("/") and p not in FILES and
                      not p.startswith("./usr/share/doc/prefixd/")]
        self.assertEqual(unexpected, [], "nothing else outside /usr/share/doc/prefixd")

    def test_control(self):
        control = os.path.join(self.tmp, "control")
        run(["dpkg-deb", "-e", self.deb, control])
        with open(os.path.join(control, "conffiles")) as f:
            self.assertEqual(f.read().split(), ["/etc/prefixd/config.textproto"],
                             "conffiles: /etc/prefixd/config.textproto")
        for script in ("postinst", "prerm", "postrm"):
            with self.subTest(script):
                path = os.path.join(control, script)
                self.assertTrue(os.path.exists(path), "maintainer script %s" % script)
                self.assertEqual(os.stat(path).st_mode & 0o777, 0o755, "%s mode 755" % script)
                with open(path) as f:
                    self.assertTrue(f.readline().startswith("#!/bin/sh"),
                                    "%s is a sh script" % script)
                self.assertEqual(run(["sh", "-n", path]).returncode, 0,
                                 "%s parses (sh -n)" % script)
        with open(os.path.join(control, "postinst")) as f:
            text = f.read()
        self.assertIn("systemd-sysusers /usr/lib/sysusers.d/prefixd.conf", text,
                      "postinst creates the prefixd user")
        self.assertIn("deb-systemd-helper enable prefixd.service", text,
                      "postinst enables the service")

    def test_runtime_depends(self):
        """Every library a packaged binary links directly (ELF NEEDED) must
        come from a package that Depends names, so that `apt-get install` of
        the .deb (the Dockerfile's runtime stage does exactly that) brings it."""
        depends = {d.strip().split()[0].split(":")[0]
                   for d in self.field("Depends").replace("|", ",").split(",") if d.strip()}
        libs = {}  # binary -> {soname: resolved path or None}
        for name in ("prefixd", "prefixctl"):
            binary = os.path.join(self.root, "usr", "bin", name)
            needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                                run(["readelf", "-d", binary]).stdout)
            resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", run(["ldd", binary]).stdout,
                                       re.M))
            libs[name] = {soname: resolved.get(soname) for soname in needed}
        # One dpkg-query for every path (each call reads dpkg's whole file list).
        paths = sorted({v for m in libs.values() for p in m.values() if p
                        for v in path_variants(p)})
        owner = {}
        for line in run(["dpkg-query", "-S"] + paths).stdout.splitlines():
            pkgs, _, path = line.partition(": ")
            for pkg in pkgs.split(", "):
                owner.setdefault(path.strip(), pkg.split(":")[0])
        for name, needed in libs.items():
            missing = {}
            for soname, path in needed.items():
                pkg = next((owner[v] for v in path_variants(path) if v in owner),
                           None) if path else None
                if pkg not in depends:
                    missing[soname] = pkg
            with self.subTest(name):
                self.assertTrue(needed and not missing,
                                "Depends covers the %d libraries %s links: not in Depends "
                                "(library: package): %s; Depends: %s"
                                % (len(needed), name, missing, sorted(depends)))
        help_text = run([os.path.join(self.root, "usr", "bin", "prefixd"), "--help"])
        if "index_source" in help_text.stdout + help_text.stderr:
            self.assertIn("libzmq5", depends,
                          "Depends names libzmq5 (the fleet index's ZeroMQ)")
        else:
            print("note  this prefixd has no fleet index: libzmq5 not required")

    def test_doc_images(self):
        """Every image a packaged doc shows (![...](path)) is packaged beside
        it, as in the repository."""
        doc = os.path.join(self.root, "usr", "share", "doc", "prefixd")
        shown = 0
        for name in sorted(os.listdir(doc)):
            if not name.endswith(".md"):
                continue
            source_dir = ARGS.repo if name == "README.md" else os.path.join(ARGS.repo, "docs")
            with open(os.path.join(doc, name)) as f:
                images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", f.read())
            for image in (i for i in images if "://" not in i):
                shown += 1
                packaged = read_bytes(os.path.join(doc, image))
                with self.subTest(doc=name, image=image):
                    self.assertTrue(packaged is not None and
                                    packaged == read_bytes(os.path.join(source_dir, image)),
                                    "%s's image %s is packaged (as in the repository)"
                                    % (name, image))
        self.assertGreaterEqual(shown, 2, "the packaged docs show images")

    def test_same_as_repo(self):
        for packaged, source in SAME_AS_REPO.items():
            with self.subTest(source), open(os.path.join(self.root, packaged), "rb") as a, \
                    open(os.path.join(ARGS.repo, source), "rb") as b:
                self.assertTrue(a.read() == b.read(), "/%s == %s" % (packaged, source))

    def test_packaged_binaries(self):
        r = run([os.path.join(self.root, "usr", "bin", "prefixd"), "--version"])
        self.assertTrue(r.returncode == 0 and ARGS.version in r.stdout,
                        "packaged prefixd --version: %s" % r.stdout)
        r = run([os.path.join(self.root, "usr", "bin", "prefixctl"), "--help"])
        self.assertTrue(r.returncode == 0 and "health" in r.stdout + r.stderr,
                        "packaged prefixctl --help")

    def test_packaged_daemon_serves(self):
        with open(os.path.join(self.root, "etc", "prefixd", "config.textproto")) as f:
            err = common.serve_config(os.path.join(self.root, "usr", "bin", "prefixd"), f.read())
        self.assertIsNone(err, "packaged prefixd serves the packaged config, exits 0 on SIGTERM")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="the CMake build directory")
    ap.add_argument("--version", required=True, help="the project version")
    ap.add_argument("--cpack", default=shutil.which("cpack"))
    ap.add_argument("--repo", default=REPO)
    ARGS, rest = ap.parse_known_args()
    common.unittest_main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
