#include "server/tls.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace prefixd {
namespace {

absl::Status Bad(absl::string_view field, const std::string& path,
                 absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("auth.", field, ": ", path, ": ", why));
}

absl::StatusOr<std::string> ReadPem(absl::string_view field,
                                    const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth.", field, " is empty"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Bad(field, path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM text; nullptr if there is none.
X509Ptr FirstCertificate(const std::string& pem) {
  BioPtr bio = MemBio(pem);
  return X509Ptr(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTlsMaterial(const v1::AuthConfig& auth,
                                            bool want_client_ca) {
  TlsMaterial m;
  absl::StatusOr<std::string> cert =
      ReadPem("tls_cert_path", auth.tls_cert_path());
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key =
      ReadPem("tls_key_path", auth.tls_key_path());
  if (!key.ok()) return key.status();
  X509Ptr x509 = FirstCertificate(*cert);
  if (x509 == nullptr) {
    return Bad("tls_cert_path", auth.tls_cert_path(),
               "no PEM certificate (\"BEGIN CERTIFICATE\") in it");
  }
  BioPtr key_bio = MemBio(*key);
  KeyPtr pkey(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr) {
    return Bad("tls_key_path", auth.tls_key_path(),
               "no unencrypted PEM private key in it");
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    return Bad("tls_key_path", auth.tls_key_path(),
               absl::StrCat("the key does not belong to the certificate in ",
                            auth.tls_cert_path()));
  }
  m.cert_chain = *std::move(cert);
  m.private_key = *std::move(key);
  if (want_client_ca) {
    absl::StatusOr<std::string> ca =
        ReadPem("client_ca_path", auth.client_ca_path());
    if (!ca.ok()) return ca.status();
    if (FirstCertificate(*ca) == nullptr) {
      return Bad("client_ca_path", auth.client_ca_path(),
                 "no PEM certificate (\"BEGIN CERTIFICATE\") in it");
    }
    m.client_ca = *std::move(ca);
  }
  return m;
}

std::shared_ptr<grpc::ServerCredentials> ServerTlsCredentials(
    const TlsMaterial& material) {
  grpc::SslServerCredentialsOptions options(
      material.client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = material.client_ca;
  options.pem_key_cert_pairs.push_back(
      {material.private_key, material.cert_chain});
  return grpc::SslServerCredentials(options);
}

std::optional<PeerCertificate> VerifiedPeerCertificate(
    const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return std::nullopt;
  return VerifiedPeerCertificate(*auth);
}

std::optional<PeerCertificate> VerifiedPeerCertificate(
    const grpc::AuthContext& auth) {
  // The server either does not ask for client certificates (then there is
  // no subject) or requires one that verifies against the client CA (then
  // the handshake failed for anything else): a subject here is verified.
  std::vector<grpc::string_ref> type =
      auth.FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
  if (type.size() != 1 || type[0] != GRPC_SSL_TRANSPORT_SECURITY_TYPE) {
    return std::nullopt;
  }
  std::vector<grpc::string_ref> subject =
      auth.FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME);
  if (subject.empty() || subject[0].empty()) return std::nullopt;
  PeerCertificate peer;
  peer.subject.assign(subject[0].data(), subject[0].size());
  std::vector<grpc::string_ref> cn =
      auth.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  if (!cn.empty()) peer.common_name.assign(cn[0].data(), cn[0].size());
  return peer;
}

}  // namespace prefixd
