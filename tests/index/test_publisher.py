#!/usr/bin/python3
"""Self-tests of the fleet index's test drivers, no daemon needed:
kv_publisher (the vLLM/SGLang wire: PUB frames, both msgpack encodings,
hash kinds, replay over a ROUTER, drops, restarts, raw payloads, XPUB
subscriber detection) and engine_pool (eviction order, the events it
publishes, cached_prefix_blocks on hand-made examples), and the two
together: a small reference index rebuilt from what a SUB socket receives
equals the pool's ground truth on a Mooncake trace.

Usage: /usr/bin/python3 tests/index/test_publisher.py [-v] [unittest args]
(Debian's python3 with python3-zmq and python3-msgpack; pytest is not
needed.)
"""

import hashlib
import os
import random
import sys
import time
import unittest

import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "client", "python"))
from prefixd import engine_pool as ep  # noqa: E402
from prefixd import kv_publisher as kp  # noqa: E402

RECV_MS = 5000
H = [hashlib.sha256(b"block %d" % i).digest() for i in range(16)]  # 32-byte engine hashes


def u64(h):
    return int.from_bytes(h[:8], "big")


class ZmqTestCase(unittest.TestCase):
    def setUp(self):
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, 0)
        self._socks = []

    def tearDown(self):
        for s in self._socks:
            s.close(0)

    def sock(self, kind):
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, RECV_MS)
        self._socks.append(s)
        return s

    def publisher(self, **kw):
        kw.setdefault("context", self.ctx)
        p = kp.Publisher(**kw)
        self.addCleanup(p.close)
        return p

    def subscribe(self, pub, topic=b""):
        """A SUB connected to pub, with its subscription registered."""
        sub = self.sock(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, topic)
        sub.connect(pub.endpoint)
        self.assertTrue(pub.wait_for_subscriber(5), "no subscription reached the XPUB")
        return sub

    def dealer(self, pub):
        d = self.sock(zmq.DEALER)
        d.connect(pub.replay_endpoint)
        return d

    def replay(self, dealer, start):
        """[(seq, payload)] answered to a replay from `start`, end marker excluded."""
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            frames = dealer.recv_multipart()
            self.assertEqual(len(frames), 3, frames)
            self.assertEqual(frames[0], b"")
            if frames[1] == kp.END_SEQ:
                self.assertEqual(frames[2], b"")
                return out
            out.append((int.from_bytes(frames[1], "big"), frames[2]))

    def recv(self, sub):
        topic, seq, payload = sub.recv_multipart()
        self.assertEqual(len(seq), 8)
        return topic, int.from_bytes(seq, "big"), kp.decode_batch(payload)


class EncodingTest(ZmqTestCase):
    def events(self):
        return [kp.block_stored([H[0], H[1]], None, list(range(32)), 16),
                kp.block_stored([H[2]], H[1], list(range(32, 48)), 16, lora_id=3,
                                lora_name="ad", extra_keys=[("ad",)]),
                kp.block_removed([H[0]]),
                kp.block_removed([H[1]], medium=None, group_idx=1),
                kp.all_blocks_cleared()]

    def test_array_encoding(self):
        pub = self.publisher(encoding="array", hash_kind="int", topic="kv")
        sub = self.subscribe(pub)
        self.assertEqual(pub.publish(self.events(), ts=12.5), 0)
        topic, seq, batch = self.recv(sub)
        self.assertEqual((topic, seq), (b"kv", 0))
        self.assertEqual(batch, [12.5, [
            ["BlockStored", [u64(H[0]), u64(H[1])], None, list(range(32)), 16, None, "GPU"],
            ["BlockStored", [u64(H[2])], u64(H[1]), list(range(32, 48)), 16, 3, "GPU", "ad",
             [["ad"]]],
            ["BlockRemoved", [u64(H[0])], "GPU"],
            ["BlockRemoved", [u64(H[1])], None, 1],
            ["AllBlocksCleared"]]])

    def test_array_batch_with_dp_rank_and_trailing_fields(self):
        pub = self.publisher(encoding="array", data_parallel_rank=0)
        sub = self.subscribe(pub)
        pub.publish([kp.block_stored([7], None, [1] * 16, 16, extra_keys=[("salt",)]),
                     kp.block_stored([8], 7, [2] * 16, 16, group_idx=2)], ts=1.0)
        _, _, batch = self.recv(sub)
        self.assertEqual(batch, [1.0, [
            ["BlockStored", [7], None, [1] * 16, 16, None, "GPU", None, [["salt"]]],
            ["BlockStored", [8], 7, [2] * 16, 16, None, "GPU", None, None, 2]], 0])

    def test_map_encoding(self):
        pub = self.publisher(encoding="map", hash_kind="bytes")
        sub = self.subscribe(pub)
        pub.publish(self.events(), ts=3.25)
        _, seq, batch = self.recv(sub)
        self.assertEqual(seq, 0)
        self.assertEqual(batch, {"ts": 3.25, "events": [
            {"type": "BlockStored", "block_hashes": [H[0], H[1]], "parent_block_hash": None,
             "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU",
             "lora_name": None},
            {"type": "BlockStored", "block_hashes": [H[2]], "parent_block_hash": H[1],
             "token_ids": list(range(32, 48)), "block_size": 16, "lora_id": 3, "medium": "GPU",
             "lora_name": "ad", "extra_keys": [["ad"]]},
            {"type": "BlockRemoved", "block_hashes": [H[0]], "medium": "GPU"},
            {"type": "BlockRemoved", "block_hashes": [H[1]], "medium": None, "group_idx": 1},
            {"type": "AllBlocksCleared"}]})
        self.assertNotIn("data_parallel_rank", batch)
        # "type" comes first, as msgspec writes a tagged struct.
        self.assertEqual(list(batch["events"][0])[0], "type")

    def test_map_batch_with_dp_rank_and_unknown_field(self):
        pub = self.publisher(encoding="map", data_parallel_rank=0)
        sub = self.subscribe(pub)
        pub.publish([kp.block_stored([5], None, [0] * 16, 16,
                                     kv_cache_spec_kind="full_attention")], ts=2.0)
        _, _, batch = self.recv(sub)
        self.assertEqual(batch["data_parallel_rank"], 0)
        self.assertEqual(batch["events"][0]["kv_cache_spec_kind"], "full_attention")

    def test_hash_kinds(self):
        h = bytes([0xff] * 8 + [1] * 24)
        self.assertEqual(kp.wire_hash(h, "int"), (1 << 64) - 1)
        self.assertEqual(kp.wire_hash(h, "int64"), -1)
        self.assertEqual(kp.wire_hash(h, "bytes"), h)
        self.assertEqual(kp.wire_hash(5, "int"), 5)
        self.assertEqual(kp.wire_hash(5, "bytes"), (5).to_bytes(32, "big"))
        self.assertIsNone(kp.wire_hash(None, "bytes"))
        for kind, want in (("int", (1 << 64) - 1), ("int64", -1), ("bytes", h)):
            for enc in kp.ENCODINGS:
                b = kp.decode_batch(kp.encode_batch([kp.block_removed([h])], enc, kind, ts=0))
                ev = b["events"][0] if enc == "map" else b[1][0]
                got = ev[1][0] if enc == "array" else ev["block_hashes"][0]
                self.assertEqual(got, want, (kind, enc))

    def test_newest_sglang_form(self):
        # The newest SGLang: a positional batch of tagged maps; a store's
        # fields up to medium always, its salt and session by name when set.
        plain = kp.sglang_block_stored([1], None, [1, 2], 2)
        salted = kp.sglang_block_stored([2], 1, [3, 4], 2, cache_salt="tenant-a",
                                        session_id="session-a")
        b = kp.decode_batch(kp.encode_batch(
            [plain, salted, kp.block_removed([2])], "array_of_maps", "int64", ts=1.5,
            data_parallel_rank=0))
        self.assertEqual((len(b), b[0], b[2]), (3, 1.5, 0))
        self.assertEqual(set(b[1][0]), {"type", "block_hashes", "parent_block_hash",
                                        "token_ids", "block_size", "lora_id", "medium"})
        self.assertEqual((b[1][1]["cache_salt"], b[1][1]["session_id"]),
                         ("tenant-a", "session-a"))
        self.assertEqual(b[1][2], {"type": "BlockRemoved", "block_hashes": [2],
                                   "medium": "GPU"})

    def test_unknown_event(self):
        for enc, want in (("array", ["BlockPromoted", [5], "CPU"]),
                          ("map", {"type": "BlockPromoted", "block_hashes": [5],
                                   "medium": "CPU"})):
            ev = kp.encode_event(kp.unknown_event("BlockPromoted", block_hashes=[5],
                                                  medium="CPU"), enc)
            self.assertEqual(ev, want)

    def test_seq_numbers_and_frames(self):
        pub = self.publisher()
        sub = self.subscribe(pub)
        for i in range(5):
            self.assertEqual(pub.publish([kp.block_removed([i])]), i)
        for i in range(5):
            frames = sub.recv_multipart()
            self.assertEqual(len(frames), 3)
            self.assertEqual(frames[0], b"")
            self.assertEqual(frames[1], i.to_bytes(8, "big"))
        self.assertEqual(pub.last_seq, 4)

    def test_connect_mode(self):
        sub = self.sock(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        port = sub.bind_to_random_port("tcp://127.0.0.1")
        pub = self.publisher(endpoint="tcp://127.0.0.1:%d" % port, replay_endpoint=None)
        self.assertEqual(pub.endpoint, "tcp://127.0.0.1:%d" % port)
        # A bound SUB attaches a connection (and sends it its subscriptions)
        # only while its own thread calls into it: keep polling it.
        deadline = time.monotonic() + 5
        while not pub.wait_for_subscriber(0.02) and time.monotonic() < deadline:
            sub.poll(10)
        self.assertEqual(pub.subscriptions, 1)
        pub.publish([kp.all_blocks_cleared()], ts=0)
        self.assertEqual(self.recv(sub)[2], [0.0, [["AllBlocksCleared"]]])


    def test_newest_fields_in_declaration_order(self):
        pub = self.publisher(encoding="array", hash_kind="int64")
        sub = self.subscribe(pub)
        pub.publish([kp.block_stored([-5 & (2**64 - 1)], None, [1] * 16, 16,
                                     kv_cache_spec_kind="sliding_window",
                                     kv_cache_spec_sliding_window=48, locality="REMOTE",
                                     ownership="lmcache", session_id="s1", event_version=1),
                     kp.block_removed([9], medium="CPU", ownership="lmcache", event_version=1),
                     kp.block_stored([8], None, [2] * 16, 16, session_id="s2")], ts=2.0)
        _, _, batch = self.recv(sub)
        self.assertEqual(batch, [2.0, [
            ["BlockStored", [-5], None, [1] * 16, 16, None, "GPU", None, None, None,
             "sliding_window", 48, "REMOTE", "lmcache", "s1", 1],
            ["BlockRemoved", [9], "CPU", None, None, "lmcache", 1],
            ["BlockStored", [8], None, [2] * 16, 16, None, "GPU", None, None, None, None, None,
             None, None, "s2"]]])

    def test_raw_and_typed_extra_keys(self):
        mm = [("image", "img-1", 5), ("audio", "aud-2", -11)]
        self.assertEqual(kp.raw_extra_keys("ad", mm, "salt", b"\x01\x02", ["old"]),
                         ("ad", ["img-1", 5], ["aud-2", -11], "old", "salt", b"\x01\x02"))
        self.assertEqual(kp.typed_extra_keys("ad", mm, "salt", b"\x01", ["old"]), [
            {"type": "lora", "name": "ad"},
            {"type": "mm", "modality": "image", "hash": "img-1", "block_offset": 5},
            {"type": "mm", "modality": "audio", "hash": "aud-2", "block_offset": -11},
            {"type": "legacy", "value": "old"},
            {"type": "cache_salt", "salt": "salt"},
            {"type": "prompt_embeds", "hash": b"\x01"}])
        self.assertIsNone(kp.raw_extra_keys())
        self.assertIsNone(kp.typed_extra_keys())
        pub = self.publisher(encoding="map")
        sub = self.subscribe(pub)
        pub.publish([kp.block_stored([1, 2], None, [0] * 32, 16, extra_keys=[
            kp.typed_extra_keys(cache_salt="s"), None], event_version=1)], ts=0)
        ev = self.recv(sub)[2]["events"][0]
        self.assertEqual((ev["extra_keys"], ev["event_version"]),
                         ([[{"type": "cache_salt", "salt": "s"}], None], 1))


class ReplayTest(ZmqTestCase):
    def replay4(self, dealer, start, topic):
        """As replay(), for vLLM >= 0.26's ["", topic, seq, payload] frames."""
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            frames = dealer.recv_multipart()
            self.assertEqual(len(frames), 4, frames)
            self.assertEqual(frames[0], b"")
            if frames[2] == kp.END_SEQ:
                self.assertEqual((frames[1], frames[3]), (b"", b""))
                return out
            self.assertEqual(frames[1], topic)
            out.append((int.from_bytes(frames[2], "big"), frames[3]))

    def test_topic_framed_replay(self):
        pub = self.publisher(encoding="map", replay_framing="topic", topic="kv@e@m")
        sent = [pub.encode([kp.block_removed([i])], ts=i) for i in range(3)]
        for p in sent:
            pub.send_raw(p)
        self.assertEqual(self.replay4(self.dealer(pub), 1, b"kv@e@m"), [(1, sent[1]),
                                                                       (2, sent[2])])
        with self.assertRaises(ValueError):
            kp.Publisher(replay_framing="frames")

    def test_replay_from_start_seq(self):
        pub = self.publisher(encoding="map")
        sent = [pub.encode([kp.block_removed([i])], ts=i) for i in range(6)]
        for p in sent:
            pub.send_raw(p)
        d = self.dealer(pub)
        self.assertEqual(self.replay(d, 0), list(enumerate(sent)))
        self.assertEqual(self.replay(d, 4), [(4, sent[4]), (5, sent[5])])
        self.assertEqual(self.replay(d, 6), [])
        self.assertEqual(pub.replay_requests, [0, 4, 6])

    def test_replay_buffer_rolled_over(self):
        pub = self.publisher(buffer_steps=4)
        for i in range(10):
            pub.publish([kp.block_removed([i])], ts=i)
        d = self.dealer(pub)
        got = self.replay(d, 0)
        self.assertEqual([s for s, _ in got], [6, 7, 8, 9])
        self.assertEqual(kp.decode_batch(got[0][1]), [6.0, [["BlockRemoved", [6], "GPU"]]])

    def test_drop_next_leaves_a_gap_replay_fills(self):
        pub = self.publisher()
        sub = self.subscribe(pub)
        pub.publish([kp.block_removed([0])], ts=0)
        pub.drop_next(2)
        pub.publish([kp.block_removed([1])], ts=1)
        pub.publish([kp.block_removed([2])], ts=2)
        pub.publish([kp.block_removed([3])], ts=3)
        self.assertEqual([self.recv(sub)[1] for _ in range(2)], [0, 3])
        self.assertEqual((pub.sent, pub.dropped), ([0, 3], [1, 2]))
        got = self.replay(self.dealer(pub), 1)
        self.assertEqual([s for s, _ in got], [1, 2, 3])
        self.assertEqual(kp.decode_batch(got[1][1]), [2.0, [["BlockRemoved", [2], "GPU"]]])

    def test_restart(self):
        pub = self.publisher()
        sub = self.subscribe(pub)
        for i in range(3):
            pub.publish([kp.block_removed([i])])
        pub.restart()
        self.assertEqual(pub.last_seq, -1)
        d = self.dealer(pub)
        self.assertEqual(self.replay(d, 0), [])
        self.assertEqual(pub.publish([kp.all_blocks_cleared()]), 0)
        self.assertEqual([self.recv(sub)[1] for _ in range(4)], [0, 1, 2, 0])
        self.assertEqual([s for s, _ in self.replay(d, 0)], [0])

    def test_send_raw(self):
        pub = self.publisher()
        sub = self.subscribe(pub)
        pub.publish([kp.all_blocks_cleared()])
        self.assertEqual(pub.send_raw(b"\xc1 not msgpack"), 1)
        self.recv(sub)
        topic, seq, payload = sub.recv_multipart()
        self.assertEqual((seq, payload), ((1).to_bytes(8, "big"), b"\xc1 not msgpack"))
        self.assertEqual(self.replay(self.dealer(pub), 1), [(1, b"\xc1 not msgpack")])

    def test_malformed_request_is_ignored(self):
        pub = self.publisher()
        pub.publish([kp.all_blocks_cleared()])
        d = self.dealer(pub)
        d.send_multipart([b"", (0).to_bytes(8, "big"), b"extra"])
        self.assertEqual([s for s, _ in self.replay(d, 0)], [0])
        self.assertEqual(pub.replay_requests, [None, 0])

    def test_two_clients(self):
        pub = self.publisher()
        for i in range(3):
            pub.publish([kp.block_removed([i])])
        a, b = self.dealer(pub), self.dealer(pub)
        self.assertEqual([s for s, _ in self.replay(a, 2)], [2])
        self.assertEqual([s for s, _ in self.replay(b, 1)], [1, 2])


class SlowJoinerTest(ZmqTestCase):
    def test_xpub_reports_the_subscription(self):
        pub = self.publisher(topic="kv@w0")
        self.assertFalse(pub.wait_for_subscriber(0.2))
        sub = self.sock(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")  # a prefix of the topic matches
        sub.connect(pub.endpoint)
        self.assertTrue(pub.wait_for_subscriber(5))
        pub.publish([kp.all_blocks_cleared()])  # the very first batch arrives
        self.assertEqual(self.recv(sub)[:2], (b"kv@w0", 0))

    def test_other_topics_do_not_count(self):
        pub = self.publisher(topic="kv@w0")
        sub = self.sock(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"other")
        sub.connect(pub.endpoint)
        self.assertFalse(pub.wait_for_subscriber(0.3))

    def test_plain_pub_needs_a_confirmation(self):
        pub = self.publisher(xpub=False)
        with self.assertRaises(ValueError):
            pub.wait_for_subscriber(0.1)
        self.assertTrue(pub.wait_for_subscriber(1, confirm=lambda: True, settle=0))
        self.assertFalse(pub.wait_for_subscriber(0.1, confirm=lambda: False))


# ---- the engine pool ----

def toks(*blocks, bs=2):
    """Tokens of blocks named by small ints: block k is [k*bs .. k*bs+bs-1]."""
    return [k * bs + j for k in blocks for j in range(bs)]


def shape(ev):
    """(type, [block indices], parent) of an Event whose hashes come from `pool`."""
    return ev.type, ev.get("block_hashes"), ev.get("parent_block_hash")


class EnginePoolTest(unittest.TestCase):
    def pool(self, c, **kw):
        return ep.EnginePool(c, block_size=2, **kw)

    def batch(self, pool):
        seq, events = pool.published[-1]
        return events

    def test_eviction_order_and_events(self):
        p = self.pool(6)
        A, B, Cq = toks(1, 2, 3), toks(4, 5, 6), toks(7, 8)
        a = p.block_hashes(A)
        b = p.block_hashes(B)
        c = p.block_hashes(Cq)
        p.submit(A)
        self.assertEqual(p.step(), 0)
        (ev,) = self.batch(p)
        self.assertEqual(shape(ev), ("BlockStored", a, None))
        self.assertEqual(ev.get("token_ids"), A)
        self.assertEqual(ev.get("block_size"), 2)
        self.assertEqual(list(p.free), [3, 4, 5, 2, 1, 0])  # A's tail freed first
        self.assertEqual(p.cached_prefix_blocks(A), 3)
        self.assertEqual(p.cached_prefix_blocks(A[:4]), 2)
        self.assertEqual(p.cached_prefix_blocks(A + [99]), 3)  # a partial block never counts
        self.assertEqual(p.cached_prefix_blocks(toks(1, 9, 3)), 1)
        p.submit(B)
        p.step()  # takes the three uncached blocks 3, 4, 5: nothing evicted
        self.assertEqual([shape(e) for e in self.batch(p)], [("BlockStored", b, None)])
        self.assertEqual(list(p.free), [2, 1, 0, 5, 4, 3])
        p.submit(Cq)
        p.step()  # pops 2 (a3) then 1 (a2): A's tail goes first
        self.assertEqual([shape(e) for e in self.batch(p)],
                         [("BlockRemoved", [a[2]], None), ("BlockRemoved", [a[1]], None),
                          ("BlockStored", c, None)])
        self.assertEqual((p.cached_prefix_blocks(A), p.cached_prefix_blocks(B),
                          p.cached_prefix_blocks(Cq)), (1, 3, 2))
        self.assertEqual(list(p.free), [0, 5, 4, 3, 1, 2])
        p.submit(A)
        p.step()  # hits a1 (block 0 leaves the queue), pops 5 (b3) and 4 (b2)
        self.assertEqual([shape(e) for e in self.batch(p)],
                         [("BlockRemoved", [b[2]], None), ("BlockRemoved", [b[1]], None),
                          ("BlockStored", a[1:], a[0])])
        self.assertEqual(self.batch(p)[-1].get("token_ids"), A[2:])
        self.assertEqual((p.cached_prefix_blocks(A), p.cached_prefix_blocks(B),
                          p.cached_prefix_blocks(Cq)), (3, 1, 2))
        self.assertEqual(p.counts["hit_blocks"], 1)
        p.check()

    def test_coalesced_removes(self):
        p = self.pool(3, coalesce_removed=True)
        a = p.block_hashes(toks(1, 2, 3))
        p.submit(toks(1, 2, 3))
        p.step()
        p.submit(toks(4, 5))
        p.step()
        self.assertEqual([shape(e)[:2] for e in self.batch(p)],
                         [("BlockRemoved", [a[2], a[1]]),
                          ("BlockStored", p.block_hashes(toks(4, 5)))])

    def test_running_requests_pin_their_blocks(self):
        p = self.pool(4)
        r1 = p.submit(toks(1, 2, 3), hold_steps=3)
        r2 = p.submit(toks(4, 5))
        r3 = p.submit(toks(1, 2, 3, 4, 5))  # 5 blocks > C: refused at once
        self.assertEqual(r3.state, ep.REFUSED)
        p.step()
        self.assertEqual((r1.state, r2.state), (ep.RUNNING, ep.WAITING))  # 1 block free, needs 2
        p.step()
        self.assertEqual(r2.state, ep.WAITING)
        p.step()  # r1 finishes at the end of this step
        self.assertEqual((r1.state, r2.state), (ep.FINISHED, ep.WAITING))
        p.step()  # r2 runs: takes the free block 3, then evicts a3 (block 2)
        self.assertEqual(r2.state, ep.FINISHED)
        self.assertEqual(p.cached_prefix_blocks(toks(1, 2, 3)), 2)
        self.assertEqual(p.counts["refused"], 1)
        p.check()

    def test_a_hit_that_is_held_costs_no_free_block(self):
        p = self.pool(4)
        p.submit(toks(1, 2), hold_steps=5)
        p.step()
        r = p.submit(toks(1, 2, 3, 4))  # hits 2 held blocks, needs 2 new: exactly the free ones
        p.step()
        self.assertEqual((r.state, r.hit), (ep.FINISHED, 2))
        self.assertEqual(p.cached_prefix_blocks(toks(1, 2, 3, 4)), 4)
        p.check()

    def test_salt_and_lora(self):
        p = self.pool(8)
        t = toks(1, 2, 3)
        p.submit(t, salt="A")
        p.step()
        (ev,) = self.batch(p)
        self.assertEqual(ev.get("extra_keys"), [["A"], None, None])
        self.assertEqual((p.cached_prefix_blocks(t, salt="A"), p.cached_prefix_blocks(t),
                          p.cached_prefix_blocks(t, salt="B")), (3, 0, 0))
        p.submit(t + toks(4), salt="A")
        p.step()
        (ev,) = self.batch(p)
        self.assertEqual((ev.get("parent_block_hash"), ev.get("extra_keys")),
                         (p.block_hashes(t, salt="A")[2], None))
        p.submit(toks(5, 6), salt="A", lora="ad")
        p.step()
        (ev,) = self.batch(p)
        self.assertEqual((ev.get("lora_id"), ev.get("lora_name"), ev.get("extra_keys")),
                         (1, "ad", [["ad", "A"], ["ad"]]))
        self.assertEqual(p.cached_prefix_blocks(toks(5, 6), salt="A", lora="ad"), 2)
        self.assertEqual(p.cached_prefix_blocks(toks(5, 6), salt="A"), 0)
        self.assertEqual(p.cached_prefix_blocks(toks(5, 6), lora="ad"), 0)

    def test_hash_seed_changes_hashes_not_content(self):
        a, b = self.pool(4, hash_seed=b"a"), self.pool(4, hash_seed=b"b")
        self.assertNotEqual(a.block_hashes(toks(1)), b.block_hashes(toks(1)))

    def test_recompute_last_block(self):
        p = self.pool(5, recompute_last_block=True)
        P = toks(1, 2)
        h = p.block_hashes(P)
        p.submit(P)
        p.step()  # blocks 0, 1; queue 2 3 4 1 0
        p.submit(P)
        p.step()  # hit capped at 1 block: p2 recomputed into block 2 and stored again
        self.assertEqual([shape(e) for e in self.batch(p)], [("BlockStored", [h[1]], h[0])])
        self.assertEqual(p.cached[h[1]], [1, 2])
        self.assertEqual(list(p.free), [3, 4, 1, 2, 0])
        p.submit(toks(7, 8, 9))
        p.step()  # pops 3, 4, 1: block 1's copy of p2 goes, block 2's stays
        self.assertEqual([shape(e) for e in self.batch(p)][0], ("BlockRemoved", [h[1]], None))
        self.assertEqual(p.cached_prefix_blocks(P), 2)
        p.submit(toks(10))
        p.step()  # pops 2: the last copy of p2
        self.assertEqual([shape(e) for e in self.batch(p)][0], ("BlockRemoved", [h[1]], None))
        self.assertEqual(p.cached_prefix_blocks(P), 1)
        self.assertEqual(p.counts["duplicate_stores"], 1)
        p.check()

    def test_copy_counts_name_the_copies_left(self):
        p = self.pool(5, recompute_last_block=True, copy_counts=True)
        P = toks(1, 2)
        h = p.block_hashes(P)
        p.submit(P)
        p.step()
        p.submit(P)
        p.step()  # p2 in blocks 1 and 2
        self.batch(p)
        p.submit(toks(7, 8, 9))
        p.step()  # pops 3, 4, 1: block 1's copy of p2 goes, one is left
        removed = self.batch(p)[0]
        self.assertEqual((removed.get("block_hashes"), removed.get("remaining_copy_counts")),
                         ([h[1]], [1]))
        p.submit(toks(10))
        p.step()  # pops 2: the last copy
        removed = self.batch(p)[0]
        self.assertEqual((removed.get("block_hashes"), removed.get("remaining_copy_counts")),
                         ([h[1]], [0]))
        q = self.pool(3, coalesce_removed=True, copy_counts=True)
        q.submit(toks(1, 2, 3))
        q.step()
        q.submit(toks(4, 5))
        q.step()  # evicts two blocks of one copy each, in one event
        removed = self.batch(q)[0]
        self.assertEqual((len(removed.get("block_hashes")),
                          removed.get("remaining_copy_counts")), (2, [0, 0]))

    def test_no_duplicates_without_the_cap(self):
        p = self.pool(5)
        p.submit(toks(1, 2))
        p.step()
        r = p.submit(toks(1, 2))
        p.step()
        self.assertEqual(r.hit, 2)
        self.assertEqual(p.published[-1][0], 0)  # nothing new to publish
        self.assertEqual(p.counts["duplicate_stores"], 0)

    def test_stored_since(self):
        p = self.pool(8)
        p.submit(toks(1, 2))
        self.assertEqual(p.step(), 0)
        p.submit(toks(1, 2, 3))
        self.assertEqual(p.step(), 1)
        p.submit(toks(4, 5))
        self.assertEqual(p.step(), 2)
        self.assertEqual(p.cached_prefix_blocks(toks(1, 2, 3), stored_since=1), 0)
        self.assertEqual(p.cached_prefix_blocks(toks(1, 2, 3), stored_since=0), 3)
        self.assertEqual(p.cached_prefix_blocks(toks(4, 5), stored_since=2), 2)
        self.assertEqual(p.cached_prefix_blocks(toks(4, 5), stored_since=3), 0)

    def test_steps_per_batch(self):
        p = self.pool(8, steps_per_batch=2)
        p.submit(toks(1))
        self.assertIsNone(p.step())
        p.submit(toks(2))
        self.assertEqual(p.step(), 0)
        self.assertEqual(len(self.batch(p)), 2)

    def test_reset_prefix_cache_and_restart(self):
        p = self.pool(8)
        p.submit(toks(1, 2), hold_steps=4)
        p.step()
        p.reset_prefix_cache()  # drains first
        self.assertEqual(shape(self.batch(p)[-1])[0], "AllBlocksCleared")
        self.assertEqual((p.cached_prefix_blocks(toks(1, 2)), len(p.cached)), (0, 0))
        p.check()
        p.submit(toks(1, 2))
        p.step()
        p.restart()
        self.assertEqual((p.cached_prefix_blocks(toks(1, 2)), len(p.free)), (0, 8))

    def test_content_keys(self):
        p = ep.EnginePool(32, 4, keys_form="typed")
        toks = list(range(16))
        img = [("image", "img-a", 6, 4)]  # tokens 6..9: blocks 1 and 2
        plain, with_img = p.block_hashes(toks), p.block_hashes(toks, mm=img)
        self.assertEqual(plain[0], with_img[0])
        self.assertTrue(all(a != b for a, b in zip(plain[1:], with_img[1:])))
        self.assertEqual(ep.mm_block_keys(img, 1, 4), [("image", "img-a", 2)])
        self.assertEqual(ep.mm_block_keys(img, 2, 4), [("image", "img-a", -2)])
        self.assertEqual(p.route_extra_keys(toks, mm=img), {
            1: [{"type": "mm", "modality": "image", "hash": "img-a", "block_offset": 2}],
            2: [{"type": "mm", "modality": "image", "hash": "img-a", "block_offset": -2}]})
        p.submit(toks, mm=img)
        odd = list(range(200, 216))
        p.submit(odd, opaque_at=2)
        p.drain()
        ev = p.published[0][1][0]
        self.assertEqual(ev.get("extra_keys")[1], [
            {"type": "mm", "modality": "image", "hash": b"img-a", "block_offset": 2}])
        self.assertEqual(ev.get("event_version"), 1)
        self.assertEqual(p.cached_prefix_blocks(toks, mm=img), 4)
        self.assertEqual(p.cached_prefix_blocks(toks), 1)
        other = [("image", "img-b", 6, 4)]
        self.assertEqual(p.route_answer(toks, mm=other)["matched"], 1)
        # A key no decoder knows: the engine holds the block, an index cannot.
        self.assertEqual(p.cached_prefix_blocks(odd, opaque_at=2), 4)
        self.assertEqual(p.route_answer(odd, opaque_at=2)["matched"], 2)
        self.assertEqual(p.medium_blocks(), {"GPU": 6})  # not odd's last two

    def test_second_tier(self):
        p = ep.EnginePool(4, 4, tier=dict(medium="CPU", blocks=2, ownership="lmcache"))
        a, b = list(range(8)), list(range(100, 116))
        p.submit(a)
        p.drain()
        p.submit(b)
        p.drain()
        kinds = [(e.type, e.get("medium"), e.get("ownership")) for _, evs in p.published
                 for e in evs]
        self.assertIn(("BlockStored", "CPU", "lmcache"), kinds)
        self.assertEqual(p.route_answer(a), {"matched": 2, "full": 2,
                                             "mediums": {"CPU/lmcache": 2}})
        self.assertEqual(p.medium_blocks(), {"GPU": 4, "CPU/lmcache": 2})
        p.check()

    def test_sliding_window_group(self):
        p = ep.EnginePool(16, 4, sliding_window=9, window_blocks=3)  # 2 window blocks
        self.assertEqual(p.window_need, 2)
        a = list(range(20))  # 5 blocks; the window group keeps the last 3 at most
        p.submit(a)
        p.drain()
        self.assertEqual(p.route_answer(a)["matched"], 5)
        self.assertEqual([p.route_answer(a[:4 * k]) for k in (1, 2, 3)],
                         [{"matched": 0, "full": k, "mediums": {"GPU": k}} for k in (1, 2, 3)])
        groups = {(e.get("group_idx"), e.get("kv_cache_spec_kind")) for _, evs in p.published
                  for e in evs if e.type == "BlockStored"}
        self.assertEqual(groups, {(0, "full_attention"), (1, "sliding_window")})
        p.check()

    def test_radix_pool(self):
        p = ep.RadixPool(6, 4, host_blocks=4, store_chunk=2)
        a, b = list(range(16)), list(range(100, 116))
        p.submit(a)
        p.drain()
        stored = [e.get("block_hashes") for e in p.published[0][1]]
        self.assertEqual([len(h) for h in stored], [2, 2])  # 4 pages, stores of 2
        p.submit(b)  # evicts a to the host
        p.drain()
        evs = [(e.type, e.get("medium"), len(e.get("block_hashes"))) for e in p.published[1][1]]
        self.assertEqual(evs[:3], [("BlockStored", "CPU_PINNED", 2),
                                   ("BlockStored", "CPU_PINNED", 2), ("BlockRemoved", "GPU", 4)])
        self.assertEqual(p.route_answer(a), {"matched": 4, "full": 4,
                                             "mediums": {"CPU_PINNED": 4}})
        p.submit(a[:8] + [7] * 4)  # loads a's first node back after a split
        p.drain()
        self.assertEqual(p.counts["splits"], 1)
        # b went to make room, and a's tail left the host for b, which found none.
        self.assertEqual(p.route_answer(a), {"matched": 2, "full": 2,
                                             "mediums": {"GPU": 2, "CPU_PINNED": 2}})
        self.assertEqual(p.route_answer(b)["matched"], 0)
        p.check()

    def test_trace(self):
        reqs = ep.load_trace("synthetic", 5)
        self.assertEqual(len(reqs), 5)
        r = reqs[0]
        t = ep.trace_tokens(r, 16)
        self.assertEqual(len(t), 16 * len(r.hash_ids))
        base = ep.TRACE_ID_BASE["synthetic"]
        self.assertEqual(t[:16], [(base + r.hash_ids[0]) * 16 + j for j in range(16)])
        conv = ep.load_trace("conversation", 3)
        h0 = conv[0].hash_ids[0]
        self.assertEqual(ep.trace_tokens(conv[0], 16)[:2], [h0 * 16, h0 * 16 + 1])
        self.assertEqual(len(ep.load_trace("conversation")), 12031)
        top = max(max(r.hash_ids) for r in ep.load_trace("synthetic"))
        self.assertLess((base + top + 1) * 16, 1 << 32)
        self.assertLess((ep.FRESH_ID_BASE + 10 ** 6) * 16, 1 << 32)


# ---- the two together: an index rebuilt from the wire ----

class MiniIndex:
    """The fleet index's job in a few lines, as the e2e test assumes the
    daemon does it: a block's key is the hash of its parent's key and its
    tokens (the root's parent: the namespace, lora name and cache salt);
    a BlockStored whose parent the worker never stored is not indexed; a
    worker's stores of one hash are counted, and its BlockRemoveds undo
    them one by one; AllBlocksCleared forgets the worker."""

    def __init__(self, block_size):
        self.bs = block_size
        self.held = {}   # worker -> {key: count}
        self.keys = {}   # worker -> {engine hash: key}
        self.dropped = 0

    @staticmethod
    def root(lora, salt):
        return hashlib.sha256(repr(("root", lora or "", salt or "")).encode()).digest()

    @staticmethod
    def key(parent, tokens):
        return hashlib.sha256(parent + repr(list(tokens)).encode()).digest()

    @staticmethod
    def fields(ev):
        if isinstance(ev, dict):
            return ev["type"], ev
        names = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                                 "lora_id", "medium", "lora_name", "extra_keys", "group_idx"],
                 "BlockRemoved": ["block_hashes", "medium", "group_idx"]}.get(ev[0], [])
        return ev[0], dict(zip(names, ev[1:]))

    @staticmethod
    def hashable(h):
        return h if isinstance(h, int) else bytes(h)

    def apply(self, worker, batch):
        events = batch["events"] if isinstance(batch, dict) else batch[1]
        held = self.held.setdefault(worker, {})
        keys = self.keys.setdefault(worker, {})
        for ev in events:
            t, f = self.fields(ev)
            if t == "BlockStored":
                assert f["block_size"] == self.bs
                lora = f.get("lora_name")
                extra = f.get("extra_keys") or [None] * len(f["block_hashes"])
                if f["parent_block_hash"] is None:
                    first = [k for k in (extra[0] or []) if k != lora]
                    prev = self.root(lora, first[0] if first else None)
                else:
                    prev = keys.get(self.hashable(f["parent_block_hash"]))
                    if prev is None:
                        self.dropped += len(f["block_hashes"])
                        continue
                for i, h in enumerate(f["block_hashes"]):
                    prev = self.key(prev, f["token_ids"][i * self.bs:(i + 1) * self.bs])
                    keys[self.hashable(h)] = prev
                    held[prev] = held.get(prev, 0) + 1
            elif t == "BlockRemoved":
                for h in f["block_hashes"]:
                    k = keys.get(self.hashable(h))
                    if k is None:
                        continue
                    held[k] -= 1
                    if held[k] == 0:
                        del held[k]
                        del keys[self.hashable(h)]
            elif t == "AllBlocksCleared":
                held.clear()
                keys.clear()

    def route(self, worker, tokens, salt=None, lora=None):
        held = self.held.get(worker, {})
        prev, n = self.root(lora, salt), 0
        for i in range(len(tokens) // self.bs):
            prev = self.key(prev, tokens[i * self.bs:(i + 1) * self.bs])
            if prev not in held:
                break
            n += 1
        return n


class WireToIndexTest(ZmqTestCase):
    def test_index_from_the_wire_equals_the_pools(self):
        """Two pools (one per encoding, int and bytes hashes, the array one
        with vLLM's last-block recompute) fed 400 requests of each trace; a
        reference index built only from what a SUB receives answers every
        sample exactly as the pools' cached_prefix_blocks."""
        bs = 16
        pubs = [self.publisher(encoding="array", hash_kind="int64", name="w0"),
                self.publisher(encoding="map", hash_kind="bytes", name="w1",
                               data_parallel_rank=0)]
        pools = [ep.EnginePool(192, bs, publisher=pubs[0], hash_seed=b"0",
                               recompute_last_block=True, medium=None),
                 ep.EnginePool(192, bs, publisher=pubs[1], hash_seed=b"1", steps_per_batch=2,
                               spec_kind="full_attention")]
        subs = [self.subscribe(p) for p in pubs]
        reqs = ep.load_trace("conversation", 400) + ep.load_trace("synthetic", 400)
        reqs.sort(key=lambda r: (r.timestamp, r.trace))
        idx = MiniIndex(bs)
        got = [0, 0]
        salts = [None, None, "tenant-a"]
        for i, r in enumerate(reqs):
            pools[i % 2].submit(ep.trace_tokens(r, bs), salt=salts[i % 3],
                                hold_steps=r.hold_steps)
            if i % 5 == 0:  # an exact repeat: a fully cached prompt
                pools[0].submit(ep.trace_tokens(r, bs), salt=salts[i % 3])
            for p in pools:
                p.step()
                p.check()
        for p in pools:
            p.drain()
        for w, (pub, sub) in enumerate(zip(pubs, subs)):
            while got[w] <= pub.last_seq:
                _, seq, batch = self.recv(sub)
                self.assertEqual(seq, got[w])
                got[w] += 1
                idx.apply(w, batch)
        self.assertGreater(pools[0].counts["duplicate_stores"], 0)
        self.assertGreater(pools[0].counts["evicted"], 1000)
        rng = random.Random(3)
        sample = reqs[-150:] + rng.sample(reqs, 100)
        nonzero = 0
        for k, r in enumerate(sample):
            t = ep.trace_tokens(r, bs)
            if k % 4 == 1:
                t = t + ep.fresh_tokens([k], bs)
            if k % 4 == 2:
                t = t + [1, 2, 3]
            for salt in (None, "tenant-a"):
                for w, pool in enumerate(pools):
                    want = pool.cached_prefix_blocks(t, salt=salt)
                    nonzero += want > 0
                    self.assertEqual(idx.route(w, t, salt=salt), want, (k, w, salt))
        self.assertGreater(nonzero, 100)


if __name__ == "__main__":
    unittest.main()
