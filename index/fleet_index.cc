#include "index/fleet_index.h"

#include <algorithm>
#include <string>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "index/keys.h"

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
      "block_size",         "removed", "reconnect"};
  return kNames[static_cast<int>(reason)];
}

FleetIndex::FleetIndex(IndexOptions options)
    : options_(options),
      tree_(options.block_size,
            KeyScheme(options.hash_profile, options.hash_seed)) {}

// --- Workers ----------------------------------------------------------------

WorkerId FleetIndex::AddWorker(absl::string_view name,
                               absl::string_view endpoint) {
  MutexLock lock(&mu_);
  const WorkerId id = workers_.Add(name, endpoint).id;
  tree_.AddWorker(id);
  return id;
}

void FleetIndex::RetireWorker(WorkerId id) {
  MutexLock lock(&mu_);
  WorkerRecord& w = workers_.Get(id);
  ClearLocked(w, ClearReason::kRemoved);
  w.retired = true;
}

void FleetIndex::SetState(WorkerId id, WorkerState state,
                          absl::string_view detail) {
  MutexLock lock(&mu_);
  WorkerRecord& w = workers_.Get(id);
  w.state = state;
  w.detail = std::string(detail);
}

void FleetIndex::CountGap(WorkerId id) {
  MutexLock lock(&mu_);
  ++workers_.Get(id).gaps;
}

void FleetIndex::CountReplay(WorkerId id, bool ok) {
  MutexLock lock(&mu_);
  WorkerRecord& w = workers_.Get(id);
  ++(ok ? w.replays_ok : w.replays_failed);
}

void FleetIndex::SetLastSeq(WorkerId id, int64_t seq) {
  MutexLock lock(&mu_);
  workers_.Get(id).last_seq = seq;
}

void FleetIndex::SetLabels(WorkerId id, const WorkerLabels& labels) {
  MutexLock lock(&mu_);
  workers_.Get(id).labels = labels;
  if (labels.hashes_are_keys) tree_.EnableKeyLookup();
}

void FleetIndex::SetGroupRules(WorkerId id,
                               const std::array<GroupRule, kMaxGroups>& rules) {
  MutexLock lock(&mu_);
  WorkerRecord& w = workers_.Get(id);
  w.groups = rules;
  hybrid_.Set(id, w.groups);
}

void FleetIndex::ApplyHashes(WorkerId id,
                             absl::Span<const HashUpdate> updates) {
  MutexLock lock(&mu_);
  WorkerRecord& w = workers_.Get(id);
  const uint64_t stamp = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  for (const HashUpdate& u : updates) {
    if (u.op == HashUpdate::Op::kClearTier) {
      tree_.ClearTier(id, u.medium);
      continue;
    }
    for (int g = 0; g < kMaxGroups; ++g) {
      if ((u.groups >> g & 1) == 0) continue;
      if (u.op == HashUpdate::Op::kReport) {
        tree_.StoreHashes(id, u.hashes, g, u.medium, stamp);
      } else {
        BlockRemovedEvent ev;
        ev.block_hashes.assign(u.hashes.begin(), u.hashes.end());
        ev.medium = u.medium;
        ev.group_idx = g;
        tree_.Remove(id, ev);
      }
    }
  }
  if (w.state != WorkerState::kLive) {
    w.state = WorkerState::kLive;
    w.detail.clear();
  }
  Trim();
}

void FleetIndex::ClearWorker(WorkerId id, ClearReason reason,
                             absl::string_view detail) {
  MutexLock lock(&mu_);
  WorkerRecord& w = workers_.Get(id);
  ClearLocked(w, reason);
  w.state = WorkerState::kConnecting;
  w.detail = std::string(detail);
  w.last_error = absl::StrCat(ClearReasonName(reason), ": ", detail);
  w.last_seq = -1;
}

void FleetIndex::ClearLocked(WorkerRecord& w, ClearReason reason) {
  ++w.clears[static_cast<int>(reason)];
  tree_.Clear(w.id);
}

// --- Apply ------------------------------------------------------------------

bool FleetIndex::RejectBlockSize(WorkerRecord& w, const KvEventBatch& batch) {
  const BlockStoredEvent* wrong = nullptr;
  uint64_t blocks = 0;
  for (const KvEvent& e : batch.events) {
    const auto* st = std::get_if<BlockStoredEvent>(&e);
    if (st == nullptr) continue;
    blocks += st->block_hashes.size();
    if (wrong == nullptr && st->group_idx == 0 &&
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
  MutexLock lock(&mu_);
  WorkerRecord& w = workers_.Get(id);
  w.last_seq = seq;
  w.last_event_unix_ms = absl::ToUnixMillis(now);
  w.last_ts = batch.ts;
  w.events_by_type[3] += batch.unknown_events;
  w.unknown_fields += batch.unknown_fields;
  if (RejectBlockSize(w, batch)) return;

  const uint64_t stamp = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  DropCounts drops = {};
  for (const KvEvent& e : batch.events) {
    if (const auto* st = std::get_if<BlockStoredEvent>(&e)) {
      ++w.events_by_type[0];
      StoreLocked(w, *st, stamp, &drops);
    } else if (const auto* rm = std::get_if<BlockRemovedEvent>(&e)) {
      ++w.events_by_type[1];
      w.event_version = std::max(w.event_version, rm->event_version);
      tree_.Remove(id, *rm);
    } else {
      ++w.events_by_type[2];
      ClearLocked(w, ClearReason::kAllBlocksCleared);
    }
  }
  workers_.CountDrops(id, drops);
  if (w.state != WorkerState::kLive) {
    w.state = WorkerState::kLive;
    w.detail.clear();
  }
  Trim();
}

void FleetIndex::StoreLocked(WorkerRecord& w, const BlockStoredEvent& ev,
                             uint64_t stamp, DropCounts* drops) {
  w.event_version = std::max(w.event_version, ev.event_version);
  const int64_t g = ev.group_idx;
  DropReason reason;
  if (g < 0 || g >= kMaxGroups) {
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
      tree_.Store(w.id, ev, defaults, stamp, drops);
      return;
    }
  }
  (*drops)[static_cast<int>(reason)] += ev.block_hashes.size();
}

// A group is indexed once a store has declared its kind (group 0 is full
// attention unless declared otherwise, as every engine without hybrid
// groups has it). Older engines send group_idx without a kind: their
// other groups are skipped, and routing follows group 0 alone.
void FleetIndex::LearnGroup(WorkerRecord& w, const BlockStoredEvent& ev) {
  if (ev.kv_cache_spec_kind.empty()) return;
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

void FleetIndex::Trim() {
  // Called back under mu_ (held by Trim's caller): the analysis does not
  // follow a lock into a lambda, so the lambda says so.
  const uint64_t blocks = tree_.Trim(
      options_.max_entries, [&](WorkerId w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        ++workers_.Get(w).dropped_blocks;
      });
  workers_.CountTrimmed(blocks);
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
  ReaderMutexLock lock(&mu_);
  tree_.Score(prompt, ns, workers_.size(), hybrid_,
              clock_.fetch_add(1, std::memory_order_relaxed) + 1, &scores);
  return Assemble(q.filter, scores, now);
}

RouteResult FleetIndex::RouteEngineHashes(absl::Span<const EngineHash> hashes,
                                          const WorkerFilter& filter) const {
  const absl::Time now = absl::Now();
  RouteScores scores;
  ReaderMutexLock lock(&mu_);
  tree_.ScoreEngineHashes(hashes, workers_.size(), hybrid_, &scores);
  return Assemble(filter, scores, now);
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

// The workers asked for (by default those with a matched block), most
// matched blocks first, then by name: sorted as
// (blocks, worker) pairs, then written out in order, which is cheaper than
// sorting the answers themselves.
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

RouteResult FleetIndex::Assemble(const WorkerFilter& filter,
                                 const RouteScores& scores,
                                 absl::Time now) const {
  struct Scored {
    uint32_t blocks;
    const WorkerRecord* worker;
  };
  absl::InlinedVector<Scored, 32> order;
  const bool unmatched = filter.all_workers || !filter.workers.empty();
  const size_t num_workers = workers_.size();
  for (WorkerId id = 0; id < num_workers; ++id) {
    const uint32_t blocks = scores.Usable(id);
    if (blocks == 0 && !unmatched) continue;
    const WorkerRecord& w = workers_.Get(id);
    if (!Passes(filter, w)) continue;
    order.push_back({blocks, &w});
  }
  std::sort(order.begin(), order.end(), [](const Scored& a, const Scored& b) {
    if (a.blocks != b.blocks) return a.blocks > b.blocks;
    return a.worker->name < b.worker->name;
  });
  RouteResult result;
  result.prompt_blocks = scores.prompt_blocks;
  result.workers.resize(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const WorkerRecord& w = *order[i].worker;
    WorkerMatch& m = result.workers[i];
    m.worker = w.name;
    m.matched_blocks = order[i].blocks;
    m.full_attention_blocks = scores.FullAttention(w.id);
    for (size_t k = 0; k < scores.num_mediums; ++k) {
      const uint32_t held = scores.InMedium(w.id, k);
      if (held > 0) m.mediums.push_back({tree_.MediumName(k), held});
    }
    m.state = w.state;
    m.last_seq = w.last_seq;
    m.lag_ms = w.LagMs(now);
    m.labels = &w.labels;
  }
  for (const WorkerMatch& m : result.workers) {
    if (m.matched_blocks == 0) break;
    if (m.state == WorkerState::kLive) {
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
  s.lag_ms = w.LagMs(now);
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
  stats.blocks = tree_.blocks();
  stats.nodes = tree_.nodes();
  stats.engine_hashes = tree_.engine_hashes();
  stats.dropped = workers_.dropped();
  return stats;
}

uint64_t FleetIndex::entries() const {
  ReaderMutexLock lock(&mu_);
  return tree_.entries();
}

absl::Status FleetIndex::CheckInvariants() const {
  ReaderMutexLock lock(&mu_);
  return tree_.CheckInvariants();
}

}  // namespace prefixd
