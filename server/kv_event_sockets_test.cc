// events_publish's sockets over loopback (server/kv_event_sockets.h) and
// their replay buffer (server/replay_buffer.h). What slow peers cost the
// daemon in memory is measured against the real binary by
// tests/reliability/memory_bounds_test.py.
#include "server/kv_event_sockets.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/fleet_index.h"
#include "index/ingest.h"
#include "index/publisher.h"
#include "index/stored_for_test.h"
#include "index/zmq_wire.h"
#include "server/kv_batcher.h"
#include "server/replay_buffer.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::shared_ptr<const std::string> Payload(size_t bytes, char c) {
  return std::make_shared<const std::string>(bytes, c);
}

TEST(ReplayBufferTest, KeepsTheNewestWithinBatchesAndBytes) {
  ReplayBuffer buffer(/*max_batches=*/4, /*max_bytes=*/250);
  for (int64_t seq = 0; seq < 6; ++seq) buffer.Add(seq, Payload(100, 'a'));
  EXPECT_EQ(buffer.batches(), 2u);  // 3 would be 300 bytes
  EXPECT_EQ(buffer.bytes(), 200u);
  std::vector<int64_t> seqs;
  for (const ReplayBuffer::Entry& e : buffer.From(0)) seqs.push_back(e.seq);
  EXPECT_THAT(seqs, ElementsAre(4, 5));
  EXPECT_EQ(buffer.From(5).size(), 1u);
  EXPECT_TRUE(buffer.From(6).empty());
  for (int64_t seq = 6; seq < 12; ++seq) buffer.Add(seq, Payload(10, 'b'));
  EXPECT_EQ(buffer.batches(), 4u);  // now the count binds
  // A batch larger than the bound stays alone: the newest is always kept.
  buffer.Add(12, Payload(1000, 'c'));
  EXPECT_EQ(buffer.batches(), 1u);
  EXPECT_EQ(buffer.bytes(), 1000u);
}

// The entries a replay gets are the buffer's strings, not copies.
TEST(ReplayBufferTest, ARepliedBatchIsTheSameString) {
  ReplayBuffer buffer(10, 1 << 20);
  auto payload = Payload(100, 'x');
  buffer.Add(0, payload);
  EXPECT_EQ(buffer.From(0)[0].payload.get(), payload.get());
}

TEST(PublishLimitsTest, OutOfRangeLimitsAreRefusedNamingTheField) {
  PublishLimits l;
  EXPECT_TRUE(ValidatePublishLimits(l).ok());
  l.queue_bytes = 1000;
  EXPECT_THAT(ValidatePublishLimits(l).message(),
              HasSubstr("events_publish.queue_bytes: 1000 bytes is less than "
                        "one batch (65536 bytes)"));
  l = PublishLimits{};
  l.buffer_bytes = 0;
  EXPECT_THAT(ValidatePublishLimits(l).message(),
              HasSubstr("events_publish.buffer_bytes"));
  l = PublishLimits{};
  l.stall_timeout = absl::Milliseconds(10);
  EXPECT_THAT(ValidatePublishLimits(l).message(),
              HasSubstr("events_publish.stall_timeout: 10ms is not in 1s..1h"));
}

class KvEventSocketsTest : public ::testing::Test {
 protected:
  void Start(PublishLimits limits) {
    KvPublisherOptions o;
    o.endpoint = "tcp://127.0.0.1:*";
    o.replay_endpoint = "tcp://127.0.0.1:*";
    o.topic = "kv@test@m";
    auto sockets = KvEventSockets::Start(o, limits);
    ASSERT_TRUE(sockets.ok()) << sockets.status();
    sockets_ = *std::move(sockets);
  }

  // [seq, payload size] of every batch a replay from `start` sends, until
  // its end marker (seq -1, empty).
  std::vector<std::pair<int64_t, size_t>> Replay(int64_t start) {
    zmq::socket_t dealer(ZmqContext(), zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::rcvtimeo, 10000);
    dealer.connect(sockets_->replay_endpoint());
    const std::string start_bytes = Be64(start);
    std::array<zmq::const_buffer, 2> request = {zmq::const_buffer("", 0),
                                                zmq::buffer(start_bytes)};
    EXPECT_TRUE(zmq::send_multipart(dealer, request).has_value());
    std::vector<std::pair<int64_t, size_t>> out;
    for (;;) {
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(dealer, std::back_inserter(parts))) {
        ADD_FAILURE() << "no end marker within 10 s";
        return out;
      }
      EXPECT_EQ(parts.size(), 3u);
      if (parts.size() != 3) return out;
      const std::optional<int64_t> seq = ReadBe64(parts[1]);
      if (seq == -1) return out;
      out.push_back({*seq, parts[2].size()});
    }
  }

  std::unique_ptr<KvEventSockets> sockets_;
};

TEST_F(KvEventSocketsTest, PublishesAndReplaysInVllmFraming) {
  Start(PublishLimits{});
  zmq::socket_t sub(ZmqContext(), zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::rcvtimeo, 100);
  sub.set(zmq::sockopt::subscribe, "");
  sub.connect(sockets_->endpoint());
  // A SUB sees only what is published once it is connected: publish until
  // one arrives.
  std::vector<zmq::message_t> parts;
  for (int i = 0; i < 100 && parts.empty(); ++i) {
    sockets_->Publish("payload");
    if (!zmq::recv_multipart(sub, std::back_inserter(parts))) parts.clear();
  }
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].to_string(), "kv@test@m");
  EXPECT_EQ(parts[2].to_string(), "payload");
  const int64_t published = sockets_->Publish("last");
  const auto replayed = Replay(published - 1);
  ASSERT_EQ(replayed.size(), 2u);
  EXPECT_EQ(replayed[1], std::make_pair(published, size_t{4}));
  EXPECT_EQ(sockets_->counters().replay_requests, 1u);
  // The replay thread counts what it sent after the end marker went out.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (sockets_->counters().replayed_batches < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(sockets_->counters().replayed_batches, 2u);
}

// The replay buffer keeps buffer_bytes of the newest batches; a replay
// from 0 gets those, in order. The queues' high-water mark is queue_bytes
// in batches of at most kMaxBatchBytes.
TEST_F(KvEventSocketsTest, TheBufferAndTheQueuesAreBoundedInBytes) {
  PublishLimits limits;
  limits.buffer_bytes = 1 << 20;
  limits.queue_bytes = 1 << 20;
  Start(limits);
  EXPECT_EQ(sockets_->high_water_mark(), (1 << 20) / kMaxBatchBytes);
  for (int i = 0; i < 100; ++i) sockets_->Publish(std::string(60 << 10, 'p'));
  const KvEventSockets::Counters c = sockets_->counters();
  EXPECT_EQ(c.batches, 100u);
  EXPECT_EQ(c.buffered_batches, 17u);  // 17 x 60 KiB <= 1 MiB < 18 x
  EXPECT_LE(c.buffered_bytes, uint64_t{1} << 20);
  const auto replayed = Replay(0);
  ASSERT_EQ(replayed.size(), 17u);
  for (size_t i = 0; i < replayed.size(); ++i) {
    EXPECT_EQ(replayed[i].first, static_cast<int64_t>(83 + i));
  }
}

using test::Stored;
constexpr int kBs = test::kStoredBlockSize;

TEST(KvEventSocketsStart, BindFailureNamesTheEndpoint) {
  KvPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  auto a = KvEventSockets::Start(o, PublishLimits());
  ASSERT_TRUE(a.ok());
  o.replay_endpoint = (*a)->replay_endpoint();  // taken
  auto b = KvEventSockets::Start(o, PublishLimits());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(b.status().message(), HasSubstr(o.replay_endpoint));
}

// prefixd's own ingest follows the publisher: a catch-up replay of what was
// published before it connected, then live batches, then a removal.
TEST(KvEventSocketsIngest, PrefixdIngestFollowsIt) {
  KvPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  auto p = KvEventSockets::Start(o, PublishLimits());
  ASSERT_TRUE(p.ok());
  KvEventBatch first;
  first.ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  first.events.push_back(Stored({1, 2}, std::nullopt, std::nullopt, "acme"));
  (*p)->Publish(EncodeEventBatch(
      first));  // before anyone listens: only the replay has it

  IndexOptions io;
  io.block_size = kBs;
  FleetIndex index(io);
  IngestOptions in;
  IndexSource source;
  source.name = "sidecar";
  source.endpoint = (*p)->endpoint();
  source.replay_endpoint = (*p)->replay_endpoint();
  in.sources.push_back(source);
  in.poll_interval = absl::Milliseconds(5);
  auto ingest = Ingest::Start(&index, in);
  ASSERT_TRUE(ingest.ok()) << ingest.status();

  std::vector<Token> prompt;
  for (EngineHash h : {1, 2, 3})
    for (int t = 1; t <= kBs; ++t)
      prompt.push_back(static_cast<Token>(h * 10 + t));
  auto matched = [&](absl::string_view salt) {
    RouteQuery q;
    q.tokens = prompt;
    q.cache_salt = salt;
    RouteResult r = index.Route(q);
    return r.workers.empty() ? uint64_t{0} : r.workers[0].matched_blocks;
  };
  auto eventually = [&](absl::string_view salt, uint64_t want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      if (matched(salt) == want) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  };
  EXPECT_TRUE(eventually("acme", 2));
  EXPECT_EQ(matched(""), 0);  // another namespace

  KvEventBatch more;
  more.events.push_back(Stored({3}, 2));
  (*p)->Publish(EncodeEventBatch(more));
  EXPECT_TRUE(eventually("acme", 3));
  KvEventBatch gone;
  BlockRemovedEvent rm;
  rm.block_hashes = {2, 3};
  gone.events.push_back(rm);
  (*p)->Publish(EncodeEventBatch(gone));
  EXPECT_TRUE(eventually("acme", 1));
  (*ingest)->Stop();
}

}  // namespace
}  // namespace prefixd
