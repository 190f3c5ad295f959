#include "server/daemon.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/http/conductor_listener.h"
#include "server/http/metrics.h"
#include "server/http/metrics_listener.h"
#include "server/http/sources.h"

namespace prefixd {
namespace {

void Log(absl::string_view line) {
  std::fprintf(stderr, "prefixd: %.*s\n", static_cast<int>(line.size()),
               line.data());
}

// What the HTTP side reads of the running server.
HttpSources SourcesOf(const Server& server) {
  const ServerConfig& c = server.config();
  return {server.cache(),
          server.index(),
          server.events_publisher(),
          {PREFIXD_VERSION, server.epoch(), c.model, c.model_description,
           c.fingerprint, c.bytes_per_token},
          server.picker(),
          server.engine_scraper(),
          server.engine_load_feed(),
          server.sglang_discovery(),
          server.ingest()};
}

absl::Status Prefixed(absl::string_view what, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(what, ": ", status.message()));
}

}  // namespace

Daemon::Daemon() : metrics_(std::make_unique<Metrics>(PREFIXD_VERSION)) {}

Daemon::~Daemon() { Shutdown().IgnoreError(); }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(ServerConfig config) {
  std::unique_ptr<Daemon> daemon(new Daemon());
  ServerDeps deps;
  deps.observer = daemon->metrics_.get();
  // SERVING once the HTTP listeners are up too (StartHttp).
  deps.serve_later = true;
  absl::Status s = daemon->Restore(config, deps);
  if (s.ok()) s = daemon->StartServer(std::move(config), std::move(deps));
  if (!s.ok()) return Prefixed("cannot start", s);
  s = daemon->StartHttp();
  if (!s.ok()) {
    // The server may have served calls already: its cache, not the consumed
    // file, is the state to keep, so it is saved as at a clean stop.
    const absl::Status saved = daemon->DrainAndSave();
    if (daemon->restored_ && !saved.ok()) {
      ReturnConsumedSnapshot(daemon->server_->config().snapshot_path)
          .IgnoreError();
    } else if (daemon->restored_) {
      DiscardConsumedSnapshot(daemon->server_->config().snapshot_path);
    }
    return s;
  }
  if (daemon->restored_) {
    DiscardConsumedSnapshot(daemon->server_->config().snapshot_path);
  }
  daemon->server_->Serve();
  return daemon;
}

// A clean snapshot is consumed here, before anything is served; a bad one
// is moved aside and the daemon starts empty (server/snapshot_file.h).
absl::Status Daemon::Restore(const ServerConfig& config, ServerDeps& deps) {
  const std::string& path = config.snapshot_path;
  if (path.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(snapshot_lock_, SnapshotLock::Acquire(path));
  ASSIGN_OR_RETURN(RestoredSnapshot restored,
                   RestoreSnapshot(path, config.fingerprint, config.cache));
  Log(restored.summary);
  deps.cache = std::move(restored.cache);
  deps.epoch = restored.epoch;
  restored_ = deps.epoch.has_value();
  return absl::OkStatus();
}

absl::Status Daemon::StartServer(ServerConfig config, ServerDeps deps) {
  const std::string path = config.snapshot_path;
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Start(std::move(config), std::move(deps));
  if (!server.ok()) {
    // Nothing was served: the snapshot still holds for the next attempt.
    if (restored_) ReturnConsumedSnapshot(path).IgnoreError();
    return server.status();
  }
  server_ = *std::move(server);
  return absl::OkStatus();
}

// /metrics, the status page and the KV calculator, on metrics_listen.
// Each failure says which listener could not start.
absl::Status Daemon::StartHttp() {
  absl::StatusOr<std::unique_ptr<MetricsListener>> http =
      MetricsListener::Start(server_->config().metrics_listen, metrics_.get(),
                             SourcesOf(*server_));
  if (!http.ok()) return Prefixed("cannot serve metrics", http.status());
  http_ = *std::move(http);
  const ServerConfig& c = server_->config();
  if (c.index_http_listen.empty()) return absl::OkStatus();
  HttpLimits limits;
  limits.max_body_bytes = c.max_message_bytes;
  metrics_->EnableConductorMetrics();
  absl::StatusOr<std::unique_ptr<ConductorListener>> conductor =
      ConductorListener::Start(c.index_http_listen, limits,
                               server_->conductor_api(), &server_->authorizer(),
                               metrics_.get());
  if (!conductor.ok()) {
    return Prefixed("cannot serve the Conductor API", conductor.status());
  }
  conductor_ = *std::move(conductor);
  return absl::OkStatus();
}

std::string Daemon::Banner() const {
  std::string out = StartupBanner(*server_);
  if (conductor_ != nullptr) {
    const ServerConfig& c = server_->config();
    absl::StrAppend(&out, "  index http   ", c.index_http_listen, " (port ",
                    conductor_->port(), conductor_->tls() ? ", HTTPS" : "",
                    "): Mooncake Conductor API, registrations ",
                    c.index_state_dir.empty()
                        ? "not kept (no index.state_dir)"
                        : absl::StrCat("kept in ", c.index_state_dir),
                    "\n");
  }
  return out;
}

absl::Status Daemon::Reload(const ServerConfig& config) {
  return server_->ReloadPrincipals(config.proto);
}

int Daemon::metrics_port() const {
  return http_ == nullptr ? 0 : http_->port();
}

int Daemon::conductor_port() const {
  return conductor_ == nullptr ? 0 : conductor_->port();
}

absl::Status Daemon::Shutdown() {
  if (shut_down_ || server_ == nullptr) return absl::OkStatus();
  const absl::Status saved = DrainAndSave();
  server_.reset();
  return saved;
}

absl::Status Daemon::DrainAndSave() {
  shut_down_ = true;
  conductor_.reset();  // no registration once the ingestion stops
  server_->Shutdown();
  http_.reset();  // no page or scrape may read the cache once it is gone
  const std::string& path = server_->config().snapshot_path;
  if (path.empty()) return absl::OkStatus();
  // Drained: the cache no longer changes, so the file is the final state.
  absl::StatusOr<std::string> saved =
      WriteSnapshot(*server_->cache(),
                    {server_->config().fingerprint, server_->epoch()}, path);
  if (!saved.ok()) {
    Log(absl::StrCat("cannot write the snapshot: ", saved.status().message(),
                     "; the next start will be empty"));
    return saved.status();
  }
  Log(*saved);
  return absl::OkStatus();
}

}  // namespace prefixd
