// EngineLoadFeed: follows each configured SGLang engine's load PUB socket
// (index.pick.engine_load_sockets; docs/index.md, "Load pushed by SGLang")
// and files each reading (index/load_stat.h) through an EngineLoadFiler,
// stamped with its arrival. SGLang sends a changed reading at once and an
// unchanged one every second, so a reading older than EngineLoads'
// max_age means the engine (or its socket) has gone quiet, and Pick falls
// back to the index's window.
//
// Sockets come from the config (index.pick.engine_load_sockets) and from
// the SGLang workers followed by URL (server/sglang_discovery.h), which
// replace theirs as the workers' /server_info changes.
//
// Thread safety: the receiving runs on the feed's own thread, which owns
// the sockets; SetSockets, Stop and counts may be called from any thread
// (mu_ guards the changes waiting for the thread).
#ifndef PREFIXD_SERVER_ENGINE_LOAD_FEED_H_
#define PREFIXD_SERVER_ENGINE_LOAD_FEED_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "index/engine_loads.h"
#include "server/engine_load_filer.h"

namespace prefixd {

struct EngineLoadSocket {
  std::string worker;    // the index's worker name
  std::string endpoint;  // tcp://HOST:PORT: the engine's load PUB socket
};

class EngineLoadFeed {
 public:
  // Subscribes to every socket (ZeroMQ connects in the background, and
  // reconnects to an engine that restarts) and files their readings in
  // `loads`, which must outlive the feed. INVALID_ARGUMENT naming a
  // malformed endpoint.
  static absl::StatusOr<std::unique_ptr<EngineLoadFeed>> Start(
      std::vector<EngineLoadSocket> sockets, EngineLoads* loads);

  // Follows `sockets` for `owner` instead of those it followed for `owner`
  // before (none: none), from the thread's next wake-up (within 100 ms).
  // The configured sockets' owner is "". A malformed endpoint is logged
  // and skipped.
  void SetSockets(const std::string& owner,
                  std::vector<EngineLoadSocket> sockets);
  ~EngineLoadFeed();
  EngineLoadFeed(const EngineLoadFeed&) = delete;
  EngineLoadFeed& operator=(const EngineLoadFeed&) = delete;

  // Ends the receiving and joins its thread.
  void Stop();

  // Per worker, in the order first followed: its messages so far.
  std::vector<EngineLoadFiler::Counts> counts() const {
    return filer_.counts();
  }

 private:
  explicit EngineLoadFeed(EngineLoads* loads);
  void Run();
  // Applies the changes SetSockets left (the feed's thread).
  void TakeChanges();

  class Subscribers;  // the ZeroMQ sockets (engine_load_feed.cc)
  std::unique_ptr<Subscribers> subscribers_;  // used by the feed's thread
  EngineLoadFiler filer_;  // files each message's reading (the thread's)
  Mutex mu_;
  // Per owner, the sockets SetSockets gave since the thread last looked.
  std::map<std::string, std::vector<EngineLoadSocket>> changes_
      ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};
  std::thread thread_;  // last: joined first
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_ENGINE_LOAD_FEED_H_
