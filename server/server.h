// The prefixd gRPC server: the PrefixCache service, grpc.health.v1.Health
// and server reflection on every listen address, plus the background work
// (lease expiry, WatchEvents polling). Usable in-process: tests start it on
// port 0, read the bound addresses, and shut it down.
//
//   absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
//   ... (*server)->addresses() ...
//   (*server)->Shutdown();  // NOT_SERVING, drain, stop
#ifndef PREFIXD_SERVER_SERVER_H_
#define PREFIXD_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "core/cache.h"
#include "index/conductor_api.h"
#include "index/conductor_registry.h"
#include "index/engine_loads.h"
#include "index/fleet_index.h"
#include "index/ingest.h"
#include "index/instrumented_index.h"
#include "index/picker.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/engine_load_feed.h"
#include "server/engine_scraper.h"
#include "server/events_publish.h"
#include "server/index_service.h"
#include "server/kv_indexer_service.h"
#include "server/periodic.h"
#include "server/service.h"
#include "server/sglang_discovery.h"
#include "server/watch.h"

namespace grpc {
class Channel;
class Server;
class Service;
}  // namespace grpc

namespace prefixd {

// What Start() builds from the config unless given. Restoring a snapshot
// passes its cache and epoch; auth and metrics pass their implementations.
struct ServerDeps {
  std::unique_ptr<PrefixCache>
      cache;                      // nullptr: PrefixCache::Create(config.cache)
  std::optional<uint64_t> epoch;  // unset: a fresh random non-zero epoch
  std::unique_ptr<Authorizer>
      authorizer;                   // nullptr: MakeAuthorizer(config.proto)
  RpcObserver* observer = nullptr;  // not owned; must outlive the Server
  // More services on the same listeners and threads: the benchmarks' bare
  // baseline RPC (bench/load). Not owned; must outlive the Server.
  std::vector<grpc::Service*> extra_services;
  // Health stays NOT_SERVING until the owner calls Server::Serve: for an
  // owner with more listeners to start first (Daemon's HTTP ones), so that
  // a probe that sees SERVING finds every front door open.
  bool serve_later = false;
};

// Thread safety: every method may be called from any thread.
class Server {
 public:
  // Binds every listen address and starts serving; health is SERVING when
  // this returns (unless deps.serve_later). Errors name the address or
  // setting at fault.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerConfig config,
                                                       ServerDeps deps = {});
  // Health SERVING, for the services this server runs.
  void Serve();
  // Shuts down if that has not happened yet.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Graceful stop: health NOT_SERVING, WatchEvents streams end with
  // UNAVAILABLE, new calls are refused, in-flight calls get until
  // config.drain_timeout to finish (then they are cancelled), background
  // threads stop. Idempotent; returns when all of that is done.
  void Shutdown();

  // One per config.listen entry, in order, as clients dial them: TCP with
  // the bound port (port 0 resolved), Unix as "unix:///path".
  const std::vector<std::string>& addresses() const { return addresses_; }
  // A channel to this server without a socket (fuzzers, benchmarks). It
  // skips the listeners' transport security: for tests only.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  uint64_t epoch() const { return epoch_; }
  PrefixCache* cache() const { return cache_.get(); }
  // The fleet index (instrumented for the metrics); nullptr unless
  // config.index_enabled.
  KvIndex* index() const { return index_.get(); }
  // Pick's state over that index; nullptr without it.
  const Picker* picker() const { return picker_.get(); }
  // The reader of the engines' metrics; nullptr without
  // index.pick.engine_metrics.
  const EngineScraper* engine_scraper() const { return engine_scraper_.get(); }
  const Ingest* ingest() const { return ingest_.get(); }  // null: no index
  const SglangDiscovery* sglang_discovery() const {
    return sglang_discovery_.get();
  }
  // The follower of SGLang's load sockets; nullptr without
  // index.pick.engine_load_sockets.
  const EngineLoadFeed* engine_load_feed() const {
    return engine_load_feed_.get();
  }
  // The bound index listen endpoint (a wildcard port resolved); "" if none.
  std::string index_listen_endpoint() const {
    return ingest_ == nullptr ? "" : ingest_->listen_endpoint();
  }
  // The Mooncake Conductor API over the index (its HTTP listener is the
  // daemon's); nullptr unless config.index_http_listen is set.
  const ConductorApi* conductor_api() const { return conductor_api_.get(); }
  // The KV event publisher; nullptr unless config.events_publish_enabled.
  const EventsPublisher* events_publisher() const {
    return events_publisher_.get();
  }
  const Authorizer& authorizer() const { return *authorizer_; }
  // SIGHUP: the principals of `config` from now on (Authorizer::Reload),
  // and WatchEvents streams whose principal lost its access end
  // (EventWatchers::EndRevoked); on error nothing changes.
  absl::Status ReloadPrincipals(const v1::Config& config);
  const ServerConfig& config() const { return config_; }

 private:
  Server(ServerConfig config, ServerDeps deps, uint64_t epoch);
  // Build: the services, then the gRPC server on every listener, then what
  // runs beside it.
  absl::Status Build();
  absl::Status BuildServices();
  absl::Status StartGrpc();
  absl::Status StartBackground();
  // The ingestion of the index's sources, and the registrations kept in
  // index.state_dir.
  absl::Status StartIngest();
  // The engines' load readings for Pick (engine_scrape, engine_load_sockets).
  absl::Status StartEngineLoads();
  bool FollowsSglangLoads() const;

  const ServerConfig config_;
  const uint64_t epoch_;
  std::unique_ptr<PrefixCache> cache_;
  std::unique_ptr<Authorizer> authorizer_;
  RpcObserver* const observer_;
  const std::vector<grpc::Service*> extra_services_;
  const bool serve_later_;  // ServerDeps::serve_later
  std::unique_ptr<EventWatchers> watchers_;
  std::unique_ptr<PrefixCacheService> service_;
  std::unique_ptr<FleetIndex> fleet_index_;
  std::unique_ptr<InstrumentedIndex> index_;  // wraps fleet_index_
  // The engines' own load readings, their scraper and SGLang's load
  // sockets' follower; nullptr without index.pick.engine_metrics and
  // engine_load_sockets.
  std::unique_ptr<EngineLoads> engine_loads_;
  std::unique_ptr<Picker> picker_;  // asks index_ and engine_loads_
  std::unique_ptr<EngineScraper> engine_scraper_;     // fills engine_loads_
  std::unique_ptr<EngineLoadFeed> engine_load_feed_;  // fills engine_loads_
  std::unique_ptr<Ingest> ingest_;
  // Adds and removes sources of ingest_ and load sockets of
  // engine_load_feed_.
  std::unique_ptr<SglangDiscovery> sglang_discovery_;
  std::unique_ptr<ConductorRegistry> conductor_registry_;  // uses ingest_
  std::unique_ptr<ConductorApi> conductor_api_;
  std::unique_ptr<PrefixIndexService> index_service_;
  // SGLang's KV indexer API over the same index (index/external_kv.h).
  std::unique_ptr<ExternalKv> external_kv_;
  std::unique_ptr<KvIndexerService> kv_indexer_service_;
  std::unique_ptr<EventsPublisher> events_publisher_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::vector<std::string> addresses_;
  std::unique_ptr<PeriodicThread> lease_expirer_;
  Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

// What the daemon serves, for the start-up log: addresses, model, block
// size, bytes per token and per block, budget in bytes and blocks, auth.
std::string StartupBanner(const Server& server);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_SERVER_H_
