#include "server/server.h"

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "model/units.h"
#include "server/check_config.h"

namespace prefixd {
namespace {

constexpr char kServiceName[] = "prefixd.v1.PrefixCache";
constexpr char kIndexServiceName[] = "prefixd.v1.PrefixIndex";
constexpr char kKvIndexerServiceName[] = "kv_indexer.v1.KVIndexer";

// The index's worker names, sorted (Stats lists them by name).
std::vector<std::string> WorkerNames(const KvIndex& index) {
  std::vector<std::string> names;
  for (const WorkerStatus& w : index.Stats().workers) names.push_back(w.worker);
  return names;
}

uint64_t NewEpoch() {
  absl::BitGen gen;
  uint64_t epoch = 0;
  while (epoch == 0) epoch = absl::Uniform<uint64_t>(gen);
  return epoch;
}

// Process-wide gRPC switches; they must be set before the first builder.
void InitGrpcOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  });
}

// What one peer may hold and send, on every listener.
void SetChannelLimits(const ServerConfig& config, bool authenticated,
                      grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  // gRPC sets SO_REUSEPORT by default: a second daemon on the same port would
  // start fine and take half the connections with a cache of its own.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // What one peer can hold open, authenticated or not: calls per
  // connection, and connections that carry no call (a peer that sent the
  // HTTP/2 preface and nothing else) are closed once idle.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             config.max_concurrent_streams);
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(std::min<int64_t>(
          absl::ToInt64Milliseconds(config.max_connection_idle),
          std::numeric_limits<int>::max())));
  // With authentication on, a new stream's HTTP/2 window is what a peer may
  // send before the daemon reads any of it: all that a call refused from
  // its metadata (auth.h) makes the daemon buffer. BDP probing would raise
  // every new stream's window to megabytes (4 MiB measured); without it a
  // stream starts at limits.max_bytes_before_auth and grows only while its
  // message is read. Auth off has no unauthenticated peer (it serves
  // loopback and Unix sockets only) and keeps gRPC's defaults: the small
  // window costs a 2k-token Match about 15 us of server CPU (T6,
  // docs/performance.md).
  if (authenticated) {
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               config.max_bytes_before_auth);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerConfig config,
                                                      ServerDeps deps) {
  if (deps.cache == nullptr) {
    absl::StatusOr<std::unique_ptr<PrefixCache>> cache =
        PrefixCache::Create(config.cache);
    if (!cache.ok()) return CacheConfigError(config.proto, cache.status());
    deps.cache = *std::move(cache);
  }
  if (deps.authorizer == nullptr) {
    ASSIGN_OR_RETURN(deps.authorizer, MakeAuthorizer(config.proto));
  }
  uint64_t epoch = deps.epoch.value_or(0) != 0 ? *deps.epoch : NewEpoch();
  std::unique_ptr<Server> server(
      new Server(std::move(config), std::move(deps), epoch));
  RETURN_IF_ERROR(server->Build());
  return server;
}

Server::Server(ServerConfig config, ServerDeps deps, uint64_t epoch)
    : config_(std::move(config)),
      epoch_(epoch),
      cache_(std::move(deps.cache)),
      authorizer_(std::move(deps.authorizer)),
      observer_(deps.observer),
      extra_services_(std::move(deps.extra_services)),
      serve_later_(deps.serve_later) {}

absl::Status Server::ReloadPrincipals(const v1::Config& config) {
  RETURN_IF_ERROR(authorizer_->Reload(config));
  watchers_->EndRevoked();
  return absl::OkStatus();
}

absl::Status Server::Build() {
  InitGrpcOnce();
  RETURN_IF_ERROR(BuildServices());
  RETURN_IF_ERROR(StartGrpc());
  return StartBackground();
}

absl::Status Server::BuildServices() {
  watchers_ = std::make_unique<EventWatchers>(
      cache_.get(), epoch_, config_.watch_poll_interval, config_.watch);
  service_ = std::make_unique<PrefixCacheService>(
      cache_.get(), authorizer_.get(), watchers_.get(),
      ServiceInfo::From(config_, epoch_), observer_);
  if (config_.index_enabled) {
    fleet_index_ = std::make_unique<FleetIndex>(config_.index);
    index_ = std::make_unique<InstrumentedIndex>(fleet_index_.get());
    RouteLimits route_limits;
    route_limits.max_answer_bytes = config_.max_message_bytes;
    if (!config_.engine_scrape.targets.empty() ||
        !config_.engine_load_sockets.empty() || FollowsSglangLoads()) {
      engine_loads_ =
          std::make_unique<EngineLoads>(config_.engine_scrape.max_age);
    }
    picker_ = std::make_unique<Picker>(index_.get(), config_.pick,
                                       engine_loads_.get());
    index_service_ = std::make_unique<PrefixIndexService>(
        index_.get(), picker_.get(), authorizer_.get(),
        cache_->options().limits, route_limits, observer_);
    external_kv_ =
        std::make_unique<ExternalKv>(index_.get(), ExternalKv::Options());
    kv_indexer_service_ = std::make_unique<KvIndexerService>(
        external_kv_.get(), authorizer_.get(), cache_->options().limits,
        observer_);
  }
  if (config_.events_publish_enabled) {
    if (!cache_->options().detailed_events) {
      return absl::FailedPreconditionError(
          "events_publish needs a cache created with detailed_events (stored "
          "events carrying their tokens)");
    }
    ASSIGN_OR_RETURN(
        events_publisher_,
        EventsPublisher::Start(cache_.get(), config_.events_publish,
                               config_.events_publish_limits,
                               config_.events_publish_interval));
  }
  return absl::OkStatus();
}

absl::Status Server::StartGrpc() {
  grpc::ServerBuilder builder;
  std::vector<int> ports(config_.listen.size(), 0);
  for (size_t i = 0; i < config_.listen.size(); ++i) {
    const ListenAddress& a = config_.listen[i];
    if (a.kind == ListenAddress::Kind::kUnix) {
      RETURN_IF_ERROR(PrepareUnixSocketPath(a.path));
    }
    RETURN_IF_ERROR(ProbeTcpListen(a, "--listen or listen in the config"));
    builder.AddListeningPort(a.ToGrpcUri(), authorizer_->Credentials(a),
                             &ports[i]);
  }
  SetChannelLimits(config_, authorizer_->mode() != "NONE", builder);
  builder.RegisterService(service_.get());
  if (index_service_ != nullptr) builder.RegisterService(index_service_.get());
  if (kv_indexer_service_ != nullptr)
    builder.RegisterService(kv_indexer_service_.get());
  for (grpc::Service* s : extra_services_) builder.RegisterService(s);
  grpc_server_ = builder.BuildAndStart();

  std::vector<std::string> uris;
  for (const ListenAddress& a : config_.listen) uris.push_back(a.ToGrpcUri());
  if (grpc_server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "could not listen on every address of [", absl::StrJoin(uris, ", "),
        "]: one is in use or not bindable (gRPC logged which above)"));
  }
  // gRPC's health service starts with the server as a whole ("") SERVING:
  // not until Serve.
  grpc_server_->GetHealthCheckService()->SetServingStatus("", false);
  for (size_t i = 0; i < config_.listen.size(); ++i) {
    const ListenAddress& a = config_.listen[i];
    if (a.kind == ListenAddress::Kind::kUnix) {
      addresses_.push_back(uris[i]);
    } else if (ports[i] == 0) {
      Shutdown();
      return absl::UnavailableError(
          absl::StrCat("could not listen on ", uris[i]));
    } else {
      addresses_.push_back(absl::StrCat(a.host, ":", ports[i]));
    }
  }
  return absl::OkStatus();
}

// Once the listeners serve: the index's ingestion, lease expiry, and
// health SERVING unless the owner says when (serve_later).
absl::Status Server::StartBackground() {
  if (index_ != nullptr) {
    if (absl::Status s = StartIngest(); !s.ok()) {
      Shutdown();
      return s;
    }
    if (absl::Status s = StartEngineLoads(); !s.ok()) {
      Shutdown();
      return s;
    }
  }
  lease_expirer_ = std::make_unique<PeriodicThread>(
      config_.expire_interval,
      [cache = cache_.get()] { cache->ExpireLeases(); });
  if (!serve_later_) Serve();
  return absl::OkStatus();
}

// The engines' own loads for Pick: their metrics endpoints, scraped, and
// SGLang's load sockets, followed; and the SGLang workers followed by URL,
// whose sockets go to ingest_ and the load feed.
absl::Status Server::StartEngineLoads() {
  if (!config_.engine_scrape.targets.empty()) {
    ASSIGN_OR_RETURN(
        engine_scraper_,
        EngineScraper::Start(
            config_.engine_scrape, engine_loads_.get(),
            [index = index_.get()] { return WorkerNames(*index); }));
  }
  if (!config_.engine_load_sockets.empty() || FollowsSglangLoads()) {
    ASSIGN_OR_RETURN(engine_load_feed_,
                     EngineLoadFeed::Start(config_.engine_load_sockets,
                                           engine_loads_.get()));
  }
  if (!config_.sglang_discovery.workers.empty()) {
    ASSIGN_OR_RETURN(
        sglang_discovery_,
        SglangDiscovery::Start(config_.sglang_discovery, ingest_.get(),
                               engine_load_feed_.get()));
  }
  return absl::OkStatus();
}

// SGLang workers followed by URL have their load sockets followed too,
// unless Pick runs on a replayed trace's clock.
bool Server::FollowsSglangLoads() const {
  return !config_.sglang_discovery.workers.empty() &&
         !config_.pick.replay_clock;
}

void Server::Serve() {
  grpc::HealthCheckServiceInterface* health =
      grpc_server_->GetHealthCheckService();
  if (index_ != nullptr) {
    health->SetServingStatus(kIndexServiceName, true);
    health->SetServingStatus(kKvIndexerServiceName, true);
  }
  health->SetServingStatus(kServiceName, true);
  health->SetServingStatus("", true);
}

absl::Status Server::StartIngest() {
  ASSIGN_OR_RETURN(ingest_, Ingest::Start(index_.get(), config_.ingest));
  if (config_.index_http_listen.empty()) return absl::OkStatus();
  conductor_registry_ = std::make_unique<ConductorRegistry>(
      ingest_.get(), config_.index_state_dir, config_.index.block_size);
  RETURN_IF_ERROR(conductor_registry_->Restore());
  ConductorLimits limits;
  limits.max_tokens = cache_->options().limits.max_tokens_per_request;
  limits.max_hashes = cache_->options().limits.max_block_ids_per_request;
  conductor_api_ =
      std::make_unique<ConductorApi>(index_.get(), conductor_registry_.get(),
                                     limits, config_.index_http_answer);
  return absl::OkStatus();
}

Server::~Server() { Shutdown(); }

std::shared_ptr<grpc::Channel> Server::InProcessChannel() {
  return grpc_server_->InProcessChannel(grpc::ChannelArguments());
}

void Server::Shutdown() {
  // Held for the whole drain, so a second caller returns only when it is over.
  MutexLock lock(&shutdown_mu_);
  if (shut_down_ || grpc_server_ == nullptr) return;
  shut_down_ = true;
  grpc_server_->GetHealthCheckService()->SetServingStatus(false);
  watchers_->Shutdown();
  grpc_server_->Shutdown(
      absl::ToChronoTime(absl::Now() + config_.drain_timeout));
  grpc_server_->Wait();
  if (sglang_discovery_ != nullptr) sglang_discovery_->Stop();
  if (ingest_ != nullptr) ingest_->Stop();
  if (engine_scraper_ != nullptr) engine_scraper_->Stop();
  if (engine_load_feed_ != nullptr) engine_load_feed_->Stop();
  if (events_publisher_ != nullptr) events_publisher_->Stop();
  if (lease_expirer_ != nullptr) lease_expirer_->Stop();
}

namespace {

// The fleet index's lines: its tree, each source, the listen endpoint.
std::string IndexBanner(const Server& server) {
  const ServerConfig& c = server.config();
  const IngestOptions& in = c.ingest;
  std::string out =
      absl::StrCat("  index        block size ", c.index.block_size, ", max ",
                   FormatCount(c.index.max_entries), " entries, decode budget ",
                   FormatBytes(static_cast<uint64_t>(in.decode_budget_bytes)),
                   ", services prefixd.v1.PrefixIndex and "
                   "kv_indexer.v1.KVIndexer\n");
  for (const IndexSource& src : in.sources) {
    std::string replay =
        src.replay_port != 0
            ? absl::StrCat(" (a pool) replay port ", src.replay_port,
                           " on every address")
        : src.replay_endpoint.empty()
            ? " (no replay endpoint: a lost batch clears it)"
            : absl::StrCat(" replay ", src.replay_endpoint);
    absl::StrAppend(&out, "  index source ", src.name, " ", src.endpoint,
                    replay, "\n");
  }
  for (const SglangWorker& w : c.sglang_discovery.workers) {
    absl::StrAppend(&out, "  index source ", w.name, " SGLang at ", w.url,
                    " (its /server_info names the sockets)\n");
  }
  for (const EngineMetricsTarget& t : c.engine_scrape.targets) {
    absl::StrAppend(&out, "  index engine metrics ", t.worker, " ", t.url,
                    " every ", absl::FormatDuration(c.engine_scrape.interval),
                    "\n");
  }
  for (const EngineLoadSocket& l : c.engine_load_sockets) {
    absl::StrAppend(&out, "  index engine load ", l.worker, " ", l.endpoint,
                    "\n");
  }
  if (!in.listen.empty()) {
    absl::StrAppend(&out, "  index listen ", server.index_listen_endpoint(),
                    "\n");
  }
  return out;
}

std::string EventsBanner(const EventsPublisher& p) {
  return absl::StrCat(
      "  events pub   ", p.endpoint(), " topic \"", p.options().topic, "\"\n",
      "  events replay ",
      p.replay_endpoint().empty()
          ? "none (a lost batch clears this daemon in the index)"
          : absl::StrCat(p.replay_endpoint(), " (last ",
                         p.options().buffer_batches, " batches)"),
      "\n");
}

// Authentication, and every warning about what the listeners expose.
std::string AuthBanner(const Server& server) {
  const ServerConfig& c = server.config();
  std::string out =
      absl::StrCat("  auth         ", server.authorizer().mode(), "\n");
  for (const std::string& w : server.authorizer().Warnings(c.listen))
    absl::StrAppend(&out, "WARNING: ", w, "\n");
  for (const std::string& w : ExposureWarnings(c))
    absl::StrAppend(&out, "WARNING: ", w, "\n");
  if (server.authorizer().mode() == "NONE") {
    absl::StrAppend(&out,
                    "WARNING: authentication is OFF. Every process that can "
                    "reach the addresses above "
                    "can read, fill and wipe the cache of every tenant "
                    "(x-prefixd-tenant is taken on "
                    "trust). Serve only loopback and Unix sockets this way; "
                    "set auth.mode for anything "
                    "else.\n");
  }
  return out;
}

}  // namespace

std::string StartupBanner(const Server& server) {
  const ServerConfig& c = server.config();
  const CacheOptions& o = server.cache()->options();
  const uint64_t blocks = server.cache()->budget_blocks();
  std::string out = absl::StrFormat("prefixd %s serving, epoch %016x\n",
                                    PREFIXD_VERSION, server.epoch());
  for (const std::string& a : server.addresses())
    absl::StrAppend(&out, "  listen       ", a, "\n");
  absl::StrAppend(&out, "  metrics      ", c.metrics_listen, "/metrics\n");
  absl::StrAppend(&out, ModelAndSizeLines(c, blocks, "  "));
  absl::StrAppend(&out, "  lease ttl    ",
                  absl::FormatDuration(o.default_lease_ttl), "\n");
  absl::StrAppend(&out, "  tenants      ", o.tenants.size(), " configured",
                  o.dynamic_tenants
                      ? absl::StrCat(", others created on first use (up to ",
                                     o.limits.max_tenants, " in all)")
                      : "",
                  "\n");
  absl::StrAppend(&out, "  snapshot     ",
                  c.snapshot_path.empty()
                      ? "none"
                      : c.snapshot_path + " (written at shutdown, read once)",
                  "\n");
  if (server.index() != nullptr) absl::StrAppend(&out, IndexBanner(server));
  if (const EventsPublisher* p = server.events_publisher(); p != nullptr) {
    absl::StrAppend(&out, EventsBanner(*p));
  }
  return out + AuthBanner(server);
}

}  // namespace prefixd
