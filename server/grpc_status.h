// absl::Status -> grpc::Status. The canonical codes are numbered alike in
// both, so the code maps 1:1 and the message is kept as is.
//
// The error idiom of server/: handlers and everything below them return
// absl::Status or absl::StatusOr and pass errors on with RETURN_IF_ERROR /
// ASSIGN_OR_RETURN (base/status_macros.h); an RPC's status becomes a
// grpc::Status only here, once, where the RPC finishes
// (PrefixCacheService::Unary and WatchEvents, the index service's Unary).
// A check is written by hand only when it does more than pass the error on:
// adds context to the message (InField, CacheConfigError), treats one code
// differently, undoes work before returning, or logs and carries on.
// tests/status_idiom_check.py holds server/ to this.
#ifndef PREFIXD_SERVER_GRPC_STATUS_H_
#define PREFIXD_SERVER_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace prefixd {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace prefixd

#endif  // PREFIXD_SERVER_GRPC_STATUS_H_
