#include "server/kv_indexer_request.h"

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "index/wire_names.h"

namespace prefixd {
namespace {

absl::Status CheckName(absl::string_view field, absl::string_view value,
                       bool required) {
  if (required && value.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is empty; name the worker"));
  }
  // The index's rule for every name off the wire (index/wire_names.h).
  return CheckWireName(field, value);
}

absl::Status CheckCount(absl::string_view what, size_t n, size_t limit,
                        absl::string_view limit_name) {
  if (n <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " has ", n,
                                                 " hashes; the limit is ",
                                                 limit, " (", limit_name, ")"));
}

absl::StatusOr<std::optional<CacheSpec>> ReadSpec(
    absl::string_view field, bool present, const kvi::WorkerCacheSpec& s) {
  if (!present) return std::optional<CacheSpec>();
  if (s.version() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".version is ", s.version(), "; this indexer reads 0 and 1"));
  }
  if (s.components() == 0 || (s.components() & ~kAllComponents) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".components is ", s.components(),
                     "; use a mask of FULL (1), SWA (2) and MAMBA (4)"));
  }
  if ((s.components() & kComponentSwa) != 0 && s.swa_window_tokens() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".swa_window_tokens is 0 with SWA in components ",
                     s.components(), "; give the window in tokens"));
  }
  return CacheSpec{s.version(),        s.components(),    s.swa_window_tokens(),
                   s.full_tier_mask(), s.swa_tier_mask(), s.mamba_tier_mask()};
}

absl::Status CheckTier(absl::string_view field, int tier) {
  if (tier >= kTierHbm && tier <= kTierSsd) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", tier,
                   "; use TIER_HBM (1), TIER_DRAM (2) or TIER_SSD (3)"));
}

// component_masks and block_sizes: empty, or one per hash.
template <typename Msg>
absl::Status CheckSideArrays(absl::string_view where, const Msg& m,
                             int hashes) {
  if (m.component_masks_size() != 0 && m.component_masks_size() != hashes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".component_masks has ", m.component_masks_size(),
        " entries; it must be empty or have one per hash (", hashes, ")"));
  }
  for (int i = 0; i < m.component_masks_size(); ++i) {
    if ((m.component_masks(i) & ~kAllComponents) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".component_masks[", i, "] is ", m.component_masks(i),
          "; use a mask of FULL (1), SWA (2) and MAMBA (4)"));
    }
  }
  if (m.block_sizes_size() != 0 && m.block_sizes_size() != hashes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".block_sizes has ", m.block_sizes_size(),
        " entries; it must be empty or have one per hash (", hashes, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExternalAction> ReadAction(int i,
                                          const kvi::ExternalKvAction& a) {
  const std::string where = absl::StrCat("actions[", i, "]");
  ExternalAction out;
  switch (a.type()) {
    case kvi::ACTION_REPORT:
      out.op = HashUpdate::Op::kReport;
      break;
    case kvi::ACTION_REVOKE:
      out.op = HashUpdate::Op::kRevoke;
      break;
    case kvi::ACTION_CLEAR_ALL_AT_TIER:
      out.op = HashUpdate::Op::kClearTier;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".type is ", static_cast<int>(a.type()),
                       "; use ACTION_REPORT (1), ACTION_REVOKE (2) or "
                       "ACTION_CLEAR_ALL_AT_TIER (3)"));
  }
  RETURN_IF_ERROR(CheckTier(absl::StrCat(where, ".tier"), a.tier()));
  out.tier = a.tier();
  if (out.op == HashUpdate::Op::kClearTier) return out;
  if (a.hashes().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".hashes is empty; a REPORT or REVOKE names its hashes"));
  }
  RETURN_IF_ERROR(CheckSideArrays(where, a, a.hashes_size()));
  out.hashes = EngineHashes(a.hashes());
  if (out.op == HashUpdate::Op::kReport) {
    out.component_masks = absl::MakeConstSpan(a.component_masks().data(),
                                              a.component_masks_size());
    out.block_sizes =
        absl::MakeConstSpan(a.block_sizes().data(), a.block_sizes_size());
  }
  return out;
}

}  // namespace

absl::StatusOr<ExternalBatch> ReadApplyRequest(
    const kvi::ApplyExternalKvBatchRequest& req, const CacheLimits& limits) {
  RETURN_IF_ERROR(CheckName("worker_id", req.worker_id(), true));
  RETURN_IF_ERROR(CheckName("worker_address", req.worker_address(), false));
  RETURN_IF_ERROR(CheckName("worker_epoch", req.worker_epoch(), false));
  if (static_cast<size_t>(req.actions_size()) > kMaxActions) {
    return absl::InvalidArgumentError(
        absl::StrCat("actions has ", req.actions_size(),
                     " entries; the limit is ", kMaxActions));
  }
  size_t total = 0;
  for (const kvi::ExternalKvAction& a : req.actions())
    total += static_cast<size_t>(a.hashes_size());
  RETURN_IF_ERROR(CheckCount("the batch", total,
                             limits.max_block_ids_per_request,
                             "max_block_ids_per_request"));
  ExternalBatch out;
  out.worker_id = req.worker_id();
  out.seq = req.seq();
  out.address = req.worker_address();
  out.epoch = req.worker_epoch();
  out.enforce_sequence = req.enforce_sequence();
  ASSIGN_OR_RETURN(
      out.spec, ReadSpec("cache_spec", req.has_cache_spec(), req.cache_spec()));
  out.actions.reserve(static_cast<size_t>(req.actions_size()));
  for (int i = 0; i < req.actions_size(); ++i) {
    ASSIGN_OR_RETURN(ExternalAction a, ReadAction(i, req.actions(i)));
    out.actions.push_back(a);
  }
  return out;
}

absl::StatusOr<ExternalSnapshot> ReadSnapshotRequest(
    const kvi::ReplaceExternalKvSnapshotRequest& req,
    const CacheLimits& limits) {
  RETURN_IF_ERROR(CheckName("worker_id", req.worker_id(), true));
  RETURN_IF_ERROR(CheckName("worker_address", req.worker_address(), false));
  RETURN_IF_ERROR(CheckName("worker_epoch", req.worker_epoch(), false));
  size_t total = 0;
  for (const kvi::TierHashes& t : req.hashes_by_tier())
    total += static_cast<size_t>(t.hashes_size());
  RETURN_IF_ERROR(CheckCount("the snapshot", total,
                             limits.max_tokens_per_request,
                             "max_tokens_per_request"));
  ExternalSnapshot out;
  out.worker_id = req.worker_id();
  out.address = req.worker_address();
  out.epoch = req.worker_epoch();
  out.applied_seq = req.applied_seq();
  ASSIGN_OR_RETURN(
      out.spec, ReadSpec("cache_spec", req.has_cache_spec(), req.cache_spec()));
  for (int i = 0; i < req.hashes_by_tier_size(); ++i) {
    const kvi::TierHashes& t = req.hashes_by_tier(i);
    const std::string where = absl::StrCat("hashes_by_tier[", i, "]");
    RETURN_IF_ERROR(CheckTier(absl::StrCat(where, ".tier"), t.tier()));
    RETURN_IF_ERROR(CheckSideArrays(where, t, t.hashes_size()));
    out.tiers.push_back(
        {HashUpdate::Op::kReport, t.tier(), EngineHashes(t.hashes()),
         absl::MakeConstSpan(t.component_masks().data(),
                             t.component_masks_size()),
         absl::MakeConstSpan(t.block_sizes().data(), t.block_sizes_size())});
  }
  return out;
}

absl::StatusOr<std::vector<ExpectedWorker>> ReadExpectedWorkers(
    const kvi::ConfigureExpectedWorkersRequest& req) {
  if (static_cast<size_t>(req.workers_size()) > kMaxExpectedWorkers) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers has ", req.workers_size(),
                     " entries; the limit is ", kMaxExpectedWorkers));
  }
  std::vector<ExpectedWorker> out;
  absl::flat_hash_set<absl::string_view> seen;
  for (int i = 0; i < req.workers_size(); ++i) {
    const kvi::ExpectedWorker& w = req.workers(i);
    const std::string where = absl::StrCat("workers[", i, "]");
    RETURN_IF_ERROR(
        CheckName(absl::StrCat(where, ".worker_id"), w.worker_id(), true));
    RETURN_IF_ERROR(CheckName(absl::StrCat(where, ".worker_address"),
                              w.worker_address(), false));
    if (!seen.insert(w.worker_id()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".worker_id \"", w.worker_id(), "\" is listed twice"));
    }
    ASSIGN_OR_RETURN(std::optional<CacheSpec> spec,
                     ReadSpec(absl::StrCat(where, ".cache_spec"),
                              w.has_cache_spec(), w.cache_spec()));
    out.push_back({w.worker_id(), w.worker_address(), spec});
  }
  return out;
}

absl::StatusOr<absl::string_view> ReadInvalidateRequest(
    const kvi::InvalidateWorkerRequest& req) {
  RETURN_IF_ERROR(CheckName("worker_id", req.worker_id(), true));
  return absl::string_view(req.worker_id());
}

absl::StatusOr<absl::Span<const EngineHash>> ReadPrefixRequest(
    const kvi::MatchExternalKvPrefixRequest& req, const CacheLimits& limits) {
  if (req.hashes().empty()) {
    return absl::InvalidArgumentError(
        "hashes is empty; send the prompt's page hashes in order");
  }
  const size_t n = static_cast<size_t>(req.hashes_size());
  if (n > limits.max_tokens_per_request) {
    return absl::OutOfRangeError(absl::StrCat(
        "hashes has ", n, " hashes; the limit is ",
        limits.max_tokens_per_request, " (max_tokens_per_request)"));
  }
  absl::Span<const EngineHash> hashes = EngineHashes(req.hashes());
  if (req.max_blocks() != 0)
    hashes = hashes.first(std::min<size_t>(n, req.max_blocks()));
  return hashes;
}

absl::StatusOr<absl::Span<const EngineHash>> ReadHashList(
    const google::protobuf::RepeatedField<int64_t>& hashes,
    const CacheLimits& limits) {
  if (hashes.empty()) {
    return absl::InvalidArgumentError("hashes is empty; name at least one");
  }
  RETURN_IF_ERROR(CheckCount("hashes", static_cast<size_t>(hashes.size()),
                             limits.max_block_ids_per_request,
                             "max_block_ids_per_request"));
  return EngineHashes(hashes);
}

}  // namespace prefixd
