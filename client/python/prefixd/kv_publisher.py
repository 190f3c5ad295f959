#!/usr/bin/python3
"""KV events on the wire exactly as stock vLLM (ZmqEventPublisher) and SGLang
publish them, for driving the fleet index (docs/index.md) in tests.

    pub = Publisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", encoding="map",
                    hash_kind="bytes")
    ...start the daemon with --index_source=e0=<pub.endpoint>,<pub.replay_endpoint>
    pub.wait_for_subscriber()            # the daemon's SUB has subscribed
    seq = pub.publish([block_stored([h1, h2], None, tokens, 16)])
    pub.close()

Wire (vllm/distributed/kv_events.py):

- PUB socket: bound when the endpoint has a "*" (or is ipc:// / inproc://),
  else connected. Every batch is one multipart message
  [topic, seq as 8-byte big-endian unsigned, payload]; seq starts at 0 and
  grows by one per batch.
- payload: msgpack of an EventBatch, in one of two encodings chosen per
  publisher:
    "array" (older vLLM, SGLang): [ts, events] or [ts, events, dp_rank]
        (SGLang's third element is its attn_dp_rank); events are tagged
        arrays, fields in vLLM's declaration order:
        ["BlockStored", block_hashes, parent_block_hash, token_ids,
         block_size, lora_id, medium(, lora_name(, extra_keys(, group_idx(,
         kv_cache_spec_kind(, kv_cache_spec_sliding_window(, locality(,
         ownership(, session_id(, event_version))))))))))]
        ["BlockRemoved", block_hashes, medium(, group_idx(, locality(,
         ownership(, event_version)))))]
        ["AllBlocksCleared"]
        (trailing optional fields are present up to the last one set, as
        msgspec's array_like + omit_defaults writes them);
    "map" (newer vLLM): {"ts", "events", "data_parallel_rank"} with
        data_parallel_rank omitted when None; events are maps with a "type"
        key first, then block_hashes, parent_block_hash, token_ids,
        block_size, lora_id, medium, lora_name (always present, None
        included) and the later fields (only when set);
    "array_of_maps" (the newest SGLang): the batch as in "array", its
        events maps as in "map" (SGLang's own stores: sglang_block_stored).
- extra_keys: one entry per block, None or a list, in one of two forms
  (docs/index.md, "Namespaces and content keys"): raw tuples as older vLLM
  writes them (raw_extra_keys: the LoRA name, [mm_hash, offset] pairs, the
  cache salt in a request's first block, the prompt-embeds digest) or typed
  keys as the newest vLLM writes them with event_version 1 (typed_extra_keys:
  {"type": "lora"|"mm"|"cache_salt"|"prompt_embeds"|"legacy", ...} maps).
- block hashes: hash_kind "int" (unsigned 64-bit, newer vLLM's int form of
  its sha256 hashes), "int64" (signed 64-bit, older vLLM's and SGLang's
  builtin hash) or "bytes" (32-byte sha256 digests). Events carry whatever
  the caller built them with (32-byte digests or ints); the publisher turns
  them into its kind when it encodes a batch.
- replay: a ROUTER socket bound at replay_endpoint, served by a background
  thread with its own socket. A request [client_id, b"", start_seq (8 bytes
  big-endian)] is answered with one message per buffered batch with seq >=
  start_seq, then an end marker, in the publisher's replay_framing:
    "seq" (SGLang, vLLM <= 0.25):  [client_id, b"", seq, payload], end
        [client_id, b"", -1 as 8 signed bytes, b""];
    "topic" (vLLM >= 0.26):        [client_id, b"", topic, seq, payload],
        end [client_id, b"", b"", -1, b""]. The buffer keeps the last buffer_steps batches
  (collections.deque(maxlen=buffer_steps)). Unlike vLLM, a batch enters the
  buffer before it is sent, so a subscriber that asks for a batch it has
  just seen always finds it.

Slow joiners: a ZeroMQ PUB drops every message sent before a subscriber's
subscription has reached it, and says nothing. By default the socket is an
XPUB (ZMQ_XPUB_VERBOSE on): to the subscriber it is an ordinary PUB, but it
receives each subscription, so wait_for_subscriber() returns only once a
subscription matching this publisher's topic has been registered, after
which nothing sent is lost to joining late. With xpub=False (a plain PUB,
as vLLM uses) there is no such signal: wait_for_subscriber(confirm=f) then
polls f (for example: the daemon's ListWorkers shows the worker connected)
and sleeps `settle` seconds more, which narrows the window but cannot close
it; that mode is for demos, the tests use the XPUB.

Test hooks: drop_next(n) (the next n batches get a seq and enter the replay
buffer but are not sent: a loss in transit), restart() (seq back to 0, the
replay buffer emptied, as an engine restart: the sockets stay), send_raw()
(any payload bytes with the next seq), unknown_event() (an event type no
decoder knows), all_blocks_cleared(). A wrong block size is just
block_stored(..., block_size=32).

One thread publishes; the replay thread only reads the buffer (under a
lock). Plain Python 3 with python3-zmq and python3-msgpack (Debian's
/usr/bin/python3).

Demo: prefixd.demo_engine (the prefixd-demo-engine command) publishes a
trace or a prompt file through an engine pool, on loopback, until stopped
(docs/index.md, "Try it in five minutes"); main() below is the older, bare
form.
"""

import argparse
import collections
import sys
import threading
import time

import msgpack
import zmq

ENCODINGS = ("array", "map", "array_of_maps")
HASH_KINDS = ("int", "int64", "bytes")
REPLAY_FRAMINGS = ("seq", "topic")  # ["", seq, payload] / ["", topic, seq, payload]
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"

_U64 = (1 << 64) - 1


class Event:
    """One KV event, independent of the encoding: a type name and its fields
    in declaration order. The first `array_required` fields are always
    written in the array encoding, the first `map_required` always in the
    map encoding; the others only when not None (and, in an array, up to the
    last one that is set)."""

    __slots__ = ("type", "fields", "array_required", "map_required")

    def __init__(self, type_name, fields, array_required=None, map_required=None):
        self.type = type_name
        self.fields = list(fields)  # [(name, value)]
        n = len(self.fields)
        self.array_required = n if array_required is None else array_required
        self.map_required = n if map_required is None else map_required

    def get(self, name, default=None):
        for k, v in self.fields:
            if k == name:
                return v
        return default

    def __repr__(self):
        return "%s(%s)" % (self.type, ", ".join("%s=%r" % kv for kv in self.fields))


def block_stored(block_hashes, parent_block_hash, token_ids, block_size, lora_id=None,
                 medium=MEDIUM_GPU, lora_name=None, extra_keys=None, group_idx=None,
                 kv_cache_spec_kind=None, kv_cache_spec_sliding_window=None, locality=None,
                 ownership=None, session_id=None, event_version=None, **extra):
    """BlockStored, its fields in vLLM's declaration order. extra_keys: one
    entry per block (None, a raw tuple or a list of typed keys; see
    raw_extra_keys and typed_extra_keys). `extra` adds fields no decoder
    knows, after the known ones."""
    fields = [("block_hashes", list(block_hashes)), ("parent_block_hash", parent_block_hash),
              ("token_ids", list(token_ids)), ("block_size", block_size), ("lora_id", lora_id),
              ("medium", medium), ("lora_name", lora_name),
              ("extra_keys", None if extra_keys is None else [
                  list(k) if isinstance(k, (list, tuple)) else k for k in extra_keys]),
              ("group_idx", group_idx), ("kv_cache_spec_kind", kv_cache_spec_kind),
              ("kv_cache_spec_sliding_window", kv_cache_spec_sliding_window),
              ("locality", locality), ("ownership", ownership), ("session_id", session_id),
              ("event_version", event_version)]
    fields += list(extra.items())
    return Event("BlockStored", fields, array_required=6, map_required=7)


def sglang_block_stored(block_hashes, parent_block_hash, token_ids, block_size,
                        medium=MEDIUM_GPU, lora_name=None, cache_salt=None, session_id=None,
                        component_types=None):
    """BlockStored as the newest SGLang declares it, for the map encodings:
    block_hashes ... medium always written, then its named fields lora_name,
    cache_salt (the request's salt, in every store of a salted request),
    session_id and component_types (with --enable-kv-events-component-types:
    the components, "full", "swa", "mamba", the engine now holds of these
    blocks) when set."""
    fields = [("block_hashes", list(block_hashes)), ("parent_block_hash", parent_block_hash),
              ("token_ids", list(token_ids)), ("block_size", block_size), ("lora_id", None),
              ("medium", medium), ("lora_name", lora_name), ("cache_salt", cache_salt),
              ("session_id", session_id),
              ("component_types", None if component_types is None else list(component_types))]
    return Event("BlockStored", fields, array_required=6, map_required=6)


def block_removed(block_hashes, medium=MEDIUM_GPU, group_idx=None, locality=None,
                  ownership=None, event_version=None, **extra):
    """BlockRemoved, its fields in vLLM's declaration order (`extra`: fields
    no decoder knows, after the known ones)."""
    fields = [("block_hashes", list(block_hashes)), ("medium", medium),
              ("group_idx", group_idx), ("locality", locality), ("ownership", ownership),
              ("event_version", event_version)]
    return Event("BlockRemoved", fields + list(extra.items()), array_required=2,
                 map_required=2)


def raw_extra_keys(lora_name=None, mm=(), cache_salt=None, embeds=None, legacy=()):
    """One block's extra keys as a raw tuple, in vLLM's order: the LoRA
    name, then [mm_hash, block_offset] per multimodal input, plain legacy
    values (an older engine's bare multimodal hash), the cache salt (a
    request's first block only) and the prompt-embeds digest (bytes).
    mm: (modality, hash, block_offset) triples (the raw form has no
    modality). None when there is nothing."""
    keys = [lora_name] if lora_name else []
    keys += [[h, int(k)] for _, h, k in mm]
    keys += list(legacy)
    keys += [cache_salt] if cache_salt else []
    keys += [bytes(embeds)] if embeds is not None else []
    return tuple(keys) if keys else None


def typed_extra_keys(lora_name=None, mm=(), cache_salt=None, embeds=None, legacy=()):
    """The same keys as raw_extra_keys in the newest vLLM's typed form
    (event_version 1): a list of {"type": ...} maps, or None."""
    keys = [{"type": "lora", "name": lora_name}] if lora_name else []
    keys += [{"type": "mm", "modality": m, "hash": h, "block_offset": int(k)}
             for m, h, k in mm]
    keys += [{"type": "legacy", "value": v} for v in legacy]
    keys += [{"type": "cache_salt", "salt": cache_salt}] if cache_salt else []
    keys += [{"type": "prompt_embeds", "hash": bytes(embeds)}] if embeds is not None else []
    return keys or None


def all_blocks_cleared():
    return Event("AllBlocksCleared", [])


def unknown_event(type_name="BlockPromoted", **fields):
    """An event of a type no decoder knows, with the given fields (all
    written, in order); a decoder must skip it and go on."""
    return Event(type_name, list(fields.items()))


def wire_hash(h, hash_kind):
    """An engine hash (32-byte digest or int) in the publisher's kind."""
    if h is None:
        return None
    if hash_kind == "bytes":
        if isinstance(h, (bytes, bytearray)):
            return bytes(h)
        return (h & _U64).to_bytes(32, "big")
    v = int.from_bytes(h[:8], "big") if isinstance(h, (bytes, bytearray)) else h & _U64
    if hash_kind == "int64" and v >= 1 << 63:
        v -= 1 << 64
    return v


def encode_event(ev, encoding, hash_kind="int"):
    """The msgpack-ready form of one event (array or map)."""
    values = []
    for name, v in ev.fields:
        if name == "block_hashes":
            v = [wire_hash(h, hash_kind) for h in v]
        elif name == "parent_block_hash":
            v = wire_hash(v, hash_kind)
        values.append((name, v))
    if encoding == "array":
        last = ev.array_required
        for i in range(ev.array_required, len(values)):
            if values[i][1] is not None:
                last = i + 1
        return [ev.type] + [v for _, v in values[:last]]
    out = {"type": ev.type}
    for i, (name, v) in enumerate(values):
        if i < ev.map_required or v is not None:
            out[name] = v
    return out


def encode_batch(events, encoding, hash_kind="int", ts=None, data_parallel_rank=None):
    """msgpack bytes of one EventBatch."""
    if encoding not in ENCODINGS:
        raise ValueError("encoding must be one of %s" % (ENCODINGS,))
    ts = time.time() if ts is None else float(ts)
    form = "map" if encoding == "array_of_maps" else encoding
    evs = [e if isinstance(e, (list, dict)) else encode_event(e, form, hash_kind)
           for e in events]
    if encoding != "map":
        obj = [ts, evs] if data_parallel_rank is None else [ts, evs, data_parallel_rank]
    else:
        obj = {"ts": ts, "events": evs}
        if data_parallel_rank is not None:
            obj["data_parallel_rank"] = data_parallel_rank
    return msgpack.packb(obj, use_bin_type=True)


def decode_batch(payload):
    """The payload as plain Python (for tests): msgpack.unpackb, raw=False."""
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def _binds(endpoint):
    return ("*" in endpoint or "::" in endpoint or endpoint.startswith("ipc://")
            or endpoint.startswith("inproc://"))


class _ReplayServer(threading.Thread):
    """The ROUTER side of replay, on its own socket and thread."""

    POLL_MS = 20

    def __init__(self, ctx, endpoint, publisher):
        super().__init__(daemon=True, name="kv-replay")
        self._ctx = ctx
        self._requested = endpoint
        self._pub = publisher
        self._halt = threading.Event()
        self._ready = threading.Event()
        self.endpoint = None
        self.error = None

    def start(self):
        super().start()
        self._ready.wait()
        if self.error is not None:
            raise self.error
        return self

    def run(self):
        sock = self._ctx.socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(self._requested)
            self.endpoint = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        except zmq.ZMQError as e:
            sock.close()
            self.error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._halt.is_set():
                if not sock.poll(self.POLL_MS):
                    continue
                frames = sock.recv_multipart()
                if len(frames) != 3:  # vLLM logs and ignores such requests
                    self._pub._note_replay(None, 0)
                    continue
                client_id, _, start_bytes = frames
                start = int.from_bytes(start_bytes, "big")
                batches = [(s, p) for s, p in self._pub._buffered() if s >= start]
                self._pub._note_replay(start, len(batches))
                head = (client_id, b"") + ((self._pub.topic,) if self._pub.replay_framing
                                            == "topic" else ())
                for s, p in batches:
                    sock.send_multipart(head + (s.to_bytes(8, "big"), p))
                end = (b"",) if self._pub.replay_framing == "topic" else ()
                sock.send_multipart((client_id, b"") + end + (END_SEQ, b""))
        finally:
            sock.close(0)

    def stop(self):
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)


class Publisher:
    """One engine's KV event stream (see the module docstring).

    endpoint / replay_endpoint: as given, with a bound port resolved (bind
    "tcp://127.0.0.1:*" and read .endpoint). replay_endpoint=None: no replay.
    bind: None follows vLLM's rule (bind when the endpoint has a wildcard or
    is ipc:// or inproc://, else connect); True binds, False connects.
    replay_framing: "seq" (SGLang, vLLM <= 0.25) or "topic" (vLLM >= 0.26),
    the form of the replay socket's answers (module docstring).
    last_seq: the last seq given to a batch (sent or dropped), -1 if none.
    """

    def __init__(self, endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
                 encoding="array", hash_kind="int", buffer_steps=10_000, topic="",
                 data_parallel_rank=None, hwm=100_000, xpub=True, context=None, name=None,
                 bind=None, replay_framing="seq"):
        if encoding not in ENCODINGS:
            raise ValueError("encoding must be one of %s" % (ENCODINGS,))
        if hash_kind not in HASH_KINDS:
            raise ValueError("hash_kind must be one of %s" % (HASH_KINDS,))
        if replay_framing not in REPLAY_FRAMINGS:
            raise ValueError("replay_framing must be one of %s" % (REPLAY_FRAMINGS,))
        self.replay_framing = replay_framing
        self.name = name
        self.encoding = encoding
        self.hash_kind = hash_kind
        self.topic = topic.encode() if isinstance(topic, str) else bytes(topic)
        self.data_parallel_rank = data_parallel_rank
        self.buffer_steps = buffer_steps
        self.xpub = xpub
        self._ctx = context or zmq.Context.instance()
        self._lock = threading.Lock()
        self._buffer = collections.deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._drop = 0
        self.subscriptions = 0      # live subscriptions matching the topic (XPUB)
        self.sent = []              # seqs sent on PUB, since the last restart()
        self.dropped = []           # seqs dropped by drop_next, since the last restart()
        self.replay_requests = []   # start seqs asked for (None: a malformed request)
        self.replayed_batches = 0
        self.restarts = 0

        self._pub = self._ctx.socket(zmq.XPUB if xpub else zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, hwm)
        if xpub:
            self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._replay = None
        self.replay_endpoint = None
        try:
            if _binds(endpoint) if bind is None else bind:  # bind=None: vLLM's rule
                self._pub.bind(endpoint)
                self.endpoint = self._pub.getsockopt(zmq.LAST_ENDPOINT).decode()
            else:
                self._pub.connect(endpoint)
                self.endpoint = endpoint
            if replay_endpoint:
                self._replay = _ReplayServer(self._ctx, replay_endpoint, self).start()
                self.replay_endpoint = self._replay.endpoint
        except zmq.ZMQError:
            self._pub.close()  # a port taken: the caller may try another
            raise

    # ---- state ----

    @property
    def last_seq(self):
        return self._next_seq - 1

    @property
    def next_seq(self):
        return self._next_seq

    def source_flag(self, name=None):
        """NAME=endpoint[,replay_endpoint], as --index_source takes it."""
        name = name or self.name
        s = "%s=%s" % (name, self.endpoint)
        return s + ("," + self.replay_endpoint if self.replay_endpoint else "")

    def _buffered(self):
        with self._lock:
            return list(self._buffer)

    def buffered_seqs(self):
        return [s for s, _ in self._buffered()]

    def _note_replay(self, start, n):
        with self._lock:
            self.replay_requests.append(start)
            self.replayed_batches += n

    # ---- publishing ----

    def encode(self, events, ts=None):
        return encode_batch(events, self.encoding, self.hash_kind, ts, self.data_parallel_rank)

    def publish(self, events, ts=None):
        """Publishes one batch of events (Event objects, or already-encoded
        lists/dicts passed through as they are); returns its seq."""
        return self.send_raw(self.encode(events, ts))

    def send_raw(self, payload):
        """Sends `payload` (any bytes) as the next batch; returns its seq.
        The payload enters the replay buffer like any batch."""
        self._drain_subscriptions()
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            self._buffer.append((seq, payload))
            drop = self._drop > 0
            if drop:
                self._drop -= 1
        if drop:
            self.dropped.append(seq)
        else:
            self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
            self.sent.append(seq)
        return seq

    def all_blocks_cleared(self, ts=None):
        """Publishes a batch holding one AllBlocksCleared; returns its seq."""
        return self.publish([all_blocks_cleared()], ts)

    # ---- test hooks ----

    def drop_next(self, n=1):
        """The next n batches get a seq and enter the replay buffer but are
        not sent: a subscriber sees a gap."""
        with self._lock:
            self._drop += n

    def restart(self):
        """As an engine restart: seq back to 0, the replay buffer emptied,
        pending drops forgotten. The sockets stay (a subscriber stays
        connected, so the first batch after the restart is not lost)."""
        with self._lock:
            self._next_seq = 0
            self._buffer.clear()
            self._drop = 0
            self.sent = []
            self.dropped = []
            self.restarts += 1

    # ---- slow joiners ----

    def _drain_subscriptions(self):
        if not self.xpub:
            return
        while True:
            try:
                msg = self._pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not msg:
                continue
            prefix = msg[1:]
            if self.topic.startswith(prefix):
                if msg[0] == 1:
                    self.subscriptions += 1
                elif msg[0] == 0:
                    self.subscriptions = max(0, self.subscriptions - 1)

    def wait_for_subscriber(self, timeout=10.0, count=1, confirm=None, settle=0.2):
        """True once `count` subscriptions matching the topic have reached
        this XPUB (from then on nothing sent is lost to joining late); False
        after `timeout` seconds. With a plain PUB (xpub=False) `confirm` (a
        callable, true once the subscriber reports itself connected) is
        required: it is polled, then `settle` seconds pass; no guarantee."""
        deadline = time.monotonic() + timeout
        if not self.xpub:
            if confirm is None:
                raise ValueError("a PUB socket cannot tell when a subscriber has joined: "
                                 "use xpub=True or pass confirm=")
            while time.monotonic() < deadline:
                if confirm():
                    time.sleep(settle)
                    return True
                time.sleep(0.02)
            return False
        while True:
            self._drain_subscriptions()
            if self.subscriptions >= count:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._pub.poll(int(min(left, 0.05) * 1000) + 1, zmq.POLLIN)

    # ---- lifecycle ----

    def close(self):
        if self._replay is not None:
            self._replay.stop()
            self._replay = None
        if self._pub is not None:
            self._pub.close(0)
            self._pub = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def main():
    ap = argparse.ArgumentParser(description="Publishes a Mooncake trace's KV events as a "
                                 "vLLM engine would (see the module docstring).")
    ap.add_argument("--endpoint", default="tcp://*:5557", help="PUB endpoint (bind if '*')")
    ap.add_argument("--replay", default="tcp://*:5558", help="ROUTER endpoint ('' for none)")
    ap.add_argument("--encoding", choices=ENCODINGS, default="map")
    ap.add_argument("--hash_kind", choices=HASH_KINDS, default="int")
    ap.add_argument("--trace", default="synthetic", help="conversation or synthetic")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--blocks", type=int, default=1024, help="the engine's pool, in blocks")
    ap.add_argument("--block_size", type=int, default=16)
    ap.add_argument("--steps_per_second", type=float, default=200.0)
    ap.add_argument("--wait", type=float, default=30.0,
                    help="seconds to wait for a subscriber before publishing (0: don't)")
    args = ap.parse_args()

    from prefixd import engine_pool

    pub = Publisher(args.endpoint, args.replay or None, encoding=args.encoding,
                    hash_kind=args.hash_kind, name="demo")
    print("PUB %s  replay %s  (%s, %s hashes)" % (pub.endpoint, pub.replay_endpoint,
                                                  args.encoding, args.hash_kind))
    if args.wait > 0:
        print("waiting up to %.0f s for a subscriber..." % args.wait)
        if not pub.wait_for_subscriber(args.wait):
            print("no subscriber; publishing anyway")
    pool = engine_pool.EnginePool(args.blocks, args.block_size, publisher=pub)
    for r in engine_pool.load_trace(args.trace, args.requests):
        pool.submit(engine_pool.trace_tokens(r, args.block_size), hold_steps=r.hold_steps)
        pool.step()
        time.sleep(1.0 / args.steps_per_second)
    pool.drain()
    print("%d batches (last seq %d); %s" % (pub.last_seq + 1, pub.last_seq, pool.stats()))
    pub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
