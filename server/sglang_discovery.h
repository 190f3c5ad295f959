// SglangDiscovery: follows SGLang workers named by their URL
// (index.sources with server_info_url; docs/index.md, "Following SGLang
// workers by URL"), as SGLang's own router does: it reads each worker's
// /server_info (index/sglang_server_info.h) and follows every DP rank's
// event socket as an index source and, when the worker publishes its
// load, every rank's load socket for Pick.
//
// Rank 0 is the worker `name`, rank r > 0 the worker `name/dp<r>`, each
// labelled as the entry says, with its rank, the entry's instance_id (or
// `name`) as its instance, and the URL as its address unless one is
// given; rank r replays at replay_port + r on the worker's host when
// replay_port is set (/server_info does not say where SGLang replays).
//
// A worker whose /server_info cannot be read is asked again every
// `retry`; once followed, every `interval`, and the sockets change when
// its answer does (a restart with another --dp-size or ports). A worker
// that stops answering stays followed (ZeroMQ reconnects by itself); one
// that answers without events, or with another block size than the
// index's, is no longer followed. Each outcome is logged when it changes.
//
// Thread safety: the reading runs on its own thread; Stop and counts may
// be called from any thread (the counts are relaxed atomics).
#ifndef PREFIXD_SERVER_SGLANG_DISCOVERY_H_
#define PREFIXD_SERVER_SGLANG_DISCOVERY_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "index/ingest.h"
#include "index/kv_index.h"
#include "index/sglang_server_info.h"
#include "server/engine_load_feed.h"
#include "server/http_fetches.h"
#include "server/periodic.h"

namespace prefixd {

// One worker, as configured.
struct SglangWorker {
  std::string name;
  std::string url;      // its HTTP server: http(s)://HOST:PORT
  int replay_port = 0;  // rank 0's replay port on HOST; 0: no replay
  WorkerLabels labels;  // every rank's (dp_rank is set per rank)
  std::string api_key;  // SGLang's --api-key, sent as a bearer token
  absl::Duration interval = absl::Seconds(10);
};

struct SglangDiscoveryOptions {
  std::vector<SglangWorker> workers;
  int block_size = 16;  // the index's
  absl::Duration retry = absl::Seconds(1);
  absl::Duration timeout = absl::Seconds(2);  // per /server_info request
};

// The host of `url` as ZeroMQ dials it (IPv6 in brackets).
// INVALID_ARGUMENT naming the URL unless it is http(s)://HOST[:PORT][/...].
absl::StatusOr<std::string> WorkerHost(const std::string& url);

class SglangDiscovery {
 public:
  // Starts reading every worker's /server_info at once. Sources go to
  // `ingest`, load sockets to `loads` (nullptr: not followed); both must
  // outlive the discovery.
  static absl::StatusOr<std::unique_ptr<SglangDiscovery>> Start(
      SglangDiscoveryOptions options, Ingest* ingest, EngineLoadFeed* loads);
  ~SglangDiscovery();
  SglangDiscovery(const SglangDiscovery&) = delete;
  SglangDiscovery& operator=(const SglangDiscovery&) = delete;

  // Ends the round in progress and joins; what is followed stays.
  void Stop();

  // Per worker, in the config's order: its /server_info reads so far, ok
  // (followed) or failed (not read, or not followable).
  std::vector<EngineLoadFiler::Counts> counts() const;

 private:
  // What the thread knows of worker i.
  struct State {
    std::string host;  // WorkerHost(url)
    std::optional<SglangEventSockets> followed;
    std::vector<IndexSource> sources;  // its ranks in ingest_
    std::string last_outcome;          // the last logged
    absl::Time next;                   // when to ask again
  };

  SglangDiscovery(SglangDiscoveryOptions options, Ingest* ingest,
                  EngineLoadFeed* loads, std::vector<State> states);
  void Round();
  // Worker i's answer (or why there is none) at `now`.
  void Apply(size_t i, const absl::StatusOr<std::string>& body, absl::Time now);
  // Follows `sockets` (nullopt: nothing) for worker i in place of what
  // it followed.
  void Follow(size_t i, const std::optional<SglangEventSockets>& sockets);
  void Log(size_t i, const std::string& outcome);

  const SglangDiscoveryOptions options_;
  Ingest* const ingest_;
  EngineLoadFeed* const loads_;
  std::vector<State> states_;  // the thread's
  // Per worker: reads that were followed, and the others.
  std::unique_ptr<std::atomic<uint64_t>[]> ok_;
  std::unique_ptr<std::atomic<uint64_t>[]> failed_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<HttpFetches> fetches_;    // the thread's
  std::unique_ptr<PeriodicThread> thread_;  // last: stopped first
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_SGLANG_DISCOVERY_H_
