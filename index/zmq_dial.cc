#include "index/zmq_dial.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace prefixd {
namespace {

bool IsIpv6(absl::string_view address) {
  return absl::StrContains(address, ':');
}

}  // namespace

std::vector<std::string> HostAddresses(std::vector<std::string> resolved) {
  if (!std::all_of(resolved.begin(), resolved.end(), IsIpv6)) {
    resolved.erase(std::remove_if(resolved.begin(), resolved.end(), IsIpv6),
                   resolved.end());
  }
  std::sort(resolved.begin(), resolved.end());
  resolved.erase(std::unique(resolved.begin(), resolved.end()), resolved.end());
  return resolved;
}

absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::vector<std::string> out;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc == EAI_NONAME || rc == EAI_NODATA || rc == EAI_ADDRFAMILY) {
    return out;  // the resolver's answer: no addresses
  }
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("resolving \"", host, "\": ", gai_strerror(rc)));
  }
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, buf, sizeof(buf), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      out.emplace_back(buf);
    }
  }
  freeaddrinfo(res);
  return HostAddresses(std::move(out));
}

bool ResolvesToSeveral(const std::string& host) {
  const absl::StatusOr<std::vector<std::string>> addresses = ResolveHost(host);
  return addresses.ok() && addresses->size() > 1;
}

std::string BracketedHost(absl::string_view address) {
  return IsIpv6(address) ? absl::StrCat("[", address, "]")
                         : std::string(address);
}

std::string JoinHostPort(absl::string_view host, absl::string_view port) {
  return absl::StrCat(BracketedHost(host), ":", port);
}

bool DialsIpv6(absl::string_view endpoint) {
  if (!absl::ConsumePrefix(&endpoint, "tcp://")) return false;
  const size_t colon = endpoint.rfind(':');
  absl::string_view host = endpoint.substr(0, colon);
  if (absl::StartsWith(host, "[") || IsIpv6(host)) return true;
  if (host.empty() || host == "*") return false;
  const absl::StatusOr<std::vector<std::string>> addresses =
      ResolveHost(std::string(host));
  return addresses.ok() && !addresses->empty() && IsIpv6(addresses->front());
}

}  // namespace prefixd
