// kv_indexer.v1 requests read and checked into ExternalKv's terms
// (index/external_kv.h). Each reader refuses bad input with a status that
// names the field and the numbers, before anything changes:
// INVALID_ARGUMENT for a malformed or oversized request, except a
// MatchExternalKvPrefix longer than the prompt limit, which is OUT_OF_RANGE
// (sgl-router routes without cache affinity on that code instead of
// failing the request).
//
// Limits (docs/index.md, "As sgl-router's KV indexer"): the hashes of one
// ApplyExternalKvBatch, MatchExternalKv or GetExternalKvHitCounts:
// max_block_ids_per_request; of one ReplaceExternalKvSnapshot or
// MatchExternalKvPrefix: max_tokens_per_request (a page holds a token at
// least); actions per batch: kMaxActions; workers per
// ConfigureExpectedWorkers: kMaxExpectedWorkers; worker ids, addresses and
// epochs: index/wire_names.h (256 bytes of UTF-8, no control characters).
//
// Thread safety: plain functions. What they return views the request, which
// must outlive it.
#ifndef PREFIXD_SERVER_KV_INDEXER_REQUEST_H_
#define PREFIXD_SERVER_KV_INDEXER_REQUEST_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/cache_types.h"
#include "index/external_kv.h"
#include "kv_indexer/v1/kv_indexer.pb.h"

namespace prefixd {

inline constexpr size_t kMaxActions = 4096;
inline constexpr size_t kMaxExpectedWorkers = 4096;

namespace kvi = ::kv_indexer::v1;

absl::StatusOr<ExternalBatch> ReadApplyRequest(
    const kvi::ApplyExternalKvBatchRequest& req, const CacheLimits& limits);
absl::StatusOr<ExternalSnapshot> ReadSnapshotRequest(
    const kvi::ReplaceExternalKvSnapshotRequest& req,
    const CacheLimits& limits);
absl::StatusOr<std::vector<ExpectedWorker>> ReadExpectedWorkers(
    const kvi::ConfigureExpectedWorkersRequest& req);
// The worker to forget.
absl::StatusOr<absl::string_view> ReadInvalidateRequest(
    const kvi::InvalidateWorkerRequest& req);
// The hashes to consider: max_blocks of them at most.
absl::StatusOr<absl::Span<const EngineHash>> ReadPrefixRequest(
    const kvi::MatchExternalKvPrefixRequest& req, const CacheLimits& limits);
// MatchExternalKv's and GetExternalKvHitCounts' hashes.
absl::StatusOr<absl::Span<const EngineHash>> ReadHashList(
    const google::protobuf::RepeatedField<int64_t>& hashes,
    const CacheLimits& limits);

// The engine hashes of an sfixed64 field, read in place (a signed and an
// unsigned integer of one size may alias).
inline absl::Span<const EngineHash> EngineHashes(
    const google::protobuf::RepeatedField<int64_t>& hashes) {
  return absl::MakeConstSpan(reinterpret_cast<const EngineHash*>(hashes.data()),
                             static_cast<size_t>(hashes.size()));
}

}  // namespace prefixd

#endif  // PREFIXD_SERVER_KV_INDEXER_REQUEST_H_
