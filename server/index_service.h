// The PrefixIndex gRPC service (docs/index.md): Route, RouteBatch,
// ListWorkers, Pick and PickBatch over the fleet index, on the daemon's
// listeners. Translates proto <-> index/ and checks who may ask; the index
// logic lives in index/.
//
// Who may call (docs/security.md): with auth off, anyone who reaches the
// listeners; otherwise ENGINE and ADMIN principals, and TENANT principals
// for Route and Pick only, with a cache_salt from their configured
// cache_salts.
#ifndef PREFIXD_SERVER_INDEX_SERVICE_H_
#define PREFIXD_SERVER_INDEX_SERVICE_H_

#include "absl/status/status.h"
#include "core/cache.h"
#include "index/kv_index.h"
#include "index/picker.h"
#include "prefixd/v1/prefix_index.grpc.pb.h"
#include "server/arena_allocator.h"
#include "server/auth.h"
#include "server/route_limits.h"
#include "server/service.h"

namespace prefixd {

// Thread safety: handlers run concurrently; the index is thread-safe.
// `index`, `picker`, `auth` and `observer` (nullable) must outlive the
// service.
class PrefixIndexService final : public v1::PrefixIndex::CallbackService {
 public:
  PrefixIndexService(const KvIndex* index, Picker* picker,
                     const Authorizer* auth, CacheLimits limits,
                     RouteLimits route_limits, RpcObserver* observer);

  grpc::ServerUnaryReactor* Route(grpc::CallbackServerContext* ctx,
                                  const v1::RouteRequest* req,
                                  v1::RouteResponse* resp) override;
  grpc::ServerUnaryReactor* RouteBatch(grpc::CallbackServerContext* ctx,
                                       const v1::RouteBatchRequest* req,
                                       v1::RouteBatchResponse* resp) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const v1::ListWorkersRequest* req,
                                        v1::ListWorkersResponse* resp) override;
  grpc::ServerUnaryReactor* Pick(grpc::CallbackServerContext* ctx,
                                 const v1::PickRequest* req,
                                 v1::PickResponse* resp) override;
  grpc::ServerUnaryReactor* PickBatch(grpc::CallbackServerContext* ctx,
                                      const v1::PickBatchRequest* req,
                                      v1::PickBatchResponse* resp) override;

 private:
  absl::Status DoRoute(const CallContext& call, const v1::RouteRequest& req,
                       int item, v1::RouteResponse* resp) const;
  absl::Status DoPick(const CallContext& call, const v1::PickRequest& req,
                      int item, v1::PickResponse* resp) const;

  const KvIndex* const index_;
  Picker* const picker_;
  const Authorizer* const auth_;
  const CacheLimits limits_;
  const RouteLimits route_limits_;
  RpcObserver* const observer_;
  // Route's answers list every worker: on an arena, building and freeing
  // them costs no malloc (docs/performance.md, Fleet index).
  ArenaAllocator<v1::RouteRequest, v1::RouteResponse, kUnaryBlock>
      route_messages_;
  ArenaAllocator<v1::RouteBatchRequest, v1::RouteBatchResponse, kBatchBlock>
      route_batch_messages_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_INDEX_SERVICE_H_
