// pki_tool: the security tests' throwaway PKI (tests/security/pki.h) for
// the tests that are not C++ (tests/index/test_conductor_https.py): makes it
// in a new directory under PARENT and prints one "NAME PATH" line per file.
//
//   pki_tool PARENT [client:CN | rogue:CN | server:NAME]...
//
// prints "dir", "ca", "server.cert" and "server.key", then "<arg>.cert" and
// "<arg>.key" for each argument: a client certificate signed by the CA (or
// by the rogue CA), or another server certificate signed by the CA.
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "tests/security/pki.h"

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "pki_tool: %s\n", std::string(s.message()).c_str());
  return 1;
}

void Print(const std::string& name, const std::string& path) {
  std::printf("%s %s\n", name.c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: pki_tool PARENT [client:CN | rogue:CN | "
                 "server:NAME]...\n");
    return 2;
  }
  absl::StatusOr<prefixd::testing::Pki> pki =
      prefixd::testing::Pki::Create(argv[1]);
  if (!pki.ok()) return Fail(pki.status());
  Print("dir", pki->dir());
  Print("ca", pki->ca());
  Print("server.cert", pki->server().cert);
  Print("server.key", pki->server().key);
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string name = arg.substr(arg.find(':') + 1);
    absl::StatusOr<prefixd::testing::CertFiles> c =
        absl::StartsWith(arg, "server:")  ? pki->Server(name)
        : absl::StartsWith(arg, "rogue:") ? pki->Client(name, /*rogue=*/true)
        : absl::StartsWith(arg, "client:")
            ? pki->Client(name)
            : absl::InvalidArgumentError("unknown argument " + arg);
    if (!c.ok()) return Fail(c.status());
    Print(arg + ".cert", c->cert);
    Print(arg + ".key", c->key);
  }
  return 0;
}
