#include "index/external_kv.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace prefixd {
namespace {

constexpr absl::string_view kEndpoint = "kv_indexer";

// The worker of that name in `stats` (which lists them by name), or null.
const WorkerStatus* Listed(const IndexStats& stats, absl::string_view name) {
  auto it = std::lower_bound(
      stats.workers.begin(), stats.workers.end(), name,
      [](const WorkerStatus& w, absl::string_view n) { return w.worker < n; });
  return it != stats.workers.end() && it->worker == name ? &*it : nullptr;
}

// Legacy reports (no mask, or mask 0) hold the whole block: FULL.
uint32_t GroupsOfMask(uint32_t mask) {
  return mask == 0 ? kComponentFull : mask & kAllComponents;
}

void AddUpdate(HashUpdate::Op op, absl::string_view medium, uint32_t groups,
               absl::Span<const EngineHash> hashes,
               std::vector<HashUpdate>* out) {
  HashUpdate u;
  u.op = op;
  u.medium = std::string(medium);
  u.groups = groups;
  u.hashes = hashes;
  out->push_back(std::move(u));
}

void AddUpdate(HashUpdate::Op op, int tier, uint32_t groups,
               absl::Span<const EngineHash> hashes,
               std::vector<HashUpdate>* out) {
  AddUpdate(op, TierMedium(tier), groups, hashes, out);
}

// One REPORT with per-hash masks: each run of equal masks replaces what the
// worker held of those hashes at the tier.
void AddMaskedReport(const ExternalAction& a, std::vector<HashUpdate>* out) {
  size_t start = 0;
  while (start < a.hashes.size()) {
    const uint32_t groups = GroupsOfMask(a.component_masks[start]);
    size_t end = start + 1;
    while (end < a.hashes.size() &&
           GroupsOfMask(a.component_masks[end]) == groups) {
      ++end;
    }
    AddComponentUpdates(TierMedium(a.tier), groups, kAllComponents & ~groups,
                        a.hashes.subspan(start, end - start), out);
    start = end;
  }
}

// The page size a batch's block_sizes say, or 0.
uint32_t PageTokensOf(absl::Span<const ExternalAction> actions) {
  for (const ExternalAction& a : actions) {
    for (uint32_t b : a.block_sizes) {
      if (b > 0) return b;
    }
  }
  return 0;
}

}  // namespace

void AddComponentUpdates(absl::string_view medium, uint32_t report,
                         uint32_t revoke, absl::Span<const EngineHash> hashes,
                         std::vector<HashUpdate>* out) {
  if (report != 0) {
    AddUpdate(HashUpdate::Op::kReport, medium, report, hashes, out);
  }
  if (revoke != 0) {
    AddUpdate(HashUpdate::Op::kRevoke, medium, revoke, hashes, out);
  }
}

absl::string_view TierMedium(int tier) {
  switch (tier) {
    case kTierDram:
      return "CPU";
    case kTierSsd:
      return "DISK";
    default:
      return "GPU";
  }
}

int MediumTier(absl::string_view medium) {
  if (medium == "GPU") return kTierHbm;
  if (medium == "CPU") return kTierDram;
  if (medium == "DISK") return kTierSsd;
  return 0;
}

std::array<GroupRule, kMaxGroups> RulesForSpec(const CacheSpec& spec,
                                               uint32_t page_tokens) {
  std::array<GroupRule, kMaxGroups> rules{};
  rules[0].kind = GroupKind::kFull;
  if ((spec.components & kComponentSwa) != 0) {
    rules[1].kind = GroupKind::kSlidingWindow;
    rules[1].window_blocks = std::max<uint32_t>(
        1, (spec.swa_window_tokens + page_tokens - 1) / page_tokens);
  }
  if ((spec.components & kComponentMamba) != 0) {
    rules[2].kind = GroupKind::kState;
  }
  return rules;
}

std::vector<HashUpdate> HashUpdatesOf(
    absl::Span<const ExternalAction> actions) {
  std::vector<HashUpdate> out;
  out.reserve(actions.size());
  for (const ExternalAction& a : actions) {
    switch (a.op) {
      case HashUpdate::Op::kClearTier:
        AddUpdate(a.op, a.tier, kAllComponents, {}, &out);
        break;
      case HashUpdate::Op::kRevoke:
        AddUpdate(a.op, a.tier, kAllComponents, a.hashes, &out);
        break;
      case HashUpdate::Op::kReport:
        if (a.component_masks.empty()) {
          AddUpdate(a.op, a.tier, kComponentFull, a.hashes, &out);
        } else {
          AddMaskedReport(a, &out);
        }
        break;
    }
  }
  return out;
}

namespace {

// 128 random bits, in hex.
std::string NewEpoch() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

}  // namespace

ExternalKv::ExternalKv(KvIndex* index, Options options)
    : index_(index), options_(options), epoch_(NewEpoch()) {}

ExternalKv::Stream& ExternalKv::StreamAt(absl::string_view worker_id,
                                         absl::string_view address) {
  auto it = streams_.find(worker_id);
  if (it != streams_.end()) {
    if (const auto endpoint = index_->SetAddress(it->second.id, address)) {
      // A source that follows it now (a registration after a retirement)
      // makes it the source's.
      if (*endpoint != kEndpoint) it->second.owned = false;
      return it->second;
    }
    streams_.erase(it);  // retired since
  }
  Stream& s = NewStream(worker_id);
  index_->SetAddress(s.id, address);
  return s;
}

ExternalKv::Stream& ExternalKv::NewStream(absl::string_view worker_id) {
  Stream s;
  // A worker the index already follows keeps its labels; only the address
  // is ours to set.
  const std::optional<std::string> endpoint = index_->EndpointOf(worker_id);
  s.owned = !endpoint.has_value();
  s.id = index_->AddWorker(worker_id, s.owned ? kEndpoint : *endpoint);
  return streams_.emplace(std::string(worker_id), std::move(s)).first->second;
}

void ExternalKv::SetSpec(Stream& s, const std::optional<CacheSpec>& spec,
                         absl::Span<const ExternalAction> actions) {
  const uint32_t page = PageTokensOf(actions);
  const bool page_changed = page != 0 && page != s.page_tokens;
  if (page != 0) s.page_tokens = page;
  // A ZeroMQ-fed worker learns its groups from its events: only a spec
  // given here replaces them.
  if (!s.owned && !spec.has_value()) return;
  if (spec == s.spec && !page_changed) return;
  s.spec = spec;
  const uint32_t tokens =
      s.page_tokens != 0 ? s.page_tokens
                         : static_cast<uint32_t>(index_->options().block_size);
  index_->SetGroupRules(s.id, RulesForSpec(spec.value_or(CacheSpec{}), tokens));
}

absl::Status ExternalKv::CheckStream(Stream& s, const ExternalBatch& batch,
                                     bool* duplicate) {
  if (!batch.epoch.empty() && !s.epoch.empty() && batch.epoch != s.epoch) {
    const std::string detail =
        absl::StrCat("worker_epoch \"", batch.epoch, "\" after \"", s.epoch,
                     "\": the worker restarted");
    index_->ClearWorker(s.id, ClearReason::kRestart, detail);
    s.has_seq = false;
    s.needs_snapshot = batch.enforce_sequence;
    s.epoch = std::string(batch.epoch);
    if (batch.enforce_sequence) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker \"", batch.worker_id, "\": ", detail,
          "; what it held is cleared and its batches are refused until "
          "ReplaceExternalKvSnapshot installs a snapshot of epoch \"",
          batch.epoch, "\""));
    }
  }
  if (!batch.epoch.empty()) s.epoch = std::string(batch.epoch);
  if (!batch.enforce_sequence) return absl::OkStatus();
  if (s.needs_snapshot) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker \"", batch.worker_id, "\": seq ", batch.seq,
        " refused: the worker lost a batch or restarted and is cleared until "
        "ReplaceExternalKvSnapshot installs a snapshot"));
  }
  if (!s.has_seq) return absl::OkStatus();  // the stream starts here
  if (batch.seq <= s.applied_seq) {
    *duplicate = true;
    return absl::OkStatus();
  }
  if (batch.seq == s.applied_seq + 1) return absl::OkStatus();
  const std::string detail = absl::StrCat(
      "seq ", batch.seq, " after applied_seq ", s.applied_seq, ": batches ",
      s.applied_seq + 1, "..", batch.seq - 1, " are missing");
  index_->ClearWorker(s.id, ClearReason::kReplayFailed, detail);
  s.needs_snapshot = true;
  s.has_seq = false;
  return absl::FailedPreconditionError(absl::StrCat(
      "worker \"", batch.worker_id, "\": ", detail,
      "; what it held is cleared and its batches are refused until "
      "ReplaceExternalKvSnapshot installs a snapshot"));
}

absl::StatusOr<ApplyOutcome> ExternalKv::Apply(const ExternalBatch& batch) {
  MutexLock lock(&mu_);
  Stream& s = StreamAt(batch.worker_id, batch.address);
  ApplyOutcome out;
  RETURN_IF_ERROR(CheckStream(s, batch, &out.duplicate));
  if (out.duplicate) {
    out.applied_seq = s.applied_seq;
    return out;
  }
  SetSpec(s, batch.spec, batch.actions);
  const std::vector<HashUpdate> updates = HashUpdatesOf(batch.actions);
  index_->ApplyHashes(s.id, updates);
  s.has_seq = true;
  s.applied_seq = batch.seq;
  out.applied_seq = batch.seq;
  return out;
}

uint64_t ExternalKv::ReplaceSnapshot(const ExternalSnapshot& snapshot) {
  MutexLock lock(&mu_);
  Stream& s = StreamAt(snapshot.worker_id, snapshot.address);
  SetSpec(s, snapshot.spec, snapshot.tiers);
  std::vector<HashUpdate> updates;
  for (int tier : {kTierHbm, kTierDram, kTierSsd}) {
    AddUpdate(HashUpdate::Op::kClearTier, tier, kAllComponents, {}, &updates);
  }
  std::vector<HashUpdate> reports = HashUpdatesOf(snapshot.tiers);
  std::move(reports.begin(), reports.end(), std::back_inserter(updates));
  index_->ApplyHashes(s.id, updates);
  s.epoch = std::string(snapshot.epoch);
  s.has_seq = true;
  s.applied_seq = snapshot.applied_seq;
  s.needs_snapshot = false;
  return s.applied_seq;
}

ExpectedCounts ExternalKv::ConfigureExpected(
    absl::Span<const ExpectedWorker> workers) {
  MutexLock lock(&mu_);
  absl::flat_hash_set<absl::string_view> wanted;
  for (const ExpectedWorker& w : workers) {
    wanted.insert(w.worker_id);
    Stream& s = StreamAt(w.worker_id, w.address);
    SetSpec(s, w.spec, {});
  }
  for (auto it = streams_.begin(); it != streams_.end();) {
    auto next = std::next(it);
    Stream& s = it->second;
    if (!wanted.contains(it->first) && s.owned) {
      // A source that follows it now (a registration after its retirement)
      // keeps it; else it goes.
      const std::optional<std::string> endpoint = index_->EndpointOf(it->first);
      if (endpoint.has_value() && *endpoint != kEndpoint) {
        s.owned = false;
      } else {
        index_->RetireWorker(s.id);
        streams_.erase(it);
      }
    }
    it = next;
  }
  std::vector<absl::string_view> names;
  names.reserve(workers.size());
  for (const ExpectedWorker& w : workers) names.push_back(w.worker_id);
  return Count(names);
}

absl::StatusOr<ExpectedCounts> ExternalKv::Invalidate(
    absl::string_view worker_id) {
  MutexLock lock(&mu_);
  auto it = streams_.find(worker_id);
  if (it == streams_.end() || !index_->EndpointOf(worker_id).has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "worker_id \"", worker_id,
        "\" is no worker of this API: no batch, snapshot or "
        "ConfigureExpectedWorkers named it since it was last removed"));
  }
  Stream& s = it->second;
  index_->ClearWorker(s.id, ClearReason::kInvalidated,
                      "InvalidateWorker: what it held is unknown until a "
                      "snapshot (or, over ZeroMQ, its next events)");
  s.has_seq = false;
  s.needs_snapshot = true;
  s.epoch.clear();
  std::vector<absl::string_view> names;
  names.reserve(streams_.size());
  for (const auto& [name, stream] : streams_) names.push_back(name);
  return Count(names);
}

ExpectedCounts ExternalKv::Count(
    const std::vector<absl::string_view>& workers) const {
  ExpectedCounts counts;
  counts.total = static_cast<uint32_t>(workers.size());
  // A worker a source follows is ready when the index has it LIVE: one
  // listing for all of them, taken only if there is one.
  std::optional<IndexStats> stats;
  for (absl::string_view name : workers) {
    const Stream& s = streams_.find(name)->second;
    if (s.owned) {
      counts.ready += s.has_seq && !s.needs_snapshot ? 1 : 0;
      continue;
    }
    if (!stats.has_value()) stats = index_->Stats();
    if (const WorkerStatus* ws = Listed(*stats, name)) {
      counts.ready += ws->state == WorkerState::kLive ? 1 : 0;
    }
  }
  return counts;
}

PrefixAnswer ExternalKv::MatchPrefix(absl::Span<const EngineHash> hashes,
                                     const WorkerFilter& filter) const {
  PrefixAnswer out;
  out.blocks_read = static_cast<uint32_t>(hashes.size());
  if (hashes.empty()) return out;
  const RouteResult r = index_->RouteEngineHashes(hashes, filter);
  for (const WorkerMatch& m : r.workers) {
    if (m.matched_blocks == 0 || m.labels->address.empty()) continue;
    out.matches.push_back(
        {m.worker, m.labels->address, static_cast<uint32_t>(m.matched_blocks)});
  }
  if (!out.matches.empty()) out.best_blocks = out.matches[0].blocks;
  return out;
}

std::vector<NodeHoldings> ExternalKv::Match(absl::Span<const EngineHash> hashes,
                                            bool count_as_hit,
                                            absl::string_view tenant) {
  std::vector<EngineHash> distinct;
  distinct.reserve(hashes.size());
  absl::flat_hash_set<EngineHash> seen;
  for (EngineHash h : hashes) {
    if (seen.insert(h).second) distinct.push_back(h);
  }
  std::vector<NodeHoldings> out;
  std::vector<EngineHash> held;
  for (const HashHolding& h : index_->HashHoldings(distinct)) {
    const int tier = MediumTier(h.medium);
    if (tier == 0) continue;
    if (!tenant.empty() && h.labels->Tenant() != tenant) continue;
    auto node = std::find_if(
        out.begin(), out.end(),
        [&](const NodeHoldings& n) { return n.worker == h.worker; });
    if (node == out.end()) {
      out.push_back({h.worker, h.labels->address, {}});
      node = out.end() - 1;
    }
    auto t =
        std::find_if(node->tiers.begin(), node->tiers.end(),
                     [&](const TierHoldings& x) { return x.tier == tier; });
    if (t == node->tiers.end()) {
      node->tiers.push_back({tier, {}, {}});
      t = node->tiers.end() - 1;
    }
    t->hashes.push_back(h.hash);
    t->component_masks.push_back(h.groups & kAllComponents);
    if (held.empty() || held.back() != h.hash) held.push_back(h.hash);
  }
  for (NodeHoldings& n : out) {
    std::sort(n.tiers.begin(), n.tiers.end(),
              [](const TierHoldings& a, const TierHoldings& b) {
                return a.tier < b.tier;
              });
  }
  if (count_as_hit) CountHits(held);
  return out;
}

void ExternalKv::CountHits(const std::vector<EngineHash>& held) {
  MutexLock lock(&hits_mu_);
  for (EngineHash h : held) {
    auto it = hits_.find(h);
    if (it != hits_.end()) {
      ++it->second;
    } else if (hits_.size() < options_.max_hit_counts) {
      hits_.emplace(h, 1);
    }
  }
}

std::vector<HitCount> ExternalKv::HitCounts(
    absl::Span<const EngineHash> hashes) const {
  std::vector<HitCount> out;
  absl::flat_hash_set<EngineHash> seen;
  ReaderMutexLock lock(&hits_mu_);
  for (EngineHash h : hashes) {
    if (!seen.insert(h).second) continue;
    auto it = hits_.find(h);
    if (it != hits_.end()) out.push_back({h, it->second});
  }
  return out;
}

}  // namespace prefixd
