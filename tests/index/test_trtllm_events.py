#!/usr/bin/python3
"""TensorRT-LLM's streaming KV events as its publisher sends them, over
real sockets to the real daemon (docs/index.md, "TensorRT-LLM" and
"Wire"). The frames, sequence numbers, events and replay socket are
built here from its kv_cache_events.py and native_kv_cache_events.py
(tests/index/upstream.py), not by prefixd's publisher.

Checks, a TensorRT-LLM source (blocks of 16) with a replay endpoint:
  - batches the engine sent before the daemon started (its first an
    AllBlocksCleared, its sequence numbers from the wall clock in
    nanoseconds) are caught up from the replay socket, whose answers
    carry the topic;
  - a chain whose hashes are uint64 values past 2^63, sent as int64 as
    the engine does, is found whole and removed by those hashes;
  - a second engine, serving a model with several attention windows,
    publishes only the layer group of its largest window and names it
    (group_idx 1): its blocks are found and removed as any engine's, none
    dropped;
  - a heartbeat (an empty batch) is applied, and a batch the network lost
    is fetched from the replay socket when the next one shows the gap;
  - an engine that restarts (its new numbers above the old ones, as the
    wall clock makes them) is rebuilt from its new replay buffer: what it
    held before is gone, what it stores after is found;
  - a third engine's multimodal stores: a block with multimodal keys
    (mm_keys), or with a token given as text, is not indexed, nor are the
    blocks after it in the store (counted as dropped), and the batch is no
    error: a prompt of the same token ids must not match it;
  - nothing else is dropped, and the workers stay LIVE.

Usage: test_trtllm_events.py --prefixd PATH [--stubs DIR]
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
NAME = "trtllm-0"
VSWA = "trtllm-vswa"
MM = "trtllm-mm"


def blocks(first, n):
    return upstream.numbered_blocks(first, n, BS)


class TrtllmEventsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pub = upstream.TrtllmPublisher(0)
        cls.vswa = upstream.TrtllmPublisher(0)
        cls.mm = upstream.TrtllmPublisher(0)
        # Sent before the daemon follows the engine: only its replay has it.
        cls.early_seq = cls.pub.publish([upstream.trtllm_stored([1, 2], None, blocks(0, 2),
                                                                BS, group_idx=0)])
        config = ('index {\n  block_size: %d\n'
                  '  sources { name: "%s" endpoint: "%s" replay_endpoint: "%s" }\n'
                  '  sources { name: "%s" endpoint: "%s" replay_endpoint: "%s" }\n'
                  '  sources { name: "%s" endpoint: "%s" replay_endpoint: "%s" }\n'
                  '}\n' % (BS, NAME, cls.pub.endpoint, cls.pub.replay_endpoint,
                           VSWA, cls.vswa.endpoint, cls.vswa.replay_endpoint,
                           MM, cls.mm.endpoint, cls.mm.replay_endpoint))
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False).start()
        cls.client = prefixd.Client(cls.daemon.tcp)
        for pub in (cls.pub, cls.vswa, cls.mm):
            if not pub.wait_for_subscriber(DEADLINE_S):
                raise AssertionError("the daemon did not subscribe")

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()
        cls.pub.close()
        cls.vswa.close()
        cls.mm.close()

    def applied(self, seq, name=NAME):
        return prefixd_fixture.applied(self.client, self.daemon, {name: seq},
                                       DEADLINE_S)[name]

    def publish(self, events, name=NAME):
        pub = {VSWA: self.vswa, MM: self.mm}.get(name, self.pub)
        return self.applied(pub.publish(events), name)

    def held(self, tokens, name=NAME):
        """(matched blocks, {medium: blocks}) of the engine."""
        for w in self.client.route(tokens, workers=[name]).workers:
            return w.matched_blocks, dict(w.mediums)
        return None

    def check_clean(self, w):
        self.assertEqual(w.state, prefixd.WorkerState.LIVE, w.state_detail)
        self.assertEqual((w.dropped_blocks, w.last_error), (0, ""))

    def test_1_caught_up_from_the_replay(self):
        w = self.applied(self.early_seq)
        self.check_clean(w)
        self.assertGreaterEqual(w.replays, 1)
        self.assertEqual(self.held(blocks(0, 2)), (2, {"GPU": 2}))

    def test_2_uint64_hashes_as_int64(self):
        top = [upstream.trtllm_signed((1 << 64) - 1), upstream.trtllm_signed(1 << 63)]
        self.assertEqual(top, [-1, -(1 << 63)])
        w = self.publish([upstream.trtllm_stored(top, None, blocks(10, 2), BS, group_idx=0)])
        self.check_clean(w)
        self.assertEqual(self.held(blocks(10, 2)), (2, {"GPU": 2}))
        w = self.publish([upstream.trtllm_removed(top[1:], group_idx=0)])
        self.check_clean(w)
        self.assertEqual(self.held(blocks(10, 2)), (1, {"GPU": 1}))

    def test_3_largest_window_group(self):
        w = self.publish([upstream.trtllm_stored([31, 32, 33], None, blocks(20, 3), BS,
                                                 group_idx=1)], VSWA)
        self.check_clean(w)
        self.assertEqual(self.held(blocks(20, 3), VSWA), (3, {"GPU": 3}))
        w = self.publish([upstream.trtllm_removed([33], group_idx=1)], VSWA)
        self.check_clean(w)
        self.assertEqual(self.held(blocks(20, 3), VSWA), (2, {"GPU": 2}))

    def test_4_heartbeat_and_lost_batch(self):
        before = self.publish([])  # a heartbeat
        self.check_clean(before)
        self.pub.publish([upstream.trtllm_stored([41], None, blocks(30, 1), BS, group_idx=0)],
                         on_pub=False)
        w = self.publish([upstream.trtllm_stored([42], 41, blocks(31, 1), BS, group_idx=0)])
        self.check_clean(w)
        self.assertEqual(w.gaps, before.gaps + 1)
        self.assertEqual(w.replays, before.replays + 1)
        self.assertEqual(self.held(blocks(30, 2)), (2, {"GPU": 2}))

    def test_5_restart(self):
        old_next = self.pub.next_seq
        ports = self.pub.ports
        self.pub.close()
        type(self).pub = upstream.TrtllmPublisher(0, ports=ports)
        self.assertGreater(self.pub.next_seq, old_next)
        if not self.pub.wait_for_subscriber(DEADLINE_S):
            raise AssertionError("the daemon did not subscribe again")
        w = self.publish([upstream.trtllm_stored([51], None, blocks(50, 1), BS, group_idx=0)])
        self.assertEqual(w.state, prefixd.WorkerState.LIVE, w.state_detail)
        self.assertEqual(w.dropped_blocks, 0)
        self.assertEqual(self.held(blocks(50, 1)), (1, {"GPU": 1}))
        self.assertEqual(self.held(blocks(0, 2)), (0, {}))
        self.assertEqual(self.held(blocks(30, 2)), (0, {}))

    def test_6_multimodal_blocks_are_not_indexed(self):
        image = upstream.trtllm_mm_key(b"\x9f" * 16, 3)
        w = self.publish([upstream.trtllm_stored([61, 62, 63], None, blocks(60, 3), BS,
                                                 mm_keys=[[], [image], []])], MM)
        self.assertEqual(w.state, prefixd.WorkerState.LIVE, w.state_detail)
        self.assertEqual((w.dropped_blocks, w.last_error), (2, ""))
        self.assertEqual(self.held(blocks(60, 3), MM), (1, {"GPU": 1}))
        text = blocks(70, 2)
        text[BS + 5] = "mm:9f"  # block 1's sixth token, given as text
        w = self.publish([upstream.trtllm_stored([71, 72], None, text, BS)], MM)
        self.assertEqual(w.state, prefixd.WorkerState.LIVE, w.state_detail)
        self.assertEqual((w.dropped_blocks, w.last_error), (3, ""))
        self.assertEqual(self.held(blocks(70, 2), MM), (1, {"GPU": 1}))


if __name__ == "__main__":
    if not ARGS.prefixd:
        print("SKIP: --prefixd not given")
        sys.exit(common.SKIP)
    common.unittest_main()
