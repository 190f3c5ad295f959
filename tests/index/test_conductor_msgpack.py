#!/usr/bin/python3
"""Mooncake's current Conductor API as its own router calls it, over real
sockets to the real daemon (docs/index.md, "As a Mooncake Conductor"). The
requests are built here as Mooncake's cache-aware disaggregation proxy
(mooncake-conductor/example/cache_aware_disagg_proxy.py) builds them:
MessagePack bodies (`Content-Type: application/msgpack`, msgpack.packb with
use_bin_type), /register with a `hash_profile` and no replay endpoint,
/query with `token_ids` as one bin of little-endian int32; its answers are
read as that proxy reads them: a MessagePack map, `instances`, each
instance's integer `longest_matched`.

Publishers (ZeroMQ, framed and encoded here as vLLM's kv_events.py and the
Mooncake RFC #1527 describe them; tests/index/upstream.py): a0 and a1, vLLM
ranks 0 and 1 of instance vllm-a; b0, vLLM rank 0 of instance vllm-b; store,
a Mooncake store holding the prompt's blocks in its CPU pool.

Checks:
  - /register and /unregister answer in MessagePack as that proxy expects;
  - /query answers by instance: engines only, per rank its cumulative
    tiers (npu, cpu_local, cpu_share, disk), the store's blocks carrying every engine's
    cpu_share and disk runs on, past the engine's own blocks too; the
    proxy's rule (the longest `longest_matched`, ties taken in turn) then
    picks the engine;
  - a bad body (one past limits.max_message_size too) is 400 with a
    MessagePack {"error"} naming the field, and changes nothing;
  - a daemon told --index_http_answer=by_instance answers a JSON /query by
    instance too;
  - a store holding more of a prompt than any engine is never Route's
    best_worker nor Pick's choice, and naming it a Pick candidate is
    INVALID_ARGUMENT.

Usage: test_conductor_msgpack.py --prefixd PATH [--stubs DIR]
"""

import http.client
import json
import os
import struct
import sys
import unittest

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
import upstream  # noqa: E402  (tests/index/upstream.py)

BS = 16
DEADLINE_S = 10
MODEL = "qwen2.5_7B"
HASH_PROFILE = {"strategy": "vllm_v1", "algorithm": "sha256_cbor",
                "python_hash_seed": "0", "index_projection": "low64_be"}
PROMPT = list(range(5000, 5000 + 4 * BS)) + [1, 2, 3]  # 4 blocks and a part


def rank_runs(npu, cpu_local, cpu_share, disk):
    """One rank's runs in tokens."""
    return {"npu": npu, "cpu_local": cpu_local, "cpu_share": cpu_share, "disk": disk}


def instance_answer(ranks):
    """An instance's answer: each tier the longest over its ranks."""
    out = {k: max(r[k] for r in ranks.values()) for k in next(iter(ranks.values()))}
    return dict(out, longest_matched=out["disk"], rank_matches=ranks,
                dp={rank: r["npu"] for rank, r in ranks.items()})


class ConductorMsgpackTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = prefixd_fixture.Daemon(
            ARGS.prefixd,
            "index { block_size: %d }\nlimits { max_message_size: \"1MiB\" }\n" % BS,
            index_http="127.0.0.1", snapshot=False).start()
        cls.http_port = cls.daemon.index_http_port
        cls.client = prefixd.Client(cls.daemon.tcp)
        cls.pubs = {"a0": upstream.ZmqEventPublisher(0),
                    "a1": upstream.ZmqEventPublisher(1),
                    "b0": upstream.ZmqEventPublisher(0),
                    "store": upstream.ZmqEventPublisher(0, form="array")}

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()
        for pub in cls.pubs.values():
            pub.close()

    def post(self, path, payload=None, raw=None):
        """(status, Content-Type, decoded MessagePack answer)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        body = raw if raw is not None else msgpack.packb(payload, use_bin_type=True)
        conn.request("POST", path, body=body,
                     headers={"Content-Type": "application/msgpack",
                              "X-Request-Id": "req-1"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, resp.getheader("Content-Type"), msgpack.unpackb(data, raw=False)

    def registration(self, name, instance, rank, type_="vLLM"):
        """The proxy's registration payload (ConductorClient.registration_payloads)."""
        return {"endpoint": self.pubs[name].endpoint, "type": type_, "modelname": MODEL,
                "instance_id": instance, "block_size": BS, "dp_rank": rank,
                "tenant_id": "default", "lora_name": "", "hash_profile": HASH_PROFILE}

    def query(self, token_ids, **extra):
        """The proxy's /query payload: token_ids packed as int32 LE."""
        payload = {"model": MODEL, "block_size": BS,
                   "token_ids": struct.pack("<%di" % len(token_ids), *token_ids),
                   "tenant_id": "default", "lora_name": ""}
        payload.update(extra)
        return self.post("/query", payload)

    def workers(self):
        return prefixd_fixture.workers_by_name(self.client)

    def store_cpu(self, seq_hashes):
        """The store's batch: the blocks of these rolling keys stored in its
        CPU pool, as Mooncake's RFC #1527 publisher sends them."""
        return self.pubs["store"].publish([{
            "event_type": "stored", "model_name": MODEL, "block_size": BS,
            "tenant_id": "default", "backend_id": "store-0", "medium": "cpu", "dp_rank": 0,
            "seq_hashes": seq_hashes,
            "base_block_idx": None, "parent_hash": None, "token_ids": None}])

    def test_1_register_publish_and_query(self):
        for name, instance, rank, type_ in (("a0", "vllm-a", 0, "vLLM"),
                                            ("a1", "vllm-a", 1, "vLLM"),
                                            ("b0", "vllm-b", 0, "vLLM"),
                                            ("store", "store-0", 0, "Mooncake")):
            status, ctype, body = self.post("/register",
                                            self.registration(name, instance, rank, type_))
            self.assertEqual((status, ctype), (200, "application/msgpack"), body)
            # What the proxy requires of a registration's answer.
            self.assertEqual(body, {"status": "registered successfully",
                                    "instance_id": instance})
        for name in self.pubs:
            self.assertTrue(self.pubs[name].wait_for_subscriber(DEADLINE_S), name)
        hashes = [7100 + i for i in range(4)]
        self.pubs["a0"].publish([upstream.vllm_block_stored(hashes, None, PROMPT[:4 * BS], BS)])
        self.pubs["a1"].publish([upstream.vllm_block_stored(hashes[:1], None, PROMPT[:BS], BS)])
        names = {"a0": "vllm-a|default|0", "a1": "vllm-a|default|1"}
        prefixd_fixture.applied(self.client, self.daemon,
                                {names[n]: self.pubs[n].last_seq for n in names}, DEADLINE_S)
        # The store holds the first three blocks, named by their rolling
        # keys (placed under the engines' blocks with tokens).
        self.store_cpu(upstream.conductor_hashes(PROMPT[:3 * BS], BS))
        prefixd_fixture.applied(self.client, self.daemon,
                                {"store-0|default|0": self.pubs["store"].last_seq},
                                DEADLINE_S)

        status, ctype, got = self.query(PROMPT)
        self.assertEqual((status, ctype), (200, "application/msgpack"), got)
        want = {"instances": {
            "vllm-a": instance_answer(ranks={"0": rank_runs(64, 64, 64, 64), "1": rank_runs(16, 16, 48, 48)}),
            "vllm-b": instance_answer(ranks={"0": rank_runs(0, 0, 48, 48)})}}
        self.assertEqual(got, want)
        # The proxy's choice: the longest longest_matched among its engines.
        candidates = {i: r["longest_matched"] for i, r in got["instances"].items()
                      if type(r.get("longest_matched")) is int}
        self.assertEqual(max(candidates, key=candidates.get), "vllm-a")
        status, _, one = self.query(PROMPT, instance_id="vllm-b")
        self.assertEqual((status, one), (200, {"instances": {"vllm-b":
                                                             want["instances"]["vllm-b"]}}))
        status, _, other = self.query(PROMPT, model="llama")
        self.assertEqual((status, other), (200, {"instances": {}}))

    def test_2_bad_bodies_are_400_in_msgpack(self):
        before = sorted(self.workers())
        bad_bin = {"model": MODEL, "block_size": BS, "token_ids": b"\x01\x00\x00\x00\x02"}
        cases = [
            ("/query", bad_bin, None, "token_ids: entry 1 (1 bytes past the last int32)"),
            ("/query", None, msgpack.packb({"model": MODEL, "block_size": BS,
                                            "token_ids": struct.pack("<2i", 5, -1)}),
             "token_ids: entry 1 (-1)"),
            ("/query", None, b"\xc1", "the body is not MessagePack"),
            ("/register", dict(self.registration("a0", "vllm-z", 0), cache_group=2), None,
             "cache_group: 2 is not served"),
            ("/register", dict(self.registration("a0", "vllm-z", 0), hash_profile="x"), None,
             "hash_profile: must be an object"),
            ("/unregister", {"instance_id": "nobody", "dp_rank": 0}, None, "nobody|default|0"),
            # Past limits.max_message_size: refused before it is read whole.
            ("/query", dict(bad_bin, token_ids=bytes(1 << 20)), None,
             "body: over 1048576 bytes"),
        ]
        for path, payload, raw, error in cases:
            status, ctype, body = self.post(path, payload, raw)
            self.assertIn(status, (400, 404), (path, body))
            self.assertEqual(ctype, "application/msgpack")
            self.assertIn(error, body["error"])
        self.assertEqual(sorted(self.workers()), before)

    def test_3_unregister(self):
        status, ctype, body = self.post("/unregister", {"instance_id": "vllm-a",
                                                        "tenant_id": "default", "dp_rank": 1})
        self.assertEqual((status, ctype), (200, "application/msgpack"))
        self.assertEqual(body, {"status": "unregistered successfully",
                                "removed_instances": ["vllm-a|default|1"]})
        status, _, got = self.query(PROMPT)
        self.assertEqual(got["instances"]["vllm-a"]["dp"], {"0": 64})
        self.assertNotIn("vllm-a|default|1", self.workers())

    def test_4_json_by_instance_when_configured(self):
        # A daemon told --index_http_answer=by_instance answers JSON as
        # Mooncake's current Conductor does in JSON.
        daemon = prefixd_fixture.Daemon(
            ARGS.prefixd, "index { block_size: %d }\n" % BS, index_http="127.0.0.1",
            args=["--index_http_answer=by_instance"], snapshot=False).start()
        port = daemon.index_http_port
        client = prefixd.Client(daemon.tcp)
        pub = upstream.ZmqEventPublisher(0)
        try:
            def post(path, body):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("POST", path, body=json.dumps(body),
                             headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                answer = (resp.status, resp.getheader("Content-Type"),
                          json.loads(resp.read()))
                conn.close()
                return answer
            status, _, body = post("/register", dict(self.registration("a0", "vllm-b", 0),
                                                     endpoint=pub.endpoint))
            self.assertEqual(status, 200, body)
            self.assertTrue(pub.wait_for_subscriber(DEADLINE_S))
            toks = list(range(9000, 9000 + 2 * BS))
            pub.publish([upstream.vllm_block_stored([7301, 7302], None, toks, BS)])
            prefixd_fixture.applied(client, daemon, {"vllm-b|default|0": pub.last_seq},
                                    DEADLINE_S)
            status, ctype, got = post("/query", {"model": MODEL, "block_size": BS,
                                                 "token_ids": toks})
            self.assertEqual((status, ctype), (200, "application/json"))
            self.assertEqual(got, {"instances": {"vllm-b": instance_answer(
                ranks={"0": rank_runs(2 * BS, 2 * BS, 2 * BS, 2 * BS)})}})
        finally:
            client.close()
            daemon.close()
            pub.close()

    def test_5_store_blocks_carry_an_engine_on(self):
        # Each tier is one run from the prompt's first block: b0 holds the
        # first two blocks on its GPU and the store only the two after them
        # in its CPU pool (a0 holds all four, which places the store's keys).
        prompt = list(range(6000, 6000 + 4 * BS))
        hashes = [7200 + i for i in range(4)]
        self.pubs["a0"].publish([upstream.vllm_block_stored(hashes, None, prompt, BS)])
        self.pubs["b0"].publish([upstream.vllm_block_stored(hashes[:2], None,
                                                            prompt[:2 * BS], BS)])
        prefixd_fixture.applied(self.client, self.daemon,
                                {"vllm-a|default|0": self.pubs["a0"].last_seq,
                                 "vllm-b|default|0": self.pubs["b0"].last_seq}, DEADLINE_S)
        self.store_cpu(upstream.conductor_hashes(prompt, BS)[2:])
        prefixd_fixture.applied(self.client, self.daemon,
                                {"store-0|default|0": self.pubs["store"].last_seq},
                                DEADLINE_S)
        status, _, got = self.query(prompt, instance_id="vllm-b")
        self.assertEqual((status, got), (200, {"instances": {"vllm-b": instance_answer(
            ranks={"0": rank_runs(2 * BS, 2 * BS, 4 * BS, 4 * BS)})}}))

    def test_6_a_store_is_never_the_engine_to_send_to(self):
        # The store holds all three blocks of a prompt, a0 only its first:
        # Route's best_worker and Pick must still name an engine.
        prompt = list(range(7000, 7000 + 3 * BS))
        hashes = [7400 + i for i in range(3)]
        self.pubs["a0"].publish([upstream.vllm_block_stored(hashes, None, prompt, BS)])
        prefixd_fixture.applied(self.client, self.daemon,
                                {"vllm-a|default|0": self.pubs["a0"].last_seq}, DEADLINE_S)
        self.store_cpu(upstream.conductor_hashes(prompt, BS))
        store = "store-0|default|0"
        # The store's keys find their blocks only while a0 still holds
        # them: its batch is applied before a0 lets them go.
        prefixd_fixture.applied(self.client, self.daemon,
                                {store: self.pubs["store"].last_seq}, DEADLINE_S)
        self.pubs["a0"].publish([upstream.vllm_block_removed(hashes[1:])])
        prefixd_fixture.applied(self.client, self.daemon,
                                {"vllm-a|default|0": self.pubs["a0"].last_seq}, DEADLINE_S)
        r = self.client.route(prompt)
        self.assertEqual([(w.worker, w.matched_blocks) for w in r.workers],
                         [(store, 3), ("vllm-a|default|0", 1)])
        self.assertEqual(r.best_worker, "vllm-a|default|0")
        picked = self.client.pick(prompt, dry_run=True)
        self.assertNotIn(store, [c.worker for c in picked.ranked])
        self.assertEqual(picked.worker, "vllm-a|default|0")
        with self.assertRaises(prefixd.PrefixdError) as e:
            self.client.pick(prompt, candidates=["vllm-b|default|0", store], dry_run=True)
        self.assertEqual(e.exception.code.name, "INVALID_ARGUMENT")
        self.assertIn('candidates[1] "%s" is a KV store' % store, e.exception.details)


if __name__ == "__main__":
    if not ARGS.prefixd:
        print("SKIP: --prefixd not given")
        sys.exit(common.SKIP)
    common.unittest_main()
