#include "server/kv_indexer_service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/kv_indexer_request.h"
#include "server/kv_indexer_wire.h"
#include "server/unary_call.h"

namespace prefixd {
namespace {

absl::Status MayWrite(const CallContext& call, absl::string_view method) {
  if (call.index_write) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("principal \"", call.principal, "\" may not call ", method,
                   ": changing the index needs an ENGINE principal"));
}

// The tenant whose workers a query sees: "" (all) for engines and admins.
absl::string_view QueryTenant(const CallContext& call) {
  return call.index_all ? absl::string_view() : absl::string_view(call.tenant);
}

void TierToProto(const TierHoldings& t, kvi::TierHashes* out) {
  out->set_tier(static_cast<kvi::TierType>(t.tier));
  out->mutable_hashes()->Reserve(static_cast<int>(t.hashes.size()));
  for (EngineHash h : t.hashes) out->add_hashes(static_cast<int64_t>(h));
  for (uint32_t m : t.component_masks) out->add_component_masks(m);
  // Page sizes are not kept: 0, unknown, for each hash.
  out->mutable_block_sizes()->Resize(static_cast<int>(t.hashes.size()), 0);
}

// The request's bytes; an error rather than an empty message (which would
// read as a valid request) when gRPC cannot hand them over.
absl::StatusOr<std::string> Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (const grpc::Status s = buffer.Dump(&slices); !s.ok()) {
    return absl::InternalError(absl::StrCat("cannot read the request's ",
                                            buffer.Length(),
                                            " bytes: ", s.error_message()));
  }
  std::string out;
  out.reserve(buffer.Length());
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

void SetBytes(const std::string& bytes, grpc::ByteBuffer* out) {
  grpc::Slice slice(bytes);
  *out = grpc::ByteBuffer(&slice, 1);
}

}  // namespace

KvIndexerService::KvIndexerService(ExternalKv* kv, const Authorizer* auth,
                                   CacheLimits limits, RpcObserver* observer)
    : kv_(kv), auth_(auth), limits_(limits), observer_(observer) {}

grpc::ServerUnaryReactor* KvIndexerService::ConfigureExpectedWorkers(
    grpc::CallbackServerContext* ctx,
    const kvi::ConfigureExpectedWorkersRequest* req,
    kvi::ConfigureExpectedWorkersResponse* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "ConfigureExpectedWorkers",
      [&](const CallContext& call) -> absl::Status {
        RETURN_IF_ERROR(MayWrite(call, "ConfigureExpectedWorkers"));
        ASSIGN_OR_RETURN(std::vector<ExpectedWorker> workers,
                         ReadExpectedWorkers(*req));
        const ExpectedCounts c = kv_->ConfigureExpected(workers);
        resp->set_total_workers(c.total);
        resp->set_ready_workers(c.ready);
        resp->set_indexer_epoch(kv_->epoch());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvIndexerService::InvalidateWorker(
    grpc::CallbackServerContext* ctx, const kvi::InvalidateWorkerRequest* req,
    kvi::InvalidateWorkerResponse* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "InvalidateWorker",
      [&](const CallContext& call) -> absl::Status {
        RETURN_IF_ERROR(MayWrite(call, "InvalidateWorker"));
        ASSIGN_OR_RETURN(absl::string_view worker, ReadInvalidateRequest(*req));
        ASSIGN_OR_RETURN(const ExpectedCounts c, kv_->Invalidate(worker));
        resp->set_total_workers(c.total);
        resp->set_ready_workers(c.ready);
        resp->set_indexer_epoch(kv_->epoch());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvIndexerService::ReplaceExternalKvSnapshot(
    grpc::CallbackServerContext* ctx,
    const kvi::ReplaceExternalKvSnapshotRequest* req,
    kvi::ReplaceExternalKvSnapshotResponse* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "ReplaceExternalKvSnapshot",
      [&](const CallContext& call) -> absl::Status {
        RETURN_IF_ERROR(MayWrite(call, "ReplaceExternalKvSnapshot"));
        ASSIGN_OR_RETURN(ExternalSnapshot snapshot,
                         ReadSnapshotRequest(*req, limits_));
        resp->set_applied_seq(kv_->ReplaceSnapshot(snapshot));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvIndexerService::ApplyExternalKvBatch(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
    grpc::ByteBuffer* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "ApplyExternalKvBatch",
      [&](const CallContext& call) -> absl::Status {
        RETURN_IF_ERROR(MayWrite(call, "ApplyExternalKvBatch"));
        ASSIGN_OR_RETURN(const std::string bytes, Bytes(*req));
        kvi::ApplyExternalKvBatchRequest request;
        RETURN_IF_ERROR(DecodeApplyRequest(bytes, &request).status());
        ASSIGN_OR_RETURN(ExternalBatch batch,
                         ReadApplyRequest(request, limits_));
        ASSIGN_OR_RETURN(ApplyOutcome out, kv_->Apply(batch));
        kvi::ApplyExternalKvBatchResponse response;
        response.set_applied_seq(out.applied_seq);
        response.set_duplicate(out.duplicate);
        SetBytes(response.SerializeAsString(), resp);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvIndexerService::MatchExternalKv(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
    grpc::ByteBuffer* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "MatchExternalKv",
      [&](const CallContext& call) -> absl::Status {
        ASSIGN_OR_RETURN(const std::string bytes, Bytes(*req));
        kvi::MatchExternalKvRequest request;
        ASSIGN_OR_RETURN(const HashForm form,
                         DecodeMatchRequest(bytes, &request));
        ASSIGN_OR_RETURN(absl::Span<const EngineHash> hashes,
                         ReadHashList(request.hashes(), limits_));
        kvi::MatchExternalKvResponse response;
        for (const NodeHoldings& n :
             kv_->Match(hashes, request.count_as_hit(), QueryTenant(call))) {
          kvi::ExternalKvNodeMatch* m = response.add_matches();
          m->set_worker_id(n.worker.data(), n.worker.size());
          m->set_address(n.address.data(), n.address.size());
          for (const TierHoldings& t : n.tiers)
            TierToProto(t, m->add_hashes_by_tier());
        }
        SetBytes(EncodeMatchResponse(response, form), resp);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvIndexerService::MatchExternalKvPrefix(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
    grpc::ByteBuffer* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "MatchExternalKvPrefix",
      [&](const CallContext& call) -> absl::Status {
        ASSIGN_OR_RETURN(const std::string bytes, Bytes(*req));
        kvi::MatchExternalKvPrefixRequest request;
        RETURN_IF_ERROR(DecodePrefixRequest(bytes, &request).status());
        ASSIGN_OR_RETURN(absl::Span<const EngineHash> hashes,
                         ReadPrefixRequest(request, limits_));
        WorkerFilter filter;
        filter.tenant = QueryTenant(call);
        const PrefixAnswer a = kv_->MatchPrefix(hashes, filter);
        kvi::MatchExternalKvPrefixResponse response;
        response.mutable_matches()->Reserve(static_cast<int>(a.matches.size()));
        for (const PrefixMatch& m : a.matches) {
          kvi::ExternalKvPrefixMatch* out = response.add_matches();
          out->set_worker_address(m.address.data(), m.address.size());
          out->set_matched_prefix_blocks(m.blocks);
          out->set_worker_id(m.worker.data(), m.worker.size());
        }
        response.set_best_prefix_blocks(a.best_blocks);
        response.set_blocks_read(a.blocks_read);
        SetBytes(response.SerializeAsString(), resp);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvIndexerService::GetExternalKvHitCounts(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
    grpc::ByteBuffer* resp) {
  return UnaryCall(ctx, *auth_, observer_, "GetExternalKvHitCounts",
                   [&](const CallContext&) -> absl::Status {
                     ASSIGN_OR_RETURN(const std::string bytes, Bytes(*req));
                     kvi::GetExternalKvHitCountsRequest request;
                     ASSIGN_OR_RETURN(const HashForm form,
                                      DecodeHitCountsRequest(bytes, &request));
                     ASSIGN_OR_RETURN(absl::Span<const EngineHash> hashes,
                                      ReadHashList(request.hashes(), limits_));
                     kvi::GetExternalKvHitCountsResponse response;
                     for (const HitCount& h : kv_->HitCounts(hashes)) {
                       kvi::HitCountEntry* e = response.add_entries();
                       e->set_hash(static_cast<int64_t>(h.hash));
                       e->set_hit_count_total(h.hits);
                     }
                     SetBytes(EncodeHitCountsResponse(response, form), resp);
                     return absl::OkStatus();
                   });
}

}  // namespace prefixd
