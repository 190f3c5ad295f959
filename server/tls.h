// TLS for the TCP listeners (auth TOKEN with a certificate, and MTLS) and
// the identity of a client certificate. Unix sockets never use TLS: the
// socket file's permissions decide who may connect (docs/security.md).
//
// The PEM files are read and checked at start-up and on SIGHUP: the
// certificate and the key parse and belong together, the client CA parses.
// A set that passes replaces the one in force for new connections
// (RotatingTls): the gRPC listeners' and the Conductor API's HTTPS
// (server/http/https_listener.h); one that does not is refused and the old
// one stays.
#ifndef PREFIXD_SERVER_TLS_H_
#define PREFIXD_SERVER_TLS_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "prefixd/v1/config.pb.h"

namespace grpc {
namespace experimental {
class CertificateProviderInterface;
}  // namespace experimental
class AuthContext;
class ServerContextBase;
class ServerCredentials;
}  // namespace grpc

namespace prefixd {

struct TlsMaterial {
  std::string cert_chain;   // PEM, the server's certificate (and chain)
  std::string private_key;  // PEM
  std::string client_ca;    // PEM; non-empty: clients must present a
                            // certificate signed by it (MTLS)
};

// Reads auth.tls_cert_path, auth.tls_key_path and (when `want_client_ca`)
// auth.client_ca_path. INVALID_ARGUMENT naming the field and the file for a
// file that cannot be read, is not PEM of the right kind, or a key that does
// not belong to the certificate.
absl::StatusOr<TlsMaterial> LoadTlsMaterial(const v1::AuthConfig& auth,
                                            bool want_client_ca);

// Server TLS credentials whose certificate, key and client CA can be
// replaced while the listeners serve. With a client CA, the handshake fails
// unless the client presents a certificate that chains to it
// (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
//
// gRPC 1.51 replaces a listener's certificate only through a certificate
// provider, and its one updatable provider watches files. So the material,
// once validated, is copied into anonymous memory files (memfd) that the
// provider watches, never the operator's files themselves: a half-written
// or broken file in their place is never served. The key and the chain
// share one memory file, so a swap can never pair a new key with an old
// certificate. Update is seen by new handshakes within kRefreshSeconds;
// connections already open keep the certificate they started with.
//
// Thread safety: credentials() and material() may be called from any
// thread; Update from one caller at a time (the SIGHUP handler). material()
// is guarded by an internal lock.
class RotatingTls {
 public:
  static constexpr unsigned kRefreshSeconds = 1;

  // INTERNAL when the memory files cannot be created.
  static absl::StatusOr<std::unique_ptr<RotatingTls>> Create(
      const TlsMaterial& material);
  ~RotatingTls();
  RotatingTls(const RotatingTls&) = delete;
  RotatingTls& operator=(const RotatingTls&) = delete;

  const std::shared_ptr<grpc::ServerCredentials>& credentials() const {
    return credentials_;
  }

  // Serves `material` (validated by LoadTlsMaterial, with a client CA iff
  // the one at Create had one) to new connections. Not thread-safe: one
  // caller (the SIGHUP handler) at a time.
  absl::Status Update(const TlsMaterial& material);

  // The material in force: what Create or the last Update was given. A
  // listener that is not gRPC's (the Conductor API's HTTPS) reads it for
  // each new connection.
  std::shared_ptr<const TlsMaterial> material() const;

 private:
  RotatingTls() = default;

  mutable Mutex mu_;
  std::shared_ptr<const TlsMaterial> material_ ABSL_GUARDED_BY(mu_);

  int identity_fd_ = -1;  // key + certificate chain
  int ca_fd_ = -1;        // -1: no client CA
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
};

// The verified client certificate of a call: its subject as gRPC prints it
// (RFC 2253, most specific first: "CN=engine-0,O=acme") and its common name.
struct PeerCertificate {
  std::string subject;
  std::string common_name;
};

// The client certificate of the call, when the connection is TLS and the
// client presented one that the handshake verified; nullopt otherwise
// (plaintext, Unix socket, TLS without a client certificate).
std::optional<PeerCertificate> VerifiedPeerCertificate(
    const grpc::ServerContextBase& context);
// The same from a connection's AuthContext (what an AuthMetadataProcessor
// sees before the call reaches a service).
std::optional<PeerCertificate> VerifiedPeerCertificate(
    const grpc::AuthContext& auth);
// The subject and common name of a DER certificate, printed as gRPC prints
// them (for a certificate a TLS library other than gRPC's verified: the
// Conductor API's HTTPS); nullopt if `der` is not a certificate.
std::optional<PeerCertificate> PeerCertificateOfDer(absl::string_view der);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_TLS_H_
