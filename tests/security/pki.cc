#include "tests/security/pki.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace prefixd::testing {
namespace {

constexpr char kConfig[] = R"(
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
)";

// Runs a shell command; its output goes to a log that an error quotes.
absl::Status Run(const std::string& dir, const std::string& command) {
  const std::string log = dir + "/openssl.log";
  const std::string full = absl::StrCat(command, " >", log, " 2>&1");
  const int rc = std::system(full.c_str());
  if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0)
    return absl::OkStatus();
  std::ifstream in(log);
  std::stringstream out;
  out << in.rdbuf();
  return absl::InternalError(
      absl::StrCat("`", command, "` failed (", rc, "): ", out.str()));
}

std::string NewKey(const std::string& path) {
  return absl::StrCat(
      "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 "
      "-out ",
      path);
}

}  // namespace

absl::StatusOr<Pki> Pki::Create(const std::string& parent) {
  std::string tmpl = parent + "/prefixd-pki-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", tmpl, " failed"));
  }
  Pki pki;
  pki.dir_ = tmpl;
  pki.config_ = pki.dir_ + "/openssl.cnf";
  std::ofstream(pki.config_) << kConfig;
  for (auto [ca, name] :
       {std::pair{&pki.ca_, "ca"}, std::pair{&pki.rogue_ca_, "rogue-ca"}}) {
    ca->key = absl::StrCat(pki.dir_, "/", name, ".key");
    ca->cert = absl::StrCat(pki.dir_, "/", name, ".pem");
    if (absl::Status s = Run(pki.dir_, NewKey(ca->key)); !s.ok()) return s;
    if (absl::Status s = Run(
            pki.dir_,
            absl::StrCat("openssl req -new -x509 -days 2 -config ", pki.config_,
                         " -extensions ca_ext -key ", ca->key, " -out ",
                         ca->cert, " -subj '/O=prefixd test/CN=", name, "'"));
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<CertFiles> server = pki.Server("localhost");
  if (!server.ok()) return server.status();
  pki.server_ = *std::move(server);
  return pki;
}

absl::StatusOr<CertFiles> Pki::Client(const std::string& cn, bool rogue) const {
  return Sign(absl::StrCat(rogue ? "rogue-" : "client-", cn),
              absl::StrCat("/O=prefixd test/CN=", cn), "client_ext",
              rogue ? rogue_ca_ : ca_);
}

absl::StatusOr<CertFiles> Pki::Server(const std::string& name) const {
  return Sign(name == "localhost" ? "server" : absl::StrCat("server-", name),
              absl::StrCat("/O=prefixd test/CN=", name), "server_ext", ca_);
}

absl::StatusOr<CertFiles> Pki::Sign(const std::string& name,
                                    const std::string& subject,
                                    const std::string& extensions,
                                    const CertFiles& ca) const {
  CertFiles out;
  out.key = absl::StrCat(dir_, "/", name, ".key");
  out.cert = absl::StrCat(dir_, "/", name, ".pem");
  const std::string csr = absl::StrCat(dir_, "/", name, ".csr");
  static int serial = 1000;
  for (const std::string& command : {
           NewKey(out.key),
           absl::StrCat("openssl req -new -config ", config_, " -key ", out.key,
                        " -out ", csr, " -subj '", subject, "'"),
           absl::StrCat("openssl x509 -req -days 2 -in ", csr, " -CA ", ca.cert,
                        " -CAkey ", ca.key, " -set_serial ", ++serial,
                        " -extfile ", config_, " -extensions ", extensions,
                        " -out ", out.cert),
       }) {
    if (absl::Status s = Run(dir_, command); !s.ok()) return s;
  }
  return out;
}

}  // namespace prefixd::testing
