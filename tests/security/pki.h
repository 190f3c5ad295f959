// A throwaway PKI for the security tests, made with the `openssl` command
// line in a temporary directory: a CA, a server certificate for 127.0.0.1 and
// localhost (subjectAltName), client certificates signed by the CA, and a
// rogue CA with a client certificate of its own that the server must refuse.
#ifndef PREFIXD_TESTS_SECURITY_PKI_H_
#define PREFIXD_TESTS_SECURITY_PKI_H_

#include <string>

#include "absl/status/statusor.h"

namespace prefixd::testing {

struct CertFiles {
  std::string cert;  // PEM
  std::string key;   // PEM, unencrypted
};

class Pki {
 public:
  // Makes a new PKI in a new directory under `parent`; errors quote the
  // failing openssl command and its output.
  static absl::StatusOr<Pki> Create(const std::string& parent);

  // A client certificate with subject "/O=prefixd test/CN=<cn>", signed by
  // the CA (or by the rogue CA).
  absl::StatusOr<CertFiles> Client(const std::string& cn,
                                   bool rogue = false) const;
  // Another server certificate for 127.0.0.1 and localhost, signed by the
  // CA, with subject "/O=prefixd test/CN=<name>" (a rotation's new one).
  absl::StatusOr<CertFiles> Server(const std::string& name) const;

  const std::string& dir() const { return dir_; }
  const std::string& ca() const { return ca_.cert; }  // the clients' trust root
  const CertFiles& server() const { return server_; }

 private:
  absl::StatusOr<CertFiles> Sign(const std::string& name,
                                 const std::string& subject,
                                 const std::string& extensions,
                                 const CertFiles& ca) const;

  std::string dir_;
  std::string config_;  // openssl config with the extension sections
  CertFiles ca_;
  CertFiles rogue_ca_;
  CertFiles server_;
};

}  // namespace prefixd::testing

#endif  // PREFIXD_TESTS_SECURITY_PKI_H_
