#include "index/publisher.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "index/zmq_wire.h"

// Debian's msgpack-cxx is header-only and needs Boost unless told not to.
#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

namespace prefixd {
namespace {

// The most batches a replay buffer may keep.
constexpr size_t kMaxBufferBatches = size_t{1} << 24;

// How long the replay thread waits for a slow requester's queue before it
// gives up on that request, and how often it looks at its stop flag.
constexpr int kReplaySendTimeoutMs = 2000;
constexpr std::chrono::milliseconds kReplayPoll(50);

// msgpack-cxx writes into any stream with write(const char*, size_t).
struct StringStream {
  std::string* out;
  void write(const char* data, size_t size) { out->append(data, size); }
};
using Packer = msgpack::packer<StringStream>;

void PackStr(Packer& pk, absl::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHashes(Packer& pk, const std::vector<EngineHash>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (EngineHash h : hashes) pk.pack_uint64(h);
}

void PackStored(Packer& pk, const BlockStoredEvent& ev) {
  pk.pack_map(9);
  PackStr(pk, "type");
  PackStr(pk, "BlockStored");
  PackStr(pk, "block_hashes");
  PackHashes(pk, ev.block_hashes);
  PackStr(pk, "parent_block_hash");
  if (ev.parent_block_hash.has_value()) {
    pk.pack_uint64(*ev.parent_block_hash);
  } else {
    pk.pack_nil();
  }
  PackStr(pk, "token_ids");
  pk.pack_array(static_cast<uint32_t>(ev.token_ids.size()));
  for (Token t : ev.token_ids) pk.pack_uint32(t);
  PackStr(pk, "block_size");
  pk.pack_int64(ev.block_size);
  PackStr(pk, "lora_id");
  if (ev.lora_id.has_value()) {
    pk.pack_int64(*ev.lora_id);
  } else {
    pk.pack_nil();
  }
  PackStr(pk, "medium");
  PackStr(pk, ev.medium);
  PackStr(pk, "lora_name");
  if (ev.lora_name.has_value()) {
    PackStr(pk, *ev.lora_name);
  } else {
    pk.pack_nil();
  }
  // vLLM's per-block extra keys: the LoRA name in every block, the salt
  // after it in the first block of a chain that starts at the root.
  PackStr(pk, "extra_keys");
  const bool lora = ev.lora_name.has_value();
  const bool salt = !ev.cache_salt.empty() && !ev.parent_block_hash.has_value();
  const size_t n = ev.block_hashes.size();
  if (n == 0 || (!lora && !salt)) {
    pk.pack_nil();
    return;
  }
  pk.pack_array(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const bool with_salt = salt && i == 0;
    const uint32_t keys = (lora ? 1 : 0) + (with_salt ? 1 : 0);
    if (keys == 0) {
      pk.pack_nil();
      continue;
    }
    pk.pack_array(keys);
    if (lora) PackStr(pk, *ev.lora_name);
    if (with_salt) PackStr(pk, ev.cache_salt);
  }
}

void PackRemoved(Packer& pk, const BlockRemovedEvent& ev) {
  pk.pack_map(3);
  PackStr(pk, "type");
  PackStr(pk, "BlockRemoved");
  PackStr(pk, "block_hashes");
  PackHashes(pk, ev.block_hashes);
  PackStr(pk, "medium");
  PackStr(pk, ev.medium);
}

// vLLM's rule: a PUB endpoint with a wildcard (or an IPC/in-process one)
// is bound, any other is connected to.
bool BindsPub(absl::string_view endpoint) {
  return absl::StrContains(endpoint, '*') ||
         absl::StrContains(endpoint, "::") ||
         absl::StartsWith(endpoint, "ipc://") ||
         absl::StartsWith(endpoint, "inproc://");
}

absl::Status CheckEndpoint(absl::string_view what, absl::string_view ep) {
  absl::string_view rest = ep;
  if (absl::ConsumePrefix(&rest, "ipc://") ||
      absl::ConsumePrefix(&rest, "inproc://")) {
    if (!rest.empty()) return absl::OkStatus();
  } else if (absl::ConsumePrefix(&rest, "tcp://")) {
    const size_t colon = rest.rfind(':');
    if (colon != absl::string_view::npos && colon > 0) {
      const absl::string_view port = rest.substr(colon + 1);
      int p;
      if (port == "*" || (absl::SimpleAtoi(port, &p) && p >= 0 && p <= 65535)) {
        return absl::OkStatus();
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " \"", ep, "\" is not tcp://HOST:PORT (or ipc://PATH)"));
}

void SetIpv6IfLiteral(zmq::socket_t& s, absl::string_view endpoint) {
  if (absl::StrContains(endpoint, '[')) s.set(zmq::sockopt::ipv6, 1);
}

}  // namespace

std::string EncodeEventBatch(const KvEventBatch& batch) {
  std::string out;
  StringStream stream{&out};
  Packer pk(stream);
  pk.pack_map(batch.data_parallel_rank.has_value() ? 3 : 2);
  PackStr(pk, "ts");
  pk.pack_double(batch.ts);
  PackStr(pk, "events");
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const KvEvent& e : batch.events) {
    if (const auto* st = std::get_if<BlockStoredEvent>(&e)) {
      PackStored(pk, *st);
    } else if (const auto* rm = std::get_if<BlockRemovedEvent>(&e)) {
      PackRemoved(pk, *rm);
    } else {
      pk.pack_map(1);
      PackStr(pk, "type");
      PackStr(pk, "AllBlocksCleared");
    }
  }
  if (batch.data_parallel_rank.has_value()) {
    PackStr(pk, "data_parallel_rank");
    pk.pack_int64(*batch.data_parallel_rank);
  }
  return out;
}

absl::Status ValidateKvPublisherOptions(const KvPublisherOptions& o) {
  if (absl::Status s = CheckEndpoint("events_publish endpoint", o.endpoint);
      !s.ok()) {
    return s;
  }
  if (!o.replay_endpoint.empty()) {
    if (absl::Status s =
            CheckEndpoint("events_publish replay_endpoint", o.replay_endpoint);
        !s.ok()) {
      return s;
    }
  }
  if (o.buffer_batches == 0 || o.buffer_batches > kMaxBufferBatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("events_publish buffer_batches ", o.buffer_batches,
                     " is not in 1..", kMaxBufferBatches));
  }
  return absl::OkStatus();
}

// The sockets, the replay buffer and the replay thread.
class KvEventPublisher::Impl {
 public:
  explicit Impl(KvPublisherOptions options) : options_(std::move(options)) {}
  ~Impl() { Stop(); }

  absl::Status Open(std::string* endpoint, std::string* replay_endpoint) {
    // Nothing else runs yet; the lock is for the analysis (and is cheap).
    MutexLock lock(&mu_);
    pub_ = std::make_unique<zmq::socket_t>(ZmqContext(), zmq::socket_type::pub);
    pub_->set(zmq::sockopt::linger, 0);
    pub_->set(zmq::sockopt::sndhwm, 100000);  // vLLM's
    SetIpv6IfLiteral(*pub_, options_.endpoint);
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
    router_->set(zmq::sockopt::linger, 0);
    // A full queue to a requester blocks the send (up to the timeout)
    // instead of silently dropping the rest of its replay.
    router_->set(zmq::sockopt::router_mandatory, true);
    router_->set(zmq::sockopt::sndtimeo, kReplaySendTimeoutMs);
    SetIpv6IfLiteral(*router_, options_.replay_endpoint);
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
    MutexLock lock(&mu_);
    const int64_t seq = next_seq_++;
    auto shared = std::make_shared<const std::string>(std::move(payload));
    if (pub_ != nullptr) {
      const std::string seq_bytes = Be64(seq);
      std::array<zmq::const_buffer, 3> parts = {
          zmq::buffer(options_.topic), zmq::buffer(seq_bytes),
          zmq::const_buffer(shared->data(), shared->size())};
      try {
        // A PUB socket never blocks: past its high-water mark a subscriber
        // misses the batch and fetches it from the replay socket.
        zmq::send_multipart(*pub_, parts, zmq::send_flags::dontwait);
      } catch (const zmq::error_t&) {
        // Nothing a subscriber cannot recover from by replaying.
      }
    }
    ++counters_.batches;
    counters_.bytes += shared->size();
    if (router_ != nullptr) {
      buffer_.emplace_back(seq, std::move(shared));
      if (buffer_.size() > options_.buffer_batches) buffer_.pop_front();
    }
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
    MutexLock lock(&mu_);
    return counters_;
  }

 private:
  using Buffered = std::pair<int64_t, std::shared_ptr<const std::string>>;

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
      std::vector<Buffered> batches;
      {
        MutexLock lock(&mu_);
        ++counters_.replay_requests;
        auto it = std::lower_bound(
            buffer_.begin(), buffer_.end(), *start,
            [](const Buffered& b, int64_t s) { return b.first < s; });
        batches.assign(it, buffer_.end());
      }
      const std::string id = parts[0].to_string();
      uint64_t sent = 0;
      bool ok = true;
      for (const Buffered& b : batches) {
        if (stop_ || !(ok = Answer(id, Be64(b.first), *b.second))) break;
        ++sent;
      }
      if (ok && !stop_) Answer(id, Be64(-1), "");
      MutexLock lock(&mu_);
      counters_.replayed_batches += sent;
    }
  }

  // [id, "", seq, payload] to one requester; false if it is gone or its
  // queue stayed full past the send timeout.
  bool Answer(const std::string& id, const std::string& seq,
              absl::string_view payload) {
    std::array<zmq::const_buffer, 4> parts = {
        zmq::buffer(id), zmq::const_buffer("", 0), zmq::buffer(seq),
        zmq::const_buffer(payload.data(), payload.size())};
    try {
      return zmq::send_multipart(*router_, parts).has_value();
    } catch (const zmq::error_t&) {
      return false;  // EHOSTUNREACH: the requester went away
    }
  }

  const KvPublisherOptions options_;
  mutable Mutex mu_;
  std::unique_ptr<zmq::socket_t> pub_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Buffered> buffer_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  // Set in Open, before the replay thread starts; reset after it ends.
  std::unique_ptr<zmq::socket_t> router_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

KvEventPublisher::KvEventPublisher(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

KvEventPublisher::~KvEventPublisher() { Stop(); }

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(
    KvPublisherOptions options) {
  if (absl::Status s = ValidateKvPublisherOptions(options); !s.ok()) return s;
  std::unique_ptr<KvEventPublisher> p(
      new KvEventPublisher(std::make_unique<Impl>(std::move(options))));
  if (absl::Status s = p->impl_->Open(&p->endpoint_, &p->replay_endpoint_);
      !s.ok()) {
    return s;
  }
  return p;
}

int64_t KvEventPublisher::PublishPayload(std::string payload) {
  return impl_->Publish(std::move(payload));
}

void KvEventPublisher::Stop() { impl_->Stop(); }

KvEventPublisher::Counters KvEventPublisher::counters() const {
  return impl_->counters();
}

}  // namespace prefixd
