"""What the index's interop tests take from the routers' published specs,
computed here independently of prefixd's own code:

- SGLang's KV indexer client, generated at import time from the
  repository's copy of kv_indexer.proto (as published) with grpc_tools;
- the Mooncake Conductor's rolling hash: XXH64 (Debian's libxxhash through
  ctypes) of the parent key as 8 bytes little-endian then the block's
  tokens as int32 little-endian, seed 0, from XXH64(salt).
"""

import atexit
import ctypes
import os
import shutil
import struct
import sys
import tempfile

from grpc_tools import protoc

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kv_indexer_stubs():
    """(kv_indexer_pb2, kv_indexer_pb2_grpc), generated from the proto text."""
    root = os.path.join(_REPO, "proto")
    gen = tempfile.mkdtemp(prefix="kv-indexer-stubs-")
    atexit.register(shutil.rmtree, gen, True)
    if protoc.main(["protoc", "-I" + root, "--python_out=" + gen, "--grpc_python_out=" + gen,
                    os.path.join(root, "kv_indexer", "v1", "kv_indexer.proto")]) != 0:
        sys.exit("protoc failed on kv_indexer.proto")
    sys.path.insert(0, gen)
    from kv_indexer.v1 import kv_indexer_pb2, kv_indexer_pb2_grpc
    return kv_indexer_pb2, kv_indexer_pb2_grpc


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
