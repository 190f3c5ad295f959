// Microbenchmarks of core/ (docs/performance.md, benchmark 1): Match and Insert
// at prompt lengths 512, 2k, 8k and 32k tokens (block_size 16) on a deep
// shared-prefix tree and on bushy trees of 10^3, 10^5 and 10^6 cached prefixes;
// Evict throughput; and, in the same run, memcmp over the same token bytes.
//
// Every benchmark reports items_per_second as tokens per second (blocks per
// second for Evict), so "Match vs memcmp" is the ratio of two
// items_per_second figures of one run; bench/ratios.py prints the targets of
// docs/performance.md from --benchmark_format=json output.
//
// Trees (built once, outside the timed loop, when the first benchmark that
// needs one runs; benchmarks are registered grouped by tree):
//   deep       one 32k-token trunk with a 32-block side branch at every
//              32-block boundary (a conversation tree: 64 turns, each with a
//              sibling that diverged there). The probe is the trunk.
//   bushyN     N cached prefixes of 1 or 2 blocks, each with its own first
//              block (root fan-out N), plus 16 probe prompts of 32k tokens.
// Probes are pre-split at every length benchmarked, so the tree has the same
// shape whichever benchmarks run and in whichever order.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "benchmark/benchmark.h"
#include "core/cache.h"

namespace prefixd {
namespace {

constexpr size_t kBlockSize = 16;
constexpr size_t kMaxLen = 32768;
constexpr size_t kLengths[] = {512, 2048, 8192, 32768};
constexpr char kTenant[] = "bench";

void Die(const std::string& what) {
  std::fprintf(stderr, "core_bench: %s\n", what.c_str());
  std::abort();
}

template <typename T>
T Check(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}

// Tokens of block `serial`: distinct for every serial, so blocks never
// collide unless they are meant to be the same block.
void AppendBlock(uint64_t serial, std::vector<Token>* out) {
  for (size_t j = 0; j < kBlockSize; ++j)
    out->push_back(static_cast<Token>(serial * kBlockSize + j));
}

std::unique_ptr<PrefixCache> NewCache(uint64_t budget_blocks) {
  CacheOptions o;
  o.block_size = kBlockSize;
  o.block_bytes = 1;
  o.budget_bytes = budget_blocks;
  o.seed = 1;
  return Check(PrefixCache::Create(o), "Create");
}

// A cache holding one tree, and the prompts the benchmarks query it with.
class TreeFixture {
 public:
  // prefixes == 0: the deep tree; else a bushy tree of that many prefixes.
  explicit TreeFixture(uint64_t prefixes) : prefixes_(prefixes) {
    const uint64_t probes = prefixes == 0 ? 1 : 16;
    // Room for the tree and for the blocks InsertHalfNew adds for a moment.
    cache_ = NewCache(2 * prefixes + probes * 2 * kMaxLen / kBlockSize +
                      kMaxLen / kBlockSize);
    for (uint64_t p = 0; p < probes; ++p) {
      probes_.emplace_back();
      for (size_t b = 0; b < kMaxLen / kBlockSize; ++b)
        AppendBlock(next_serial_++, &probes_.back());
      stored_.push_back(probes_.back());  // what memcmp compares against
      InsertFresh(probes_.back(), &probe_ids_.emplace_back());
    }
    if (prefixes == 0) BuildSideBranches();
    for (uint64_t i = 0; i < prefixes; ++i) {
      std::vector<Token> t;
      PrefixTokens(i, &t);
      std::vector<BlockId> ids;
      InsertFresh(t, &ids);
    }
    // Fresh tokens and IDs for the new half of InsertHalfNew.
    for (size_t b = 0; b < kMaxLen / 2 / kBlockSize; ++b) {
      AppendBlock(next_serial_++, &fresh_tokens_);
      fresh_ids_.push_back(next_id_++);
    }
    // Pre-split every probe where Match and InsertHalfNew end.
    for (size_t p = 0; p < probes_.size(); ++p) {
      for (size_t len : kLengths) {
        Match(p, len);
        PrepareHalfNew(p, len);
        RunHalfNew();
        Undo();
      }
    }
  }

  PrefixCache& cache() { return *cache_; }
  size_t num_probes() const { return probes_.size(); }
  uint64_t prefixes() const { return prefixes_; }
  absl::Span<const Token> probe(size_t p, size_t len) const {
    return absl::MakeConstSpan(probes_[p]).subspan(0, len);
  }
  absl::Span<const Token> stored(size_t p, size_t len) const {
    return absl::MakeConstSpan(stored_[p]).subspan(0, len);
  }

  // Tokens of bushy prefix i: 1 block for even i, 2 for odd i.
  void PrefixTokens(uint64_t i, std::vector<Token>* out) const {
    const uint64_t base = kPrefixSerialBase + 2 * i;
    AppendBlock(base, out);
    if (i % 2 == 1) AppendBlock(base + 1, out);
  }

  MatchResult Match(size_t p, size_t len) {
    MatchQuery req;
    req.tokens = probe(p, len);
    MatchResult r = Check(cache_->Match(kTenant, req), "Match");
    if (r.matched_tokens != len) Die("probe not fully cached");
    return r;
  }

  // Insert of the whole cached prompt with the cached IDs: every block is
  // confirmed, nothing changes but recency.
  void InsertConfirm(size_t p, size_t len) {
    InsertRequest req;
    req.tokens = probe(p, len);
    req.block_ids =
        absl::MakeConstSpan(probe_ids_[p]).subspan(0, len / kBlockSize);
    InsertResult r = Check(cache_->Insert(kTenant, req), "Insert");
    if (r.cached_tokens != len) Die("confirm insert found a miss");
  }

  // Insert of `len` tokens whose first half is probe p (cached, confirmed)
  // and whose second half is new: PrepareHalfNew (untimed), RunHalfNew (the
  // Insert), then Undo() removes the new half again.
  void PrepareHalfNew(size_t p, size_t len) {
    const size_t half = len / 2, half_blocks = half / kBlockSize;
    half_new_tokens_.assign(probes_[p].begin(), probes_[p].begin() + half);
    half_new_tokens_.insert(half_new_tokens_.end(), fresh_tokens_.begin(),
                            fresh_tokens_.begin() + half);
    half_new_ids_.assign(probe_ids_[p].begin(),
                         probe_ids_[p].begin() + half_blocks);
    half_new_ids_.insert(half_new_ids_.end(), fresh_ids_.begin(),
                         fresh_ids_.begin() + half_blocks);
    half_new_req_ = InsertRequest{};
    half_new_req_.tokens = half_new_tokens_;
    half_new_req_.block_ids = half_new_ids_;
  }
  void RunHalfNew() {
    InsertResult r = Check(cache_->Insert(kTenant, half_new_req_), "Insert");
    if (r.cached_tokens != half_new_tokens_.size() / 2 ||
        !r.evicted_block_ids.empty()) {
      Die("half-new insert did not adopt exactly the new half");
    }
  }
  void Undo() {
    Check(cache_->Invalidate(TenantScope::All(),
                             absl::MakeConstSpan(&fresh_ids_[0], 1)),
          "Invalidate");
  }

 private:
  static constexpr uint64_t kPrefixSerialBase = uint64_t{1} << 21;

  void InsertFresh(absl::Span<const Token> tokens, std::vector<BlockId>* ids) {
    for (size_t b = 0; b < tokens.size() / kBlockSize; ++b)
      ids->push_back(next_id_++);
    InsertRequest req;
    req.tokens = tokens;
    req.block_ids = *ids;
    InsertResult r = Check(cache_->Insert(kTenant, req), "Insert");
    if (!r.evicted_block_ids.empty()) Die("tree does not fit its budget");
  }

  // A 32-block branch off the trunk at every 32-block boundary.
  void BuildSideBranches() {
    constexpr size_t kTurn = 32;
    const std::vector<Token>& trunk = probes_[0];
    const std::vector<BlockId>& trunk_ids = probe_ids_[0];
    for (size_t at = kTurn; at < trunk_ids.size(); at += kTurn) {
      std::vector<Token> t(trunk.begin(), trunk.begin() + at * kBlockSize);
      std::vector<BlockId> ids(trunk_ids.begin(), trunk_ids.begin() + at);
      for (size_t b = 0; b < kTurn; ++b) {
        AppendBlock(next_serial_++, &t);
        ids.push_back(next_id_++);
      }
      InsertRequest req;
      req.tokens = t;
      req.block_ids = ids;
      Check(cache_->Insert(kTenant, req), "Insert");
    }
  }

  const uint64_t prefixes_;
  std::unique_ptr<PrefixCache> cache_;
  uint64_t next_serial_ = 1;
  BlockId next_id_ = 1;
  std::vector<std::vector<Token>> probes_, stored_;
  std::vector<std::vector<BlockId>> probe_ids_;
  std::vector<Token> fresh_tokens_, half_new_tokens_;
  std::vector<BlockId> fresh_ids_, half_new_ids_;
  InsertRequest half_new_req_;
};

// The tree of the benchmarks running now; replaced when one needs another.
TreeFixture& Tree(uint64_t prefixes) {
  static std::unique_ptr<TreeFixture> current;
  if (current == nullptr || current->prefixes() != prefixes) {
    current.reset();  // free the old tree before building the new one
    current = std::make_unique<TreeFixture>(prefixes);
  }
  return *current;
}

void SetTokens(benchmark::State& state, size_t len) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * len));
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations() * len * sizeof(Token)));
}

// --- Baselines: the same token bytes, compared without a tree. --------------

void BM_Memcmp(benchmark::State& state, uint64_t prefixes, size_t len) {
  TreeFixture& f = Tree(prefixes);
  size_t p = 0;
  for (auto _ : state) {
    int r = std::memcmp(f.probe(p, len).data(), f.stored(p, len).data(),
                        len * sizeof(Token));
    benchmark::DoNotOptimize(r);
    if (++p == f.num_probes()) p = 0;
  }
  SetTokens(state, len);
}

// One dependent load from DRAM per iteration: a pointer chase through a
// random cycle over 256 MiB. The unit in which cold tree lookups are paid.
void BM_DramLoad(benchmark::State& state) {
  constexpr size_t kSlots = (size_t{256} << 20) / sizeof(uint64_t);
  static const std::vector<uint64_t>* const next = [] {
    auto* v = new std::vector<uint64_t>(kSlots);
    std::vector<uint64_t> order(kSlots);
    for (size_t i = 0; i < kSlots; ++i) order[i] = i;
    std::shuffle(order.begin() + 1, order.end(), std::mt19937_64(7));
    for (size_t i = 0; i < kSlots; ++i)
      (*v)[order[i]] = order[(i + 1) % kSlots];
    return v;
  }();
  uint64_t at = 0;
  for (auto _ : state) {
    at = (*next)[at];
    benchmark::DoNotOptimize(at);
  }
}

// --- Match and Insert of cached prompts. ------------------------------------

void BM_Match(benchmark::State& state, uint64_t prefixes, size_t len) {
  TreeFixture& f = Tree(prefixes);
  size_t p = 0;
  for (auto _ : state) {
    MatchResult r = f.Match(p, len);
    benchmark::DoNotOptimize(r);
    if (++p == f.num_probes()) p = 0;
  }
  SetTokens(state, len);
}

// Match of a random one of the tree's small prefixes followed by tokens that
// miss: the per-lookup cost when the tree does not sit in the CPU caches.
// Writing the query's first 32 tokens is inside the timed loop (a few ns).
void BM_MatchRandomPrefix(benchmark::State& state, uint64_t prefixes,
                          size_t len) {
  TreeFixture& f = Tree(prefixes);
  std::mt19937_64 rng(42);
  std::vector<uint64_t> order(1 << 16);
  for (uint64_t& i : order) i = rng() % prefixes;
  std::vector<Token> query(len, 0);  // a block of zeros is never cached
  std::vector<Token> prefix;
  size_t k = 0;
  for (auto _ : state) {
    prefix.clear();
    f.PrefixTokens(order[k], &prefix);
    std::fill(query.begin(), query.begin() + 2 * kBlockSize, 0);
    std::copy(prefix.begin(), prefix.end(), query.begin());
    if (++k == order.size()) k = 0;
    MatchQuery req;
    req.tokens = query;
    MatchResult r = Check(f.cache().Match(kTenant, req), "Match");
    if (r.matched_tokens != prefix.size()) Die("random prefix not matched");
    benchmark::DoNotOptimize(r);
  }
  SetTokens(state, len);
}

void BM_InsertConfirm(benchmark::State& state, uint64_t prefixes, size_t len) {
  TreeFixture& f = Tree(prefixes);
  size_t p = 0;
  for (auto _ : state) {
    f.InsertConfirm(p, len);
    if (++p == f.num_probes()) p = 0;
  }
  SetTokens(state, len);
}

// Manual time: only the Insert is timed, not the Invalidate that undoes it.
void BM_InsertHalfNew(benchmark::State& state, uint64_t prefixes, size_t len) {
  TreeFixture& f = Tree(prefixes);
  size_t p = 0;
  for (auto _ : state) {
    f.PrepareHalfNew(p, len);
    const auto start = std::chrono::steady_clock::now();
    f.RunHalfNew();
    const auto stop = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
    f.Undo();
    if (++p == f.num_probes()) p = 0;
  }
  SetTokens(state, len);
}

// --- Evict.
// -------------------------------------------------------------------

// Evict(1024) from a cache of 2^16 prompts, each a shared 1-block prefix (one
// of 256) and `leaf_blocks` blocks of its own; refilled (untimed) when fewer
// than 1024 blocks are left. Items are evicted blocks.
void BM_Evict(benchmark::State& state) {
  const size_t leaf_blocks = static_cast<size_t>(state.range(0));
  constexpr size_t kPrompts = 1 << 16, kBatch = 1024, kShared = 256;
  std::unique_ptr<PrefixCache> cache;
  uint64_t left = 0, serial = 1;
  BlockId next_id = kShared + 1;
  auto refill = [&] {
    cache.reset();
    cache = NewCache(kShared + kPrompts * leaf_blocks);
    std::vector<Token> t;
    std::vector<BlockId> ids;
    for (size_t i = 0; i < kPrompts; ++i) {
      t.clear();
      ids.clear();
      AppendBlock(i % kShared, &t);    // serials [0, 256): the shared blocks
      ids.push_back(i % kShared + 1);  // IDs [1, 256]: theirs
      for (size_t b = 0; b < leaf_blocks; ++b) {
        AppendBlock(kShared + serial++, &t);
        ids.push_back(next_id++);
      }
      InsertRequest req;
      req.tokens = t;
      req.block_ids = ids;
      Check(cache->Insert(kTenant, req), "Insert");
    }
    left = kShared + kPrompts * leaf_blocks;
  };
  uint64_t evicted = 0;
  for (auto _ : state) {
    if (left < kBatch) refill();
    const auto start = std::chrono::steady_clock::now();
    auto out = Check(cache->Evict(TenantScope::All(), kBatch), "Evict");
    const auto stop = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
    if (out.size() != kBatch) Die("Evict returned too few blocks");
    left -= out.size();
    evicted += out.size();
  }
  state.SetItemsProcessed(static_cast<int64_t>(evicted));
}

// --- Invalidate.
// -------------------------------------------------------------------

// Invalidate of 8,192 one-block leaves below one block that `leases` leases
// pin (built untimed per iteration): ending the leases of each removed node
// must not scan all of them, so the time per leaf should not grow with
// `leases`. Items are invalidated blocks.
void BM_InvalidateBesideLeases(benchmark::State& state) {
  const int leases = static_cast<int>(state.range(0));
  constexpr Token kLeaves = 8192;
  uint64_t removed = 0;
  for (auto _ : state) {
    std::unique_ptr<PrefixCache> cache = NewCache(2 * kLeaves);
    std::vector<Token> root;
    AppendBlock(0, &root);
    const std::vector<BlockId> root_id = {uint64_t{1} << 40};
    InsertRequest in;
    in.tokens = root;
    in.block_ids = root_id;
    Check(cache->Insert(kTenant, in), "Insert");
    MatchQuery pin;
    pin.tokens = root;
    pin.pin = true;
    for (int i = 0; i < leases; ++i) Check(cache->Match(kTenant, pin), "Match");
    std::vector<BlockId> leaves;
    for (Token k = 1; k <= kLeaves; ++k) {
      std::vector<Token> t = root;
      AppendBlock(k, &t);
      const std::vector<BlockId> ids = {root_id[0], k};
      in.tokens = t;
      in.block_ids = ids;
      Check(cache->Insert(kTenant, in), "Insert");
      leaves.push_back(k);
    }
    const auto start = std::chrono::steady_clock::now();
    auto out =
        Check(cache->Invalidate(TenantScope::All(), leaves), "Invalidate");
    const auto stop = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
    if (out.size() != kLeaves) Die("Invalidate removed too few blocks");
    removed += out.size();
  }
  state.SetItemsProcessed(static_cast<int64_t>(removed));
}

// Invalidate of one node of `blocks` blocks, ID by ID from its tail: the
// node must be cut once, not re-split per ID, so the time per ID should not
// grow with `blocks`. Items are invalidated blocks.
void BM_InvalidateTailFirst(benchmark::State& state) {
  const size_t blocks = static_cast<size_t>(state.range(0));
  uint64_t removed = 0;
  for (auto _ : state) {
    std::unique_ptr<PrefixCache> cache = NewCache(blocks);
    std::vector<Token> t;
    std::vector<BlockId> ids;
    for (size_t b = 0; b < blocks; ++b) {
      AppendBlock(b, &t);
      ids.push_back(b + 1);
    }
    InsertRequest in;
    in.tokens = t;
    in.block_ids = ids;
    Check(cache->Insert(kTenant, in), "Insert");
    const std::vector<BlockId> reversed(ids.rbegin(), ids.rend());
    const auto start = std::chrono::steady_clock::now();
    auto out =
        Check(cache->Invalidate(TenantScope::All(), reversed), "Invalidate");
    const auto stop = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
    if (out.size() != blocks) Die("Invalidate removed too few blocks");
    removed += out.size();
  }
  state.SetItemsProcessed(static_cast<int64_t>(removed));
}

std::string TreeName(uint64_t prefixes) {
  if (prefixes == 0) return "deep";
  int exp = 0;
  for (uint64_t n = prefixes; n > 1; n /= 10) ++exp;
  return absl::StrCat("bushy1e", exp);
}

void RegisterAll() {
  for (uint64_t prefixes :
       {uint64_t{0}, uint64_t{1000}, uint64_t{100000}, uint64_t{1000000}}) {
    const std::string tree = TreeName(prefixes);
    for (size_t len : kLengths) {
      const std::string suffix = absl::StrCat("/", tree, "/", len);
      benchmark::RegisterBenchmark(("Memcmp" + suffix).c_str(), BM_Memcmp,
                                   prefixes, len);
      benchmark::RegisterBenchmark(("Match" + suffix).c_str(), BM_Match,
                                   prefixes, len);
      benchmark::RegisterBenchmark(("InsertConfirm" + suffix).c_str(),
                                   BM_InsertConfirm, prefixes, len);
      benchmark::RegisterBenchmark(("InsertHalfNew" + suffix).c_str(),
                                   BM_InsertHalfNew, prefixes, len)
          ->UseManualTime();
    }
    if (prefixes != 0) {
      benchmark::RegisterBenchmark(
          absl::StrCat("MatchRandomPrefix/", tree, "/512").c_str(),
          BM_MatchRandomPrefix, prefixes, size_t{512});
    }
  }
  benchmark::RegisterBenchmark("DramLoad", BM_DramLoad);
  benchmark::RegisterBenchmark("Evict/leaf_blocks", BM_Evict)
      ->Arg(1)
      ->Arg(16)
      ->UseManualTime();
  benchmark::RegisterBenchmark("Invalidate/beside_leases",
                               BM_InvalidateBesideLeases)
      ->Arg(0)
      ->Arg(65536)
      ->UseManualTime();
  benchmark::RegisterBenchmark("Invalidate/tail_first", BM_InvalidateTailFirst)
      ->Arg(1024)
      ->Arg(32768)
      ->UseManualTime();
}

}  // namespace
}  // namespace prefixd

// Like the daemon (server/main.cc), the benchmarks run with absl::Mutex
// deadlock detection off; Debian's abseil (built without NDEBUG) leaves it on,
// which --mutex_deadlock_detection=true (ours, not Google Benchmark's) keeps
// for comparison (docs/performance.md).
int main(int argc, char** argv) {
  bool detect = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg(argv[i]);
    if (arg == "--mutex_deadlock_detection=false") {
      detect = false;
    } else if (arg == "--mutex_deadlock_detection=true") {
      detect = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  if (!detect) {
    prefixd::DisableMutexDeadlockDetection();
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  prefixd::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
