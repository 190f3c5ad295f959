#!/usr/bin/python3
"""Writes the seed corpora of index_events_fuzzer and load_stat_fuzzer
(tests/fuzz/corpus/<target>/).

    /usr/bin/python3 tests/fuzz/make_index_seeds.py

Each index_events_fuzzer seed is one KV event payload as stock engines
publish it: msgspec's msgpack of an EventBatch, in the array form (older
vLLM, SGLang; array_like=True) or the map form (newer vLLM), with the event
shapes index/events.h decodes. Each load_stat_fuzzer seed is one of
SGLang's load messages (index/load_stat.h). The output is deterministic, so
rerunning the script changes nothing unless the script changed.
"""

import os

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
TS = 1735689600.125


def tokens(first, n):
    return list(range(first, first + n))


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def stored_array(hashes, parent, block_size, first_token=0, lora_id=None, medium="GPU",
                 lora_name=None, extra_keys=None, group_idx=None, upto=None):
    """A BlockStored in the array form; upto keeps only the first fields (older vLLM)."""
    event = ["BlockStored", hashes, parent, tokens(first_token, len(hashes) * block_size),
             block_size, lora_id, medium, lora_name, extra_keys, group_idx,
             "full_attention", None]
    return event[:upto] if upto else event


def stored_map(hashes, parent, block_size, first_token=0, lora_name=None, extra_keys=None,
               group_idx=None, medium="GPU"):
    """A BlockStored in the map form: fields left at their default are omitted."""
    event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
             "token_ids": tokens(first_token, len(hashes) * block_size),
             "block_size": block_size, "lora_id": None, "medium": medium,
             "lora_name": lora_name}
    if extra_keys is not None:
        event["extra_keys"] = extra_keys
    if group_idx is not None:
        event["group_idx"] = group_idx
        event["kv_cache_spec_kind"] = "sliding_window"
        event["kv_cache_spec_sliding_window"] = 1024
    return event


def seeds():
    s = {}
    # SGLang: array batch, array events, int hashes, dp rank.
    s["sglang_array"] = pack([TS, [
        stored_array([101, 102], None, 4),
        stored_array([103], 102, 4, first_token=8),
        ["BlockRemoved", [101], "GPU"],
    ], 0])
    # Older vLLM: BlockStored up to lora_id, then up to medium; no dp rank.
    s["vllm_old_short_fields"] = pack([TS, [
        stored_array([-5, 2 ** 63 + 1], None, 2, upto=6),
        stored_array([7], 2 ** 63 + 1, 2, first_token=4, medium="cpu", upto=7),
        ["BlockRemoved", [-5], None],
        ["AllBlocksCleared"],
    ]])
    # Newer vLLM: map batch, map events, bytes hashes (sha256 digests).
    h = [bytes([i]) * 32 for i in range(1, 4)]
    s["vllm_map_bytes_hashes"] = pack({"ts": TS, "events": [
        stored_map(h[:2], None, 16),
        stored_map(h[2:], h[1], 16, first_token=32),
        {"type": "BlockRemoved", "block_hashes": [h[0]], "medium": "GPU"},
    ], "data_parallel_rank": 1})
    # LoRA and cache salt in extra_keys; group_idx and cache spec fields.
    s["vllm_map_lora_salt"] = pack({"ts": TS, "events": [
        stored_map([11, 12, 13], None, 2, lora_name="sql-adapter",
                   extra_keys=[("sql-adapter", "tenant-a"), ("sql-adapter",), ("sql-adapter",)],
                   group_idx=1),
        {"type": "BlockRemoved", "block_hashes": [13], "medium": "GPU", "group_idx": 1},
    ]})
    # Multimodal keys, (identifier, offset in the block) as vLLM sends them:
    # an image from the third block on ends the chain there; the last block
    # also carries a prompt-embeds digest.
    s["vllm_map_multimodal"] = pack({"ts": TS, "events": [
        stored_map([21, 22, 23, 24], None, 4,
                   extra_keys=[None, None, (("mm-9f86d081884c7d65", 2),),
                               (("mm-9f86d081884c7d65", -2), b"\x01" * 32)]),
    ], "data_parallel_rank": 0})
    # A hybrid Mamba model in vLLM's align mode: its Mamba group (0) stores
    # the state of the last block alone, token_ids covering every new block;
    # an MLA group (1) stores them all.
    mamba = stored_map([44], None, 4)
    mamba.update(token_ids=tokens(0, 16), group_idx=0, kv_cache_spec_kind="mamba")
    mla = stored_map([41, 42, 43, 44], None, 4)
    mla.update(group_idx=1, kv_cache_spec_kind="mla_attention")
    s["vllm_map_mamba_align"] = pack({"ts": TS, "events": [mamba, mla]})
    # Mooncake's store master: objects by key (vLLM's, SGLang's), seq_hashes
    # empty, the batch stamped in integer milliseconds.
    digest = "0102030405060708" + "ab" * 16 + "1122334455667788"

    def mooncake(event_type, key):
        return {"event_id": 1, "timestamp": 1765000000000, "event_type": event_type,
                "model_name": None, "block_size": None, "lora_name": None,
                "tenant_id": "default", "backend_id": "store-0", "medium": "cpu",
                "dp_rank": 0, "group_id": None, "object_key": key, "seq_hashes": []}

    s["mooncake_object_keys"] = pack([1765000000000, [
        mooncake("stored", "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + digest),
        mooncake("stored", "m_" + digest + "_0_k"),
        mooncake("removed", "m_" + digest + "_0_v"),
        {"event_id": 2, "timestamp": 1765000000000, "event_type": "cleared",
         "tenant_id": "default", "backend_id": "store-0"},
    ], 0])
    # Array events with every field, extra_keys, in an array batch.
    s["vllm_array_full"] = pack([TS, [
        stored_array([31, 32], None, 8, lora_id=3, lora_name="chat",
                     extra_keys=[("chat", "salt-b"), None], group_idx=0),
        stored_array([33], 32, 8, first_token=16, lora_id=3, medium="cpu",
                     lora_name="chat", extra_keys=[("chat",)], group_idx=0),
        ["BlockRemoved", [31, 32, 33], "CPU", 0],
    ], 2])
    # Unknown event types and fields, which are skipped and counted.
    s["unknown_types_fields"] = pack({"ts": TS, "producer": "vllm-next", "events": [
        ["BlockMoved", [1], "GPU", "CPU"],
        {"type": "CacheResized", "num_blocks": 4096},
        stored_array([41], None, 2) + ["future_field", [1, 2]],
        {"type": "BlockRemoved", "block_hashes": [41], "medium": "GPU",
         "eviction_reason": "lru"},
        ["AllBlocksCleared", 0],
    ]})
    # RFC #1527's storage daemons: map events tagged event_type, rolling
    # hashes and no token ids; one with a block size, one without.
    s["rfc1527_keys_only"] = pack({"ts": TS, "events": [
        {"event_type": "stored", "model_name": "deepseek", "block_size": 16,
         "tenant_id": "default", "backend_id": "store-0", "medium": "cpu", "dp_rank": 0,
         "seq_hashes": [2 ** 64 - 3, 17], "base_block_idx": None, "parent_hash": None,
         "token_ids": None, "additional_salt": "tenant-a"},
        {"type": "BlockStored", "block_hashes": [18], "parent_block_hash": 17,
         "token_ids": None, "medium": "cpu"},
        {"event_type": "removed", "seq_hashes": [18], "medium": "cpu"},
    ]})
    # Newer vLLM's removal of one copy of a recomputed block: the hash is
    # stored twice, then each copy's removal says how many copies are left.
    s["vllm_map_copies_left"] = pack({"ts": TS, "events": [
        stored_map([51, 52], None, 4),
        stored_map([52], 51, 4, first_token=4),
        {"type": "BlockRemoved", "block_hashes": [52, 51], "medium": "GPU",
         "remaining_copy_counts": [1, 0]},
        {"type": "BlockRemoved", "block_hashes": [52], "medium": "GPU",
         "remaining_copy_counts": [0]},
    ]})
    # vLLM's OffloadingConnector: what it copied to the CPU by hash alone
    # (token_ids [], block_size 0; older vLLM the offloaded block's size),
    # then the CPU's removal.
    s["vllm_map_offload_placeholder"] = pack({"ts": TS, "events": [
        stored_map([61, 62], None, 4),
        {"type": "BlockStored", "block_hashes": [62], "parent_block_hash": None,
         "token_ids": [], "block_size": 0, "lora_id": None, "medium": "CPU",
         "lora_name": None, "group_idx": 0},
        ["BlockStored", [61], None, [], 256, None, "CPU"],
        {"type": "BlockRemoved", "block_hashes": [61, 62], "medium": "CPU", "group_idx": 0},
    ]})
    # SGLang under EAGLE: token_ids as pairs [t, next t], one page per event
    # chained by its parent, then the removal.
    s["sglang_eagle_bigram"] = pack([TS, [
        ["BlockStored", [71], None, [[1, 2], [2, 3], [3, 4], [4, 5]], 4, None, "GPU"],
        ["BlockStored", [72], 71, [[5, 6], [6, 7], [7, 8], [8, 9]], 4, None, "GPU"],
        ["BlockRemoved", [72], "GPU"],
    ], 0])
    # SGLang's cache salt: its metadata map in lora_name's slot (some
    # releases), then extra_keys' prefixed salt with the map past ownership.
    meta = {"cache_salt": "tenant-a"}
    s["sglang_salt_metadata"] = pack([TS, [
        ["BlockStored", [81], None, [1, 2, 3, 4], 4, None, "GPU", meta],
        ["BlockStored", [82], 81, [5, 6, 7, 8], 4, None, "GPU", None,
         [["dynamo-cache-salt:tenant-a"]], None, None, None, None, None, meta],
    ], 0])
    # The newest SGLang: a positional batch of tagged maps, the salt and
    # the session named fields of every store of the request.
    s["sglang_named_salt"] = pack([TS, [
        {"type": "BlockStored", "block_hashes": [91], "parent_block_hash": None,
         "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None, "medium": "GPU",
         "cache_salt": "tenant-a", "session_id": "session-a"},
        {"type": "BlockStored", "block_hashes": [92], "parent_block_hash": 91,
         "token_ids": [5, 6, 7, 8], "block_size": 4, "lora_id": None, "medium": "GPU",
         "cache_salt": "tenant-a"},
        {"type": "BlockRemoved", "block_hashes": [92], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ], 0])
    # SGLang with --enable-kv-events-component-types: the components after
    # medium in its array form, a named field in its map form; a page
    # restated with fewer components.
    s["sglang_component_types"] = pack([TS, [
        ["BlockStored", [93, 94], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU",
         ["full", "swa"]],
        {"type": "BlockStored", "block_hashes": [93], "parent_block_hash": None,
         "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None, "medium": "GPU",
         "component_types": ["full"]},
        ["BlockStored", [95], 94, [9, 10, 11, 12], 4, None, "GPU", ["full", "mamba"]],
        ["BlockRemoved", [95], "GPU"],
    ], 0])
    # SGLang's earlier component-typed layout: a component's name where
    # medium is, then component_id, snapshot_version and medium.
    s["sglang_one_component"] = pack([TS, [
        ["BlockStored", [96], None, [1, 2, 3, 4], 4, None, "full", None, 0, "GPU"],
        ["BlockStored", [96], None, [1, 2, 3, 4], 4, None, "swa", None, 0, "GPU"],
        ["BlockRemoved", [96], "swa", None, 0, "GPU"],
        {"type": "BlockStored", "block_hashes": [96], "parent_block_hash": None,
         "token_ids": [1, 2, 3, 4], "block_size": 4, "lora_id": None,
         "component_type": "mamba", "component_id": 2, "snapshot_version": 1,
         "medium": "GPU"},
    ], 0])
    # TensorRT-LLM: tagged maps in an array batch with the rank, int64
    # hashes, its largest window's layer group named, multimodal keys on a
    # block, and a token given as text.
    trt = stored_map([-7, -(2 ** 63)], None, 4)
    trt.update(group_idx=1, mm_keys=[[], [{"type": "mm_key", "hash": "9f" * 16,
                                            "start_offset": 1}]])
    trt_text = stored_map([31, 32], None, 4)
    trt_text["token_ids"][5] = "mm:9f"
    s["trtllm_mm_text_group"] = pack([TS, [
        {"type": "AllBlocksCleared"}, trt, trt_text,
        {"type": "BlockRemoved", "block_hashes": [-7], "medium": "GPU", "group_idx": 1},
    ], 0])
    # A cleared-only batch with an int ts and an explicit nil dp rank.
    s["cleared_int_ts"] = pack([1735689600, [["AllBlocksCleared"]], None])
    return s


def load_stat_seeds():
    """SGLang's LoadStat: ["LoadStat", running, waiting, num_tokens,
    max_total_num_tokens, attn_dp_rank], every field written."""
    return {
        "sglang_load_stat": pack(["LoadStat", 3, 5, 2500, 10000, 1]),
        "capacity_unknown": pack(["LoadStat", 0, 0, 7, 0, None]),
        "more_elements": pack(["LoadStat", 2, 1, 10, 100, 0, "later"]),
    }


def main():
    for target, corpus in (("index_events_fuzzer", seeds()),
                           ("load_stat_fuzzer", load_stat_seeds())):
        out = os.path.join(HERE, "corpus", target)
        os.makedirs(out, exist_ok=True)
        for name, data in corpus.items():
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
