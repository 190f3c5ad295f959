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
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import common  # noqa: E402  (tests/python/common.py)

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="the CMake build directory")
    ap.add_argument("--version", required=True, help="the project version")
    ap.add_argument("--cpack", default=shutil.which("cpack"))
    ap.add_argument("--repo", default=REPO)
    args = ap.parse_args()
    if shutil.which("dpkg-deb") is None or not args.cpack:
        print("SKIP: dpkg-deb or cpack not found")
        return SKIP
    config = os.path.abspath(os.path.join(args.build, "CPackConfig.cmake"))
    t = common.Checker()
    if not t.check(os.path.exists(config), "%s exists (configure ran)" % config):
        return 1
    with tempfile.TemporaryDirectory(prefix="prefixd-pkg-") as tmp:
        r = run([args.cpack, "--config", config, "-B", tmp], cwd=args.build)
        debs = [f for f in os.listdir(tmp) if f.endswith(".deb")]
        if not t.check(r.returncode == 0 and len(debs) == 1, "cpack builds one .deb",
                       r.stdout[-2000:] + r.stderr[-2000:]):
            return 1
        deb = os.path.join(tmp, debs[0])
        arch = run(["dpkg", "--print-architecture"]).stdout.strip()
        t.check(debs[0] == "prefixd_%s_%s.deb" % (args.version, arch),
                "file name prefixd_%s_%s.deb" % (args.version, arch), debs[0])
        check_metadata(t, deb, args.version, arch)
        check_contents(t, deb)
        check_control(t, deb, tmp)
        root = os.path.join(tmp, "root")
        run(["dpkg-deb", "-x", deb, root])
        check_files(t, root, args.repo, args.version)
        check_runtime_depends(t, deb, root)
    return t.exit_code()


def check_metadata(t, deb, version, arch):
    def field(name):
        return run(["dpkg-deb", "-f", deb, name]).stdout.strip()
    t.check(field("Package") == "prefixd", "Package: prefixd")
    t.check(field("Version") == version, "Version: %s" % version, field("Version"))
    t.check(field("Architecture") == arch, "Architecture: %s" % arch)
    t.check("@" in field("Maintainer"), "Maintainer set", field("Maintainer"))
    t.check(field("Section") and field("Priority"), "Section and Priority set")
    t.check(len(field("Description").splitlines()) > 1, "a summary and a long description")
    deps = field("Depends")
    for lib in ("libgrpc++", "libprotobuf", "libabsl", "libprometheus-cpp", "libc6"):
        t.check(lib in deps, "Depends names %s (dpkg-shlibdeps)" % lib, deps)


def check_contents(t, deb):
    lines = run(["dpkg-deb", "-c", deb]).stdout.splitlines()
    listed = {l.split()[-1]: l for l in lines}
    for path, mode in FILES.items():
        line = listed.get(path)
        if t.check(line is not None, "contains %s" % path[1:]):
            t.check(mode_of(line) == mode, "%s mode %o" % (path[1:], mode), line)
            t.check(" root/root " in line, "%s owned by root" % path[1:], line)
    unexpected = [p for p in listed if not p.endswith("/") and p not in FILES and
                  not p.startswith("./usr/share/doc/prefixd/")]
    t.check(not unexpected, "nothing else outside /usr/share/doc/prefixd", unexpected)


def check_control(t, deb, tmp):
    control = os.path.join(tmp, "control")
    run(["dpkg-deb", "-e", deb, control])
    with open(os.path.join(control, "conffiles")) as f:
        t.check(f.read().split() == ["/etc/prefixd/config.textproto"],
                "conffiles: /etc/prefixd/config.textproto")
    for script in ("postinst", "prerm", "postrm"):
        path = os.path.join(control, script)
        if t.check(os.path.exists(path), "maintainer script %s" % script):
            t.check(os.stat(path).st_mode & 0o777 == 0o755, "%s mode 755" % script)
            with open(path) as f:
                t.check(f.readline().startswith("#!/bin/sh"), "%s is a sh script" % script)
            t.check(run(["sh", "-n", path]).returncode == 0, "%s parses (sh -n)" % script)
    with open(os.path.join(control, "postinst")) as f:
        text = f.read()
    t.check("systemd-sysusers /usr/lib/sysusers.d/prefixd.conf" in text,
            "postinst creates the prefixd user")
    t.check("deb-systemd-helper enable prefixd.service" in text, "postinst enables the service")


def path_variants(path):
    """`path` and its real path, each also with /usr added or taken away:
    with merged /usr, dpkg may know a library under /lib or /usr/lib."""
    out = []
    for p in (path, os.path.realpath(path)):
        out += [p, p[len("/usr"):] if p.startswith("/usr/") else "/usr" + p]
    return out


def check_runtime_depends(t, deb, root):
    """Every library a packaged binary links directly (ELF NEEDED) must come
    from a package that Depends names, so that `apt-get install` of the .deb
    (the Dockerfile's runtime stage does exactly that) brings it."""
    depends = {d.strip().split()[0].split(":")[0]
               for d in run(["dpkg-deb", "-f", deb, "Depends"]).stdout.replace("|", ",")
               .split(",") if d.strip()}
    libs = {}  # binary -> {soname: resolved path or None}
    for name in ("prefixd", "prefixctl"):
        binary = os.path.join(root, "usr", "bin", name)
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                            run(["readelf", "-d", binary]).stdout)
        resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", run(["ldd", binary]).stdout, re.M))
        libs[name] = {soname: resolved.get(soname) for soname in needed}
    # One dpkg-query for every path (each call reads dpkg's whole file list).
    paths = sorted({v for m in libs.values() for p in m.values() if p for v in path_variants(p)})
    owner = {}
    for line in run(["dpkg-query", "-S"] + paths).stdout.splitlines():
        pkgs, _, path = line.partition(": ")
        for pkg in pkgs.split(", "):
            owner.setdefault(path.strip(), pkg.split(":")[0])
    for name, needed in libs.items():
        missing = {}
        for soname, path in needed.items():
            pkg = next((owner[v] for v in path_variants(path) if v in owner), None) if path else None
            if pkg not in depends:
                missing[soname] = pkg
        t.check(needed and not missing,
                "Depends covers the %d libraries %s links" % (len(needed), name),
                "not in Depends (library: package): %s; Depends: %s"
                % (missing, sorted(depends)))
    help_text = run([os.path.join(root, "usr", "bin", "prefixd"), "--help"])
    if "index_source" in help_text.stdout + help_text.stderr:
        t.check("libzmq5" in depends, "Depends names libzmq5 (the fleet index's ZeroMQ)",
                sorted(depends))
    else:
        print("note  this prefixd has no fleet index: libzmq5 not required")


def read_bytes(path):
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def check_doc_images(t, root, repo):
    """Every image a packaged doc shows (![...](path)) is packaged beside it,
    as in the repository."""
    doc = os.path.join(root, "usr", "share", "doc", "prefixd")
    shown = 0
    for name in sorted(os.listdir(doc)):
        if not name.endswith(".md"):
            continue
        source_dir = repo if name == "README.md" else os.path.join(repo, "docs")
        with open(os.path.join(doc, name)) as f:
            images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", f.read())
        for image in (i for i in images if "://" not in i):
            shown += 1
            packaged = read_bytes(os.path.join(doc, image))
            t.check(packaged is not None and
                    packaged == read_bytes(os.path.join(source_dir, image)),
                    "%s's image %s is packaged (as in the repository)" % (name, image))
    t.check(shown >= 2, "the packaged docs show images", shown)


def check_files(t, root, repo, version):
    check_doc_images(t, root, repo)
    for packaged, source in SAME_AS_REPO.items():
        with open(os.path.join(root, packaged), "rb") as a, \
                open(os.path.join(repo, source), "rb") as b:
            t.check(a.read() == b.read(), "/%s == %s" % (packaged, source))
    prefixd = os.path.join(root, "usr", "bin", "prefixd")
    r = run([prefixd, "--version"])
    t.check(r.returncode == 0 and version in r.stdout, "packaged prefixd --version", r.stdout)
    r = run([os.path.join(root, "usr", "bin", "prefixctl"), "--help"])
    t.check(r.returncode == 0 and "health" in r.stdout + r.stderr, "packaged prefixctl --help")
    with open(os.path.join(root, "etc", "prefixd", "config.textproto")) as f:
        err = common.serve_config(prefixd, f.read())
    t.check(err is None, "packaged prefixd serves the packaged config, exits 0 on SIGTERM", err)


if __name__ == "__main__":
    sys.exit(main())
