#!/usr/bin/python3
"""events_publish end to end (docs/index.md, "The sidecar publishes too"):
three real sidecar-mode prefixd daemons publish their own cache changes as
vLLM KV events over ZeroMQ, one real prefixd index follows all three
(--index_source per sidecar), and the index must answer Route exactly as
each sidecar's own Match answers.

Each sidecar is driven by the engine simulator (prefixd.engine_sim: Match,
allocate, Evict, Insert, KeepAlive, Release, as an engine would) over a
slice of a Mooncake trace (tests/data/mooncake), with a pool and a budget
small enough that the cache evicts all the time:

  sidecar0  tenant default, namespace ""            (no salt, no LoRA)
  sidecar1  tenants acme and globex, namespace ""    ONE engine pool for
            both: a block ID one tenant's blocks gave back (evicted by the
            other's Insert under the global budget) is stored by the other,
            so the order of removals and stores across tenants matters
  sidecar2  tenants default and acme, namespace "lora-a" (one pool), an
            event ring of 4 events per tenant (events_per_tenant): rings
            overflow while the simulators run, and the sidecar publishes
            AllBlocksCleared and its whole cache again

Checks, after each quiescence (every sidecar's published batches, read
from prefixd_events_published_batches_total, applied by the index):
  - for ~150 prompts (fed ones, extended ones, diverging ones, unknown
    ones) x every (tenant, namespace) of any sidecar x every sidecar:
    Route(tokens, lora_name=namespace, cache_salt=tenant, or none for
    "default") gives that sidecar's worker exactly Match(tokens, namespace)
    as that tenant, in blocks;
  - Reset of tenant acme on sidecar1: its blocks leave the index as
    BlockRemoved (the worker is not cleared), globex's stay; exact again;
  - an InsertBatch of 40 new prompts on sidecar2 (more events than its
    ring holds, in one lock hold): an overflow resync is counted, exact.

Usage: test_sidecar_publish.py --prefixd PATH [--stubs DIR] [--requests N]
Prints one line per check and "N passed, M failed"; exit 1 on a failure,
77 (skipped) without --prefixd.
"""

import atexit
import collections
import os
import random
import re
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = common.setup(__doc__, extra=lambda ap: ap.add_argument(
    "--requests", type=int, default=150, help="trace requests per engine simulator"))

if not ARGS.prefixd:
    print("--prefixd not given: skipped")
    sys.exit(77)

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402
from prefixd import engine_sim  # noqa: E402

BS = 16
BLOCK_MIB = 2          # llama-3-8b fp16: 2 MiB per 16-token block
POOL_BLOCKS = 192      # each sidecar's engine pool
BUDGET_BLOCKS = 160    # each sidecar's budget: smaller than the pool
QUIESCE_TIMEOUT = 20
CHUNK = 50
TRACES = {name: os.path.join(common.REPO, "tests", "data", "mooncake", name + "_trace.jsonl")
          for name in ("conversation", "synthetic")}

# name -> (extra config, [(tenant, namespace, trace, first request)])
SIDECARS = collections.OrderedDict([
    ("sidecar0", ("", [("default", "", "synthetic", 0)])),
    ("sidecar1", ("", [("acme", "", "conversation", 0),
                       ("globex", "", "synthetic", 300)])),
    ("sidecar2", ("events_per_tenant: 4\n", [("default", "lora-a", "conversation", 500),
                                              ("acme", "lora-a", "synthetic", 600)])),
])
COMBOS = sorted({(t, ns) for _, sims in SIDECARS.values() for t, ns, _, _ in sims})


def salt_of(tenant):
    return None if tenant == "default" else tenant


def config(name, extra):
    return ('kv_budget: "%dMiB"\nmodel { preset: "llama-3-8b" }\nblock_size: %d\n%s'
            'events_publish { endpoint: "tcp://127.0.0.1:*" replay_endpoint: "tcp://127.0.0.1:*"'
            ' topic: "kv@%s@llama-3-8b" buffer_batches: 10000 }\n'
            % (BUDGET_BLOCKS * BLOCK_MIB, BS, extra, name))


def scrape(daemon, family):
    """{label text: value} of one family on the daemon's /metrics."""
    with urllib.request.urlopen("http://%s/metrics" % daemon.metrics, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^%s(\{[^}]*\})? (\S+)$" % re.escape(family), line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


class Sidecar:
    def __init__(self, name, extra, sims):
        self.name = name
        self.daemon = prefixd_fixture.Daemon(ARGS.prefixd, config(name, extra), snapshot=False)
        self.sim_specs = sims
        self.clients = {}
        self.sims = []
        self.pub = self.replay = None

    def start(self):
        self.daemon.start()
        atexit.register(self.daemon.close)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            logs = self.daemon.logs()
            pub = re.search(r"events pub\s+(\S+)", logs)
            rep = re.search(r"events replay\s+(\S+)", logs)
            if pub and rep:
                self.pub, self.replay = pub.group(1), rep.group(1)
                return
            time.sleep(0.02)
        raise prefixd_fixture.DaemonFailed("no events_publish endpoints in the banner:\n"
                                           + self.daemon.logs())

    def client(self, tenant):
        if tenant not in self.clients:
            self.clients[tenant] = prefixd.Client(
                self.daemon.unix, tenant=None if tenant == "default" else tenant,
                channel_options=prefixd_fixture.FAST_RECONNECT, deadline=10)
        return self.clients[tenant]

    def published(self):
        return int(scrape(self.daemon, "prefixd_events_published_batches_total").get("", 0))

    def resyncs(self, reason):
        return int(scrape(self.daemon, "prefixd_events_resyncs_total")
                   .get('{reason="%s"}' % reason, 0))


class Test(common.Checker):
    def __init__(self):
        super().__init__()
        self.sidecars = [Sidecar(n, extra, sims) for n, (extra, sims) in SIDECARS.items()]
        self.index = None
        self.fed = []       # per simulator, the prompts fed (whole blocks)
        self.fresh = 10**6  # hash ids no trace uses

    # ---- start-up ----

    def start(self):
        for s in self.sidecars:
            s.start()
        self.check(True, "3 sidecars serve with events_publish (endpoints %s)"
                   % [s.pub for s in self.sidecars])
        flags = ["--index_block_size=%d" % BS]
        flags += ["--index_source=%s=%s,%s" % (s.name, s.pub, s.replay) for s in self.sidecars]
        self.index = prefixd_fixture.Daemon(ARGS.prefixd, "", args=flags, snapshot=False)
        self.index.start()
        atexit.register(self.index.close)
        self.ic = prefixd.Client(self.index.tcp, channel_options=prefixd_fixture.FAST_RECONNECT,
                                 deadline=10)
        ws = self.quiesce()
        return self.check(ws is not None and sorted(ws) == [s.name for s in self.sidecars],
                          "the index follows sidecar0..2 (LIVE, caught up)",
                          getattr(self, "last_wait", ""))

    # ---- driving ----

    def drive(self):
        """Every engine simulator over its trace slice, one step of each in
        turn. The simulators of one sidecar share one pool: one engine
        serving several tenants (block IDs are unique per daemon)."""
        t0 = time.monotonic()
        runs = []
        for s in self.sidecars:
            pool = None
            for tenant, ns, trace, first in s.sim_specs:
                sim = engine_sim.EngineSim(s.client(tenant), POOL_BLOCKS, namespace=ns,
                                           engine_id="%s-%s" % (s.name, tenant))
                if pool is None:
                    pool = sim.pool
                else:
                    sim.pool = pool  # one engine, several tenants
                reqs = list(engine_sim.read_trace(TRACES[trace], first + ARGS.requests))[first:]
                fed = []
                for r in reqs:
                    whole = r.input_length // engine_sim.TRACE_BLOCK_TOKENS
                    if whole:
                        fed.append(sim.tokens(r.hash_ids[:whole]))
                self.fed.append(fed)
                runs.append((sim, collections.deque(reqs)))
        while any(p or sim.running for sim, p in runs):
            for sim, pending in runs:
                if pending or sim.running:
                    self.step(sim, pending)
        for sim, _ in runs:
            sim.finish_all()
        reports = [sim.final_report() for sim, _ in runs]
        print("      %d simulators, %.1f s: requests %s, inserted %s, evicted %s"
              % (len(runs), time.monotonic() - t0, [r.requests for r in reports],
                 [r.inserted_blocks for r in reports],
                 [r.evicted_by_insert + r.evicted_by_request for r in reports]))
        self.check(all(r.requests > 0 and r.inserted_blocks > 0 for r in reports)
                   and sum(r.evicted_by_insert + r.evicted_by_request for r in reports) > 0,
                   "the simulators inserted and evicted blocks on every sidecar")

    @staticmethod
    def step(sim, pending):
        """One iteration of EngineSim.run: admit, insert, step."""
        admitted = []
        while pending and len(admitted) < sim.batch and len(sim.running) < sim.max_running:
            run = sim.admit(pending[0])
            if run is not None:
                pending.popleft()
                admitted.append(run)
            elif sim.running:
                break
            else:
                pending.popleft()
                sim.report.rejected += 1
        for run in admitted:
            if run.insert_ids:
                sim.insert(run, run.prompt, run.insert_ids)
        sim.step()

    # ---- the index ----

    def quiesce(self):
        """Waits until every sidecar's batches are all applied (and nothing
        new was published meanwhile); returns the index's workers."""
        deadline = time.monotonic() + QUIESCE_TIMEOUT
        before = None
        while True:
            pubs = [s.published() for s in self.sidecars]
            ws = {w.worker: w for w in self.ic.list_workers().workers}
            done = all(s.name in ws and ws[s.name].last_seq == n - 1
                       and ws[s.name].state == prefixd.WorkerState.LIVE
                       for s, n in zip(self.sidecars, pubs))
            if done and pubs == before:
                return ws
            before = pubs
            if time.monotonic() > deadline:
                self.last_wait = "; ".join(
                    "%s published %d, index %s" % (s.name, n, ws.get(s.name))
                    for s, n in zip(self.sidecars, pubs))
                return None
            time.sleep(0.05)

    def fresh_tokens(self, n_blocks):
        ids = list(range(self.fresh, self.fresh + n_blocks))
        self.fresh += n_blocks
        return [h * BS + j for h in ids for j in range(BS)]

    def samples(self, extra=()):
        """~130 prompts: each simulator's last prompts (the likeliest to be
        cached) and older ones, some extended by new blocks and a partial
        one, some diverging halfway, and prompts no one fed."""
        rng = random.Random(sum(len(f) for f in self.fed))
        out = []
        for fed in self.fed:
            out += fed[-12:] + rng.sample(fed[:-12], 4)
        every = [t for fed in self.fed for t in fed]
        out += [t + self.fresh_tokens(2) + [1, 2, 3] for t in rng.sample(every, 20)]
        for t in rng.sample(every, 20):
            k = len(t) // BS // 2
            out.append(t[:k * BS] + self.fresh_tokens(1) + t[(k + 1) * BS:])
        out += [self.fresh_tokens(3) for _ in range(10)]
        return out + list(extra)

    def compare(self, samples):
        """Mismatches (sidecar, tenant, ns, sample, route, match) and how
        many (sidecar, combo, sample) had a match > 0."""
        bad, nonzero = [], 0
        names = [s.name for s in self.sidecars]
        for tenant, ns in COMBOS:
            routed = []
            for i in range(0, len(samples), CHUNK):
                items = self.ic.route_batch(samples[i:i + CHUNK], lora_name=ns or None,
                                            cache_salt=salt_of(tenant), workers=names)
                for item in items:
                    if isinstance(item, Exception):
                        raise item
                    routed.append({w.worker: w.matched_blocks for w in item.workers})
            for s in self.sidecars:
                c = s.client(tenant)
                for i in range(0, len(samples), CHUNK):
                    for k, m in enumerate(c.match_batch(samples[i:i + CHUNK], namespace=ns)):
                        if isinstance(m, Exception):
                            raise m
                        want = m.matched_tokens // BS
                        got = routed[i + k].get(s.name, 0)
                        nonzero += want > 0
                        if got != want:
                            bad.append((s.name, tenant, ns, i + k, got, want))
        return bad, nonzero

    def check_exact(self, what, extra=(), min_nonzero=1):
        ws = self.quiesce()
        if not self.check(ws is not None, "quiescence before: " + what,
                          getattr(self, "last_wait", "")):
            return None
        samples = self.samples(extra)
        bad, nonzero = self.compare(samples)
        self.check(not bad and nonzero >= min_nonzero,
                   "%s: Route == Match for %d prompts x %d (tenant, namespace) x %d sidecars "
                   "(%d matches > 0)" % (what, len(samples), len(COMBOS), len(self.sidecars),
                                         nonzero),
                   "%d mismatches (sidecar, tenant, ns, sample, route, match): %s"
                   % (len(bad), bad[:8]))
        return ws

    # ---- the run ----

    def run(self):
        if not self.start():
            return
        self.drive()
        ws = self.check_exact("after the traces", min_nonzero=80)
        if ws is None:
            return
        self.check(all(ws[s.name].gaps == 0 for s in self.sidecars),
                   "no gaps in any sidecar's stream", [(w.worker, w.gaps) for w in ws.values()])
        over = self.sidecars[2].resyncs("overflow")
        print("      sidecar2: %d overflow resyncs while the simulators ran" % over)

        s1 = self.sidecars[1]
        before = ws[s1.name].clears
        removed = s1.client("acme").reset()
        ws = self.check_exact("after Reset of acme on sidecar1 (%d blocks)" % len(removed))
        if ws is not None:
            self.check(ws[s1.name].clears == before,
                       "the Reset reached the index as BlockRemoved, not a clear",
                       "clears %d -> %d" % (before, ws[s1.name].clears))

        s2 = self.sidecars[2]
        over = s2.resyncs("overflow")
        items, ids = [], 10**7
        for _ in range(40):
            items.append((self.fresh_tokens(2), [ids, ids + 1]))
            ids += 2
        results = s2.client("acme").insert_batch(items, namespace="lora-a")
        self.check(all(not isinstance(r, Exception) for r in results),
                   "InsertBatch of 40 prompts on sidecar2", results[:2])
        ws = self.check_exact("after an event ring overflow on sidecar2",
                              extra=[t for t, _ in items])
        self.check(s2.resyncs("overflow") > over,
                   "sidecar2 counted an overflow resync (AllBlocksCleared, then its cache)",
                   "resyncs %d -> %d" % (over, s2.resyncs("overflow")))


def main():
    t = Test()
    try:
        t.run()
    except (prefixd.PrefixdError, prefixd_fixture.DaemonFailed, OSError) as e:
        t.check(False, "the run completed", "%s: %s" % (type(e).__name__, e))
    finally:
        for s in t.sidecars:
            for c in s.clients.values():
                c.close()
            s.daemon.close()
        if t.index is not None:
            t.index.close()
    return t.exit_code()


if __name__ == "__main__":
    sys.exit(main())
