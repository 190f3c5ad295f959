// Ingest: the ZeroMQ side of the fleet index (docs/index.md, "Wire"). It
// subscribes to engines' KV event streams, keeps each stream's sequence
// numbers, fetches missing batches from the engine's replay endpoint, and
// applies decoded batches to a FleetIndex.
//
//   sources { name: "vllm-0" endpoint: "tcp://10.0.0.7:5557"
//             replay_endpoint: "tcp://10.0.0.7:5558" }      one worker
//   sources { name: "pool" endpoint: "tcp://vllm.svc:5557" replay_port: 5558 }
//                          one worker per address, re-resolved
//   listen: "tcp://0.0.0.0:5557"       engines connect; topic names them
//
// Sources come and go at run time too (AddSource, RemoveSource): the
// Mooncake Conductor's /register and /unregister (index/conductor_api.h).
// A source removed retires its workers (cleared, reason "removed").
//
// Each source runs on its own thread (the listen socket on one more), so a
// stream's batches are decoded and applied in order, and one slow replay
// holds up only its own source. What their decoding holds at once is
// bounded by one budget they share (decode_budget_bytes). On connecting to an
// engine with a replay endpoint, the stream first replays what the engine still
// buffers, so an index that starts (or restarts) next to running engines
// catches up without waiting for their next events.
//
// Thread safety: every method may be called from any thread; mu_ guards
// the set of sources (a source's own thread touches only its streams and
// the index, which is shared and thread-safe).
#ifndef PREFIXD_INDEX_INGEST_H_
#define PREFIXD_INDEX_INGEST_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "index/decode_budget.h"
#include "index/kv_index.h"
#include "index/pool_resolver.h"

namespace prefixd {

struct IndexSource {
  std::string name;
  std::string endpoint;         // tcp://HOST:PORT (or ipc://PATH)
  std::string replay_endpoint;  // the engine's ROUTER socket; empty: none
  // A pool: one worker per address HOST resolves to, each replayed at
  // tcp://ADDRESS:replay_port (0: no replay). Re-resolved every
  // resolve_interval. A source is a pool when replay_port or
  // resolve_interval is set, or when HOST resolves to several addresses.
  int replay_port = 0;
  absl::Duration resolve_interval = absl::ZeroDuration();
  // What its workers are registered as (each worker's labels.dp_rank is its
  // rank, unless pinned).
  WorkerLabels labels = {};
  // A registration (the Conductor's /register, or a `sources` entry with an
  // instance_id): the stream is one worker, named `name`, of rank
  // labels.dp_rank, whatever rank its batches carry.
  bool pinned = false;
};

struct IngestOptions {
  std::vector<IndexSource> sources;
  std::string listen;  // a SUB socket to bind; empty: none
  absl::Duration replay_timeout = absl::Seconds(2);
  absl::Duration default_resolve_interval = absl::Seconds(10);
  // How often threads look at their stop flag and resolve timers.
  absl::Duration poll_interval = absl::Milliseconds(50);
  // What one replay may bring before it is applied (its batches' payload
  // bytes, their number); a replay past either has failed. vLLM buffers
  // 10,000 batches by default.
  int64_t max_replay_bytes = int64_t{256} << 20;
  size_t max_replay_batches = 100000;
  // Engines on `listen`, one worker per topic: at most this many; when all
  // are taken, one silent for listen_idle makes room for a new topic
  // (retired, its blocks dropped), else the new topic is not followed.
  size_t max_listen_workers = 1024;
  absl::Duration listen_idle = absl::Minutes(10);
  // Connections to `listen` at once (index/listen_gate.h): one more waits,
  // unanswered, until its handshake times out, and its engine connects
  // again. Each may hold 5 messages of up to 16 MiB.
  size_t max_listen_connections = 1024;
  absl::Duration listen_handshake_timeout = absl::Seconds(10);
  // What decoding may hold at once, over every source and the listen
  // socket (index/decode_budget.h): each decode reserves its payload's
  // estimated peak first and waits while the others' leave no room. One
  // payload larger than the budget allows is decoded alone.
  int64_t decode_budget_bytes = int64_t{512} << 20;
};

// Checks endpoints and names; the message names the offending value.
absl::Status ValidateIngestOptions(const IngestOptions& options);
// INVALID_ARGUMENT ("<what> \"<ep>\" is not tcp://HOST:PORT ...") unless
// `ep` is a ZeroMQ endpoint the index may connect to or bind: tcp://HOST:PORT,
// ipc://PATH or inproc://NAME.
absl::Status CheckEndpoint(absl::string_view what, absl::string_view ep);
// The checks of one source alone (all but the uniqueness of its name).
absl::Status ValidateIndexSource(const IndexSource& source);

class Ingest {
 public:
  // Starts a thread per source (and one for `listen`, bound before this
  // returns). UNAVAILABLE if `listen` cannot be bound.
  static absl::StatusOr<std::unique_ptr<Ingest>> Start(KvIndex* index,
                                                       IngestOptions options);
  ~Ingest();
  Ingest(const Ingest&) = delete;
  Ingest& operator=(const Ingest&) = delete;

  // Follows one more source from now on. INVALID_ARGUMENT as
  // ValidateIndexSource, ALREADY_EXISTS for a name in use,
  // FAILED_PRECONDITION after Stop.
  absl::Status AddSource(IndexSource source);
  // Stops following the source named `name` and retires its workers.
  // NOT_FOUND if there is none.
  absl::Status RemoveSource(absl::string_view name);
  // The sources followed now (the config's and those added), by name.
  std::vector<IndexSource> Sources() const;
  // Each pool source's lookups of its host name so far, by name.
  std::vector<PoolLookups> pool_lookups() const;

  // Stops every thread and closes the sockets. Idempotent.
  void Stop();
  // The bound listen endpoint, with a wildcard port resolved; empty if none.
  const std::string& listen_endpoint() const { return listen_endpoint_; }
  // Handshakes on `listen` left unanswered so far as one connection too
  // many (0 without `listen`).
  uint64_t listen_connections_refused() const;
  // What every runner's decoding reserves from (tests read its counters
  // and may hold some of it).
  DecodeBudget& decode_budget() { return *decode_budget_; }

 private:
  class Runner;
  Ingest() = default;

  IngestOptions options_;  // the runners keep a reference; sources unused
  KvIndex* index_ = nullptr;
  std::unique_ptr<DecodeBudget> decode_budget_;  // outlives the runners
  std::string listen_endpoint_;
  mutable Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Runner> listen_runner_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Runner>, std::less<>> runners_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_INGEST_H_
