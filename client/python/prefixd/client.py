"""prefixd.Client: a small typed layer over the generated PrefixCache stub,
and over PrefixIndex (the fleet index, docs/index.md: route, route_batch,
list_workers) on the same channel.

    client = prefixd.Client("unix:///run/prefixd/prefixd.sock", tenant="acme",
                            token=os.environ.get("PREFIXD_TOKEN"), deadline=2.0,
                            on_epoch_change=lambda old, new: engine.drop_cache_view())
    with client.match(prompt, pin=True) as m:     # the lease is released on exit
        reuse(m.block_ids, m.segments)            # segments carry rope_delta
        ...
        r = client.insert(prompt_blocks_tokens, block_ids)
        engine.free(r.redundant_block_ids + r.evicted_block_ids)

- Every call carries a deadline (the client's, or `timeout=` per call) and
  the caller's metadata: `authorization: Bearer <token>`, `x-prefixd-tenant`.
- Errors raise PrefixdError subclasses named after the gRPC code
  (InvalidArgument, NotFound, ResourceExhausted, ...), message kept as is.
- With `pin=True`, Match and Insert return a result holding a Lease; use the
  result (or the lease) as a context manager to release it on exit. Release
  on exit is best effort: an expired lease is already gone.
- Epochs: the client remembers the first epoch a response carries; when a
  later response carries another, the daemon lost its cache state and every
  block ID the engine believed cached there is gone. `on_epoch_change(old,
  new)` is then called once, on the calling thread, before the call returns,
  and the new epoch becomes the baseline.

- The fleet index: `route(tokens, lora_name=..., cache_salt=...)` says how
  many leading blocks of a prompt each worker (engine) holds, best first;
  `list_workers()` what the index knows of each worker. A daemon that runs
  no index raises Unimplemented.

Thread safety: a Client may be used from many threads at once (grpc
channels are); a Lease belongs to one thread at a time.
"""

import array
import enum
import sys
import threading
from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence,
                    Tuple, TypeVar, Union)

import grpc

from prefixd.v1 import prefix_cache_pb2 as pb
from prefixd.v1 import prefix_cache_pb2_grpc as pb_grpc
from prefixd.v1 import prefix_index_pb2 as ipb
from prefixd.v1 import prefix_index_pb2_grpc as ipb_grpc

TENANT_HEADER = "x-prefixd-tenant"
HEALTH_SERVICE = "prefixd.v1.PrefixCache"

EpochCallback = Callable[[int, int], None]

# Route's per-block extra keys: {block index: [typed key, ...]} (or pairs),
# each key a dict in vLLM's typed form, e.g. {"type": "mm", "hash": "...",
# "block_offset": 0}.
ExtraKeys = Union[Mapping[int, Sequence[Mapping[str, Any]]],
                  Sequence[Tuple[int, Sequence[Mapping[str, Any]]]]]


# ---- errors ------------------------------------------------------------------

class PrefixdError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the daemon's
    message, `method` the RPC."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str):
        super().__init__("%s: %s: %s" % (method, code.name, details))
        self.method = method
        self.code = code
        self.details = details


class InvalidArgument(PrefixdError):
    pass


class NotFound(PrefixdError):
    pass


class ResourceExhausted(PrefixdError):
    pass


class FailedPrecondition(PrefixdError):
    pass


class Unauthenticated(PrefixdError):
    pass


class PermissionDenied(PrefixdError):
    pass


class Unavailable(PrefixdError):
    pass


class DeadlineExceeded(PrefixdError):
    pass


class Unimplemented(PrefixdError):
    """The daemon does not serve the method: for route, route_batch and
    list_workers, it runs no fleet index (start it with
    --index_source=NAME=ENDPOINT or an index { } config: docs/index.md)."""


_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}


# The fleet index's RPCs (prefixd.v1.PrefixIndex): UNIMPLEMENTED from them
# means the daemon runs no index, which gRPC reports with an empty message.
_INDEX_METHODS = ("Route", "RouteBatch", "ListWorkers", "Pick", "PickBatch")


def _error(method: str, e: grpc.RpcError, client: Optional["Client"] = None) -> PrefixdError:
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = (e.details() if hasattr(e, "details") else str(e)) or ""
    if code == grpc.StatusCode.UNAVAILABLE and client is not None:
        details = explain_connect_error(client.target, details, tls=client._tls,
                                        client_cert=client._client_cert) or details
    if code == grpc.StatusCode.UNIMPLEMENTED and method in _INDEX_METHODS:
        where = " at %s" % client.target if client is not None else ""
        details = ("the daemon%s does not serve the fleet index: start it with "
                   "--index_source=NAME=ENDPOINT or an index { } config (docs/index.md)%s"
                   % (where, "; " + details if details else ""))
    return _ERRORS.get(code, PrefixdError)(method, code, details)


# Connection failures as one actionable line: gRPC reports them as UNAVAILABLE
# in its transport's words ("Socket closed", "Connection refused", a DNS error
# for a file path). The same rules as the C++ client (client/connect_error.cc);
# docs/client.md, "Connection errors", lists them.

def check_target(target: str) -> None:
    """ValueError for a target that is a file path ("/tmp/prefixd.sock"),
    which gRPC would take for a host name, naming the unix:// address."""
    if not target:
        raise ValueError("empty target address")
    if "://" in target or not (target.startswith(("/", "./", "../"))
                               or target.endswith(".sock")):
        return
    hint = ("unix://" + target if target.startswith("/")
            else "unix:%s (relative) or unix:///ABSOLUTE/PATH" % target)
    raise ValueError('address "%s" is a file path; a Unix socket\'s address is %s'
                     % (target, hint))


def explain_connect_error(target: str, details: str, *, tls: bool,
                          client_cert: bool) -> Optional[str]:
    """The message of an UNAVAILABLE from `target` as one line naming the
    address, the cause and what to change; None when `details` is not a
    connection failure (a draining daemon's own UNAVAILABLE, say)."""
    why = details.lower()
    running = ": is the daemon running at %s? (prefixd --listen=%s)" % (target, target)
    if "connection refused" in why:
        advice = "connection refused" + running
    elif "no such file or directory" in why:
        advice = "no such socket file" + running
    elif any(w in why for w in ("dns resolution failed", "name or service not known",
                                "domain name not found")):
        advice = "the host name does not resolve: give host:port, or unix:///path for a Unix socket"
    elif "wrong_version_number" in why or "wrong version number" in why:
        advice = ("the daemon does not serve TLS on this port: connect without TLS "
                  "(tls=False, no tls_ca_file)")
    elif "certificate_verify_failed" in why or "certificate verify" in why:
        advice = ("the daemon's certificate does not verify: give the CA that signed it "
                  "(tls_ca_file=...), and dial a name its subjectAltName lists")
    elif not any(w in why for w in ("socket closed", "connection reset", "broken pipe",
                                    "end of tcp stream", "handshake", "alert")):
        return None
    elif not tls:
        advice = ("the daemon closed the connection: it likely serves TLS on this port; "
                  "connect with TLS and the CA of its certificate (tls_ca_file=..., or "
                  "tls=True for the system roots)")
    elif not client_cert:
        advice = ("the daemon ended the TLS handshake: with auth mode MTLS it requires a "
                  "client certificate signed by its client CA (tls_cert_file=..., "
                  "tls_key_file=...)")
    else:
        advice = ("the daemon ended the TLS handshake: check that its client CA signed the "
                  "client certificate (tls_cert_file)")
    return "cannot connect to %s: %s" % (target, advice)


# ---- results -----------------------------------------------------------------

class Epoch(int):
    """An epoch: an int that prints as 16 hex digits, as prefixctl's tables
    and JSON and the daemon's log print it, so one epoch reads the same
    everywhere. repr() is the hex literal, 0x...; comparisons are int's."""

    def __str__(self) -> str:
        return "%016x" % int(self)

    def __repr__(self) -> str:
        return "0x%016x" % int(self)


@dataclass(frozen=True)
class RopeDenied:
    """Why a match stopped under rope.shift DENY: the next block of the query
    is cached at `cached_position`, not at `requested_position`, and DENY
    matches only blocks at the requested position."""
    requested_position: int
    cached_position: int


@dataclass(frozen=True)
class Segment:
    """Matched blocks that share one RoPE delta: re-rotate their keys by
    `rope_delta` positions (0: reuse as they are)."""
    block_ids: Tuple[int, ...]
    cached_position: int
    rope_delta: int


@dataclass(frozen=True)
class RetentionRange:
    """A hint for the blocks whose first token's offset in the Insert's
    tokens is in [token_begin, token_end); token_end 0: to the end."""
    token_begin: int
    token_end: int = 0
    priority: int = 50
    duration: Optional[float] = None  # seconds; None or 0: never lapses


@dataclass(frozen=True)
class Retention:
    """How long inserted blocks should stay (docs/api.md, "Retention"):
    lower priorities (0..100) are evicted first; after `duration` seconds the
    hint lapses and the block is ordinary (priority 50). Pins stay absolute
    and hints never break the budget. `ranges` (sorted, not overlapping)
    give parts of the Insert their own hint.

        client.insert(system_prompt, ids, retention=Retention(priority=90))
        client.insert(session, ids, retention=Retention(priority=80, duration=600))
    """
    priority: Optional[int] = None  # None: 50
    duration: Optional[float] = None  # seconds; None or 0: never lapses
    ranges: Sequence[RetentionRange] = ()

    def to_proto(self) -> pb.Retention:
        r = pb.Retention(duration_ms=_ms(self.duration), ranges=[
            pb.RetentionRange(token_begin=g.token_begin, token_end=g.token_end,
                              priority=g.priority, duration_ms=_ms(g.duration))
            for g in self.ranges])
        if self.priority is not None:
            r.priority = self.priority
        return r


class Lease:
    """A pin on a cached path. `with lease:` releases it on exit."""

    def __init__(self, client: "Client", lease_id: int):
        self._client = client
        self.id = lease_id

    def __bool__(self) -> bool:
        return self.id != 0

    def __repr__(self) -> str:
        return "Lease(%#x)" % self.id

    def release(self) -> None:
        """Ends the lease now; raises NotFound if it had already expired."""
        if self.id:
            lease_id, self.id = self.id, 0
            self._client.release(lease_id)

    def keepalive(self) -> float:
        """Renews the lease; returns the seconds it now has left."""
        return self._client.keepalive([self.id])[0]

    def detach(self) -> int:
        """Gives up ownership without releasing; returns the id."""
        lease_id, self.id = self.id, 0
        return lease_id

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> bool:
        try:
            self.release()
        except PrefixdError:
            pass  # best effort: the lease ends by its TTL anyway
        return False


class _Leased:
    """Mixin: a result whose lease a `with` block releases."""
    lease: Optional[Lease]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        if self.lease:
            self.lease.__exit__(*exc)
        return False


@dataclass
class MatchResult(_Leased):
    epoch: Epoch
    matched_tokens: int
    segments: List[Segment]
    lease: Optional[Lease] = None  # with pin=True and a non-empty match
    rope_denied: Optional[RopeDenied] = None  # why DENY stopped the match

    @property
    def block_ids(self) -> List[int]:
        """Every matched block ID, in order."""
        return [b for s in self.segments for b in s.block_ids]


@dataclass
class InsertResult(_Leased):
    epoch: Epoch
    cached_tokens: int
    # Both lists are the engine's to free: IDs it passed for blocks that were
    # already cached under other IDs, and blocks evicted to make room.
    redundant_block_ids: List[int] = field(default_factory=list)
    evicted_block_ids: List[int] = field(default_factory=list)
    lease: Optional[Lease] = None  # with pin=True


# ---- fleet index results -----------------------------------------------------

class WorkerState(enum.IntEnum):
    """The state of a worker's event stream (WorkerState in
    prefix_index.proto). Equal to the proto's numbers (prefix_index_pb2.LIVE
    == WorkerState.LIVE); prints as its name."""
    UNSPECIFIED = 0
    CONNECTING = 1  # not connected (or just cleared after a broken batch)
    LIVE = 2        # connected; every batch seen was applied in sequence
    REPLAYING = 3   # a gap was seen; missing batches are being fetched
    ERROR = 4       # events cannot be applied (state_detail says why)

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        return format(self.name, spec)


# A state this client does not know (a newer daemon's) stays a plain int.
State = Union[WorkerState, int]


@dataclass
class WorkerMatch:
    """How much of a prompt one worker holds (an entry of RouteResult)."""
    worker: str
    # The whole blocks from the start of the prompt the worker can reuse:
    # the longest run it holds in any medium (for an engine serving a hybrid
    # model, as far as each of its KV-cache groups holds what it needs).
    matched_blocks: int
    mediums: Dict[str, int]  # per medium ("GPU", "CPU", ...), the run held there
    state: State             # WorkerState.LIVE, ...
    last_seq: int            # the last event batch applied; -1: none yet
    lag_ms: int              # now - that batch's engine timestamp
    # The run its full-attention group(s) hold (== matched_blocks unless the
    # engine serves a hybrid model).
    full_attention_blocks: int = 0


@dataclass
class RouteResult:
    # Most matched_blocks first, then by name: those with a matched block
    # (every worker with all_workers, the named ones with a workers filter).
    workers: List[WorkerMatch]
    best_worker: str            # the first LIVE engine holding block 0; "" if none
    prompt_blocks: int          # whole blocks in the prompt
    block_size: int

    @property
    def best(self) -> Optional[WorkerMatch]:
        """The best worker's entry; None when no worker holds the first block."""
        for w in self.workers:
            if self.best_worker and w.worker == self.best_worker:
                return w
        return None


@dataclass(frozen=True)
class RouteQuery:
    """One prompt of route_batch with its own namespace and worker filter."""
    tokens: Sequence[int]
    lora_name: Optional[str] = None
    lora_id: Optional[int] = None
    cache_salt: Optional[str] = None
    workers: Optional[Sequence[str]] = None
    block_extra_keys: Optional[ExtraKeys] = None
    all_workers: bool = False


@dataclass
class WorkerLoad:
    """A candidate's load as the router sees it (pick's `loads`)."""
    requests_in_flight: int = 0
    queued_prefill_tokens: int = 0  # prompt tokens it has yet to prefill
    kv_usage: float = 0.0           # fraction of its KV cache in use, 0..1


@dataclass
class PickCandidate:
    """One candidate of a Pick with its cost terms, in tokens: cost =
    prefill_weight x prefill_tokens + load_term + churn_term + affinity_term."""
    worker: str
    cost: float
    prefill_tokens: float     # the prompt's tokens less credited blocks x block_size
    load_term: float
    affinity_term: float      # <= 0
    matched_blocks: int       # leading blocks its events say it holds
    predicted_blocks: int     # further blocks earlier picks sent it
    credited_blocks: float    # tier-weighted matched + predicted
    state: State
    load_from_request: bool   # the load given in `loads`, else the index's window
    requests_in_flight: int
    queued_prefill_tokens: int
    kv_usage: float
    churn_term: float = 0.0   # churn_weight x churn_tokens
    churn_tokens: float = 0.0  # prefill tokens Pick sent it within churn_window
    # requests and KV usage from the engine's own metrics endpoint
    # (index.pick.engine_metrics), queued tokens from the window
    load_from_engine: bool = False


@dataclass
class PickResult:
    worker: str                  # the chosen candidate (ranked[0])
    ranked: List[PickCandidate]  # cheapest first
    decision_id: int             # 0 for a dry run
    prompt_blocks: int
    block_size: int


@dataclass
class WorkerInfo:
    """One worker as the index knows it (an entry of ListWorkersResult)."""
    worker: str
    endpoint: str          # where its events come from
    state: State           # WorkerState.LIVE, ...
    state_detail: str      # why, when there is something to say ("" otherwise)
    mediums: Dict[str, int]  # blocks held per medium
    events: int            # events applied
    gaps: int              # sequence gaps seen
    replays: int           # replay requests made
    clears: int            # AllBlocksCleared, engine restarts, unfillable gaps
    dropped_blocks: int    # blocks of this worker the index did not take
    last_seq: int          # the last batch applied; -1: none yet
    last_event_unix_ms: int  # when that batch was applied; 0: never
    # Why it was last cleared or put in ERROR ("reason: detail"); "" if never.
    last_error: str = ""
    event_version: int = 0  # the highest its events declared
    # A hybrid model's KV-cache groups: group_idx -> (kind, window_blocks).
    groups: Dict[int, Tuple[str, int]] = field(default_factory=dict)


@dataclass
class ListWorkersResult:
    workers: List[WorkerInfo]
    block_size: int
    entries: int       # (block, worker) entries in the index
    max_entries: int


R = TypeVar("R")
# One entry of a batch's answer: the item's result, or its own error.
BatchItem = Union[R, PrefixdError]


# ---- the client --------------------------------------------------------------

class Client:
    def __init__(self, target: str, *, tenant: Optional[str] = None,
                 token: Optional[str] = None, deadline: float = 5.0,
                 on_epoch_change: Optional[EpochCallback] = None,
                 tls: bool = False, tls_ca_file: Optional[str] = None,
                 tls_cert_file: Optional[str] = None, tls_key_file: Optional[str] = None,
                 channel_options: Sequence[Tuple[str, object]] = ()):
        """`target`: "host:port" or "unix:///path". `deadline`: seconds per
        unary call. TLS when `tls` or any file is given (cert + key: mTLS).
        ValueError for a file path as `target` (it names the unix:// one)."""
        check_target(target)
        self.target = target
        self._tls = bool(tls or tls_ca_file or tls_cert_file)
        self._client_cert = bool(tls_cert_file)
        self.deadline = deadline
        self.on_epoch_change = on_epoch_change
        self._metadata: List[Tuple[str, str]] = []
        if tenant:
            self._metadata.append((TENANT_HEADER, tenant))
        if token:
            self._metadata.append(("authorization", "Bearer " + token))
        options = list(channel_options) + [("grpc.max_receive_message_length", 64 << 20),
                                           ("grpc.max_send_message_length", 64 << 20)]
        if tls or tls_ca_file or tls_cert_file:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca_file), private_key=_read(tls_key_file),
                certificate_chain=_read(tls_cert_file))
            self._channel = grpc.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._stub = pb_grpc.PrefixCacheStub(self._channel)
        self._index_stub = ipb_grpc.PrefixIndexStub(self._channel)
        self._epoch_lock = threading.Lock()
        self._epoch: Optional[int] = None

    # ---- lifecycle ----

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    # ---- epochs ----

    @property
    def epoch(self) -> Optional[Epoch]:
        """The epoch of the daemon's cache state as last seen (prints in
        hex); None before the first response."""
        with self._epoch_lock:
            return self._epoch

    def _see_epoch(self, epoch: int) -> None:
        if epoch == 0:
            return
        epoch = Epoch(epoch)
        with self._epoch_lock:
            old, self._epoch = self._epoch, epoch
        if old is not None and old != epoch and self.on_epoch_change is not None:
            self.on_epoch_change(old, epoch)

    # ---- calls ----

    def _call(self, method: str, request, timeout: Optional[float], stub=None):
        try:
            return getattr(stub or self._stub, method)(
                request, timeout=self.deadline if timeout is None else timeout,
                metadata=self._metadata)
        except grpc.RpcError as e:
            raise _error(method, e, self) from None

    def info(self, *, timeout: Optional[float] = None) -> pb.GetInfoResponse:
        r = self._call("GetInfo", pb.GetInfoRequest(), timeout)
        self._see_epoch(r.epoch)
        return r

    def handshake(self, engine_id: str, model_fingerprint: str, *,
                  model_fingerprint_text: str = "",
                  timeout: Optional[float] = None) -> pb.HandshakeResponse:
        """FailedPrecondition when the daemon serves another model geometry."""
        req = pb.HandshakeRequest(engine_id=engine_id, model_fingerprint=model_fingerprint)
        if model_fingerprint_text and "model_fingerprint_text" in req.DESCRIPTOR.fields_by_name:
            req.model_fingerprint_text = model_fingerprint_text
        r = self._call("Handshake", req, timeout)
        self._see_epoch(r.epoch)
        return r

    def match(self, tokens: Sequence[int], *, namespace: str = "", position_offset: int = 0,
              pin: bool = False, lease_ttl: Optional[float] = None,
              timeout: Optional[float] = None) -> MatchResult:
        """The longest cached prefix of `tokens` (whole blocks only)."""
        r = self._call("Match", self._match_request(
            tokens, namespace, position_offset, pin, lease_ttl), timeout)
        self._see_epoch(r.epoch)
        return self._match_result(r)

    def insert(self, tokens: Sequence[int], block_ids: Sequence[int], *, namespace: str = "",
               position_offset: int = 0, pin: bool = False, lease_ttl: Optional[float] = None,
               retention: Optional[Retention] = None,
               timeout: Optional[float] = None) -> InsertResult:
        """Offers `block_ids` (len(tokens) / block_size of them) to the cache.
        Free every ID in redundant_block_ids and evicted_block_ids. With
        `retention`, every block the tokens cover takes that hint."""
        r = self._call("Insert", self._insert_request(
            tokens, block_ids, namespace, position_offset, pin, lease_ttl, retention), timeout)
        self._see_epoch(r.epoch)
        return self._insert_result(r)

    def match_batch(self, prompts: Sequence[Sequence[int]], *, namespace: str = "",
                    position_offsets: Optional[Sequence[int]] = None, pin: bool = False,
                    lease_ttl: Optional[float] = None,
                    timeout: Optional[float] = None) -> List[BatchItem[MatchResult]]:
        """Matches every prompt in one round trip (MatchBatch): one entry per
        prompt, in order, a MatchResult or that prompt's own PrefixdError
        (returned, not raised: the other prompts ran). Raises only when the
        daemon refuses the whole batch (empty, past the limits)."""
        offsets = _offsets(position_offsets, len(prompts))
        r = self._call("MatchBatch", pb.MatchBatchRequest(requests=[
            self._match_request(t, namespace, o, pin, lease_ttl)
            for t, o in zip(prompts, offsets)]), timeout)
        self._see_epoch(r.epoch)
        return [self._match_result(i.response) if i.code == 0
                else _item_error("MatchBatch", i.code, i.message) for i in r.results]

    def insert_batch(self, items: Sequence[Tuple[Sequence[int], Sequence[int]]], *,
                     namespace: str = "", position_offsets: Optional[Sequence[int]] = None,
                     pin: bool = False, lease_ttl: Optional[float] = None,
                     retention: Optional[Retention] = None,
                     timeout: Optional[float] = None) -> List[BatchItem[InsertResult]]:
        """Inserts every (tokens, block_ids) pair in one round trip
        (InsertBatch), in order: an InsertResult (free its redundant and
        evicted IDs, as for insert) or that item's own PrefixdError (its IDs
        stay the engine's). Raises only when the whole batch is refused.
        `retention` applies to every item."""
        offsets = _offsets(position_offsets, len(items))
        r = self._call("InsertBatch", pb.InsertBatchRequest(requests=[
            self._insert_request(t, ids, namespace, o, pin, lease_ttl, retention)
            for (t, ids), o in zip(items, offsets)]), timeout)
        self._see_epoch(r.epoch)
        return [self._insert_result(i.response) if i.code == 0
                else _item_error("InsertBatch", i.code, i.message) for i in r.results]

    @staticmethod
    def _match_request(tokens, namespace, position_offset, pin, lease_ttl) -> pb.MatchRequest:
        return pb.MatchRequest(
            namespace=namespace, tokens_le32=tokens_le32(tokens),
            position_offset=position_offset, pin=pin, lease_ttl_ms=_ms(lease_ttl))

    @staticmethod
    def _insert_request(tokens, block_ids, namespace, position_offset, pin,
                        lease_ttl, retention=None) -> pb.InsertRequest:
        r = pb.InsertRequest(
            namespace=namespace, tokens_le32=tokens_le32(tokens), block_ids=block_ids,
            position_offset=position_offset, pin=pin, lease_ttl_ms=_ms(lease_ttl))
        if retention is not None:
            r.retention.CopyFrom(retention.to_proto())
        return r

    def _match_result(self, r: pb.MatchResponse) -> MatchResult:
        return MatchResult(
            epoch=Epoch(r.epoch), matched_tokens=r.matched_tokens,
            segments=[Segment(tuple(s.block_ids), s.cached_position, s.rope_delta)
                      for s in r.segments],
            lease=Lease(self, r.lease_id) if r.lease_id else None,
            rope_denied=RopeDenied(r.rope_denied.requested_position,
                                   r.rope_denied.cached_position)
            if r.HasField("rope_denied") else None)

    def _insert_result(self, r: pb.InsertResponse) -> InsertResult:
        return InsertResult(
            epoch=Epoch(r.epoch), cached_tokens=r.cached_tokens,
            redundant_block_ids=list(r.redundant_block_ids),
            evicted_block_ids=list(r.evicted_block_ids),
            lease=Lease(self, r.lease_id) if r.lease_id else None)

    def release(self, lease_id: int, *, timeout: Optional[float] = None) -> None:
        self._call("Release", pb.ReleaseRequest(lease_id=lease_id), timeout)

    def keepalive(self, lease_ids: Iterable[int], *,
                  timeout: Optional[float] = None) -> List[float]:
        """Renews the leases; seconds left for each, in order."""
        r = self._call("KeepAlive", pb.KeepAliveRequest(lease_ids=list(lease_ids)), timeout)
        return [ms / 1000.0 for ms in r.expires_in_ms]

    def evict(self, blocks: int, *, timeout: Optional[float] = None) -> List[int]:
        """Evicts up to `blocks` blocks now (LRU, never pinned ones); returns
        their IDs, which the engine frees."""
        return list(self._call("Evict", pb.EvictRequest(blocks=blocks),
                               timeout).evicted_block_ids)

    def invalidate(self, block_ids: Iterable[int], *,
                   timeout: Optional[float] = None) -> List[int]:
        """Removes the nodes holding `block_ids` and everything below them;
        returns every removed ID."""
        return list(self._call("Invalidate", pb.InvalidateRequest(block_ids=list(block_ids)),
                               timeout).removed_block_ids)

    def reset(self, tenant: str = "", *, all_tenants: bool = False,
              timeout: Optional[float] = None) -> List[int]:
        """Drops the tenant's trees (the caller's by default) or every
        tenant's; returns the removed IDs."""
        r = self._call("Reset", pb.ResetRequest(tenant=tenant, all=all_tenants), timeout)
        self._see_epoch(r.epoch)
        return list(r.removed_block_ids)

    def stats(self, *, all_tenants: bool = False,
              timeout: Optional[float] = None) -> pb.StatsResponse:
        r = self._call("Stats", pb.StatsRequest(all_tenants=all_tenants), timeout)
        self._see_epoch(r.epoch)
        return r

    def dump(self, namespace: str = "", *, timeout: Optional[float] = None) -> pb.DumpResponse:
        """One tree of the caller's tenant, node by node (for debugging)."""
        r = self._call("Dump", pb.DumpRequest(namespace=namespace), timeout)
        self._see_epoch(r.epoch)
        return r

    def cached_block_ids(self, namespace: str = "", *,
                         timeout: Optional[float] = None) -> List[int]:
        """Every block ID in one tree (from Dump)."""
        return [b for n in self.dump(namespace, timeout=timeout).nodes for b in n.block_ids]

    # ---- the fleet index (PrefixIndex) ----

    def route(self, tokens: Sequence[int], *, lora_name: Optional[str] = None,
              lora_id: Optional[int] = None, cache_salt: Optional[str] = None,
              workers: Optional[Sequence[str]] = None,
              block_extra_keys: Optional[ExtraKeys] = None,
              all_workers: bool = False,
              timeout: Optional[float] = None) -> RouteResult:
        """How many leading whole blocks of `tokens` each worker holds, best
        first. The namespace is what the engines mixed into the first block's
        hash: `lora_name` (wins over `lora_id`), `cache_salt`. The answer
        lists the workers with a matched block; `all_workers`: every worker
        (matched_blocks 0 for the others); `workers`: only these, each listed
        matched or not. `block_extra_keys`: per block index, its
        keys beyond the tokens in vLLM's typed form, e.g.
        {2: [{"type": "mm", "modality": "image", "hash": "...",
        "block_offset": 5}]}. Unimplemented when the daemon runs no fleet
        index."""
        r = self._call("Route", _route_request(tokens, lora_name, lora_id, cache_salt, workers,
                                               block_extra_keys, all_workers),
                       timeout, self._index_stub)
        return _route_result(r)

    def route_batch(self, queries: Sequence[Union[RouteQuery, Sequence[int]]], *,
                    lora_name: Optional[str] = None, lora_id: Optional[int] = None,
                    cache_salt: Optional[str] = None, workers: Optional[Sequence[str]] = None,
                    all_workers: bool = False,
                    timeout: Optional[float] = None) -> List[BatchItem[RouteResult]]:
        """Routes every prompt in one round trip (RouteBatch). An item is a
        RouteQuery (its own options) or a token sequence (this call's
        keyword options). One entry per item, in order: a RouteResult or
        that item's own PrefixdError (returned, not raised: the others ran).
        Raises only when the daemon refuses the whole batch."""
        requests = []
        for q in queries:
            if isinstance(q, RouteQuery):
                requests.append(_route_request(q.tokens, q.lora_name, q.lora_id, q.cache_salt,
                                               q.workers, q.block_extra_keys, q.all_workers))
            else:
                requests.append(_route_request(q, lora_name, lora_id, cache_salt, workers,
                                               None, all_workers))
        r = self._call("RouteBatch", ipb.RouteBatchRequest(requests=requests), timeout,
                       self._index_stub)
        return [_route_result(i.response) if i.code == 0
                else _item_error("RouteBatch", i.code, i.message) for i in r.responses]

    def pick(self, tokens: Sequence[int], *, candidates: Optional[Sequence[str]] = None,
             loads: Optional[Mapping[str, WorkerLoad]] = None,
             lora_name: Optional[str] = None, lora_id: Optional[int] = None,
             cache_salt: Optional[str] = None,
             block_extra_keys: Optional[ExtraKeys] = None, dry_run: bool = False,
             replay_time_ms: int = 0, timeout: Optional[float] = None) -> PickResult:
        """Which worker should serve `tokens` (docs/index.md, "Pick"): the
        `candidates` (default: every engine of the index) ranked by cost, the
        cheapest chosen. `loads`: worker name -> WorkerLoad as the router sees
        it; a candidate without one is charged the index's own count of its
        recent picks. Unless `dry_run`, the chosen worker is then predicted
        to hold the whole prompt until the TTL lapses (unless it is LIVE and
        its events report the whole prompt already).
        `replay_time_ms`: the decision's time when replaying a trace (the
        daemon runs with index.pick.replay_clock; docs/index.md)."""
        r = self._call("Pick", _pick_request(tokens, candidates, loads, lora_name, lora_id,
                                             cache_salt, block_extra_keys, dry_run,
                                             replay_time_ms),
                       timeout, self._index_stub)
        return _pick_result(r)

    def pick_batch(self, prompts: Sequence[Sequence[int]], *,
                   candidates: Optional[Sequence[str]] = None,
                   loads: Optional[Mapping[str, WorkerLoad]] = None,
                   cache_salt: Optional[str] = None, dry_run: bool = False,
                   timeout: Optional[float] = None) -> List[BatchItem[PickResult]]:
        """Picks for every prompt in order, in one round trip (PickBatch): each
        sees the blocks predicted for the ones before it. One entry per prompt:
        a PickResult or that item's own PrefixdError (returned, not raised)."""
        requests = [_pick_request(t, candidates, loads, None, None, cache_salt, None, dry_run)
                    for t in prompts]
        r = self._call("PickBatch", ipb.PickBatchRequest(requests=requests), timeout,
                       self._index_stub)
        return [_pick_result(i.response) if i.code == 0
                else _item_error("PickBatch", i.code, i.message) for i in r.responses]

    def list_workers(self, *, timeout: Optional[float] = None) -> ListWorkersResult:
        """Every worker the fleet index knows, with its state and counters."""
        r = self._call("ListWorkers", ipb.ListWorkersRequest(), timeout, self._index_stub)
        return ListWorkersResult(
            workers=[WorkerInfo(
                worker=w.worker, endpoint=w.endpoint, state=_state(w.state),
                state_detail=w.state_detail, mediums={m.medium: m.blocks for m in w.mediums},
                events=w.events, gaps=w.gaps, replays=w.replays, clears=w.clears,
                dropped_blocks=w.dropped_blocks, last_seq=w.last_seq,
                last_event_unix_ms=w.last_event_unix_ms, last_error=w.last_error,
                event_version=w.event_version,
                groups={g.group: (g.kind, g.window_blocks) for g in w.groups})
                for w in r.workers],
            block_size=r.block_size, entries=r.entries, max_entries=r.max_entries)

    def watch_events(self, from_sequence: int = 0, *,
                     timeout: Optional[float] = None) -> "EventStream":
        """A stream of event batches; iterate it, `cancel()` it from any thread."""
        call = self._stub.WatchEvents(pb.WatchEventsRequest(from_sequence=from_sequence),
                                      timeout=timeout, metadata=self._metadata)
        return EventStream(call, self)

    def health(self, service: str = "", *, timeout: Optional[float] = None) -> str:
        """grpc.health.v1 status: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"
        or "UNKNOWN"."""
        check = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=_health_request,
            response_deserializer=_health_status)
        try:
            return check(service, timeout=self.deadline if timeout is None else timeout)
        except grpc.RpcError as e:
            raise _error("Health", e, self) from None


class EventStream:
    def __init__(self, call, client: Client):
        self._call = call
        self._client = client

    def __iter__(self) -> Iterator[pb.WatchEventsResponse]:
        try:
            for batch in self._call:
                self._client._see_epoch(batch.epoch)
                yield batch
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise _error("WatchEvents", e, self._client) from None

    def cancel(self) -> None:
        self._call.cancel()


# ---- helpers -----------------------------------------------------------------

def tokens_le32(tokens: Iterable[int]) -> bytes:
    """`tokens` as MatchRequest/InsertRequest/RouteRequest.tokens_le32 carries them: 4 bytes each,
    little-endian, which is much faster to build than the repeated `tokens` field
    (a numpy array can be passed as tokens.astype("<u4").tobytes() directly).
    A token outside 0..2**32-1 raises OverflowError."""
    a = array.array("I", tokens)
    if a.itemsize != 4:  # not on Linux x86-64 or ARM64, but C leaves it open
        a = array.array("L", a)
        if a.itemsize != 4:
            raise RuntimeError("no 4-byte unsigned array type on this platform")
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def _route_request(tokens, lora_name, lora_id, cache_salt, workers,
                   block_extra_keys=None, all_workers=False) -> ipb.RouteRequest:
    if isinstance(workers, str):  # a lone name would be split into letters
        raise TypeError("workers is a sequence of worker names, not the string %r" % workers)
    return ipb.RouteRequest(tokens_le32=tokens_le32(tokens), lora_name=lora_name or "",
                            lora_id=lora_id or 0, cache_salt=cache_salt or "",
                            workers=list(workers or ()), all_workers=bool(all_workers),
                            block_extra_keys=_block_extra_keys(block_extra_keys))


def _pick_request(tokens, candidates, loads, lora_name, lora_id, cache_salt,
                  block_extra_keys, dry_run, replay_time_ms=0) -> ipb.PickRequest:
    if isinstance(candidates, str):
        raise TypeError("candidates is a sequence of worker names, not the string %r"
                        % candidates)
    return ipb.PickRequest(
        prompt=_route_request(tokens, lora_name, lora_id, cache_salt, None, block_extra_keys),
        candidates=list(candidates or ()),
        loads=[ipb.WorkerLoad(worker=w, requests_in_flight=l.requests_in_flight,
                              queued_prefill_tokens=l.queued_prefill_tokens,
                              kv_usage=l.kv_usage) for w, l in (loads or {}).items()],
        dry_run=bool(dry_run), replay_time_ms=int(replay_time_ms))


def _pick_result(r: ipb.PickResponse) -> PickResult:
    return PickResult(
        worker=r.worker,
        ranked=[PickCandidate(
            worker=c.worker, cost=c.cost, prefill_tokens=c.prefill_tokens,
            load_term=c.load_term, affinity_term=c.affinity_term,
            matched_blocks=c.matched_blocks, predicted_blocks=c.predicted_blocks,
            credited_blocks=c.credited_blocks, state=_state(c.state),
            load_from_request=c.load_from_request, requests_in_flight=c.requests_in_flight,
            queued_prefill_tokens=c.queued_prefill_tokens, kv_usage=c.kv_usage,
            churn_term=c.churn_term, churn_tokens=c.churn_tokens,
            load_from_engine=c.load_from_engine)
            for c in r.ranked],
        decision_id=r.decision_id, prompt_blocks=r.prompt_blocks, block_size=r.block_size)


def _bytes(v) -> bytes:
    return v.encode("utf-8") if isinstance(v, str) else bytes(v)


def _extra_key(key: Mapping) -> ipb.ExtraKey:
    """One key in vLLM's typed form ({"type": ..., ...}) as the proto's."""
    kind = key.get("type")
    if kind == "lora":
        return ipb.ExtraKey(lora=key["name"])
    if kind == "cache_salt":
        return ipb.ExtraKey(cache_salt=key["salt"])
    if kind == "prompt_embeds":
        return ipb.ExtraKey(prompt_embeds=_bytes(key["hash"]))
    if kind == "mm":
        return ipb.ExtraKey(mm=ipb.MultiModalKey(modality=key.get("modality") or "",
                                                 hash=_bytes(key["hash"]),
                                                 block_offset=int(key["block_offset"])))
    if kind == "legacy":
        if not isinstance(key["value"], str):
            raise TypeError("a legacy extra key's value must be a str, not %r" % (key["value"],))
        return ipb.ExtraKey(legacy=key["value"])
    raise ValueError("unknown extra key type %r (lora, cache_salt, prompt_embeds, mm, legacy)"
                     % (kind,))


def _block_extra_keys(keys: Optional[ExtraKeys]) -> List[ipb.BlockExtraKeys]:
    if not keys:
        return []
    items = keys.items() if isinstance(keys, Mapping) else keys
    return [ipb.BlockExtraKeys(block=int(block), keys=[_extra_key(k) for k in block_keys])
            for block, block_keys in items]


def _route_result(r: ipb.RouteResponse) -> RouteResult:
    return RouteResult(
        workers=[WorkerMatch(worker=w.worker, matched_blocks=w.matched_blocks,
                             mediums={m.medium: m.matched_blocks for m in w.mediums},
                             state=_state(w.state), last_seq=w.last_seq, lag_ms=w.lag_ms,
                             full_attention_blocks=w.full_attention_blocks)
                 for w in r.workers],
        best_worker=r.best_worker, prompt_blocks=r.prompt_blocks, block_size=r.block_size)


def _state(state: int) -> State:
    try:
        return WorkerState(state)
    except ValueError:
        return state  # from a newer daemon


def _offsets(offsets: Optional[Sequence[int]], n: int) -> Sequence[int]:
    if offsets is None:
        return [0] * n
    if len(offsets) != n:
        raise ValueError("%d position_offsets for %d requests; give one per request"
                         % (len(offsets), n))
    return offsets


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def _item_error(method: str, code: int, message: str) -> PrefixdError:
    status = _CODES.get(code, grpc.StatusCode.UNKNOWN)
    return _ERRORS.get(status, PrefixdError)(method, status, message)


def _ms(seconds: Optional[float]) -> int:
    return 0 if not seconds else max(1, int(round(seconds * 1000)))


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


# grpc.health.v1 by hand (Debian's python3-grpcio has no grpc_health):
# HealthCheckRequest{string service = 1}, HealthCheckResponse{enum status = 1}.
_HEALTH_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _health_request(service: str) -> bytes:
    data = service.encode()
    return b"\x0a" + bytes([len(data)]) + data if data else b""


def _health_status(data: bytes) -> str:
    status = data[1] if len(data) >= 2 and data[0] == 0x08 else 0
    return _HEALTH_NAMES.get(status, "UNKNOWN")
