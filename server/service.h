// The PrefixCache gRPC service: translates proto <-> core and absl::Status
// -> grpc::Status, nothing more; the cache logic lives in core/.
//
// Every call first asks the Authorizer who is calling and for which tenant,
// then acts on that tenant only. Unary calls run on gRPC's callback API and
// finish inside the handler: a core call holds one tenant mutex for
// microseconds and never waits on I/O, so running it inline is cheaper than
// handing it to another thread.
#ifndef PREFIXD_SERVER_SERVICE_H_
#define PREFIXD_SERVER_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/cache.h"
#include "prefixd/v1/prefix_cache.grpc.pb.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/watch.h"

namespace prefixd {

// Sees every RPC as it ends (metrics hook). Thread safety: called
// concurrently from gRPC threads; must be cheap and must not block.
class RpcObserver {
 public:
  virtual ~RpcObserver() = default;
  // `method` is the RPC name ("Match"). WatchEvents reports when its
  // authorization fails or its stream starts (elapsed: until then).
  virtual void OnRpcDone(absl::string_view method, absl::StatusCode code,
                         absl::Duration elapsed) = 0;
};

// The facts GetInfo and Handshake report; fixed for the daemon's lifetime.
struct ServiceInfo {
  uint64_t epoch = 0;
  std::string fingerprint;  // Fingerprint(model)
  std::string
      fingerprint_text;  // FingerprintText(model), for mismatch messages
  std::string model_description;
  uint64_t bytes_per_token = 0;
  uint64_t max_message_bytes = 0;
  std::string version;

  static ServiceInfo From(const ServerConfig& config, uint64_t epoch);
};

// Thread safety: handlers run concurrently; every member they use is
// thread-safe or immutable. `cache`, `auth`, `watchers` and `observer`
// (nullable) must outlive the service.
class PrefixCacheService final : public v1::PrefixCache::CallbackService {
 public:
  PrefixCacheService(PrefixCache* cache, const Authorizer* auth,
                     EventWatchers* watchers, ServiceInfo info,
                     RpcObserver* observer);
  ~PrefixCacheService() override;

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx,
                                    const v1::GetInfoRequest* req,
                                    v1::GetInfoResponse* resp) override;
  grpc::ServerUnaryReactor* Handshake(grpc::CallbackServerContext* ctx,
                                      const v1::HandshakeRequest* req,
                                      v1::HandshakeResponse* resp) override;
  grpc::ServerUnaryReactor* Match(grpc::CallbackServerContext* ctx,
                                  const v1::MatchRequest* req,
                                  v1::MatchResponse* resp) override;
  grpc::ServerUnaryReactor* Insert(grpc::CallbackServerContext* ctx,
                                   const v1::InsertRequest* req,
                                   v1::InsertResponse* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const v1::ReleaseRequest* req,
                                    v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* KeepAlive(grpc::CallbackServerContext* ctx,
                                      const v1::KeepAliveRequest* req,
                                      v1::KeepAliveResponse* resp) override;
  grpc::ServerUnaryReactor* Evict(grpc::CallbackServerContext* ctx,
                                  const v1::EvictRequest* req,
                                  v1::EvictResponse* resp) override;
  grpc::ServerUnaryReactor* Invalidate(grpc::CallbackServerContext* ctx,
                                       const v1::InvalidateRequest* req,
                                       v1::InvalidateResponse* resp) override;
  grpc::ServerUnaryReactor* Reset(grpc::CallbackServerContext* ctx,
                                  const v1::ResetRequest* req,
                                  v1::ResetResponse* resp) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx,
                                  const v1::StatsRequest* req,
                                  v1::StatsResponse* resp) override;
  grpc::ServerWriteReactor<v1::WatchEventsResponse>* WatchEvents(
      grpc::CallbackServerContext* ctx,
      const v1::WatchEventsRequest* req) override;
  grpc::ServerUnaryReactor* Dump(grpc::CallbackServerContext* ctx,
                                 const v1::DumpRequest* req,
                                 v1::DumpResponse* resp) override;
  grpc::ServerUnaryReactor* MatchBatch(grpc::CallbackServerContext* ctx,
                                       const v1::MatchBatchRequest* req,
                                       v1::MatchBatchResponse* resp) override;
  grpc::ServerUnaryReactor* InsertBatch(grpc::CallbackServerContext* ctx,
                                        const v1::InsertBatchRequest* req,
                                        v1::InsertBatchResponse* resp) override;

 private:
  template <typename Req, typename Resp>
  using Handler = absl::Status (PrefixCacheService::*)(const CallContext&,
                                                       const Req&, Resp*);

  // Authorizes, runs `handler`, reports to the observer, finishes the call.
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Unary(absl::string_view method,
                                  grpc::CallbackServerContext* ctx,
                                  const Req* req, Resp* resp,
                                  Handler<Req, Resp> handler);

  absl::Status DoGetInfo(const CallContext& call, const v1::GetInfoRequest& req,
                         v1::GetInfoResponse* resp);
  absl::Status DoHandshake(const CallContext& call,
                           const v1::HandshakeRequest& req,
                           v1::HandshakeResponse* resp);
  absl::Status DoMatch(const CallContext& call, const v1::MatchRequest& req,
                       v1::MatchResponse* resp);
  absl::Status DoInsert(const CallContext& call, const v1::InsertRequest& req,
                        v1::InsertResponse* resp);
  absl::Status DoRelease(const CallContext& call, const v1::ReleaseRequest& req,
                         v1::ReleaseResponse* resp);
  absl::Status DoKeepAlive(const CallContext& call,
                           const v1::KeepAliveRequest& req,
                           v1::KeepAliveResponse* resp);
  absl::Status DoEvict(const CallContext& call, const v1::EvictRequest& req,
                       v1::EvictResponse* resp);
  absl::Status DoInvalidate(const CallContext& call,
                            const v1::InvalidateRequest& req,
                            v1::InvalidateResponse* resp);
  absl::Status DoReset(const CallContext& call, const v1::ResetRequest& req,
                       v1::ResetResponse* resp);
  absl::Status DoStats(const CallContext& call, const v1::StatsRequest& req,
                       v1::StatsResponse* resp);
  absl::Status DoDump(const CallContext& call, const v1::DumpRequest& req,
                      v1::DumpResponse* resp);
  // A batch's items run in core's MatchBatch/InsertBatch (one tenant lock);
  // the call fails only as a whole: auth, tenant, or the batch limits.
  absl::Status DoMatchBatch(const CallContext& call,
                            const v1::MatchBatchRequest& req,
                            v1::MatchBatchResponse* resp);
  absl::Status DoInsertBatch(const CallContext& call,
                             const v1::InsertBatchRequest& req,
                             v1::InsertBatchResponse* resp);

  PrefixCache* const cache_;
  const Authorizer* const auth_;
  EventWatchers* const watchers_;
  const ServiceInfo info_;
  RpcObserver* const observer_;
  // Arena allocation of the hot calls' messages (service.cc).
  struct Allocators;
  const std::unique_ptr<Allocators> allocators_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_SERVICE_H_
