// absl::Status -> grpc::Status. The canonical codes are numbered alike in
// both, so the code maps 1:1 and the message is kept as is.
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
