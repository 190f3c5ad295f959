#!/usr/bin/env python3
"""An independent leaf-LRU (or Belady) simulator of the trace replay.

It shares no code with prefixd: a plain prefix tree of trace hash ids, one
block per id. Per request, as bench/trace_replay does through core/:
  1. match the longest cached prefix of the request's ids; stamp the matched
     blocks with the request's logical time (one step per request);
  2. if the request has more blocks than the capacity, insert nothing (prefixd
     refuses such an Insert with RESOURCE_EXHAUSTED and changes nothing);
  3. otherwise insert the rest, stamped with the same time; then, while more
     blocks are cached than the capacity, evict the least-recently-stamped
     block that has no cached child and is not on the current request's path.

With --policy=belady, step 3 evicts instead the evictable block whose next use
(the next request that holds it) is farthest in the future: the offline
optimum that bench/belady computes, checked against it by
bench/check_belady.py (docs/performance.md, "Eviction policies"). With
--policy=reuse_oracle it evicts the least recently used block among those
never used again, and LRU's block only when there is none: what a policy
could reach if it knew which blocks come back, but not when.

Prints the block hit rate per capacity (a table, or JSON with --json).
Plain Python 3, no third-party modules.

  lru_sim.py --trace=tests/data/mooncake/synthetic_trace.jsonl \\
             --capacities=10000,50000,infinite
"""

import argparse
import heapq
import json
import re
import sys

_HASH_IDS = re.compile(r'"hash_ids"\s*:\s*\[([^\]]*)\]')


def load(path):
    requests = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            m = _HASH_IDS.search(line)
            if m is None:
                sys.exit("%s:%d: no hash_ids" % (path, n))
            body = m.group(1).strip()
            requests.append([int(x) for x in body.split(",")] if body else [])
    return requests


class Block:
    __slots__ = ("key", "parent", "children", "stamp", "cached", "next_use")

    def __init__(self, key, parent):
        self.key = key
        self.parent = parent
        self.children = {}  # key -> cached child Block
        self.stamp = 0
        self.cached = True
        self.next_use = 0


def next_uses(requests):
    """For each request, the index of the next request holding each id."""
    never = len(requests)
    following = {}
    out = [None] * len(requests)
    for i in range(len(requests) - 1, -1, -1):
        out[i] = [following.get(key, never) for key in requests[i]]
        for key in requests[i]:
            following[key] = i
    return out


def simulate(requests, capacity, policy="lru"):
    """Returns (hit_blocks, total_blocks, evicted_blocks, refused_inserts).

    policy "lru" evicts the least recently stamped evictable block; "belady"
    the one used again farthest in the future; "reuse_oracle" the least
    recently stamped of those never used again, and only when there is none
    the least recently stamped: an oracle that knows which blocks come back
    but not when.
    """
    nexts = next_uses(requests)
    never = len(requests)
    clock = 0
    root = Block(None, None)
    cached = 0
    hits = total = evicted = refused = 0
    # Candidates (key, seq, block), checked when popped: a block is a victim
    # only if it is still cached, childless and its key is still `key`.
    heap = []
    seq = 0

    def order_key(b):
        if policy == "belady":
            return -b.next_use
        if policy == "reuse_oracle":
            return (b.next_use != never, b.stamp)
        return b.stamp

    def push(b):
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (order_key(b), seq, b))

    for ids, nxt in zip(requests, nexts):
        clock += 1
        total += len(ids)
        node, path = root, []
        for key in ids:
            child = node.children.get(key)
            if child is None:
                break
            path.append(child)
            node = child
        hits += len(path)
        for b, n in zip(path, nxt):
            b.next_use = n
            b.stamp = clock
        if len(ids) > capacity:
            refused += 1
            if path and not path[-1].children:
                push(path[-1])
            continue
        for k, n in zip(ids[len(path):], nxt[len(path):]):
            child = Block(k, node)
            child.next_use = n
            child.stamp = clock
            node.children[k] = child
            cached += 1
            path.append(child)
            node = child
        if path and not path[-1].children:
            push(path[-1])
        on_path = set(map(id, path))
        aside = []  # on the current path: not evictable, offered again after
        while cached > capacity:
            k, _, b = heapq.heappop(heap)
            if not b.cached or b.children or order_key(b) != k:
                continue  # stale entry
            if id(b) in on_path:
                aside.append(b)
                continue
            del b.parent.children[b.key]
            b.cached = False
            cached -= 1
            evicted += 1
            parent = b.parent
            if parent is not root and not parent.children:
                push(parent)
        for b in aside:
            push(b)
    return hits, total, evicted, refused


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True, help="a Mooncake .jsonl trace")
    ap.add_argument("--capacities", default="10000,50000,infinite",
                    help="capacities in blocks, comma-separated")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--policy", choices=("lru", "belady", "reuse_oracle"),
                    default="lru",
                    help="lru (prefixd's default), belady (the offline "
                    "optimum) or reuse_oracle (LRU that knows which blocks "
                    "are never used again and evicts those first)")
    args = ap.parse_args()

    requests = load(args.trace)
    rows = []
    for c in args.capacities.split(","):
        c = c.strip()
        cap = float("inf") if c in ("infinite", "inf") else int(c)
        hits, total, evicted, refused = simulate(requests, cap, args.policy)
        rows.append({"capacity": c, "blocks": total, "hit_blocks": hits,
                     "block_hit_rate": hits / total if total else 0.0,
                     "evicted_blocks": evicted, "refused_inserts": refused})
    if args.json:
        print(json.dumps({"trace": args.trace, "results": rows}, indent=2))
        return
    print("%-10s %10s %10s %10s %10s %9s" % ("capacity", "blocks", "hit_blk",
                                            "blk_hit", "evicted", "refused"))
    for r in rows:
        print("%-10s %10d %10d %9.4f%% %10d %9d" % (
            r["capacity"], r["blocks"], r["hit_blocks"],
            100 * r["block_hit_rate"], r["evicted_blocks"],
            r["refused_inserts"]))


if __name__ == "__main__":
    main()
