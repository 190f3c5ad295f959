#include "server/auth.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include "absl/strings/str_cat.h"

namespace prefixd {

std::shared_ptr<grpc::ServerCredentials> Authorizer::Credentials(
    const ListenAddress& /*address*/) const {
  return grpc::InsecureServerCredentials();
}

absl::StatusOr<CallContext> NoAuthAuthorizer::Authorize(
    const grpc::CallbackServerContext& context) const {
  absl::StatusOr<std::string> tenant =
      SingleMetadataValue(context, kTenantHeader);
  if (!tenant.ok()) return tenant.status();
  if (tenant->empty()) *tenant = kDefaultTenant;
  CallContext call;
  call.principal = "anonymous";
  call.tenant = *std::move(tenant);
  call.scope = TenantScope::All();
  call.all_tenants = true;
  return call;
}

absl::StatusOr<std::unique_ptr<Authorizer>> MakeAuthorizer(
    const v1::Config& config) {
  switch (config.auth().mode()) {
    case v1::AuthConfig::MODE_UNSPECIFIED:
    case v1::AuthConfig::NONE:
      return std::make_unique<NoAuthAuthorizer>();
    default:
      return absl::UnimplementedError(absl::StrCat(
          "auth.mode ", v1::AuthConfig::Mode_Name(config.auth().mode()),
          " is not supported by this build; use NONE"));
  }
}

absl::StatusOr<std::string> SingleMetadataValue(
    const grpc::CallbackServerContext& context, absl::string_view key) {
  const auto& metadata = context.client_metadata();
  auto [begin, end] =
      metadata.equal_range(grpc::string_ref(key.data(), key.size()));
  if (begin == end) return std::string();
  if (std::next(begin) != end) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata ", key, " is given ", std::distance(begin, end),
                     " times; send it once"));
  }
  return std::string(begin->second.data(), begin->second.size());
}

}  // namespace prefixd
