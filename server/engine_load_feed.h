// EngineLoadFeed: follows each configured SGLang engine's load PUB socket
// (index.pick.engine_load_sockets; docs/index.md, "Load pushed by SGLang")
// and files each reading (index/load_stat.h) in EngineLoads for Pick,
// stamped with its arrival. SGLang sends a changed reading at once and an
// unchanged one every second, so a reading older than EngineLoads'
// max_age means the engine (or its socket) has gone quiet, and Pick falls
// back to the index's window. A message that does not decode is counted
// and logged when it starts a run of such messages or gives a new reason,
// and so is the first good one after them.
//
// Thread safety: the receiving runs on the feed's own thread, which owns
// the sockets; Stop and counts may be called from any thread.
#ifndef PREFIXD_SERVER_ENGINE_LOAD_FEED_H_
#define PREFIXD_SERVER_ENGINE_LOAD_FEED_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "index/engine_loads.h"

namespace prefixd {

struct EngineLoadSocket {
  std::string worker;    // the index's worker name
  std::string endpoint;  // tcp://HOST:PORT: the engine's load PUB socket
};

class EngineLoadFeed {
 public:
  // Subscribes to every socket (ZeroMQ connects in the background, and
  // reconnects to an engine that restarts) and files their readings in
  // `loads`, which must outlive the feed.
  static absl::StatusOr<std::unique_ptr<EngineLoadFeed>> Start(
      std::vector<EngineLoadSocket> sockets, EngineLoads* loads);
  ~EngineLoadFeed();
  EngineLoadFeed(const EngineLoadFeed&) = delete;
  EngineLoadFeed& operator=(const EngineLoadFeed&) = delete;

  // Ends the receiving and joins its thread.
  void Stop();

  // Per socket, in the config's order: its messages so far.
  struct Counts {
    absl::string_view worker;
    uint64_t ok = 0;
    uint64_t failed = 0;
  };
  std::vector<Counts> counts() const;

 private:
  EngineLoadFeed(std::vector<EngineLoadSocket> sockets, EngineLoads* loads);
  void Run();
  // The outcome of one message from socket i.
  void File(size_t i, const absl::StatusOr<EngineLoad>& reading);

  const std::vector<EngineLoadSocket> sockets_;
  EngineLoads* const loads_;
  class Subscribers;  // the ZeroMQ sockets (engine_load_feed.cc)
  std::unique_ptr<Subscribers> subscribers_;  // used by the feed's thread
  // Per socket, its last message's error ("" when it decoded); touched
  // only by the feed's thread.
  std::vector<std::string> last_error_;
  // Per socket, its messages that decoded and failed (relaxed: counts).
  std::unique_ptr<std::atomic<uint64_t>[]> ok_;
  std::unique_ptr<std::atomic<uint64_t>[]> failed_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;  // last: joined first
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_ENGINE_LOAD_FEED_H_
