// SGLang's KV indexer service (kv_indexer.v1.KVIndexer, docs/index.md "As
// sgl-router's KV indexer") on the daemon's gRPC listeners when the fleet
// index is on. Translates proto <-> ExternalKv (index/external_kv.h),
// whose logic it holds none of, and checks who may call.
//
// Who may call (docs/security.md): with auth off, anyone who reaches the
// listeners. Otherwise ApplyExternalKvBatch, ReplaceExternalKvSnapshot,
// ConfigureExpectedWorkers and InvalidateWorker need an ENGINE principal; the
// queries (MatchExternalKvPrefix, MatchExternalKv, GetExternalKvHitCounts) are
// open to ENGINE and ADMIN principals over every worker, and to TENANT
// principals over the workers of their tenant.
#ifndef PREFIXD_SERVER_KV_INDEXER_SERVICE_H_
#define PREFIXD_SERVER_KV_INDEXER_SERVICE_H_

#include "core/cache_types.h"
#include "index/external_kv.h"
#include "kv_indexer/v1/kv_indexer.grpc.pb.h"
#include "server/auth.h"
#include "server/service.h"

namespace prefixd {

// Thread safety: handlers run concurrently; ExternalKv is thread-safe.
// `kv`, `auth` and `observer` (nullable) must outlive the service.
class KvIndexerService final
    : public ::kv_indexer::v1::KVIndexer::CallbackService {
 public:
  KvIndexerService(ExternalKv* kv, const Authorizer* auth, CacheLimits limits,
                   RpcObserver* observer);

  grpc::ServerUnaryReactor* ConfigureExpectedWorkers(
      grpc::CallbackServerContext* ctx,
      const ::kv_indexer::v1::ConfigureExpectedWorkersRequest* req,
      ::kv_indexer::v1::ConfigureExpectedWorkersResponse* resp) override;
  grpc::ServerUnaryReactor* InvalidateWorker(
      grpc::CallbackServerContext* ctx,
      const ::kv_indexer::v1::InvalidateWorkerRequest* req,
      ::kv_indexer::v1::InvalidateWorkerResponse* resp) override;
  grpc::ServerUnaryReactor* ReplaceExternalKvSnapshot(
      grpc::CallbackServerContext* ctx,
      const ::kv_indexer::v1::ReplaceExternalKvSnapshotRequest* req,
      ::kv_indexer::v1::ReplaceExternalKvSnapshotResponse* resp) override;
  grpc::ServerUnaryReactor* ApplyExternalKvBatch(
      grpc::CallbackServerContext* ctx,
      const ::kv_indexer::v1::ApplyExternalKvBatchRequest* req,
      ::kv_indexer::v1::ApplyExternalKvBatchResponse* resp) override;
  grpc::ServerUnaryReactor* MatchExternalKv(
      grpc::CallbackServerContext* ctx,
      const ::kv_indexer::v1::MatchExternalKvRequest* req,
      ::kv_indexer::v1::MatchExternalKvResponse* resp) override;
  grpc::ServerUnaryReactor* MatchExternalKvPrefix(
      grpc::CallbackServerContext* ctx,
      const ::kv_indexer::v1::MatchExternalKvPrefixRequest* req,
      ::kv_indexer::v1::MatchExternalKvPrefixResponse* resp) override;
  grpc::ServerUnaryReactor* GetExternalKvHitCounts(
      grpc::CallbackServerContext* ctx,
      const ::kv_indexer::v1::GetExternalKvHitCountsRequest* req,
      ::kv_indexer::v1::GetExternalKvHitCountsResponse* resp) override;

 private:
  ExternalKv* const kv_;
  const Authorizer* const auth_;
  const CacheLimits limits_;
  RpcObserver* const observer_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_KV_INDEXER_SERVICE_H_
