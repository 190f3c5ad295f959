#include "server/kv_event_sockets.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "index/zmq_dial.h"
#include "index/zmq_wire.h"
#include "server/kv_batcher.h"
#include "server/replay_buffer.h"

namespace prefixd {
namespace {

// How long the replay thread waits for a slow requester's queue before it
// gives up on that request, and how often it looks at its stop flag.
constexpr int kReplaySendTimeoutMs = 2000;
constexpr std::chrono::milliseconds kReplayPoll(50);

constexpr absl::Duration kMinStall = absl::Seconds(1);
constexpr absl::Duration kMaxStall = absl::Hours(1);

// vLLM's rule: a PUB endpoint with a wildcard (or an IPC/in-process one)
// is bound, any other is connected to.
bool BindsPub(absl::string_view endpoint) {
  return absl::StrContains(endpoint, '*') ||
         absl::StrContains(endpoint, "::") ||
         absl::StartsWith(endpoint, "ipc://") ||
         absl::StartsWith(endpoint, "inproc://");
}

// The bounds every peer's queue gets: a high-water mark in batches, and
// the kernel's disconnect of a peer that stopped reading.
void Bound(zmq::socket_t& s, int hwm, absl::Duration stall) {
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::sndhwm, hwm);
  s.set(zmq::sockopt::tcp_maxrt,
        static_cast<int>(absl::ToInt64Milliseconds(stall)));
}

// A message that refers to `payload` instead of copying it. ZeroMQ drops
// the reference when it is done with the message, possibly on its I/O
// thread after the socket closed: the reference is all it needs.
zmq::message_t SharedMessage(
    const std::shared_ptr<const std::string>& payload) {
  auto* ref = new std::shared_ptr<const std::string>(payload);
  return zmq::message_t(
      const_cast<char*>(payload->data()), payload->size(),
      [](void*, void* hint) {
        delete static_cast<std::shared_ptr<const std::string>*>(hint);
      },
      ref);
}

}  // namespace

absl::Status ValidatePublishLimits(const PublishLimits& l) {
  for (const auto& [name, bytes] :
       {std::pair<const char*, uint64_t>{"buffer_bytes", l.buffer_bytes},
        {"queue_bytes", l.queue_bytes}}) {
    if (bytes < kMaxBatchBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "events_publish.", name, ": ", bytes,
          " bytes is less than one batch (", kMaxBatchBytes, " bytes)"));
    }
  }
  if (l.stall_timeout < kMinStall || l.stall_timeout > kMaxStall) {
    return absl::InvalidArgumentError(absl::StrCat(
        "events_publish.stall_timeout: ", absl::FormatDuration(l.stall_timeout),
        " is not in ", absl::FormatDuration(kMinStall), "..",
        absl::FormatDuration(kMaxStall)));
  }
  return absl::OkStatus();
}

// The sockets, the replay buffer and the replay thread.
class KvEventSockets::Impl {
 public:
  Impl(KvPublisherOptions options, PublishLimits limits)
      : options_(std::move(options)),
        limits_(limits),
        hwm_(static_cast<int>(std::clamp<uint64_t>(
            limits_.queue_bytes / kMaxBatchBytes, 1, INT_MAX))),
        buffer_(options_.buffer_batches, limits_.buffer_bytes) {}
  ~Impl() { Stop(); }

  int hwm() const { return hwm_; }

  absl::Status Open(std::string* endpoint, std::string* replay_endpoint) {
    // Nothing else runs yet; the lock is for the analysis (and is cheap).
    MutexLock lock(&mu_);
    pub_ = std::make_unique<zmq::socket_t>(ZmqContext(), zmq::socket_type::pub);
    Bound(*pub_, hwm_, limits_.stall_timeout);
    pub_->set(zmq::sockopt::ipv6, DialsIpv6(options_.endpoint));
    const bool bind = BindsPub(options_.endpoint);
    try {
      if (bind) {
        pub_->bind(options_.endpoint);
      } else {
        pub_->connect(options_.endpoint);
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(absl::StrCat(
          "could not ", bind ? "bind" : "connect",
          " the events_publish endpoint ", options_.endpoint, ": ", e.what()));
    }
    *endpoint =
        bind ? pub_->get(zmq::sockopt::last_endpoint) : options_.endpoint;
    if (options_.replay_endpoint.empty()) return absl::OkStatus();
    router_ =
        std::make_unique<zmq::socket_t>(ZmqContext(), zmq::socket_type::router);
    Bound(*router_, hwm_, limits_.stall_timeout);
    // A full queue to a requester blocks the send (up to the timeout)
    // instead of silently dropping the rest of its replay.
    router_->set(zmq::sockopt::router_mandatory, true);
    router_->set(zmq::sockopt::sndtimeo, kReplaySendTimeoutMs);
    router_->set(zmq::sockopt::ipv6, DialsIpv6(options_.replay_endpoint));
    try {
      router_->bind(options_.replay_endpoint);
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(
          absl::StrCat("could not bind the events_publish replay_endpoint ",
                       options_.replay_endpoint, ": ", e.what()));
    }
    *replay_endpoint = router_->get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { ServeReplays(); });
    return absl::OkStatus();
  }

  int64_t Publish(std::string payload) {
    auto shared = std::make_shared<const std::string>(std::move(payload));
    MutexLock lock(&mu_);
    const int64_t seq = next_seq_++;
    if (pub_ != nullptr) {
      const std::string seq_bytes = Be64(seq);
      std::array<zmq::message_t, 3> parts = {
          zmq::message_t(options_.topic.data(), options_.topic.size()),
          zmq::message_t(seq_bytes.data(), seq_bytes.size()),
          SharedMessage(shared)};
      try {
        // A PUB socket never blocks: past a subscriber's high-water mark
        // it misses the batch and fetches it from the replay socket.
        zmq::send_multipart(*pub_, parts, zmq::send_flags::dontwait);
      } catch (const zmq::error_t&) {
        // Nothing a subscriber cannot recover from by replaying.
      }
    }
    ++counters_.batches;
    counters_.bytes += shared->size();
    if (router_ != nullptr) buffer_.Add(seq, std::move(shared));
    return seq;
  }

  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    MutexLock lock(&mu_);
    pub_.reset();
    router_.reset();
  }

  Counters counters() const {
    Counters c;
    {
      MutexLock lock(&mu_);
      c = counters_;
    }
    c.buffered_batches = buffer_.batches();
    c.buffered_bytes = buffer_.bytes();
    return c;
  }

 private:
  // The replay thread: the only user of router_ until Stop joins it.
  void ServeReplays() {
    while (!stop_) {
      zmq::pollitem_t item{static_cast<void*>(*router_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, kReplayPoll);
      if ((item.revents & ZMQ_POLLIN) == 0) continue;
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(*router_, std::back_inserter(parts),
                               zmq::recv_flags::dontwait)) {
        continue;
      }
      // [identity, "", start]; anything else is not a replay request.
      if (parts.size() != 3 || parts[1].size() != 0) continue;
      const std::optional<int64_t> start = ReadBe64(parts[2]);
      if (!start.has_value()) continue;
      {
        MutexLock lock(&mu_);
        ++counters_.replay_requests;
      }
      const uint64_t sent = Replay(parts[0].to_string(), *start);
      MutexLock lock(&mu_);
      counters_.replayed_batches += sent;
    }
  }

  // Sends the buffered batches from `start` to requester `id`, then the end
  // marker; returns how many batches went.
  uint64_t Replay(const std::string& id, int64_t start) {
    uint64_t sent = 0;
    for (const ReplayBuffer::Entry& e : buffer_.From(start)) {
      if (stop_ || !Answer(id, e.seq, e.payload)) return sent;
      ++sent;
    }
    if (!stop_) Answer(id, -1, nullptr);
    return sent;
  }

  // [id, "", seq, payload] to one requester; false if it is gone or its
  // queue stayed full past the send timeout.
  bool Answer(const std::string& id, int64_t seq,
              const std::shared_ptr<const std::string>& payload) {
    const std::string seq_bytes = Be64(seq);
    std::array<zmq::message_t, 4> parts = {
        zmq::message_t(id.data(), id.size()), zmq::message_t(),
        zmq::message_t(seq_bytes.data(), seq_bytes.size()),
        payload != nullptr ? SharedMessage(payload) : zmq::message_t()};
    try {
      return zmq::send_multipart(*router_, parts).has_value();
    } catch (const zmq::error_t&) {
      return false;  // EHOSTUNREACH: the requester went away
    }
  }

  const KvPublisherOptions options_;
  const PublishLimits limits_;
  const int hwm_;
  ReplayBuffer buffer_;
  mutable Mutex mu_;
  std::unique_ptr<zmq::socket_t> pub_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  Counters counters_ ABSL_GUARDED_BY(mu_);
  // Set in Open, before the replay thread starts; reset after it ends.
  std::unique_ptr<zmq::socket_t> router_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

KvEventSockets::KvEventSockets(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

KvEventSockets::~KvEventSockets() { Stop(); }

absl::StatusOr<std::unique_ptr<KvEventSockets>> KvEventSockets::Start(
    KvPublisherOptions options, PublishLimits limits) {
  RETURN_IF_ERROR(ValidateKvPublisherOptions(options));
  RETURN_IF_ERROR(ValidatePublishLimits(limits));
  std::unique_ptr<KvEventSockets> p(
      new KvEventSockets(std::make_unique<Impl>(std::move(options), limits)));
  RETURN_IF_ERROR(p->impl_->Open(&p->endpoint_, &p->replay_endpoint_));
  return p;
}

int64_t KvEventSockets::Publish(std::string payload) {
  return impl_->Publish(std::move(payload));
}

void KvEventSockets::Stop() { impl_->Stop(); }

int KvEventSockets::high_water_mark() const { return impl_->hwm(); }

KvEventSockets::Counters KvEventSockets::counters() const {
  return impl_->counters();
}

}  // namespace prefixd
