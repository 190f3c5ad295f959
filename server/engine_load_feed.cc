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
#include "index/zmq_dial.h"
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

}  // namespace

class EngineLoadFeed::Subscribers {
 public:
  // Subscribes to `sockets` for `owner` in place of owner's others, each
  // filed under the filer's index of its worker. A malformed endpoint
  // throws zmq::error_t, after the sockets before it are in place.
  void Replace(const std::string& owner,
               const std::vector<EngineLoadSocket>& sockets,
               EngineLoadFiler* filer) {
    for (size_t i = subs_.size(); i-- > 0;) {
      if (subs_[i].owner == owner) subs_.erase(subs_.begin() + i);
    }
    for (const EngineLoadSocket& s : sockets) {
      Sub sub{zmq::socket_t(ZmqContext(), zmq::socket_type::sub), owner,
              filer->Add({s.worker, s.endpoint})};
      sub.socket.set(zmq::sockopt::linger, 0);
      sub.socket.set(zmq::sockopt::ipv6, DialsIpv6(s.endpoint));
      sub.socket.set(zmq::sockopt::maxmsgsize, kMaxLoadMessageBytes);
      sub.socket.set(zmq::sockopt::rcvhwm, kLoadQueueMessages);
      sub.socket.set(zmq::sockopt::subscribe, std::string(kLoadTopic));
      sub.socket.connect(s.endpoint);
      subs_.push_back(std::move(sub));
    }
  }

  // Waits up to kPollTimeout, then takes the messages waiting (at most
  // kMaxMessagesPerWake a socket); fn(i, m) for each, i the filer's index
  // of the socket's worker.
  template <typename Fn>
  void Poll(Fn fn) {
    std::vector<zmq::pollitem_t> items;
    for (Sub& s : subs_)
      items.push_back({static_cast<void*>(s.socket), 0, ZMQ_POLLIN, 0});
    zmq::poll(items, kPollTimeout);
    for (size_t i = 0; i < subs_.size(); ++i) {
      if ((items[i].revents & ZMQ_POLLIN) == 0) continue;
      std::vector<zmq::message_t> m;
      for (int n = 0; n < kMaxMessagesPerWake; ++n) {
        if (!zmq::recv_multipart(subs_[i].socket, std::back_inserter(m),
                                 zmq::recv_flags::dontwait)) {
          break;
        }
        fn(subs_[i].filed_as, m);
        m.clear();
      }
    }
  }

 private:
  struct Sub {
    zmq::socket_t socket;
    std::string owner;
    size_t filed_as;
  };
  std::vector<Sub> subs_;
};

EngineLoadFeed::EngineLoadFeed(EngineLoads* loads)
    : subscribers_(std::make_unique<Subscribers>()), filer_(loads, "load") {}

EngineLoadFeed::~EngineLoadFeed() { Stop(); }

absl::StatusOr<std::unique_ptr<EngineLoadFeed>> EngineLoadFeed::Start(
    std::vector<EngineLoadSocket> sockets, EngineLoads* loads) {
  std::unique_ptr<EngineLoadFeed> f(new EngineLoadFeed(loads));
  try {
    f->subscribers_->Replace("", sockets, &f->filer_);
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("index.pick.engine_load_sockets: ", e.what()));
  }
  f->thread_ = std::thread([p = f.get()] { p->Run(); });
  return f;
}

void EngineLoadFeed::SetSockets(const std::string& owner,
                                std::vector<EngineLoadSocket> sockets) {
  MutexLock lock(&mu_);
  changes_[owner] = std::move(sockets);
}

void EngineLoadFeed::TakeChanges() {
  std::map<std::string, std::vector<EngineLoadSocket>> changes;
  {
    MutexLock lock(&mu_);
    changes.swap(changes_);
  }
  for (const auto& [owner, sockets] : changes) {
    try {
      subscribers_->Replace(owner, sockets, &filer_);
    } catch (const zmq::error_t& e) {
      std::fprintf(stderr, "prefixd: load sockets of %s not all followed: %s\n",
                   owner.c_str(), e.what());
    }
  }
}

void EngineLoadFeed::Stop() {
  stopping_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

void EngineLoadFeed::Run() {
  while (!stopping_.load(std::memory_order_relaxed)) {
    TakeChanges();
    subscribers_->Poll([this](size_t i, const std::vector<zmq::message_t>& m) {
      filer_.File(i, ReadMessage(m), absl::Now());
    });
  }
}

}  // namespace prefixd
