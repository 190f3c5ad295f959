"""The routing policies of the simulated fleet (fleet_sim.py): load-only
ones, three peer routers' published rules, prefixd's documented rule, the
oracle, and pickpy, a Python model of the daemon's Pick cost model.

What a policy sees, per request, is what its real counterpart could see:

  Req    i (the router's request id), ids (the prompt's Mooncake hash ids:
         one block each; an id names its whole prefix, so an id stands for
         the block's hash), now_ms (the arrival, simulated milliseconds);
  View   per engine, in fleet_sim's order of names:
           inflight  requests sent and not finished (any router in the
                     request path counts these itself);
           waiting   vllm:num_requests_waiting, scraped from the engine;
           kv_usage  vllm:kv_cache_usage_perc (0..1), scraped;
           truth     the engine's cached prefix of this prompt, read from
                     the engine (the oracle's input; fleet_sim's figures);
           route     for the policies that read KV events: (matched blocks,
                     worker state) per engine from a Route over the real
                     daemon, or None. One event-fed index stands in for
                     each peer's own: they consume the same events.

choose(req, view) returns an engine's index; routed(req, k, view) is told
the choice; event(rid, kind, k, now_ms) is told when a request it routed
produced its first token or finished (a router in the request path sees
both). Random tie breaks draw from a random.Random seeded by the run's seed.
"""

import collections
import hashlib
import random
import zlib

LIVE = 2  # prefix_index.proto's WorkerState.LIVE
FIRST_TOKEN, FINISHED = 1, 2  # event() kinds
BLOCK_TOKENS = 16  # fleet_sim's block size


class Policy:
    uses_index = False  # needs view.route (a Route per request)

    def __init__(self, names, seed, args):
        self.names = names
        self.n = len(names)
        self.rng = random.Random("%s/%s" % (seed, type(self).__name__))
        self.args = args

    def choose(self, req, view):
        raise NotImplementedError

    def routed(self, req, k, view):
        pass

    def event(self, rid, kind, k, now_ms):
        pass

    def random_min(self, costs):
        """The index of the lowest cost; ties: at random."""
        best = min(costs)
        tied = [j for j, c in enumerate(costs) if c == best]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)


def prefix_in(ids, held, start=0):
    """How many leading blocks of `ids` are in `held` (a set or dict),
    counting on from `start` blocks known to be held."""
    n = start
    while n < len(ids) and ids[n] in held:
        n += 1
    return n


# ---- load only ----

class RoundRobin(Policy):
    """Round robin."""

    def __init__(self, *a):
        super().__init__(*a)
        self.next = 0

    def choose(self, req, view):
        k = self.next % self.n
        self.next += 1
        return k


class LeastLoaded(Policy):
    """Fewest requests in flight; ties: name."""

    def choose(self, req, view):
        return min(range(self.n), key=lambda j: (view.inflight[j], self.names[j]))


class Session(Policy):
    """Session affinity: crc32 of the first block's id, mod N. Every
    request of the conversation trace starts with block 0, so there it
    sends everything to one engine."""

    def choose(self, req, view):
        return zlib.crc32(str(req.ids[0]).encode()) % self.n


# ---- prefixd's documented rule (docs/index.md, "Calling Route from a router") ----

def bounded_most_matched(inflight, matched, names, slack):
    """Among the engines whose requests in flight are within `slack` of the
    least loaded's, the most matched blocks; ties: least loaded, then name."""
    bound = min(inflight) + slack
    return min((k for k in range(len(inflight)) if inflight[k] <= bound),
               key=lambda k: (-matched[k], inflight[k], names[k]))


class TodaysRule(Policy):
    """Route, then docs/index.md's rule with a bound of --load_slack (2)
    requests; a worker that is not LIVE counts as 0 matched blocks (a failed
    Route counts every worker as 0: least loaded)."""
    uses_index = True

    def choose(self, req, view):
        matched = [m if state == LIVE else 0 for m, state in view.route]
        return bounded_most_matched(view.inflight, matched, self.names, self.args.load_slack)


class Oracle(Policy):
    """Today's rule on every engine's cache read directly (exact state)."""

    def choose(self, req, view):
        return bounded_most_matched(view.inflight, view.truth, self.names, self.args.load_slack)


class PerturbedOracle(Oracle):
    """The oracle with K picks (chosen by the seed among the run's
    requests) sent to the rule's runner-up instead: the noise floor."""

    def __init__(self, names, seed, args, k, n_requests):
        super().__init__(names, seed, args)
        self.perturb = set(random.Random(seed).sample(range(n_requests),
                                                      min(n_requests, k)))

    def choose(self, req, view):
        k = super().choose(req, view)
        if req.i in self.perturb and self.n > 1:
            truth = list(view.truth)
            truth[k] = -1
            k = bounded_most_matched(view.inflight, truth, self.names, self.args.load_slack)
        return k


# ---- blocks a router has just sent somewhere (Dynamo, llm-d, pickpy) ----

class Predicted:
    """Per worker, block id -> the moment (ms) its entry lapses. A new add
    of a block renews it. Lapsed entries are skipped when read, and purged
    every `purge_every` adds, which bounds the memory."""

    def __init__(self, n, ttl_ms, purge_every=4096):
        self.ttl_ms = ttl_ms
        self.held = [dict() for _ in range(n)]
        self.adds = 0
        self.purge_every = purge_every

    def add(self, k, ids, now_ms):
        until = now_ms + self.ttl_ms
        h = self.held[k]
        for b in ids:
            h[b] = until
        self.adds += 1
        if self.adds % self.purge_every == 0:
            for h in self.held:
                for b in [b for b, t in h.items() if t <= now_ms]:
                    del h[b]

    def prefix(self, k, ids, now_ms, start=0):
        """Leading blocks of `ids` worker k holds by prediction, counting on
        from `start` blocks known to be held."""
        h = self.held[k]
        n = start
        while n < len(ids) and h.get(ids[n], -1.0) > now_ms:
            n += 1
        return n


# ---- NVIDIA Dynamo's KV router ----

class Dynamo(Policy):
    """NVIDIA Dynamo's KV router (ai-dynamo/dynamo: the router docs,
    "Cost Calculation" in router-concepts.md and the flags in
    router-configuration.md; the scorer in lib/kv-router's
    scheduling/selector). Per worker, in blocks:

      prefill = active prefill blocks + the prompt's blocks
                - overlap_score_credit (1.0) x device overlap
                (host 0.75 and disk 0.25 credits: the fleet is GPU only),
                floored at 0;
      decode  = the worker's active blocks (distinct, since KV reuse is
                assumed by default) + the prompt's blocks beyond its longest
                prefix among them;
      cost    = prefill_load_scale (1.0) x prefill + decode
                (+ decode_active_request_weight x active requests: 0 by
                default).

    The lowest cost wins; equal costs: at random (router temperature 0).
    The router keeps the load itself: a routed request adds its uncached
    blocks (prompt - overlap at routing) to the worker's active prefill
    until its first token, and its prompt blocks to the active blocks until
    it finishes. Predicted entries (--router-predicted-ttl-secs, off unless
    set; here 5 s, the value its docs suggest for bursts of siblings): each
    routed prompt goes into a side index with that TTL, and a worker's
    overlap is the larger of the event-fed index's and the side index's.
    Not modelled: the router's own request queue (--router-queue-threshold,
    off by default) and overlap-credit decay (0 by default)."""
    uses_index = True
    OVERLAP_SCORE_CREDIT = 1.0
    PREFILL_LOAD_SCALE = 1.0
    PREDICTED_TTL_MS = 5000.0

    def __init__(self, *a):
        super().__init__(*a)
        self.side = Predicted(self.n, self.PREDICTED_TTL_MS)
        self.active = [collections.Counter() for _ in range(self.n)]  # block -> requests
        self.prefill = [0] * self.n      # active prefill blocks per worker
        self.requests = {}               # rid -> [worker, ids, prefill blocks still charged]

    def choose(self, req, view):
        p = len(req.ids)
        self.overlaps = [max(m, self.side.prefix(k, req.ids, req.now_ms))
                         for k, (m, _) in enumerate(view.route)]
        costs = []
        for k, overlap in enumerate(self.overlaps):
            prefill = max(self.prefill[k] + p - self.OVERLAP_SCORE_CREDIT * overlap, 0.0)
            active = self.active[k]
            decode = len(active) + p - prefix_in(req.ids, active)
            costs.append(self.PREFILL_LOAD_SCALE * prefill + decode)
        return self.random_min(costs)

    def routed(self, req, k, view):
        charge = len(req.ids) - self.overlaps[k]
        self.prefill[k] += charge
        self.active[k].update(req.ids)
        self.requests[req.i] = [k, req.ids, charge]
        self.side.add(k, req.ids, req.now_ms)

    def event(self, rid, kind, k, now_ms):
        r = self.requests.get(rid)
        if r is None:
            return
        self.prefill[r[0]] -= r[2]  # the first token (or the end) ends its prefill load
        r[2] = 0
        if kind == FINISHED:
            active = self.active[r[0]]
            active.subtract(r[1])
            for b in set(r[1]):
                if active[b] <= 0:
                    del active[b]
            del self.requests[rid]


# ---- llm-d's inference scheduler ----

class LlmD(Policy):
    """llm-d's inference scheduler, configured as its precise prefix-cache
    guide does (llm-d/llm-d: guides/precise-prefix-cache-aware, the
    scheduler values; the scorers in llm-d/llm-d-inference-scheduler and
    kubernetes-sigs/gateway-api-inference-extension). A scheduling profile
    sums weighted scorers, each in [0, 1], and the max-score picker takes
    the highest sum (equal sums: at random):

      2.0 x precise-prefix-cache-scorer: each pod's run of the prompt's
            leading blocks in its KV-event index, min-max normalised over
            the pods with a run (all 1.0 when their runs are equal; 0 for a
            pod with none);
      1.0 x kv-cache-utilization-scorer: 1 - the pod's KV cache usage
            (vllm:kv_cache_usage_perc, scraped);
      1.0 x queue-scorer: (the largest waiting count - the pod's) /
            (largest - smallest) over the pods (vllm:num_requests_waiting,
            scraped; 1.0 for all when they are equal).

    (An older version of the guide weighted them 3, 2, 2.) Speculative
    indexing (speculativeIndexing, off by default; on here, to compare with
    llm-d at its best; speculativeTTL 2 s, its default): right after a
    decision the chosen pod gets entries for the prompt's blocks in the
    same index, lapsing after the TTL, so a pod's run counts confirmed and
    speculative blocks alike."""
    uses_index = True
    PREFIX_WEIGHT, KV_WEIGHT, QUEUE_WEIGHT = 2.0, 1.0, 1.0
    SPECULATIVE_TTL_MS = 2000.0

    def __init__(self, *a):
        super().__init__(*a)
        self.spec = Predicted(self.n, self.SPECULATIVE_TTL_MS)

    def choose(self, req, view):
        runs = [self.spec.prefix(k, req.ids, req.now_ms, start=m)
                for k, (m, _) in enumerate(view.route)]
        held = [r for r in runs if r > 0]
        lo, hi = (min(held), max(held)) if held else (0, 0)
        qlo, qhi = min(view.waiting), max(view.waiting)
        scores = []
        for k in range(self.n):
            prefix = 0.0 if runs[k] == 0 else (1.0 if hi == lo else (runs[k] - lo) / (hi - lo))
            queue = 1.0 if qhi == qlo else (qhi - view.waiting[k]) / (qhi - qlo)
            kv = 1.0 - view.kv_usage[k]
            scores.append(self.PREFIX_WEIGHT * prefix + self.KV_WEIGHT * kv
                          + self.QUEUE_WEIGHT * queue)
        return self.random_min([-s for s in scores])

    def routed(self, req, k, view):
        self.spec.add(k, req.ids, req.now_ms)


# ---- SGLang's router ----

class SGLang(Policy):
    """SGLang's router, cache_aware policy (sgl-project/sglang: sgl-router's
    policies/cache_aware.rs and tree.rs; the defaults of its launcher's
    router arguments: cache_threshold 0.3, balance_abs_threshold 64,
    balance_rel_threshold 1.5, eviction_interval_secs 120, max_tree_size
    2^26). It reads no KV events: it keeps an approximate radix tree of the
    prompts it sent, each node tagged with the workers it sent them to.

      load = the requests the router has in flight per worker;
      if max load - min load > 64 and max load > 1.5 x min load:
          the least loaded (the first of them), and the tree records the
          prompt under it;
      else: the longest prefix of the prompt in the tree; if it covers more
          than 0.3 of the prompt, a worker tagged on that prefix's deepest
          node (the tree hands out an arbitrary one: at random here), else
          the worker with the smallest share of the tree; the tree records
          the prompt under the chosen worker.

    The real tree is over characters; here a block stands for 512 tokens
    of about 4 characters, so the cap is 2^26 / 2048 = 32768 blocks per
    worker, enforced every 120 s by dropping the least recently used
    leaves."""
    CACHE_THRESHOLD = 0.3
    BALANCE_ABS, BALANCE_REL = 64, 1.5
    EVICTION_INTERVAL_MS = 120_000.0
    MAX_TREE_BLOCKS = (1 << 26) // (512 * 4)

    def __init__(self, *a):
        super().__init__(*a)
        self.tree = [dict() for _ in range(self.n)]  # block -> (last access ms, depth)
        self.next_eviction = self.EVICTION_INTERVAL_MS

    def choose(self, req, view):
        while req.now_ms >= self.next_eviction:
            self.evict()
            self.next_eviction += self.EVICTION_INTERVAL_MS
        hi, lo = max(view.inflight), min(view.inflight)
        if hi - lo > self.BALANCE_ABS and hi > lo * self.BALANCE_REL:
            return view.inflight.index(lo)
        depth, holders = 0, list(range(self.n))
        for b in req.ids:
            nxt = [k for k in holders if b in self.tree[k]]
            if not nxt:
                break
            depth, holders = depth + 1, nxt
        if depth:  # the tree answers one holder and refreshes its path
            k = self.rng.choice(holders)
            tree = self.tree[k]
            for b in req.ids[:depth]:
                tree[b] = (req.now_ms, tree[b][1])
            if depth / len(req.ids) > self.CACHE_THRESHOLD:
                return k
        return self.random_min([len(t) for t in self.tree])

    def routed(self, req, k, view):
        tree = self.tree[k]
        for d, b in enumerate(req.ids):
            tree[b] = (req.now_ms, d)

    def evict(self):
        for tree in self.tree:
            over = len(tree) - self.MAX_TREE_BLOCKS
            if over > 0:  # the oldest first; of equal age, the deepest (a leaf) first
                for b in sorted(tree, key=lambda b: (tree[b][0], -tree[b][1]))[:over]:
                    del tree[b]


# ---- pickpy: a model of the daemon's Pick ----

# pickpy's defaults, tuned on fleet_sim --compare (docs/performance.md, "Pick
# on the simulated fleet"): a token of prefill saved here is worth 20
# tokens of prefill queued ahead (queued_weight 0.05), because a hit also
# spares every later request the work, where queueing delays one; a full KV
# cache costs 64 tokens (ties between idle engines); each prefill token
# Pick sent an engine in the last 60 s costs 0.003 (churn: cold prompts go
# where the cache was filled least lately); no affinity term.
PICK_DEFAULTS = collections.OrderedDict((
    ("prefill_weight", 1.0),
    ("queued_weight", 0.05),
    ("request_tokens", 0.0),
    ("kv_tokens", 64.0),
    ("affinity_tokens", 0.0),
    ("affinity_blocks", 0.0),
    ("predicted_ttl_ms", 5000.0),
    ("load_window_ms", 2000.0),
    ("churn_weight", 0.003),
    ("churn_window_ms", 60000.0),
))

Load = collections.namedtuple("Load", "requests_in_flight queued_prefill_tokens kv_usage")
# matched: the blocks the index reports that Pick takes its word for (0 for
# a worker that is not LIVE)
Cost = collections.namedtuple("Cost", "worker prefill_tokens load churn affinity cost credit matched")


def pick_knobs(spec):
    """PICK_DEFAULTS overridden by "key=value,..." (fleet_sim's --pick)."""
    knobs = collections.OrderedDict(PICK_DEFAULTS)
    for kv in (spec or "").split(","):
        if not kv:
            continue
        key, _, value = kv.partition("=")
        if key not in knobs:
            raise SystemExit("--pick: no knob %r (knobs: %s)" % (key, ", ".join(knobs)))
        knobs[key] = float(value)
    return knobs


def rendezvous_winner(key, candidates):
    """The candidate with the highest hash of (key, candidate)."""
    def score(w):
        return hashlib.blake2b(repr((key, w)).encode(), digest_size=8).digest()
    return max(candidates, key=score)


class PickModel:
    """The daemon's Pick cost model, in Python, so that its defaults can be
    tuned on the simulated fleet before the C++ exists. For a prompt of
    P tokens (B = 16 per block) and each candidate worker w:

      c_w     the index's matched blocks of w, tier-weighted (every block
              here is on GPU: weight 1.0); 0 when w is not LIVE;
      p_w     predicted entries: the longest run of the prompt's leading
              blocks that earlier picks sent to w within predicted_ttl_ms
              (a later pick renews the entries of the blocks it sends);
      credit  max(c_w, p_w);
      prefill_tokens_w = max(P - credit x B, 0);
      load    the router's figures when it passes them (requests in flight
              r_w, queued prefill tokens q_w, KV usage u_w in [0, 1]);
              else the daemon's own window: r_w = picks sent to w in the
              last load_window_ms, q_w = the sum of their prefill_tokens,
              u_w = 0;
      load_term_w = queued_weight x q_w + request_tokens x r_w
                    + kv_tokens x u_w;
      churn_term_w = churn_weight x the prefill tokens of the picks sent
              to w in the last churn_window_ms (whether or not the router
              passes load);
      affinity_term_w = -affinity_tokens when w wins rendezvous hashing
              (the highest hash of (key, w)) among the candidates, key the
              prompt's first min(affinity_blocks, its blocks) blocks; else
              0 (affinity_blocks 0: off);
      cost_w = prefill_weight x prefill_tokens_w + load_term_w
               + churn_term_w + affinity_term_w.

    The lowest cost wins; ties: fewer r_w, then the rendezvous winner (on
    the first block's key when affinity is off), then the name. The
    matched blocks come from the caller (here Route's answer; the daemon
    reads its own index); pick() records the decision: predicted entries
    for every block of the prompt on the winner (none when the index
    reports the winner, LIVE, holds them all), and the window."""

    def __init__(self, names, knobs):
        self.names = names
        self.kn = knobs
        self.index = {w: k for k, w in enumerate(names)}
        self.predicted = Predicted(len(names), knobs["predicted_ttl_ms"])
        self.window = [collections.deque() for _ in names]  # (ms, prefill tokens) per pick
        self.churn = [collections.deque() for _ in names]   # the same, churn_window_ms
        self.churn_tokens = [0.0] * len(names)

    def affinity_key(self, ids):
        n = min(int(self.kn["affinity_blocks"]), len(ids))
        return tuple(ids[:max(n, 1)]), n > 0

    def window_load(self, k, now_ms):
        win = self.window[k]
        while win and win[0][0] <= now_ms - self.kn["load_window_ms"]:
            win.popleft()
        return Load(len(win), sum(t for _, t in win), 0.0)

    def churn_of(self, k, now_ms):
        ch = self.churn[k]
        while ch and ch[0][0] <= now_ms - self.kn["churn_window_ms"]:
            self.churn_tokens[k] -= ch.popleft()[1]
        if not ch:
            self.churn_tokens[k] = 0.0
        return self.churn_tokens[k]

    def costs(self, ids, now_ms, candidates, matched, loads=None):
        """matched: worker -> (matched blocks, state) from the index;
        loads: worker -> Load, or None (the daemon's window)."""
        kn = self.kn
        key, affinity_on = self.affinity_key(ids)
        winner = rendezvous_winner(key, candidates)
        out = []
        for w in candidates:
            k = self.index[w]
            m, state = matched.get(w, (0, 0))
            c = m if state == LIVE else 0  # every simulated block is GPU: weight 1.0
            p = self.predicted.prefix(k, ids, now_ms)
            credit = max(c, p)
            prefill = max(len(ids) * BLOCK_TOKENS - credit * BLOCK_TOKENS, 0)
            ld = loads[w] if loads is not None else self.window_load(k, now_ms)
            load = (kn["queued_weight"] * ld.queued_prefill_tokens
                    + kn["request_tokens"] * ld.requests_in_flight
                    + kn["kv_tokens"] * ld.kv_usage)
            churn = kn["churn_weight"] * self.churn_of(k, now_ms)
            affinity = -kn["affinity_tokens"] if affinity_on and w == winner else 0.0
            cost = kn["prefill_weight"] * prefill + load + churn + affinity
            out.append((cost, ld.requests_in_flight, w != winner, w,
                        Cost(w, prefill, load, churn, affinity, cost, credit, c)))
        return [x[-1] for x in sorted(out)]

    def pick(self, ids, now_ms, candidates, matched, loads=None):
        ranked = self.costs(ids, now_ms, candidates, matched, loads)
        self.record(ranked[0], ids, now_ms)
        return ranked

    def record(self, chosen, ids, now_ms):
        """The decision to send the prompt to chosen.worker (a Cost): every
        block predicted there, unless the index reports it holds them all
        and it is LIVE."""
        k = self.index[chosen.worker]
        if chosen.matched < len(ids):
            self.predicted.add(k, ids, now_ms)
        self.window[k].append((now_ms, chosen.prefill_tokens))
        self.churn[k].append((now_ms, chosen.prefill_tokens))
        self.churn_tokens[k] += chosen.prefill_tokens


class PickPy(Policy):
    """pickpy: the router calls Pick (modelled by PickModel) with every
    engine as a candidate and the load it can vouch for itself:
      requests_in_flight     the requests it sent and that have not finished;
      queued_prefill_tokens  the prefill tokens Pick's answer predicted for
                             each request it sent, until its first token
                             (an estimate: the engine exports no such
                             figure; Dynamo's router keeps the same one);
      kv_usage               vllm:kv_cache_usage_perc, scraped.
    The engines' waiting counts are not passed (Pick's load takes none).
    pickpy-window passes no load: the daemon's window stands in."""
    uses_index = True
    pass_load = True

    def __init__(self, names, seed, args, variant=""):
        super().__init__(names, seed, args)
        knobs = ",".join(x for x in (getattr(args, "pick", ""), variant) if x)
        self.model = PickModel(names, pick_knobs(knobs))
        self.queued = [0] * self.n   # the router's queued prefill tokens per engine
        self.charged = {}            # rid -> (engine, tokens) until its first token

    def inputs(self, view):
        """(candidates, loads): what the router sends to Pick besides the prompt."""
        if not self.pass_load:
            return self.names, None
        return self.names, {w: Load(view.inflight[k], self.queued[k], view.kv_usage[k])
                            for k, w in enumerate(self.names)}

    def choose(self, req, view):
        candidates, loads = self.inputs(view)
        matched = dict(zip(self.names, view.route))  # the daemon reads its own index
        self.answer = self.model.pick(req.ids, req.now_ms, candidates, matched, loads)
        return self.names.index(self.answer[0].worker)

    def routed(self, req, k, view):
        tokens = self.answer[0].prefill_tokens
        self.queued[k] += tokens
        self.charged[req.i] = (k, tokens)

    def event(self, rid, kind, k, now_ms):
        c = self.charged.pop(rid, None)
        if c is not None:
            self.queued[c[0]] -= c[1]


class PickPyWindow(PickPy):
    pass_load = False


class Pick(PickPy):
    """pick: the daemon's own Pick, the RPC, with its shipped defaults
    (pickpy's --pick does not reach it), the router passing the same loads
    as pickpy's. fleet_sim sets `call(req, candidates, loads)`, which
    returns the client's PickResult or None when the call failed (then:
    least loaded); its daemon runs with index.pick.replay_clock and each
    Pick carries the request's simulated time, so the predicted blocks and
    the window age in simulated time. pick-window passes no load: the
    daemon's window of its own picks stands in."""
    uses_index = False  # it asks Pick, which reads the index itself
    calls_pick = True
    call = None

    def choose(self, req, view):
        candidates, loads = self.inputs(view)
        res = self.call(req, candidates, loads)
        self.answer = res.ranked if res is not None else None
        if res is None:
            return min(range(self.n), key=lambda k: (view.inflight[k], self.names[k]))
        return self.names.index(res.worker)

    def routed(self, req, k, view):
        tokens = (self.answer[0].prefill_tokens if self.answer
                  else len(req.ids) * BLOCK_TOKENS)
        self.queued[k] += tokens
        self.charged[req.i] = (k, tokens)


class PickWindow(Pick):
    pass_load = False


class PickModelCheck(Pick):
    """pick-model: pick, with PickModel asked the same first, on the same
    state: the index as Route saw it just before (the daemon reads its own
    a moment later), the same loads, and the model's windows and predicted
    blocks holding the daemon's choices. Counts the requests where the
    two chose differently, and of those the ones where the model's cost of
    the daemon's choice equals its own best (a tie broken another way:
    pickpy hashes with BLAKE2b, the daemon with XXH3)."""
    uses_index = True

    def __init__(self, names, seed, args):
        super().__init__(names, seed, args)
        self.differed = []  # (request, tie)

    def choose(self, req, view):
        candidates, loads = self.inputs(view)
        matched = dict(zip(self.names, view.route))
        mine = self.model.costs(req.ids, req.now_ms, candidates, matched, loads)
        k = super().choose(req, view)
        chosen = next(c for c in mine if c.worker == self.names[k])
        if chosen.worker != mine[0].worker:
            self.differed.append((req.i, abs(chosen.cost - mine[0].cost) < 1e-9))
        self.model.record(chosen, req.ids, req.now_ms)
        return k

    def notes(self):
        ties = sum(1 for _, tie in self.differed if tie)
        others = [i for i, tie in self.differed if not tie]
        return ("the model chose otherwise on %d requests: %d exact ties, %d not%s"
                % (len(self.differed), ties, len(others),
                   " (requests %s)" % ", ".join(map(str, others[:10])) if others else ""))


def make(name, names, seed, args, n_requests):
    """The policy called `name`: fleet_sim.COMPARE's, pickpy-window, a +drop
    variant, oracle~K, or pickpy@knob=value@... (pickpy with those knobs
    over --pick's)."""
    if name.startswith("oracle~"):
        return PerturbedOracle(names, seed, args, int(name[7:]), n_requests)
    base, *variant = name.split("+")[0].split("@")  # prefixd+drop; pickpy@knob=value@...
    if variant:
        return {"pickpy": PickPy, "pickpy-window": PickPyWindow}[base](
            names, seed, args, ",".join(variant))
    cls = {"rr": RoundRobin, "ll": LeastLoaded, "session": Session, "prefixd": TodaysRule,
           "oracle": Oracle, "dynamo": Dynamo, "llmd": LlmD, "sglang": SGLang,
           "pickpy": PickPy, "pickpy-window": PickPyWindow, "pick": Pick,
           "pick-window": PickWindow, "pick-model": PickModelCheck}[base]
    return cls(names, seed, args)
