#!/usr/bin/python3
"""Every config the documentation shows loads: `prefixd --check_config`.

Finds the config blocks of README.md and docs/*.md (indented code blocks
whose first line sets a field of prefixd.v1.Config, read from
proto/prefixd/v1/config.proto) and the config files under deploy/, and runs
`prefixd --check_config=FILE` on each: it must exit 0 and print the resolved
settings. A doc's config that does not load fails this test. The Kubernetes
configs are checked as their pods join them (the config, then the Secret's
principals: two --check_config), and every `prefixd --check_config=...`
command the docs and the deploy configs' comments show is run as shown.

Only what a reader must replace anyway is replaced: each "<hex>" by a
distinct SHA-256 (token hashes must be unique), and the TLS file paths by a
certificate and key made here with openssl, since check_config reads them.

Also: --check_config's own contract (exit 1, the field and the value named,
--help documents it), and the security example this test was written for
(two 8 GiB reservations over the default 4 GiB budget).

Usage: docs_config_test.py --prefixd PATH [--repo DIR]
"""

import argparse
import glob
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = None

# The deploy configs the docs point to; Kubernetes concatenates the
# ConfigMap's config and the Secret's principals (docs/deploy.md).
DEPLOY_CONFIGS = [
    ["deploy/config/prefixd.textproto"],
    ["deploy/config/container.textproto"],
    ["deploy/k8s/prefixd.textproto", "deploy/k8s/secrets/principals.textproto"],
    ["deploy/k8s/index/prefixd-index.textproto", "deploy/k8s/index/secrets/principals.textproto"],
]
TLS_FIELDS = {"tls_cert_path": "server.pem", "tls_key_path": "server.key",
              "client_ca_path": "server.pem"}


def config_fields(repo):
    """The top-level field names of prefixd.v1.Config."""
    with open(os.path.join(repo, "proto", "prefixd", "v1", "config.proto")) as f:
        text = f.read()
    body = re.search(r"^message Config \{(.*?)^\}", text, re.S | re.M).group(1)
    return set(re.findall(r"^\s+(?:repeated\s+)?[\w.]+\s+(\w+)\s*=\s*\d+;", body, re.M))


def indented_blocks(text):
    """(first line number, block text) of each indented code block."""
    blocks, current, start, prev_blank = [], [], 0, True
    for n, line in enumerate(text.split("\n"), 1):
        if line.startswith("    ") and (current or prev_blank):
            if not current:
                start = n
            current.append(line[4:])
        elif current and not line.strip():
            current.append("")
        else:
            if current:
                blocks.append((start, "\n".join(current).strip("\n") + "\n"))
            current = []
        prev_blank = not line.strip()
    if current:
        blocks.append((start, "\n".join(current).strip("\n") + "\n"))
    return blocks


def doc_configs(repo):
    """(where, text) of every config block in README.md and docs/*.md."""
    fields = config_fields(repo)
    out = []
    docs = [os.path.join(repo, "README.md")] + sorted(glob.glob(os.path.join(repo, "docs", "*.md")))
    for path in docs:
        with open(path) as f:
            text = f.read()
        for line, block in indented_blocks(text):
            m = re.match(r"([a-z_]+)\s*(\{|:)", block)
            if m and m.group(1) in fields:
                out.append(("%s:%d" % (os.path.relpath(path, repo), line), block))
    return out


CHECK = re.compile(r"prefixd((?:\s+(?:\\\s*)?--check_config=\S+)+)")


def documented_checks(repo):
    """(where, cwd, args) of every `prefixd --check_config=FILE ...` that the
    docs (paths from the repository's root) and the deploy configs' comments
    (paths from the file's directory) show on files of the repository."""
    sources = [(p, repo) for p in [os.path.join(repo, "README.md")] +
               sorted(glob.glob(os.path.join(repo, "docs", "*.md")))]
    sources += [(p, os.path.dirname(p)) for p in
                sorted(glob.glob(os.path.join(repo, "deploy", "**", "*.textproto"),
                                 recursive=True))]
    out = []
    for path, cwd in sources:
        with open(path) as f:
            text = f.read()
        if path.endswith(".textproto"):  # comments: "#   prefixd ... \" lines
            text = re.sub(r"(?m)^#\s?", "", text)
        for m in CHECK.finditer(text):
            args = re.findall(r"--check_config=\S+", m.group(1))
            if all(os.path.exists(os.path.join(cwd, a.split("=", 1)[1])) for a in args):
                line = text.count("\n", 0, m.start()) + 1
                out.append(("%s:%d" % (os.path.relpath(path, repo), line), cwd, args))
    return out


def make_tls(tmp):
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", os.path.join(tmp, "server.key"), "-out",
         os.path.join(tmp, "server.pem"), "-subj", "/CN=prefixd", "-days", "2"],
        check=True, capture_output=True)


def fill_placeholders(text, tmp):
    counter = iter(range(1 << 30))
    text = re.sub(r"<hex>", lambda _: hashlib.sha256(b"%d" % next(counter)).hexdigest(), text)
    return re.sub(r'\b(%s)(\s*:\s*)"[^"]*"' % "|".join(TLS_FIELDS),
                  lambda m: '%s%s"%s"' % (m.group(1), m.group(2),
                                          os.path.join(tmp, TLS_FIELDS[m.group(1)])), text)


def check_config(text, tmp, name="config.textproto"):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return subprocess.run([ARGS.prefixd, "--check_config=" + path],
                          capture_output=True, text=True, timeout=30)


class DocsConfigTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmpdir = tempfile.TemporaryDirectory(prefix="prefixd-docs-config-")
        cls.tmp = cls.tmpdir.name
        make_tls(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.tmpdir.cleanup()

    def test_every_doc_config_loads(self):
        configs = doc_configs(ARGS.repo)
        # The blocks known when this test was written: a broken extractor
        # must not pass by finding nothing.
        self.assertGreaterEqual(len(configs), 6, [w for w, _ in configs])
        for where, block in configs:
            with self.subTest(where=where):
                r = check_config(fill_placeholders(block, self.tmp), self.tmp)
                self.assertEqual(r.returncode, 0, "%s does not load:\n%s%s" % (where, block, r.stderr))
                self.assertIn(": OK; the resolved settings follow", r.stdout)
                self.assertIn("# budget ", r.stdout)

    def test_deploy_configs_load(self):
        # Several --check_config join the files as the pod's init container
        # does (cat), so each pair is checked as it is deployed.
        for files in DEPLOY_CONFIGS:
            with self.subTest(files=files):
                r = subprocess.run([ARGS.prefixd] + ["--check_config=" + f for f in files],
                                   cwd=ARGS.repo, capture_output=True, text=True, timeout=30)
                self.assertEqual(r.returncode, 0, "%s: %s" % (files, r.stderr))
                self.assertIn("# %s: OK" % " + ".join(files), r.stdout)

    def test_documented_check_commands_pass(self):
        commands = documented_checks(ARGS.repo)
        for must in ("deploy/k8s/prefixd.textproto", "deploy/k8s/index/prefixd-index.textproto"):
            self.assertTrue(any(must in " ".join(args) for _, _, args in commands),
                            "no documented --check_config of %s" % must)
        for where, cwd, args in commands:
            with self.subTest(where=where):
                r = subprocess.run([ARGS.prefixd] + args, cwd=cwd, capture_output=True,
                                   text=True, timeout=30)
                self.assertEqual(r.returncode, 0, "%s: prefixd %s\n%s" % (where, " ".join(args),
                                                                         r.stderr))

    def test_over_budget_reservations_fail_naming_fields(self):
        # docs/security.md's example before it set kv_budget.
        r = check_config('tenants { name: "acme" reserved: "8GiB" limit: "8GiB" }\n'
                         'tenants { name: "globex" reserved: "8GiB" limit: "8GiB" }\n', self.tmp)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertEqual(r.stdout, "")
        self.assertIn('kv_budget "4GiB"', r.stderr)
        self.assertIn("17179869184 bytes, above the budget of 4294967296 bytes", r.stderr)
        self.assertEqual(len(r.stderr.strip().split("\n")), 1, r.stderr)

    def test_start_names_the_same_fields(self):
        # Starting on that config fails before binding, with the same words.
        path = os.path.join(self.tmp, "over.textproto")
        with open(path, "w") as f:
            f.write('kv_budget: "1GiB"\ntenants { name: "acme" reserved: "768MiB" }\n'
                    'tenants { name: "globex" reserved: "768MiB" }\n')
        r = subprocess.run([ARGS.prefixd, "--config=" + path, "--listen=127.0.0.1:0",
                            "--metrics_listen=127.0.0.1:0"],
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('cannot start: kv_budget "1GiB" / tenants: tenant reservations total '
                      '1610612736 bytes, above the budget of 1073741824 bytes', r.stderr)

    def test_bad_value_names_field_and_value(self):
        r = check_config('kv_budget: "4 parsecs"\n', self.tmp)
        self.assertEqual(r.returncode, 1)
        self.assertIn("kv_budget", r.stderr)
        self.assertIn("4 parsecs", r.stderr)

    def test_missing_tls_file_names_field(self):
        r = check_config('auth { mode: TOKEN tls_cert_path: "%s/none.pem" tls_key_path: "%s" }\n'
                         'principals { name: "ops" role: ADMIN token_sha256: "%s" }\n'
                         % (self.tmp, os.path.join(self.tmp, "server.key"), "ab" * 32), self.tmp)
        self.assertEqual(r.returncode, 1)
        self.assertIn("tls_cert_path", r.stderr)
        self.assertIn("none.pem", r.stderr)

    def test_resolved_settings_are_a_config(self):
        r = check_config('kv_budget: "1GiB"\nblock_size: 32\n', self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('kv_budget: "1GiB"', r.stdout)
        self.assertIn("lease_ttl: ", r.stdout)  # a default, filled in
        self.assertIn("# budget       1,073,741,824 bytes (1 GiB) = 256 blocks", r.stdout)
        again = check_config(r.stdout, self.tmp, "resolved.textproto")
        self.assertEqual(again.returncode, 0, again.stderr)

    def test_flags_apply_over_the_file(self):
        r = subprocess.run([ARGS.prefixd, "--check_config=" + os.path.join(
            ARGS.repo, "deploy/config/prefixd.textproto"), "--kv_budget=2GiB"],
            capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('kv_budget: "2GiB"', r.stdout)

    def test_the_same_files_only(self):
        r = subprocess.run([ARGS.prefixd, "--config=a.textproto", "--check_config=b.textproto"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--check_config=b.textproto with --config=a.textproto", r.stderr)

    def test_missing_file_and_help(self):
        r = subprocess.run([ARGS.prefixd, "--check_config=/nonexistent/prefixd.textproto"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("/nonexistent/prefixd.textproto", r.stderr)
        h = subprocess.run([ARGS.prefixd, "--help"], capture_output=True, text=True, timeout=30)
        self.assertIn("--check_config=FILE", h.stdout)


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prefixd", required=True)
    ap.add_argument("--repo", default=REPO)
    ARGS, rest = ap.parse_known_args()
    ARGS.prefixd = os.path.abspath(ARGS.prefixd)  # some checks run elsewhere
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
