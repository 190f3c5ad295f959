// Daemon: the running prefixd, everything main() starts and stops, in
// order, so that main() only parses flags, starts it, waits for a signal and
// stops it (as gRPC's route_guide RunServer does):
//
//   start:  the snapshot lock, RestoreSnapshot     (with snapshot_path)
//           Server::Start: gRPC listeners, the fleet index, the publisher
//           the HTTP side on metrics_listen: /metrics, the status page, the
//           KV calculator; and the Conductor API on index.http_listen
//           the consumed snapshot is discarded once all of that serves
//   stop:   Server::Shutdown (drain), the HTTP side stops, WriteSnapshot
//
// A start that fails leaves nothing running and the snapshot where the next
// start finds it: when the gRPC server could not start, nothing was served
// and the consumed file is renamed back; when it served but the HTTP side
// could not, calls may have changed the cache, so it is drained and saved as
// at a clean stop (server/snapshot_file.h, docs/operations.md).
//
//   absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(config);
//   std::fputs(daemon->Banner().c_str(), stdout);
//   ... wait for SIGTERM ...
//   absl::Status saved = (*daemon)->Shutdown();
//
// What it restored and saved is logged to stderr, one line each, as
// "prefixd: ...".
//
// Thread safety: none; one thread (main's) calls every method.
#ifndef PREFIXD_SERVER_DAEMON_H_
#define PREFIXD_SERVER_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/server.h"
#include "server/snapshot_file.h"

namespace prefixd {

class ConductorListener;
class Metrics;
class MetricsListener;

class Daemon {
 public:
  // Starts everything `config` asks for. Errors say which step failed:
  // "cannot start: ..." (the snapshot, a gRPC listener, the index) or
  // "cannot serve metrics: ..." (the HTTP listener).
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(ServerConfig config);
  // Shuts down if that has not happened yet.
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // What the daemon serves, for the start-up log (server.h's StartupBanner).
  std::string Banner() const;

  // SIGHUP: the principals and TLS files of `config` from now on
  // (Server::ReloadPrincipals); on error nothing changes.
  absl::Status Reload(const ServerConfig& config);

  // Graceful stop: the gRPC server drains (up to drain_timeout), the HTTP
  // side stops, and with snapshot_path the cache is written there. An error
  // when the snapshot could not be written (the next start will be empty).
  // Idempotent: a second call does nothing and returns OK.
  absl::Status Shutdown();

  Server& server() const { return *server_; }
  // The HTTP listener's port (metrics_listen's port resolved).
  int metrics_port() const;
  // The Conductor API's port (index.http_listen's resolved); 0 when off.
  int conductor_port() const;

 private:
  Daemon();
  // The snapshot lock and what RestoreSnapshot gave; a fresh cache without
  // snapshot_path.
  absl::Status Restore(const ServerConfig& config, ServerDeps& deps);
  absl::Status StartServer(ServerConfig config, ServerDeps deps);
  absl::Status StartHttp();
  // Drains and saves; the end of a clean stop and of a start whose HTTP side
  // failed after the gRPC server served.
  absl::Status DrainAndSave();

  // Declared first, so destroyed last: held until the process ends.
  std::unique_ptr<SnapshotLock> snapshot_lock_;
  bool restored_ = false;  // the cache came from the snapshot
  // Sees every RPC from the first; must outlive the server.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Server> server_;
  // The HTTP side (server/http/); reads the server's cache: goes before it.
  std::unique_ptr<MetricsListener> http_;
  // The Mooncake Conductor API (index.http_listen); registers sources with
  // the server's ingestion: goes before the server stops.
  std::unique_ptr<ConductorListener> conductor_;
  bool shut_down_ = false;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_DAEMON_H_
