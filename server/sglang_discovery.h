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
// A pool (a URL whose host names a Kubernetes headless Service) is one
// such worker per address the host resolves to (index/zmq_dial.h), named
// `name/<address>:<port>`, read at http(s)://<address>:<port> and labelled
// with that name as its instance and that URL as its address. The host is
// resolved again every `interval`: a new address is followed from the next
// round, and the worker of one that is gone stops being followed (its
// ranks retired, its load sockets closed).
//
// A worker whose /server_info cannot be read is asked again every
// `retry`; once followed, every `interval`, and the sockets change when
// its answer does (a restart with another --dp-size or ports). A worker
// that stops answering stays followed (ZeroMQ reconnects by itself); one
// that answers without events, or with another block size than the
// index's, is no longer followed. Each outcome is logged when it changes.
//
// Thread safety: the reading runs on its own thread; Stop, counts and
// pool_lookups may be called from any thread (reads_ guards its counts,
// each pool's resolver counts in atomics; the rest is the thread's own).
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
#include "index/pool_resolver.h"
#include "index/sglang_server_info.h"
#include "server/engine_load_feed.h"
#include "server/http_fetches.h"
#include "server/periodic.h"
#include "server/read_counts.h"

namespace prefixd {

// One worker, as configured.
struct SglangWorker {
  std::string name;
  std::string url;      // its HTTP server: http(s)://HOST:PORT
  int replay_port = 0;  // rank 0's replay port on HOST; 0: no replay
  WorkerLabels labels;  // every rank's (dp_rank is set per rank)
  std::string api_key;  // SGLang's --api-key, sent as a bearer token
  absl::Duration interval = absl::Seconds(10);
  // The URL's host names a pool: a worker per address (also when it
  // resolves to several addresses without this).
  bool pool = false;
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

  // Per worker (a pool's, each address's, also after it went), in the
  // order they were first followed: its /server_info reads so far, ok
  // (followed) or failed (not read, or not followable).
  std::vector<EngineLoadFiler::Counts> counts() const;
  // Each pool's lookups of its host name so far; any thread.
  std::vector<PoolLookups> pool_lookups() const;

 private:
  // One /server_info the thread reads: a configured worker, or one
  // address of a pool.
  struct Member {
    size_t entry = 0;     // in options_.workers
    std::string address;  // of the pool's host; "" for a configured worker
    std::string name;     // the worker of rank 0
    // Its HTTP server, read at url/server_info; a pool's member at the
    // pool's URL, connected to `address` (its url names the address).
    std::string url;
    std::string host;    // the URL's host, as ZeroMQ dials it
    size_t counter = 0;  // in reads_
    std::optional<SglangEventSockets> followed;
    std::vector<IndexSource> sources;  // its ranks in ingest_
    std::string last_outcome;          // the last logged
    absl::Time next;                   // when to ask again
  };
  // A pool entry: its host's resolutions, and the addresses its members
  // follow.
  struct Pool {
    size_t entry = 0;
    std::unique_ptr<PoolResolver> resolver;  // lookups() from any thread
    std::vector<std::string> addresses;
    absl::Time next = absl::InfinitePast();  // when to resolve again
  };

  SglangDiscovery(SglangDiscoveryOptions options, Ingest* ingest,
                  EngineLoadFeed* loads);
  void Round();
  // Resolves pool p's host; true when its addresses changed (the members
  // were added or dropped). A lookup that was not answered changes nothing.
  bool Resolve(Pool& p, absl::Time now);
  void AddMember(size_t entry, std::string address, std::string name,
                 std::string url, std::string host);
  void MakeFetches();
  // Member i's answer (or why there is none) at `now`.
  void Apply(size_t i, const absl::StatusOr<std::string>& body, absl::Time now);
  // Follows `sockets` (nullopt: nothing) for member i in place of what
  // it followed.
  void Follow(size_t i, const std::optional<SglangEventSockets>& sockets);
  // Rank r's index source when member m follows `s`.
  IndexSource RankSource(const Member& m, const SglangEventSockets& s,
                         int rank) const;
  void Log(Member& m, const std::string& outcome);

  const SglangDiscoveryOptions options_;
  Ingest* const ingest_;
  EngineLoadFeed* const loads_;
  std::vector<Member> members_;  // the thread's
  // Fixed at Start; the thread's, but for each resolver's lookups().
  std::vector<Pool> pools_;
  ReadCounts reads_;  // per worker ever followed
  std::atomic<bool> stopping_{false};
  std::unique_ptr<HttpFetches> fetches_;    // the thread's; one per member
  std::unique_ptr<PeriodicThread> thread_;  // last: stopped first
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_SGLANG_DISCOVERY_H_
