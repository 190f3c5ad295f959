// Who is calling and for which tenant. The service asks its Authorizer once
// per call, before it touches the cache, and acts only on the CallContext it
// gets back: the tenant is never a request field.
//
// Modes (auth.mode in the config, docs/security.md):
//   NONE   every caller is an engine for any tenant (loopback and Unix
//          sockets only, unless the operator overrides that);
//   TOKEN  principals present `authorization: Bearer <token>`; the config
//          keeps only each token's SHA-256. TCP listeners use TLS when a
//          certificate is configured;
//   MTLS   TCP listeners require a client certificate signed by the client
//          CA, and its subject names the principal; callers on Unix sockets
//          (never TLS) authenticate with a bearer token.
#ifndef PREFIXD_SERVER_AUTH_H_
#define PREFIXD_SERVER_AUTH_H_

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "core/cache.h"
#include "prefixd/v1/config.pb.h"
#include "server/listen_address.h"
#include "server/tls.h"

namespace grpc {
class AuthMetadataProcessor;
class CallbackServerContext;
class ServerCredentials;
}  // namespace grpc

namespace prefixd {

// Metadata keys (lower case, as gRPC delivers them).
inline constexpr char kTenantHeader[] = "x-prefixd-tenant";
inline constexpr char kAuthorizationHeader[] = "authorization";
inline constexpr char kDefaultTenant[] = "default";

struct CallContext {
  std::string principal;  // for logs; "anonymous" with auth off
  // Every single-tenant call acts on this tenant. Empty when a principal
  // that acts for several tenants named none: calls that need a tenant then
  // fail (RequireTenant); GetInfo, Handshake, Evict, Invalidate and the
  // all-tenant forms of Stats and Reset do not need one.
  std::string tenant;
  // Tenants that Evict and Invalidate may touch and Reset may name.
  TenantScope scope;
  // May read Stats of every tenant and Reset all of them (admin, or auth off).
  bool all_tenants = false;
  // The fleet index (docs/index.md): engines, admins and auth off Route over
  // every namespace and list workers; a tenant principal Routes only with
  // one of its configured cache_salts.
  bool index_all = false;
  // May change what the index holds through its front doors (SGLang's KV
  // indexer: apply, replace, configure; the Mooncake Conductor API's
  // /register and /unregister): engines, and auth off.
  bool index_write = false;
  std::vector<std::string> cache_salts;
};

// OK when call.tenant is set; else INVALID_ARGUMENT telling the principal to
// name the tenant in x-prefixd-tenant.
absl::Status RequireTenant(const CallContext& call);

// What a call presents to be authorized: all an Authorizer reads of it. A
// long-lived call (WatchEvents) keeps a copy, so that it can be authorized
// again after a SIGHUP changed the principals.
struct CallCredentials {
  // The connection's verified client certificate, if any.
  std::optional<PeerCertificate> cert;
  // The single value of `authorization` / `x-prefixd-tenant`, "" when
  // absent; INVALID_ARGUMENT when given more than once.
  absl::StatusOr<std::string> authorization;
  absl::StatusOr<std::string> tenant;

  static CallCredentials Of(const grpc::CallbackServerContext& context);
};

class Authorizer;

// For a call authorized for `tenant` from `credentials`: OK while they
// still authorize that tenant (after a Reload), else why not
// (UNAUTHENTICATED, PERMISSION_DENIED, naming the tenant and the reload).
absl::Status StillAuthorized(const Authorizer& auth,
                             const CallCredentials& credentials,
                             absl::string_view tenant);

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
  // The same for credentials taken from a call earlier: what they allow
  // now, with the principals of the last Reload.
  virtual absl::StatusOr<CallContext> AuthorizeCredentials(
      const CallCredentials& credentials) const = 0;

  // SIGHUP: takes the principals of `config` (a whole config, validated
  // as at start-up) for every call from now on, and re-reads its TLS files
  // for every new connection; calls and connections in flight finish with
  // the old ones. On any error nothing changes: INVALID_ARGUMENT naming the
  // field (and the file), or FAILED_PRECONDITION when the mode differs or
  // TLS is turned on or off (that needs a restart).
  virtual absl::Status Reload(const v1::Config& config);

  // Transport credentials for one listener. The default is plaintext, which
  // is all auth-off serves (loopback and Unix sockets, see config.cc).
  virtual std::shared_ptr<grpc::ServerCredentials> Credentials(
      const ListenAddress& address) const;

  // The TCP listeners' TLS material (auth.tls_*), rotated by Reload; null
  // without TLS. Listeners outside gRPC (the Conductor API's HTTPS) serve
  // it too.
  virtual const RotatingTls* tls() const { return nullptr; }

  // What the start-up banner must warn about for these listeners (one line
  // each; none by default).
  virtual std::vector<std::string> Warnings(
      const std::vector<ListenAddress>& listen) const;
};

// Auth off: every caller is an engine for any tenant. The tenant comes from
// `x-prefixd-tenant`, else "default"; the cache validates the name and
// creates the tenant on first use.
class NoAuthAuthorizer final : public Authorizer {
 public:
  absl::string_view mode() const override { return "NONE"; }
  absl::StatusOr<CallContext> Authorize(
      const grpc::CallbackServerContext& context) const override;
  absl::StatusOr<CallContext> AuthorizeCredentials(
      const CallCredentials& credentials) const override;
};

// One configured principal (v1::PrincipalConfig), validated.
struct Principal {
  enum class Role { kTenant, kEngine, kAdmin };
  std::string name;
  Role role = Role::kTenant;
  bool has_token = false;
  std::array<unsigned char, 32> token_sha256{};
  std::string cert_subject;  // "" = none
  // Engine with "*", and admin: any tenant. Otherwise `tenants` (a tenant
  // principal has exactly one).
  bool any_tenant = false;
  std::vector<std::string> tenants;
  std::vector<std::string> cache_salts;  // tenant principals: Route's salts
};

// The principals of a TOKEN or MTLS config and the rules that map a
// principal and the x-prefixd-tenant it sends to a CallContext:
//   tenant  its one tenant; naming another is PERMISSION_DENIED;
//   engine  the tenant it names, if in its list (else PERMISSION_DENIED);
//           without the header, its only tenant, or none if it has several
//           (RequireTenant then refuses single-tenant calls);
//   admin   any tenant it names; also Stats and Reset of every tenant.
// A named tenant that is not configured is PERMISSION_DENIED unless dynamic
// tenants are on. Immutable after FromConfig: thread-safe.
class PrincipalTable {
 public:
  // INVALID_ARGUMENT naming the principal (and what is wrong) for: no name
  // or a repeated one, no or an unknown role, a token_sha256 that is not 64
  // hex digits, two principals with one token or one certificate subject, a
  // principal without the credential its mode needs, a tenant principal
  // without exactly one tenant, an engine without tenants, "*" mixed with
  // names, tenants that are not configured while dynamic tenants are off.
  static absl::StatusOr<PrincipalTable> FromConfig(const v1::Config& config);

  // The principal whose token_sha256 is SHA-256(token), or nullptr. The
  // hash is compared with every principal's in constant time
  // (CRYPTO_memcmp), and the loop never ends early: how long it takes says
  // nothing about which principal, if any, matched.
  const Principal* FindByToken(absl::string_view token) const;

  // The principal whose cert_subject is the certificate's subject (when
  // cert_subject contains '=', e.g. "CN=engine-0,O=acme") or its common name
  // (otherwise, e.g. "engine-0"); nullptr if none.
  const Principal* FindByCertificate(const PeerCertificate& cert) const;

  // What `p` may do when it sends x-prefixd-tenant `tenant_header` ("" when
  // absent).
  absl::StatusOr<CallContext> Resolve(const Principal& p,
                                      absl::string_view tenant_header) const;

  const std::vector<Principal>& principals() const { return principals_; }

 private:
  std::vector<Principal> principals_;
  absl::flat_hash_set<std::string> configured_tenants_;
  bool dynamic_tenants_ = false;
};

// TOKEN and MTLS. In MTLS, a call on a TLS connection is the principal of
// its (verified) client certificate; a call without one (a Unix socket)
// authenticates with its bearer token.
//
// Every listener whose gRPC credentials accept an AuthMetadataProcessor
// (TLS, Unix sockets and loopback TCP: see Credentials) authenticates a call
// from its metadata before gRPC reads the request body: a peer without a
// valid credential gets UNAUTHENTICATED and the daemon never buffers what it
// sends. Authorize then runs again on the call, as before.
class PrincipalAuthorizer final : public Authorizer {
 public:
  // `tls`: the TCP listeners' certificate, or null for plaintext (TOKEN
  // only; MTLS always has one, with the client CA).
  PrincipalAuthorizer(v1::AuthConfig::Mode mode, PrincipalTable principals,
                      std::unique_ptr<RotatingTls> tls);

  absl::string_view mode() const override;
  absl::StatusOr<CallContext> Authorize(
      const grpc::CallbackServerContext& context) const override;
  absl::StatusOr<CallContext> AuthorizeCredentials(
      const CallCredentials& credentials) const override;
  std::shared_ptr<grpc::ServerCredentials> Credentials(
      const ListenAddress& address) const override;
  const RotatingTls* tls() const override { return tls_.get(); }
  absl::Status Reload(const v1::Config& config) override;
  std::vector<std::string> Warnings(
      const std::vector<ListenAddress>& listen) const override;

  // OK when `cert` (the connection's verified client certificate) or
  // `authorization` (the call's single authorization value, "" when absent)
  // names a current principal; UNAUTHENTICATED otherwise, as Authorize.
  absl::Status Authenticate(
      const std::optional<PeerCertificate>& cert,
      const absl::StatusOr<std::string>& authorization) const;

 private:
  std::shared_ptr<const PrincipalTable> principals() const;
  absl::StatusOr<const Principal*> Identify(
      const PrincipalTable& principals,
      const std::optional<PeerCertificate>& cert,
      const absl::StatusOr<std::string>& authorization) const;

  const v1::AuthConfig::Mode mode_;
  // Swapped whole by Reload; a call keeps the table it started with.
  mutable Mutex mu_;
  std::shared_ptr<const PrincipalTable> principals_ ABSL_GUARDED_BY(mu_);
  const std::unique_ptr<RotatingTls> tls_;                    // null: none
  std::shared_ptr<grpc::ServerCredentials> tls_credentials_;  // null: none
  std::shared_ptr<grpc::AuthMetadataProcessor> processor_;
};

// Checks config.auth and config.principals against each other and the
// mode (the checks of PrincipalTable::FromConfig and which TLS files each
// mode needs) without reading any file. INVALID_ARGUMENT naming the field.
absl::Status ValidateAuthConfig(const v1::Config& config);

// The Authorizer for config.auth().mode(): validates the config and reads
// the TLS files.
absl::StatusOr<std::unique_ptr<Authorizer>> MakeAuthorizer(
    const v1::Config& config);

// The token of an `authorization` value "Bearer <token>" (the scheme in any
// case, RFC 6750). UNAUTHENTICATED for anything else.
absl::StatusOr<std::string> BearerToken(absl::string_view authorization);

// Lower-case hex SHA-256 of `text`, as token_sha256 stores it (for tests and
// tools; `printf %s "$TOKEN" | sha256sum` prints the same).
std::string Sha256Hex(absl::string_view text);

// The single value of `key` in the call's metadata; "" when absent.
// INVALID_ARGUMENT when it is given more than once.
absl::StatusOr<std::string> SingleMetadataValue(
    const grpc::CallbackServerContext& context, absl::string_view key);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_AUTH_H_
