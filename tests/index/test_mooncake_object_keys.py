#!/usr/bin/python3
"""Mooncake's store master as it publishes today, over real sockets to the
real daemon (docs/index.md, "Mooncake's store"): three ZeroMQ frames (empty
topic, 8-byte sequence, payload), the payload [timestamp_ms, [event maps],
dp_rank] in integer milliseconds, each stored or removed object named by its
`object_key` with `seq_hashes` empty, built here with msgpack field by field
as Mooncake's publisher design documents them. The keys are those vLLM's
Mooncake store connector and SGLang's HiCache Mooncake backend write: the
block's sha256 digest in hex, whose low 64 bits (vLLM) or first 64 bits
(SGLang) are the hash the engine's own GPU events carry.

Checks:
  - the store's batches are applied (its worker LIVE, never cleared);
  - objects of a vLLM engine's blocks and of an SGLang engine's pages make
    the store hold those blocks in its medium (CPU, DISK), found by Route
    by the prompt's tokens;
  - a removed object's block is no longer the store's, and a cleared
    backend holds nothing;
  - the master names each object's tenant: objects, removals and clears of
    another tenant than the store's registration (default) change nothing
    (their blocks counted as other_tenant drops), and a clear of its own
    tenant still clears; a second source on the same stream for tenant
    acme holds acme's objects, until acme's clear.

Usage: test_mooncake_object_keys.py --prefixd PATH [--stubs DIR]
"""

import hashlib
import os
import sys
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__)

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
import upstream  # noqa: E402  (tests/index/upstream.py)

BS = 16
DEADLINE_S = 10
TS_MS = 1765000000000
MODEL = "Qwen/Qwen3-8B"


def digest(i):
    return hashlib.sha256(b"block %d" % i).digest()


def vllm_hash(i):
    """vLLM's event hash of a sha256 block hash: its low 64 bits."""
    return int.from_bytes(digest(i)[-8:], "big")


def sglang_hash(i):
    """SGLang's: the first 16 hex digits, as a signed int64."""
    v = int(digest(i).hex()[:16], 16)
    return v - (1 << 64) if v >= 1 << 63 else v


def vllm_key(i):
    return "%s@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%s" % (MODEL, digest(i).hex())


def sglang_key(i, part):
    return "%s_%s_0_%s" % (MODEL.replace("/", "-"), digest(i).hex(), part)


class MooncakeStore(upstream.ZmqEventPublisher):
    """Mooncake's store master's KV event PUB socket: batches [timestamp_ms,
    events, dp_rank]."""

    def __init__(self):
        super().__init__(form="array", clock=lambda: TS_MS)
        self.event_id = 0

    def event(self, event_type, key=None, medium="cpu", tenant="default"):
        self.event_id += 1
        ev = {"event_id": self.event_id, "timestamp": TS_MS, "event_type": event_type,
              "model_name": None, "block_size": None, "additional_salt": None,
              "lora_name": None, "tenant_id": tenant, "backend_id": "store-0",
              "medium": None if event_type == "cleared" else medium, "dp_rank": 0}
        if event_type != "cleared":
            ev.update(group_id=None, object_key=key, seq_hashes=[], block_hashes=[],
                      base_block_idx=None)
        if event_type == "stored":
            ev.update(parent_hash=None, token_ids=None, parent_block_hash=None)
        ev["type"] = {"stored": "BlockStored", "removed": "BlockRemoved",
                      "cleared": "AllBlocksCleared"}[event_type]
        return ev


def tokens(first_block, n):
    return list(range(first_block * BS, (first_block + n) * BS))


class MooncakeObjectKeysTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.vllm = upstream.ZmqEventPublisher()
        cls.sglang = upstream.ZmqEventPublisher(form="array")
        cls.store = MooncakeStore()
        config = ('index {\n  block_size: %d\n'
                  '  sources { name: "vllm-0" endpoint: "%s" }\n'
                  '  sources { name: "sglang-0" endpoint: "%s" type: "SGLang" }\n'
                  '  sources { name: "store" endpoint: "%s" type: "Mooncake" }\n'
                  '  sources { name: "store-acme" endpoint: "%s" type: "Mooncake"'
                  ' tenant: "acme" }\n'
                  '}\n' % (BS, cls.vllm.endpoint, cls.sglang.endpoint, cls.store.endpoint,
                           cls.store.endpoint))
        cls.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config, snapshot=False).start()
        cls.client = prefixd.Client(cls.daemon.tcp)
        for pub in (cls.vllm, cls.sglang, cls.store):
            if not pub.wait_for_subscriber(DEADLINE_S):
                raise AssertionError("the daemon did not subscribe to %s" % pub.endpoint)
        # The engines' own GPU stores: vLLM blocks 0..3, SGLang pages 10..12.
        cls.vllm.publish([upstream.vllm_block_stored([vllm_hash(i) for i in range(4)], None,
                                                     tokens(0, 4), BS)])
        cls.sglang.publish([upstream.sglang_block_stored(
            [sglang_hash(i) for i in range(10, 13)], None, tokens(10, 3), BS)])
        cls.applied({"vllm-0": 0, "sglang-0": 0})

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()
        for s in (cls.vllm, cls.sglang, cls.store):
            s.close()

    @classmethod
    def applied(cls, seqs):
        return prefixd_fixture.applied(cls.client, cls.daemon, seqs, DEADLINE_S)

    def held(self, toks, store="store"):
        """The store's (matched blocks, {medium: blocks})."""
        for w in self.client.route(toks, workers=[store]).workers:
            if w.worker == store:
                return w.matched_blocks, dict(w.mediums)
        return None

    def test_1_objects_of_vllm_blocks(self):
        seq = self.store.publish([self.store.event("stored", vllm_key(i)) for i in range(3)]
                                 + [self.store.event("stored", vllm_key(3), medium="disk")])
        w = self.applied({"store": seq})["store"]
        self.assertEqual(w.state, prefixd.WorkerState.LIVE)
        self.assertEqual(w.clears, 0)
        # Block 3 on disk: the run in any medium, CPU's alone is 3.
        self.assertEqual(self.held(tokens(0, 4)), (4, {"CPU": 3}))

    def test_2_objects_of_sglang_pages(self):
        # One object per page and part (K and V): the same block twice.
        seq = self.store.publish([self.store.event("stored", sglang_key(i, part))
                                  for i in range(10, 13) for part in ("k", "v")])
        self.applied({"store": seq})
        self.assertEqual(self.held(tokens(10, 3)), (3, {"CPU": 3}))

    def test_3_removed_and_cleared(self):
        seq = self.store.publish([self.store.event("stored", vllm_key(i)) for i in range(3)]
                                 + [self.store.event("removed", vllm_key(1))])
        self.applied({"store": seq})
        self.assertEqual(self.held(tokens(0, 3))[0], 1)
        seq = self.store.publish([self.store.event("cleared")])
        w = self.applied({"store": seq})["store"]
        self.assertEqual(self.held(tokens(0, 3)), (0, {}))
        self.assertEqual(w.state, prefixd.WorkerState.LIVE)

    def other_tenant_drops(self):
        with urllib.request.urlopen("http://%s/metrics" % self.daemon.metrics,
                                    timeout=DEADLINE_S) as r:
            for line in r.read().decode().splitlines():
                if line.startswith('prefixd_index_dropped_blocks_total{reason="other_tenant"}'):
                    return float(line.split()[-1])
        return None

    def test_4_other_tenants_objects(self):
        before = self.other_tenant_drops()
        seq = self.store.publish([self.store.event("stored", vllm_key(i), tenant="acme")
                                  for i in range(3)])
        self.applied({"store": seq, "store-acme": seq})
        self.assertEqual(self.held(tokens(0, 3)), (0, {}))
        self.assertEqual(self.other_tenant_drops(), before + 3)
        # The same master followed for acme holds them.
        self.assertEqual(self.held(tokens(0, 3), "store-acme"), (3, {"CPU": 3}))
        seq = self.store.publish([self.store.event("stored", vllm_key(i)) for i in range(3)])
        clears = self.applied({"store": seq})["store"].clears
        self.assertEqual(self.held(tokens(0, 3)), (3, {"CPU": 3}))
        # Another tenant's removal and RemoveAll are not about these objects.
        seq = self.store.publish([self.store.event("removed", vllm_key(1), tenant="acme"),
                                  self.store.event("cleared", tenant="acme")])
        w = self.applied({"store": seq, "store-acme": seq})["store"]
        self.assertEqual(self.held(tokens(0, 3)), (3, {"CPU": 3}))
        self.assertEqual(w.clears, clears)
        self.assertEqual(self.held(tokens(0, 3), "store-acme"), (0, {}))
        seq = self.store.publish([self.store.event("cleared")])
        self.applied({"store": seq})
        self.assertEqual(self.held(tokens(0, 3)), (0, {}))


if __name__ == "__main__":
    if not ARGS.prefixd:
        print("SKIP: --prefixd not given")
        sys.exit(common.SKIP)
    common.unittest_main()
