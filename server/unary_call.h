// The one place an index RPC's absl::Status becomes its gRPC status:
// authorizes the call, runs the handler, reports to the observer and
// finishes, as PrefixCacheService::Unary does for the cache's RPCs.
//
// Thread safety: a plain function; `auth` and `observer` must be safe to
// call concurrently (they are).
#ifndef PREFIXD_SERVER_UNARY_CALL_H_
#define PREFIXD_SERVER_UNARY_CALL_H_

#include <grpcpp/server_context.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "server/auth.h"
#include "server/grpc_status.h"
#include "server/service.h"

namespace prefixd {

inline grpc::ServerUnaryReactor* UnaryCall(
    grpc::CallbackServerContext* ctx, const Authorizer& auth,
    RpcObserver* observer, absl::string_view method,
    absl::FunctionRef<absl::Status(const CallContext&)> handler) {
  const absl::Time start = absl::Now();
  absl::StatusOr<CallContext> call = auth.Authorize(*ctx);
  absl::Status status = call.ok() ? handler(*call) : call.status();
  if (observer != nullptr)
    observer->OnRpcDone(method, status.code(), absl::Now() - start);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace prefixd

#endif  // PREFIXD_SERVER_UNARY_CALL_H_
