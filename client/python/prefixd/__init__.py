"""prefixd: the Python client of the prefixd prefix-cache daemon.

    import prefixd
    client = prefixd.Client("unix:///run/prefixd/prefixd.sock")
    with client.match(tokens, pin=True) as m:
        ...

Modules: prefixd.client (Client, results, errors), prefixd.engine_sim (an
engine simulator, the worked example of docs/integration.md), prefixd.sglang
(SGLang's prefix-cache interface on top of the client), prefixd.demo_engine
(the prefixd-demo-engine command: an engine without a GPU publishing KV
events for the fleet index), prefixd.kv_publisher
(KV events on vLLM's and SGLang's ZeroMQ wire, with replay) and
prefixd.engine_pool (a paged engine cache publishing through it; both need
python3-zmq and python3-msgpack). The generated gRPC
modules are prefixd.v1.prefix_cache_pb2 and prefix_cache_pb2_grpc (and
prefix_index_pb2, prefix_index_pb2_grpc: the fleet index); they come from a
build directory (see prefixd/_stubs.py).
"""

from prefixd import _stubs

_stubs.install(__path__)

from prefixd.client import (  # noqa: E402
    HEALTH_SERVICE,
    Client,
    DeadlineExceeded,
    Epoch,
    EventStream,
    FailedPrecondition,
    InsertResult,
    InvalidArgument,
    Lease,
    ListWorkersResult,
    MatchResult,
    NotFound,
    PermissionDenied,
    PrefixdError,
    ResourceExhausted,
    Retention,
    RetentionRange,
    RopeDenied,
    PickCandidate,
    PickResult,
    RouteQuery,
    RouteResult,
    Segment,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    WorkerInfo,
    WorkerLoad,
    WorkerMatch,
    WorkerState,
    tokens_le32,
)

__all__ = [
    "HEALTH_SERVICE", "Client", "DeadlineExceeded", "Epoch", "EventStream", "FailedPrecondition",
    "InsertResult", "InvalidArgument", "Lease", "ListWorkersResult", "MatchResult", "NotFound",
    "PermissionDenied", "PrefixdError", "ResourceExhausted", "Retention", "RetentionRange",
    "PickCandidate", "PickResult", "RopeDenied", "RouteQuery",
    "RouteResult",
    "Segment", "Unauthenticated", "Unavailable", "Unimplemented", "WorkerInfo", "WorkerLoad", "WorkerMatch",
    "WorkerState", "tokens_le32",
]
