#!/usr/bin/python3
"""SGLang's newest KV events as its kv_events.py encodes them, over real
sockets to the real daemon (docs/index.md, "SGLang" and "Wire"). The
batch stays array_like, [ts, events, attn_dp_rank] (the rank left out
when None); each event is now a map tagged by "type", the defaulted
fields (medium, cache_salt, session_id) present only when set.
The frames and events are built here from those declarations
(tests/index/upstream.py), not by prefixd's publisher.

Checks, one SGLang source (page size 16) with a replay-less stream:
  - a chain of stores whose hashes are the int64 extremes (INT64_MIN as a
    parent) is found whole by Route;
  - a store with cache_salt lands in the salt's namespace: Route finds it
    with the salt, not without; session_id is read and ignored;
  - a page copied to host memory (medium CPU_PINNED) is held there too;
    a BlockRemoved without a medium removes the device copy only;
  - a batch without attn_dp_rank is applied;
  - AllBlocksCleared leaves the worker LIVE and holding nothing;
  - nothing is dropped, and no error is recorded.

Usage: test_sglang_events.py --prefixd PATH [--stubs DIR]
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
import upstream  # noqa: E402  (tests/index/upstream.py)

BS = 16
DEADLINE_S = 10
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def pages(first, n):
    return upstream.numbered_blocks(first, n, BS)


class SglangEventsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pub = upstream.ZmqEventPublisher(0, form="array")
        config = ('index {\n  block_size: %d\n'
                  '  sources { name: "sglang-0" endpoint: "%s" type: "SGLang" }\n'
                  '}\n' % (BS, cls.pub.endpoint))
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False).start()
        cls.client = prefixd.Client(cls.daemon.tcp)
        if not cls.pub.wait_for_subscriber(DEADLINE_S):
            raise AssertionError("the daemon did not subscribe")

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()
        cls.pub.close()

    def publish(self, events):
        seq = self.pub.publish(events)
        return prefixd_fixture.applied(self.client, self.daemon, {"sglang-0": seq},
                                       DEADLINE_S)["sglang-0"]

    def held(self, tokens, **kw):
        """(matched blocks, {medium: blocks}) of the SGLang worker."""
        for w in self.client.route(tokens, workers=["sglang-0"], **kw).workers:
            return w.matched_blocks, dict(w.mediums)
        return None

    def check_clean(self, w):
        self.assertEqual(w.state, prefixd.WorkerState.LIVE)
        self.assertEqual((w.dropped_blocks, w.last_error), (0, ""))

    def test_1_signed_hash_chain(self):
        w = self.publish([
            upstream.sglang_stored([INT64_MIN], None, pages(0, 1), BS, medium="GPU"),
            upstream.sglang_stored([INT64_MAX, -1], INT64_MIN, pages(1, 2), BS)])
        self.check_clean(w)
        self.assertEqual(self.held(pages(0, 3)), (3, {"GPU": 3}))

    def test_2_salt_and_session(self):
        w = self.publish([upstream.sglang_stored(
            [7, 8], None, pages(10, 2), BS, cache_salt="salt-a", session_id="session-a")])
        self.check_clean(w)
        self.assertEqual(self.held(pages(10, 2), cache_salt="salt-a"), (2, {"GPU": 2}))
        self.assertEqual(self.held(pages(10, 2))[0], 0)

    def test_3_host_copy_and_device_removal(self):
        self.publish([upstream.sglang_stored([21, 22], None, pages(20, 2), BS)])
        w = self.publish([upstream.sglang_stored([21, 22], None, pages(20, 2), BS,
                                                 medium="CPU_PINNED")])
        self.check_clean(w)
        self.assertEqual(self.held(pages(20, 2)), (2, {"GPU": 2, "CPU_PINNED": 2}))
        w = self.publish([upstream.sglang_removed([21, 22])])
        self.check_clean(w)
        self.assertEqual(self.held(pages(20, 2)), (2, {"CPU_PINNED": 2}))

    def test_4_batch_without_rank(self):
        self.pub.rank = None
        try:
            w = self.publish([upstream.sglang_stored([31], None, pages(30, 1), BS)])
        finally:
            self.pub.rank = 0
        self.check_clean(w)
        self.assertEqual(self.held(pages(30, 1)), (1, {"GPU": 1}))

    def test_5_cleared(self):
        w = self.publish([upstream.sglang_cleared()])
        self.assertEqual(w.state, prefixd.WorkerState.LIVE)
        self.assertEqual(w.clears, 1)
        self.assertEqual(w.mediums, {})
        self.assertEqual(self.held(pages(0, 3)), (0, {}))


if __name__ == "__main__":
    if not ARGS.prefixd:
        print("SKIP: --prefixd not given")
        sys.exit(common.SKIP)
    common.unittest_main()
