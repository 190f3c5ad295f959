#include "client/connect_error.h"

#include <initializer_list>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace prefixd {
namespace {

bool ContainsAny(absl::string_view text,
                 std::initializer_list<absl::string_view> needles) {
  for (absl::string_view n : needles) {
    if (absl::StrContains(text, n)) return true;
  }
  return false;
}

bool UsesTls(const ClientOptions& o) {
  return o.tls || !o.tls_ca_file.empty() || !o.tls_cert_file.empty() ||
         !o.tls_key_file.empty();
}

// What to change, given gRPC's message in lower case; "" when the message
// is not one of the connection failures below (a daemon's own UNAVAILABLE,
// e.g. while it drains, passes through unchanged).
std::string Advice(const std::string& target, const ClientOptions& o,
                   absl::string_view why) {
  const std::string running =
      absl::StrCat(": is the daemon running at ", target,
                   "? (prefixd --listen=", target, ")");
  if (ContainsAny(why, {"connection refused"})) {
    return absl::StrCat("connection refused", running);
  }
  if (ContainsAny(why, {"no such file or directory"})) {
    return absl::StrCat("no such socket file", running);
  }
  if (ContainsAny(why, {"dns resolution failed", "name or service not known",
                        "domain name not found"})) {
    return "the host name does not resolve: give host:port, or "
           "unix:///path for a Unix socket";
  }
  if (ContainsAny(why, {"wrong_version_number", "wrong version number"})) {
    return "the daemon does not serve TLS on this port: connect without TLS "
           "(drop --tls/--tls_ca; ClientOptions::tls, tls_ca_file)";
  }
  if (ContainsAny(why, {"certificate_verify_failed", "certificate verify"})) {
    return "the daemon's certificate does not verify: give the CA that "
           "signed it (--tls_ca; ClientOptions::tls_ca_file), and dial a name "
           "its subjectAltName lists";
  }
  const bool closed =
      ContainsAny(why, {"socket closed", "connection reset", "broken pipe",
                        "end of tcp stream", "handshake", "alert"});
  if (!closed) return "";
  if (!UsesTls(o)) {
    return "the daemon closed the connection: it likely serves TLS on this "
           "port; connect with TLS and the CA of its certificate (--tls_ca "
           "or --tls; ClientOptions::tls_ca_file or tls)";
  }
  if (o.tls_cert_file.empty()) {
    return "the daemon ended the TLS handshake: with auth mode MTLS it "
           "requires a client certificate signed by its client CA "
           "(--tls_cert and --tls_key; ClientOptions::tls_cert_file, "
           "tls_key_file)";
  }
  return "the daemon ended the TLS handshake: check that its client CA "
         "signed the client certificate (--tls_cert; "
         "ClientOptions::tls_cert_file)";
}

}  // namespace

absl::Status CheckTarget(const std::string& target) {
  if (target.empty()) return absl::InvalidArgumentError("empty target address");
  const bool path =
      !absl::StrContains(target, "://") &&
      (target.front() == '/' || absl::StartsWith(target, "./") ||
       absl::StartsWith(target, "../") || absl::EndsWith(target, ".sock"));
  if (!path) return absl::OkStatus();
  const std::string hint = target.front() == '/'
                               ? absl::StrCat("unix://", target)
                               : absl::StrCat("unix:", target,
                                              " (relative) or "
                                              "unix:///ABSOLUTE/PATH");
  return absl::InvalidArgumentError(
      absl::StrCat("address \"", target,
                   "\" is a file path; a Unix socket's address is ", hint));
}

absl::Status ExplainConnectError(const std::string& target,
                                 const ClientOptions& options,
                                 const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnavailable || target.empty())
    return status;
  const std::string advice = Advice(
      target, options, absl::AsciiStrToLower(std::string(status.message())));
  if (advice.empty()) return status;
  return absl::UnavailableError(
      absl::StrCat("cannot connect to ", target, ": ", advice));
}

}  // namespace prefixd
