// Who is calling and for which tenant. The service asks its Authorizer once
// per call, before it touches the cache, and acts only on the CallContext it
// gets back: the tenant is never a request field (DESIGN.md section 8).
//
// This file has the interface and the auth-off implementation. TOKEN and
// MTLS modes are further Authorizer implementations returned by
// MakeAuthorizer(); nothing else in server/ changes when they are added.
#ifndef PREFIXD_SERVER_AUTH_H_
#define PREFIXD_SERVER_AUTH_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/cache.h"
#include "prefixd/v1/config.pb.h"
#include "server/listen_address.h"

namespace grpc {
class CallbackServerContext;
class ServerCredentials;
}  // namespace grpc

namespace prefixd {

// Metadata keys (lower case, as gRPC delivers them).
inline constexpr char kTenantHeader[] = "x-prefixd-tenant";
inline constexpr char kDefaultTenant[] = "default";

struct CallContext {
  std::string principal;  // for logs; "anonymous" with auth off
  std::string tenant;     // every single-tenant call acts on this tenant
  // Tenants that Evict and Invalidate may touch and Reset may name.
  TenantScope scope;
  // May read Stats of every tenant and Reset all of them (admin, or auth off).
  bool all_tenants = false;
};

// Thread safety: Authorize and Credentials are called concurrently from
// gRPC threads; implementations must be safe for that and must not block.
class Authorizer {
 public:
  virtual ~Authorizer() = default;

  // "NONE", "TOKEN" or "MTLS", as GetInfo and the start-up banner show it.
  virtual absl::string_view mode() const = 0;

  // UNAUTHENTICATED for missing or bad credentials, PERMISSION_DENIED when
  // the principal may not act for the tenant it asks for, INVALID_ARGUMENT
  // for malformed metadata.
  virtual absl::StatusOr<CallContext> Authorize(
      const grpc::CallbackServerContext& context) const = 0;

  // Transport credentials for one listener. The default is plaintext, which
  // is all auth-off serves (loopback and Unix sockets, see config.cc).
  virtual std::shared_ptr<grpc::ServerCredentials> Credentials(
      const ListenAddress& address) const;
};

// Auth off: every caller is an engine for any tenant. The tenant comes from
// `x-prefixd-tenant`, else "default"; the cache validates the name and
// creates the tenant on first use.
class NoAuthAuthorizer final : public Authorizer {
 public:
  absl::string_view mode() const override { return "NONE"; }
  absl::StatusOr<CallContext> Authorize(
      const grpc::CallbackServerContext& context) const override;
};

// The Authorizer for config.auth().mode(). UNIMPLEMENTED for modes this
// build does not have.
absl::StatusOr<std::unique_ptr<Authorizer>> MakeAuthorizer(
    const v1::Config& config);

// The single value of `key` in the call's metadata; "" when absent.
// INVALID_ARGUMENT when it is given more than once.
absl::StatusOr<std::string> SingleMetadataValue(
    const grpc::CallbackServerContext& context, absl::string_view key);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_AUTH_H_
