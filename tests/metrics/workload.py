"""A workload whose every count is known, for the metrics tests.

Geometry: llama-3-8b fp16, block_size 16, so one block is 16 x 131072 B =
2 MiB; the budget is 40 MiB = 20 blocks. Tenant acme is configured with
reserved 8 MiB (4 blocks) and limit 16 MiB (8 blocks); tenant beta is created
on first use with the default quota (reserved 0, limit the whole budget).

The counts below follow from docs/api.md (Match, Insert, Evict) and
docs/architecture.md (recency and eviction); each step says why.
"""

MIB = 1 << 20
BLOCK_SIZE = 16
BLOCK_BYTES = 2 * MIB
BUDGET_BYTES = 40 * MIB

CONFIG = """\
model { preset: "llama-3-8b" }
kv_dtype: "fp16"
block_size: 16
kv_budget: "40MiB"
lease_ttl: "300s"
drain_timeout: "3s"
tenants { name: "acme" reserved: "8MiB" limit: "16MiB" }
"""

REASONS = ("budget", "limit", "requested", "invalidated", "reset")

# The pinned lease of step 3 expires after this; the test waits for it.
SHORT_LEASE_MS = 300


def toks(start, n):
    return list(range(start, start + n))


def phase1(c):
    """Creates both tenants with one miss each, so that phase 2 changes
    series Prometheus has already scraped (rate() then sees the increase)."""
    c.call("Match", tenant="acme", tokens=toks(0, 32))   # miss: 32 tokens
    c.call("Match", tenant="beta", tokens=toks(5000, 16))  # miss: 16 tokens


def phase2(c):
    # --- acme ---------------------------------------------------------------
    # 1. 4 new blocks.
    c.call("Insert", tenant="acme", tokens=toks(0, 64), block_ids=[1001, 1002, 1003, 1004])
    # 2. 72 tokens: the 4 blocks match (64), the last 8 tokens are no block.
    r = c.call("Match", tenant="acme", tokens=toks(0, 72))
    assert r.matched_tokens == 64, r
    # 3. 32 tokens pinned by a short lease, which will expire.
    r = c.call("Match", tenant="acme", tokens=toks(0, 32), pin=True, lease_ttl_ms=SHORT_LEASE_MS)
    assert r.matched_tokens == 32 and r.lease_id != 0, r
    # 4. 6 blocks: 1001, 1002 confirmed; 2003, 2004 redundant (1003, 1004
    #    are cached there); 1005, 1006 new. acme holds 6 blocks.
    r = c.call("Insert", tenant="acme", tokens=toks(0, 96),
               block_ids=[1001, 1002, 2003, 2004, 1005, 1006])
    assert r.cached_tokens == 64 and list(r.redundant_block_ids) == [2003, 2004], r
    # 5. 4 new blocks would make 10 > limit 8: acme's own two LRU tails go
    #    (1006, 1005), reason "limit".
    r = c.call("Insert", tenant="acme", tokens=toks(1000, 64), block_ids=[1011, 1012, 1013, 1014])
    assert sorted(r.evicted_block_ids) == [1005, 1006], r
    # 6. Evict 1: the LRU tail is 1004 (stamped by step 4), reason "requested".
    r = c.call("Evict", tenant="acme", blocks=1)
    assert list(r.evicted_block_ids) == [1004], r
    # 7. Invalidate 1011: it and everything below, 4 blocks, "invalidated".
    r = c.call("Invalidate", tenant="acme", block_ids=[1011])
    assert sorted(r.removed_block_ids) == [1011, 1012, 1013, 1014], r
    # 8. Errors: an unknown lease (NOT_FOUND), a malformed Insert
    #    (INVALID_ARGUMENT: 16 tokens need 1 block ID, not 2).
    c.call("Release", tenant="acme", lease_id=12345, expect="NOT_FOUND")
    c.call("Insert", tenant="acme", tokens=toks(0, 16), block_ids=[7, 8],
           expect="INVALID_ARGUMENT")
    # 9. A long lease on the 3 blocks left (48 tokens), renewed once.
    r = c.call("Match", tenant="acme", tokens=toks(0, 48), pin=True, lease_ttl_ms=600000)
    assert r.matched_tokens == 48 and r.lease_id != 0, r
    c.call("KeepAlive", tenant="acme", lease_ids=[r.lease_id])

    # --- beta ---------------------------------------------------------------
    # 10. 16 new blocks: 3 (acme) + 16 = 19 of 20.
    c.call("Insert", tenant="beta", tokens=toks(5000, 256), block_ids=list(range(3001, 3017)))
    # 11. 4 more make 23 > 20: 3 go by budget, all beta's (acme holds 3 < its
    #     reservation of 4): the LRU tails 3016, 3015, 3014.
    r = c.call("Insert", tenant="beta", tokens=toks(7000, 64), block_ids=[3101, 3102, 3103, 3104])
    assert sorted(r.evicted_block_ids) == [3014, 3015, 3016], r
    # 12. 128 tokens: 8 blocks hit.
    r = c.call("Match", tenant="beta", tokens=toks(5000, 128))
    assert r.matched_tokens == 128, r
    # 13. Reset beta: its 17 blocks, reason "reset".
    r = c.call("Reset", tenant="beta")
    assert len(r.removed_block_ids) == 17, r


def expected_counters():
    """{(metric, (("label", "value"), ...)): value} after phase1 + phase2
    and the expiry of the short lease."""
    per_tenant = {
        "acme": dict(match_requests=4, match_tokens=32 + 72 + 32 + 48,
                     match_hit_tokens=0 + 64 + 32 + 48, insert_requests=3,
                     inserted_blocks=4 + 2 + 4, redundant_blocks=2, lease_expired=1,
                     evicted=dict(budget=0, limit=2, requested=1, invalidated=4, reset=0)),
        "beta": dict(match_requests=2, match_tokens=16 + 128, match_hit_tokens=128,
                     insert_requests=2, inserted_blocks=16 + 4, redundant_blocks=0,
                     lease_expired=0,
                     evicted=dict(budget=3, limit=0, requested=0, invalidated=0, reset=17)),
    }
    out = {}
    for tenant, e in per_tenant.items():
        t = (("tenant", tenant),)
        for name in ("match_requests", "match_tokens", "match_hit_tokens", "insert_requests",
                     "inserted_blocks", "redundant_blocks", "lease_expired"):
            out[("prefixd_%s_total" % name, t)] = e[name]
        for reason in REASONS:
            labels = (("reason", reason), ("tenant", tenant))
            out[("prefixd_evicted_blocks_total", labels)] = e["evicted"][reason]
            out[("prefixd_evicted_bytes_total", labels)] = e["evicted"][reason] * BLOCK_BYTES
    return out


def expected_gauges(version):
    """Gauges at the end: acme keeps 1001-1003 under the long lease."""
    out = {("prefixd_budget_bytes", ()): BUDGET_BYTES,
           ("prefixd_block_bytes", ()): BLOCK_BYTES,
           ("prefixd_build_info", (("version", version),)): 1}
    for tenant, cached, pinned, leases, reserved, limit in (
            ("acme", 3, 3, 1, 8 * MIB, 16 * MIB), ("beta", 0, 0, 0, 0, BUDGET_BYTES)):
        t = (("tenant", tenant),)
        out[("prefixd_cached_blocks", t)] = cached
        out[("prefixd_cached_bytes", t)] = cached * BLOCK_BYTES
        out[("prefixd_pinned_blocks", t)] = pinned
        out[("prefixd_active_leases", t)] = leases
        out[("prefixd_tenant_reserved_bytes", t)] = reserved
        out[("prefixd_tenant_limit_bytes", t)] = limit
    out[("prefixd_tree_nodes", (("tenant", "beta"),))] = 0
    return out


def wait_for_lease_expiry(c, wait_for):
    """Polls Stats (counted by c) until acme's short lease has expired."""
    def expired():
        r = c.call("Stats", tenant="acme")
        return any(t.tenant == "acme" and t.lease_expired == 1 for t in r.tenants)
    wait_for("the short lease of acme expires", expired, timeout_s=30, interval_s=0.1)
