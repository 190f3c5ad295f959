#!/usr/bin/python3
"""Writes the seed corpus of kv_indexer_fuzzer (tests/fuzz/corpus/
kv_indexer_fuzzer/): records as kv_indexer_fuzzer.cc describes (selector,
length, request bytes), built with a client generated from
proto/kv_indexer/v1/kv_indexer.proto, and, for requests whose hashes are
decimal text (the standalone sgl-kv-indexer's form, server/kv_indexer_wire.h),
kv_indexer_decimal.proto. Deterministic: rerunning it changes nothing unless
the script changed.

    /usr/bin/python3 tests/fuzz/make_kv_indexer_seeds.py
"""

import os
import shutil
import sys
import tempfile

from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROTO = os.path.join(ROOT, "proto")
OUT = os.path.join(HERE, "corpus", "kv_indexer_fuzzer")

APPLY, REPLACE, CONFIGURE, MATCH, PREFIX, HITS, INVALIDATE = range(7)


def record(rpc, message):
    """One record: `message` is a protobuf message or its bytes."""
    data = message if isinstance(message, bytes) else message.SerializeToString()
    assert len(data) < 256, (rpc, len(data))
    return bytes([rpc, len(data)]) + data


def decimal_apply(kv, dec, worker, address, actions):
    """An ApplyExternalKvBatchRequest with its hashes as decimal text:
    actions are (type, tier, [hash text])."""
    out = dec.ApplyRequest.FromString(kv.ApplyExternalKvBatchRequest(
        worker_id=worker, seq=1, worker_address=address).SerializeToString())
    for kind, tier, texts in actions:
        out.actions.append(dec.Action.FromString(
            kv.ExternalKvAction(type=kind, tier=tier).SerializeToString()
            + dec.Action(hashes=[t.encode() for t in texts]).SerializeToString()))
    return out


def decimal_list(dec, message, texts, **fields):
    """The bytes of `message` (a request whose hashes are field 1) with
    `fields` and decimal hashes: the two encodings concatenated, which a
    parser reads as one message."""
    return (message(**fields).SerializeToString()
            + dec.HashList(hashes=[t.encode() for t in texts]).SerializeToString())


def main():
    gen = tempfile.mkdtemp()
    try:
        if protoc.main(["protoc", "-I" + PROTO, "--python_out=" + gen,
                        os.path.join(PROTO, "kv_indexer", "v1", "kv_indexer.proto"),
                        os.path.join(PROTO, "kv_indexer", "v1",
                                     "kv_indexer_decimal.proto")]) != 0:
            sys.exit("protoc failed")
        sys.path.insert(0, gen)
        from kv_indexer.v1 import kv_indexer_pb2 as kv
        from kv_indexer.v1 import kv_indexer_decimal_pb2 as dec
        texts = ["-895308556211281782", "42", "17551435517498269834"]
        act = kv.ExternalKvAction
        spec = kv.WorkerCacheSpec(version=1, components=7, swa_window_tokens=8)
        seeds = {
            "report_and_prefix": [
                record(APPLY, kv.ApplyExternalKvBatchRequest(
                    worker_id="a", seq=1, worker_address="a:1",
                    actions=[act(type=1, tier=1, hashes=[1, -2, 3])])),
                record(PREFIX, kv.MatchExternalKvPrefixRequest(hashes=[1, -2, 3, 4])),
                record(MATCH, kv.MatchExternalKvRequest(hashes=[3, 1], count_as_hit=True)),
                record(HITS, kv.GetExternalKvHitCountsRequest(hashes=[1, 3])),
            ],
            "sequence_and_snapshot": [
                record(APPLY, kv.ApplyExternalKvBatchRequest(
                    worker_id="s", seq=4, worker_address="s:1", enforce_sequence=True,
                    worker_epoch="e", actions=[act(type=1, tier=2, hashes=[9])])),
                record(APPLY, kv.ApplyExternalKvBatchRequest(
                    worker_id="s", seq=7, enforce_sequence=True, worker_epoch="e",
                    actions=[act(type=2, tier=2, hashes=[9])])),
                record(REPLACE, kv.ReplaceExternalKvSnapshotRequest(
                    worker_id="s", worker_address="s:1", worker_epoch="f", applied_seq=9,
                    hashes_by_tier=[kv.TierHashes(tier=3, hashes=[9, 10])])),
                record(PREFIX, kv.MatchExternalKvPrefixRequest(hashes=[9, 10], max_blocks=1)),
            ],
            "hybrid_and_configure": [
                record(CONFIGURE, kv.ConfigureExpectedWorkersRequest(workers=[
                    kv.ExpectedWorker(worker_id="h", worker_address="h:1", cache_spec=spec)])),
                record(APPLY, kv.ApplyExternalKvBatchRequest(
                    worker_id="h", seq=1, worker_address="h:1", cache_spec=spec,
                    actions=[act(type=1, tier=1, hashes=[5, 6, 7], component_masks=[1, 3, 7],
                                 block_sizes=[4, 4, 4]),
                             act(type=3, tier=2)])),
                record(PREFIX, kv.MatchExternalKvPrefixRequest(hashes=[5, 6, 7])),
                record(CONFIGURE, kv.ConfigureExpectedWorkersRequest()),
            ],
            "invalidate": [
                record(APPLY, kv.ApplyExternalKvBatchRequest(
                    worker_id="i", seq=1, worker_address="i:1", enforce_sequence=True,
                    worker_epoch="e", actions=[act(type=1, tier=1, hashes=[11, 12])])),
                record(INVALIDATE, kv.InvalidateWorkerRequest(worker_id="i")),
                record(APPLY, kv.ApplyExternalKvBatchRequest(
                    worker_id="i", seq=2, enforce_sequence=True, worker_epoch="e",
                    actions=[act(type=1, tier=1, hashes=[13])])),
                record(INVALIDATE, kv.InvalidateWorkerRequest(worker_id="gone")),
                record(PREFIX, kv.MatchExternalKvPrefixRequest(hashes=[11, 12, 13])),
            ],
            "decimal_hashes": [
                record(APPLY, decimal_apply(kv, dec, "w0", "w0:1", [(1, 1, texts)])),
                record(PREFIX, decimal_list(dec, kv.MatchExternalKvPrefixRequest, texts,
                                            max_blocks=2)),
                record(MATCH, decimal_list(dec, kv.MatchExternalKvRequest, texts,
                                           count_as_hit=True)),
                record(HITS, decimal_list(dec, kv.GetExternalKvHitCountsRequest, texts)),
            ],
            "decimal_bad_entry": [
                record(APPLY, decimal_apply(kv, dec, "w0", "w0:1", [(1, 1, ["12", "0x1f"])])),
            ],
            "bad_input": [
                record(APPLY, kv.ApplyExternalKvBatchRequest(
                    worker_id="b", actions=[act(type=9, tier=0, hashes=[1],
                                                component_masks=[1, 2])])),
                record(PREFIX, kv.MatchExternalKvPrefixRequest()),
                record(MATCH, kv.MatchExternalKvRequest(hashes=list(range(17)))),
                record(PREFIX, kv.MatchExternalKvPrefixRequest(hashes=list(range(25)))),
            ],
        }
        shutil.rmtree(OUT, ignore_errors=True)
        os.makedirs(OUT)
        for name, records in seeds.items():
            with open(os.path.join(OUT, name), "wb") as f:
                f.write(b"".join(records))
    finally:
        shutil.rmtree(gen, ignore_errors=True)


if __name__ == "__main__":
    main()
