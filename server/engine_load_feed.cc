#include "server/engine_load_feed.h"

#include <chrono>
#include <cstdio>
#include <iterator>
#include <utility>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "index/load_stat.h"
#include "index/zmq_wire.h"

namespace prefixd {
namespace {

// A load message is a few dozen bytes; SGLang's own socket keeps 8.
constexpr int64_t kMaxLoadMessageBytes = 64 << 10;
constexpr int kLoadQueueMessages = 16;
// How long the thread waits for a message before it checks for Stop, and
// the most messages it takes from one socket per wake-up (so that a socket
// that never stops sending cannot hold off the others, or Stop).
constexpr std::chrono::milliseconds kPollTimeout(100);
constexpr int kMaxMessagesPerWake = 64;

absl::string_view View(const zmq::message_t& m) {
  return absl::string_view(static_cast<const char*>(m.data()), m.size());
}

// One message's reading: [topic "load", seq, payload].
absl::StatusOr<EngineLoad> ReadMessage(const std::vector<zmq::message_t>& m) {
  if (m.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("a message of ", m.size(),
                     " frames; want 3 (topic, sequence number, payload)"));
  }
  if (View(m[0]) != kLoadTopic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a message on topic \"", absl::CHexEscape(View(m[0]).substr(0, 64)),
        "\"; want \"", kLoadTopic, "\""));
  }
  if (!ReadBe64(m[1]).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sequence number of ", m[1].size(), " bytes; want 8"));
  }
  return DecodeLoadStat(View(m[2]));
}

// The filer's sources: each socket's worker and endpoint.
std::vector<EngineLoadFiler::Source> Sources(
    const std::vector<EngineLoadSocket>& sockets) {
  std::vector<EngineLoadFiler::Source> out;
  for (const EngineLoadSocket& s : sockets)
    out.push_back({s.worker, s.endpoint});
  return out;
}

}  // namespace

class EngineLoadFeed::Subscribers {
 public:
  explicit Subscribers(const std::vector<EngineLoadSocket>& sockets) {
    for (const EngineLoadSocket& s : sockets) {
      subs_.emplace_back(ZmqContext(), zmq::socket_type::sub);
      zmq::socket_t& sub = subs_.back();
      sub.set(zmq::sockopt::linger, 0);
      sub.set(zmq::sockopt::maxmsgsize, kMaxLoadMessageBytes);
      sub.set(zmq::sockopt::rcvhwm, kLoadQueueMessages);
      sub.set(zmq::sockopt::subscribe, std::string(kLoadTopic));
      sub.connect(s.endpoint);
    }
  }

  // Waits up to kPollTimeout, then takes the messages waiting (at most
  // kMaxMessagesPerWake a socket); fn(i, m) for each, i the socket's index.
  template <typename Fn>
  void Poll(Fn fn) {
    std::vector<zmq::pollitem_t> items;
    for (zmq::socket_t& s : subs_)
      items.push_back({static_cast<void*>(s), 0, ZMQ_POLLIN, 0});
    zmq::poll(items, kPollTimeout);
    for (size_t i = 0; i < subs_.size(); ++i) {
      if ((items[i].revents & ZMQ_POLLIN) == 0) continue;
      std::vector<zmq::message_t> m;
      for (int n = 0; n < kMaxMessagesPerWake; ++n) {
        if (!zmq::recv_multipart(subs_[i], std::back_inserter(m),
                                 zmq::recv_flags::dontwait)) {
          break;
        }
        fn(i, m);
        m.clear();
      }
    }
  }

 private:
  std::vector<zmq::socket_t> subs_;
};

EngineLoadFeed::EngineLoadFeed(std::vector<EngineLoadSocket> sockets,
                               EngineLoads* loads)
    : sockets_(std::move(sockets)), filer_(loads, "load", Sources(sockets_)) {}

EngineLoadFeed::~EngineLoadFeed() { Stop(); }

absl::StatusOr<std::unique_ptr<EngineLoadFeed>> EngineLoadFeed::Start(
    std::vector<EngineLoadSocket> sockets, EngineLoads* loads) {
  std::unique_ptr<EngineLoadFeed> f(
      new EngineLoadFeed(std::move(sockets), loads));
  try {
    f->subscribers_ = std::make_unique<Subscribers>(f->sockets_);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("index.pick.engine_load_sockets: ", e.what()));
  }
  f->thread_ = std::thread([p = f.get()] { p->Run(); });
  return f;
}

void EngineLoadFeed::Stop() {
  stopping_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

void EngineLoadFeed::Run() {
  while (!stopping_.load(std::memory_order_relaxed)) {
    subscribers_->Poll([this](size_t i, const std::vector<zmq::message_t>& m) {
      filer_.File(i, ReadMessage(m), absl::Now());
    });
  }
}

}  // namespace prefixd
