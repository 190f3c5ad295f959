// libFuzzer: one FleetIndex fed from every side a daemon's index is fed
// from, in any order: engine batches as the decoder hands them over (stores
// with tokens, EAGLE's bigram stores (the token after each block a content
// key), stores of keys alone, vLLM's offloading placeholders, sparse
// stores and Mooncake objects (blocks named by engine hash), removals,
// AllBlocksCleared, a wrong block size, LoRA, salts, mediums, KV-cache groups,
// events of another tenant than the worker's),
// hash reports of SGLang's KV indexer (report, revoke, clear a tier),
// registrations (labels, hashes that are the index's own keys, KV-cache group
// rules), streams cleared and workers retired and added back. Hashes and tokens
// come from small sets, and some hashes are a prompt's rolling keys, so that
// stores, reports and lookups meet on the same blocks.
//
// Input (FuzzedDataProvider): whether max_entries is small enough for
// trims, then steps until the input ends, each a selector and its operands
// (see Step).
//
// Checked after every step: FleetIndex::CheckInvariants. Every Route answer
// lists a worker at most once, sorted by matched blocks, none past the
// prompt, best_worker the first LIVE engine (no store) with a match; a
// Route by the prompt's rolling keys answers as the Route by its tokens
// (keys name no bigram blocks: once some are stored, no worker's match by
// keys is longer than by tokens); every RouteEngineHashes answer is sorted
// and within the hashes. At the end,
// clearing every worker leaves no entry, block or engine hash.
//
// `make fuzz` runs it on tests/fuzz/corpus/fleet_index_fuzzer.
//
// A finding may not replay in another process when it involves a trim
// after a clear: clears free slots in the order of a hash map that absl
// seeds per process, and trims order leaves of one age by their slots.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fuzzer/FuzzedDataProvider.h"
#include "index/events.h"
#include "index/extra_keys.h"
#include "index/fleet_index.h"
#include "index/group_rules.h"
#include "index/keys.h"

namespace prefixd {
namespace {

constexpr int kBlockSize = 2;
constexpr int kWorkers = 4;
constexpr int kMaxBlocks = 6;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fleet_index_fuzzer: %s\n", what.c_str());
  std::abort();
}

class Driver {
 public:
  // max_entries small (trims run all the time) or out of reach (the trees
  // grow).
  explicit Driver(bool trims)
      : index_(Options(trims)), scheme_(Options(trims).hash_profile, 0) {
    for (int w = 0; w < kWorkers; ++w) Add(w);
  }

  void Step(FuzzedDataProvider& in) {
    const int w = in.ConsumeIntegralInRange<int>(0, kWorkers - 1);
    switch (in.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
      case 1:
      case 2:
        return ApplyBatch(w, in);
      case 3:
      case 4:
        return ApplyHashes(w, in);
      case 5:
        return Restart(w, in);
      case 6:
        return Label(w, in);
      default:
        return Lookup(in);
    }
  }

  void Check(const char* after) {
    const absl::Status s = index_.CheckInvariants();
    if (!s.ok()) Fail(absl::StrCat("after ", after, ": ", s.ToString()));
  }

  void ClearAll() {
    for (int w = 0; w < kWorkers; ++w)
      index_.ClearWorker(ids_[w], ClearReason::kRestart, "");
    Check("clearing every worker");
    const IndexStats st = index_.Stats();
    if (st.entries != 0 || st.blocks != 0 || st.engine_hashes != 0)
      Fail(absl::StrCat("cleared index holds ", st.entries, " entries, ",
                        st.blocks, " blocks, ", st.engine_hashes,
                        " engine hashes"));
  }

 private:
  static IndexOptions Options(bool trims) {
    IndexOptions o;
    o.block_size = kBlockSize;
    o.max_entries = trims ? 64 : 1 << 20;
    o.key_lookup = true;
    return o;
  }

  void Add(int w) {
    ids_[w] =
        index_.AddWorker(absl::StrCat("w", w), absl::StrCat("tcp://w", w));
    seq_[w] = 0;
  }

  // A prompt of 1..kMaxBlocks blocks over the tokens 1..3.
  static std::vector<Token> Prompt(FuzzedDataProvider& in) {
    const int blocks = in.ConsumeIntegralInRange<int>(1, kMaxBlocks);
    std::vector<Token> t(static_cast<size_t>(blocks) * kBlockSize);
    for (Token& x : t) x = in.ConsumeIntegralInRange<Token>(1, 3);
    return t;
  }

  std::vector<uint64_t> Keys(const std::vector<Token>& tokens,
                             absl::string_view salt) const {
    std::vector<uint64_t> keys(tokens.size() / kBlockSize);
    scheme_.Chain(scheme_.Root(salt), true, tokens, kBlockSize, keys.size(),
                  nullptr, keys.data());
    return keys;
  }

  // `n` engine hashes: small numbers, or the rolling keys of a prompt.
  std::vector<EngineHash> Hashes(FuzzedDataProvider& in, size_t n) {
    std::vector<EngineHash> h;
    if (in.ConsumeBool()) {
      const std::vector<uint64_t> keys = Keys(Prompt(in), "");
      h.assign(keys.begin(), keys.begin() + std::min(n, keys.size()));
    }
    while (h.size() < n)
      h.push_back(in.ConsumeIntegralInRange<EngineHash>(1, 24));
    return h;
  }

  static std::string Medium(FuzzedDataProvider& in) {
    static const char* const kMediums[] = {"GPU", "CPU", "DISK", "CPU/LMCACHE"};
    return kMediums[in.ConsumeIntegralInRange<int>(0, 3)];
  }

  // RFC #1527's tenant_id: mostly none; else the default tenant, or one
  // that only some workers' labels name.
  static std::string Tenant(FuzzedDataProvider& in) {
    static const char* const kTenants[] = {"", "", "", "", "default", "t"};
    return kTenants[in.ConsumeIntegralInRange<int>(0, 5)];
  }

  BlockStoredEvent Store(FuzzedDataProvider& in) {
    BlockStoredEvent e;
    const bool root = in.ConsumeBool();
    if (!root) e.parent_block_hash = Hashes(in, 1)[0];
    const bool tokens = in.ConsumeIntegralInRange<int>(0, 3) != 0;
    std::vector<Token> prompt = Prompt(in);
    const size_t blocks = prompt.size() / kBlockSize;
    // A child may name a salt too (SGLang names it in every store of a
    // salted request): kept only in its parent's namespace.
    if (in.ConsumeBool() && (root || in.ConsumeBool())) e.cache_salt = "s";
    if (in.ConsumeBool()) e.lora_name = "a";
    // Hashes as a vLLM engine sends them (anything), or as the index's
    // own rolling keys, as an RFC #1527 publisher does.
    if (root && in.ConsumeBool()) {
      const std::vector<uint64_t> keys = Keys(prompt, e.cache_salt);
      e.block_hashes.assign(keys.begin(), keys.end());
    } else {
      e.block_hashes = Hashes(in, blocks);
    }
    if (tokens) {
      e.token_ids = std::move(prompt);
      e.block_size = in.ConsumeIntegralInRange<int>(0, 15) == 0
                         ? kBlockSize + 1  // a wrong block size: ERROR
                         : kBlockSize;
      if (e.block_size != kBlockSize)
        e.token_ids.resize(blocks * e.block_size, 1);
    } else {
      // Keys alone, or vLLM's offloading placeholder (block size 0 or the
      // offloaded block's).
      e.placeholder = in.ConsumeBool();
      e.block_size = in.ConsumeBool()                    ? kBlockSize
                     : e.placeholder && in.ConsumeBool() ? 256
                                                         : 0;
      // A Mooncake object's key: one engine hash, any worker's block.
      if (!e.placeholder && !e.block_hashes.empty() && in.ConsumeBool()) {
        e.block_hashes.erase(e.block_hashes.begin() + 1, e.block_hashes.end());
        e.block_size = 0;
        e.from_object_key = true;
      }
    }
    e.medium = Medium(in);
    e.tenant = Tenant(in);
    e.chain_blocks = in.ConsumeIntegralInRange<size_t>(0, 7) == 0
                         ? in.ConsumeIntegralInRange<size_t>(0, blocks)
                         : blocks;
    if (tokens && e.block_size == kBlockSize &&
        in.ConsumeIntegralInRange<int>(0, 3) == 0) {
      // As the decoder makes EAGLE's pairs: each chained block's content
      // is the token after it.
      e.bigram = true;
      e.content =
          WithNextTokens(nullptr, e.token_ids, kBlockSize, e.chain_blocks,
                         in.ConsumeIntegralInRange<Token>(1, 3));
      bigram_stored_ = true;
    }
    // vLLM's store of a group with null blocks: fewer hashes than blocks
    // of tokens, the last ones kept (a Mamba group in align mode).
    if (tokens && !e.bigram && !e.block_hashes.empty() &&
        in.ConsumeIntegralInRange<int>(0, 5) == 0) {
      const size_t keep =
          in.ConsumeIntegralInRange<size_t>(0, e.block_hashes.size() - 1);
      e.block_hashes.erase(e.block_hashes.begin(),
                           e.block_hashes.end() - static_cast<long>(keep));
      e.chain_blocks = std::min(e.chain_blocks, keep);
      e.sparse = true;
    }
    // Group 2 never declares a kind: a worker whose first such store names
    // it is routed by it (TensorRT-LLM's one named group).
    e.group_idx = Group(in);
    if (e.group_idx == 1 ||
        (e.group_idx == 0 && in.ConsumeIntegralInRange<int>(0, 3) == 0)) {
      static const char* const kKinds[] = {"full_attention", "sliding_window",
                                           "mamba", "mla_attention"};
      e.kv_cache_spec_kind = kKinds[in.ConsumeIntegralInRange<int>(0, 3)];
      if (e.kv_cache_spec_kind == "sliding_window")
        e.kv_cache_spec_sliding_window = in.ConsumeIntegralInRange<int>(0, 5);
    }
    // SGLang's component-typed stores (any set of full, swa, mamba).
    if (in.ConsumeIntegralInRange<int>(0, 5) == 0) {
      e.components = in.ConsumeIntegralInRange<uint32_t>(0, 7);
      e.one_component = in.ConsumeBool();
    }
    return e;
  }

  static int Group(FuzzedDataProvider& in) {
    const int pick = in.ConsumeIntegralInRange<int>(0, 7);
    return pick < 2 ? 1 : pick == 2 ? 2 : 0;
  }

  void ApplyBatch(int w, FuzzedDataProvider& in) {
    KvEventBatch batch;
    batch.ts = static_cast<double>(clock_s_);
    const int events = in.ConsumeIntegralInRange<int>(1, 3);
    for (int i = 0; i < events; ++i) {
      const int kind = in.ConsumeIntegralInRange<int>(0, 9);
      if (kind < 6) {
        batch.events.emplace_back(Store(in));
      } else if (kind < 9) {
        BlockRemovedEvent r;
        r.block_hashes = Hashes(in, in.ConsumeIntegralInRange<size_t>(1, 4));
        r.medium = Medium(in);
        r.group_idx = Group(in);
        if (in.ConsumeIntegralInRange<int>(0, 5) == 0)
          r.components = in.ConsumeIntegralInRange<uint32_t>(0, 7);
        r.tenant = Tenant(in);
        batch.events.emplace_back(std::move(r));
      } else {
        batch.events.emplace_back(AllBlocksClearedEvent{Tenant(in)});
      }
    }
    ++clock_s_;
    index_.Apply(ids_[w], batch, seq_[w]++, Now());
    Check("a batch");
  }

  void ApplyHashes(int w, FuzzedDataProvider& in) {
    const int n = in.ConsumeIntegralInRange<int>(1, 3);
    std::vector<std::vector<EngineHash>> lists(n);
    std::vector<HashUpdate> updates(n);
    for (int i = 0; i < n; ++i) {
      lists[i] = Hashes(in, in.ConsumeIntegralInRange<size_t>(0, kMaxBlocks));
      HashUpdate& u = updates[i];
      const int op = in.ConsumeIntegralInRange<int>(0, 9);
      u.op = op < 6   ? HashUpdate::Op::kReport
             : op < 9 ? HashUpdate::Op::kRevoke
                      : HashUpdate::Op::kClearTier;
      u.medium = Medium(in);
      u.groups = in.ConsumeIntegralInRange<uint32_t>(1, 3);
      u.hashes = lists[i];
    }
    index_.ApplyHashes(ids_[w], updates);
    Check("hash updates");
  }

  void Restart(int w, FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        index_.ClearWorker(ids_[w], ClearReason::kReplayFailed, "gap");
        seq_[w] = 0;
        break;
      case 1:
        index_.RetireWorker(ids_[w]);
        Check("retiring a worker");
        Add(w);
        break;
      case 2:
        index_.SetState(ids_[w], WorkerState::kReplaying, "replaying");
        break;
      default:
        index_.SetLastSeq(ids_[w], seq_[w]++);
        break;
    }
    Check("restarting a stream");
  }

  void Label(int w, FuzzedDataProvider& in) {
    WorkerLabels l;
    l.hashes_are_keys = in.ConsumeBool();
    if (in.ConsumeBool()) l.lora_name = "a";
    if (in.ConsumeBool()) l.salt = "s";
    if (in.ConsumeBool()) l.address = absl::StrCat("http://w", w);
    if (in.ConsumeBool()) l.tenant = "t";
    index_.SetLabels(ids_[w], l);
    Check("labels");
    if (in.ConsumeBool()) {  // group rules its registration declares
      std::array<GroupRule, kMaxGroups> rules;
      for (int g = 0; g < 3; ++g) {
        rules[g].kind =
            static_cast<GroupKind>(in.ConsumeIntegralInRange<int>(0, 4));
        if (rules[g].kind == GroupKind::kSlidingWindow)
          rules[g].window_blocks = in.ConsumeIntegralInRange<uint32_t>(0, 3);
      }
      index_.SetGroupRules(ids_[w], rules);
      Check("group rules");
    }
  }

  void Lookup(FuzzedDataProvider& in) {
    const std::vector<Token> tokens = Prompt(in);
    const bool salted = in.ConsumeBool();
    const bool lora = in.ConsumeBool();
    RouteQuery q;
    q.tokens = tokens;
    if (salted) q.cache_salt = "s";
    if (lora) q.lora_name = "a";
    q.filter.all_workers = in.ConsumeBool();
    const RouteResult by_tokens = index_.Route(q);
    CheckRoute(by_tokens, tokens.size() / kBlockSize, "Route");
    // The same prompt by its rolling keys, as a router that hashes sends
    // it: the same answer (keys carry no LoRA, so only without one).
    if (!lora) {
      const std::vector<uint64_t> keys = Keys(tokens, q.cache_salt);
      RouteQuery k;
      k.keys = keys;
      k.cache_salt = q.cache_salt;
      k.filter.all_workers = q.filter.all_workers;
      const RouteResult by_keys = index_.Route(k);
      CheckRoute(by_keys, keys.size(), "Route by keys");
      const auto keyed = Matched(by_keys);
      const auto tokened = Matched(by_tokens);
      if (!bigram_stored_ && keyed != tokened)
        Fail("Route by keys answers otherwise than Route by tokens");
      for (const auto& [worker, blocks] : keyed) {
        const auto it = tokened.find(worker);
        if (blocks > (it == tokened.end() ? 0 : it->second))
          Fail("Route by keys matches more than Route by tokens");
      }
    }
    const std::vector<EngineHash> hashes =
        Hashes(in, in.ConsumeIntegralInRange<size_t>(1, kMaxBlocks));
    CheckRoute(index_.RouteEngineHashes(hashes, WorkerFilter{}), hashes.size(),
               "RouteEngineHashes");
    for (const HashHolding& h : index_.HashHoldings(hashes)) {
      if (std::find(hashes.begin(), hashes.end(), h.hash) == hashes.end())
        Fail("HashHoldings answered a hash not asked");
    }
  }

  static std::map<std::string, uint64_t> Matched(const RouteResult& r) {
    std::map<std::string, uint64_t> m;
    for (const WorkerMatch& w : r.workers)
      m[std::string(w.worker)] = w.matched_blocks;
    return m;
  }

  static void CheckRoute(const RouteResult& r, size_t blocks,
                         const char* what) {
    std::set<absl::string_view> seen;
    uint64_t last = UINT64_MAX;
    absl::string_view best;
    for (const WorkerMatch& m : r.workers) {
      if (!seen.insert(m.worker).second)
        Fail(absl::StrCat(what, " lists ", m.worker, " twice"));
      if (m.matched_blocks > last) Fail(absl::StrCat(what, " not sorted"));
      if (m.matched_blocks > blocks)
        Fail(absl::StrCat(what, ": ", m.worker, " matches ", m.matched_blocks,
                          " of ", blocks, " blocks"));
      if (best.empty() && m.state == WorkerState::kLive &&
          m.matched_blocks > 0 && !m.labels->hashes_are_keys) {
        best = m.worker;
      }
      last = m.matched_blocks;
    }
    if (r.best_worker != best)
      Fail(absl::StrCat(what, ": best_worker ", r.best_worker, ", not ", best));
  }

  absl::Time Now() const { return absl::FromUnixSeconds(clock_s_); }

  FleetIndex index_;
  KeyScheme scheme_;
  WorkerId ids_[kWorkers] = {};
  int64_t seq_[kWorkers] = {};
  int64_t clock_s_ = 1700000000;
  bool bigram_stored_ = false;  // some store was EAGLE's bigram blocks
};

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  prefixd::Driver d(in.ConsumeBool());
  while (in.remaining_bytes() > 0) d.Step(in);
  d.ClearAll();
  return 0;
}
