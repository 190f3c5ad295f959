// TLS for the TCP listeners (auth TOKEN with a certificate, and MTLS) and
// the identity of a client certificate. Unix sockets never use TLS: the
// socket file's permissions decide who may connect (docs/security.md).
//
// The PEM files are read and checked once, at start-up: the certificate and
// the key parse and belong together, the client CA parses. Rotating a
// certificate means restarting the daemon.
#ifndef PREFIXD_SERVER_TLS_H_
#define PREFIXD_SERVER_TLS_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "prefixd/v1/config.pb.h"

namespace grpc {
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

// Server credentials for `material`. With a client CA, the handshake fails
// unless the client presents a certificate that chains to it
// (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
std::shared_ptr<grpc::ServerCredentials> ServerTlsCredentials(
    const TlsMaterial& material);

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

}  // namespace prefixd

#endif  // PREFIXD_SERVER_TLS_H_
