#!/usr/bin/python3
"""prefixd.Client against the real daemon (and, for what the daemon cannot
show with auth off, against a recording fake server).

The daemon runs on a free TCP port and a Unix socket in a temp dir with a
64-block budget; it is stopped with SIGTERM and must exit 0. The fleet
index's calls (route, route_batch, list_workers) run against a daemon with
one index source nobody publishes on (IndexTest), and against a fake
PrefixIndex for what goes on the wire (IndexFakeTest).

Usage: test_client.py --prefixd PATH [--stubs DIR] [unittest args]
"""

import threading
import unittest

import common

ARGS = common.setup(__doc__)

import grpc  # noqa: E402
from concurrent import futures  # noqa: E402

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd.v1 import prefix_cache_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_cache_pb2_grpc as pb_grpc  # noqa: E402
from prefixd.v1 import prefix_index_pb2 as ipb  # noqa: E402
from prefixd.v1 import prefix_index_pb2_grpc as ipb_grpc  # noqa: E402

BLOCK = 16
BUDGET_BLOCKS = 64
CONFIG = 'kv_budget: "%dMiB"\nblock_size: %d\ndrain_timeout: "2s"\n' % (BUDGET_BLOCKS * 2, BLOCK)

DAEMON = None


def setUpModule():
    global DAEMON
    if not ARGS.prefixd:
        raise unittest.SkipTest("--prefixd not given")
    DAEMON = prefixd_fixture.Daemon(ARGS.prefixd, CONFIG).start()


def tearDownModule():
    if DAEMON is not None:
        rc = DAEMON.stop()
        logs = DAEMON.logs()
        DAEMON.close()
        if rc != 0:
            raise AssertionError("prefixd exited %s on SIGTERM:\n%s" % (rc, logs))


def tokens(first_block, n_blocks):
    """n_blocks blocks of tokens that depend only on the block numbers."""
    return [b * BLOCK + j for b in range(first_block, first_block + n_blocks) for j in range(BLOCK)]


class TenantTestCase(unittest.TestCase):
    """Each test works in its own tenant, so tests never see each other."""

    def client(self, tenant=None, target=None, **kw):
        c = prefixd.Client(target or DAEMON.unix, tenant=tenant or self.id().split(".")[-1],
                           **kw)
        self.addCleanup(c.close)
        return c

    def tenant_stats(self, c):
        (t,) = c.stats().tenants
        return t


class ClientTest(TenantTestCase):
    def test_health_and_info_over_tcp_and_unix(self):
        for target in (DAEMON.tcp, DAEMON.unix):
            c = self.client(target=target)
            self.assertEqual(c.health(), "SERVING")
            self.assertEqual(c.health(prefixd.HEALTH_SERVICE), "SERVING")
            info = c.info()
            self.assertEqual(info.eviction_policy, "LRU")
            self.assertEqual(info.block_size, BLOCK)
            self.assertEqual(info.budget_blocks, BUDGET_BLOCKS)
            self.assertNotEqual(info.epoch, 0)
            self.assertEqual(c.epoch, info.epoch)

    def test_epoch_prints_in_hex(self):
        """As prefixctl's tables and JSON and the daemon's log print it."""
        c = self.client()
        m = c.match(tokens(0, 1))
        self.assertRegex(str(c.epoch), "^[0-9a-f]{16}$")
        self.assertEqual(str(m.epoch), "%016x" % c.epoch)
        self.assertIn("epoch=0x%016x" % c.epoch, repr(m))
        self.assertEqual(m.epoch, c.info().epoch)  # still an int

    def test_match_at_another_position_under_deny_says_why(self):
        c = self.client()
        c.insert(tokens(0, 2), [300, 301])
        m = c.match(tokens(0, 2), position_offset=16)
        self.assertEqual(m.matched_tokens, 0)
        self.assertEqual(m.rope_denied, prefixd.RopeDenied(16, 0))
        m = c.match(tokens(0, 2))
        self.assertEqual(m.matched_tokens, 32)
        self.assertIsNone(m.rope_denied)

    def test_insert_then_match_whole_blocks(self):
        c = self.client()
        r = c.insert(tokens(0, 3), [100, 101, 102])
        self.assertEqual((r.cached_tokens, r.redundant_block_ids, r.evicted_block_ids),
                         (0, [], []))
        self.assertIsNone(r.lease)
        m = c.match(tokens(0, 2) + [9999] * 5)  # 37 tokens: at most 2 whole blocks
        self.assertEqual(m.matched_tokens, 32)
        self.assertEqual(m.block_ids, [100, 101])
        self.assertEqual(m.segments, [prefixd.Segment((100, 101), 0, 0)])
        self.assertIsNone(m.lease)
        self.assertEqual(c.match(tokens(5, 2)).matched_tokens, 0)
        self.assertEqual(c.match(tokens(0, 3), namespace="other").matched_tokens, 0)
        self.assertEqual(sorted(c.cached_block_ids()), [100, 101, 102])

    def test_insert_returns_redundant_ids_and_confirms_matched_ones(self):
        c = self.client()
        c.insert(tokens(0, 2), [200, 201])
        r = c.insert(tokens(0, 3), [300, 301, 302])
        self.assertEqual(r.cached_tokens, 32)
        self.assertEqual(sorted(r.redundant_block_ids), [300, 301])
        r = c.insert(tokens(0, 4), [200, 201, 302, 303])  # as an engine does after Match
        self.assertEqual((r.cached_tokens, r.redundant_block_ids), (48, []))
        self.assertEqual(c.match(tokens(0, 4)).block_ids, [200, 201, 302, 303])

    def test_lease_context_manager_releases_on_exit(self):
        c = self.client()
        c.insert(tokens(0, 2), [400, 401])
        with c.match(tokens(0, 2), pin=True) as m:
            self.assertTrue(m.lease)
            self.assertEqual(self.tenant_stats(c).pinned_blocks, 2)
        self.assertEqual(self.tenant_stats(c).pinned_blocks, 0)
        self.assertFalse(m.lease)  # released: the id is cleared
        with self.assertRaises(ZeroDivisionError):
            with c.match(tokens(0, 2), pin=True) as m:
                lease_id = m.lease.id
                1 / 0
        self.assertEqual(self.tenant_stats(c).pinned_blocks, 0)
        with self.assertRaises(prefixd.NotFound):
            c.release(lease_id)
        with c.insert(tokens(0, 3), [400, 401, 402], pin=True) as r:
            self.assertEqual(self.tenant_stats(c).pinned_blocks, 3)
            with r.lease:  # a Lease is a context manager too
                pass
            self.assertEqual(self.tenant_stats(c).pinned_blocks, 0)

    def test_pin_on_a_miss_gives_no_lease(self):
        c = self.client()
        with c.match(tokens(50, 2), pin=True) as m:
            self.assertEqual(m.matched_tokens, 0)
            self.assertIsNone(m.lease)

    def test_keepalive_and_ttl(self):
        c = self.client()
        c.insert(tokens(0, 1), [500])
        m = c.match(tokens(0, 1), pin=True, lease_ttl=60)
        left = m.lease.keepalive()
        self.assertGreater(left, 50)
        self.assertLessEqual(left, 60)
        self.assertEqual(len(c.keepalive([m.lease.id, m.lease.id])), 2)
        lease_id = m.lease.detach()
        self.assertFalse(m.lease)
        c.release(lease_id)
        with self.assertRaises(prefixd.NotFound):
            c.keepalive([lease_id])

    def test_invalidate_removes_the_subtree(self):
        c = self.client()
        c.insert(tokens(0, 3), [700, 701, 702])
        c.insert(tokens(0, 2) + tokens(20, 1), [700, 701, 720])
        self.assertEqual(sorted(c.invalidate([701])), [701, 702, 720])
        self.assertEqual(c.cached_block_ids(), [700])

    def test_reset_returns_every_id(self):
        c = self.client()
        c.insert(tokens(0, 2), [800, 801])
        c.insert(tokens(5, 1), [805], namespace="lora-a")
        self.assertEqual(sorted(c.reset()), [800, 801, 805])
        self.assertEqual(self.tenant_stats(c).cached_blocks, 0)

    def test_errors_carry_code_and_numbers(self):
        c = self.client()
        with self.assertRaises(prefixd.InvalidArgument) as e:
            c.insert(tokens(0, 2), [900])
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(e.exception.method, "Insert")
        self.assertIn("32", e.exception.details)
        self.assertEqual(c.cached_block_ids(), [])
        c.insert(tokens(0, 1), [901])
        with self.assertRaises(prefixd.InvalidArgument):  # 901 is cached elsewhere
            c.insert(tokens(3, 1), [901])
        self.assertIsInstance(e.exception, prefixd.PrefixdError)

    def test_retention_reaches_the_daemon(self):
        # Values the daemon can only refuse if they arrive: each error names
        # the field the client filled in, and nothing is cached.
        c = self.client()
        cases = [
            (prefixd.Retention(priority=2**32 - 1), "retention.priority 4294967295"),
            (prefixd.Retention(priority=80, ranges=[
                prefixd.RetentionRange(0, 16, priority=20),
                prefixd.RetentionRange(16, 0, priority=90, duration=2**63 / 1000)]),
             "retention.ranges[1].duration_ms 9223372036854775808"),
        ]
        for retention, message in cases:
            with self.assertRaises(prefixd.InvalidArgument) as e:
                c.insert(tokens(0, 2), [7001, 7002], retention=retention)
            self.assertIn(message, e.exception.details)
            with self.assertRaises(prefixd.InvalidArgument) as e:
                c.insert_batch([(tokens(0, 2), [7001, 7002])], retention=retention)
            self.assertIn("requests[0]: " + message, e.exception.details)
        self.assertEqual(list(c.stats().tenants), [])
        # The proto the client sends for a well-formed hint.
        self.assertEqual(
            prefixd.Retention(priority=80, duration=600, ranges=[
                prefixd.RetentionRange(0, 16, priority=90)]).to_proto(),
            pb.Retention(priority=80, duration_ms=600000, ranges=[
                pb.RetentionRange(token_begin=0, token_end=16, priority=90)]))
        self.assertFalse(prefixd.Retention().to_proto().HasField("priority"))
        r = c.insert(tokens(0, 2), [7001, 7002], retention=prefixd.Retention(priority=90))
        self.assertEqual(r.redundant_block_ids, [])
        self.assertEqual(self.tenant_stats(c).cached_blocks, 2)

    def test_tokens_travel_as_le32_and_both_encodings_agree(self):
        self.assertEqual(prefixd.tokens_le32([1, 0x01020304, 0xFFFFFFFF]),
                         b"\x01\0\0\0\x04\x03\x02\x01\xff\xff\xff\xff")
        for bad in (-1, 2**32):
            with self.assertRaises(OverflowError):
                prefixd.tokens_le32([bad])
        c = self.client()
        c.insert(tokens(0, 2), [1000, 1001])  # sent as tokens_le32
        channel = grpc.insecure_channel(DAEMON.unix)
        self.addCleanup(channel.close)
        stub = pb_grpc.PrefixCacheStub(channel)
        meta = (("x-prefixd-tenant", self.id().split(".")[-1]),)
        r = stub.Match(pb.MatchRequest(tokens=tokens(0, 2)), metadata=meta)
        self.assertEqual((r.matched_tokens, list(r.segments[0].block_ids)), (32, [1000, 1001]))
        with self.assertRaises(grpc.RpcError) as e:
            stub.Match(pb.MatchRequest(tokens=tokens(0, 1),
                                       tokens_le32=prefixd.tokens_le32(tokens(0, 1))),
                       metadata=meta)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("both tokens (16 tokens) and tokens_le32 (16 tokens)", e.exception.details())

    def test_batches_answer_per_item_in_one_call(self):
        c = self.client()
        ins = c.insert_batch([(tokens(0, 2), [5100, 5101]),
                              (tokens(10, 2), [5110]),  # one ID for two blocks
                              (tokens(0, 3), [5200, 5201, 5202])])
        self.assertIsInstance(ins[0], prefixd.InsertResult)
        self.assertIsInstance(ins[1], prefixd.InvalidArgument)
        self.assertEqual(ins[1].method, "InsertBatch")
        self.assertIn("1 block_ids for 32 tokens", ins[1].details)
        self.assertEqual((ins[2].cached_tokens, ins[2].redundant_block_ids), (32, [5200, 5201]))
        self.assertEqual(sorted(c.cached_block_ids()), [5100, 5101, 5202])

        got = c.match_batch([tokens(0, 3), tokens(10, 2), [], tokens(0, 1) + [7]],
                            position_offsets=[0, 0, 0, 0], pin=True)
        self.assertEqual(len(got), 4)
        self.assertEqual(got[0].block_ids, [5100, 5101, 5202])
        self.assertTrue(got[0].lease)
        self.assertEqual((got[1].matched_tokens, got[1].lease), (0, None))
        self.assertIsInstance(got[2], prefixd.InvalidArgument)  # empty tokens
        self.assertEqual(got[3].block_ids, [5100])
        self.assertEqual(self.tenant_stats(c).pinned_blocks, 3)
        for m in (got[0], got[3]):
            m.lease.release()
        self.assertEqual(self.tenant_stats(c).pinned_blocks, 0)

        with self.assertRaises(prefixd.InvalidArgument) as e:  # the whole batch
            c.match_batch([])
        self.assertIn("has no requests", e.exception.details)
        with self.assertRaises(ValueError):
            c.match_batch([tokens(0, 1)], position_offsets=[0, 16])

    def test_tenants_are_isolated_by_metadata(self):
        a, b = self.client(tenant="iso-a"), self.client(tenant="iso-b")
        a.insert(tokens(0, 2), [1100, 1101])
        self.assertEqual(b.match(tokens(0, 2)).matched_tokens, 0)
        self.assertEqual(a.match(tokens(0, 2)).matched_tokens, 32)
        self.assertEqual([t.tenant for t in b.stats().tenants], ["iso-b"])
        lease = a.match(tokens(0, 2), pin=True).lease
        with self.assertRaises(prefixd.NotFound):
            b.release(lease.id)
        lease.release()

    def test_handshake_checks_the_fingerprint(self):
        c = self.client()
        fp = c.info().model_fingerprint
        self.assertEqual(c.handshake("engine-0", fp).epoch, c.epoch)
        with self.assertRaises(prefixd.FailedPrecondition) as e:
            c.handshake("engine-0", "0123456789abcdef")
        self.assertIn(fp, e.exception.details)

    def test_the_fleet_index_is_unimplemented_without_an_index(self):
        c = self.client()
        for method, call in (("Route", lambda: c.route(tokens(0, 1))),
                             ("RouteBatch", lambda: c.route_batch([tokens(0, 1)])),
                             ("ListWorkers", c.list_workers),
                             ("Pick", lambda: c.pick(tokens(0, 1))),
                             ("PickBatch", lambda: c.pick_batch([tokens(0, 1)]))):
            with self.assertRaises(prefixd.Unimplemented) as e:
                call()
            self.assertEqual(e.exception.code, grpc.StatusCode.UNIMPLEMENTED)
            self.assertEqual(e.exception.method, method)
            # Not gRPC's bare "Route: UNIMPLEMENTED: ": the way out, as prefixctl says it.
            self.assertEqual(str(e.exception),
                             "%s: UNIMPLEMENTED: the daemon at %s does not serve the fleet "
                             "index: start it with --index_source=NAME=ENDPOINT or an index { } "
                             "config (docs/index.md)" % (method, c.target))

    def test_watch_events_streams_stored_blocks(self):
        c = self.client()
        c.insert(tokens(0, 2), [1200, 1201])
        stream = c.watch_events(0, timeout=10)
        seen = []
        for batch in stream:
            for ev in batch.events:
                if ev.HasField("block_stored"):
                    seen += ev.block_stored.block_ids
            if 1201 in seen:
                stream.cancel()
        self.assertEqual(seen[:2], [1200, 1201])


class FreshDaemonTest(TenantTestCase):
    """Evict and the global budget act across tenants (auth off: the caller
    may act for all of them), so these tests get a daemon each."""

    def setUp(self):
        self.daemon = prefixd_fixture.Daemon(ARGS.prefixd, CONFIG)
        self.addCleanup(self.daemon.close)
        self.daemon.start()

    def client(self, tenant=None, target=None, **kw):
        return super().client(tenant, target or self.daemon.unix, **kw)

    def test_evict_takes_lru_tails_never_pinned(self):
        c = self.client()
        c.insert(tokens(0, 2), [600, 601])
        c.insert(tokens(10, 2), [610, 611])
        c.match(tokens(0, 2))  # 600-601 are now the most recently used
        with c.match(tokens(10, 2), pin=True):
            self.assertEqual(sorted(c.evict(4)), [600, 601])  # 610-611 are pinned
        self.assertEqual(sorted(c.evict(4)), [610, 611])
        self.assertEqual(c.evict(4), [])
        self.assertEqual(self.tenant_stats(c).cached_blocks, 0)

    def test_budget_eviction_is_reported_by_insert(self):
        c = self.client()
        c.insert(tokens(0, 60), list(range(1000, 1060)))
        r = c.insert(tokens(100, 10), list(range(2000, 2010)))
        self.assertEqual(len(r.evicted_block_ids), 6)
        self.assertTrue(all(1000 <= b < 1060 for b in r.evicted_block_ids))
        self.assertEqual(self.tenant_stats(c).cached_blocks, BUDGET_BLOCKS)
        with self.assertRaises(prefixd.ResourceExhausted):
            c.insert(tokens(200, BUDGET_BLOCKS + 1), list(range(3000, 3000 + BUDGET_BLOCKS + 1)))




class IndexTest(unittest.TestCase):
    """A daemon with a fleet index of one source, w0, whose endpoint nobody
    listens on: ZeroMQ connects lazily, so w0 stays CONNECTING, holds
    nothing and has applied no batch (needs the daemon's --index_source)."""

    @classmethod
    def setUpClass(cls):
        cls.endpoint = "tcp://127.0.0.1:%d" % prefixd_fixture.free_port()
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, CONFIG,
                                            args=["--index_source=w0=" + cls.endpoint])
        try:
            cls.daemon.start()
        except BaseException:
            cls.daemon.close()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.daemon.stop()
        logs = cls.daemon.logs()
        cls.daemon.close()
        if rc != 0:
            raise AssertionError("prefixd exited %s on SIGTERM:\n%s" % (rc, logs))

    def client(self, target=None):
        c = prefixd.Client(target or self.daemon.unix)
        self.addCleanup(c.close)
        return c

    def assert_nothing_held(self, r, prompt_blocks, listed):
        """`listed`: the call asked for w0 (all_workers or workers=["w0"]);
        otherwise the answer lists no worker, as none matched."""
        self.assertIsInstance(r, prefixd.RouteResult)
        self.assertEqual((r.best_worker, r.best), ("", None))
        self.assertEqual((r.prompt_blocks, r.block_size), (prompt_blocks, BLOCK))
        want = [prefixd.WorkerMatch(
            worker="w0", matched_blocks=0, mediums={}, state=prefixd.WorkerState.CONNECTING,
            last_seq=-1,
            lag_ms=r.workers[0].lag_ms if r.workers else 0)] if listed else []
        self.assertEqual(r.workers, want)

    def test_route_answers_for_the_connecting_worker(self):
        for target in (self.daemon.tcp, self.daemon.unix):
            c = self.client(target)
            self.assert_nothing_held(c.route(tokens(0, 4)), 4, listed=False)
            self.assert_nothing_held(c.route(tokens(0, 4), all_workers=True), 4, listed=True)
        c = self.client()
        self.assert_nothing_held(c.route(tokens(0, 2) + [7] * 5, lora_name="sql-adapter",
                                         cache_salt="salt", workers=["w0"]), 2, listed=True)
        self.assert_nothing_held(c.route(tokens(0, 1), lora_id=3), 1, listed=False)

    def test_route_batch_answers_every_item(self):
        c = self.client()
        got = c.route_batch([tokens(0, 2), prefixd.RouteQuery(tokens(0, 3), workers=["w0"]),
                             prefixd.RouteQuery(tokens(0, 1), all_workers=True)],
                            cache_salt="salt")
        self.assertEqual(len(got), 3)
        self.assert_nothing_held(got[0], 2, listed=False)
        self.assert_nothing_held(got[1], 3, listed=True)
        self.assert_nothing_held(got[2], 1, listed=True)
        got = c.route_batch([tokens(0, 2)], all_workers=True)
        self.assert_nothing_held(got[0], 2, listed=True)

    def test_list_workers_shows_the_source(self):
        r = self.client().list_workers()
        self.assertEqual((r.block_size, r.entries), (BLOCK, 0))
        self.assertGreater(r.max_entries, 0)
        self.assertEqual(r.workers, [prefixd.WorkerInfo(
            worker="w0", endpoint=self.endpoint, state=prefixd.WorkerState.CONNECTING,
            state_detail=r.workers[0].state_detail if r.workers else "", mediums={}, events=0,
            gaps=0, replays=0, clears=0, dropped_blocks=0, last_seq=-1, last_event_unix_ms=0)])


class EpochTest(unittest.TestCase):
    def test_epoch_change_calls_back_once(self):
        """A crash (SIGKILL: no snapshot) gives the restarted daemon a new
        epoch; the next response tells the client."""
        d = prefixd_fixture.Daemon(ARGS.prefixd, CONFIG)
        self.addCleanup(d.close)
        d.start()
        changes = []
        c = prefixd.Client(d.unix, on_epoch_change=lambda old, new: changes.append((old, new)),
                           channel_options=prefixd_fixture.FAST_RECONNECT)
        self.addCleanup(c.close)
        c.insert(tokens(0, 1), [1])
        first = c.epoch
        c.match(tokens(0, 1))
        self.assertEqual(changes, [])
        d.kill()
        d.start()  # the same Unix socket path
        m = c.match(tokens(0, 1), timeout=10)
        self.assertEqual(m.matched_tokens, 0)
        self.assertEqual(len(changes), 1)
        self.assertEqual(changes[0][0], first)
        self.assertEqual(changes[0][1], c.epoch)
        self.assertNotEqual(first, c.epoch)
        c.info()
        self.assertEqual(len(changes), 1)
        self.assertEqual(d.stop(), 0)


class RecordingServicer(pb_grpc.PrefixCacheServicer):
    def __init__(self):
        self.calls = []
        self.unblock = threading.Event()

    def Match(self, request, context):
        self.calls.append((dict(context.invocation_metadata()), context.time_remaining()))
        return pb.MatchResponse(epoch=7, matched_tokens=0)

    def GetInfo(self, request, context):
        self.unblock.wait(timeout=30)  # past any client deadline in this test
        return pb.GetInfoResponse(epoch=7)


class MetadataTest(unittest.TestCase):
    """What goes on the wire, seen by a fake server (auth is off in the real
    daemon, which would accept anything)."""

    def setUp(self):
        self.servicer = RecordingServicer()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_PrefixCacheServicer_to_server(self.servicer, server)
        self.target = "127.0.0.1:%d" % server.add_insecure_port("127.0.0.1:0")
        server.start()
        self.addCleanup(server.stop, None)
        self.addCleanup(self.servicer.unblock.set)

    def test_token_tenant_and_deadline_are_sent(self):
        servicer = self.servicer
        c = prefixd.Client(self.target, tenant="acme", token="s3cret", deadline=3.0)
        self.addCleanup(c.close)
        c.match([1, 2, 3])
        c.match([1, 2, 3], timeout=30)
        (md, left), (_, left30) = servicer.calls
        self.assertEqual(md.get("authorization"), "Bearer s3cret")
        self.assertEqual(md.get("x-prefixd-tenant"), "acme")
        self.assertTrue(0 < left <= 3.5, left)  # server clock: a little slack
        self.assertTrue(3.5 < left30 <= 30.5, left30)
        anon = prefixd.Client(self.target)
        self.addCleanup(anon.close)
        anon.match([1])
        self.assertNotIn("authorization", servicer.calls[-1][0])
        self.assertNotIn("x-prefixd-tenant", servicer.calls[-1][0])

    def test_a_call_past_its_deadline_raises_deadline_exceeded(self):
        c = prefixd.Client(self.target, deadline=30.0)
        self.addCleanup(c.close)
        with self.assertRaises(prefixd.DeadlineExceeded) as e:
            c.info(timeout=0.2)
        self.assertEqual(e.exception.method, "GetInfo")


ROUTE = ipb.RouteResponse(
    best_worker="vllm-1", prompt_blocks=4, block_size=16, workers=[
        ipb.WorkerMatch(worker="vllm-1", matched_blocks=3, state=ipb.LIVE, last_seq=1042,
                        lag_ms=12, mediums=[ipb.MediumMatch(medium="GPU", matched_blocks=3),
                                            ipb.MediumMatch(medium="CPU", matched_blocks=1)]),
        ipb.WorkerMatch(worker="vllm-2", state=ipb.WORKER_STATE_UNSPECIFIED, last_seq=-1)])

WORKERS = ipb.ListWorkersResponse(block_size=16, entries=1234, max_entries=50000000, workers=[
    ipb.WorkerInfo(worker="vllm-0", endpoint="tcp://10.0.0.5:5557", state=ipb.LIVE,
                   mediums=[ipb.MediumBlocks(medium="GPU", blocks=120),
                            ipb.MediumBlocks(medium="CPU", blocks=8)],
                   events=5230, gaps=1, replays=1, clears=0, dropped_blocks=2, last_seq=1042,
                   last_event_unix_ms=1735689600000),
    ipb.WorkerInfo(worker="vllm-1", endpoint="tcp://10.0.0.6:5557", state=ipb.ERROR,
                   state_detail="batch 17: unknown event tag", last_seq=-1),
    ipb.WorkerInfo(worker="vllm-9", state=7, last_seq=-1)])  # a state from a newer daemon


class IndexServicer(ipb_grpc.PrefixIndexServicer):
    """Answers ROUTE and WORKERS; an item whose lora_name is "bad" fails."""

    def __init__(self):
        self.requests = []
        self.metadata = []

    def Route(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        self.requests.append(request)
        return ROUTE

    def RouteBatch(self, request, context):
        items = []
        for r in request.requests:
            self.requests.append(r)
            if r.lora_name == "bad":
                items.append(ipb.RouteBatchItem(code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                                message="unknown LoRA adapter 'bad'"))
            else:
                items.append(ipb.RouteBatchItem(code=0, response=ROUTE))
        return ipb.RouteBatchResponse(responses=items)

    def ListWorkers(self, request, context):
        self.metadata.append(dict(context.invocation_metadata()))
        return WORKERS


class IndexFakeTest(unittest.TestCase):
    """What route, route_batch and list_workers send and how they convert
    the answers, seen by a fake PrefixIndex; a server without it is
    Unimplemented."""

    def serve(self, add):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add(server)
        target = "127.0.0.1:%d" % server.add_insecure_port("127.0.0.1:0")
        server.start()
        self.addCleanup(server.stop, None)
        return target

    def setUp(self):
        self.servicer = IndexServicer()
        target = self.serve(lambda s: ipb_grpc.add_PrefixIndexServicer_to_server(self.servicer, s))
        self.c = prefixd.Client(target, tenant="acme", token="s3cret")
        self.addCleanup(self.c.close)

    def test_route_sends_tokens_as_le32_and_the_namespace(self):
        r = self.c.route([1, 2, 0xFFFFFFFF], lora_name="sql", lora_id=7, cache_salt="s",
                         workers=["vllm-1", "vllm-2"])
        (sent,) = self.servicer.requests
        self.assertEqual(list(sent.tokens), [])
        self.assertEqual(sent.tokens_le32, prefixd.tokens_le32([1, 2, 0xFFFFFFFF]))
        self.assertEqual((sent.lora_name, sent.lora_id, sent.cache_salt), ("sql", 7, "s"))
        self.assertEqual(list(sent.workers), ["vllm-1", "vllm-2"])
        md = self.servicer.metadata[0]
        self.assertEqual((md.get("authorization"), md.get("x-prefixd-tenant")),
                         ("Bearer s3cret", "acme"))
        self.assertEqual(r, prefixd.RouteResult(
            workers=[prefixd.WorkerMatch("vllm-1", 3, {"GPU": 3, "CPU": 1},
                                         prefixd.WorkerState.LIVE, 1042, 12),
                     prefixd.WorkerMatch("vllm-2", 0, {}, prefixd.WorkerState.UNSPECIFIED, -1, 0)],
            best_worker="vllm-1", prompt_blocks=4, block_size=16))
        self.assertIs(r.best, r.workers[0])
        state = r.workers[0].state
        self.assertEqual(state, ipb.LIVE)  # the proto's number
        self.assertEqual((state.name, str(state), "%s|%-6s|" % (state, state), f"{state:>5}"),
                         ("LIVE", "LIVE", "LIVE|LIVE  |", " LIVE"))
        self.assertEqual(list(r.workers[0].mediums), ["GPU", "CPU"])  # the daemon's order

    def test_route_defaults_send_no_namespace_and_every_worker(self):
        self.c.route([5])
        self.c.route([5], all_workers=True)
        sent, all_workers = self.servicer.requests
        self.assertEqual((sent.lora_name, sent.lora_id, sent.cache_salt, list(sent.workers),
                          sent.all_workers), ("", 0, "", [], False))
        self.assertTrue(all_workers.all_workers)
        with self.assertRaises(TypeError):  # a lone name, not a list of them
            self.c.route([5], workers="vllm-1")
        with self.assertRaises(OverflowError):
            self.c.route([-1])

    def test_route_batch_returns_each_items_error(self):
        got = self.c.route_batch([[1, 2], prefixd.RouteQuery([3], lora_name="bad"),
                                  prefixd.RouteQuery([4], lora_id=9, workers=["vllm-1"])],
                                 cache_salt="s", workers=["vllm-2"])
        self.assertEqual(len(got), 3)
        self.assertIsInstance(got[0], prefixd.RouteResult)
        self.assertEqual(got[0].best_worker, "vllm-1")
        self.assertIsInstance(got[1], prefixd.InvalidArgument)
        self.assertEqual(got[1].method, "RouteBatch")
        self.assertEqual(got[1].details, "unknown LoRA adapter 'bad'")
        self.assertIsInstance(got[2], prefixd.RouteResult)
        first, bad, third = self.servicer.requests
        # A bare token list takes the call's options; a RouteQuery only its own.
        self.assertEqual((first.tokens_le32, first.cache_salt, list(first.workers)),
                         (prefixd.tokens_le32([1, 2]), "s", ["vllm-2"]))
        self.assertEqual((bad.lora_name, bad.cache_salt, list(bad.workers)), ("bad", "", []))
        self.assertEqual((third.lora_id, list(third.workers)), (9, ["vllm-1"]))

    def test_list_workers_converts_every_field(self):
        r = self.c.list_workers()
        self.assertEqual((r.block_size, r.entries, r.max_entries), (16, 1234, 50000000))
        self.assertEqual([w.worker for w in r.workers], ["vllm-0", "vllm-1", "vllm-9"])
        self.assertEqual(r.workers[0], prefixd.WorkerInfo(
            worker="vllm-0", endpoint="tcp://10.0.0.5:5557", state=prefixd.WorkerState.LIVE,
            state_detail="",
            mediums={"GPU": 120, "CPU": 8}, events=5230, gaps=1, replays=1, clears=0,
            dropped_blocks=2, last_seq=1042, last_event_unix_ms=1735689600000))
        self.assertEqual((r.workers[1].state, r.workers[1].state_detail),
                         (prefixd.WorkerState.ERROR, "batch 17: unknown event tag"))
        self.assertEqual(r.workers[2].state, 7)  # unknown here: the number
        self.assertNotIsInstance(r.workers[2].state, prefixd.WorkerState)
        self.assertEqual(self.servicer.metadata[0].get("x-prefixd-tenant"), "acme")

    def test_a_server_without_the_index_is_unimplemented(self):
        target = self.serve(lambda s: pb_grpc.add_PrefixCacheServicer_to_server(
            pb_grpc.PrefixCacheServicer(), s))
        c = prefixd.Client(target)
        self.addCleanup(c.close)
        with self.assertRaises(prefixd.Unimplemented) as e:
            c.route([1])
        self.assertEqual((e.exception.method, e.exception.code),
                         ("Route", grpc.StatusCode.UNIMPLEMENTED))
        self.assertIsInstance(e.exception, prefixd.PrefixdError)
        with self.assertRaises(prefixd.Unimplemented):
            c.list_workers()


if __name__ == "__main__":
    unittest.main()
