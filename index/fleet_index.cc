#include "index/fleet_index.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "index/event_tenant.h"
#include "index/external_kv.h"
#include "index/extra_keys.h"
#include "index/keys.h"
#include "index/routed_group.h"

namespace prefixd {

absl::string_view WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kConnecting:
      return "CONNECTING";
    case WorkerState::kLive:
      return "LIVE";
    case WorkerState::kReplaying:
      return "REPLAYING";
    case WorkerState::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

absl::string_view ClearReasonName(ClearReason reason) {
  static constexpr absl::string_view kNames[kNumClearReasons] = {
      "all_blocks_cleared", "restart", "replay_failed", "undecodable",
      "block_size",         "removed", "reconnect",     "invalidated"};
  return kNames[static_cast<int>(reason)];
}

// --- Locking ----------------------------------------------------------------

// A change: writer_mu_ for its whole length, mu_ but between slices (the
// analysis cannot follow mu_ through Yield, hence its opt-out here).
class ABSL_SCOPED_LOCKABLE FleetIndex::Writer {
 public:
  explicit Writer(FleetIndex* index)
      ABSL_EXCLUSIVE_LOCK_FUNCTION(index->mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS
      : index_(index) {
    index_->writer_mu_.Lock();
    index_->mu_.Lock();
  }
  ~Writer() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    index_->EndHold();
    index_->mu_.Unlock();
    index_->writer_mu_.Unlock();
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

 private:
  FleetIndex* const index_;
};

// A Route's shared hold of mu_, counted while it waits (see Yield).
class ABSL_SCOPED_LOCKABLE FleetIndex::Reader {
 public:
  explicit Reader(const FleetIndex* index)
      ABSL_SHARED_LOCK_FUNCTION(index->mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS
      : index_(index) {
    index_->waiting_readers_.fetch_add(1, std::memory_order_relaxed);
    index_->mu_.ReaderLock();
    index_->waiting_readers_.fetch_sub(1, std::memory_order_relaxed);
  }
  ~Reader() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    index_->mu_.ReaderUnlock();
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

 private:
  const FleetIndex* const index_;
};

size_t FleetIndex::Budget() {
  if (hold_blocks_ >= kSliceBlocks) Yield();
  return kSliceBlocks - hold_blocks_;
}

void FleetIndex::EndHold() {
  hold_stats_.max_blocks =
      std::max<uint64_t>(hold_stats_.max_blocks, hold_blocks_);
  hold_blocks_ = 0;
}

void FleetIndex::Yield() {
  EndHold();
  ++hold_stats_.yields;
  mu_.Unlock();
  // absl::Mutex lets the thread that unlocks take the lock back before the
  // readers it woke run: wait, a bounded while, until they have it. (With
  // none waiting, as on most of a slice's releases, not even the clock.)
  if (waiting_readers_.load(std::memory_order_relaxed) > 0) {
    const absl::Time deadline = absl::Now() + absl::Milliseconds(2);
    while (waiting_readers_.load(std::memory_order_relaxed) > 0 &&
           absl::Now() < deadline) {
      std::this_thread::yield();
    }
  }
  if (between_slices_) between_slices_();
  mu_.Lock();
}

void FleetIndex::GrowAside(WorkerId id, size_t inserts) {
  std::unique_ptr<HolderTree::Growth> growth = tree_.GrowthFor(id, inserts);
  if (growth == nullptr) return;
  EndHold();
  mu_.Unlock();
  mu_.ReaderLock();
  growth->Build();  // writer_mu_ keeps every other change out
  mu_.ReaderUnlock();
  mu_.Lock();
  growth->Adopt();
  ++hold_stats_.grown_aside;
  hold_stats_.largest_key_copy = std::max<uint64_t>(
      hold_stats_.largest_key_copy, growth->largest_key_copy());
  // The tables replaced are out of every Route's reach: freed unlocked.
  mu_.Unlock();
  growth.reset();
  mu_.Lock();
}

FleetIndex::HoldStats FleetIndex::hold_stats() const {
  ReaderMutexLock lock(&mu_);
  HoldStats stats = hold_stats_;
  stats.grown_in_place = tree_.sizes().grown_in_place;
  return stats;
}

void FleetIndex::SetBetweenSlicesForTest(std::function<void()> hook) {
  MutexLock lock(&writer_mu_);
  between_slices_ = std::move(hook);
}

FleetIndex::FleetIndex(IndexOptions options)
    : options_(options),
      tree_(options.block_size,
            KeyScheme(options.hash_profile, options.hash_seed)) {
  if (options.key_lookup) {
    std::unique_ptr<HolderTree::Job> job = tree_.BeginKeyLookup();
    for (bool done = false; !done;) job->Step(SIZE_MAX, &done);
  }
}

// --- Workers ----------------------------------------------------------------

WorkerId FleetIndex::AddWorker(absl::string_view name,
                               absl::string_view endpoint) {
  Writer lock(this);
  const WorkerId id = workers_.Add(name, endpoint).id;
  tree_.AddWorker(id);
  return id;
}

void FleetIndex::RetireWorker(WorkerId id) {
  Writer lock(this);
  WorkerRecord& w = workers_.Get(id);
  ClearLocked(w, ClearReason::kRemoved);
  w.retired = true;
}

void FleetIndex::SetState(WorkerId id, WorkerState state,
                          absl::string_view detail) {
  Writer lock(this);
  WorkerRecord& w = workers_.Get(id);
  w.state = state;
  w.detail = std::string(detail);
}

void FleetIndex::CountGap(WorkerId id) {
  Writer lock(this);
  ++workers_.Get(id).gaps;
}

void FleetIndex::CountReplay(WorkerId id, bool ok) {
  Writer lock(this);
  WorkerRecord& w = workers_.Get(id);
  ++(ok ? w.replays_ok : w.replays_failed);
}

void FleetIndex::SetLastSeq(WorkerId id, int64_t seq) {
  Writer lock(this);
  workers_.Get(id).last_seq = seq;
}

void FleetIndex::SetLabels(WorkerId id, const WorkerLabels& labels) {
  Writer lock(this);
  workers_.Get(id).labels = labels;
  if (!labels.hashes_are_keys) return;
  Run(tree_.BeginKeyLookup());
}

std::optional<std::string> FleetIndex::SetAddress(WorkerId id,
                                                  absl::string_view address) {
  {
    ReaderMutexLock lock(&mu_);
    const WorkerRecord& w = workers_.Get(id);
    if (w.retired) return std::nullopt;
    if (w.labels.address == address) return w.endpoint;
  }
  Writer lock(this);
  WorkerRecord& w = workers_.Get(id);
  if (w.retired) return std::nullopt;
  w.labels.address = std::string(address);
  return w.endpoint;
}

std::optional<std::string> FleetIndex::EndpointOf(
    absl::string_view name) const {
  ReaderMutexLock lock(&mu_);
  const WorkerRecord* w = workers_.Find(name);
  if (w == nullptr || w->retired) return std::nullopt;
  return w->endpoint;
}

void FleetIndex::SetGroupRules(WorkerId id,
                               const std::array<GroupRule, kMaxGroups>& rules) {
  Writer lock(this);
  WorkerRecord& w = workers_.Get(id);
  w.groups = rules;
  hybrid_.Set(id, w.groups);
}

void FleetIndex::ApplyHashes(WorkerId id,
                             absl::Span<const HashUpdate> updates) {
  Writer lock(this);
  WorkerRecord& w = workers_.Get(id);
  const uint64_t stamp = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  ApplyUpdates(id, updates, stamp);
  if (w.state != WorkerState::kLive) {
    w.state = WorkerState::kLive;
    w.detail.clear();
  }
  Trim();
}

void FleetIndex::ApplyUpdates(WorkerId id, absl::Span<const HashUpdate> updates,
                              uint64_t stamp) {
  for (const HashUpdate& u : updates) {
    if (u.op == HashUpdate::Op::kClearTier) {
      Run(tree_.BeginClearTier(id, u.medium));
      continue;
    }
    for (int g = 0; g < kMaxGroups; ++g) {
      if ((u.groups >> g & 1) == 0) continue;
      if (u.op == HashUpdate::Op::kReport) {
        StoreHashesSliced(id, u.hashes, g, u.medium, stamp);
      } else {
        BlockRemovedEvent ev;
        ev.block_hashes.assign(u.hashes.begin(), u.hashes.end());
        ev.medium = u.medium;
        ev.group_idx = g;
        RemoveSliced(id, ev);
      }
    }
  }
}

void FleetIndex::ClearWorker(WorkerId id, ClearReason reason,
                             absl::string_view detail) {
  Writer lock(this);
  WorkerRecord& w = workers_.Get(id);
  ClearLocked(w, reason);
  w.state = WorkerState::kConnecting;
  w.detail = std::string(detail);
  w.last_error = absl::StrCat(ClearReasonName(reason), ": ", detail);
  w.last_seq = -1;
}

void FleetIndex::ClearLocked(WorkerRecord& w, ClearReason reason) {
  ++w.clears[static_cast<int>(reason)];
  Run(tree_.BeginClear(w.id));
}

// --- Apply ------------------------------------------------------------------

bool FleetIndex::RejectBlockSize(WorkerRecord& w, const KvEventBatch& batch) {
  const BlockStoredEvent* wrong = nullptr;
  uint64_t blocks = 0;
  for (const KvEvent& e : batch.events) {
    const auto* st = std::get_if<BlockStoredEvent>(&e);
    if (st == nullptr || OfAnotherTenant(w, st->tenant)) continue;
    blocks += st->block_hashes.size();
    // A placeholder names blocks stored before: its size is the offload
    // tier's, never the index's to check; so does a store of SGLang's
    // components without full attention, or of a Mooncake object's key.
    const bool placed =
        (st->components == 0 || (st->components & kComponentFull) != 0) &&
        !st->placeholder && !st->from_object_key;
    if (wrong == nullptr && RoutedGroupOf(w, *st) == 0 && placed &&
        st->block_size != options_.block_size) {
      wrong = st;
    }
  }
  if (wrong == nullptr) return false;
  if (w.state != WorkerState::kError) ClearLocked(w, ClearReason::kBlockSize);
  w.state = WorkerState::kError;
  w.detail = absl::StrFormat(
      "events carry block_size %d but index.block_size is %d: set "
      "--index_block_size to the engine's block size",
      wrong->block_size, options_.block_size);
  w.last_error = w.detail;
  DropCounts drops = {};
  drops[static_cast<int>(DropReason::kBlockSize)] = blocks;
  workers_.CountDrops(w.id, drops);
  return true;
}

void FleetIndex::Apply(WorkerId id, const KvEventBatch& batch, int64_t seq,
                       absl::Time now) {
  Writer lock(this);
  WorkerRecord& w = workers_.Get(id);
  w.events_by_type[3] += batch.unknown_events;
  w.unknown_fields += batch.unknown_fields;
  LearnRoutedGroup(batch, &w);
  if (!RejectBlockSize(w, batch)) ApplyEvents(w, batch);
  // Recorded once the batch is applied in full: a long one releases mu_
  // between slices, and a reader then must not take the worker for caught
  // up through it.
  w.last_seq = seq;
  w.last_event_unix_ms = absl::ToUnixMillis(now);
  w.last_ts = batch.ts;
}

void FleetIndex::ApplyEvents(WorkerRecord& w, const KvEventBatch& batch) {
  const WorkerId id = w.id;
  const uint64_t stamp = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  DropCounts drops = {};
  // A sparse store names its blocks by the hashes another group's store
  // gives them, which vLLM may send after it in the same step (a hybrid
  // model's Mamba groups come before its full attention): it waits for the
  // stores after it, up to the next removal or clear.
  std::vector<const BlockStoredEvent*> waiting;
  for (const KvEvent& e : batch.events) {
    if (SkipOtherTenants(w, e, &drops)) continue;
    if (const auto* st = std::get_if<BlockStoredEvent>(&e)) {
      ++w.events_by_type[0];
      if (st->sparse) {
        waiting.push_back(st);
      } else {
        StoreLocked(w, *st, stamp, &drops);
      }
      continue;
    }
    StoreWaiting(w, &waiting, stamp, &drops);
    if (const auto* rm = std::get_if<BlockRemovedEvent>(&e)) {
      ++w.events_by_type[1];
      w.event_version = std::max(w.event_version, rm->event_version);
      if (rm->components != 0) {
        w.component_typed = true;
        RemoveComponents(id, *rm, rm->components);
      } else if (w.component_typed) {
        RemoveComponents(id, *rm, kAllComponents);
      } else if (RoutedGroupOf(w, *rm) != rm->group_idx) {
        BlockRemovedEvent routed = *rm;
        routed.group_idx = 0;
        RemoveSliced(id, routed);
      } else {
        RemoveSliced(id, *rm);
      }
    } else {
      ++w.events_by_type[2];
      ClearLocked(w, ClearReason::kAllBlocksCleared);
    }
  }
  StoreWaiting(w, &waiting, stamp, &drops);
  workers_.CountDrops(id, drops);
  if (w.state != WorkerState::kLive) {
    w.state = WorkerState::kLive;
    w.detail.clear();
  }
  Trim();
}

void FleetIndex::StoreWaiting(WorkerRecord& w,
                              std::vector<const BlockStoredEvent*>* waiting,
                              uint64_t stamp, DropCounts* drops) {
  for (const BlockStoredEvent* st : *waiting) StoreLocked(w, *st, stamp, drops);
  waiting->clear();
}

void FleetIndex::StoreLocked(WorkerRecord& w, const BlockStoredEvent& ev,
                             uint64_t stamp, DropCounts* drops) {
  if (RoutedGroupOf(w, ev) != ev.group_idx) {
    // Counted in group 0: a copy, tokens and all, made only for an engine
    // routed by another group, which sends that group's stores alone.
    BlockStoredEvent routed = ev;
    routed.group_idx = 0;
    StoreLocked(w, routed, stamp, drops);
    return;
  }
  if (ev.bigram) bigram_blocks_ = true;
  w.event_version = std::max(w.event_version, ev.event_version);
  const int64_t g = ev.group_idx;
  DropReason reason;
  if (ev.components != 0 && g == 0) {
    StoreComponents(w, ev, stamp, drops);
    return;
  }
  if (ev.from_object_key && g == 0) {
    // A shared pool's copy of a block some engine stored: found among
    // every worker's blocks by its engine hash, as the KV indexer API's.
    StoreHashesSliced(w.id, ev.block_hashes, 0, ev.medium, stamp);
    return;
  }
  if (g < 0 || g >= kMaxGroups || ev.components != 0) {
    reason = DropReason::kGroup;
  } else {
    LearnGroup(w, ev);
    if (g > 0 && w.groups[static_cast<size_t>(g)].kind == GroupKind::kNone) {
      reason = DropReason::kGroup;
    } else if (ev.block_size != options_.block_size && !ev.token_ids.empty()) {
      reason = DropReason::kBlockSize;
    } else {
      const StoreDefaults defaults = {w.labels.lora_name, w.labels.salt,
                                      w.labels.hashes_are_keys};
      StoreSliced(w.id, ev, defaults, stamp, drops);
      SweepStale();
      return;
    }
  }
  (*drops)[static_cast<int>(reason)] += ev.block_hashes.size();
}

// A group is indexed once a store has declared its kind (group 0 is full
// attention unless declared otherwise, as every engine without hybrid
// groups has it). Engines that send group_idx without a kind are routed
// by one group (WorkerRecord::routed_group), their others skipped.
void FleetIndex::LearnGroup(WorkerRecord& w, const BlockStoredEvent& ev) {
  // A placeholder's block size is its offload tier's, not the group's.
  if (ev.kv_cache_spec_kind.empty() || ev.placeholder) return;
  GroupRule rule =
      RuleForSpec(ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window,
                  options_.block_size);
  // Blocks of another size cannot line up with the index's: such a group
  // can never vouch for a prefix (group 0's case is RejectBlockSize's).
  if (ev.block_size != options_.block_size) rule.kind = GroupKind::kUnsupported;
  GroupRule& known = w.groups[static_cast<size_t>(ev.group_idx)];
  if (rule == known) return;
  known = rule;
  hybrid_.Set(w.id, w.groups);
}

// SGLang's component-typed store: the components it names replace those
// the worker held of the blocks in the medium (SGLang restates a smaller
// set when it evicts a component, and sends no removal), or, in its
// earlier layout, the one it names is added. Full attention's blocks are
// placed by their tokens, as any store's; the other components' are found
// by the engine hashes.
void FleetIndex::StoreComponents(WorkerRecord& w, const BlockStoredEvent& ev,
                                 uint64_t stamp, DropCounts* drops) {
  w.component_typed = true;
  LearnComponents(w, ev.components);
  if ((ev.components & kComponentFull) != 0) {
    if (ev.block_size != options_.block_size && !ev.token_ids.empty()) {
      (*drops)[static_cast<int>(DropReason::kBlockSize)] +=
          ev.block_hashes.size();
      return;
    }
    const StoreDefaults defaults = {w.labels.lora_name, w.labels.salt,
                                    w.labels.hashes_are_keys};
    StoreSliced(w.id, ev, defaults, stamp, drops);
    SweepStale();
  }
  // The other components by engine hash, as SGLang's KV indexer API's.
  std::vector<HashUpdate> updates;
  AddComponentUpdates(ev.medium, ev.components & ~kComponentFull,
                      ev.one_component ? 0 : kAllComponents & ~ev.components,
                      ev.block_hashes, &updates);
  ApplyUpdates(w.id, updates, stamp);
}

// Components other than full attention declare their groups. A sliding
// window's length is not on the wire: it is the worker's registration's
// (WorkerLabels::swa_window_tokens) until a cache spec gives one
// (ExternalKv::SetSpec), else unknown (GroupRule::window_blocks).
void FleetIndex::LearnComponents(WorkerRecord& w, uint32_t components) {
  bool changed = false;
  for (int g = 1; (kAllComponents >> g) != 0; ++g) {
    GroupRule& known = w.groups[static_cast<size_t>(g)];
    if ((components >> g & 1) == 0 || known.kind != GroupKind::kNone) continue;
    if (g == 1) {
      const uint64_t bs = static_cast<uint64_t>(options_.block_size);
      known = {
          GroupKind::kSlidingWindow,
          static_cast<uint32_t>((w.labels.swa_window_tokens + bs - 1) / bs)};
    } else {
      known.kind = GroupKind::kState;
    }
    changed = true;
  }
  if (changed) hybrid_.Set(w.id, w.groups);
}

void FleetIndex::RemoveComponents(WorkerId id, const BlockRemovedEvent& ev,
                                  uint32_t components) {
  BlockRemovedEvent part = ev;
  for (int g = 0; (components >> g) != 0; ++g) {
    if ((components >> g & 1) == 0) continue;
    part.group_idx = g;
    RemoveSliced(id, part);
  }
}

void FleetIndex::StoreHashesSliced(WorkerId id,
                                   absl::Span<const EngineHash> hashes, int g,
                                   absl::string_view medium, uint64_t stamp) {
  for (size_t a = 0; a < hashes.size();) {
    const size_t k = std::min(hashes.size() - a, Budget());
    GrowAside(id, k);
    tree_.StoreHashes(id, hashes.subspan(a, k), g, medium, stamp);
    Spend(k);
    a += k;
  }
  SweepStale();
}

void FleetIndex::Trim() {
  HolderTree::Trimmed trimmed;
  std::unique_ptr<HolderTree::Job> job =
      tree_.BeginTrim(options_.max_entries, &trimmed);
  if (job == nullptr) return;
  Run(std::move(job));
  for (WorkerId w = 0; w < trimmed.entries_by_worker.size(); ++w)
    workers_.Get(w).dropped_blocks += trimmed.entries_by_worker[w];
  workers_.CountTrimmed(trimmed.blocks);
}

// The store just applied may have left its worker's engine-hash map stale
// (HolderTree::BeginSweep): swept here, in steps, before anything else
// changes.
void FleetIndex::SweepStale() {
  while (std::unique_ptr<HolderTree::Job> job = tree_.BeginSweep())
    Run(std::move(job));
}

void FleetIndex::Run(std::unique_ptr<HolderTree::Job> job) {
  if (job == nullptr) return;
  for (bool done = false; !done;) Spend(job->Step(Budget(), &done));
}

// --- Slices -----------------------------------------------------------------

namespace {

// Blocks [a, b) of `ev` as a store of their own into *part (whose other
// fields are ev's): its parent is block a - 1, its tokens and content keys
// those of its blocks.
void StoreSlice(const BlockStoredEvent& ev, size_t a, size_t b,
                size_t block_size, BlockStoredEvent* part) {
  part->block_hashes.assign(ev.block_hashes.begin() + static_cast<long>(a),
                            ev.block_hashes.begin() + static_cast<long>(b));
  if (a > 0) part->parent_block_hash = ev.block_hashes[a - 1];
  const size_t t0 = std::min(ev.token_ids.size(), a * block_size);
  const size_t t1 = std::min(ev.token_ids.size(), b * block_size);
  part->token_ids.assign(ev.token_ids.begin() + static_cast<long>(t0),
                         ev.token_ids.begin() + static_cast<long>(t1));
  part->chain_blocks =
      ev.chain_blocks > a ? std::min(ev.chain_blocks - a, b - a) : 0;
  part->content.Clear();
  const std::vector<uint32_t>& begin = ev.content.begin;
  if (begin.size() > a + 1) {
    const size_t last = std::min(b, begin.size() - 1);
    for (size_t i = a; i <= last; ++i)
      part->content.begin.push_back(begin[i] - begin[a]);
    part->content.keys.assign(ev.content.keys.begin() + begin[a],
                              ev.content.keys.begin() + begin[last]);
  }
}

}  // namespace

// Each slice is a store of its own, parented on the slice before it; once
// a slice finds no parent the rest of the chain has none either (as one
// store of them all would count it).
void FleetIndex::StoreSliced(WorkerId id, const BlockStoredEvent& ev,
                             const StoreDefaults& defaults, uint64_t stamp,
                             DropCounts* drops) {
  const size_t n = ev.block_hashes.size();
  if (n <= Budget()) {
    GrowAside(id, n);
    tree_.Store(id, ev, defaults, stamp, drops);
    Spend(n);
    return;
  }
  const size_t chain = std::min(ev.chain_blocks, n);
  uint64_t& unknown = (*drops)[static_cast<int>(DropReason::kUnknownParent)];
  BlockStoredEvent part;
  part.parent_block_hash = ev.parent_block_hash;
  part.block_size = ev.block_size;
  part.placeholder = ev.placeholder;
  part.sparse = ev.sparse;
  part.bigram = ev.bigram;
  part.lora_id = ev.lora_id;
  part.medium = ev.medium;
  part.lora_name = ev.lora_name;
  part.cache_salt = ev.cache_salt;
  part.group_idx = ev.group_idx;
  part.kv_cache_spec_kind = ev.kv_cache_spec_kind;
  part.kv_cache_spec_sliding_window = ev.kv_cache_spec_sliding_window;
  part.locality = ev.locality;
  part.ownership = ev.ownership;
  part.event_version = ev.event_version;
  for (size_t a = 0; a < n;) {
    const size_t b = std::min(n, a + Budget());
    StoreSlice(ev, a, b, static_cast<size_t>(options_.block_size), &part);
    GrowAside(id, b - a);
    const uint64_t unknown_before = unknown;
    tree_.Store(id, part, defaults, stamp, drops);
    Spend(b - a);
    if (unknown != unknown_before && !ev.token_ids.empty()) {
      const size_t rest = chain > b ? chain - b : 0;
      unknown += rest;
      (*drops)[static_cast<int>(DropReason::kExtraKeys)] += n - b - rest;
      return;
    }
    a = b;
  }
}

void FleetIndex::RemoveSliced(WorkerId id, const BlockRemovedEvent& ev) {
  const size_t n = ev.block_hashes.size();
  if (n <= Budget()) {
    tree_.Remove(id, ev);
    Spend(n);
    return;
  }
  BlockRemovedEvent part;
  part.medium = ev.medium;
  part.group_idx = ev.group_idx;
  part.locality = ev.locality;
  part.ownership = ev.ownership;
  part.event_version = ev.event_version;
  for (size_t a = 0; a < n;) {
    const size_t b = std::min(n, a + Budget());
    part.block_hashes.assign(ev.block_hashes.begin() + static_cast<long>(a),
                             ev.block_hashes.begin() + static_cast<long>(b));
    tree_.Remove(id, part);
    Spend(b - a);
    a = b;
  }
}

// --- Route ------------------------------------------------------------------

RouteResult FleetIndex::Route(const RouteQuery& q) const {
  const absl::Time now = absl::Now();
  const std::string ns = NamespaceKey(q.lora_name, q.lora_id, q.cache_salt);
  PromptKeys prompt;
  prompt.tokens = q.tokens;
  prompt.content = q.content;
  prompt.salt = q.cache_salt;
  prompt.keys = q.keys;
  RouteScores scores;
  // With tier runs asked for, the walks keep each block's holders.
  HeldBlocks held, bigram_held;
  Reader lock(this);
  const uint64_t stamp = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  tree_.Score(prompt, ns, workers_.size(), hybrid_, stamp, &scores,
              q.tier_runs ? &held : nullptr);
  const bool bigrams = bigram_blocks_ && q.keys.empty();
  if (bigrams) {
    BlockContent content;
    RouteScores bigram;
    tree_.Score(BigramPrompt(q, &content), ns, workers_.size(), hybrid_, stamp,
                &bigram, q.tier_runs ? &bigram_held : nullptr);
    scores.TakeLonger(bigram);
  }
  if (!q.tier_runs) return Assemble(q.filter, scores, nullptr, now);
  const std::vector<TierRuns> tiers =
      ScoreTiers(q.filter, scores, {&held, &bigram_held});
  return Assemble(q.filter, scores, &tiers, now);
}

// A bigram block covers block_size tokens and the one after it, so a
// prompt of n tokens has (n - 1) / block_size of them. A worker's blocks
// are all of one kind or the other: its run is the longer of the walks.
PromptKeys FleetIndex::BigramPrompt(const RouteQuery& q,
                                    BlockContent* content) const {
  const size_t bs = static_cast<size_t>(options_.block_size);
  const size_t blocks = q.tokens.empty() ? 0 : (q.tokens.size() - 1) / bs;
  // Every block has a token after it within the prompt.
  *content = WithNextTokens(q.content, q.tokens, bs, blocks, /*after=*/0);
  PromptKeys prompt;
  prompt.tokens = absl::MakeConstSpan(q.tokens).first(blocks * bs);
  prompt.content = content;
  prompt.salt = q.cache_salt;
  return prompt;
}

// The stores the filter lets through extend every engine's runs; a hybrid
// model's engine counts its own blocks only as far as it can reuse them.
// Per walk (by plain blocks, by bigram blocks) one TierScorer; a worker's
// blocks are all of one kind, so each run is the longer of the walks'.
std::vector<TierRuns> FleetIndex::ScoreTiers(
    const WorkerFilter& filter, const RouteScores& scores,
    std::initializer_list<const HeldBlocks*> walks) const {
  const size_t n = workers_.size();
  TierSources sources;
  for (size_t m = 0; m < scores.num_mediums; ++m)
    sources.medium_level.push_back(MediumLevel(tree_.MediumName(m)));
  sources.shared.assign(n, false);
  sources.cap.assign(n, UINT32_MAX);
  WorkerFilter stores = filter;
  stores.instance = "";  // a store is no instance of the engines'
  for (WorkerId id = 0; id < n; ++id) {
    const WorkerRecord& w = workers_.Get(id);
    sources.shared[id] = w.labels.IsStore() && Passes(stores, w);
    if (hybrid_.Of(id) >= 0) sources.cap[id] = scores.Usable(id);
  }
  std::vector<TierRuns> out(n);
  for (const HeldBlocks* held : walks) {
    if (held->empty()) continue;  // no block matched: every run is 0
    TierScorer scorer(n, sources);
    for (uint32_t b = 0; b < held->size(); ++b) scorer.Block(b, (*held)[b]);
    scorer.Finish();
    for (WorkerId id = 0; id < n; ++id) out[id].TakeLonger(scorer.Of(id));
  }
  return out;
}

RouteResult FleetIndex::RouteEngineHashes(absl::Span<const EngineHash> hashes,
                                          const WorkerFilter& filter) const {
  const absl::Time now = absl::Now();
  RouteScores scores;
  Reader lock(this);
  tree_.ScoreEngineHashes(hashes, workers_.size(), hybrid_, &scores);
  return Assemble(filter, scores, nullptr, now);
}

std::vector<HashHolding> FleetIndex::HashHoldings(
    absl::Span<const EngineHash> hashes) const {
  std::vector<HashHolding> out;
  ReaderMutexLock lock(&mu_);
  for (EngineHash hash : hashes) {
    const size_t first = out.size();
    for (uint32_t h : tree_.HoldersOfEngineHash(hash)) {
      const WorkerRecord& w = workers_.Get(HolderWorker(h));
      if (w.retired) continue;
      const absl::string_view medium = tree_.MediumName(HolderMedium(h));
      auto same =
          std::find_if(out.begin() + static_cast<long>(first), out.end(),
                       [&](const HashHolding& x) {
                         return x.worker == w.name && x.medium == medium;
                       });
      if (same == out.end()) {
        out.push_back({hash, w.name, medium, 0, &w.labels});
        same = out.end() - 1;
      }
      same->groups |= 1u << HolderGroup(h);
    }
  }
  return out;
}

bool FleetIndex::Passes(const WorkerFilter& f, const WorkerRecord& w) const {
  if (w.retired) return false;
  if (!f.workers.empty() && std::find(f.workers.begin(), f.workers.end(),
                                      w.name) == f.workers.end()) {
    return false;
  }
  if (!f.tenant.empty() && w.labels.Tenant() != f.tenant) return false;
  if (!f.model.empty() && !w.labels.model.empty() && w.labels.model != f.model)
    return false;
  return f.instance.empty() || w.labels.Instance(w.name) == f.instance;
}

// The workers asked for (by default those with a matched block), most
// matched blocks first, then by name: sorted as one integer each (blocks,
// then the name's rank in the registry, which names the worker), then
// written out in order, which is cheaper than sorting the answers or
// comparing names.
RouteResult FleetIndex::Assemble(const WorkerFilter& filter,
                                 const RouteScores& scores,
                                 const std::vector<TierRuns>* tiers,
                                 absl::Time now) const {
  // Per worker: fewer blocks, then a later name, is larger.
  absl::InlinedVector<uint64_t, 32> order;
  const bool unmatched = filter.all_workers || !filter.workers.empty();
  const bool narrowed = !filter.NamesNothing();
  const size_t num_workers = workers_.size();
  for (WorkerId id = 0; id < num_workers; ++id) {
    const uint32_t blocks = scores.Usable(id);
    if (blocks == 0 && !unmatched) continue;
    const WorkerRecord& w = workers_.Get(id);
    if (narrowed ? !Passes(filter, w) : w.retired) continue;
    order.push_back((uint64_t{UINT32_MAX - blocks} << 32) | w.name_rank);
  }
  std::sort(order.begin(), order.end());
  const int64_t now_ns = absl::ToUnixNanos(now);
  RouteResult result;
  result.prompt_blocks = scores.prompt_blocks;
  result.workers.resize(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const WorkerRecord& w = workers_.ByRank(static_cast<uint32_t>(order[i]));
    WorkerMatch& m = result.workers[i];
    m.worker = w.name;
    m.matched_blocks = scores.Usable(w.id);
    m.full_attention_blocks = scores.FullAttention(w.id);
    for (size_t k = 0; k < scores.num_mediums; ++k) {
      const uint32_t held = scores.InMedium(w.id, k);
      if (held > 0) m.mediums.push_back({tree_.MediumName(k), held});
    }
    if (tiers != nullptr) m.tiers = (*tiers)[w.id];
    m.state = w.state;
    m.last_seq = w.last_seq;
    m.lag_ms = w.LagMs(now_ns);
    m.labels = &w.labels;
  }
  // A store is no engine: a router sends no request to it.
  for (const WorkerMatch& m : result.workers) {
    if (m.matched_blocks == 0) break;
    if (m.state == WorkerState::kLive && !m.labels->IsStore()) {
      result.best_worker = m.worker;
      break;
    }
  }
  return result;
}

// --- Introspection ----------------------------------------------------------

WorkerStatus FleetIndex::StatusOf(const WorkerRecord& w, absl::Time now) const {
  WorkerStatus s;
  s.worker = w.name;
  s.endpoint = w.endpoint;
  s.labels = w.labels;
  s.state = w.state;
  s.state_detail = w.detail;
  s.last_error = w.last_error;
  for (const HolderTree::MediumBlocks& m : tree_.Holdings(w.id))
    s.mediums.push_back({std::string(m.medium), m.blocks});
  s.events_by_type = w.events_by_type;
  for (uint64_t n : w.events_by_type) s.events += n;
  s.gaps = w.gaps;
  s.replays_ok = w.replays_ok;
  s.replays_failed = w.replays_failed;
  s.dropped_blocks = w.dropped_blocks;
  s.unknown_fields = w.unknown_fields;
  s.clears = w.clears;
  s.last_seq = w.last_seq;
  s.last_event_unix_ms = w.last_event_unix_ms;
  s.lag_ms = w.LagMs(absl::ToUnixNanos(now));
  s.event_version = w.event_version;
  for (int g = 0; g < kMaxGroups; ++g) {
    if (w.groups[static_cast<size_t>(g)].kind != GroupKind::kNone)
      s.groups.push_back({g, w.groups[static_cast<size_t>(g)]});
  }
  return s;
}

IndexStats FleetIndex::Stats() const {
  const absl::Time now = absl::Now();
  IndexStats stats;
  ReaderMutexLock lock(&mu_);
  for (WorkerId id = 0; id < workers_.size(); ++id) {
    const WorkerRecord& w = workers_.Get(id);
    if (!w.retired) stats.workers.push_back(StatusOf(w, now));
  }
  std::sort(stats.workers.begin(), stats.workers.end(),
            [](const WorkerStatus& a, const WorkerStatus& b) {
              return a.worker < b.worker;
            });
  stats.entries = tree_.entries();
  stats.max_entries = options_.max_entries;
  const HolderTree::Sizes sizes = tree_.sizes();
  stats.blocks = sizes.blocks;
  stats.nodes = sizes.nodes;
  stats.engine_hashes = sizes.engine_hashes;
  stats.dropped = workers_.dropped();
  return stats;
}

absl::Status FleetIndex::CheckInvariants() const {
  ReaderMutexLock lock(&mu_);
  return tree_.CheckInvariants();
}

}  // namespace prefixd
