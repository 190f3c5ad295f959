// The daemon's configuration: a textproto or JSON file (prefixd.v1.Config),
// then the command-line flags over it, then the embedded default for
// whatever is still unset, then validation. The result is a ServerConfig:
// plain values the server and the core library take, with every size and
// duration parsed and every model number resolved.
#ifndef PREFIXD_SERVER_CONFIG_H_
#define PREFIXD_SERVER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/cache.h"
#include "index/conductor_answer.h"
#include "index/ingest.h"
#include "index/kv_index.h"
#include "index/picker.h"
#include "index/publisher.h"
#include "model/kv_geometry.h"
#include "prefixd/v1/config.pb.h"
#include "server/engine_load_feed.h"
#include "server/engine_scraper.h"
#include "server/flags.h"
#include "server/kv_event_sockets.h"
#include "server/listen_address.h"
#include "server/sglang_discovery.h"
#include "server/watch.h"

namespace prefixd {

struct ServerConfig {
  std::vector<ListenAddress> listen;
  std::string metrics_listen;
  std::string snapshot_path;  // "" = no snapshot
  uint64_t max_message_bytes = 0;
  absl::Duration drain_timeout;

  ModelSpec model;
  uint64_t bytes_per_token = 0;
  std::string fingerprint;        // Fingerprint(model)
  std::string model_description;  // one line for humans (GetInfo, banner)
  std::vector<std::string>
      model_notes;  // assumptions made reading a config.json

  CacheOptions cache;  // block_size, block_bytes, budget, limits, tenants, ...
  // The fleet index (docs/index.md): on when a source, listen or
  // http_listen is set.
  bool index_enabled = false;
  IndexOptions index;
  IngestOptions ingest;
  // index.sources with a server_info_url: SGLang workers followed by URL.
  SglangDiscoveryOptions sglang_discovery;
  PickerOptions pick;  // index.pick
  // index.pick.engine_metrics: the engines' endpoints Pick's load reads.
  EngineScrapeOptions engine_scrape;
  // index.pick.engine_load_sockets: SGLang's load sockets, read as they
  // send (their readings' max_age is engine_scrape's).
  std::vector<EngineLoadSocket> engine_load_sockets;
  // The Mooncake Conductor API's "host:port" ("" = off) and the index's
  // state directory ("" = registrations not kept).
  std::string index_http_listen;
  std::string index_state_dir;
  // index.http_answer: how the Conductor API answers a JSON /query.
  AnswerForm index_http_answer = AnswerForm::kByTenant;
  // events_publish (docs/index.md, "The sidecar publishes too"): on when its
  // endpoint is set; then cache.detailed_events is on too.
  bool events_publish_enabled = false;
  KvPublisherOptions events_publish;
  PublishLimits events_publish_limits;

  // The merged file + flags with defaults filled in. The settings that have
  // no field above (auth principals, TLS files, metrics) are read from here.
  v1::Config proto;

  // Background work; tests shorten these.
  absl::Duration expire_interval = absl::Milliseconds(100);
  absl::Duration watch_poll_interval = absl::Milliseconds(20);
  // WatchEvents bounds (limits.max_watch_streams_per_tenant, ...).
  WatchLimits watch;
  // Per connection: limits.max_concurrent_streams, max_connection_idle.
  int max_concurrent_streams = 64;
  absl::Duration max_connection_idle = absl::Minutes(5);
  // limits.max_bytes_before_auth: a new stream's HTTP/2 window.
  int max_bytes_before_auth = 64 * 1024;
  // How often events_publish reads the event rings: the most a change
  // waits before it is published, and so the batch rate (at most 100/s).
  absl::Duration events_publish_interval = absl::Milliseconds(10);
};

// Reads `path` as JSON if it ends in .json, else as textproto.
// INVALID_ARGUMENT with the file name (and line and column for textproto)
// on a parse error; NOT_FOUND if it cannot be read.
absl::StatusOr<v1::Config> ReadConfigFile(const std::string& path);

// Several files as one config: their texts joined in order, as `cat` joins
// them (textproto only: repeated fields add up, a field set in two files is
// an error). One path is ReadConfigFile. Errors name the file and its line.
absl::StatusOr<v1::Config> ReadConfigFiles(
    const std::vector<std::string>& paths);

// Writes the set flags over `config`.
void ApplyCommandLine(const CommandLine& flags, v1::Config* config);

// Fills every unset field with the embedded default.
void FillDefaults(v1::Config* config);

// Validates a filled config and resolves it. INVALID_ARGUMENT naming the
// field and the offending value.
absl::StatusOr<ServerConfig> ResolveConfig(const v1::Config& config);

// ReadConfigFiles (if flags.config_paths is set), ApplyCommandLine,
// FillDefaults, ResolveConfig.
absl::StatusOr<ServerConfig> LoadServerConfig(const CommandLine& flags);

// The model and the sizes derived from it, one line each, every line
// starting with `indent`: the start-up banner's ("  ") and --check_config's
// ("# ").
std::string ModelAndSizeLines(const ServerConfig& config,
                              uint64_t budget_blocks, absl::string_view indent);

// What the config exposes without being refused, one sentence each and no
// prefix (the banner prints them after "WARNING: ", --check_config after
// "# WARNING: "): an index `listen` socket other hosts can reach, since KV
// events carry no authentication.
std::vector<std::string> ExposureWarnings(const ServerConfig& config);

// "LRU", or "ADAPTIVE, history 2,048 blocks per tenant" (0 history: the
// budget's blocks).
std::string DescribeEviction(const CacheOptions& options,
                             uint64_t budget_blocks);

// "llama-3-8b: 32 layers x 8 KV heads x 128 head_dim, fp16, RoPE theta 500000
// neox"
std::string DescribeModel(const ModelSpec& spec);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_CONFIG_H_
