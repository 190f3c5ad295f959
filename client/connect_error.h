// Connection failures as one actionable line. gRPC reports them as
// UNAVAILABLE with its transport's words ("Socket closed", "failed to
// connect to all addresses; ... Connection refused", a DNS error for a file
// path), which say what broke but not what to do. The rules are the same in
// the Python client (client/python/prefixd/client.py) and docs/client.md
// ("Connection errors") lists them.
#ifndef PREFIXD_CLIENT_CONNECT_ERROR_H_
#define PREFIXD_CLIENT_CONNECT_ERROR_H_

#include <string>

#include "absl/status/status.h"
#include "client/client.h"

namespace prefixd {

// INVALID_ARGUMENT for a target that is a file path ("/tmp/prefixd.sock",
// "./prefixd.sock"), which gRPC would take for a host name: the message
// gives the unix:// address to use instead.
absl::Status CheckTarget(const std::string& target);

// `status` (from a call to `target` with `options`) unchanged unless it is
// an UNAVAILABLE the connection layer reported; then the same code with a
// message naming the address, the cause in plain words and what to change:
// a daemon not running there, plaintext to a TLS port, TLS to a plaintext
// port, an mTLS daemon without a client certificate, an unknown CA, a host
// that does not resolve.
absl::Status ExplainConnectError(const std::string& target,
                                 const ClientOptions& options,
                                 const absl::Status& status);

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_CONNECT_ERROR_H_
