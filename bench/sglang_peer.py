#!/usr/bin/python3
"""Replays the Mooncake traces through SGLang's real RadixCache, as a peer.

The same replay as bench/trace_replay, through SGLang's radix tree instead of
prefixd's core (docs/performance.md, "SGLang RadixCache as a peer"). Each
trace hash id is one block of --block_size tokens id * block_size + j; the
cache's page_size is block_size, and its KV pool holds capacity * block_size
token slots. Per request, as SGLang's scheduler and cache_finished_req do:

  match_prefix; inc_lock_ref(last node); evict the shortfall if the pool
  lacks room for the new tokens, and refuse the request (no insert) if it
  still does; allocate the new tokens; insert the whole prompt with the
  matched indices followed by the new ones; free the duplicate range the
  insert reports; dec_lock_ref(last node).

Only those calls are timed (perf_counter around each request, not the
building of its token list); block ops/s = prompt blocks / summed seconds,
as trace_replay's blk_ops/s.

SGLang's code is not part of this repository. --sglang_src names a directory
that holds the `sglang` package (a checkout's python/, or one with only
sglang/srt/mem_cache/{radix_cache,evict_policy,cache_init_params}.py in it).
radix_cache.py, evict_policy.py and cache_init_params.py are imported as they
are; the few modules they import from the rest of SGLang are replaced by
stubs in this file, each on a path the replay never takes. Needs torch (Debian:
python3-torch); --help and the check for radix_cache.py do not.

  /usr/bin/python3 bench/sglang_peer.py --sglang_src=DIR \\
      --capacities=1953,5859,19531 [--json > sglang.json]
  bench/peer_ratio.py prefixd.json sglang.json   # prefixd / SGLang
"""

import argparse
import dataclasses
import json
import os
import sys
import time
import types
from typing import Any, NamedTuple, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import lru_sim  # noqa: E402  (bench/lru_sim.py: the trace reader)
_RADIX_CACHE = os.path.join("sglang", "srt", "mem_cache", "radix_cache.py")


def fail(message):
    sys.exit("sglang_peer: " + message)


# --- Stubs for the imports outside the radix tree ---------------------------


def _module(name, path=None, **attrs):
    """Registers module `name` in sys.modules; a package if `path` is set."""
    m = types.ModuleType(name)
    if path is not None:
        m.__path__ = [path]
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def _never(what, why):
    """A stand-in that fails loudly if the replay ever takes its path."""

    def called(*args, **kwargs):
        raise RuntimeError("sglang_peer stub %s was called: %s" % (what, why))

    return called


def _event_class(name):
    # kv_events' classes are only built by RadixCache._record_*_event, which
    # returns at once unless enable_kv_cache_events: the replay turns it off.
    return type(name, (), {"__init__": _never(
        "kv_events." + name, "KV cache events are off")})


def _base_prefix_cache_stub(torch):
    """The records radix_cache.py constructs, and its base class.

    The real base_prefix_cache.py imports the allocator, memory pool and
    metrics collector, which import much of SGLang. RadixCache only builds
    these records with keyword fields and calls two base methods:
    init_metrics_collector (only with enable_metrics, off here) and
    update_eviction_metrics (a no-op here, as with metrics off).
    """

    @dataclasses.dataclass
    class MatchPrefixParams:
        key: Any
        cow_mamba: bool = False
        req: Any = None

    @dataclasses.dataclass
    class InsertParams:
        key: Any = None
        value: Optional[torch.Tensor] = None
        mamba_value: Optional[torch.Tensor] = None
        prev_prefix_len: int = 0
        swa_evicted_seqlen: int = 0
        chunked: bool = False
        priority: int = 0

    @dataclasses.dataclass
    class InsertResult:
        prefix_len: int
        mamba_exist: bool = False

    @dataclasses.dataclass
    class EvictParams:
        num_tokens: int
        swa_num_tokens: int = 0
        mamba_num: int = 0

    @dataclasses.dataclass
    class EvictResult:
        num_tokens_evicted: int = 0
        swa_num_tokens_evicted: int = 0
        mamba_num_evicted: int = 0

    class MatchResult(NamedTuple):
        device_indices: torch.Tensor
        last_device_node: Any
        last_host_node: Any
        host_hit_length: int = 0

    class BasePrefixCache:
        init_metrics_collector = _never(
            "BasePrefixCache.init_metrics_collector", "metrics are off")

        def update_eviction_metrics(self, num_evicted, start_time):
            pass  # metrics are off

    return dict(MatchPrefixParams=MatchPrefixParams, InsertParams=InsertParams,
                InsertResult=InsertResult, EvictParams=EvictParams,
                EvictResult=EvictResult, MatchResult=MatchResult,
                BasePrefixCache=BasePrefixCache)


def import_radix_cache(src, torch):
    """Imports SGLang's radix_cache module from `src` with the stubs in place.

    The parent packages are registered as bare packages whose __path__ is the
    checkout's directory, so sglang/__init__.py (which imports the whole
    runtime) never runs, while radix_cache.py, evict_policy.py and
    cache_init_params.py load from their files.
    """
    pkg = os.path.join(src, "sglang")
    _module("sglang", pkg)
    _module("sglang.srt", os.path.join(pkg, "srt"))
    _module("sglang.srt.mem_cache", os.path.join(pkg, "srt", "mem_cache"))
    # Only the event classes and MEDIUM_GPU, used by _record_*_event alone.
    _module("sglang.srt.disaggregation", os.path.join(pkg, "srt",
                                                      "disaggregation"))
    _module("sglang.srt.disaggregation.kv_events", MEDIUM_GPU="GPU",
            **{n: _event_class(n) for n in ("AllBlocksCleared", "BlockRemoved",
                                            "BlockStored")})
    _module("sglang.srt.mem_cache.base_prefix_cache",
            **_base_prefix_cache_stub(torch))
    # The hashes of KV events (compute_node_hash_values): events are off.
    _module("sglang.srt.mem_cache.hicache_storage",
            get_hash_str=_never("get_hash_str", "KV cache events are off"),
            hash_str_to_int64=_never("hash_str_to_int64",
                                     "KV cache events are off"))
    # Bigram keys are EAGLE's (maybe_bigram_convert): is_eagle is False.
    _module("sglang.srt.mem_cache.utils",
            convert_to_bigram_key=_never("convert_to_bigram_key",
                                         "EAGLE is off"))
    try:
        import sglang.srt.mem_cache.radix_cache as rc
    except ImportError as e:
        fail("importing %s failed: %s (this harness stubs only kv_events, "
             "base_prefix_cache, hicache_storage and utils; evict_policy.py "
             "and cache_init_params.py must sit beside radix_cache.py)"
             % (os.path.join(src, _RADIX_CACHE), e))
    for name in ("RadixCache", "RadixKey"):
        if not hasattr(rc, name):
            fail("%s has no %s: not the RadixCache API this harness drives "
                 "(match_prefix(MatchPrefixParams), insert(InsertParams), "
                 "evict(EvictParams))" % (rc.__file__, name))
    import sglang.srt.mem_cache.cache_init_params as cip
    return rc, cip.CacheInitParams, sys.modules[
        "sglang.srt.mem_cache.base_prefix_cache"]


# --- The KV pool ------------------------------------------------------------


class KvAllocator:
    """Token slots 0 .. capacity-1, as SGLang's token-to-KV pool allocator.

    RadixCache reads .device and calls .free(indices). Freed slots are kept
    as a list of tensors and merged into the free tensor only when an alloc
    needs them, so that a free costs O(1) and the allocator adds little to
    the time charged to SGLang.
    """

    def __init__(self, torch, capacity_tokens):
        self._torch = torch
        self.device = torch.device("cpu")
        self.capacity = capacity_tokens
        self._free = torch.arange(capacity_tokens, dtype=torch.int64)
        self._released = []
        self._released_tokens = 0

    def available(self):
        return len(self._free) + self._released_tokens

    def alloc(self, n):
        if n > len(self._free):
            self._free = self._torch.cat([self._free] + self._released)
            self._released, self._released_tokens = [], 0
        out = self._free[:n]
        self._free = self._free[n:]
        return out

    def free(self, indices):
        n = len(indices)
        if n:
            self._released.append(indices)
            self._released_tokens += n

    def free_slots(self):
        return self._torch.cat([self._free] + self._released)


# --- Traces -----------------------------------------------------------------


def load_trace(name, trace_dir):
    path = name if name.endswith(".jsonl") else os.path.join(
        trace_dir, name + "_trace.jsonl")
    if not os.path.isfile(path):
        fail("trace '%s': no file %s" % (name, path))
    requests = lru_sim.load(path)  # the simulator's reader: hash_ids only
    return os.path.basename(path).replace("_trace.jsonl", ""), requests


def expand(ids, bs):
    return [i * bs + j for i in ids for j in range(bs)]


# --- Replay -----------------------------------------------------------------


class Progress:
    def __init__(self, label, enabled):
        self.label, self.enabled = label, enabled
        self.last = time.monotonic()

    def update(self, done, total):
        now = time.monotonic()
        if self.enabled and now - self.last >= 1.0:
            self.last = now
            print("sglang_peer: %s: %d/%d requests" % (self.label, done, total),
                  file=sys.stderr, flush=True)


def replay(sg, trace, requests, capacity_blocks, label, args):
    """One replay into a fresh RadixCache; returns the row's figures."""
    torch, rc, params, bpc = sg
    bs = args.block_size
    alloc = KvAllocator(torch, capacity_blocks * bs)
    cache = rc.RadixCache(params(
        disable=False, req_to_token_pool=None,
        token_to_kv_pool_allocator=alloc, page_size=bs,
        eviction_policy=args.eviction_policy))
    RadixKey, MatchPrefixParams = rc.RadixKey, bpc.MatchPrefixParams
    InsertParams, EvictParams = bpc.InsertParams, bpc.EvictParams
    cat, perf, cpu = torch.cat, time.perf_counter, time.thread_time
    t = dict(requests=0, blocks=0, hit_blocks=0, inserted_blocks=0,
             evicted_blocks=0, refused_inserts=0)
    seconds = cpu_seconds = 0.0
    progress = Progress(label, args.progress)
    for ids in requests:
        tokens = expand(ids, bs)
        c0, t0 = cpu(), perf()
        # --- timed: what SGLang does for one request
        key = RadixKey(tokens)
        m = cache.match_prefix(MatchPrefixParams(key=key))
        matched, node = m.device_indices, m.last_device_node
        cache.inc_lock_ref(node)
        need = len(tokens) - len(matched)
        evicted = 0
        if alloc.available() < need:
            evicted = cache.evict(
                EvictParams(num_tokens=need - alloc.available())
            ).num_tokens_evicted
        refused = alloc.available() < need
        inserted = 0
        if not refused:
            value = cat([matched, alloc.alloc(need)])
            prefix_len = cache.insert(
                InsertParams(key=key, value=value)).prefix_len
            alloc.free(value[len(matched):prefix_len])
            inserted = len(tokens) - max(prefix_len, len(matched))
        cache.dec_lock_ref(node)
        # --- end of timed part
        seconds += perf() - t0
        cpu_seconds += cpu() - c0
        t["requests"] += 1
        t["blocks"] += len(ids)
        t["hit_blocks"] += len(matched) // bs
        t["inserted_blocks"] += inserted // bs
        t["evicted_blocks"] += evicted // bs
        t["refused_inserts"] += refused
        progress.update(t["requests"], len(requests))
    t["cached_blocks"] = check_slots(torch, cache, alloc, trace,
                                     capacity_blocks) // bs
    t["seconds"], t["cpu_seconds"] = seconds, cpu_seconds
    return t


def check_slots(torch, cache, alloc, trace, capacity_blocks):
    """Every slot is either free or cached, exactly once; returns cached."""
    where = "%s capacity %s" % (trace, capacity_blocks)
    cached = cache.total_size()
    free = alloc.free_slots()
    if cache.protected_size() != 0:
        fail("%s: %d tokens still locked after the replay"
             % (where, cache.protected_size()))
    if len(free) + cached != alloc.capacity:
        fail("%s: free %d + cached %d != capacity %d tokens (a leak or a "
             "double free)" % (where, len(free), cached, alloc.capacity))
    values = [free] + ([cache.all_values_flatten()]
                       if cache.root_node.children else [])
    slots = torch.sort(torch.cat(values)).values
    if not torch.equal(slots, torch.arange(alloc.capacity, dtype=torch.int64)):
        fail("%s: the free and cached slots are not each slot once (a slot "
             "was freed twice or lost)" % where)
    return cached


# --- Output -----------------------------------------------------------------


def finish_row(trace, capacity, t):
    row = dict(trace=trace, capacity=str(capacity), **t)
    row["block_hit_rate"] = t["hit_blocks"] / t["blocks"] if t["blocks"] else 0
    row["block_ops_per_second"] = t["blocks"] / t["seconds"]
    row["block_ops_per_cpu_second"] = t["blocks"] / t["cpu_seconds"]
    return row


def print_table(rows):
    print("%-13s %-8s %9s %8s %8s %9s %9s %7s %11s %11s" % (
        "trace", "policy", "capacity", "requests", "blocks", "blk_hit",
        "evicted", "refused", "blk_ops/s", "cpu_ops/s"))
    for r in rows:
        print("%-13s %-8s %9s %8d %8d %8.4f%% %9d %7d %11.0f %11.0f" % (
            r["trace"], "sglang-" + r["eviction_policy"], r["capacity"],
            r["requests"], r["blocks"], 100 * r["block_hit_rate"],
            r["evicted_blocks"], r["refused_inserts"],
            r["block_ops_per_second"], r["block_ops_per_cpu_second"]))


# --- Main -------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="SGLang's source is not in this repository: docs/performance.md"
        " says which files to fetch and where to put them.")
    ap.add_argument("--sglang_src", required=True, metavar="DIR",
                    help="directory holding the sglang package (a checkout's "
                    "python/): DIR/" + _RADIX_CACHE + " must exist")
    ap.add_argument("--traces", default="conversation,synthetic",
                    help="traces: names of <trace_dir>/<name>_trace.jsonl or "
                    "paths ending in .jsonl, comma-separated "
                    "(default: %(default)s)")
    ap.add_argument("--capacities", default="1953,5859,19531",
                    help="KV pool sizes in blocks, comma-separated; "
                    "'infinite' for one that never evicts "
                    "(default: %(default)s)")
    ap.add_argument("--trace_dir",
                    default=os.path.join(_HERE, "..", "tests", "data",
                                         "mooncake"),
                    help="directory of the Mooncake traces "
                    "(default: the repository's tests/data/mooncake)")
    ap.add_argument("--block_size", type=int, default=16,
                    help="tokens per block, also RadixCache's page_size "
                    "(default: %(default)s)")
    ap.add_argument("--eviction_policy", default="lru",
                    choices=("lru", "lfu", "fifo", "mru", "filo", "priority"),
                    help="RadixCache's eviction policy (default: %(default)s, "
                    "SGLang's default)")
    ap.add_argument("--runs", type=int, default=3,
                    help="replays per (trace, capacity); the one with the "
                    "median CPU time is reported, as trace_replay does "
                    "(default: %(default)s)")
    ap.add_argument("--json", action="store_true",
                    help="print JSON (as trace_replay --json) instead of a "
                    "table")
    ap.add_argument("--no_progress", dest="progress", action="store_false",
                    help="no progress lines on stderr")
    args = ap.parse_args(argv)
    if args.block_size < 1:
        ap.error("--block_size=%d: must be >= 1" % args.block_size)
    if args.runs < 1:
        ap.error("--runs=%d: must be >= 1" % args.runs)
    args.capacity_list = []
    for c in args.capacities.split(","):
        c = c.strip()
        if c in ("infinite", "inf"):
            args.capacity_list.append("infinite")
        elif c.isdigit() and int(c) > 0:
            args.capacity_list.append(int(c))
        else:
            ap.error("--capacities: '%s' is not a positive number of blocks "
                     "or 'infinite'" % c)
    return args


def main(argv):
    args = parse_args(argv)
    src = os.path.abspath(args.sglang_src)
    # Checked before torch is imported, so that this error needs no torch.
    if not os.path.isfile(os.path.join(src, _RADIX_CACHE)):
        fail("--sglang_src=%s: no %s there (DIR must hold the sglang package, "
             "e.g. a checkout's python/; see docs/performance.md)"
             % (args.sglang_src, os.path.join(src, _RADIX_CACHE)))
    try:
        import torch
    except ImportError as e:
        fail("SGLang's radix_cache.py needs torch (Debian: apt-get install "
             "python3-torch): %s" % e)
    torch.set_num_threads(1)  # one thread, as trace_replay's core path
    rc, params, bpc = import_radix_cache(src, torch)
    sg = (torch, rc, params, bpc)
    rows = []
    for name in args.traces.split(","):
        trace, requests = load_trace(name.strip(), args.trace_dir)
        for cap in args.capacity_list:
            # An infinite pool: one slot per prompt token of the trace.
            blocks = (sum(len(r) for r in requests) if cap == "infinite"
                      else cap)
            runs = sorted((replay(sg, trace, requests, blocks,
                                  "%s capacity %s run %d/%d"
                                  % (trace, cap, i + 1, args.runs), args)
                           for i in range(args.runs)),
                          key=lambda t: t["cpu_seconds"])
            row = finish_row(trace, cap, runs[len(runs) // 2])
            row["eviction_policy"] = args.eviction_policy
            rows.append(row)
    if args.json:
        print(json.dumps({"peer": "sglang-radix-cache",
                          "radix_cache": os.path.join(src, _RADIX_CACHE),
                          "block_size": args.block_size, "replays": rows},
                         indent=2))
    else:
        print_table(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
