#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

    /usr/bin/python3 tests/fuzz/make_seeds.py

rpc_fuzzer seeds are short engine sessions (records as rpc_fuzzer.cc
describes: selector, length, request bytes) built with the generated Python
stubs; core_ops_fuzzer and fleet_index_fuzzer seeds are fixed pseudo-random
byte strings, which the targets turn into operation sequences, plus the
inputs of fleet_index_fuzzer's findings. The output is deterministic, so
rerunning the script changes nothing unless the script changed.
"""

import os
import random
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import gen_stubs  # noqa: E402

RPCS = ["GetInfo", "Handshake", "Match", "Insert", "Release", "KeepAlive", "Evict",
        "Invalidate", "Reset", "Stats", "WatchEvents", "Dump", "MatchBatch", "InsertBatch"]
ADVANCE = 14
META_NONE, META_A, META_B, META_TWICE, META_BAD = range(5)


def record(rpc, message=b"", meta=META_A):
    data = message if isinstance(message, bytes) else message.SerializeToString()
    assert len(data) < 256, (rpc, len(data))
    index = ADVANCE if rpc == "advance" else RPCS.index(rpc)
    return bytes([index + 15 * meta, len(data)]) + data


def tokens(first, n):
    return list(range(first, first + n))


def rpc_seeds(pb):
    s = {}
    s["engine_session"] = b"".join([
        record("GetInfo", meta=META_NONE),
        record("Handshake", pb.HandshakeRequest(engine_id="e0", model_fingerprint="0" * 16)),
        record("Match", pb.MatchRequest(tokens=tokens(0, 8), pin=True)),
        record("Insert", pb.InsertRequest(tokens=tokens(0, 8), block_ids=[1, 2, 3, 4], pin=True)),
        record("Match", pb.MatchRequest(tokens=tokens(0, 6))),
        record("Insert", pb.InsertRequest(tokens=tokens(0, 4) + [9, 9], block_ids=[1, 2, 7])),
        record("KeepAlive", pb.KeepAliveRequest(lease_ids=[1, 2])),
        record("Dump", pb.DumpRequest()),
        record("Stats", pb.StatsRequest(all_tenants=True)),
    ])
    s["two_tenants_evict"] = b"".join([
        record("Insert", pb.InsertRequest(tokens=tokens(0, 16), block_ids=list(range(10, 18)))),
        record("Insert", pb.InsertRequest(tokens=tokens(0, 16), block_ids=list(range(20, 28))),
               META_B),
        record("Insert", pb.InsertRequest(namespace="lora1", tokens=tokens(100, 8),
                                          block_ids=[30, 31, 32, 33], position_offset=64)),
        record("Match", pb.MatchRequest(namespace="lora1", tokens=tokens(100, 8),
                                        position_offset=32, pin=True)),
        record("Evict", pb.EvictRequest(blocks=5)),
        record("Invalidate", pb.InvalidateRequest(block_ids=[20, 999])),
        record("Invalidate", pb.InvalidateRequest(block_ids=[10])),
        record("Reset", pb.ResetRequest(tenant="b")),
    ])
    s["budget_and_leases"] = b"".join(
        [record("Insert", pb.InsertRequest(tokens=tokens(10 * i, 8),
                                           block_ids=[100 + 4 * i + j for j in range(4)],
                                           pin=i % 2 == 0, lease_ttl_ms=500))
         for i in range(10)] +
        [record("advance", b"\x00" * 6), record("Evict", pb.EvictRequest(blocks=64)),
         record("Release", pb.ReleaseRequest(lease_id=12345))])
    s["bad_input"] = b"".join([
        record("Match", pb.MatchRequest()),
        record("Insert", pb.InsertRequest(tokens=tokens(0, 3), block_ids=[1])),
        record("Insert", pb.InsertRequest(tokens=tokens(0, 4), block_ids=[5, 5])),
        record("Match", pb.MatchRequest(tokens=[1, 2], position_offset=-5)),
        record("Match", pb.MatchRequest(namespace="a b", tokens=[1, 2]), META_TWICE),
        record("Match", pb.MatchRequest(tokens=[1, 2]), META_BAD),
        record("Evict", pb.EvictRequest(blocks=0)),
        record("KeepAlive", pb.KeepAliveRequest()),
        record("Reset", pb.ResetRequest(tenant="a", all=True)),
        record("Insert", b"\x12\xff\xff\xff\xff\x0f"),  # a length past the end
        record("Handshake", pb.HandshakeRequest()),
    ])
    s["watch"] = b"".join([
        record("Insert", pb.InsertRequest(tokens=tokens(0, 4), block_ids=[1, 2])),
        record("WatchEvents", pb.WatchEventsRequest(from_sequence=0)),
        record("WatchEvents", pb.WatchEventsRequest(from_sequence=2 ** 63)),
    ])
    s["batches"] = b"".join([
        record("InsertBatch", pb.InsertBatchRequest(requests=[
            pb.InsertRequest(tokens=tokens(0, 4), block_ids=[1, 2]),
            pb.InsertRequest(tokens=tokens(0, 6), block_ids=[3, 4, 5], pin=True),
            pb.InsertRequest(tokens=tokens(0, 3), block_ids=[6]),
            pb.InsertRequest(tokens=tokens(50, 2), block_ids=[2])])),
        record("MatchBatch", pb.MatchBatchRequest(requests=[
            pb.MatchRequest(tokens=tokens(0, 6), pin=True),
            pb.MatchRequest(),
            pb.MatchRequest(tokens=tokens(50, 2), position_offset=-1)])),
        record("Evict", pb.EvictRequest(blocks=2)),
    ])
    return s


def core_seeds():
    rng = random.Random(7)
    return {"random_%d" % i: bytes(rng.randrange(256) for _ in range(n))
            for i, n in enumerate([16, 64, 256, 512, 1024, 2048])}


def fleet_index_seeds():
    rng = random.Random(11)
    seeds = {"random_%d" % i: bytes(rng.randrange(256) for _ in range(n))
             for i, n in enumerate([32, 128, 512, 2048])}
    # One store whose four blocks carry one hash: before the fix, moving the
    # hash off a block pruned the chain's blocks not yet held. (The last
    # byte, read first, asks for a small max_entries.)
    seeds["regression-repeated-hash"] = bytes.fromhex(
        "2f4a3b000000000000000000000000000760001543a5000a000a01")
    return seeds


def write(target, seeds):
    out = os.path.join(HERE, "corpus", target)
    os.makedirs(out, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        gen_stubs.generate(tmp)
        sys.path.insert(0, tmp)
        from prefixd.v1 import prefix_cache_pb2 as pb
        write("rpc_fuzzer", rpc_seeds(pb))
    write("core_ops_fuzzer", core_seeds())
    write("fleet_index_fuzzer", fleet_index_seeds())


if __name__ == "__main__":
    main()
