// What the HTTP side (server/http/) reads of the running daemon: the cache,
// the fleet index and the events publisher, and the facts fixed at start.
// The daemon (server/daemon.h) fills it once the gRPC server is up; the
// HTTP side never sees the Server itself.
#ifndef PREFIXD_SERVER_HTTP_SOURCES_H_
#define PREFIXD_SERVER_HTTP_SOURCES_H_

#include <cstdint>
#include <string>

#include "core/cache.h"
#include "index/ingest.h"
#include "index/kv_index.h"
#include "index/picker.h"
#include "model/kv_geometry.h"
#include "server/engine_load_feed.h"
#include "server/engine_scraper.h"
#include "server/events_publish.h"
#include "server/sglang_discovery.h"

namespace prefixd {

// What the pages show about the daemon besides its live state.
struct DaemonFacts {
  std::string version;
  uint64_t epoch = 0;
  ModelSpec model;
  std::string model_description;
  std::string fingerprint;
  uint64_t bytes_per_token = 0;
};

// Not owned; each must outlive every listener that reads it.
struct HttpSources {
  const PrefixCache* cache = nullptr;                 // required
  const KvIndex* index = nullptr;                     // with the fleet index
  const EventsPublisher* events_publisher = nullptr;  // with events_publish
  DaemonFacts facts;
  const Picker* picker = nullptr;  // with the fleet index
  // With index.pick.engine_metrics.
  const EngineScraper* engine_scraper = nullptr;
  // With index.pick.engine_load_sockets or SGLang workers by URL.
  const EngineLoadFeed* engine_load_feed = nullptr;
  // With index.sources { server_info_url }.
  const SglangDiscovery* sglang_discovery = nullptr;
  const Ingest* ingest = nullptr;  // with the fleet index
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_SOURCES_H_
