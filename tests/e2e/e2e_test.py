#!/usr/bin/python3
"""End-to-end: the real prefixd binary driven by the real prefixctl.

Starts prefixd on a free TCP port and a Unix socket in a temporary directory,
runs prefixctl against both (health, info, insert, match, stats, watch, dump,
lease commands, errors and exit codes, tenant isolation), then sends SIGTERM
while a `health --watch` stream and a `watch` stream are open, and expects
health to report NOT_SERVING during the drain and prefixd to exit 0.

Usage: e2e_test.py --prefixd PATH --prefixctl PATH
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
from common import Checker  # noqa: E402  (tests/python/common.py)

# How long prefixd may take to start serving and to drain.
START_TIMEOUT_S = 30
DRAIN_TIMEOUT = "3s"
STOP_TIMEOUT_S = 20


class E2E(Checker):
    def __init__(self, prefixd, prefixctl, tmp):
        super().__init__()
        self.prefixd = prefixd
        self.prefixctl = prefixctl
        self.tmp = tmp
        self.tcp = "127.0.0.1:%d" % free_port()
        self.unix = "unix://" + os.path.join(tmp, "prefixd.sock")
        self.proc = None

    # ---- helpers ----

    def ctl(self, *args, addr=None, tenant=None, timeout=30):
        """Runs prefixctl; returns (exit code, stdout, stderr)."""
        cmd = [self.prefixctl, "--addr", addr or self.tcp]
        if tenant:
            cmd += ["--tenant", tenant]
        cmd += list(args)
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
        return r.returncode, r.stdout, r.stderr

    def ctl_json(self, *args, addr=None, tenant=None):
        rc, out, err = self.ctl("--json", *args, addr=addr, tenant=tenant)
        if rc != 0:
            self.check(False, "prefixctl %s" % " ".join(args), "exit %d: %s" % (rc, err))
            return {}
        return json.loads(out)

    # ---- the daemon ----

    def start(self):
        config = os.path.join(self.tmp, "prefixd.textproto")
        with open(config, "w") as f:
            f.write('drain_timeout: "%s"\n' % DRAIN_TIMEOUT)
        self.stdout = open(os.path.join(self.tmp, "prefixd.out"), "w+")
        self.stderr = open(os.path.join(self.tmp, "prefixd.err"), "w+")
        self.proc = subprocess.Popen(
            [self.prefixd, "--config", config, "--listen", self.tcp, "--listen", self.unix,
             "--metrics_listen", "127.0.0.1:%d" % free_port(),
             "--snapshot_path", os.path.join(self.tmp, "snapshot.bin"),
             "--eviction_policy", "Lru"],
            stdin=subprocess.DEVNULL, stdout=self.stdout, stderr=self.stderr)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            rc, out, _ = self.ctl("health", timeout=10)
            if rc == 0 and out.strip() == "SERVING":
                return True
            time.sleep(0.1)
        self.check(False, "prefixd serves within %ds" % START_TIMEOUT_S, self.logs())
        return False

    def logs(self):
        text = ""
        for f in (self.stdout, self.stderr):
            f.flush()
            f.seek(0)
            text += f.read()
        return text

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    # ---- scenarios ----

    def test_health_and_info(self):
        for addr in (self.tcp, self.unix):
            rc, out, err = self.ctl("health", addr=addr)
            self.check(rc == 0 and out == "SERVING\n", "health SERVING over %s" % addr,
                       "exit %d out %r err %r" % (rc, out, err))
            rc, out, _ = self.ctl("--json", "health", addr=addr)
            self.check(rc == 0 and json.loads(out) == {"status": "SERVING"},
                       "health --json over %s" % addr, out)
        info = self.ctl_json("info", addr=self.unix)
        self.check(info.get("block_size") == 16, "info: block_size 16", str(info))
        epoch = info.get("epoch", "")
        self.check(re.fullmatch("[0-9a-f]{16}", epoch) is not None and int(epoch, 16) != 0,
                   "info: non-zero epoch, 16 hex digits as in the tables", str(info))
        self.epoch = info.get("epoch")
        rc, out, _ = self.ctl("info")
        self.check(rc == 0 and "block_size" in out and "budget" in out, "info table", out)

    def test_insert_and_match(self):
        # The README's session, verbatim.
        rc, out, err = self.ctl("insert", "--tokens", "1-32", "--block_ids", "100,101")
        self.check(rc == 0 and "inserted 32 tokens: 0 already cached, 2 of 2 blocks new" in out,
                   "insert 2 blocks over TCP", "exit %d out %r err %r" % (rc, out, err))
        ins = self.ctl_json("insert", "--tokens", "1-48", "--block_ids", "100,101,102",
                            addr=self.unix)
        self.check(ins.get("cached_tokens") == "32", "insert over Unix: 32 tokens cached", str(ins))
        self.check(ins.get("redundant_block_ids") == [] and ins.get("evicted_block_ids") == [],
                   "insert: nothing redundant or evicted", str(ins))
        self.check(ins.get("epoch") == self.epoch, "insert: same epoch as info", str(ins))

        m = self.ctl_json("match", "--tokens", "1-40", addr=self.unix)
        ids = [i for s in m.get("segments", []) for i in s["block_ids"]]
        self.check(m.get("matched_tokens") == "32" and ids == ["100", "101"],
                   "match 40 tokens: 32 matched, blocks 100,101", str(m))
        self.check(m.get("lease_id") == "0", "match without --pin: no lease", str(m))
        rc, out, _ = self.ctl("match", "--tokens", "1-48")
        self.check(rc == 0 and "matched 48 of 48 tokens (3 blocks, 1 segment)" in out
                   and "100-102" in out, "match table", out)

        tokens_file = os.path.join(self.tmp, "tokens.txt")
        with open(tokens_file, "w") as f:
            f.write(" ".join(str(t) for t in range(1, 17)) + "\n99\n")
        m = self.ctl_json("match", "--tokens_file", tokens_file)
        self.check(m.get("matched_tokens") == "16", "match --tokens_file", str(m))

        # The same prompt at another position: rope.shift DENY (the default)
        # matches nothing, and says why rather than looking like a miss.
        rc, out, _ = self.ctl("match", "--tokens", "1-48", "--position", "16")
        self.check(rc == 0 and "matched 0 of 48 tokens" in out and
                   "stopped at position 16: the next block is cached at position 0; "
                   "rope.shift is DENY" in out, "match at another position says why", out)
        m = self.ctl_json("match", "--tokens", "1-48", "--position", "16")
        self.check(m.get("rope_denied") == {"requested_position": "16", "cached_position": "0"},
                   "match --json: rope_denied", str(m))

    def test_leases(self):
        m = self.ctl_json("match", "--tokens", "1-32", "--pin", "--lease_ttl", "60s")
        lease = m.get("lease_id", "0")
        self.check(lease != "0", "match --pin returns a lease", str(m))
        stats = self.ctl_json("stats")
        tenant = tenant_stats(stats, "default")
        self.check(tenant.get("pinned_blocks") == "2" and tenant.get("active_leases") == "1",
                   "stats: 2 pinned blocks, 1 lease (the lease outlived prefixctl)", str(tenant))
        rc, out, err = self.ctl("keepalive", "--lease", lease)
        self.check(rc == 0 and lease in out, "keepalive", out + err)
        rc, out, err = self.ctl("release", "--lease", lease, addr=self.unix)
        self.check(rc == 0 and out == "released lease %s\n" % lease, "release", out + err)
        rc, out, err = self.ctl("release", "--lease", lease)
        self.check(rc == 1 and err.startswith("error: NOT_FOUND: "),
                   "release again: exit 1, NOT_FOUND", "exit %d err %r" % (rc, err))

    def test_stats(self):
        stats = self.ctl_json("stats")
        t = tenant_stats(stats, "default")
        self.check(t.get("cached_blocks") == "3", "stats: 3 cached blocks", str(t))
        self.check(int(t.get("cached_bytes", "0")) == 3 * int(stats.get("block_bytes", "0")),
                   "stats: cached bytes = 3 blocks", str(stats))
        self.check(int(t.get("match_requests", "0")) >= 3, "stats: match requests counted", str(t))
        rc, out, _ = self.ctl("stats", addr=self.unix)
        self.check(rc == 0 and "HIT_RATE" in out and "default" in out and "%" in out
                   and "requested" in out, "stats table: hit rate and evictions", out)

    def test_watch_and_dump(self):
        rc, out, err = self.ctl("--json", "watch", "--count", "2")
        lines = [json.loads(l) for l in out.splitlines() if l.strip()]
        self.check(rc == 0 and len(lines) == 2, "watch --count 2: two events", out + err)
        if len(lines) == 2:
            first, second = lines
            self.check(first.get("block_stored", {}).get("block_ids") == ["100", "101"],
                       "watch: first event stores 100,101", str(first))
            stored = second.get("block_stored", {})
            self.check(stored.get("block_ids") == ["102"] and stored.get("parent_block_id") == "101",
                       "watch: second stores 102 under 101", str(second))
        rc, out, _ = self.ctl("watch", "--from", "2", "--count", "1", addr=self.unix)
        self.check(rc == 0 and out.startswith("#2 stored"), "watch --from over Unix", out)
        dump = self.ctl_json("dump")
        blocks = [i for n in dump.get("nodes", []) for i in n["block_ids"]]
        self.check(sorted(blocks) == ["100", "101", "102"], "dump: every cached block", str(dump))
        rc, out, _ = self.ctl("dump", addr=self.unix)
        self.check(rc == 0 and "- [0," in out and "blocks=10" in out and "pins=0" in out,
                   "dump tree", out)

    def test_tenants_evict_invalidate(self):
        m = self.ctl_json("match", "--tokens", "1-32", tenant="other")
        self.check(m.get("matched_tokens") == "0", "another tenant sees nothing", str(m))
        rc, out, err = self.ctl("insert", "--tokens", "1-48", "--block_ids", "200-202",
                                tenant="other")
        self.check(rc == 0, "insert for tenant other", out + err)
        # Touch default's blocks: other's tail 202 is then the least recently
        # used evictable block whether Evict is scoped to the call's tenant or
        # to every tenant the (auth-off) principal may act for.
        self.ctl_json("match", "--tokens", "1-48")
        ev = self.ctl_json("evict", "--blocks", "1", tenant="other")
        self.check(ev.get("evicted_block_ids") == ["202"], "evict 1: the LRU tail 202", str(ev))
        inv = self.ctl_json("invalidate", "--block_ids", "200", tenant="other")
        self.check(sorted(inv.get("removed_block_ids", [])) == ["200", "201"],
                   "invalidate 200: removes 200 and 201 below it", str(inv))
        t = tenant_stats(self.ctl_json("stats"), "default")
        self.check(t.get("cached_blocks") == "3", "tenant default untouched", str(t))

    def test_errors(self):
        rc, _, err = self.ctl("insert", "--tokens", "1-20", "--block_ids", "300")
        self.check(rc == 1 and "INVALID_ARGUMENT" in err, "partial block: exit 1 INVALID_ARGUMENT",
                   err)
        rc, _, err = self.ctl("insert", "--tokens", "1-16", "--block_ids", "x")
        self.check(rc == 2, "bad list: exit 2", err)
        rc, _, err = self.ctl("frobnicate")
        self.check(rc == 2, "unknown command: exit 2", err)
        rc, out, _ = self.ctl("--help")
        self.check(rc == 0 and all(c in out for c in (
            "health", "info", "stats", "match", "insert", "release", "keepalive", "evict",
            "invalidate", "reset", "watch", "dump")), "prefixctl --help lists commands", out)

    def test_eviction_and_retention(self):
        info = self.ctl_json("info")
        self.check(info.get("eviction_policy") == "LRU", "info: eviction_policy LRU", str(info))
        rc, out, _ = self.ctl("info")
        self.check(rc == 0 and re.search(r"eviction_policy +LRU", out) is not None,
                   "info table: eviction_policy LRU", out)
        self.check(re.search(r"eviction +LRU", self.logs()) is not None,
                   "start-up banner names the policy", self.logs())
        t = "retention"
        rc, _, err = self.ctl("insert", "--tokens", "1-16", "--block_ids", "400",
                              "--priority", "4294967295", tenant=t)
        self.check(rc == 1 and "INVALID_ARGUMENT" in err and
                   "retention.priority 4294967295" in err,
                   "insert --priority 4294967295: the daemon names the value", err)
        rc, _, err = self.ctl("insert", "--tokens", "1-16", "--block_ids", "400",
                              "--priority", "4294967296", tenant=t)
        self.check(rc == 2 and "--priority=4294967296" in err,
                   "insert --priority past uint32: usage error naming it", err)
        stats = self.ctl_json("stats", tenant=t)
        self.check(stats.get("tenants", []) == [], "refused inserts change nothing", str(stats))
        rc, out, err = self.ctl("insert", "--tokens", "1-32", "--block_ids", "400,401",
                                "--priority", "90", "--retention_ms", "600000", tenant=t)
        self.check(rc == 0 and "2 of 2 blocks new" in out,
                   "insert --priority 90 --retention_ms 600000", out + err)
        rc, out, _ = self.ctl("insert", "--help")
        self.check(rc == 0 and "--priority=N" in out and "--retention_ms=MS" in out,
                   "insert --help lists --priority and --retention_ms", out)
        help_text = subprocess.run([self.prefixd, "--help"], capture_output=True,
                                   text=True).stdout
        self.check("--eviction_policy=lru|adaptive|shadow" in help_text,
                   "prefixd --help lists --eviction_policy", help_text)
        r = subprocess.run([self.prefixd, "--eviction_policy=lfu"], capture_output=True,
                           text=True, timeout=30)
        self.check(r.returncode != 0 and "--eviction_policy=lfu" in r.stderr and
                   "lru, adaptive or shadow" in r.stderr,
                   "prefixd --eviction_policy=lfu: refused, naming the value and the choices",
                   "exit %d: %s" % (r.returncode, r.stderr))

    def test_plan(self):
        rc, out, err = self.ctl("--json", "plan", "--model", "llama-3-8b", "--gpus", "1xH100-80GB",
                                "--weights", "16GB")
        plan = json.loads(out) if rc == 0 else {}
        self.check(plan.get("bytes_per_token") == 131072 and
                   plan.get("kv_budget_bytes") == 64000000000,
                   "plan: Llama-3-8B fp16 on one H100", out + err)

    def test_drain(self):
        """SIGTERM: health NOT_SERVING while draining, open streams end, exit 0."""
        health = subprocess.Popen(
            [self.prefixctl, "--addr", self.unix, "health", "--watch", "--count", "2"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        events = subprocess.Popen(
            [self.prefixctl, "--addr", self.tcp, "watch"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = health.stdout.readline()
        self.check(first == "SERVING\n", "health --watch: SERVING before SIGTERM", first)
        first_event = events.stdout.readline()  # the stream is open at the daemon
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = health.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            health.kill()
            out, err = health.communicate()
        self.check("NOT_SERVING" in out, "health --watch: NOT_SERVING during the drain",
                   "out %r err %r" % (out, err))
        try:
            code = self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        self.check(code == 0, "prefixd exits 0 after SIGTERM", "exit %r\n%s" % (code, self.logs()))
        try:
            out, err = events.communicate(timeout=STOP_TIMEOUT_S)
            self.check(first_event.startswith("#1 stored") and events.returncode in (0, 1),
                       "open watch stream ended by the drain",
                       "exit %r out %r err %r" % (events.returncode, first_event + out, err))
        except subprocess.TimeoutExpired:
            events.kill()
            events.communicate()
            self.check(False, "open watch stream ended by the drain")
        rc, _, err = self.ctl("health", timeout=10)
        self.check(rc == 1 and "UNAVAILABLE" in err, "after exit: health UNAVAILABLE, exit 1", err)
        self.check(self.epoch is not None and self.epoch_hex() in self.logs(),
                   "startup banner names the epoch", self.logs())

    def epoch_hex(self):
        return self.epoch  # --json prints it in hex, as the log does


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tenant_stats(stats, name):
    for t in stats.get("tenants", []):
        if t.get("tenant") == name:
            return t
    return {}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefixd", required=True)
    parser.add_argument("--prefixctl", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prefixd-e2e-") as tmp:
        t = E2E(os.path.abspath(args.prefixd), os.path.abspath(args.prefixctl), tmp)
        t.epoch = None
        try:
            if t.start():
                for step in (t.test_health_and_info, t.test_insert_and_match, t.test_leases,
                             t.test_stats, t.test_watch_and_dump, t.test_tenants_evict_invalidate,
                             t.test_errors, t.test_eviction_and_retention, t.test_plan,
                             t.test_drain):
                    print("--- %s" % step.__name__)
                    step()
        except Exception as e:  # a crash of the test itself is a failure, with the daemon's log
            t.check(False, "no exception", "%r\n%s" % (e, t.logs() if t.proc else ""))
        finally:
            t.kill()
        print("%d passed, %d failed" % (t.passed, t.failed))
        return 0 if t.failed == 0 and t.passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
