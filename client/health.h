// grpc.health.v1.Health without its generated code: Debian ships no C++
// health stubs, and compiling our own copy of health.proto could clash with
// the server's. The two messages are one field each, so the client speaks
// the wire format directly over a generic stub.
#ifndef PREFIXD_CLIENT_HEALTH_H_
#define PREFIXD_CLIENT_HEALTH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace prefixd::client_internal {

// HealthCheckRequest{service}, serialized.
std::string EncodeHealthCheckRequest(absl::string_view service);
// HealthCheckResponse bytes -> its status. Unknown fields are skipped;
// INTERNAL for malformed bytes.
absl::StatusOr<HealthStatus> DecodeHealthCheckResponse(absl::string_view bytes);

// Health/Check. `context` carries deadline and metadata.
absl::StatusOr<HealthStatus> CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
    const std::string& service);
// Health/Watch; the stream owns `context`.
std::unique_ptr<Client::HealthStream> WatchHealth(
    const std::shared_ptr<grpc::Channel>& channel,
    std::unique_ptr<grpc::ClientContext> context, const std::string& service);

}  // namespace prefixd::client_internal

#endif  // PREFIXD_CLIENT_HEALTH_H_
