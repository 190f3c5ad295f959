#include "server/listen_address.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace prefixd {
namespace {

constexpr size_t kMaxUnixPath = sizeof(sockaddr_un::sun_path) - 1;

absl::StatusOr<ListenAddress> ParseUnix(absl::string_view text) {
  absl::string_view rest = text.substr(5);  // after "unix:"
  // "unix:///abs" keeps one slash; "unix:rel" is relative to the cwd.
  if (absl::StartsWith(rest, "//")) rest.remove_prefix(2);
  if (rest.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address \"", text, "\" has no socket path"));
  }
  if (rest.size() > kMaxUnixPath) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address \"", text, "\": socket path is ", rest.size(),
        " bytes, Unix sockets allow at most ", kMaxUnixPath));
  }
  ListenAddress a;
  a.kind = ListenAddress::Kind::kUnix;
  a.path = std::string(rest);
  return a;
}

absl::StatusOr<ListenAddress> ParseTcp(absl::string_view text) {
  size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address \"", text,
        "\" needs host:port (e.g. 127.0.0.1:50051) or unix:///path"));
  }
  absl::string_view host = text.substr(0, colon);
  absl::string_view port_text = text.substr(colon + 1);
  bool bracketed = absl::StartsWith(host, "[") && absl::EndsWith(host, "]");
  if (!bracketed && host.find(':') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address \"", text,
                     "\": write IPv6 hosts in brackets, e.g. [::1]:50051"));
  }
  if (bracketed && host.size() == 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address \"", text, "\" has an empty host in brackets"));
  }
  int port = -1;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("listen address \"", text,
                                                   "\": port \"", port_text,
                                                   "\" is not in 0..65535"));
  }
  ListenAddress a;
  a.host = std::string(host);
  a.port = port;
  return a;
}

bool IsLoopbackHost(absl::string_view host) {
  if (host == "localhost") return true;
  std::string h(host);
  if (absl::StartsWith(h, "[") && absl::EndsWith(h, "]")) {
    h = h.substr(1, h.size() - 2);
  }
  in_addr v4;
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

// True if something accepts connections on the socket at `path`.
bool SomeoneListens(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  bool connected =
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return connected;
}

}  // namespace

std::string ListenAddress::ToGrpcUri() const {
  if (kind == Kind::kTcp) return absl::StrCat(host, ":", port);
  return absl::StrCat(absl::StartsWith(path, "/") ? "unix://" : "unix:", path);
}

bool ListenAddress::IsLoopback() const {
  return kind == Kind::kUnix || IsLoopbackHost(host);
}

bool IsLoopbackEndpoint(absl::string_view endpoint) {
  if (!absl::ConsumePrefix(&endpoint, "tcp://")) return true;
  const size_t colon = endpoint.rfind(':');
  return colon != absl::string_view::npos &&
         IsLoopbackHost(endpoint.substr(0, colon));
}

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text) {
  if (text.empty())
    return absl::InvalidArgumentError("listen address is empty");
  if (absl::StartsWith(text, "unix:")) return ParseUnix(text);
  return ParseTcp(text);
}

absl::Status PrepareUnixSocketPath(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", dir.string(),
                     " for unix socket ", path, ": ", ec.message()));
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot stat unix socket path ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("unix socket path ", path,
                     " exists and is not a socket; refusing to remove it"));
  }
  if (SomeoneListens(path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("another process is serving on unix socket ", path,
                     " (is prefixd already running?)"));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot remove stale unix socket ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status ProbeTcpListen(const ListenAddress& a, absl::string_view flag) {
  if (a.kind != ListenAddress::Kind::kTcp || a.port == 0) {
    return absl::OkStatus();
  }
  std::string host = a.host;
  if (absl::StartsWith(host, "[")) host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(a.port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints,
                  &found) != 0) {
    return absl::OkStatus();  // the listener reports names it cannot resolve
  }
  int error = 0;
  for (addrinfo* ai = found; ai != nullptr && error == 0; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;  // a family this host lacks
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) error = errno;
    close(fd);
  }
  freeaddrinfo(found);
  const std::string where =
      absl::StrCat(a.host.empty() ? "*" : a.host, ":", a.port);
  switch (error) {
    case EADDRINUSE:
      return absl::UnavailableError(
          absl::StrCat(where,
                       ": address already in use (is another prefixd "
                       "running? change ",
                       flag, ")"));
    case EACCES:
      return absl::UnavailableError(
          absl::StrCat(where,
                       ": permission denied (ports below 1024 need root or "
                       "CAP_NET_BIND_SERVICE; change ",
                       flag, ")"));
    case EADDRNOTAVAIL:
      return absl::UnavailableError(absl::StrCat(
          where, ": not an address of this host (change ", flag, ")"));
    default:
      return absl::OkStatus();  // nothing to say better than the listener
  }
}

}  // namespace prefixd
