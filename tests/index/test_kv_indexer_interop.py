#!/usr/bin/python3
"""SGLang's KV indexer API (kv_indexer.v1.KVIndexer, docs/index.md "As
sgl-router's KV indexer") served by the real prefixd binary, called by a
client generated at test time from the schema text (grpc_tools.protoc over
proto/kv_indexer/v1/kv_indexer.proto, whose names and field numbers are
upstream's), not by prefixd's own client.

Covers every RPC and every error path: ApplyExternalKvBatch (REPORT,
REVOKE, CLEAR_ALL_AT_TIER, enforce_sequence duplicates and gaps,
worker_epoch restarts), ReplaceExternalKvSnapshot, ConfigureExpectedWorkers
(adds, removes what it created, leaves ZeroMQ-fed workers; the daemon's
epoch), InvalidateWorker (cleared, not ready, sequenced batches refused
until a snapshot, NOT_FOUND for an unknown worker), MatchExternalKv
(by tier, count_as_hit), MatchExternalKvPrefix (order, addresses,
max_blocks, a WorkerCacheSpec with SWA and MAMBA), GetExternalKvHitCounts;
a ZeroMQ publisher speaking SGLang's wire (signed 64-bit hashes) answered by
MatchExternalKvPrefix with its own hashes; principals (ENGINE mutates,
ADMIN and TENANT query, TENANT within its tenant); and the RPC metrics.

Usage: test_kv_indexer_interop.py --prefixd PATH [--stubs DIR] [-v]
Exit 77 (skipped) without --prefixd.
"""

import hashlib
import os
import sys
import time
import unittest
import urllib.request

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

kv, kv_grpc = upstream.kv_indexer_stubs()

TIMEOUT = 10
TOKENS = {"engine": "engine-token-0123", "admin": "admin-token-0123",
          "t0": "tenant-t0-token-0123", "dflt": "tenant-default-token-0123"}
MAX_TOKENS = 4096     # limits.max_tokens_per_request: MatchExternalKvPrefix, snapshots
MAX_BLOCK_IDS = 1024  # limits.max_block_ids_per_request: batches, Match, hit counts

FULL, SWA, MAMBA = 1, 2, 4
HBM, DRAM, SSD = kv.TIER_HBM, kv.TIER_DRAM, kv.TIER_SSD
REPORT, REVOKE, CLEAR = kv.ACTION_REPORT, kv.ACTION_REVOKE, kv.ACTION_CLEAR_ALL_AT_TIER


def config(pub, pub_components, pub_window):
    principals = "".join(
        'principals { name: "%s" role: %s tenants: "%s" token_sha256: "%s" }\n'
        % (name, role, tenant, hashlib.sha256(TOKENS[name].encode()).hexdigest())
        for name, role, tenant in (("engine", "ENGINE", "*"), ("admin", "ADMIN", "*"),
                                   ("t0", "TENANT", "t0"), ("dflt", "TENANT", "default")))
    return ('auth { mode: TOKEN }\ndynamic_tenants { enabled: true }\n' + principals +
            'limits { max_tokens_per_request: %d max_block_ids_per_request: %d }\n'
            % (MAX_TOKENS, MAX_BLOCK_IDS) +
            'index { block_size: 16 sources { name: "sg" endpoint: "%s" replay_endpoint: "%s" }\n'
            % (pub.endpoint, pub.replay_endpoint) +
            '  sources { name: "sgc" endpoint: "%s" address: "http://sgc:30000" type: "SGLang" }\n'
            % pub_components.endpoint +
            '  sources { name: "sgw" endpoint: "%s" address: "http://sgw:30000" type: "SGLang"\n'
            '            swa_window_tokens: 32 } }\n' % pub_window.endpoint)


def action(kind, tier, hashes=(), masks=(), sizes=()):
    return kv.ExternalKvAction(type=kind, tier=tier, hashes=list(hashes),
                               component_masks=list(masks), block_sizes=list(sizes))


def batch(worker, seq, actions, address="", **kw):
    return kv.ApplyExternalKvBatchRequest(worker_id=worker, seq=seq, actions=actions,
                                          worker_address=address, **kw)


class KvIndexerInterop(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # SGLang's publisher: array encoding, signed 64-bit hashes, replay
        # answers framed [seq, payload].
        cls.pub = kp.Publisher(encoding="array", hash_kind="int64", replay_framing="seq",
                               name="sg")
        # An SGLang engine with --enable-kv-events-component-types: events
        # are passed to it encoded, in either of SGLang's forms.
        cls.pub_c = kp.Publisher(encoding="array", hash_kind="int64", name="sgc")
        # Another, whose source gives its window's length (32 tokens).
        cls.pub_w = kp.Publisher(encoding="array", hash_kind="int64", name="sgw")
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd,
                                            config(cls.pub, cls.pub_c, cls.pub_w))
        cls.daemon.start()
        cls.channel = grpc.insecure_channel(cls.daemon.tcp)
        cls.stub = kv_grpc.KVIndexerStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.daemon.stop()
        cls.daemon.close()
        cls.pub.close()
        cls.pub_c.close()
        cls.pub_w.close()

    def call(self, method, request, who="engine"):
        md = [("authorization", "Bearer " + TOKENS[who])] if who else []
        return getattr(self.stub, method)(request, timeout=TIMEOUT, metadata=md)

    def refused(self, method, request, code, *words, who="engine"):
        with self.assertRaises(grpc.RpcError) as e:
            self.call(method, request, who)
        self.assertEqual(e.exception.code(), code, e.exception.details())
        for w in words:
            self.assertIn(w, e.exception.details())
        return e.exception.details()

    def prefix(self, hashes, max_blocks=0, who="engine"):
        r = self.call("MatchExternalKvPrefix",
                      kv.MatchExternalKvPrefixRequest(hashes=hashes, max_blocks=max_blocks), who)
        return [(m.worker_id, m.worker_address, m.matched_prefix_blocks) for m in r.matches], r

    def apply(self, *args, **kw):
        return self.call("ApplyExternalKvBatch", batch(*args, **kw))

    # ---- MatchExternalKvPrefix ----

    def test_prefix_per_worker_most_first(self):
        a, b = [-101, 102, -103, 104], "p-b"
        self.apply("p-a", 1, [action(REPORT, HBM, a)], "10.0.0.1:30000")
        self.apply(b, 1, [action(REPORT, DRAM, a[:2])], "10.0.0.2:30000")
        self.apply("p-noaddr", 1, [action(REPORT, HBM, a)])  # no address: left out
        got, r = self.prefix(a)
        self.assertEqual(got, [("p-a", "10.0.0.1:30000", 4), (b, "10.0.0.2:30000", 2)])
        self.assertEqual((r.best_prefix_blocks, r.blocks_read), (4, 4))
        got, r = self.prefix(a, max_blocks=3)
        self.assertEqual(got, [("p-a", "10.0.0.1:30000", 3), (b, "10.0.0.2:30000", 2)])
        self.assertEqual(r.blocks_read, 3)
        got, r = self.prefix([999, -101])
        self.assertEqual((got, r.best_prefix_blocks), ([], 0))

    def test_hybrid_worker_cache_spec(self):
        # SWA window 8 tokens = 2 pages of 4; MAMBA on the boundary only.
        spec = kv.WorkerCacheSpec(version=1, components=FULL | SWA | MAMBA, swa_window_tokens=8,
                                  full_tier_mask=1 << HBM, swa_tier_mask=1 << HBM,
                                  mamba_tier_mask=1 << HBM)
        h = [501, 502, 503, 504, 505]
        masks = [FULL, FULL, FULL | SWA, FULL | SWA, FULL | SWA | MAMBA]
        self.apply("hy", 1, [action(REPORT, HBM, h, masks, [4] * 5)], "hy:1", cache_spec=spec)
        self.assertEqual(self.prefix(h)[0], [("hy", "hy:1", 5)])
        self.assertEqual(self.prefix(h[:4])[0], [])  # no MAMBA at 4
        # A REPORT replaces the components: page 4 loses SWA, the window breaks.
        self.apply("hy", 2, [action(REPORT, HBM, [504], [FULL])], "hy:1", cache_spec=spec)
        self.assertEqual(self.prefix(h)[0], [])
        m = self.call("MatchExternalKv", kv.MatchExternalKvRequest(hashes=[504, 505]))
        self.assertEqual(list(m.matches[0].hashes_by_tier[0].component_masks),
                         [FULL, FULL | SWA | MAMBA])
        # Without a spec the worker is full attention only: 5 pages again.
        self.apply("hy", 3, [], "hy:1")
        self.assertEqual(self.prefix(h)[0], [("hy", "hy:1", 5)])

    # ---- ApplyExternalKvBatch ----

    def test_revoke_clear_and_match_by_tier(self):
        h = [601, 602, 603]
        self.apply("t", 1, [action(REPORT, HBM, h), action(REPORT, SSD, h[1:])], "t:1")
        self.apply("t", 2, [action(REVOKE, HBM, [602])], "t:1")
        m = self.call("MatchExternalKv", kv.MatchExternalKvRequest(hashes=h + [602, 699]))
        self.assertEqual(len(m.matches), 1)
        node = m.matches[0]
        self.assertEqual((node.worker_id, node.address), ("t", "t:1"))
        tiers = {t.tier: list(t.hashes) for t in node.hashes_by_tier}
        self.assertEqual(tiers, {HBM: [601, 603], SSD: [602, 603]})
        self.assertEqual(self.prefix(h)[0], [("t", "t:1", 3)])  # 602 still on SSD
        self.apply("t", 3, [action(CLEAR, SSD)], "t:1")
        self.assertEqual(self.prefix(h)[0], [("t", "t:1", 1)])

    def test_enforced_sequence_duplicate_and_gap(self):
        r = self.apply("s", 7, [action(REPORT, HBM, [701])], "s:1", enforce_sequence=True)
        self.assertEqual((r.applied_seq, r.duplicate), (7, False))
        r = self.apply("s", 7, [action(REPORT, HBM, [702])], "s:1", enforce_sequence=True)
        self.assertEqual((r.applied_seq, r.duplicate), (7, True))
        self.assertEqual(self.prefix([701, 702])[0], [("s", "s:1", 1)])  # 702 not applied
        self.apply("s", 8, [action(REPORT, HBM, [702])], "s:1", enforce_sequence=True)
        self.refused("ApplyExternalKvBatch",
                     batch("s", 11, [action(REPORT, HBM, [703])], "s:1", enforce_sequence=True),
                     grpc.StatusCode.FAILED_PRECONDITION, "seq 11 after applied_seq 8",
                     "batches 9..10 are missing")
        self.assertEqual(self.prefix([701])[0], [])  # cleared
        self.refused("ApplyExternalKvBatch",
                     batch("s", 12, [action(REPORT, HBM, [701])], "s:1", enforce_sequence=True),
                     grpc.StatusCode.FAILED_PRECONDITION, "ReplaceExternalKvSnapshot")
        r = self.call("ReplaceExternalKvSnapshot", kv.ReplaceExternalKvSnapshotRequest(
            worker_id="s", worker_address="s:2", applied_seq=20,
            hashes_by_tier=[kv.TierHashes(tier=HBM, hashes=[701, 702, 703])]))
        self.assertEqual(r.applied_seq, 20)
        self.assertEqual(self.prefix([701, 702, 703])[0], [("s", "s:2", 3)])
        r = self.apply("s", 21, [action(REPORT, HBM, [704])], "s:2", enforce_sequence=True)
        self.assertEqual((r.applied_seq, r.duplicate), (21, False))

    def test_epoch_change_is_a_restart(self):
        self.apply("ep", 1, [action(REPORT, HBM, [801, 802])], "ep:1", worker_epoch="a")
        self.apply("ep", 1, [action(REPORT, HBM, [809])], "ep:1", worker_epoch="b")
        self.assertEqual(self.prefix([801])[0], [])
        self.assertEqual(self.prefix([809])[0], [("ep", "ep:1", 1)])
        self.refused("ApplyExternalKvBatch",
                     batch("ep", 2, [action(REPORT, HBM, [803])], "ep:1", worker_epoch="c",
                           enforce_sequence=True),
                     grpc.StatusCode.FAILED_PRECONDITION, 'worker_epoch "c" after "b"')

    def test_snapshot_replaces_every_tier(self):
        self.apply("sn", 1, [action(REPORT, HBM, [901]), action(REPORT, SSD, [902])], "sn:1")
        r = self.call("ReplaceExternalKvSnapshot", kv.ReplaceExternalKvSnapshotRequest(
            worker_id="sn", worker_address="sn:1", worker_epoch="e", applied_seq=5,
            hashes_by_tier=[kv.TierHashes(tier=DRAM, hashes=[903, 904])]))
        self.assertEqual(r.applied_seq, 5)
        self.assertEqual(self.prefix([901])[0], [])
        self.assertEqual(self.prefix([902])[0], [])
        self.assertEqual(self.prefix([903, 904])[0], [("sn", "sn:1", 2)])

    # ---- hit counts ----

    def test_hit_counts(self):
        self.apply("hc", 1, [action(REPORT, HBM, [1001, 1002])], "hc:1")
        self.call("MatchExternalKv", kv.MatchExternalKvRequest(
            hashes=[1001, 1002, 1001, 1099], count_as_hit=True))
        self.call("MatchExternalKv", kv.MatchExternalKvRequest(hashes=[1001], count_as_hit=True))
        self.call("MatchExternalKv", kv.MatchExternalKvRequest(hashes=[1002]))  # not counted
        r = self.call("GetExternalKvHitCounts",
                      kv.GetExternalKvHitCountsRequest(hashes=[1002, 1001, 1099, 1001]))
        self.assertEqual([(e.hash, e.hit_count_total) for e in r.entries],
                         [(1002, 1), (1001, 2)])

    # ---- InvalidateWorker and the indexer's epoch ----

    def test_invalidate_worker(self):
        self.apply("iv", 1, [action(REPORT, HBM, [1301, 1302])], "iv:1",
                   worker_epoch="w1", enforce_sequence=True)
        self.assertEqual(self.prefix([1301, 1302])[0], [("iv", "iv:1", 2)])
        r = self.call("InvalidateWorker", kv.InvalidateWorkerRequest(worker_id="iv"))
        self.assertGreaterEqual(r.total_workers, 1)
        self.assertLess(r.ready_workers, r.total_workers)  # iv is not ready
        self.assertRegex(r.indexer_epoch, "^[0-9a-f]{32}$")
        self.assertEqual(self.prefix([1301, 1302])[0], [])
        # Its sequenced batches wait for a snapshot; then they go on.
        self.refused("ApplyExternalKvBatch",
                     batch("iv", 2, [action(REPORT, HBM, [1303])], "iv:1", worker_epoch="w1",
                           enforce_sequence=True),
                     grpc.StatusCode.FAILED_PRECONDITION, "ReplaceExternalKvSnapshot")
        self.call("ReplaceExternalKvSnapshot", kv.ReplaceExternalKvSnapshotRequest(
            worker_id="iv", worker_address="iv:1", worker_epoch="w1", applied_seq=7,
            hashes_by_tier=[kv.TierHashes(tier=HBM, hashes=[1301])]))
        r2 = self.apply("iv", 8, [action(REPORT, HBM, [1302])], "iv:1", worker_epoch="w1",
                        enforce_sequence=True)
        self.assertEqual((r2.applied_seq, r2.duplicate), (8, False))
        self.assertEqual(self.prefix([1301, 1302])[0], [("iv", "iv:1", 2)])
        # The epoch is the daemon's, the same in every answer.
        again = self.call("InvalidateWorker", kv.InvalidateWorkerRequest(worker_id="iv"))
        self.assertEqual(again.indexer_epoch, r.indexer_epoch)
        self.refused("InvalidateWorker", kv.InvalidateWorkerRequest(worker_id="nobody"),
                     grpc.StatusCode.NOT_FOUND, '"nobody"')
        self.refused("InvalidateWorker", kv.InvalidateWorkerRequest(),
                     grpc.StatusCode.INVALID_ARGUMENT, "worker_id")

    # ---- ConfigureExpectedWorkers and ZeroMQ-fed workers ----
    # Named to run last (unittest runs tests by name): ConfigureExpectedWorkers
    # removes the workers the other tests created.

    def test_zmq_worker_and_expected_workers(self):
        hashes = [-(1 << 62) + 5, (1 << 62) + 7, -9]  # SGLang's signed page hashes
        self.pub.wait_for_subscriber()
        tokens = list(range(48))
        self.pub.publish([kp.block_stored(hashes, None, tokens, 16)])
        deadline = time.monotonic() + TIMEOUT
        holders = []
        while time.monotonic() < deadline and not holders:
            m = self.call("MatchExternalKv", kv.MatchExternalKvRequest(hashes=hashes))
            holders = [n.worker_id for n in m.matches]
        self.assertEqual(holders, ["sg"])
        # No address yet: left out of MatchExternalKvPrefix.
        self.assertEqual(self.prefix(hashes)[0], [])
        self.apply("cw-a", 1, [action(REPORT, HBM, hashes[:1])], "cw-a:1")
        self.apply("cw-b", 1, [action(REPORT, HBM, hashes[:1])], "cw-b:1")
        r = self.call("ConfigureExpectedWorkers", kv.ConfigureExpectedWorkersRequest(workers=[
            kv.ExpectedWorker(worker_id="sg", worker_address="http://sg:30000"),
            kv.ExpectedWorker(worker_id="cw-a", worker_address="cw-a:2"),
            kv.ExpectedWorker(worker_id="cw-new", worker_address="cw-new:1")]))
        self.assertEqual((r.total_workers, r.ready_workers), (3, 2))  # cw-new has no data
        epoch = r.indexer_epoch
        self.assertRegex(epoch, "^[0-9a-f]{32}$")
        got = [(w, a, n) for w, a, n in self.prefix(hashes)[0] if w.startswith(("sg", "cw"))]
        self.assertEqual(got, [("sg", "http://sg:30000", 3), ("cw-a", "cw-a:2", 1)])  # cw-b gone
        # Left out, the ZeroMQ-fed worker stays.
        r = self.call("ConfigureExpectedWorkers", kv.ConfigureExpectedWorkersRequest(workers=[
            kv.ExpectedWorker(worker_id="cw-new", worker_address="cw-new:1")]))
        self.assertEqual((r.total_workers, r.ready_workers), (1, 0))
        got = [(w, n) for w, _, n in self.prefix(hashes)[0] if w.startswith(("sg", "cw"))]
        self.assertEqual(got, [("sg", 3)])
        # One epoch for the daemon's life, in every answer that carries it.
        self.assertEqual(r.indexer_epoch, epoch)
        r = self.call("InvalidateWorker", kv.InvalidateWorkerRequest(worker_id="cw-new"))
        self.assertEqual(r.indexer_epoch, epoch)

    def masks_of(self, worker, hashes):
        m = self.call("MatchExternalKv", kv.MatchExternalKvRequest(hashes=hashes))
        for n in m.matches:
            if n.worker_id == worker:
                held = {}
                for t in n.hashes_by_tier:
                    held.update(zip(t.hashes, t.component_masks))
                return [held.get(h, 0) for h in hashes]
        return [0] * len(hashes)

    def wait_masks(self, worker, hashes, want):
        deadline = time.monotonic() + TIMEOUT
        got = self.masks_of(worker, hashes)
        while got != want and time.monotonic() < deadline:
            time.sleep(0.02)
            got = self.masks_of(worker, hashes)
        self.assertEqual(got, want)

    def test_zmq_sglang_component_types(self):
        # SGLang's stores with --enable-kv-events-component-types, as its own
        # KV indexer bridge reads them: the components a page now holds,
        # which replace what it held (an evicted component is restated
        # away, never removed); a removal takes every component. Then its
        # earlier layout, an event per component.
        h = [-(1 << 60) - 11, 12, 13, 14, 15]  # 5 pages of 16 tokens
        tokens = list(range(1000, 1080))
        self.pub_c.wait_for_subscriber()
        # The array form: the list after medium.
        self.pub_c.publish([["BlockStored", h, None, tokens, 16, None, "GPU", ["full", "swa"]]])
        self.wait_masks("sgc", h, [FULL | SWA] * 5)
        self.assertEqual(self.prefix(h)[0], [("sgc", "http://sgc:30000", 5)])
        # The map form (the newest SGLang): pages 0 and 1 lose the window.
        restate = [kp.encode_event(kp.sglang_block_stored(
            [h[i]], None if i == 0 else h[i - 1], tokens[16 * i:16 * i + 16], 16,
            component_types=["full"]), "map", "int64") for i in (0, 1)]
        self.pub_c.publish(restate)
        self.wait_masks("sgc", h, [FULL, FULL] + [FULL | SWA] * 3)
        # The window's length is not on the wire: until a spec gives it, the
        # window needs every page, and none is usable.
        self.assertEqual(self.prefix(h)[0], [])
        # A spec (a window of 32 tokens: 2 pages) for the ZeroMQ-fed worker.
        spec = kv.WorkerCacheSpec(version=1, components=FULL | SWA, swa_window_tokens=32)
        self.apply("sgc", 1, [], "http://sgc:30000", cache_spec=spec)
        self.assertEqual(self.prefix(h)[0], [("sgc", "http://sgc:30000", 5)])
        # Page 4 removed (both components), then stored with full attention
        # alone: boundary 5 lacks the window, boundary 4 has it.
        self.pub_c.publish([["BlockRemoved", [h[4]], "GPU"],
                            ["BlockStored", [h[4]], h[3], tokens[64:], 16, None, "GPU",
                             ["full"]]])
        self.wait_masks("sgc", h, [FULL, FULL, FULL | SWA, FULL | SWA, FULL])
        self.assertEqual(self.prefix(h)[0], [("sgc", "http://sgc:30000", 4)])
        # SGLang's earlier layout: one component per event, its name where
        # medium is, then component_id, snapshot_version and medium; a store
        # adds the component, a removal takes it alone.
        g = [31, 32, 33, 34, 35]
        more = list(range(2000, 2080))
        self.pub_c.publish([
            ["BlockStored", g, None, more, 16, None, "full", None, 0, "GPU"],
            ["BlockStored", g[2:], g[1], more[32:], 16, None, "swa", None, 0, "GPU"]])
        self.wait_masks("sgc", g, [FULL, FULL] + [FULL | SWA] * 3)
        self.assertEqual(self.prefix(g)[0], [("sgc", "http://sgc:30000", 5)])
        self.pub_c.publish([["BlockRemoved", [g[4]], "swa", None, 0, "GPU"]])
        self.wait_masks("sgc", g, [FULL, FULL, FULL | SWA, FULL | SWA, FULL])
        self.assertEqual(self.prefix(g)[0], [("sgc", "http://sgc:30000", 4)])
        # No batch was refused, no field left unknown.
        text = urllib.request.urlopen("http://%s/metrics" % self.daemon.metrics,
                                      timeout=TIMEOUT).read().decode()
        sgc = [x for x in text.splitlines() if 'worker="sgc"' in x]
        self.assertIn('prefixd_index_worker_state{state="LIVE",worker="sgc"} 1', sgc)
        self.assertIn('prefixd_index_unknown_fields_total{worker="sgc"} 0', sgc)
        self.assertFalse([x for x in sgc if x.startswith("prefixd_index_clears_total")
                          and not x.endswith(" 0")], sgc)

    def test_zmq_sglang_window_from_the_source(self):
        # index.sources' swa_window_tokens: 32 tokens, 2 pages of 16.
        h = [41, 42, 43, 44, 45]
        tokens = list(range(3000, 3080))
        self.pub_w.wait_for_subscriber()
        self.pub_w.publish([
            ["BlockStored", h, None, tokens, 16, None, "GPU", ["full", "swa"]],
            ["BlockStored", h[:3], None, tokens[:48], 16, None, "GPU", ["full"]]])
        self.wait_masks("sgw", h, [FULL] * 3 + [FULL | SWA] * 2)
        self.assertEqual(self.prefix(h)[0], [("sgw", "http://sgw:30000", 5)])
        self.assertEqual(self.prefix(h[:4])[0], [])

    # ---- principals ----

    def test_principals(self):
        self.apply("au", 1, [action(REPORT, HBM, [1101])], "au:1")
        self.refused("MatchExternalKvPrefix", kv.MatchExternalKvPrefixRequest(hashes=[1101]),
                     grpc.StatusCode.UNAUTHENTICATED, who=None)
        for who in ("admin", "t0", "dflt"):
            for method, req in (
                    ("ApplyExternalKvBatch", batch("au", 2, [action(CLEAR, HBM)], "au:1")),
                    ("ReplaceExternalKvSnapshot",
                     kv.ReplaceExternalKvSnapshotRequest(worker_id="au")),
                    ("ConfigureExpectedWorkers", kv.ConfigureExpectedWorkersRequest()),
                    ("InvalidateWorker", kv.InvalidateWorkerRequest(worker_id="au"))):
                self.refused(method, req, grpc.StatusCode.PERMISSION_DENIED, who,
                             "needs an ENGINE principal", who=who)
        self.assertEqual(self.prefix([1101], who="admin")[0], [("au", "au:1", 1)])
        # Tenant principals see the workers of their tenant ("default" here).
        self.assertEqual(self.prefix([1101], who="dflt")[0], [("au", "au:1", 1)])
        self.assertEqual(self.prefix([1101], who="t0")[0], [])
        m = self.call("MatchExternalKv", kv.MatchExternalKvRequest(hashes=[1101]), who="t0")
        self.assertEqual(len(m.matches), 0)
        self.call("GetExternalKvHitCounts", kv.GetExternalKvHitCountsRequest(hashes=[1101]),
                  who="t0")

    # ---- bad input: the status names the field and numbers; nothing changes ----

    def test_bad_input_changes_nothing(self):
        self.apply("bad", 1, [action(REPORT, HBM, [1201, 1202])], "bad:1",
                   enforce_sequence=True)
        before = self.prefix([1201, 1202])[0]
        inv = grpc.StatusCode.INVALID_ARGUMENT
        cases = [
            (batch("", 2, [action(REPORT, HBM, [1])]), "worker_id is empty"),
            (batch("bad", 2, [action(999, HBM, [1])]), "actions[0].type is 999"),
            (batch("bad", 2, [action(0, HBM, [1])]), "actions[0].type is 0"),
            (batch("bad", 2, [action(REVOKE, 0, [1201])]), "actions[0].tier is 0"),
            (batch("bad", 2, [action(REVOKE, 7, [1201])]), "actions[0].tier is 7"),
            (batch("bad", 2, [action(CLEAR, HBM), action(REPORT, HBM, [])]),
             "actions[1].hashes is empty"),
            (batch("bad", 2, [action(REPORT, HBM, [1, 2], [FULL])]),
             "actions[0].component_masks has 1 entries", "(2)"),
            (batch("bad", 2, [action(REPORT, HBM, [1, 2], [], [16])]),
             "actions[0].block_sizes has 1 entries"),
            (batch("bad", 2, [action(REPORT, HBM, [1], [8])]),
             "actions[0].component_masks[0] is 8"),
            (batch("bad", 2, [action(CLEAR, HBM)], cache_spec=kv.WorkerCacheSpec(
                version=2, components=FULL)), "cache_spec.version is 2"),
            (batch("bad", 2, [action(CLEAR, HBM)], cache_spec=kv.WorkerCacheSpec(version=1)),
             "cache_spec.components is 0"),
            (batch("bad", 2, [action(CLEAR, HBM)], cache_spec=kv.WorkerCacheSpec(
                components=FULL | SWA)), "cache_spec.swa_window_tokens is 0"),
            (batch("bad", 2, [action(REPORT, HBM, range(MAX_BLOCK_IDS + 1))]),
             "the batch has %d hashes; the limit is %d" % (MAX_BLOCK_IDS + 1, MAX_BLOCK_IDS)),
            (batch("x" * 257, 2, []), "worker_id is 257 bytes, more than 256"),
            (batch("w\x1b[2J", 2, []), "has a control character"),
        ]
        for req, *words in cases:
            self.refused("ApplyExternalKvBatch", req, inv, *words)
        snap = kv.ReplaceExternalKvSnapshotRequest
        self.refused("ReplaceExternalKvSnapshot", snap(worker_address="a"), inv, "worker_id")
        self.refused("ReplaceExternalKvSnapshot", snap(
            worker_id="bad", hashes_by_tier=[kv.TierHashes(tier=0, hashes=[1])]), inv,
            "hashes_by_tier[0].tier is 0")
        self.refused("ReplaceExternalKvSnapshot", snap(
            worker_id="bad", hashes_by_tier=[kv.TierHashes(tier=HBM, hashes=[1],
                                                           component_masks=[1, 1])]),
            inv, "hashes_by_tier[0].component_masks has 2 entries")
        self.refused("ReplaceExternalKvSnapshot", snap(
            worker_id="bad", hashes_by_tier=[kv.TierHashes(tier=HBM,
                                                           hashes=range(MAX_TOKENS + 1))]),
            inv, "the snapshot has %d hashes; the limit is %d" % (MAX_TOKENS + 1, MAX_TOKENS))
        cfg = kv.ConfigureExpectedWorkersRequest
        self.refused("ConfigureExpectedWorkers", cfg(workers=[
            kv.ExpectedWorker(worker_id="bad"), kv.ExpectedWorker(worker_id="bad")]), inv,
            'workers[1].worker_id "bad" is listed twice')
        self.refused("ConfigureExpectedWorkers", cfg(workers=[kv.ExpectedWorker()]), inv,
                     "workers[0].worker_id is empty")
        self.refused("ConfigureExpectedWorkers", cfg(workers=[kv.ExpectedWorker(
            worker_id="bad", cache_spec=kv.WorkerCacheSpec(components=16))]), inv,
            "workers[0].cache_spec.components is 16")
        self.refused("MatchExternalKvPrefix", kv.MatchExternalKvPrefixRequest(), inv,
                     "hashes is empty")
        self.refused("MatchExternalKvPrefix",
                     kv.MatchExternalKvPrefixRequest(hashes=range(MAX_TOKENS + 1)),
                     grpc.StatusCode.OUT_OF_RANGE,
                     "hashes has %d hashes; the limit is %d" % (MAX_TOKENS + 1, MAX_TOKENS))
        for method, req in (("MatchExternalKv", kv.MatchExternalKvRequest),
                            ("GetExternalKvHitCounts", kv.GetExternalKvHitCountsRequest)):
            self.refused(method, req(), inv, "hashes is empty")
            self.refused(method, req(hashes=range(MAX_BLOCK_IDS + 1)), inv,
                         "hashes has %d hashes; the limit is %d" % (MAX_BLOCK_IDS + 1,
                                                                     MAX_BLOCK_IDS))
        # Nothing changed: the same answer, and the stream goes on at seq 2.
        self.assertEqual(self.prefix([1201, 1202])[0], before)
        r = self.apply("bad", 2, [action(REPORT, HBM, [1203])], "bad:1", enforce_sequence=True)
        self.assertEqual((r.applied_seq, r.duplicate), (2, False))
        self.assertEqual(self.prefix([1201, 1202, 1203])[0], [("bad", "bad:1", 3)])

    # ---- metrics ----

    def test_metrics(self):
        self.apply("me", 1, [], "me:1")
        self.refused("ApplyExternalKvBatch", batch("", 1, []), grpc.StatusCode.INVALID_ARGUMENT)
        text = urllib.request.urlopen("http://%s/metrics" % self.daemon.metrics,
                                      timeout=TIMEOUT).read().decode()

        def value(series):
            for line in text.splitlines():
                if line.startswith(series + " "):
                    return float(line.split()[-1])
            self.fail("no series " + series)

        self.assertGreaterEqual(value(
            'prefixd_rpc_duration_seconds_count{method="ApplyExternalKvBatch"}'), 2)
        self.assertGreaterEqual(value(
            'prefixd_rpc_errors_total{code="INVALID_ARGUMENT",method="ApplyExternalKvBatch"}'), 1)
        for method in ("ConfigureExpectedWorkers", "InvalidateWorker",
                       "ReplaceExternalKvSnapshot", "MatchExternalKv", "MatchExternalKvPrefix",
                       "GetExternalKvHitCounts"):
            value('prefixd_rpc_duration_seconds_count{method="%s"}' % method)


if __name__ == "__main__":
    unittest.main()
