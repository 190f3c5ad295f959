"""What the index's interop tests take from the routers' published specs,
computed here independently of prefixd's own code:

- SGLang's KV indexer clients, generated at import time with grpc_tools:
  sgl-router's, from the repository's copy of kv_indexer.proto (as
  published), and the standalone sgl-kv-indexer crate's, whose hashes are
  decimal text, from tests/index/kv_indexer_standalone.proto;
- the Mooncake Conductor's rolling hash: XXH64 (Debian's libxxhash through
  ctypes) of the parent key as 8 bytes little-endian then the block's
  tokens as int32 little-endian, seed 0, from XXH64(salt);
- an engine's KV-event PUB socket, framed as vLLM's and SGLang's
  ZmqEventPublisher frame their batches, and their events as their
  kv_events.py encode them (SGLang's in both its array form and its
  newest tagged-map form);
- TensorRT-LLM's streaming publisher: its frames, sequence numbers,
  events, heartbeats and replay socket, from its kv_cache_events.py and
  native_kv_cache_events.py.
"""

import atexit
import ctypes
import os
import shutil
import struct
import sys
import tempfile
import threading
import time

import msgpack
import zmq
from grpc_tools import protoc

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _compile(root, proto, prefix):
    """Generates the Python and gRPC modules of `proto` (a path below
    `root`) into a temporary directory put first on sys.path."""
    gen = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, gen, True)
    if protoc.main(["protoc", "-I" + root, "--python_out=" + gen, "--grpc_python_out=" + gen,
                    os.path.join(root, proto)]) != 0:
        sys.exit("protoc failed on " + proto)
    sys.path.insert(0, gen)


def kv_indexer_stubs():
    """(kv_indexer_pb2, kv_indexer_pb2_grpc), generated from the proto text."""
    _compile(os.path.join(_REPO, "proto"), os.path.join("kv_indexer", "v1", "kv_indexer.proto"),
             "kv-indexer-stubs-")
    from kv_indexer.v1 import kv_indexer_pb2, kv_indexer_pb2_grpc
    return kv_indexer_pb2, kv_indexer_pb2_grpc


def kv_indexer_standalone_stubs():
    """(pb2, pb2_grpc) of the standalone sgl-kv-indexer crate's schema: the
    same service and field numbers, hashes as decimal text. Its package is
    kv_indexer.v1 too, so a process loads this or kv_indexer_stubs(), not
    both."""
    _compile(os.path.dirname(os.path.abspath(__file__)), "kv_indexer_standalone.proto",
             "kv-indexer-standalone-stubs-")
    import kv_indexer_standalone_pb2
    import kv_indexer_standalone_pb2_grpc
    return kv_indexer_standalone_pb2, kv_indexer_standalone_pb2_grpc


_XXH = ctypes.CDLL("libxxhash.so.0")
_XXH.XXH64.restype = ctypes.c_uint64
_XXH.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]


def xxh64(data):
    return _XXH.XXH64(data, len(data), 0)


def conductor_hashes(tokens, block_size, salt=""):
    """The Conductor's rolling hashes of the whole blocks of `tokens`."""
    parent = xxh64(salt.encode())
    out = []
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size:(i + 1) * block_size]
        parent = xxh64(struct.pack("<Q", parent) + struct.pack("<%di" % block_size, *block))
        out.append(parent)
    return out



def numbered_blocks(first, n, block_size):
    """The tokens of n blocks, block b holding 1000 * b .. 1000 * b +
    block_size - 1: distinct blocks a test names by number."""
    return [1000 * b + t for b in range(first, first + n) for t in range(block_size)]


class ZmqEventPublisher:
    """An engine's KV-event PUB socket. Each batch is three frames, as vLLM's
    and SGLang's ZmqEventPublisher send them: the topic, the sequence number
    (8 bytes big-endian, from 0) and the msgpack payload. The payload is
    vLLM's KVEventBatch (`form` "vllm": a map {ts, events,
    data_parallel_rank}, as msgspec encodes a struct that is not array_like)
    or SGLang's and Mooncake's store's (`form` "array": [ts, events,
    dp_rank], the rank left out when None), stamped by `clock` (seconds;
    Mooncake's store stamps integer milliseconds). XPUB, so that a
    subscription can be awaited."""

    def __init__(self, data_parallel_rank=0, form="vllm", topic=b"", clock=time.time):
        self.sock = zmq.Context.instance().socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's
        self.endpoint = "tcp://127.0.0.1:%d" % self.sock.bind_to_random_port(
            "tcp://127.0.0.1")
        self.rank = data_parallel_rank
        self.form = form
        self.topic = topic
        self.clock = clock
        self.last_seq = -1

    def wait_for_subscriber(self, timeout_s):
        """True once a subscriber (the next one) has subscribed."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return False
        self.sock.recv()
        return True

    def publish(self, events):
        """Sends one batch; returns its sequence number."""
        self.last_seq += 1
        if self.form == "vllm":
            batch = {"ts": self.clock(), "events": events, "data_parallel_rank": self.rank}
        else:
            # array_like with omit_defaults: a trailing rank of None is left out.
            batch = [self.clock(), events] + ([] if self.rank is None else [self.rank])
        self.sock.send_multipart([self.topic, self.last_seq.to_bytes(8, "big"),
                                  msgpack.packb(batch, use_bin_type=True)])
        return self.last_seq

    def close(self):
        self.sock.close(linger=0)


def vllm_block_stored(block_hashes, parent_block_hash, token_ids, block_size, medium="GPU",
                      **defaulted):
    """vLLM's BlockStored as its kv_events.py encodes it: a map tagged by
    "type", its fields without a default always present, those with one
    (extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window)
    only when given (omit_defaults)."""
    event = {"type": "BlockStored", "block_hashes": block_hashes,
             "parent_block_hash": parent_block_hash, "token_ids": token_ids,
             "block_size": block_size, "lora_id": None, "medium": medium, "lora_name": None}
    event.update({k: v for k, v in defaulted.items() if v is not None})
    return event


def vllm_block_removed(block_hashes, medium="GPU", group_idx=None):
    """vLLM's BlockRemoved, likewise."""
    event = {"type": "BlockRemoved", "block_hashes": block_hashes, "medium": medium}
    if group_idx is not None:
        event["group_idx"] = group_idx
    return event


def sglang_block_stored(block_hashes, parent_block_hash, token_ids, block_size, medium=None):
    """SGLang's BlockStored as its kv_events.py encoded it before its
    events became maps (sglang_stored): array_like and tagged, [tag, block_hashes, parent_block_hash, token_ids, block_size,
    lora_id], then medium when it is not its default (None)."""
    event = ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, None]
    if medium is not None:
        event.append(medium)
    return event


def sglang_stored(block_hashes, parent_block_hash, token_ids, block_size, lora_id=None,
                  **defaulted):
    """SGLang's BlockStored as its newest kv_events.py encodes it: no longer
    array_like, so a map tagged by "type" (tag=True, the class name), its
    fields without a default always present in declaration order
    (block_hashes, parent_block_hash, token_ids, block_size, lora_id), those
    with one (medium, cache_salt, session_id) only when given
    (omit_defaults). Hashes are signed int64."""
    event = {"type": "BlockStored", "block_hashes": block_hashes,
             "parent_block_hash": parent_block_hash, "token_ids": token_ids,
             "block_size": block_size, "lora_id": lora_id}
    for name in ("medium", "cache_salt", "session_id"):
        if defaulted.get(name) is not None:
            event[name] = defaulted.pop(name)
    if defaulted:
        raise TypeError("not a field of SGLang's BlockStored: %s" % sorted(defaulted))
    return event


def sglang_removed(block_hashes, medium=None):
    """SGLang's newest BlockRemoved: {"type", "block_hashes"}, medium only
    when given (its default, None, is the device cache)."""
    event = {"type": "BlockRemoved", "block_hashes": block_hashes}
    if medium is not None:
        event["medium"] = medium
    return event


def sglang_cleared():
    """SGLang's newest AllBlocksCleared: the tag alone."""
    return {"type": "AllBlocksCleared"}


class TrtllmPublisher:
    """TensorRT-LLM's streaming KV-event publisher (its KVEventsConfig with
    publisher "zmq"), as its pyexecutor/kv_cache_events.py sends:

    - three frames, [topic, seq (8 bytes big-endian), payload]; the
      sequence starts at the wall clock in nanoseconds, not 0, so that it
      keeps rising across the engine's restarts, and every batch sent
      takes the next number;
    - the payload is its KVEventBatch, [ts, events, data_parallel_rank]
      (the rank always filled in), each event a map tagged by "type";
    - the first batch is AllBlocksCleared (a resync), and an idle
      publisher sends an empty batch every 5 s (heartbeat());
    - a ROUTER replay socket answers a request [client, "", start_seq]
      with [client, "", topic, seq, payload] for each buffered batch from
      start_seq on, then [client, "", "", eight 0xff bytes, ""].

    XPUB, so that a subscription can be awaited. `ports` rebinds the
    sockets of an engine that restarts ((pub, replay) port)."""

    END_SEQ = b"\xff" * 8

    def __init__(self, data_parallel_rank=0, topic=b"", ports=None):
        ctx = zmq.Context.instance()
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.router = ctx.socket(zmq.ROUTER)
        if ports is None:
            pub_port = self.sock.bind_to_random_port("tcp://127.0.0.1")
            replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        else:
            pub_port, replay_port = ports
            _bind_again(self.sock, pub_port)
            _bind_again(self.router, replay_port)
        self.ports = (pub_port, replay_port)
        self.endpoint = "tcp://127.0.0.1:%d" % pub_port
        self.replay_endpoint = "tcp://127.0.0.1:%d" % replay_port
        self.rank = data_parallel_rank
        self.topic = topic
        self.next_seq = time.time_ns()
        self.buffer = []  # (seq, payload), every batch sent
        self.lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._serve_replay, daemon=True)
        self.thread.start()
        self.publish([trtllm_cleared()])  # the start's resync

    def wait_for_subscriber(self, timeout_s):
        """True once a subscriber (the next one) has subscribed."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return False
        self.sock.recv()
        return True

    def publish(self, events, on_pub=True):
        """Sends one batch (only into the replay buffer, as one the network
        lost, unless `on_pub`); returns its sequence number."""
        payload = msgpack.packb([time.time(), events, self.rank], use_bin_type=True)
        with self.lock:
            seq = self.next_seq
            self.next_seq += 1
            self.buffer.append((seq, payload))
        if on_pub:
            self.sock.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def heartbeat(self):
        return self.publish([])

    def _serve_replay(self):
        while self.running:
            if not self.router.poll(50):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue  # TensorRT-LLM logs and ignores any other request
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            with self.lock:
                buffered = list(self.buffer)
            for seq, payload in buffered:
                if seq >= start_seq:
                    self.router.send_multipart([client, b"", self.topic,
                                                seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", b"", self.END_SEQ, b""])

    def close(self):
        self.running = False
        self.thread.join()
        self.router.close(linger=0)
        self.sock.close(linger=0)


def _bind_again(sock, port, timeout_s=10):
    """Binds a port a socket just closed held: ZeroMQ releases it from its
    I/O thread, a moment after close() returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock.bind("tcp://127.0.0.1:%d" % port)
            return
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def trtllm_signed(h):
    """A uint64 block hash as TensorRT-LLM puts it on the wire: int64."""
    return h - (1 << 64) if h >= (1 << 63) else h


def trtllm_stored(block_hashes, parent_block_hash, token_ids, block_size, medium="GPU",
                  group_idx=None, mm_keys=None):
    """TensorRT-LLM's BlockStored as its native-event translator sends it:
    every field without a default present (lora_id and lora_name nil), and
    group_idx, the layer group of the model's largest attention window,
    present whenever the engine names one (omit_defaults leaves out only
    None). Its streaming sink's stores may carry mm_keys (a list per block
    of trtllm_mm_key) and tokens given as text (EventTokenId = int | str)."""
    event = {"type": "BlockStored", "block_hashes": block_hashes,
             "parent_block_hash": parent_block_hash, "token_ids": token_ids,
             "block_size": block_size, "lora_id": None, "medium": medium, "lora_name": None}
    if group_idx is not None:
        event["group_idx"] = group_idx
    if mm_keys is not None:
        event["mm_keys"] = mm_keys
    return event


def trtllm_mm_key(digest, start_offset):
    """One multimodal input within a block: its MultimodalKey, tagged
    "mm_key", the digest as hex."""
    return {"type": "mm_key", "hash": digest.hex(), "start_offset": start_offset}


def trtllm_removed(block_hashes, medium="GPU", group_idx=None):
    """TensorRT-LLM's BlockRemoved: its device copies, or (a block moved to
    another cache level) the copy at its old level."""
    event = {"type": "BlockRemoved", "block_hashes": block_hashes, "medium": medium}
    if group_idx is not None:
        event["group_idx"] = group_idx
    return event


def trtllm_cleared():
    return {"type": "AllBlocksCleared"}
