// How the index dials an engine's tcp:// endpoint by name: the addresses a
// host name stands for, and whether a socket must take IPv6 to reach it.
//
// Engines bind their ZeroMQ sockets to tcp://*:PORT (vLLM, SGLang), which
// listens on IPv4 only. A name that resolves to both families (localhost
// in Debian's stock /etc/hosts is ::1 and 127.0.0.1; a dual-stack
// Kubernetes Service) is therefore dialled at its IPv4 addresses: a pool
// follows those (index/ingest.h), and a socket that dials the name itself
// leaves ZMQ_IPV6 off, since with it on ZeroMQ resolves the name to its
// IPv6 addresses alone. IPv6 literals and names with IPv6 addresses only
// are dialled over IPv6.
//
// Thread safety: free functions; ResolveHost, ResolvesToSeveral and
// DialsIpv6 block on the resolver.
#ifndef PREFIXD_INDEX_ZMQ_DIAL_H_
#define PREFIXD_INDEX_ZMQ_DIAL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prefixd {

// Numeric addresses as the index follows them: sorted, without repeats,
// and of one family, the IPv4 ones when there are any.
std::vector<std::string> HostAddresses(std::vector<std::string> resolved);

// The addresses `host` resolves to for TCP, as HostAddresses keeps them:
// empty when the resolver answers that the name has none (NXDOMAIN, no
// address records). UNAVAILABLE, naming the host and the resolver's
// reason, when it could not answer (no DNS server reachable, a timeout,
// SERVFAIL): that says nothing of the name's addresses.
absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host);

// Whether `host` resolves to several addresses now (a source found to be a
// pool at start); false when it does not resolve.
bool ResolvesToSeveral(const std::string& host);

// A numeric address as it stands in an endpoint or a URL: IPv6 in
// brackets ("[fd00::1]"), IPv4 as it is.
std::string BracketedHost(absl::string_view address);
// BracketedHost(host):port ("[fd00::1]:5557").
std::string JoinHostPort(absl::string_view host, absl::string_view port);

// Whether a socket dialling `endpoint` needs ZMQ_IPV6: a tcp:// endpoint
// whose host is an IPv6 literal, or a name with IPv6 addresses only.
bool DialsIpv6(absl::string_view endpoint);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_ZMQ_DIAL_H_
