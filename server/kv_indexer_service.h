// SGLang's KV indexer service (kv_indexer.v1.KVIndexer, docs/index.md "As
// sgl-router's KV indexer") on the daemon's gRPC listeners when the fleet
// index is on. Translates proto <-> ExternalKv (index/external_kv.h),
// whose logic it holds none of, and checks who may call. sgl-router's
// packed hashes and the standalone sgl-kv-indexer's decimal ones are both
// read (server/kv_indexer_wire.h).
//
// Who may call (docs/security.md): with auth off, anyone who reaches the
// listeners. Otherwise ApplyExternalKvBatch, ReplaceExternalKvSnapshot,
// ConfigureExpectedWorkers and InvalidateWorker need an ENGINE principal; the
// queries (MatchExternalKvPrefix, MatchExternalKv, GetExternalKvHitCounts) are
// open to ENGINE and ADMIN principals over every worker, and to TENANT
// principals over the workers of their tenant.
#ifndef PREFIXD_SERVER_KV_INDEXER_SERVICE_H_
#define PREFIXD_SERVER_KV_INDEXER_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>

#include "core/cache_types.h"
#include "index/external_kv.h"
#include "kv_indexer/v1/kv_indexer.grpc.pb.h"
#include "server/auth.h"
#include "server/service.h"

namespace prefixd {

// The four RPCs whose messages carry hashes take their bytes raw: their
// hashes come in either of two forms (server/kv_indexer_wire.h), and are
// answered in the form asked.
using KvIndexerGrpc = ::kv_indexer::v1::KVIndexer;
using KvIndexerBase = KvIndexerGrpc::WithCallbackMethod_ConfigureExpectedWorkers<
    KvIndexerGrpc::WithCallbackMethod_InvalidateWorker<
        KvIndexerGrpc::WithCallbackMethod_ReplaceExternalKvSnapshot<
            KvIndexerGrpc::WithRawCallbackMethod_ApplyExternalKvBatch<
                KvIndexerGrpc::WithRawCallbackMethod_MatchExternalKv<
                    KvIndexerGrpc::WithRawCallbackMethod_MatchExternalKvPrefix<
                        KvIndexerGrpc::
                            WithRawCallbackMethod_GetExternalKvHitCounts<
                                KvIndexerGrpc::Service>>>>>>>;

// Thread safety: handlers run concurrently; ExternalKv is thread-safe.
// `kv`, `auth` and `observer` (nullable) must outlive the service.
class KvIndexerService final : public KvIndexerBase {
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
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* MatchExternalKv(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* req,
                                            grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* MatchExternalKvPrefix(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
      grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* GetExternalKvHitCounts(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
      grpc::ByteBuffer* resp) override;

 private:
  ExternalKv* const kv_;
  const Authorizer* const auth_;
  const CacheLimits limits_;
  RpcObserver* const observer_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_KV_INDEXER_SERVICE_H_
