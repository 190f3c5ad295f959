#include "server/auth.h"

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace prefixd {
namespace {

constexpr size_t kSha256Bytes = 32;
constexpr char kAnyTenant[] = "*";

std::array<unsigned char, kSha256Bytes> Sha256(absl::string_view text) {
  std::array<unsigned char, kSha256Bytes> out{};
  unsigned int len = 0;
  EVP_Digest(text.data(), text.size(), out.data(), &len, EVP_sha256(), nullptr);
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = absl::ascii_tolower(c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Never echoes the text: an operator who pasted the token itself instead of
// its hash must not find the token in a log.
absl::Status ParseSha256Hex(absl::string_view who, absl::string_view hex,
                            std::array<unsigned char, kSha256Bytes>* out) {
  const std::string how =
      "token_sha256 is the hex SHA-256 of the token: printf %s \"$TOKEN\" | "
      "sha256sum";
  if (hex.size() != 2 * kSha256Bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": token_sha256 has ", hex.size(), " characters, not ",
        2 * kSha256Bytes, " hex digits (", how, ")"));
  }
  for (size_t i = 0; i < kSha256Bytes; ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(who,
                       ": token_sha256 has a character that is not a hex "
                       "digit at offset ",
                       hi < 0 ? 2 * i : 2 * i + 1, " (", how, ")"));
    }
    (*out)[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return absl::OkStatus();
}

std::string Who(int i, absl::string_view name) {
  return absl::StrCat("principals[", i, "] (\"", name, "\")");
}

// The tenants of one principal, by role.
absl::Status ParseTenants(const std::string& who, const v1::PrincipalConfig& pc,
                          Principal* p) {
  const auto& list = pc.tenants();
  const bool has_any =
      std::find(list.begin(), list.end(), kAnyTenant) != list.end();
  for (const std::string& t : list) {
    if (t.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": tenants has an empty name"));
    }
  }
  switch (p->role) {
    case Principal::Role::kTenant:
      if (list.size() != 1 || has_any) {
        return absl::InvalidArgumentError(absl::StrCat(
            who,
            ": a TENANT principal acts for exactly one named tenant; it "
            "lists [",
            absl::StrJoin(list, ", "), "]"));
      }
      break;
    case Principal::Role::kEngine:
      if (list.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            who,
            ": an ENGINE principal needs tenants (names, or \"*\" for "
            "any)"));
      }
      break;
    case Principal::Role::kAdmin:
      if (!list.empty() && !(list.size() == 1 && has_any)) {
        return absl::InvalidArgumentError(absl::StrCat(
            who,
            ": an ADMIN principal acts for every tenant; leave tenants "
            "empty (it lists [",
            absl::StrJoin(list, ", "), "])"));
      }
      break;
  }
  if (has_any && list.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": tenants mixes \"*\" with names [",
                     absl::StrJoin(list, ", "), "]; \"*\" alone means any"));
  }
  p->any_tenant = has_any || p->role == Principal::Role::kAdmin;
  if (!p->any_tenant) p->tenants.assign(list.begin(), list.end());
  return absl::OkStatus();
}

absl::StatusOr<Principal::Role> ParseRole(const std::string& who,
                                          v1::PrincipalConfig::Role role) {
  switch (role) {
    case v1::PrincipalConfig::TENANT:
      return Principal::Role::kTenant;
    case v1::PrincipalConfig::ENGINE:
      return Principal::Role::kEngine;
    case v1::PrincipalConfig::ADMIN:
      return Principal::Role::kAdmin;
    case v1::PrincipalConfig::ROLE_UNSPECIFIED:
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": role is not set; use TENANT, ENGINE or ADMIN"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": unknown role ", static_cast<int>(role),
                       "; use TENANT, ENGINE or ADMIN"));
  }
}

absl::Status CheckTlsFields(const v1::AuthConfig& a) {
  const bool cert = !a.tls_cert_path().empty();
  const bool key = !a.tls_key_path().empty();
  const bool ca = !a.client_ca_path().empty();
  switch (a.mode()) {
    case v1::AuthConfig::MODE_UNSPECIFIED:
    case v1::AuthConfig::NONE:
      if (cert || key || ca) {
        return absl::InvalidArgumentError(
            "auth: TLS files are set but auth.mode is NONE; set mode TOKEN "
            "or MTLS to serve TLS");
      }
      return absl::OkStatus();
    case v1::AuthConfig::TOKEN:
      if (cert != key) {
        return absl::InvalidArgumentError(
            "auth: set both tls_cert_path and tls_key_path, or neither");
      }
      if (ca) {
        return absl::InvalidArgumentError(
            "auth.client_ca_path needs auth.mode MTLS (TOKEN does not ask "
            "clients for certificates)");
      }
      return absl::OkStatus();
    case v1::AuthConfig::MTLS:
      if (!cert || !key || !ca) {
        return absl::InvalidArgumentError(
            "auth: mode MTLS needs tls_cert_path, tls_key_path and "
            "client_ca_path");
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("auth.mode ", static_cast<int>(a.mode()),
                       " is unknown; use NONE, TOKEN or MTLS"));
  }
}

// Constant-time equality as an all-ones / all-zeros mask.
size_t EqualMask(const unsigned char* a, const unsigned char* b, size_t n) {
  const uint32_t diff = static_cast<uint32_t>(CRYPTO_memcmp(a, b, n));
  const uint32_t nonzero = (diff | (0u - diff)) >> 31;  // 1 iff diff != 0
  return static_cast<size_t>(0) - static_cast<size_t>(1u - nonzero);
}

}  // namespace

// --- PrincipalTable ---------------------------------------------------------

absl::StatusOr<PrincipalTable> PrincipalTable::FromConfig(
    const v1::Config& config) {
  PrincipalTable table;
  const v1::AuthConfig::Mode mode = config.auth().mode();
  table.dynamic_tenants_ = config.dynamic_tenants().enabled();
  for (const v1::TenantConfig& t : config.tenants()) {
    if (t.name() == kAnyTenant) {
      return absl::InvalidArgumentError(
          "tenants: \"*\" is not a tenant name (it means any tenant in a "
          "principal's list)");
    }
    table.configured_tenants_.insert(t.name());
  }
  absl::flat_hash_map<std::string, int> names, hashes, subjects;
  for (int i = 0; i < config.principals_size(); ++i) {
    const v1::PrincipalConfig& pc = config.principals(i);
    const std::string who = Who(i, pc.name());
    if (pc.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": name is empty"));
    }
    if (auto [it, fresh] = names.emplace(pc.name(), i); !fresh) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": the name is taken by principals[", it->second,
                       "]; names must be unique"));
    }
    Principal p;
    p.name = pc.name();
    ASSIGN_OR_RETURN(p.role, ParseRole(who, pc.role()));
    if (!pc.token_sha256().empty()) {
      RETURN_IF_ERROR(ParseSha256Hex(who, pc.token_sha256(), &p.token_sha256));
      p.has_token = true;
      const std::string key(p.token_sha256.begin(), p.token_sha256.end());
      if (auto [it, fresh] = hashes.emplace(key, i); !fresh) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": token_sha256 is the same as ",
                         Who(it->second, config.principals(it->second).name()),
                         "'s; every principal needs its own token"));
      }
    }
    for (const std::string& salt : pc.cache_salts()) {
      if (salt.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": cache_salts holds an empty salt"));
      }
      p.cache_salts.push_back(salt);
    }
    if (!p.cache_salts.empty() && p.role != Principal::Role::kTenant) {
      return absl::InvalidArgumentError(absl::StrCat(
          who,
          ": cache_salts is for TENANT principals; ENGINE and ADMIN "
          "principals Route over every namespace"));
    }
    p.cert_subject = pc.cert_subject();
    if (!p.cert_subject.empty()) {
      if (mode != v1::AuthConfig::MTLS) {
        return absl::InvalidArgumentError(absl::StrCat(
            who,
            ": cert_subject needs auth.mode MTLS (client certificates "
            "are not asked for otherwise)"));
      }
      if (auto [it, fresh] = subjects.emplace(p.cert_subject, i); !fresh) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": cert_subject \"", p.cert_subject, "\" is also ",
            Who(it->second, config.principals(it->second).name()), "'s"));
      }
    }
    if (mode == v1::AuthConfig::TOKEN && !p.has_token) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": has no token_sha256 (auth.mode TOKEN)"));
    }
    if (mode == v1::AuthConfig::MTLS && !p.has_token &&
        p.cert_subject.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who,
          ": has no credential: set cert_subject (and token_sha256 to "
          "call over a Unix socket)"));
    }
    RETURN_IF_ERROR(ParseTenants(who, pc, &p));
    if (!table.dynamic_tenants_) {
      for (const std::string& t : p.tenants) {
        if (!table.configured_tenants_.contains(t)) {
          return absl::InvalidArgumentError(
              absl::StrCat(who, ": tenant \"", t,
                           "\" is not configured (add tenants { name: \"", t,
                           "\" }) and dynamic_tenants is off"));
        }
      }
    }
    table.principals_.push_back(std::move(p));
  }
  if (table.principals_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth.mode ", v1::AuthConfig::Mode_Name(mode),
                     " but no principals are configured: nobody could call"));
  }
  return table;
}

const Principal* PrincipalTable::FindByToken(absl::string_view token) const {
  const std::array<unsigned char, kSha256Bytes> hash = Sha256(token);
  // Every principal is compared, whatever matched: `found` is selected with
  // masks, not branches. Hashes are unique (FromConfig), so at most one
  // comparison can succeed.
  const size_t none = principals_.size();
  size_t found = none;
  for (size_t i = 0; i < principals_.size(); ++i) {
    const Principal& p = principals_[i];
    const size_t mask =
        EqualMask(hash.data(), p.token_sha256.data(), kSha256Bytes) &
        (static_cast<size_t>(0) - static_cast<size_t>(p.has_token));
    found = (found & ~mask) | (i & mask);
  }
  return found == none ? nullptr : &principals_[found];
}

const Principal* PrincipalTable::FindByCertificate(
    const PeerCertificate& cert) const {
  for (const Principal& p : principals_) {
    if (p.cert_subject.empty()) continue;
    const bool full = absl::StrContains(p.cert_subject, '=');
    if (full ? p.cert_subject == cert.subject
             : (!cert.common_name.empty() &&
                p.cert_subject == cert.common_name)) {
      return &p;
    }
  }
  return nullptr;
}

absl::StatusOr<CallContext> PrincipalTable::Resolve(
    const Principal& p, absl::string_view tenant_header) const {
  if (tenant_header == kAnyTenant) {
    return absl::InvalidArgumentError(absl::StrCat(
        kTenantHeader, " \"*\" is not a tenant name; name one tenant"));
  }
  CallContext call;
  call.principal = p.name;
  switch (p.role) {
    case Principal::Role::kTenant:
      if (!tenant_header.empty() && tenant_header != p.tenants[0]) {
        return absl::PermissionDeniedError(
            absl::StrCat("principal \"", p.name, "\" acts only for tenant \"",
                         p.tenants[0], "\", but ", kTenantHeader,
                         " names tenant \"", tenant_header, "\""));
      }
      call.tenant = p.tenants[0];
      call.scope = TenantScope::One(call.tenant);
      call.cache_salts = p.cache_salts;
      break;
    case Principal::Role::kEngine:
      if (!tenant_header.empty() && !p.any_tenant &&
          std::find(p.tenants.begin(), p.tenants.end(), tenant_header) ==
              p.tenants.end()) {
        return absl::PermissionDeniedError(
            absl::StrCat("principal \"", p.name, "\" may not act for tenant \"",
                         tenant_header, "\""));
      }
      if (!tenant_header.empty()) {
        call.tenant = std::string(tenant_header);
      } else if (!p.any_tenant && p.tenants.size() == 1) {
        call.tenant = p.tenants[0];
      }
      call.scope =
          p.any_tenant ? TenantScope::All() : TenantScope{false, p.tenants};
      call.index_all = true;
      call.index_write = true;
      break;
    case Principal::Role::kAdmin:
      call.tenant = std::string(tenant_header);
      call.scope = TenantScope::All();
      call.all_tenants = true;
      call.index_all = true;
      break;
  }
  if (!call.tenant.empty() && !dynamic_tenants_ &&
      !configured_tenants_.contains(call.tenant)) {
    return absl::PermissionDeniedError(
        absl::StrCat("tenant \"", call.tenant,
                     "\" is not configured and dynamic tenants are off"));
  }
  return call;
}

// --- Authorizers ------------------------------------------------------------

absl::Status RequireTenant(const CallContext& call) {
  if (!call.tenant.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "principal \"", call.principal,
      "\" acts for several tenants and this call names none: send ",
      kTenantHeader, " with the tenant it is for"));
}

std::shared_ptr<grpc::ServerCredentials> Authorizer::Credentials(
    const ListenAddress& /*address*/) const {
  return grpc::InsecureServerCredentials();
}

std::vector<std::string> Authorizer::Warnings(
    const std::vector<ListenAddress>& /*listen*/) const {
  return {};
}

CallCredentials CallCredentials::Of(
    const grpc::CallbackServerContext& context) {
  return {VerifiedPeerCertificate(context),
          SingleMetadataValue(context, kAuthorizationHeader),
          SingleMetadataValue(context, kTenantHeader)};
}

absl::Status StillAuthorized(const Authorizer& auth,
                             const CallCredentials& credentials,
                             absl::string_view tenant) {
  absl::StatusOr<CallContext> now = auth.AuthorizeCredentials(credentials);
  if (!now.ok()) {
    return absl::Status(
        now.status().code(),
        absl::StrCat("since the principals were reloaded (SIGHUP), this "
                     "call's credentials may no longer act for tenant '",
                     tenant, "': ", now.status().message()));
  }
  if (now->tenant != tenant) {
    return absl::PermissionDeniedError(absl::StrCat(
        "since the principals were reloaded (SIGHUP), principal \"",
        now->principal, "\" acts for tenant '", now->tenant, "', not '", tenant,
        "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CallContext> NoAuthAuthorizer::Authorize(
    const grpc::CallbackServerContext& context) const {
  // Only the tenant: a call pays for no certificate or token lookup.
  CallCredentials credentials;
  credentials.tenant = SingleMetadataValue(context, kTenantHeader);
  return AuthorizeCredentials(credentials);
}

absl::StatusOr<CallContext> NoAuthAuthorizer::AuthorizeCredentials(
    const CallCredentials& credentials) const {
  ASSIGN_OR_RETURN(std::string tenant, credentials.tenant);
  if (tenant.empty()) tenant = kDefaultTenant;
  CallContext call;
  call.principal = "anonymous";
  call.tenant = std::move(tenant);
  call.scope = TenantScope::All();
  call.all_tenants = true;
  call.index_all = true;
  call.index_write = true;
  return call;
}

namespace {

// gRPC's own services that answer without credentials: the kubelet's and
// prefixctl's health probes, and reflection (deploy/k8s, docs/security.md).
bool NeedsNoCredentials(absl::string_view path) {
  return absl::StartsWith(path, "/grpc.health.v1.Health/") ||
         absl::StartsWith(path, "/grpc.reflection.");
}

// Runs in gRPC's server auth filter on the call's initial metadata, before
// the request body is read: a call it refuses ends UNAUTHENTICATED and its
// body is never buffered (only what HTTP/2 flow control lets through).
class MetadataAuthenticator final : public grpc::AuthMetadataProcessor {
 public:
  explicit MetadataAuthenticator(const PrincipalAuthorizer* authorizer)
      : authorizer_(authorizer) {}

  // A token check is a SHA-256 and a table scan: cheap enough for gRPC's
  // own thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata,
                       grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    auto path = metadata.find(":path");
    if (path != metadata.end() &&
        NeedsNoCredentials(
            absl::string_view(path->second.data(), path->second.size()))) {
      return grpc::Status::OK;
    }
    std::optional<PeerCertificate> cert;
    if (context != nullptr) cert = VerifiedPeerCertificate(*context);
    absl::Status s = authorizer_->Authenticate(cert, Authorization(metadata));
    if (s.ok()) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        std::string(s.message()));
  }

 private:
  static absl::StatusOr<std::string> Authorization(
      const InputMetadata& metadata) {
    auto [begin, end] = metadata.equal_range(kAuthorizationHeader);
    if (begin == end) return std::string();
    if (std::next(begin) != end) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata ", kAuthorizationHeader, " is given ",
                       std::distance(begin, end), " times; send it once"));
    }
    return std::string(begin->second.data(), begin->second.size());
  }

  const PrincipalAuthorizer* const authorizer_;
};

}  // namespace

PrincipalAuthorizer::PrincipalAuthorizer(v1::AuthConfig::Mode mode,
                                         PrincipalTable principals,
                                         std::unique_ptr<RotatingTls> tls)
    : mode_(mode),
      principals_(
          std::make_shared<const PrincipalTable>(std::move(principals))),
      tls_(std::move(tls)),
      processor_(std::make_shared<MetadataAuthenticator>(this)) {
  if (tls_ != nullptr) {
    tls_credentials_ = tls_->credentials();
    tls_credentials_->SetAuthMetadataProcessor(processor_);
  }
}

absl::string_view PrincipalAuthorizer::mode() const {
  return mode_ == v1::AuthConfig::MTLS ? "MTLS" : "TOKEN";
}

std::shared_ptr<const PrincipalTable> PrincipalAuthorizer::principals() const {
  ReaderMutexLock lock(&mu_);
  return principals_;
}

absl::StatusOr<const Principal*> PrincipalAuthorizer::Identify(
    const PrincipalTable& principals,
    const std::optional<PeerCertificate>& cert,
    const absl::StatusOr<std::string>& header) const {
  if (mode_ == v1::AuthConfig::MTLS && cert.has_value()) {
    if (const Principal* p = principals.FindByCertificate(*cert)) return p;
    return absl::UnauthenticatedError(
        absl::StrCat("the client certificate \"", cert->subject,
                     "\" is not mapped to a principal"));
  }
  if (!header.ok()) {
    return absl::UnauthenticatedError(header.status().message());
  }
  if (header->empty()) {
    return absl::UnauthenticatedError(
        mode_ == v1::AuthConfig::MTLS
            ? "no credentials: connect over TLS with a client certificate, "
              "or send metadata \"authorization: Bearer <token>\""
            : "no credentials: send metadata \"authorization: Bearer "
              "<token>\"");
  }
  ASSIGN_OR_RETURN(std::string token, BearerToken(*header));
  if (const Principal* p = principals.FindByToken(token)) return p;
  return absl::UnauthenticatedError("the bearer token is not valid");
}

absl::Status PrincipalAuthorizer::Authenticate(
    const std::optional<PeerCertificate>& cert,
    const absl::StatusOr<std::string>& authorization) const {
  return Identify(*principals(), cert, authorization).status();
}

absl::StatusOr<CallContext> PrincipalAuthorizer::Authorize(
    const grpc::CallbackServerContext& context) const {
  return AuthorizeCredentials(CallCredentials::Of(context));
}

absl::StatusOr<CallContext> PrincipalAuthorizer::AuthorizeCredentials(
    const CallCredentials& credentials) const {
  std::shared_ptr<const PrincipalTable> table = principals();
  ASSIGN_OR_RETURN(const Principal* p, Identify(*table, credentials.cert,
                                                credentials.authorization));
  ASSIGN_OR_RETURN(std::string tenant, credentials.tenant);
  return table->Resolve(*p, tenant);
}

absl::Status PrincipalAuthorizer::Reload(const v1::Config& config) {
  if (config.auth().mode() != mode_) {
    return absl::FailedPreconditionError(
        absl::StrCat("auth.mode is ", mode(), " and the new config asks for ",
                     v1::AuthConfig::Mode_Name(config.auth().mode()),
                     ": changing the mode needs a restart"));
  }
  RETURN_IF_ERROR(ValidateAuthConfig(config));
  ASSIGN_OR_RETURN(PrincipalTable table, PrincipalTable::FromConfig(config));
  const bool wants_tls = !config.auth().tls_cert_path().empty();
  if (wants_tls != (tls_ != nullptr)) {
    return absl::FailedPreconditionError(
        absl::StrCat("TLS is ", tls_ != nullptr ? "on" : "off",
                     " and the new config turns it ", wants_tls ? "on" : "off",
                     " (auth.tls_cert_path): that needs a restart"));
  }
  // Every file is read and checked before anything is swapped: a bad one
  // leaves both the principals and the certificate as they were.
  std::optional<TlsMaterial> material;
  if (wants_tls) {
    ASSIGN_OR_RETURN(material, LoadTlsMaterial(config.auth(),
                                               mode_ == v1::AuthConfig::MTLS));
  }
  if (material.has_value()) {
    RETURN_IF_ERROR(tls_->Update(*material));
  }
  auto fresh = std::make_shared<const PrincipalTable>(std::move(table));
  MutexLock lock(&mu_);
  principals_ = std::move(fresh);
  return absl::OkStatus();
}

absl::Status Authorizer::Reload(const v1::Config& config) {
  const v1::AuthConfig::Mode m = config.auth().mode();
  if (m != v1::AuthConfig::NONE && m != v1::AuthConfig::MODE_UNSPECIFIED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "auth.mode is ", mode(), " and the new config asks for ",
        v1::AuthConfig::Mode_Name(m), ": changing the mode needs a restart"));
  }
  return absl::OkStatus();  // no principals to reload
}

// gRPC 1.51 takes an AuthMetadataProcessor on TLS and on local
// credentials (Unix sockets; TCP that only loopback peers can reach), not on
// insecure ones (it aborts). A plaintext TCP listener on another address
// therefore reads a request body before Authorize refuses it: its peers can
// make the daemon hold up to limits.max_message_size per call (the start-up
// banner warns about such a listener already).
std::shared_ptr<grpc::ServerCredentials> PrincipalAuthorizer::Credentials(
    const ListenAddress& address) const {
  if (address.kind == ListenAddress::Kind::kTcp) {
    if (tls_credentials_ != nullptr) return tls_credentials_;
    if (!address.IsLoopback()) return grpc::InsecureServerCredentials();
  }
  std::shared_ptr<grpc::ServerCredentials> local =
      grpc::experimental::LocalServerCredentials(
          address.kind == ListenAddress::Kind::kUnix ? UDS : LOCAL_TCP);
  local->SetAuthMetadataProcessor(processor_);
  return local;
}

std::vector<std::string> PrincipalAuthorizer::Warnings(
    const std::vector<ListenAddress>& listen) const {
  std::vector<std::string> out;
  if (tls_credentials_ != nullptr) return out;
  for (const ListenAddress& a : listen) {
    if (a.kind == ListenAddress::Kind::kTcp && !a.IsLoopback()) {
      out.push_back(absl::StrCat(
          "bearer tokens and prefixes cross the network in cleartext on ",
          a.ToGrpcUri(),
          ": set auth.tls_cert_path and auth.tls_key_path (docs/security.md)"));
    }
  }
  return out;
}

// --- Config -----------------------------------------------------------------

absl::Status ValidateAuthConfig(const v1::Config& config) {
  const v1::AuthConfig& a = config.auth();
  RETURN_IF_ERROR(CheckTlsFields(a));
  if (a.mode() == v1::AuthConfig::NONE ||
      a.mode() == v1::AuthConfig::MODE_UNSPECIFIED) {
    if (config.principals_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "principals: ", config.principals_size(),
          " configured but auth.mode is NONE, which ignores them; set "
          "auth { mode: TOKEN } (or MTLS)"));
    }
    return absl::OkStatus();
  }
  return PrincipalTable::FromConfig(config).status();
}

absl::StatusOr<std::unique_ptr<Authorizer>> MakeAuthorizer(
    const v1::Config& config) {
  RETURN_IF_ERROR(ValidateAuthConfig(config));
  const v1::AuthConfig& a = config.auth();
  if (a.mode() == v1::AuthConfig::NONE ||
      a.mode() == v1::AuthConfig::MODE_UNSPECIFIED) {
    return std::make_unique<NoAuthAuthorizer>();
  }
  ASSIGN_OR_RETURN(PrincipalTable table, PrincipalTable::FromConfig(config));
  std::unique_ptr<RotatingTls> tls;
  if (!a.tls_cert_path().empty()) {
    ASSIGN_OR_RETURN(TlsMaterial m,
                     LoadTlsMaterial(a, a.mode() == v1::AuthConfig::MTLS));
    ASSIGN_OR_RETURN(tls, RotatingTls::Create(m));
  }
  return std::make_unique<PrincipalAuthorizer>(a.mode(), std::move(table),
                                               std::move(tls));
}

absl::StatusOr<std::string> BearerToken(absl::string_view authorization) {
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()),
                              kScheme)) {
    return absl::UnauthenticatedError(
        "metadata \"authorization\" must be \"Bearer <token>\"");
  }
  absl::string_view token =
      absl::StripAsciiWhitespace(authorization.substr(kScheme.size()));
  if (token.empty()) {
    return absl::UnauthenticatedError(
        "metadata \"authorization\" has an empty bearer token");
  }
  return std::string(token);
}

std::string Sha256Hex(absl::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : Sha256(text)) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
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
