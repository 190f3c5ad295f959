#!/usr/bin/python3
"""Writes the seed corpus of pick_fuzzer (tests/fuzz/corpus/pick_fuzzer/):
records as pick_fuzzer.cc describes (selector, length, bytes), the Pick
requests built with a client generated from
proto/prefixd/v1/prefix_index.proto. Deterministic: rerunning it changes
nothing unless the script changed.

    /usr/bin/python3 tests/fuzz/make_pick_seeds.py
"""

import os
import shutil
import struct
import sys
import tempfile

from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROTO = os.path.join(ROOT, "proto")
OUT = os.path.join(HERE, "corpus", "pick_fuzzer")


def record(selector, data):
    assert len(data) < 256, (selector, len(data))
    return bytes([selector, len(data)]) + data


def store(worker, tokens, cpu=False):
    """Selector 2 + 4 x (worker + 3 x cpu)."""
    return record(2 + 4 * (worker + 3 * int(cpu)), bytes(tokens))


def clock(steps):
    return record(3, bytes([steps]))


def engine(worker, running, waiting, kv_byte):
    """Selector 3 + 4 x worker + 128: worker's engine reports its load."""
    return record(131 + 4 * worker, bytes([running, waiting, kv_byte]))


def state(worker, which):
    """Selector 3 + 4 x worker + 192: worker's stream state becomes LIVE,
    REPLAYING, ERROR or CONNECTING (which = 0 .. 3)."""
    return record(195 + 4 * worker, bytes([which]))


def main():
    gen = tempfile.mkdtemp()
    try:
        if protoc.main(["protoc", "-I" + PROTO, "--python_out=" + gen,
                        os.path.join(PROTO, "prefixd", "v1", "prefix_index.proto")]) != 0:
            sys.exit("protoc failed")
        sys.path.insert(0, gen)
        from prefixd.v1 import prefix_index_pb2 as pb

        def pick(tokens, **kw):
            req = pb.PickRequest(prompt=pb.RouteRequest(
                tokens_le32=struct.pack("<%dI" % len(tokens), *tokens)), **kw)
            return record(0, req.SerializeToString())

        a = [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4]
        b = a[:8] + [7, 7, 7, 7]
        seeds = {
            "store_then_pick": store(0, a) + pick(a) + pick(b, dry_run=True),
            "predicted_then_lapse": pick(a) + pick(b) + clock(30) + pick(b, dry_run=True),
            "tiers": store(1, a, cpu=True) + store(1, a[:4]) + pick(a),
            "loads": store(2, a) + pick(a, candidates=["w0", "w2"], loads=[
                pb.WorkerLoad(worker="w2", requests_in_flight=3, queued_prefill_tokens=40,
                              kv_usage=0.5)]),
            "bad_loads": pick(a, loads=[pb.WorkerLoad(worker="w1", requests_in_flight=-1)])
            + pick(a, candidates=["w0", "w0"]) + pick(a, candidates=["nope"]) + pick([]),
            "window": pick(a) + pick(a) + pick(a) + clock(20) + pick(a) + clock(40) + pick(a),
            "engines": engine(0, 3, 2, 128) + engine(1, 0, 0, 255) + pick(a)
            + pick(a, candidates=["w0", "w1"], loads=[pb.WorkerLoad(worker="w1")])
            + clock(30) + pick(a, dry_run=True),
            "not_live": store(0, a[:8]) + pick(a, candidates=["w0"]) + state(0, 1)
            + pick(a, dry_run=True) + pick(a[:8], candidates=["w0"]) + pick(a[:8], dry_run=True)
            + state(0, 0) + pick(a, dry_run=True),
        }
        if os.path.isdir(OUT):
            shutil.rmtree(OUT)
        os.makedirs(OUT)
        for name, data in sorted(seeds.items()):
            with open(os.path.join(OUT, name), "wb") as f:
                f.write(data)
        print("wrote %d seeds to %s" % (len(seeds), OUT))
    finally:
        shutil.rmtree(gen, ignore_errors=True)


if __name__ == "__main__":
    main()
