#!/usr/bin/python3
"""Route's answer with many workers of which few hold the prompt
(docs/operations.md, "Route and RouteBatch answers"): the answer's wire size
and Route's latency (p50, p99 over gRPC from Python, one call at a time),
listing only the workers with a match (the default) against listing every
worker (all_workers, what every answer carried before).

Engine sources of 1,000 data-parallel ranks each publish --workers ranks (a
worker each): --holders of them store the prompt, the others one block of
their own. One run, printed as a table with the ratios.

    route_answer_bench.py --prefixd build/server/prefixd [--workers 5000]
        [--holders 2] [--routes 2000]
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests", "python"))
import common  # noqa: E402  (tests/python/common.py)


def extra(ap):
    ap.add_argument("--workers", type=int, default=5000)
    ap.add_argument("--holders", type=int, default=2)
    ap.add_argument("--routes", type=int, default=2000)


ARGS = common.setup(__doc__, extra)

import grpc  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import kv_publisher  # noqa: E402
from prefixd.v1 import prefix_index_pb2 as ipb  # noqa: E402
from prefixd.v1 import prefix_index_pb2_grpc as ipb_grpc  # noqa: E402

BS = 16
PROMPT = list(range(1, 4 * BS + 1))  # 4 blocks
RANKS = 1000  # per source (an engine has at most 1,024)


def listed(stub, n):
    """Waits until n workers have applied their batch."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ws = stub.ListWorkers(ipb.ListWorkersRequest(), timeout=30).workers
        if sum(w.last_seq >= 0 for w in ws) >= n:
            return
        time.sleep(0.05)
    sys.exit("the index never listed %d workers: %d listed, %d with a batch"
             % (n, len(ws), sum(w.last_seq >= 0 for w in ws)))


def fill(pubs, stub):
    """Every worker's one batch, in sequence, 500 at a time (the SUB socket
    queues 1,000 messages)."""
    for k in range(ARGS.workers):
        if k % 500 == 0:
            listed(stub, k)
        pub = pubs[k // RANKS]
        pub.data_parallel_rank = k % RANKS
        if k < ARGS.holders:
            ev = kv_publisher.block_stored([11, 12, 13, 14], None, PROMPT, BS)
        else:
            ev = kv_publisher.block_stored([k + 100], None, [100000 + k] * BS, BS)
        pub.publish([ev])
    listed(stub, ARGS.workers)


def measure(stub, all_workers):
    req = ipb.RouteRequest(tokens=PROMPT, all_workers=all_workers)
    first = stub.Route(req, timeout=30)
    want = ARGS.workers if all_workers else ARGS.holders
    if len(first.workers) != want or first.workers[0].matched_blocks != 4:
        sys.exit("Route listed %d workers (want %d)" % (len(first.workers), want))
    lat = []
    for _ in range(ARGS.routes):
        t = time.perf_counter()
        stub.Route(req, timeout=30)
        lat.append(time.perf_counter() - t)
    lat.sort()
    return (first.ByteSize(), statistics.median(lat) * 1e3,
            lat[int(len(lat) * 0.99)] * 1e3)


def main():
    pubs = [kv_publisher.Publisher(encoding="map", replay_endpoint=None)
            for _ in range((ARGS.workers + RANKS - 1) // RANKS)]
    daemon = prefixd_fixture.Daemon(
        ARGS.prefixd, "", args=["--index_block_size=%d" % BS] + [
            "--index_source=" + p.source_flag("e%d" % i) for i, p in enumerate(pubs)]).start()
    try:
        if not all(p.wait_for_subscriber() for p in pubs):
            sys.exit("the daemon never subscribed")
        with grpc.insecure_channel(daemon.tcp, options=[
                ("grpc.max_receive_message_length", 64 << 20)]) as ch:
            stub = ipb_grpc.PrefixIndexStub(ch)
            fill(pubs, stub)
            every = measure(stub, True)
            matched = measure(stub, False)
    finally:
        daemon.stop()
    print("Route of a 4-block prompt, %d workers, %d hold it; %d calls each"
          % (ARGS.workers, ARGS.holders, ARGS.routes))
    print("%-28s %12s %10s %10s" % ("answer", "wire bytes", "p50 ms", "p99 ms"))
    for name, (size, p50, p99) in (("every worker (all_workers)", every),
                                   ("matched workers (default)", matched)):
        print("%-28s %12d %10.3f %10.3f" % (name, size, p50, p99))
    print("ratios (every / matched): bytes %.0fx, p50 %.1fx, p99 %.1fx"
          % (every[0] / matched[0], every[1] / matched[1], every[2] / matched[2]))


if __name__ == "__main__":
    main()
