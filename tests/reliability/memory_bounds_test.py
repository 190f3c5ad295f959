#!/usr/bin/python3
"""Memory bounds of the real daemon (docs/operations.md, "Memory bounds"):
what one tenant's traffic can make prefixd hold is bounded by limits the
config names, measured as the daemon's RSS (VmRSS in /proc/PID/status).

- event ring: one tenant alternating two Inserts of 65,536 blocks (each
  evicts the other) appends 1 MiB of events per Insert; the ring is bounded
  by event_ring_bytes, not only by its 4096 events.
- WatchEvents: streams that are never read hold at most one reply of
  limits.watch_reply_bytes each, a tenant opens at most
  limits.max_watch_streams_per_tenant of them (RESOURCE_EXHAUSTED beyond),
  and a reply unread for limits.watch_stall_timeout cancels its stream,
  which frees its memory and its place.
- unauthenticated peers: a call without a valid bearer token is refused
  UNAUTHENTICATED from its metadata, before its body is read, and could
  send only limits.max_bytes_before_auth of it, so peers without a token
  sending 16 MiB requests leave RSS where it was.
- connections: an unauthenticated peer that sends the HTTP/2 preface and
  nothing else is told limits.max_concurrent_streams in the server's
  SETTINGS and is disconnected after limits.max_connection_idle.
- the HTTP listener: 128 peers that open a connection and send nothing
  hold at most its 32 threads for 5 s each; /metrics is answered and
  every such connection closed within 30 s;
- RouteBatch: answers listing every worker of the index stop at
  limits.max_message_size per call, however many items ask;
- snapshot_path: a symlink to /dev/zero or a FIFO there is moved aside at
  start-up without being read or waited on;
- events_publish: a subscriber that never reads holds at most
  events_publish.queue_bytes of batches and is disconnected after
  events_publish.stall_timeout; replay requesters that never read hold
  references to the replay buffer's batches, not copies; the buffer keeps
  at most events_publish.buffer_bytes.
- fleet index decoding: one payload near the 16 MiB message cap (16 M
  one-byte token ids in a group-1 event) costs its 64 MiB of token ids and
  the message, under 10 times its size; 8 sources each sending such
  payloads decode one at a time within index.decode_budget, not all at
  once.
- fleet index attacks: a replay endpoint that never ends its answer is cut
  at 256 MiB; 20,000 data_parallel_rank values from one source, or 50,000
  topics sent to index.listen, make at most 1,024 workers; names past 256 bytes are refused, not kept; engine
  hashes stored past max_entries do not grow their worker's map.

Usage: memory_bounds_test.py --prefixd PATH [--stubs DIR]
           [--decode_budget SIZE]  (the index's, for DecodeMemoryTest; 1PiB
                                    turns it off, to measure without it)
"""

import concurrent.futures
import hashlib
import os
import re
import socket
import struct
import sys
import time
import unittest
import urllib.request

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__, lambda ap: ap.add_argument(
    "--decode_budget", default="", help="index.decode_budget for DecodeMemoryTest"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import load  # noqa: E402
import prefixd_fixture  # noqa: E402
import zmq  # noqa: E402
from prefixd.v1 import prefix_cache_pb2 as pb  # noqa: E402
from prefixd.v1 import prefix_cache_pb2_grpc as pb_grpc  # noqa: E402
from prefixd.v1 import prefix_index_pb2 as ipb  # noqa: E402
from prefixd.v1 import prefix_index_pb2_grpc as ipb_grpc  # noqa: E402

from prefixd import kv_publisher  # noqa: E402  (client/python/prefixd/kv_publisher.py)

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

    def big_inserts(self, stub, n, blocks=65536):
        """n Inserts of `blocks` blocks, each evicting the previous one."""
        for i in range(n):
            base = (i % 2) << 20
            stub.Insert(pb.InsertRequest(tokens=range(base, base + blocks),
                                         block_ids=range(base, base + blocks)), timeout=30)

    def open_unread_streams(self, daemon, n):
        """n WatchEvents streams from the oldest event that nobody reads, on a
        channel whose flow-control windows stay at 64 KiB (no BDP probing), as
        a client that stopped reading leaves them."""
        ch = grpc.insecure_channel(daemon.tcp, options=[("grpc.http2.bdp_probe", 0)])
        self.addCleanup(ch.close)
        stub = pb_grpc.PrefixCacheStub(ch)
        streams = [stub.WatchEvents(pb.WatchEventsRequest(from_sequence=0), timeout=120)
                   for _ in range(n)]
        for s in streams:
            self.addCleanup(s.cancel)
        return streams

    def test_unread_watch_streams_are_bounded_per_stream_and_per_tenant(self):
        daemon = self.start('block_size: 1\nkv_budget: "65536tokens"\n')
        stub = self.stub(daemon)
        self.big_inserts(stub, 2)
        before = rss_kib(daemon.proc.pid)
        self.open_unread_streams(daemon, 24)
        time.sleep(0.5)  # the streams are registered
        refused = stub.WatchEvents(pb.WatchEventsRequest(from_sequence=0), timeout=3)
        with self.assertRaises(grpc.RpcError) as e:
            next(refused)
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                         e.exception.details())
        self.assertIn("tenant 'default' has 8 WatchEvents streams open", e.exception.details())
        self.big_inserts(stub, 12)  # each stream's backlog: all the ring holds
        time.sleep(1)  # the poller fills every stream's reply
        after = rss_kib(daemon.proc.pid)
        print("24 unread streams: RSS %d -> %d KiB" % (before, after))
        self.assertLess(after - before, 40 * MIB,
                        "RSS grew %d KiB with unread WatchEvents streams" % (after - before))

    def test_a_stalled_watch_stream_is_cancelled_and_frees_its_place(self):
        daemon = self.start('block_size: 1\nkv_budget: "65536tokens"\n'
                            'limits { watch_stall_timeout: "1s" }\n')
        stub = self.stub(daemon)
        streams = self.open_unread_streams(daemon, 8)
        # New events all along: once the client's flow-control windows are
        # full, every stream has a reply that cannot be sent.
        stalled = "stalled: a reply of"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and daemon.logs().count(stalled) < 8:
            self.big_inserts(stub, 2)
        self.assertEqual(daemon.logs().count(stalled), 8, daemon.logs()[-2000:])
        self.assertIn("bytes was not read within limits.watch_stall_timeout 1s; cancelled",
                      daemon.logs())
        for s in streams:  # what the client had buffered, then the end
            with self.assertRaises(grpc.RpcError) as e:
                for _ in s:
                    pass
            self.assertEqual(e.exception.code(), grpc.StatusCode.CANCELLED)
        # Their places are free again: a reader that reads gets its events.
        reader = stub.WatchEvents(pb.WatchEventsRequest(from_sequence=0), timeout=10)
        self.assertGreater(len(next(reader).events), 0)
        reader.cancel()

    def test_calls_without_a_token_are_refused_before_their_body_is_read(self):
        token = "tok-" + "x" * 28
        daemon = self.start('auth { mode: TOKEN }\ntenants { name: "t" }\n'
                            'principals { name: "e" role: ENGINE tenants: "*" token_sha256: "%s" }\n'
                            % hashlib.sha256(token.encode()).hexdigest())
        # A valid InsertRequest just under max_message_size (16 MiB): one
        # unknown length-delimited field (number 1000), which the parser keeps.
        size = 16 * 1024 * 1024 - 64
        head = bytes([0xC2, 0x3E])  # tag: field 1000, wire type 2
        n, length = size, b""
        while True:
            length += bytes([(n & 0x7F) | (0x80 if n >> 7 else 0)])
            n >>= 7
            if not n:
                break
        body = head + length + b"\x01" * size
        peers = 32
        before = rss_kib(daemon.proc.pid)

        def unauthenticated(i, target):
            ch = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1)])
            try:
                call = ch.unary_unary("/prefixd.v1.PrefixCache/Insert")
                for _ in range(2):
                    with self.assertRaises(grpc.RpcError) as e:
                        call(body, timeout=30)
                    self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED,
                                     e.exception.details())
            finally:
                ch.close()

        start = time.monotonic()
        targets = [daemon.tcp if i % 2 else daemon.unix for i in range(peers)]
        with concurrent.futures.ThreadPoolExecutor(peers) as pool:
            for f in [pool.submit(unauthenticated, i, t) for i, t in enumerate(targets)]:
                f.result()
        after = rss_kib(daemon.proc.pid)
        print("%d peers without a token, 2 x 16 MiB each: RSS %d -> %d KiB (%.1f s)"
              % (peers, before, after, time.monotonic() - start))
        # At most 64 streams x limits.max_bytes_before_auth (64 KiB) are
        # buffered: measured +0.4 to +0.6 MiB. +110 to +140 MiB while bodies
        # were read before auth; +1 to +30 MiB with 4 MiB stream windows.
        self.assertLess(after - before, 16 * MIB,
                        "RSS grew %d KiB from calls that were never authenticated"
                        % (after - before))
        # A peer with the token still gets served.
        ch = load.channel(daemon.tcp)
        self.addCleanup(ch.close)
        stub = pb_grpc.PrefixCacheStub(ch)
        md = [("authorization", "Bearer " + token), ("x-prefixd-tenant", "t")]
        stub.Insert(pb.InsertRequest(tokens=range(64), block_ids=range(4)), metadata=md,
                    timeout=10)
        self.assertGreater(stub.Match(pb.MatchRequest(tokens=range(64)), metadata=md,
                                      timeout=10).matched_tokens, 0)

    def test_an_idle_connection_is_closed_and_told_the_stream_limit(self):
        daemon = self.start('auth { mode: TOKEN }\n'
                            'principals { name: "p" role: ADMIN token_sha256: "%s" }\n'
                            'limits { max_concurrent_streams: 16 max_connection_idle: "1s" }\n'
                            % ("ab" * 32))
        host, port = daemon.tcp.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            start = time.monotonic()
            received = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                received += chunk
            idle_for = time.monotonic() - start
        frames, pos = [], 0  # (type, payload) of each HTTP/2 frame
        while pos + 9 <= len(received):
            length = int.from_bytes(received[pos:pos + 3], "big")
            frames.append((received[pos + 3], received[pos + 9:pos + 9 + length]))
            pos += 9 + length
        # The server's first frame is its SETTINGS (type 4): 6-byte (id,
        # value) pairs; id 3 is SETTINGS_MAX_CONCURRENT_STREAMS.
        self.assertEqual(frames[0][0], 4, frames[:2])
        payload = frames[0][1]
        settings = dict(struct.unpack(">HI", payload[i:i + 6]) for i in range(0, len(payload), 6))
        self.assertEqual(settings.get(3), 16, settings)
        self.assertIn(7, [t for t, _ in frames], "no GOAWAY (type 7) before the close")
        self.assertGreaterEqual(idle_for, 0.5)
        self.assertLess(idle_for, 8, "the idle connection stayed open %.1f s" % idle_for)


class EventsPublishMemoryTest(unittest.TestCase):
    """What peers of events_publish that stop reading cost the daemon."""

    CONFIG = ('block_size: 16\nkv_budget: "8192tokens"\nmodel { preset: "llama-3-8b" }\n'
              'events_publish { endpoint: "tcp://127.0.0.1:*" replay_endpoint: "tcp://127.0.0.1:*"'
              ' topic: "kv@attack@m" buffer_bytes: "16MiB" queue_bytes: "1MiB"'
              ' stall_timeout: "%s" }\n')

    def start(self, stall="30s"):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        daemon = prefixd_fixture.Daemon(ARGS.prefixd, self.CONFIG % stall, snapshot=False)
        self.addCleanup(daemon.close)
        daemon.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pub = re.search(r"events pub\s+(\S+)", daemon.logs())
            replay = re.search(r"events replay\s+(\S+)", daemon.logs())
            if pub and replay:
                break
            time.sleep(0.02)
        self.assertTrue(pub and replay, daemon.logs())
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, 0)
        ch = load.channel(daemon.tcp)
        self.addCleanup(ch.close)
        self.stub = pb_grpc.PrefixCacheStub(ch)
        self.inserts = 0
        return daemon, pub.group(1), replay.group(1)

    def traffic(self, seconds):
        """Inserts of 4,096 tokens (a 20 KB stored event each, its evictions
        removals) for `seconds`."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            base = (self.inserts % 64) * 8192
            self.stub.Insert(pb.InsertRequest(tokens=range(base, base + 4096),
                                              block_ids=range(base, base + 256)), timeout=30)
            self.inserts += 1

    def stuck(self, kind, endpoint):
        """A peer that never reads: a queue of 1 and a 4 KiB kernel buffer."""
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.RCVHWM, 1)
        s.setsockopt(zmq.RCVBUF, 4096)
        s.setsockopt(zmq.LINGER, 0)
        if kind == zmq.SUB:
            s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(endpoint)
        return s

    def test_the_replay_buffer_keeps_buffer_bytes(self):
        daemon, _, _ = self.start()
        before = rss_kib(daemon.proc.pid)
        self.traffic(10)
        after = rss_kib(daemon.proc.pid)
        print("the replay buffer, %d Inserts: RSS %d -> %d KiB"
              % (self.inserts, before, after))
        # buffer_bytes (16 MiB) and malloc's slack. Bounded by 10,000
        # batches only (and a batch by 65,536 tokens) it was +687 MiB in 25 s.
        self.assertLess(after - before, 40 * MIB)

    def test_a_subscriber_that_never_reads_holds_its_queue_until_it_stalls(self):
        daemon, pub, _ = self.start(stall="3s")
        self.traffic(3)  # the replay buffer full (16 MiB)
        before = rss_kib(daemon.proc.pid)
        port = int(pub.rsplit(":", 1)[1])
        sub = self.stuck(zmq.SUB, pub)
        self.addCleanup(sub.close)  # open, never read, until the test ends
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not established(port):
            time.sleep(0.01)
        self.assertEqual(established(port), 1, "the subscriber did not connect to %s" % pub)
        self.traffic(10)
        after = rss_kib(daemon.proc.pid)
        print("a subscriber that never reads, %d Inserts: RSS %d -> %d KiB"
              % (self.inserts, before, after))
        # queue_bytes (1 MiB) of batches, and malloc's slack: measured +0.2
        # to +1.9 MiB. Before the bounds (a queue of 100,000 copied
        # batches, a buffer of 10,000) the same run was +616 MiB.
        self.assertLess(after - before, 24 * MIB,
                        "RSS grew %d KiB for one subscriber that never reads"
                        % (after - before))
        # The daemon's kernel ended the connection once nothing was read for
        # 3 s (TCP_USER_TIMEOUT; it sends the peer nothing), which freed
        # its queue.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and established(port):
            time.sleep(0.1)
        self.assertEqual(established(port), 0, "the stuck subscriber is still connected")

    def test_replay_requesters_that_never_read_share_the_buffer(self):
        daemon, _, replay = self.start()
        self.traffic(3)  # the replay buffer full (16 MiB)
        before = rss_kib(daemon.proc.pid)
        requesters = []
        for _ in range(8):  # each asks for all the buffer holds
            r = self.stuck(zmq.DEALER, replay)
            r.send_multipart([b"", (0).to_bytes(8, "big")])
            requesters.append(r)
        # The replay thread takes the requests in turn and gives each 2 s to
        # make room; a requester that reads, asking once all 8 were taken,
        # gets its whole replay after them.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and scrape_value(
                daemon, "prefixd_events_replay_requests_total") < 8:
            time.sleep(0.05)
        reader = self.ctx.socket(zmq.DEALER)
        reader.setsockopt(zmq.LINGER, 0)
        reader.setsockopt(zmq.RCVTIMEO, 30000)
        reader.connect(replay)
        reader.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed = 0
        while reader.recv_multipart()[1] != b"\xff" * 8:
            replayed += 1
        after = rss_kib(daemon.proc.pid)
        self.assertGreater(replayed, 100)
        print("8 replay requesters that never read: RSS %d -> %d KiB" % (before, after))
        # References to the buffer's batches, not copies: measured +0.3 to
        # +5.4 MiB. With a copy per requester (and a buffer of 10,000
        # batches) the same run was +770 MiB.
        self.assertLess(after - before, 16 * MIB,
                        "RSS grew %d KiB for 8 replay requesters that never read"
                        % (after - before))



class ListenerMemoryTest(unittest.TestCase):
    """What peers of the HTTP listener and callers of Route cost."""

    def start(self, config="", snapshot=False, before_start=None):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=snapshot)
        self.addCleanup(daemon.close)
        if before_start is not None:
            before_start(daemon)
        daemon.start()
        return daemon

    def test_idle_http_connections_hold_the_listener_briefly(self):
        daemon = self.start()
        host, port = daemon.metrics.rsplit(":", 1)
        before = rss_kib(daemon.proc.pid)
        start = time.monotonic()
        # 32 served, 32 waiting for a thread, 64 in the kernel's backlog.
        idle = [socket.create_connection((host, int(port)), timeout=60) for _ in range(128)]
        for s in idle:
            self.addCleanup(s.close)
        opened = rss_kib(daemon.proc.pid)
        with urllib.request.urlopen("http://%s/metrics" % daemon.metrics, timeout=60) as r:
            self.assertIn(b"prefixd_cached_blocks", r.read())
        answered = time.monotonic() - start
        for s in idle:
            self.assertEqual(s.recv(1), b"")  # closed by the server
        closed = time.monotonic() - start
        print("128 idle HTTP connections: RSS %d -> %d KiB, /metrics after %.1f s, "
              "all closed after %.1f s" % (before, opened, answered, closed))
        # Four rounds of 32 connections x 5 s at most. With 2 threads and
        # civetweb's 30 s it was 64 rounds of 30 s.
        self.assertLess(answered, 30)
        self.assertLess(closed, 30)
        self.assertLess(opened - before, 16 * MIB)

    def test_route_batch_answers_stop_at_max_message_size(self):
        port = prefixd_fixture.free_port()
        daemon = self.start('index { block_size: 16 listen: "tcp://127.0.0.1:%d" }\n' % port)
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, 0)
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        self.addCleanup(pub.close)
        pub.connect("tcp://127.0.0.1:%d" % port)
        tokens = list(range(1000, 1016))
        payload = kv_publisher.encode_batch(
            [kv_publisher.block_stored([7], None, tokens, 16)], "map")
        ch = load.channel(daemon.tcp)
        self.addCleanup(ch.close)
        index = ipb_grpc.PrefixIndexStub(ch)
        workers = 200
        deadline = time.monotonic() + 30  # until the SUB has subscribed
        while time.monotonic() < deadline and len(
                index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers) < workers:
            for w in range(workers):
                pub.send_multipart([b"kv@w%d@m" % w, (0).to_bytes(8, "big"), payload])
            time.sleep(0.05)
        listed = index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers
        self.assertEqual(len(listed), workers)
        item = ipb.RouteRequest(tokens=tokens)
        one = index.Route(item, timeout=10)
        self.assertEqual(len(one.workers), workers)
        self.assertEqual(one.workers[0].matched_blocks, 1)
        batch = ipb.RouteBatchRequest(requests=[item] * 16384)
        before = rss_kib(daemon.proc.pid)

        def route_batch(_):
            with self.assertRaises(grpc.RpcError) as e:
                index.RouteBatch(batch, timeout=60)
            return e.exception

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            errors = list(pool.map(route_batch, range(2)))
        after = rss_kib(daemon.proc.pid)
        print("2 RouteBatch calls of 16,384 items x %d workers: RSS %d -> %d KiB"
              % (workers, before, after))
        for e in errors:
            self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
            self.assertIn("past limits.max_message_size 16777216 bytes", e.details())
        # Two answers stopped once their objects take 16 MiB (their wire
        # size is less), with the requests and malloc's slack: measured +24
        # to +47 MiB. Unbounded, the two calls were +1,275 MiB (answers of
        # 77 MB on the wire each).
        self.assertLess(after - before, 96 * MIB)

    def test_special_files_at_snapshot_path_are_not_read(self):
        for name, make in (("symlink", lambda p: os.symlink("/dev/zero", p)),
                           ("fifo", os.mkfifo)):
            with self.subTest(name):
                start = time.monotonic()
                daemon = self.start(snapshot=True, before_start=lambda d: make(
                    os.path.join(d.tmp, "snapshot.bin")))
                rss = rss_kib(daemon.proc.pid)
                print("%s at snapshot_path: serving after %.1f s, RSS %d KiB"
                      % (name, time.monotonic() - start, rss))
                self.assertIn("snapshot %s is unusable" % os.path.join(daemon.tmp, "snapshot.bin"),
                              daemon.logs())
                self.assertLess(rss, 128 * MIB)
                daemon.stop()


class DecodeMemoryTest(unittest.TestCase):
    """What sources sending the largest payloads cost the index's decoding."""

    SOURCES = 8
    ROUNDS = 3
    BACK_TO_BACK = 32

    @staticmethod
    def payload(tokens):
        """[ts, [a BlockStored of block 1001 (tokens 1..16), a BlockStored of
        group 1 (never declared: dropped after decoding) with `tokens` token
        ids of one byte each]], packed by hand: a list of 16 M ints would
        take the test longer than the daemon."""
        import msgpack
        small = ["BlockStored", [1001], None, list(range(1, 17)), 16, None, "GPU"]
        return b"".join([
            b"\x92", msgpack.packb(1.7e9), b"\x92", msgpack.packb(small),
            b"\x9a", msgpack.packb("BlockStored"), msgpack.packb([7]), msgpack.packb(None),
            b"\xdd", struct.pack(">I", tokens), b"\x01" * tokens,
            msgpack.packb(tokens), msgpack.packb(None), msgpack.packb("GPU"),
            msgpack.packb(None), msgpack.packb(None), msgpack.packb(1)])

    @staticmethod
    def applied(index, seq, sources):
        workers = index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers
        return len(workers) == sources and all(w.last_seq >= seq for w in workers)

    def start(self, sources):
        """A daemon whose index has `sources` sources, each a PUB socket here
        whose first small payload was applied: (PUB sockets, index stub,
        daemon)."""
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, 0)
        pubs = []
        for _ in range(sources):
            pub = ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.LINGER, 0)
            pub.bind("tcp://127.0.0.1:*")
            self.addCleanup(pub.close)
            pubs.append(pub)
        config = "index {\n%s%s}\n" % (
            "".join('  sources { name: "s%d" endpoint: "%s" }\n'
                    % (i, p.getsockopt(zmq.LAST_ENDPOINT).decode()) for i, p in enumerate(pubs)),
            '  decode_budget: "%s"\n' % ARGS.decode_budget if ARGS.decode_budget else "")
        daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False)
        self.addCleanup(daemon.close)
        daemon.start()
        ch = load.channel(daemon.tcp)
        self.addCleanup(ch.close)
        index = ipb_grpc.PrefixIndexStub(ch)
        small = self.payload(16)
        deadline = time.monotonic() + 30  # until every SUB has subscribed
        while time.monotonic() < deadline and not self.applied(index, 0, sources):
            for p in pubs:
                p.send_multipart([b"", (0).to_bytes(8, "big"), small])
            time.sleep(0.05)
        self.assertTrue(self.applied(index, 0, sources))
        return pubs, index, daemon

    def test_one_payload_decodes_near_the_size_of_what_it_holds(self):
        """16 M one-byte token ids decode straight into their 64 MiB vector
        (4 bytes a token), not through an object tree of 24 bytes a token
        first (a decoder that did took 28 times the payload, +448 MiB)."""
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        pubs, index, daemon = self.start(1)
        big = self.payload(16 * 1024 * 1024 - 1024)
        before = rss_kib(daemon.proc.pid)
        pubs[0].send_multipart([b"", (1).to_bytes(8, "big"), big])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self.applied(index, 1, 1):
            time.sleep(0.05)
        self.assertTrue(self.applied(index, 1, 1), "the payload was not applied")
        peak = hwm_kib(daemon.proc.pid)
        print("1 payload of %d bytes: RSS %d KiB before, peak %d KiB (+%d KiB)"
              % (len(big), before, peak, peak - before))
        # Under 10 times the payload: the token ids (64 MiB) and the message.
        self.assertLess(peak - before, 160 * MIB,
                        "decoding one payload of %d bytes grew RSS by %d KiB"
                        % (len(big), peak - before))

    def test_a_payload_denser_than_its_allowance_is_refused_within_it(self):
        """A 16 MiB payload of 9-byte ["cleared"] events asks for 376 bytes
        an event: 43 times its size, +683 MiB before the decoder counted
        what it allocates. It is refused once its batch holds 24 times the
        payload (index/decode_budget.h), its worker says why, and the
        daemon goes on."""
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        import msgpack
        pubs, index, daemon = self.start(1)
        n = (16 * 1024 * 1024 - 64) // 9
        dense = b"".join([b"\x92", msgpack.packb(1.7e9), b"\xdd", struct.pack(">I", n),
                          b"\x91\xa7cleared" * n])
        before = rss_kib(daemon.proc.pid)
        pubs[0].send_multipart([b"", (1).to_bytes(8, "big"), dense])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self.applied(index, 1, 1):
            time.sleep(0.05)
        peak = hwm_kib(daemon.proc.pid)
        print("1 payload of %d cleared events (%d bytes): RSS %d KiB before, peak %d KiB "
              "(+%d KiB)" % (n, len(dense), before, peak, peak - before))
        (w,) = index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers
        self.assertEqual(w.last_seq, 1, "the payload was not taken")
        self.assertIn("refused as too dense", w.state_detail)
        self.assertIn("%d-byte payload" % len(dense), w.state_detail)
        # The allowance (384 MiB) and the message (16 MiB), not 683 MiB.
        self.assertLess(peak - before, 448 * MIB,
                        "a payload of %d cleared events grew RSS by %d KiB"
                        % (n, peak - before))
        # The next batch is decoded and applied as ever.
        pubs[0].send_multipart([b"", (2).to_bytes(8, "big"), self.payload(16)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.applied(index, 2, 1):
            time.sleep(0.05)
        (w,) = index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers
        self.assertEqual(w.last_seq, 2)
        self.assertEqual(w.state, ipb.LIVE, w.state_detail)

    def test_a_source_sending_faster_than_the_index_decodes_is_held_back(self):
        """A source that sends its largest payloads back to back, faster
        than the index decodes them, is held back by the index's receive
        queue (kReceiveQueueMessages per peer: ZeroMQ stops reading the
        connection, the publisher's own send queue keeps the rest): none is
        lost, and the daemon holds a few of them at a time (+144 MiB). With
        the 100,000 messages its ZeroMQ queue held before, the same 32 took
        +496 MiB, and more payloads took more."""
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        pubs, index, daemon = self.start(1)
        big = self.payload(16 * 1024 * 1024 - 1024)
        before = rss_kib(daemon.proc.pid)
        start = time.monotonic()
        for seq in range(1, self.BACK_TO_BACK + 1):
            pubs[0].send_multipart([b"", seq.to_bytes(8, "big"), big])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self.applied(index, self.BACK_TO_BACK, 1):
            time.sleep(0.05)
        peak = hwm_kib(daemon.proc.pid)
        print("%d payloads of %d bytes back to back: RSS %d KiB before, peak %d KiB "
              "(+%d KiB), %.1f s" % (self.BACK_TO_BACK, len(big), before, peak,
                                     peak - before, time.monotonic() - start))
        (w,) = index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers
        self.assertEqual(w.last_seq, self.BACK_TO_BACK, "not every payload was applied")
        self.assertEqual(w.state, ipb.LIVE, w.state_detail)
        self.assertEqual(w.gaps, 0, "payloads were lost on the way")
        # The payload decoding (+80 MiB, as above) and at most
        # kReceiveQueueMessages (4) waiting, 64 MiB.
        self.assertLess(peak - before, 224 * MIB,
                        "%d payloads sent back to back grew RSS by %d KiB"
                        % (self.BACK_TO_BACK, peak - before))

    def test_sources_decoding_the_largest_payloads_share_one_budget(self):
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        pubs, index, daemon = self.start(self.SOURCES)
        big = self.payload(16 * 1024 * 1024 - 1024)
        before = rss_kib(daemon.proc.pid)
        start = time.monotonic()
        # One payload per source at a time, so that the 8 decodes compete
        # for the budget (one source's back-to-back payloads: above).
        for seq in range(1, self.ROUNDS + 1):
            for p in pubs:
                p.send_multipart([b"", seq.to_bytes(8, "big"), big])
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not self.applied(index, seq, self.SOURCES):
                time.sleep(0.05)
            self.assertTrue(self.applied(index, seq, self.SOURCES),
                            "round %d was not applied" % seq)
        peak = hwm_kib(daemon.proc.pid)
        print("%d sources x %d payloads of %d bytes: RSS %d KiB before, peak %d KiB "
              "(+%d KiB), %.1f s" % (self.SOURCES, self.ROUNDS, len(big), before, peak,
                                     peak - before, time.monotonic() - start))
        for w in index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers:
            self.assertEqual(w.last_seq, self.ROUNDS)
            self.assertEqual(w.state, ipb.LIVE, w.state_detail)
        route = index.Route(ipb.RouteRequest(tokens=range(1, 17)), timeout=10)
        self.assertEqual(sorted((w.worker, w.matched_blocks) for w in route.workers),
                         [("s%d" % i, 1) for i in range(self.SOURCES)])
        # One decode at a time (each reserves 24 x 16 MiB, and two pass the
        # 512 MiB budget): its peak (4 x the payload, 64 MiB) and the
        # payloads waiting in the sockets' queues. All 8 at once, without
        # the budget, take about 640 MiB.
        self.assertLess(peak - before, 384 * MIB,
                        "decoding %d sources' payloads grew RSS by %d KiB"
                        % (self.SOURCES, peak - before))


class IndexAttackMemoryTest(unittest.TestCase):
    """What a hostile or broken engine can make the fleet index hold:
    a replay that never ends, more workers than the index follows, names
    it does not keep, and more engine hashes than max_entries blocks."""

    def start(self, index_config):
        """A daemon whose index has one source, a PUB socket (and a ROUTER
        replay socket) here, whose first batch was applied: (PUB, ROUTER,
        index stub, daemon)."""
        if not ARGS.prefixd:
            self.skipTest("--prefixd not given")
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, 0)
        pub = ctx.socket(zmq.PUB)
        router = ctx.socket(zmq.ROUTER)
        for sock in (pub, router):
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind("tcp://127.0.0.1:*")
            self.addCleanup(sock.close)
        config = ('index {\n  block_size: 16\n%s  sources { name: "s0" endpoint: "%s" '
                  'replay_endpoint: "%s" }\n}\n'
                  % (index_config, pub.getsockopt(zmq.LAST_ENDPOINT).decode(),
                     router.getsockopt(zmq.LAST_ENDPOINT).decode()))
        daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False)
        self.addCleanup(daemon.close)
        daemon.start()
        ch = load.channel(daemon.tcp)
        self.addCleanup(ch.close)
        index = ipb_grpc.PrefixIndexStub(ch)
        first = stored_batch([1], list(range(1, 17)))
        deadline = time.monotonic() + 30  # until the SUB has subscribed
        while time.monotonic() < deadline and not workers_at(index, 0):
            pub.send_multipart([b"", (0).to_bytes(8, "big"), first])
            time.sleep(0.05)
        self.assertTrue(workers_at(index, 0))
        return pub, router, index, daemon

    def test_a_replay_that_never_ends_is_cut_at_max_replay_bytes(self):
        """A replay endpoint that answers with 16 MiB batches and no end
        marker: the replay fails once it brought more than
        index.max_replay_bytes (256 MiB), and the daemon held about that
        much. Before the replay had a bound, such an endpoint cost +2.4 to
        2.9 GiB per replay."""
        # A replay_timeout long enough for the test to send 256 MiB.
        pub, router, index, daemon = self.start('  replay_timeout: "60s"\n')
        router.setsockopt(zmq.SNDHWM, 4)
        router.setsockopt(zmq.SNDTIMEO, 1000)
        payload = b"\x00" * (16 * 1024 * 1024 - 1024)
        before = rss_kib(daemon.proc.pid)
        pub.send_multipart([b"", (5).to_bytes(8, "big"), stored_batch([2], list(range(17, 33)))])
        self.assertTrue(router.poll(30000), "no replay request came")
        client, _, start = router.recv_multipart()
        self.assertEqual(int.from_bytes(start, "big"), 1)
        sent = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sent < 64:
            try:
                router.send_multipart([client, b"", (1 + sent).to_bytes(8, "big"), payload])
                sent += 1
            except zmq.Again:  # the daemon stopped reading: it gave up
                break
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "268435456 bytes" not in worker(index).last_error:
            time.sleep(0.05)
        peak = hwm_kib(daemon.proc.pid)
        after = rss_kib(daemon.proc.pid)
        print("a replay endpoint sending %d batches of %d bytes and no end: RSS %d KiB "
              "before, peak %d KiB (+%d KiB), %d KiB after" % (sent, len(payload), before, peak,
                                                               peak - before, after))
        self.assertIn("brought more than 100000 batches or 268435456 bytes",
                      worker(index).last_error)
        # 256 MiB of batches kept, the one that passed it, and the 4 the
        # socket queues.
        self.assertLess(peak - before, 384 * MIB)

    def test_workers_past_the_limits_are_not_followed(self):
        """20,000 data_parallel_rank values from one source: ranks of 1,024
        and above are not followed, so at most 1,024 workers, and the
        daemon's RSS, /metrics and Route answers stay small. Before the
        limits 20,000 ranks or 50,000 listen topics made as many workers:
        Route's median 0.16 -> 31.6 ms, /metrics 47 kB -> 65.6 MB."""
        pub, _, index, daemon = self.start("")
        before = rss_kib(daemon.proc.pid)
        tokens = list(range(1, 17))
        ranks = 20000
        send_paced(pub, ([b"", (1 + rank).to_bytes(8, "big"),
                          stored_batch([1], tokens, data_parallel_rank=rank)]
                         for rank in range(ranks)))
        workers, after, metrics = settled(index, daemon, 1024)
        route = index.Route(ipb.RouteRequest(tokens=tokens, all_workers=True), timeout=10)
        print("%d ranks from one source: %d workers, RSS %d -> %d KiB, /metrics %d bytes, "
              "a Route listing every worker %d bytes" % (ranks, len(workers), before, after,
                                                         metrics, route.ByteSize()))
        self.assertEqual(len(workers), 1024)
        self.assertEqual(len(route.workers), 1024)
        self.assertLess(after - before, 64 * MIB)
        self.assertLess(metrics, 8 * 1024 * 1024)

    def test_listen_topics_past_the_limit_are_not_followed(self):
        """50,000 topics sent to index.listen within a few seconds: 1,024
        listen workers at most (a new topic takes the place of one silent
        for 10 minutes), with the source's own worker 1,025."""
        port = prefixd_fixture.free_port()
        _, _, index, daemon = self.start('  listen: "tcp://127.0.0.1:%d"\n' % port)
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, 0)
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        self.addCleanup(pub.close)
        pub.connect("tcp://127.0.0.1:%d" % port)
        payload = stored_batch([1], list(range(1, 17)))
        deadline = time.monotonic() + 30  # until the SUB has subscribed
        while time.monotonic() < deadline and len(
                index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers) < 2:
            pub.send_multipart([b"kv@t0@m", (0).to_bytes(8, "big"), payload])
            time.sleep(0.05)
        before = rss_kib(daemon.proc.pid)
        topics = 50000
        send_paced(pub, ([b"kv@t%d@m" % t, (0).to_bytes(8, "big"), payload]
                         for t in range(topics)))
        workers, after, metrics = settled(index, daemon, 1025)
        print("%d listen topics: %d workers, RSS %d -> %d KiB, /metrics %d bytes"
              % (topics, len(workers), before, after, metrics))
        self.assertEqual(len(workers), 1025)
        self.assertLess(after - before, 64 * MIB)
        self.assertLess(metrics, 8 * 1024 * 1024)

    def test_long_names_and_restored_hashes_are_not_kept(self):
        """64 stores whose medium is a 16 MiB name (names past 256 bytes
        are refused, nothing of them kept; 64 such names used to keep
        +1 GiB), then 3,000,000 engine hashes stored in turn into an index
        of max_entries 100,000 (each worker's map of engine hashes is swept
        of those max_entries dropped; it kept every one, +134 MiB)."""
        pub, _, index, daemon = self.start("  max_entries: 100000\n")
        before = rss_kib(daemon.proc.pid)
        seq = 1
        long_name = "m" * (16 * 1024 * 1024 - 4096)
        for k in range(64):
            pub.send_multipart([b"", seq.to_bytes(8, "big"),
                                stored_batch([10 + k], list(range(1, 17)), medium=long_name)])
            seq += 1
            wait_for_seq(self, index, seq - 1)
            if k == 15:
                named16 = rss_kib(daemon.proc.pid)
        named = rss_kib(daemon.proc.pid)
        self.assertIn("medium is %d bytes, more than 256" % len(long_name),
                      worker(index).last_error)
        per_batch = 1000
        for b in range(3000):
            first = 1000000 + b * per_batch
            pub.send_multipart([b"", seq.to_bytes(8, "big"), stored_batch(
                range(first, first + per_batch), [b % 50000] * (16 * per_batch))])
            seq += 1
            if b % 100 == 99:
                wait_for_seq(self, index, seq - 1)
        wait_for_seq(self, index, seq - 1)
        after = rss_kib(daemon.proc.pid)
        w = worker(index)
        print("stores naming a %d-byte medium: RSS %d KiB before, %d after 16, %d after 64; "
              "then 3,000,000 hashes into max_entries 100,000: %d KiB (%d dropped)"
              % (len(long_name), before, named16, named, after, w.dropped_blocks))
        self.assertEqual(w.gaps, 0)
        self.assertEqual(w.dropped_blocks, 3000000 - 100000)
        # The messages in flight (16 MiB each) and malloc's slack, the same
        # after 16 names as after 64.
        self.assertLess(named - before, 48 * MIB)
        self.assertLess(named - named16, 8 * MIB)
        # 100,000 entries of about 100 bytes, the worker's map of at most
        # about twice their hashes, and malloc's slack.
        self.assertLess(after - named, 64 * MIB)


def send_paced(pub, messages):
    """Sends each multipart message, pausing every 500: a PUB socket drops
    what its subscriber's queue has no room for."""
    for i, message in enumerate(messages):
        pub.send_multipart(message)
        if i % 500 == 499:
            time.sleep(0.05)


def settled(index, daemon, expected):
    """Once the index lists `expected` workers (or after 60 s), and 1 s more
    for any past it: (the workers listed, RSS KiB, bytes of /metrics)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(
            index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers) < expected:
        time.sleep(0.1)
    time.sleep(1)  # the rest, had any more been followed
    workers = index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers
    rss = rss_kib(daemon.proc.pid)
    with urllib.request.urlopen("http://%s/metrics" % daemon.metrics, timeout=10) as r:
        return workers, rss, len(r.read())


def stored_batch(hashes, tokens, medium="GPU", data_parallel_rank=None):
    """One BlockStored of `hashes` at the root, array form."""
    ev = kv_publisher.block_stored(hashes, None, tokens, 16, medium=medium)
    return kv_publisher.encode_batch([ev], "array", data_parallel_rank=data_parallel_rank)


def worker(index):
    (w,) = index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers
    return w


def workers_at(index, seq):
    workers = index.ListWorkers(ipb.ListWorkersRequest(), timeout=10).workers
    return len(workers) == 1 and workers[0].last_seq >= seq


def wait_for_seq(test, index, seq):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not workers_at(index, seq):
        time.sleep(0.02)
    test.assertTrue(workers_at(index, seq), "batch %d was not applied" % seq)


def hwm_kib(pid):
    """The process's peak RSS (VmHWM), KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM for pid %d" % pid)


def scrape_value(daemon, family):
    """The value of an unlabelled family on the daemon's /metrics."""
    with urllib.request.urlopen("http://%s/metrics" % daemon.metrics, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(family + " "):
                return float(line.split()[1])
    return 0.0


def established(port):
    """TCP connections in state ESTABLISHED whose local port is `port`."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    n += 1
    return n


if __name__ == "__main__":
    unittest.main()
