// Listen addresses as operators write them (`--listen`, `listen:`): TCP
// "host:port" and Unix domain sockets "unix:///abs/path" or "unix:rel/path".
#ifndef PREFIXD_SERVER_LISTEN_ADDRESS_H_
#define PREFIXD_SERVER_LISTEN_ADDRESS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prefixd {

struct ListenAddress {
  enum class Kind { kTcp, kUnix };
  Kind kind = Kind::kTcp;
  std::string host;  // kTcp: as written, IPv6 in brackets; "" = every interface
  int port = 0;      // kTcp: 0 = the kernel picks one (tests)
  std::string path;  // kUnix: the socket file

  // The form gRPC's ServerBuilder takes: "host:port" or "unix:path".
  std::string ToGrpcUri() const;
  // Unix sockets and TCP on 127.0.0.0/8, ::1 or "localhost".
  bool IsLoopback() const;
};

// INVALID_ARGUMENT quoting `text` for anything gRPC could not bind as meant:
// a missing or out-of-range port, an empty host part in brackets, an empty
// or over-long (> 107 bytes, the sun_path limit) socket path.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text);

// Whether only this host can reach a ZeroMQ endpoint: ipc:// and inproc://,
// or tcp:// on a loopback host (as IsLoopback). "tcp://*:5557" and
// "tcp://0.0.0.0:5557" are every interface: false.
bool IsLoopbackEndpoint(absl::string_view endpoint);

// Makes a Unix socket path bindable: creates its directory if missing and
// removes a socket file left by a process that is gone. FAILED_PRECONDITION
// if another process still accepts connections there or the path is not a
// socket (we never delete what we did not create).
absl::Status PrepareUnixSocketPath(const std::string& path);

// Whether a TCP listener could bind `a` now (a socket is bound with
// SO_REUSEADDR, as gRPC and civetweb bind theirs, and closed again), so that
// a port in use is reported in one line before gRPC or civetweb try and
// report it in theirs. OK for port 0 and for what cannot be probed here
// (a family the host lacks: the listener itself decides); else UNAVAILABLE
// "HOST:PORT: address already in use (is another prefixd running? change
// FLAG)", or permission denied (ports below 1024), or not an address of
// this host. `flag` names what sets the address ("--listen").
absl::Status ProbeTcpListen(const ListenAddress& a, absl::string_view flag);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_LISTEN_ADDRESS_H_
