#!/usr/bin/python3
"""Memory bounds of the real daemon (docs/operations.md, "Memory bounds"):
what one tenant's traffic can make prefixd hold is bounded by limits the
config names, measured as the daemon's RSS (VmRSS in /proc/PID/status).

- event ring: one tenant alternating two Inserts of 65,536 blocks (each
  evicts the other) appends 1 MiB of events per Insert; the ring is bounded
  by event_ring_bytes, not only by its 4096 events.

Usage: memory_bounds_test.py --prefixd PATH [--stubs DIR]
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import load  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd.v1 import prefix_cache_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_cache_pb2_grpc as pb_grpc  # noqa: E402

MIB = 1024


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for pid %d" % pid)


class MemoryBoundsTest(unittest.TestCase):
    def start(self, config):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False)
        self.addCleanup(daemon.close)
        daemon.start()
        return daemon

    def stub(self, daemon):
        ch = load.channel(daemon.tcp)
        self.addCleanup(ch.close)
        return pb_grpc.PrefixCacheStub(ch)

    def test_the_event_ring_is_bounded_by_bytes(self):
        blocks = 65536
        daemon = self.start('block_size: 1\nkv_budget: "%dtokens"\n' % blocks)
        stub = self.stub(daemon)
        prompts = [pb.InsertRequest(tokens=range(base, base + blocks),
                                    block_ids=range(base, base + blocks))
                   for base in (0, 1 << 20)]

        def cycles(n):
            for _ in range(n):
                for p in prompts:  # each evicts the other: 2 events of 65,536 IDs
                    stub.Insert(p, timeout=30)

        cycles(4)  # 16 MiB of events: past the 4 MiB bound already
        before = rss_kib(daemon.proc.pid)
        start = time.monotonic()
        cycles(30)  # 120 MiB more events; a ring bounded by count keeps them
        after = rss_kib(daemon.proc.pid)
        print("event ring: RSS %d -> %d KiB over 60 Inserts of %d blocks (%.1f s)"
              % (before, after, blocks, time.monotonic() - start))
        self.assertLess(after - before, 32 * MIB,
                        "RSS grew %d KiB while one tenant's ring took 1 MiB of "
                        "events per Insert" % (after - before))

if __name__ == "__main__":
    unittest.main()
