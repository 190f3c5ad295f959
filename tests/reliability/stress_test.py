#!/usr/bin/python3
"""Stress: 8 client threads over 4 tenants doing mixed operations against the
real daemon over gRPC for a bounded time; afterwards block conservation
holds (every ID the clients handed in is cached, by Dump, or was handed back
exactly once, as the clients counted), the only errors are expected ones,
Stats agree with the Dumps, and no block stays pinned.

Usage: stress_test.py --prefixd PATH [--stubs DIR] [--seconds N] [--threads N]
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import common  # noqa: E402  (tests/python/common.py)


def extra_args(ap):
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--threads", type=int, default=8)


ARGS = common.setup(__doc__, extra_args)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import load  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd.v1 import prefix_cache_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_cache_pb2_grpc as pb_grpc  # noqa: E402

BLOCK = 16
BUDGET_BLOCKS = 1024  # 2 MiB blocks (llama-3-8b fp16 x 16 tokens)
TENANTS = ["t0", "t1", "t2", "t3"]
CONFIG = ('kv_budget: "%dMiB"\nblock_size: %d\ndrain_timeout: "5s"\n'
          % (BUDGET_BLOCKS * 2, BLOCK))


class StressTest(unittest.TestCase):
    def test_mixed_load_conserves_every_block(self):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        d = prefixd_fixture.Daemon(ARGS.prefixd, CONFIG, snapshot=False)
        self.addCleanup(d.close)
        d.start()
        ledger = load.Ledger()
        workers = load.run_load(d.tcp, TENANTS, ARGS.threads, ARGS.seconds, ledger, BLOCK)
        for w in workers:
            self.assertFalse(w.is_alive(), "%s did not finish" % w.name)
            self.assertIsNone(w.error, "%s: %r" % (w.name, w.error))
        print("stress: %d threads, %.0f s: %s" % (ARGS.threads, ARGS.seconds, ledger.summary()))
        self.assertEqual(ledger.unexpected[:10], [], "unexpected status codes")
        self.assertGreater(ledger.ok_calls(), 1000, "too little load to mean anything")

        with load.channel(d.tcp) as ch:
            stub = pb_grpc.PrefixCacheStub(ch)
            cached = load.dump_all(stub, TENANTS)
            self.assertEqual(ledger.check(cached), [])
            stats = stub.Stats(pb.StatsRequest(all_tenants=True),
                               metadata=load.metadata("t0"), timeout=10)
            by_tenant = {t.tenant: t for t in stats.tenants}
            self.assertEqual(sorted(by_tenant), TENANTS)
            self.assertEqual(sum(t.cached_blocks for t in stats.tenants), len(cached))
            self.assertLessEqual(len(cached), BUDGET_BLOCKS)
            for t in stats.tenants:
                self.assertEqual(t.pinned_blocks, 0, t.tenant)
                self.assertEqual(t.active_leases, 0, t.tenant)
            evicted = sum(e.blocks for t in stats.tenants for e in t.evictions
                          if e.reason == "budget")
            self.assertGreater(evicted, 0, "the budget never filled: the load is too light")
        self.assertEqual(d.stop(), 0, d.logs())


if __name__ == "__main__":
    unittest.main()
