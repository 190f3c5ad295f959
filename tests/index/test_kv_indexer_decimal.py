#!/usr/bin/python3
"""kv_indexer.v1 with decimal-text hashes (docs/index.md, "As sgl-router's KV
indexer"): the form of SGLang's standalone sgl-kv-indexer crate, whose
bridge and client call the same service with every block hash as the
decimal text of SGLang's signed 64-bit page hash. Served by the real
prefixd binary, called by a client generated at test time from
tests/index/kv_indexer_standalone.proto (that crate's names and field
numbers), not by prefixd's own client.

Checks: a bridge's REPORT in decimal text is found by a decimal
MatchExternalKvPrefix, by the unsigned text of the same 64 bits, and by
sgl-router's packed sfixed64 query (hand-encoded bytes); a ZeroMQ-fed SGLang
worker's pages are found by decimal text; MatchExternalKv and
GetExternalKvHitCounts answer decimal text to a decimal question; REVOKE
and CLEAR_ALL_AT_TIER; a batch with one hash that is not decimal text is
INVALID_ARGUMENT naming the entry and changes nothing.

Usage: test_kv_indexer_decimal.py --prefixd PATH [--stubs DIR] [-v]
Exit 77 (skipped) without --prefixd.
"""

import os
import struct
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)
if not ARGS.prefixd:
    print("--prefixd not given: skipped")
    sys.exit(77)

import grpc  # noqa: E402

import prefixd_fixture  # noqa: E402
from prefixd import kv_publisher as kp  # noqa: E402

import upstream  # noqa: E402  (tests/index/upstream.py)

kv, kv_grpc = upstream.kv_indexer_standalone_stubs()

TIMEOUT = 10
BS = 16
# SGLang page hashes: signed 64-bit, negative ones included.
CHAIN = [7436829157382910461, -2305843009213693952, -9223372036854775807, 42]
HBM, DRAM = kv.TIER_HBM, kv.TIER_DRAM
REPORT, REVOKE, CLEAR = kv.ACTION_REPORT, kv.ACTION_REVOKE, kv.ACTION_CLEAR_ALL_AT_TIER


def text(hashes):
    return [str(h) for h in hashes]


def unsigned_text(hashes):
    return [str(h & (1 << 64) - 1) for h in hashes]


def packed_prefix_request(hashes):
    """MatchExternalKvPrefixRequest as sgl-router sends it: field 1, packed
    sfixed64 (little-endian), encoded by hand."""
    body = struct.pack("<%dq" % len(hashes), *hashes)
    return b"\x0a" + bytes([len(body)]) + body


class KvIndexerDecimal(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pub = kp.Publisher(encoding="array", hash_kind="int64", name="sg")
        config = ('index { block_size: %d sources { name: "sg" endpoint: "%s" '
                  'address: "http://sg:30000" type: "SGLang" } }\n' % (BS, cls.pub.endpoint))
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config)
        cls.daemon.start()
        cls.channel = grpc.insecure_channel(cls.daemon.tcp)
        cls.stub = kv_grpc.KVIndexerStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.daemon.stop()
        cls.daemon.close()
        cls.pub.close()

    def apply(self, worker, seq, actions, address):
        return self.stub.ApplyExternalKvBatch(kv.ApplyExternalKvBatchRequest(
            worker_id=worker, seq=seq, actions=actions, worker_address=address),
            timeout=TIMEOUT)

    def prefix(self, hashes):
        r = self.stub.MatchExternalKvPrefix(kv.MatchExternalKvPrefixRequest(hashes=hashes),
                                            timeout=TIMEOUT)
        return [(m.worker_id, m.worker_address, m.matched_prefix_blocks)
                for m in r.matches], r.best_prefix_blocks

    def test_1_bridge_reports_and_every_form_finds_them(self):
        self.apply("w0", 1, [kv.ExternalKvAction(type=REPORT, tier=HBM, hashes=text(CHAIN))],
                   "http://w0:30000")
        want = ([("w0", "http://w0:30000", 4)], 4)
        self.assertEqual(self.prefix(text(CHAIN)), want)
        self.assertEqual(self.prefix(unsigned_text(CHAIN)), want,
                         "the unsigned text of the same 64 bits names the same hashes")
        # sgl-router's packed form finds what the decimal bridge reported.
        raw = self.channel.unary_unary("/kv_indexer.v1.KVIndexer/MatchExternalKvPrefix",
                                       request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
        r = kv.MatchExternalKvPrefixResponse.FromString(
            raw(packed_prefix_request(CHAIN), timeout=TIMEOUT))
        self.assertEqual([(m.worker_id, m.matched_prefix_blocks) for m in r.matches],
                         [("w0", 4)])

    def test_2_match_and_hit_counts_answer_decimal_text(self):
        self.apply("w1", 1, [kv.ExternalKvAction(type=REPORT, tier=DRAM, hashes=text(CHAIN[:2]))],
                   "http://w1:30000")
        m = self.stub.MatchExternalKv(kv.MatchExternalKvRequest(hashes=text(CHAIN),
                                                                count_as_hit=True),
                                      timeout=TIMEOUT)
        held = {n.worker_id: {(t.tier, h) for t in n.hashes_by_tier for h in t.hashes}
                for n in m.matches}
        self.assertEqual(held["w1"], {(DRAM, h) for h in text(CHAIN[:2])})
        self.assertEqual(held["w0"], {(HBM, h) for h in text(CHAIN)})
        c = self.stub.GetExternalKvHitCounts(kv.GetExternalKvHitCountsRequest(
            hashes=text(CHAIN[:2])), timeout=TIMEOUT)
        got = {e.hash: e.hit_count_total for e in c.entries}
        self.assertEqual(sorted(got), sorted(text(CHAIN[:2])))
        self.assertTrue(all(n >= 1 for n in got.values()), got)

    def test_3_revoke_and_clear(self):
        self.apply("w2", 1, [kv.ExternalKvAction(type=REPORT, tier=HBM, hashes=text(CHAIN))],
                   "http://w2:30000")
        self.apply("w2", 2, [kv.ExternalKvAction(type=REVOKE, tier=HBM, hashes=text(CHAIN[2:3]))],
                   "http://w2:30000")
        self.assertIn(("w2", "http://w2:30000", 2), self.prefix(text(CHAIN))[0])
        self.apply("w2", 3, [kv.ExternalKvAction(type=CLEAR, tier=HBM)], "http://w2:30000")
        self.assertNotIn("w2", [w for w, _, _ in self.prefix(text(CHAIN))[0]])

    def test_4_zmq_worker_found_by_decimal_text(self):
        pages = [-(1 << 62) + 11, (1 << 62) + 13]
        self.pub.wait_for_subscriber()
        self.pub.publish([kp.block_stored(pages, None, list(range(2 * BS)), BS)])
        deadline = time.monotonic() + TIMEOUT
        got = []
        while time.monotonic() < deadline and not got:
            got = self.prefix(text(pages))[0]
            time.sleep(0.02)
        self.assertEqual(got, [("sg", "http://sg:30000", 2)])

    def test_5_a_hash_that_is_not_decimal_is_refused(self):
        before = self.prefix(text(CHAIN))
        with self.assertRaises(grpc.RpcError) as e:
            self.apply("w0", 9, [kv.ExternalKvAction(type=REVOKE, tier=HBM,
                                                     hashes=[str(CHAIN[0]), "0x1f"])],
                       "http://w0:30000")
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn('actions[0].hashes: entry 1 ("0x1f") is not the decimal text',
                      e.exception.details())
        self.assertEqual(self.prefix(text(CHAIN)), before, "the refused batch changed nothing")


if __name__ == "__main__":
    unittest.main()
