#!/usr/bin/python3
"""Soak: churn against the real daemon for a bounded time (inserts over a
small budget, so evictions all along; matches; pinned leases that are
never released and expire on a short TTL; Evict, Invalidate, Reset), while
sampling the daemon's RSS (VmRSS in /proc/PID/status). Fails if RSS at the
end is more than --max_growth (5%) above RSS right after the warm-up, or if
block conservation breaks.

    soak_test.py --prefixd PATH --seconds 45           # ctest (default)
    soak_test.py --prefixd PATH --seconds 1800         # make soak

The warm-up is the first third of the run (at least 5 s): the budget fills,
event rings wrap, gRPC and malloc reach their working sets. The baseline is
the median of the samples in the next tenth of the run and the end value the
median of the last tenth, so a single sample taken mid-burst does not decide.

Usage: soak_test.py --prefixd PATH [--stubs DIR] [--seconds N] [--threads N]
"""

import os
import statistics
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import common  # noqa: E402  (tests/python/common.py)


def extra_args(ap):
    ap.add_argument("--seconds", type=float, default=45)
    ap.add_argument("--threads", type=int, default=6)
    ap.add_argument("--max_growth", type=float, default=0.05)
    ap.add_argument("--interval", type=float, default=0.25, help="RSS sampling period (s)")


ARGS = common.setup(__doc__, extra_args)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import load  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd.v1 import prefix_cache_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_cache_pb2_grpc as pb_grpc  # noqa: E402

BLOCK = 16
BUDGET_BLOCKS = 512
TENANTS = ["s0", "s1", "s2"]
CONFIG = ('kv_budget: "%dMiB"\nblock_size: %d\nlease_ttl: "1s"\nevents_per_tenant: 1024\n'
          % (BUDGET_BLOCKS * 2, BLOCK))


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for pid %d" % pid)


class Sampler(threading.Thread):
    def __init__(self, pid, interval, until):
        super().__init__(daemon=True)
        self.pid, self.interval, self.until = pid, interval, until
        self.samples = []  # (seconds since start, KiB)
        self.stop = threading.Event()

    def run(self):
        start = time.monotonic()
        while not self.stop.is_set() and time.monotonic() < self.until:
            self.samples.append((time.monotonic() - start, rss_kib(self.pid)))
            self.stop.wait(self.interval)


class SoakTest(unittest.TestCase):
    def test_rss_is_flat_under_churn(self):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        d = prefixd_fixture.Daemon(ARGS.prefixd, CONFIG, snapshot=False)
        self.addCleanup(d.close)
        d.start()
        seconds = ARGS.seconds
        sampler = Sampler(d.proc.pid, ARGS.interval, time.monotonic() + seconds)
        sampler.start()
        ledger = load.Ledger()
        # Short leases that are never released: they expire all the time.
        workers = load.run_load(d.tcp, TENANTS, ARGS.threads, seconds, ledger, BLOCK,
                                seed=3, lease_ttl_ms=300, release_leases=False,
                                max_leases=3)
        sampler.stop.set()
        sampler.join()
        for w in workers:
            self.assertIsNone(w.error, "%s: %r" % (w.name, w.error))
        self.assertEqual(ledger.unexpected[:10], [])

        samples = sampler.samples
        warm = max(5.0, seconds / 3)
        window = max(2.0, seconds / 10)
        base = [kib for t, kib in samples if warm <= t < warm + window]
        end = [kib for t, kib in samples if t >= seconds - window]
        self.assertTrue(base and end, "too few samples: %s" % samples)
        base_kib, end_kib = statistics.median(base), statistics.median(end)
        growth = end_kib / base_kib - 1
        with load.channel(d.tcp) as ch:
            stub = pb_grpc.PrefixCacheStub(ch)
            stats = stub.Stats(pb.StatsRequest(all_tenants=True), timeout=10)
            expired = sum(t.lease_expired for t in stats.tenants)
            evicted = sum(e.blocks for t in stats.tenants for e in t.evictions)
            self.assertEqual(ledger.check(load.dump_all(stub, TENANTS)), [])
        print("soak: %.0f s, %d threads: %s; %d leases expired, %d blocks evicted; RSS "
              "start %d KiB, after warm-up %d KiB, end %d KiB, max %d KiB: %+.2f%%"
              % (seconds, ARGS.threads, ledger.summary(), expired, evicted, samples[0][1],
                 base_kib, end_kib, max(k for _, k in samples), 100 * growth))
        self.assertGreater(expired, 0, "no lease expired: the churn misses expiry")
        self.assertGreater(evicted, BUDGET_BLOCKS, "the budget barely turned over")
        self.assertLessEqual(growth, ARGS.max_growth,
                             "RSS grew %.2f%% after warm-up (%d -> %d KiB); samples: %s"
                             % (100 * growth, base_kib, end_kib, samples))
        self.assertEqual(d.stop(), 0, d.logs())


if __name__ == "__main__":
    unittest.main()
