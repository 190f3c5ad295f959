#include "server/tls.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/server_context.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

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
  ASSIGN_OR_RETURN(std::string cert,
                   ReadPem("tls_cert_path", auth.tls_cert_path()));
  ASSIGN_OR_RETURN(std::string key,
                   ReadPem("tls_key_path", auth.tls_key_path()));
  X509Ptr x509 = FirstCertificate(cert);
  if (x509 == nullptr) {
    return Bad("tls_cert_path", auth.tls_cert_path(),
               "no PEM certificate (\"BEGIN CERTIFICATE\") in it");
  }
  BioPtr key_bio = MemBio(key);
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
  m.cert_chain = std::move(cert);
  m.private_key = std::move(key);
  if (want_client_ca) {
    ASSIGN_OR_RETURN(std::string ca,
                     ReadPem("client_ca_path", auth.client_ca_path()));
    if (FirstCertificate(ca) == nullptr) {
      return Bad("client_ca_path", auth.client_ca_path(),
                 "no PEM certificate (\"BEGIN CERTIFICATE\") in it");
    }
    m.client_ca = std::move(ca);
  }
  return m;
}

namespace {

// A memory file holding `text`; -1 with errno on failure.
int MemoryFile(const std::string& text) {
  int fd = memfd_create("prefixd-tls", MFD_CLOEXEC);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      return -1;
    }
    done += static_cast<size_t>(n);
  }
  return fd;
}

std::string FdPath(int fd) { return absl::StrCat("/proc/self/fd/", fd); }

std::string IdentityPem(const TlsMaterial& m) {
  return absl::StrCat(m.private_key, "\n", m.cert_chain);
}

// Points `target` at a new memory file holding `text`. dup2 swaps it in one
// step: the watcher reads either the old file or the new one.
absl::Status Replace(int target, const std::string& text) {
  int fd = MemoryFile(text);
  if (fd < 0 || dup2(fd, target) < 0) {
    absl::Status s = absl::InternalError(absl::StrCat(
        "TLS: cannot write a memory file: ", std::strerror(errno)));
    if (fd >= 0) close(fd);
    return s;
  }
  close(fd);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RotatingTls>> RotatingTls::Create(
    const TlsMaterial& material) {
  std::unique_ptr<RotatingTls> tls(new RotatingTls());
  {
    MutexLock lock(&tls->mu_);
    tls->material_ = std::make_shared<const TlsMaterial>(material);
  }
  tls->identity_fd_ = MemoryFile(IdentityPem(material));
  if (tls->identity_fd_ < 0 ||
      (!material.client_ca.empty() &&
       (tls->ca_fd_ = MemoryFile(material.client_ca)) < 0)) {
    return absl::InternalError(absl::StrCat(
        "TLS: cannot create a memory file: ", std::strerror(errno)));
  }
  const std::string identity = FdPath(tls->identity_fd_);
  // The watcher opens the memory files by path: that needs /proc.
  if (access(identity.c_str(), R_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("TLS: cannot read ", identity, " (", std::strerror(errno),
                     "): serving TLS needs /proc mounted"));
  }
  if (tls->ca_fd_ < 0) {
    tls->provider_ =
        std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
            identity, identity, kRefreshSeconds);
  } else {
    tls->provider_ =
        std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
            identity, identity, FdPath(tls->ca_fd_), kRefreshSeconds);
  }
  grpc::experimental::TlsServerCredentialsOptions options(tls->provider_);
  options.watch_identity_key_cert_pairs();
  if (tls->ca_fd_ >= 0) {
    options.watch_root_certs();
    options.set_cert_request_type(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  tls->credentials_ = grpc::experimental::TlsServerCredentials(options);
  return tls;
}

RotatingTls::~RotatingTls() {
  credentials_.reset();
  provider_.reset();  // stops the watcher before its files go
  if (identity_fd_ >= 0) close(identity_fd_);
  if (ca_fd_ >= 0) close(ca_fd_);
}

absl::Status RotatingTls::Update(const TlsMaterial& material) {
  RETURN_IF_ERROR(Replace(identity_fd_, IdentityPem(material)));
  if (ca_fd_ >= 0) RETURN_IF_ERROR(Replace(ca_fd_, material.client_ca));
  auto fresh = std::make_shared<const TlsMaterial>(material);
  MutexLock lock(&mu_);
  material_ = std::move(fresh);
  return absl::OkStatus();
}

std::shared_ptr<const TlsMaterial> RotatingTls::material() const {
  MutexLock lock(&mu_);
  return material_;
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
  // TlsServerCredentials (RotatingTls) say "tls"; SslServerCredentials said
  // "ssl". Both verify the client certificate the same way.
  if (type.size() != 1 || (type[0] != GRPC_TLS_TRANSPORT_SECURITY_TYPE &&
                           type[0] != GRPC_SSL_TRANSPORT_SECURITY_TYPE)) {
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

// As gRPC's TLS layer names a peer (its X509 subject and common name
// properties): the subject printed in RFC 2253 form, the first common name
// in UTF-8.
std::optional<PeerCertificate> PeerCertificateOfDer(absl::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  X509Ptr x509(d2i_X509(nullptr, &p, static_cast<long>(der.size())));
  if (x509 == nullptr) return std::nullopt;
  X509_NAME* name = X509_get_subject_name(x509.get());
  if (name == nullptr) return std::nullopt;
  BioPtr bio(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(bio.get(), name, 0, XN_FLAG_RFC2253);
  char* text = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &text);
  PeerCertificate peer;
  if (len <= 0) return std::nullopt;  // as gRPC: no subject, no peer
  peer.subject.assign(text, static_cast<size_t>(len));
  const int at = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
  unsigned char* utf8 = nullptr;
  const int n =
      at < 0
          ? -1
          : ASN1_STRING_to_UTF8(
                &utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, at)));
  if (n > 0) peer.common_name.assign(reinterpret_cast<char*>(utf8), n);
  OPENSSL_free(utf8);
  return peer;
}

}  // namespace prefixd
