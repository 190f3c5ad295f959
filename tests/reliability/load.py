"""Load for the reliability tests: engine-like clients over real gRPC and the
ledger that checks block conservation from the clients' side.

Each Worker is one client thread acting for one tenant, in a loop until its
deadline: Match (often pinned), Insert the prompt with fresh block IDs (often
pinned), release or renew the leases it holds, and now and then Evict,
Invalidate one of its blocks, Reset its tenant, read Stats or Dump. Prompts
share prefixes (a few "system prompts" and "questions" per tenant), so
inserts find cached blocks (their IDs come back redundant), trees split, and
the budget fills and evicts.

Block IDs are never reused: every ID a successful Insert carried is "handed
in" exactly once. The Ledger counts, per ID, how many times a response handed
it back (redundant, evicted, invalidated, reset); after the load,
Ledger.check(cached) requires every handed ID to be either cached (in a
Dump) or returned, exactly once in all, and nothing else to be either.
"""

import collections
import random
import threading
import time

import grpc

from prefixd.v1 import prefix_cache_pb2 as pb
from prefixd.v1 import prefix_cache_pb2_grpc as pb_grpc

TENANT_HEADER = "x-prefixd-tenant"
CALL_TIMEOUT_S = 30  # generous: a call that times out would leave the ledger unsure

# Codes each call may return under load, besides OK. Anything else fails
# the test (INVALID_ARGUMENT would mean the client sent something wrong or
# the daemon lost track of an ID; DEADLINE_EXCEEDED an unbounded call).
EXPECTED = {
    "Match": {grpc.StatusCode.RESOURCE_EXHAUSTED},   # lease limit
    "Insert": {grpc.StatusCode.RESOURCE_EXHAUSTED},  # budget full of pins
    "Release": {grpc.StatusCode.NOT_FOUND},          # expired, invalidated, reset
    "KeepAlive": {grpc.StatusCode.NOT_FOUND},
    "Evict": set(),
    "Invalidate": {grpc.StatusCode.NOT_FOUND},       # evicted meanwhile
    "Reset": set(),
    "Stats": set(),
    "Dump": set(),
}


SHUTDOWN_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}


class Ledger:
    """Thread-safe: every Worker records into the same one."""

    def __init__(self):
        self._mu = threading.Lock()
        self.handed = set()
        self.returned = collections.Counter()
        self.calls = collections.Counter()   # (method, code name) -> count
        self.unexpected = []                  # (method, code, details)

    def hand_in(self, ids):
        with self._mu:
            dup = self.handed.intersection(ids)
            assert not dup, "the load generator reused IDs %s" % sorted(dup)[:5]
            self.handed.update(ids)

    def hand_back(self, ids):
        with self._mu:
            self.returned.update(ids)

    def record(self, method, code, details=""):
        with self._mu:
            self.calls[(method, code.name)] += 1
            if code != grpc.StatusCode.OK and code not in EXPECTED.get(method, set()):
                self.unexpected.append((method, code.name, details))

    def ok_calls(self):
        return sum(n for (m, c), n in self.calls.items() if c == "OK")

    def check(self, cached):
        """Problems (strings) with `cached`, the list of IDs every Dump shows."""
        problems = []
        counts = collections.Counter(cached)
        twice = [i for i, n in counts.items() if n > 1]
        if twice:
            problems.append("cached twice: %s" % sorted(twice)[:10])
        never = set(counts) - self.handed
        if never:
            problems.append("cached but never handed in: %s" % sorted(never)[:10])
        stray = set(self.returned) - self.handed
        if stray:
            problems.append("returned but never handed in: %s" % sorted(stray)[:10])
        bad = [i for i in self.handed if self.returned[i] + counts[i] != 1]
        if bad:
            sample = sorted(bad)[:10]
            problems.append("%d IDs not cached-or-returned exactly once, e.g. %s" % (
                len(bad), ["%d: returned %d, cached %d" % (i, self.returned[i], counts[i])
                           for i in sample]))
        return problems

    def summary(self):
        by_code = collections.Counter()
        for (_, code), n in self.calls.items():
            by_code[code] += n
        return "%d calls (%s), %d IDs handed in, %d handed back" % (
            sum(by_code.values()), ", ".join("%s %d" % kv for kv in sorted(by_code.items())),
            len(self.handed), sum(self.returned.values()))


def metadata(tenant):
    return ((TENANT_HEADER, tenant),)


def channel(target):
    return grpc.insecure_channel(target, options=[("grpc.enable_retries", 0)])


def dump_all(stub, tenants):
    """Every block ID cached by `tenants`, from Dump of every namespace."""
    ids = []
    for t in tenants:
        names = stub.Dump(pb.DumpRequest(), metadata=metadata(t), timeout=CALL_TIMEOUT_S)
        for ns in names.namespaces:
            d = stub.Dump(pb.DumpRequest(namespace=ns), metadata=metadata(t),
                          timeout=CALL_TIMEOUT_S)
            for n in d.nodes:
                ids.extend(n.block_ids)
    return ids


def state(stub, tenants):
    """Stats of every tenant and every Dump, as bytes: equal state, equal bytes."""
    out = [stub.Stats(pb.StatsRequest(all_tenants=True), metadata=metadata(tenants[0]),
                      timeout=CALL_TIMEOUT_S).SerializeToString(deterministic=True)]
    for t in tenants:
        names = stub.Dump(pb.DumpRequest(), metadata=metadata(t), timeout=CALL_TIMEOUT_S)
        for ns in names.namespaces:
            out.append(stub.Dump(pb.DumpRequest(namespace=ns), metadata=metadata(t),
                                 timeout=CALL_TIMEOUT_S).SerializeToString(deterministic=True))
    return b"".join(out)


class Stopped(Exception):
    """The daemon refused a call with UNAVAILABLE (it is draining or gone)."""


class Worker(threading.Thread):
    """One engine-like client thread. IDs are worker_index << 40 | n."""

    def __init__(self, index, target, tenant, ledger, block, deadline, seed,
                 namespaces=("", "lora-1"), lease_ttl_ms=0, max_leases=3,
                 release_leases=True, stop_on_unavailable=False, rare_ops=True):
        super().__init__(name="load-%d-%s" % (index, tenant), daemon=True)
        self.index = index
        self.tenant = tenant
        self.ledger = ledger
        self.block = block
        self.deadline = deadline
        self.rng = random.Random(seed)
        self.namespaces = namespaces
        self.lease_ttl_ms = lease_ttl_ms
        self.max_leases = max_leases
        self.release_leases = release_leases
        self.stop_on_unavailable = stop_on_unavailable
        self.rare_ops = rare_ops
        self.channel = channel(target)
        self.stub = pb_grpc.PrefixCacheStub(self.channel)
        self.next_id = (index + 1) << 40
        self.leases = []
        self.mine = collections.deque(maxlen=64)  # recently adopted IDs
        self.error = None
        self.stopped_by_daemon = False
        self.iterations = 0
        # Shared prefixes: the same per tenant for every worker of it.
        prng = random.Random(tenant)
        self.systems = [self.blocks(prng, prng.randint(1, 6)) for _ in range(6)]
        self.questions = [self.blocks(prng, prng.randint(1, 3)) for _ in range(24)]

    def blocks(self, rng, n):
        return [rng.randrange(1 << 20) for _ in range(n * self.block)]

    # ---- calls ----

    def call(self, method, request):
        try:
            resp = getattr(self.stub, method)(request, metadata=metadata(self.tenant),
                                              timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as e:
            # A draining daemon refuses new calls with UNAVAILABLE, and gRPC
            # ends calls that arrived but never reached a handler with
            # CANCELLED (grpc/grpc#41785). Neither ran: the ledger checks it.
            if e.code() in SHUTDOWN_CODES and self.stop_on_unavailable:
                self.ledger.record(method, e.code())
                raise Stopped()
            self.ledger.record(method, e.code(), e.details())
            return None
        self.ledger.record(method, grpc.StatusCode.OK)
        return resp

    def prompt(self):
        p = list(self.rng.choice(self.systems)) + list(self.rng.choice(self.questions))
        p += self.blocks(self.rng, self.rng.choice([0, 0, 1, 2]))
        return p

    def step(self):
        if not self.release_leases and len(self.leases) >= self.max_leases:
            self.leases.pop(0)  # forgotten, like a crashed request's: it expires
        ns = self.rng.choice(self.namespaces)
        tokens = self.prompt()
        pin = self.rng.random() < 0.6 and len(self.leases) < self.max_leases
        m = self.call("Match", pb.MatchRequest(namespace=ns, tokens=tokens, pin=pin,
                                               lease_ttl_ms=self.lease_ttl_ms))
        if m is not None and m.lease_id:
            self.leases.append(m.lease_id)
        n = len(tokens) // self.block
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        pin = self.rng.random() < 0.4 and len(self.leases) < self.max_leases
        r = self.call("Insert", pb.InsertRequest(namespace=ns, tokens=tokens[:n * self.block],
                                                 block_ids=ids, pin=pin,
                                                 lease_ttl_ms=self.lease_ttl_ms))
        if r is not None:
            self.ledger.hand_in(ids)
            self.ledger.hand_back(r.redundant_block_ids)
            self.ledger.hand_back(r.evicted_block_ids)
            redundant = set(r.redundant_block_ids)
            self.mine.extend(i for i in ids if i not in redundant)
            if r.lease_id:
                self.leases.append(r.lease_id)
        if self.leases and self.release_leases and self.rng.random() < 0.5:
            lease = self.leases.pop(self.rng.randrange(len(self.leases)))
            self.call("Release", pb.ReleaseRequest(lease_id=lease))
        if self.leases and self.rng.random() < 0.1:
            self.call("KeepAlive", pb.KeepAliveRequest(lease_ids=self.leases))
        if self.rare_ops:
            self.rare()

    def rare(self):
        x = self.rng.random()
        if x < 0.04:
            r = self.call("Evict", pb.EvictRequest(blocks=self.rng.randint(1, 8)))
            if r is not None:
                self.ledger.hand_back(r.evicted_block_ids)
        elif x < 0.06 and self.mine:
            victim = self.mine[self.rng.randrange(len(self.mine))]
            r = self.call("Invalidate", pb.InvalidateRequest(block_ids=[victim]))
            if r is not None:
                self.ledger.hand_back(r.removed_block_ids)
        elif x < 0.063:
            r = self.call("Reset", pb.ResetRequest())
            if r is not None:
                self.ledger.hand_back(r.removed_block_ids)
                self.leases.clear()
        elif x < 0.08:
            self.call("Stats", pb.StatsRequest())
        elif x < 0.085:
            self.call("Dump", pb.DumpRequest(namespace=self.rng.choice(self.namespaces)))

    def run(self):
        try:
            while time.monotonic() < self.deadline:
                self.step()
                self.iterations += 1
            if self.release_leases:
                for lease in self.leases:
                    self.call("Release", pb.ReleaseRequest(lease_id=lease))
                self.leases.clear()
        except Stopped:
            self.stopped_by_daemon = True
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.channel.close()


def run_load(target, tenants, threads, seconds, ledger, block, seed=1, **kw):
    """`threads` Workers spread over `tenants` for `seconds`; returns them
    after they all finished."""
    deadline = time.monotonic() + seconds
    workers = [Worker(i, target, tenants[i % len(tenants)], ledger, block, deadline,
                      seed * 1000 + i, **kw) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(seconds + 120)
    return workers
