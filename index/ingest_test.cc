// Ingest over real ZeroMQ sockets on loopback: a publisher in the test
// speaks vLLM's wire (PUB [topic, seq, payload], ROUTER replay) with
// msgpack payloads, and the index must follow it.
#include "index/ingest.h"

#include <atomic>
#include <deque>
#include <functional>
#include <msgpack.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/decode_budget.h"
#include "index/events.h"
#include "index/fleet_index.h"
#include "index/wire_names.h"
#include "index/zmq_wire.h"

namespace prefixd {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kBs = 4;

// An array-form KvEventBatch with one BlockStored of `blocks` (block b has
// tokens b*10+1 .. b*10+4 and hash 1000+b) after `parent` (0: root).
std::string StoredPayload(const std::vector<uint32_t>& blocks, uint64_t parent,
                          int block_size = kBs, int dp_rank = -1) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(dp_rank < 0 ? 2 : 3);
  pk.pack_double(1.0e9);
  pk.pack_array(1);
  pk.pack_array(7);
  pk.pack(std::string("BlockStored"));
  pk.pack_array(static_cast<uint32_t>(blocks.size()));
  for (uint32_t b : blocks) pk.pack_uint64(1000 + b);
  if (parent == 0) {
    pk.pack_nil();
  } else {
    pk.pack_uint64(parent);
  }
  pk.pack_array(static_cast<uint32_t>(blocks.size() * kBs));
  for (uint32_t b : blocks)
    for (uint32_t t = 1; t <= kBs; ++t) pk.pack_uint32(b * 10 + t);
  pk.pack_int(block_size);
  pk.pack_nil();
  pk.pack(std::string("GPU"));
  if (dp_rank >= 0) pk.pack_int(dp_rank);
  return std::string(buf.data(), buf.size());
}

std::string ClearedPayload() {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(2);
  pk.pack(std::string("ts"));
  pk.pack_double(1.0e9);
  pk.pack(std::string("events"));
  pk.pack_array(1);
  pk.pack_map(1);
  pk.pack(std::string("type"));
  pk.pack(std::string("AllBlocksCleared"));
  return std::string(buf.data(), buf.size());
}

std::vector<Token> Prompt(const std::vector<uint32_t>& blocks) {
  std::vector<Token> out;
  for (uint32_t b : blocks)
    for (uint32_t t = 1; t <= kBs; ++t) out.push_back(b * 10 + t);
  return out;
}

// How a publisher frames its replay answers (docs/index.md, "Wire").
enum class ReplayFraming {
  kSeq,    // SGLang, vLLM <= 0.25: ["", seq, payload], end ["", -1, ""]
  kTopic,  // vLLM >= 0.26: ["", topic, seq, payload], end ["", "", -1, ""]
};

// vLLM's publisher, reduced to what the index relies on. The replay socket
// is served on its own thread; every send happens on the test's thread.
class Publisher {
 public:
  // Binds fresh ports, or the given ones (an engine restarting in place).
  explicit Publisher(size_t buffer = 100,
                     const std::string& pub_at = "tcp://127.0.0.1:*",
                     const std::string& replay_at = "tcp://127.0.0.1:*",
                     ReplayFraming framing = ReplayFraming::kSeq,
                     std::string topic = "")
      : buffer_(buffer), framing_(framing), topic_(std::move(topic)) {
    pub_.set(zmq::sockopt::linger, 0);
    pub_.bind(pub_at);
    router_.set(zmq::sockopt::linger, 0);
    router_.bind(replay_at);
    endpoint_ = pub_.get(zmq::sockopt::last_endpoint);
    replay_endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { ServeReplay(); });
  }
  ~Publisher() {
    stop_ = true;
    thread_.join();
  }

  // Publishes the next batch; `drop` keeps it from the wire (a loss in
  // transit) but not from the replay buffer.
  void Publish(const std::string& payload, bool drop = false) {
    const int64_t seq = next_++;
    {
      MutexLock lock(&mu_);
      replay_.emplace_back(seq, payload);
      if (replay_.size() > buffer_) replay_.pop_front();
    }
    if (drop) return;
    const std::string seq_bytes = Be64(seq);  // outlives the send
    std::array<zmq::const_buffer, 3> parts = {
        zmq::buffer(topic_), zmq::buffer(seq_bytes), zmq::buffer(payload)};
    ASSERT_TRUE(zmq::send_multipart(pub_, parts));
  }
  void Restart() {
    next_ = 0;
    MutexLock lock(&mu_);
    replay_.clear();
  }
  int64_t last_seq() const { return next_ - 1; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  void ServeReplay() {
    while (!stop_) {
      zmq::pollitem_t item{static_cast<void*>(router_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      if ((item.revents & ZMQ_POLLIN) == 0) continue;
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(router_, std::back_inserter(req))) continue;
      if (req.size() != 3) continue;
      const auto* p = static_cast<const unsigned char*>(req[2].data());
      int64_t start = 0;
      for (int i = 0; i < 8; ++i) start = (start << 8) | p[i];
      std::vector<std::pair<int64_t, std::string>> frames;
      {
        MutexLock lock(&mu_);
        for (const auto& f : replay_)
          if (f.first >= start) frames.push_back(f);
      }
      const std::string id = req[0].to_string();
      for (const auto& [seq, payload] : frames)
        Answer(id, topic_, seq, payload);
      Answer(id, "", -1, "");
    }
  }

  void Answer(const std::string& id, const std::string& topic, int64_t seq,
              const std::string& payload) {
    const std::string seq_bytes = Be64(seq);
    std::vector<zmq::const_buffer> out = {zmq::buffer(id),
                                          zmq::const_buffer("", 0)};
    if (framing_ == ReplayFraming::kTopic) out.push_back(zmq::buffer(topic));
    out.push_back(zmq::buffer(seq_bytes));
    out.push_back(zmq::buffer(payload));
    (void)zmq::send_multipart(router_, out);
  }

  zmq::context_t ctx_{1};
  zmq::socket_t pub_{ctx_, zmq::socket_type::pub};
  zmq::socket_t router_{ctx_, zmq::socket_type::router};
  std::string endpoint_, replay_endpoint_;
  const size_t buffer_;
  const ReplayFraming framing_;
  const std::string topic_;
  Mutex mu_;
  std::deque<std::pair<int64_t, std::string>> replay_ ABSL_GUARDED_BY(mu_);
  int64_t next_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Waits (bounded) until `done` holds for the index's stats.
template <typename F>
bool WaitFor(const FleetIndex& index, F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (done(index.Stats())) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

uint64_t Matched(const FleetIndex& index, const std::vector<uint32_t>& blocks,
                 const std::string& worker) {
  std::vector<Token> tokens = Prompt(blocks);
  RouteQuery q;
  q.tokens = tokens;
  q.filter.workers = {worker};
  RouteResult r = index.Route(q);
  return r.workers.empty() ? 0 : r.workers[0].matched_blocks;
}

class IngestTest : public ::testing::Test {
 protected:
  void Start(bool with_replay = true) {
    IngestOptions o;
    IndexSource s;
    s.name = "e0";
    s.endpoint = pub_.endpoint();
    if (with_replay) s.replay_endpoint = pub_.replay_endpoint();
    o.sources.push_back(s);
    o.replay_timeout = absl::Seconds(2);
    o.poll_interval = absl::Milliseconds(5);
    auto ingest = Ingest::Start(&index_, o);
    ASSERT_TRUE(ingest.ok()) << ingest.status();
    ingest_ = *std::move(ingest);
    // Connected (LIVE after the catch-up) before anything is published, so
    // that no batch is lost to ZeroMQ's subscription delay.
    ASSERT_TRUE(WaitFor(index_, [](const IndexStats& s) {
      return s.workers.size() == 1 && s.workers[0].state == WorkerState::kLive;
    }));
    absl::SleepFor(absl::Milliseconds(200));  // the subscription travels
  }
  bool WaitApplied(int64_t seq) {
    return WaitFor(index_, [seq](const IndexStats& s) {
      return !s.workers.empty() && s.workers[0].last_seq >= seq;
    });
  }

  FleetIndex index_{IndexOptions{kBs, 1000000}};
  Publisher pub_;
  std::unique_ptr<Ingest> ingest_;
};

TEST_F(IngestTest, AppliesBatchesInOrder) {
  Start();
  pub_.Publish(StoredPayload({1, 2}, 0));
  pub_.Publish(StoredPayload({3}, 1002));
  ASSERT_TRUE(WaitApplied(1));
  EXPECT_EQ(Matched(index_, {1, 2, 3}, "e0"), 3u);
  IndexStats s = index_.Stats();
  EXPECT_EQ(s.workers[0].state, WorkerState::kLive);
  EXPECT_EQ(s.workers[0].endpoint, pub_.endpoint());
  EXPECT_EQ(s.workers[0].gaps, 0u);
}

TEST_F(IngestTest, ALostBatchIsReplayed) {
  Start();
  pub_.Publish(StoredPayload({1}, 0));
  pub_.Publish(StoredPayload({2}, 1001), /*drop=*/true);
  pub_.Publish(StoredPayload({3}, 1002));
  ASSERT_TRUE(WaitApplied(2));
  EXPECT_EQ(Matched(index_, {1, 2, 3}, "e0"), 3u);
  IndexStats s = index_.Stats();
  EXPECT_EQ(s.workers[0].gaps, 1u);
  EXPECT_EQ(s.workers[0].replays_ok, 2u);  // the catch-up and the gap
  EXPECT_EQ(s.workers[0].state, WorkerState::kLive);
}

TEST_F(IngestTest, AGapTheReplayCannotFillClearsTheWorker) {
  pub_.Publish(StoredPayload({9}, 0));  // before the index connects
  Start(/*with_replay=*/false);
  pub_.Publish(StoredPayload({1}, 0));
  ASSERT_TRUE(WaitApplied(1));
  pub_.Publish(StoredPayload({2}, 1001), /*drop=*/true);
  pub_.Publish(StoredPayload({5}, 0));
  ASSERT_TRUE(WaitApplied(3));
  // Block 1 was cleared with the gap; 5 came after it.
  EXPECT_EQ(Matched(index_, {1}, "e0"), 0u);
  EXPECT_EQ(Matched(index_, {5}, "e0"), 1u);
  IndexStats s = index_.Stats();
  EXPECT_EQ(s.workers[0].clears[static_cast<int>(ClearReason::kReplayFailed)],
            1u);
  // LIVE again with the batch that revealed the gap; the clear is
  // remembered.
  EXPECT_EQ(s.workers[0].state, WorkerState::kLive);
  EXPECT_EQ(s.workers[0].state_detail, "");
  EXPECT_THAT(s.workers[0].last_error, HasSubstr("replay_failed: "));
  EXPECT_THAT(s.workers[0].last_error, HasSubstr("no replay endpoint"));
}

TEST_F(IngestTest, ARestartClearsTheWorker) {
  Start();
  pub_.Publish(StoredPayload({1}, 0));
  pub_.Publish(StoredPayload({2}, 1001));
  ASSERT_TRUE(WaitApplied(1));
  pub_.Restart();
  pub_.Publish(StoredPayload({7}, 0));  // seq 0 again
  ASSERT_TRUE(WaitFor(index_, [](const IndexStats& s) {
    return s.workers[0].clears[static_cast<int>(ClearReason::kRestart)] == 1;
  }));
  ASSERT_TRUE(WaitFor(
      index_, [](const IndexStats& s) { return s.workers[0].last_seq == 0; }));
  EXPECT_EQ(Matched(index_, {1}, "e0"), 0u);
  EXPECT_EQ(Matched(index_, {7}, "e0"), 1u);
}

TEST_F(IngestTest, GarbageClearsTheWorkerAndIngestGoesOn) {
  Start();
  pub_.Publish(StoredPayload({1}, 0));
  pub_.Publish("\xc1 not msgpack");
  pub_.Publish(StoredPayload({4}, 0));
  ASSERT_TRUE(WaitApplied(2));
  IndexStats s = index_.Stats();
  EXPECT_EQ(s.workers[0].clears[static_cast<int>(ClearReason::kUndecodable)],
            1u);
  EXPECT_EQ(s.workers[0].state_detail, "");
  EXPECT_THAT(s.workers[0].last_error, HasSubstr("undecodable: batch 1"));
  EXPECT_EQ(Matched(index_, {1}, "e0"), 0u);
  EXPECT_EQ(Matched(index_, {4}, "e0"), 1u);
}

TEST_F(IngestTest, AllBlocksClearedInAMapEncodedBatch) {
  Start();
  pub_.Publish(StoredPayload({1}, 0));
  pub_.Publish(ClearedPayload());
  ASSERT_TRUE(WaitApplied(1));
  EXPECT_EQ(Matched(index_, {1}, "e0"), 0u);
}

TEST_F(IngestTest, CatchesUpOnConnectFromTheReplayBuffer) {
  // Published before the index exists: only the replay can bring it.
  pub_.Publish(StoredPayload({1, 2}, 0));
  pub_.Publish(StoredPayload({3}, 1002));
  Start();
  ASSERT_TRUE(WaitApplied(1));
  EXPECT_EQ(Matched(index_, {1, 2, 3}, "e0"), 3u);
}

// An engine that restarts in place while the index is disconnected, and
// publishes past the index's last sequence number before the index is back:
// only clearing on reconnect keeps its old blocks from being reported.
TEST(IngestReconnect, ARestartedEngineIsRebuiltFromItsReplayBuffer) {
  FleetIndex index(IndexOptions{kBs, 1000000});
  auto first = std::make_unique<Publisher>();
  const std::string pub_at = first->endpoint();
  const std::string replay_at = first->replay_endpoint();
  IngestOptions o;
  o.sources.push_back({"e0", pub_at, replay_at, 0, absl::ZeroDuration()});
  o.poll_interval = absl::Milliseconds(5);
  auto ingest = Ingest::Start(&index, o);
  ASSERT_TRUE(ingest.ok()) << ingest.status();
  ASSERT_TRUE(WaitFor(index, [](const IndexStats& s) {
    return s.workers[0].state == WorkerState::kLive;
  }));
  absl::SleepFor(absl::Milliseconds(200));
  first->Publish(StoredPayload({1}, 0));
  ASSERT_TRUE(WaitFor(
      index, [](const IndexStats& s) { return s.workers[0].last_seq == 0; }));
  ASSERT_EQ(Matched(index, {1}, "e0"), 1u);
  first.reset();  // the engine goes away; block 1 goes with it
  ASSERT_TRUE(WaitFor(index, [](const IndexStats& s) {
    return s.workers[0].state == WorkerState::kConnecting;
  }));
  // Back on the same ports, already 3 batches in before the index returns.
  Publisher second(100, pub_at, replay_at);
  second.Publish(StoredPayload({5}, 0));
  second.Publish(StoredPayload({6}, 0));
  second.Publish(StoredPayload({7}, 0));
  ASSERT_TRUE(WaitFor(index, [](const IndexStats& s) {
    return s.workers[0].last_seq == 2 &&
           s.workers[0].state == WorkerState::kLive;
  }));
  EXPECT_EQ(Matched(index, {1}, "e0"), 0u);
  EXPECT_EQ(Matched(index, {5}, "e0"), 1u);
  EXPECT_EQ(Matched(index, {7}, "e0"), 1u);
  EXPECT_EQ(index.Stats()
                .workers[0]
                .clears[static_cast<int>(ClearReason::kReconnect)],
            1u);
}

TEST_F(IngestTest, EachDataParallelRankIsAWorker) {
  Start();
  pub_.Publish(StoredPayload({1}, 0, kBs, /*dp_rank=*/0));
  pub_.Publish(StoredPayload({2}, 0, kBs, /*dp_rank=*/2));
  ASSERT_TRUE(WaitFor(index_, [](const IndexStats& s) {
    return s.workers.size() == 2 && s.workers[1].last_seq == 1;
  }));
  IndexStats s = index_.Stats();
  EXPECT_EQ(s.workers[0].worker, "e0");
  EXPECT_EQ(s.workers[1].worker, "e0/dp2");
  EXPECT_EQ(Matched(index_, {1}, "e0"), 1u);
  EXPECT_EQ(Matched(index_, {2}, "e0"), 0u);
  EXPECT_EQ(Matched(index_, {2}, "e0/dp2"), 1u);
}

// A pool source resolves its host name and subscribes to every address, one
// worker each, replayed at the pool's replay_port.
// vLLM 0.26 and later put the topic in every replay answer (and an empty one
// in the end marker): the catch-up on connect and a gap's replay must read
// that form as well as the older one.
TEST(IngestReplayForms, TopicFramedReplaysCatchUpAndFillGaps) {
  Publisher pub(100, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                ReplayFraming::kTopic, "kv@e0@llama");
  pub.Publish(StoredPayload({1}, 0));  // before the index connects
  pub.Publish(StoredPayload({2}, 1001));
  FleetIndex index(IndexOptions{kBs, 1000000});
  IngestOptions o;
  o.sources.push_back({"e0", pub.endpoint(), pub.replay_endpoint()});
  o.poll_interval = absl::Milliseconds(5);
  auto ingest = Ingest::Start(&index, o);
  ASSERT_TRUE(ingest.ok()) << ingest.status();
  ASSERT_TRUE(WaitFor(index, [](const IndexStats& s) {
    return s.workers.size() == 1 && s.workers[0].last_seq == 1 &&
           s.workers[0].state == WorkerState::kLive;
  })) << index.Stats().workers[0].state_detail;
  EXPECT_EQ(Matched(index, {1, 2}, "e0"), 2u);
  absl::SleepFor(absl::Milliseconds(200));  // the subscription travels
  pub.Publish(StoredPayload({3}, 1002), /*drop=*/true);
  pub.Publish(StoredPayload({4}, 1003));
  ASSERT_TRUE(WaitFor(
      index, [](const IndexStats& s) { return s.workers[0].last_seq == 3; }));
  const IndexStats s = index.Stats();
  EXPECT_EQ(Matched(index, {1, 2, 3, 4}, "e0"), 4u);
  EXPECT_EQ(s.workers[0].state, WorkerState::kLive);
  EXPECT_EQ(s.workers[0].state_detail, "");
  EXPECT_EQ(s.workers[0].gaps, 1u);
  EXPECT_EQ(s.workers[0].replays_ok, 2u);  // the catch-up and the gap
  EXPECT_EQ(s.workers[0].replays_failed, 0u);
  uint64_t clears = 0;
  for (uint64_t c : s.workers[0].clears) clears += c;
  EXPECT_EQ(clears, 0u);
}

// One source per DP rank, as vLLM's port offsets make them: a source that
// carries rank 1 only is worker "<name>/dp1", and no "<name>" is left
// behind that no batch ever feeds.
TEST(IngestDataParallel, ASourceOfRankOneLeavesNoRankZeroWorker) {
  Publisher pub;
  pub.Publish(StoredPayload({1}, 0, kBs, /*dp_rank=*/1));  // catch-up
  FleetIndex index(IndexOptions{kBs, 1000000});
  IngestOptions o;
  o.sources.push_back({"e0-r1", pub.endpoint(), pub.replay_endpoint()});
  o.poll_interval = absl::Milliseconds(5);
  auto ingest = Ingest::Start(&index, o);
  ASSERT_TRUE(ingest.ok()) << ingest.status();
  ASSERT_TRUE(WaitFor(index, [](const IndexStats& s) {
    return s.workers.size() == 1 && s.workers[0].worker == "e0-r1/dp1" &&
           s.workers[0].state == WorkerState::kLive;
  }));
  absl::SleepFor(absl::Milliseconds(200));  // the subscription travels
  pub.Publish(StoredPayload({2}, 1001, kBs, 1), /*drop=*/true);
  pub.Publish(StoredPayload({3}, 1002, kBs, 1));
  ASSERT_TRUE(WaitFor(index, [](const IndexStats& s) {
    return !s.workers.empty() && s.workers[0].last_seq == 2;
  }));
  const IndexStats s = index.Stats();
  ASSERT_EQ(s.workers.size(), 1u);
  EXPECT_EQ(s.workers[0].worker, "e0-r1/dp1");
  EXPECT_EQ(s.workers[0].state, WorkerState::kLive);
  EXPECT_EQ(s.workers[0].gaps, 1u);  // counted once, on the one worker
  // The catch-up and the gap's replay, both on the worker that exists.
  EXPECT_EQ(s.workers[0].replays_ok, 2u);
  EXPECT_EQ(Matched(index, {1, 2, 3}, "e0-r1/dp1"), 3u);
}

TEST(IngestPool, OneWorkerPerAddressTheHostResolvesTo) {
  Publisher pub;
  FleetIndex index(IndexOptions{kBs, 1000000});
  const std::string port = pub.endpoint().substr(pub.endpoint().rfind(':') + 1);
  const std::string replay_port =
      pub.replay_endpoint().substr(pub.replay_endpoint().rfind(':') + 1);
  pub.Publish(StoredPayload({1, 2}, 0));  // before: only a replay brings it
  IngestOptions o;
  IndexSource s;
  s.name = "pool";
  s.endpoint = absl::StrCat("tcp://localhost:", port);
  s.replay_port = std::stoi(replay_port);
  o.sources.push_back(s);
  o.poll_interval = absl::Milliseconds(5);
  auto ingest = Ingest::Start(&index, o);
  ASSERT_TRUE(ingest.ok()) << ingest.status();
  const std::string worker = absl::StrCat("pool/127.0.0.1:", port);
  ASSERT_TRUE(WaitFor(index, [&](const IndexStats& st) {
    for (const WorkerStatus& w : st.workers)
      if (w.worker == worker && w.last_seq == 0) return true;
    return false;
  }));
  EXPECT_EQ(Matched(index, {1, 2}, worker), 2u);
  for (const WorkerStatus& w : index.Stats().workers) {
    EXPECT_THAT(w.worker, ::testing::StartsWith("pool/")) << w.worker;
  }
}

// Only the index names sources with a '/': an SGLang worker's rank r > 0
// (<name>/dp<r>) and a pool's workers (<name>/<host>:<port>[/dp<r>]), each
// pinned to its rank. A configured name with a '/' would collide with them.
TEST(IngestSources, OnlyTheIndexNamesSourcesWithASlash) {
  const auto valid = [](const std::string& name, int rank, bool pinned) {
    IndexSource s;
    s.name = name;
    s.endpoint = "tcp://10.0.0.1:5557";
    s.labels.dp_rank = rank;
    s.pinned = pinned;
    return ValidateIndexSource(s).ok();
  };
  EXPECT_TRUE(valid("sg", 0, false));
  EXPECT_TRUE(valid("sg/dp1", 1, true));
  EXPECT_TRUE(valid("sg/10.0.0.1:30000", 0, true));
  EXPECT_TRUE(valid("sg/10.0.0.1:30000/dp2", 2, true));
  EXPECT_TRUE(valid("sg/[fd00::1]:30000/dp1", 1, true));
  EXPECT_FALSE(valid("sg/dp1", 1, false));  // not pinned
  EXPECT_FALSE(valid("sg/dp1", 2, true));   // another rank
  EXPECT_FALSE(valid("sg/10.0.0.1:30000/dp1", 2, true));
  EXPECT_FALSE(valid("sg/10.0.0.1:30000", 1, true));  // rank 1 without /dp1
  EXPECT_FALSE(valid("sg/pods", 0, true));            // no host:port
  EXPECT_FALSE(valid("/10.0.0.1:30000", 0, true));    // no name
  EXPECT_FALSE(valid("sg/a/10.0.0.1:30000", 0, true));
  EXPECT_FALSE(valid("sg/10.0.0.1:30000dp1", 1, true));
}

TEST(IngestListen, EnginesConnectAndNameThemselvesByTopic) {
  FleetIndex index(IndexOptions{kBs, 1000000});
  IngestOptions o;
  o.listen = "tcp://127.0.0.1:*";
  o.poll_interval = absl::Milliseconds(5);
  auto ingest = Ingest::Start(&index, o);
  ASSERT_TRUE(ingest.ok()) << ingest.status();
  const std::string ep = (*ingest)->listen_endpoint();
  ASSERT_THAT(ep, HasSubstr("tcp://127.0.0.1:"));
  zmq::context_t ctx(1);
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.set(zmq::sockopt::linger, 0);
  pub.connect(ep);
  // A connecting PUB may drop until the subscription arrives: resend
  // seq 0 until the worker shows up (a restart of seq 0 is harmless).
  const std::string payload = StoredPayload({1}, 0);
  const bool seen = WaitFor(index, [&](const IndexStats& s) {
    const std::string seq0 = Be64(0);
    std::array<zmq::const_buffer, 3> parts = {
        zmq::str_buffer("kv@vllm-7@llama"), zmq::buffer(seq0),
        zmq::buffer(payload)};
    (void)zmq::send_multipart(pub, parts);
    return s.workers.size() == 1 && s.workers[0].last_seq == 0;
  });
  ASSERT_TRUE(seen);
  EXPECT_EQ(index.Stats().workers[0].worker, "vllm-7");
  // A resent seq 0 still in flight restarts the worker (cleared, then
  // applied again): with the sending stopped, the block comes back.
  EXPECT_TRUE(WaitFor(index, [&](const IndexStats&) {
    return Matched(index, {1}, "vllm-7") == 1;
  }));
}

// Sends one batch per topic to a listen endpoint until `done` holds.
bool SendUntil(FleetIndex& index, zmq::socket_t& pub,
               const std::vector<std::string>& topics,
               const std::function<bool(const IndexStats&)>& done) {
  const std::string payload = StoredPayload({1}, 0);
  const std::string seq0 = Be64(0);
  return WaitFor(index, [&](const IndexStats& s) {
    for (const std::string& topic : topics) {
      std::array<zmq::const_buffer, 3> parts = {
          zmq::buffer(topic), zmq::buffer(seq0), zmq::buffer(payload)};
      (void)zmq::send_multipart(pub, parts);
    }
    return done(s);
  });
}

struct ListenFixture {
  explicit ListenFixture(IngestOptions o) {
    o.listen = "tcp://127.0.0.1:*";
    o.poll_interval = absl::Milliseconds(5);
    auto started = Ingest::Start(&index, o);
    EXPECT_TRUE(started.ok()) << started.status();
    ingest = *std::move(started);
    pub.set(zmq::sockopt::linger, 0);
    pub.connect(ingest->listen_endpoint());
  }
  std::vector<std::string> Names() {
    std::vector<std::string> out;
    for (const WorkerStatus& w : index.Stats().workers) out.push_back(w.worker);
    return out;
  }
  FleetIndex index{IndexOptions{kBs, 1000000}};
  std::unique_ptr<Ingest> ingest;
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
};

TEST(IngestListen, TopicsThatAreNoNamesGetAPrintableOneOfTheirOwn) {
  ListenFixture f{IngestOptions()};
  const std::string bad("kv@\xff\xfe<script>@m");
  const std::string huge(5 << 20, 'x');
  ASSERT_TRUE(SendUntil(f.index, f.pub, {bad, huge}, [](const IndexStats& s) {
    return s.workers.size() == 2;
  }));
  for (const std::string& name : f.Names()) {
    EXPECT_TRUE(CheckWireName("worker", name).ok()) << name;
  }
  EXPECT_THAT(f.Names(), Contains(StartsWith("\\xff\\xfe<script>~")));
  EXPECT_THAT(f.Names(), Contains(StartsWith(std::string(48, 'x') + "~")));
}

// SGLang with a snapshot endpoint appends "\0sgl-kv-epoch=<epoch>" to its
// topic, and "\0sgl-kv-snapshot=<id>" on a snapshot's barrier batch: one
// worker, named by the topic before them.
TEST(IngestListen, SglangsEpochAndBarrierMarkersAreNotPartOfTheName) {
  ListenFixture f{IngestOptions()};
  const std::string live("sgl-0\0sgl-kv-epoch=9f2c", 23);
  const std::string barrier = live + std::string("\0sgl-kv-snapshot=77", 19);
  ASSERT_TRUE(
      SendUntil(f.index, f.pub, {live, barrier}, [](const IndexStats& s) {
        return s.workers.size() == 1 && s.workers[0].last_seq == 0;
      }));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_THAT(f.Names(), ElementsAre("sgl-0"));
}

TEST(IngestListen, NewTopicsPastTheLimitTakeOnlyAnIdleWorkersPlace) {
  IngestOptions o;
  o.max_listen_workers = 2;
  o.listen_idle = absl::Hours(1);
  ListenFixture f{o};
  ASSERT_TRUE(
      SendUntil(f.index, f.pub, {"kv@a@m", "kv@b@m"},
                [](const IndexStats& s) { return s.workers.size() == 2; }));
  // Full, nobody idle: a third topic is not followed (sent until its
  // message must have arrived, as a later one of "a" has).
  const std::string c_seq1 = Be64(1);
  const std::string stored2 = StoredPayload({2}, 0);
  ASSERT_TRUE(SendUntil(f.index, f.pub, {"kv@c@m"}, [&](const IndexStats&) {
    std::array<zmq::const_buffer, 3> parts = {
        zmq::str_buffer("kv@a@m"), zmq::buffer(c_seq1), zmq::buffer(stored2)};
    (void)zmq::send_multipart(f.pub, parts);
    return Matched(f.index, {2}, "a") == 1;
  }));
  EXPECT_THAT(f.Names(), ElementsAre("a", "b"));
}

TEST(IngestListen, AnIdleWorkerMakesRoomForANewTopic) {
  IngestOptions o;
  o.max_listen_workers = 2;
  o.listen_idle = absl::ZeroDuration();  // everyone is idle at once
  ListenFixture f{o};
  ASSERT_TRUE(
      SendUntil(f.index, f.pub, {"kv@a@m", "kv@b@m"},
                [](const IndexStats& s) { return s.workers.size() == 2; }));
  ASSERT_TRUE(SendUntil(f.index, f.pub, {"kv@c@m"}, [](const IndexStats& s) {
    for (const WorkerStatus& w : s.workers)
      if (w.worker == "c") return true;
    return false;
  }));
  EXPECT_LE(f.index.Stats().workers.size(), 2u);
}

TEST(IngestListen, ConnectionsPastTheLimitAreNotAdmitted) {
  IngestOptions o;
  o.max_listen_connections = 2;
  // A connection not admitted is closed after this, and connects again.
  o.listen_handshake_timeout = absl::Milliseconds(500);
  ListenFixture f{o};  // f.pub is the first connection
  zmq::socket_t second(f.ctx, zmq::socket_type::pub);
  second.set(zmq::sockopt::linger, 0);
  second.connect(f.ingest->listen_endpoint());
  ASSERT_TRUE(SendUntil(f.index, f.pub, {"kv@a@m"}, [](const IndexStats& s) {
    return s.workers.size() == 1;
  }));
  ASSERT_TRUE(SendUntil(f.index, second, {"kv@b@m"}, [](const IndexStats& s) {
    return s.workers.size() == 2;
  }));
  EXPECT_EQ(f.ingest->listen_connections_refused(), 0u);
  {
    // A third is not admitted: counted, and nothing it sends is read,
    // while the first two are.
    zmq::socket_t third(f.ctx, zmq::socket_type::pub);
    third.set(zmq::sockopt::linger, 0);
    third.connect(f.ingest->listen_endpoint());
    ASSERT_TRUE(SendUntil(f.index, third, {"kv@c@m"}, [&](const IndexStats&) {
      return f.ingest->listen_connections_refused() >= 1;
    }));
    const std::string seq1 = Be64(1);
    const std::string stored2 = StoredPayload({2}, 0);
    ASSERT_TRUE(SendUntil(f.index, third, {"kv@c@m"}, [&](const IndexStats&) {
      std::array<zmq::const_buffer, 3> parts = {
          zmq::str_buffer("kv@a@m"), zmq::buffer(seq1), zmq::buffer(stored2)};
      (void)zmq::send_multipart(f.pub, parts);
      return Matched(f.index, {2}, "a") == 1;
    }));
    EXPECT_THAT(f.Names(), ElementsAre("a", "b"));
  }
  // Once one of the two has gone, a new connection takes its place (if it
  // connects before the departure is counted, at its next attempt).
  second.close();
  zmq::socket_t fourth(f.ctx, zmq::socket_type::pub);
  fourth.set(zmq::sockopt::linger, 0);
  fourth.connect(f.ingest->listen_endpoint());
  EXPECT_TRUE(SendUntil(f.index, fourth, {"kv@d@m"}, [](const IndexStats& s) {
    for (const WorkerStatus& w : s.workers)
      if (w.worker == "d") return true;
    return false;
  }));
}

TEST(IngestReplayLimits, AReplayPastItsBatchOrByteCapFails) {
  for (const bool by_bytes : {false, true}) {
    Publisher pub(100);
    for (int i = 0; i < 10; ++i) {
      pub.Publish(StoredPayload({static_cast<uint32_t>(100 + i)}, 0),
                  /*drop=*/true);  // published before the index started
    }
    FleetIndex index(IndexOptions{kBs, 1000000});
    IngestOptions o;
    IndexSource s;
    s.name = "e0";
    s.endpoint = pub.endpoint();
    s.replay_endpoint = pub.replay_endpoint();
    o.sources.push_back(s);
    o.poll_interval = absl::Milliseconds(5);
    if (by_bytes) {
      o.max_replay_bytes = 64;
    } else {
      o.max_replay_batches = 5;
    }
    auto ingest = Ingest::Start(&index, o);
    ASSERT_TRUE(ingest.ok()) << ingest.status();
    ASSERT_TRUE(WaitFor(index, [](const IndexStats& st) {
      return st.workers.size() == 1 && st.workers[0].replays_failed >= 1;
    })) << by_bytes;
    EXPECT_THAT(index.Stats().workers[0].state_detail,
                HasSubstr(by_bytes ? "more than 100000 batches or 64 bytes"
                                   : "more than 5 batches or 268435456 bytes"));
    EXPECT_EQ(Matched(index, {100}, "e0"), 0u);
  }
}

TEST(IngestOptions, BadEndpointsAreNamed) {
  IngestOptions o;
  o.sources.push_back({"e", "http://x:1", "", 0, absl::ZeroDuration()});
  absl::Status s = ValidateIngestOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("http://x:1"));
  o.sources[0] = {"a/b", "tcp://x:1", "", 0, absl::ZeroDuration()};
  EXPECT_THAT(ValidateIngestOptions(o).message(), HasSubstr("a/b"));
  o.sources[0] = {"e", "tcp://x:1", "", 70000, absl::ZeroDuration()};
  EXPECT_THAT(ValidateIngestOptions(o).message(), HasSubstr("70000"));
}

// Sources added and removed while ingestion runs (the Conductor's /register
// and /unregister): a registration is one worker, named by it, labelled,
// and pinned to its rank whatever rank the batches carry; removing it
// retires the worker, and adding it again catches up from the replay
// buffer.
TEST(IngestRuntimeSources, AddedPinnedLabelledAndRemoved) {
  Publisher pub;
  pub.Publish(StoredPayload({1}, 0, kBs, /*dp_rank=*/3));
  FleetIndex index(IndexOptions{kBs, 1000000});
  IngestOptions o;
  o.poll_interval = absl::Milliseconds(5);
  auto ingest = Ingest::Start(&index, o);
  ASSERT_TRUE(ingest.ok()) << ingest.status();
  IndexSource s{"vllm-a|acme|1", pub.endpoint(), pub.replay_endpoint()};
  s.labels.instance_id = "vllm-a";
  s.labels.tenant = "acme";
  s.labels.model = "llama";
  s.labels.dp_rank = 1;
  s.pinned = true;
  ASSERT_TRUE((*ingest)->AddSource(s).ok());
  EXPECT_EQ((*ingest)->AddSource(s).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(WaitFor(index, [](const IndexStats& st) {
    return st.workers.size() == 1 && st.workers[0].last_seq == 0 &&
           st.workers[0].state == WorkerState::kLive;
  }));
  IndexStats st = index.Stats();
  EXPECT_EQ(st.workers[0].worker, "vllm-a|acme|1");
  EXPECT_EQ(st.workers[0].labels.instance_id, "vllm-a");
  EXPECT_EQ(st.workers[0].labels.tenant, "acme");
  EXPECT_EQ(st.workers[0].labels.model, "llama");
  EXPECT_EQ(st.workers[0].labels.dp_rank, 1);
  EXPECT_EQ(Matched(index, {1}, "vllm-a|acme|1"), 1u);
  ASSERT_EQ((*ingest)->Sources().size(), 1u);
  EXPECT_EQ((*ingest)->Sources()[0].labels.instance_id, "vllm-a");

  ASSERT_TRUE((*ingest)->RemoveSource("vllm-a|acme|1").ok());
  EXPECT_TRUE(index.Stats().workers.empty());
  EXPECT_EQ(Matched(index, {1}, "vllm-a|acme|1"), 0u);
  EXPECT_EQ((*ingest)->RemoveSource("vllm-a|acme|1").code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE((*ingest)->Sources().empty());

  pub.Publish(StoredPayload({2}, 1001, kBs, /*dp_rank=*/3));
  ASSERT_TRUE((*ingest)->AddSource(s).ok());
  ASSERT_TRUE(WaitFor(index, [](const IndexStats& st) {
    return st.workers.size() == 1 && st.workers[0].last_seq == 1;
  }));
  EXPECT_EQ(Matched(index, {1, 2}, "vllm-a|acme|1"), 2u);
  st = index.Stats();
  EXPECT_EQ(st.workers[0].clears[static_cast<int>(ClearReason::kRemoved)], 1u);
  (*ingest)->Stop();
  EXPECT_EQ((*ingest)->AddSource(s).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Sources added and removed from several threads at once, while their
// streams apply batches: every call answers, and what is left is exactly
// the sources last added.
TEST(IngestRuntimeSources, ConcurrentAddAndRemove) {
  Publisher pub;
  pub.Publish(StoredPayload({1}, 0));
  FleetIndex index(IndexOptions{kBs, 1000000});
  IngestOptions o;
  o.poll_interval = absl::Milliseconds(5);
  auto ingest = Ingest::Start(&index, o);
  ASSERT_TRUE(ingest.ok()) << ingest.status();
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      IndexSource s{absl::StrCat("w", t), pub.endpoint(),
                    pub.replay_endpoint()};
      for (int i = 0; i < 10; ++i) {
        EXPECT_TRUE((*ingest)->AddSource(s).ok());
        EXPECT_TRUE((*ingest)->RemoveSource(s.name).ok());
      }
      if (t != 1) {
        EXPECT_TRUE((*ingest)->AddSource(s).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(WaitFor(index, [](const IndexStats& st) {
    return st.workers.size() == 2 && st.workers[0].last_seq == 0 &&
           st.workers[1].last_seq == 0;
  }));
  const IndexStats st = index.Stats();
  EXPECT_EQ(st.workers[0].worker, "w0");
  EXPECT_EQ(st.workers[1].worker, "w2");
  EXPECT_EQ(Matched(index, {1}, "w2"), 1u);
  EXPECT_EQ((*ingest)->Sources().size(), 2u);
}

// A batch whose second event is a worst case for the decoder: one
// BlockStored of group 1 (a group the worker never declared, so its blocks
// are dropped) with `tokens` token ids of one byte each; its first event
// stores blocks {1, 2}, which Route then finds.
std::string GroupOnePayload(size_t tokens) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(2);
  pk.pack_double(1.0e9);
  pk.pack_array(2);
  // StoredPayload's one event, after its batch's headers.
  msgpack::sbuffer head;
  msgpack::packer<msgpack::sbuffer> head_pk(head);
  head_pk.pack_array(2);
  head_pk.pack_double(1.0e9);
  head_pk.pack_array(1);
  const std::string small = StoredPayload({1, 2}, 0);
  buf.write(small.data() + head.size(), small.size() - head.size());
  pk.pack_array(10);
  pk.pack(std::string("BlockStored"));
  pk.pack_array(1);
  pk.pack_uint64(7);
  pk.pack_nil();
  pk.pack_array(static_cast<uint32_t>(tokens));
  for (size_t i = 0; i < tokens; ++i) pk.pack_uint32(1);
  pk.pack_uint64(tokens);
  pk.pack_nil();
  pk.pack(std::string("GPU"));
  pk.pack_nil();
  pk.pack_nil();
  pk.pack_int(1);  // group_idx
  return std::string(buf.data(), buf.size());
}

TEST(IngestDecodeBudget, GroupOnePayloadDecodes) {
  KvEventBatch batch;
  const absl::Status s = DecodeEventBatch(GroupOnePayload(100), &batch);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(batch.events.size(), 2u);
  EXPECT_EQ(std::get<BlockStoredEvent>(batch.events[0]).block_hashes,
            (std::vector<EngineHash>{1001, 1002}));
  EXPECT_EQ(std::get<BlockStoredEvent>(batch.events[1]).token_ids.size(), 100u);
}

// Sources that each bring a large payload at once decode within the one
// budget they share: never more than it reserved together, each waiting
// its turn, and every batch applied. The test holds the whole budget until
// all of them wait, so that they do (through the catch-up replay, the
// path a reconnect takes; live and listen batches reserve in the same
// place).
TEST(IngestDecodeBudget, SourcesDecodeWithinTheirSharedBudget) {
  constexpr int kSources = 4;
  const std::string payload = GroupOnePayload(size_t{1} << 20);
  const int64_t estimate = DecodePeakEstimate(payload.size());
  std::vector<std::unique_ptr<Publisher>> pubs;
  for (int i = 0; i < kSources; ++i) {
    pubs.push_back(std::make_unique<Publisher>());
    pubs.back()->Publish(payload, /*drop=*/true);  // in the replay buffer
  }
  FleetIndex index(IndexOptions{kBs, 1000000});
  IngestOptions o;
  for (int i = 0; i < kSources; ++i) {
    o.sources.push_back({absl::StrCat("e", i), pubs[i]->endpoint(),
                         pubs[i]->replay_endpoint()});
  }
  o.poll_interval = absl::Milliseconds(5);
  o.decode_budget_bytes = estimate + estimate / 2;  // room for one decode
  auto ingest = Ingest::Start(&index, o);
  ASSERT_TRUE(ingest.ok()) << ingest.status();
  DecodeBudget& budget = (*ingest)->decode_budget();
  const std::atomic<bool> no_stop{false};
  DecodeBudget::Reservation all =
      budget.Reserve(o.decode_budget_bytes, no_stop);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (budget.waiting() < kSources && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(budget.waiting(), static_cast<size_t>(kSources))
      << "the sources decoded without waiting for the budget";
  EXPECT_EQ(index.Stats().workers.size(), static_cast<size_t>(kSources));
  for (const auto& w : index.Stats().workers) EXPECT_EQ(w.last_seq, -1);
  all.Release();
  ASSERT_TRUE(WaitFor(index, [](const IndexStats& st) {
    int applied = 0;
    for (const auto& w : st.workers) applied += w.last_seq == 0;
    return applied == kSources;
  }));
  for (int i = 0; i < kSources; ++i) {
    EXPECT_EQ(Matched(index, {1, 2}, absl::StrCat("e", i)), 2u) << i;
  }
  EXPECT_EQ(budget.waits(), static_cast<uint64_t>(kSources));
  EXPECT_LE(budget.peak_reserved_bytes(), o.decode_budget_bytes);
  // A runner releases its reservation after its batch is applied (and its
  // decode buffers freed), so the last one may still hold it for a moment.
  const absl::Time released_by = absl::Now() + absl::Seconds(10);
  while (budget.reserved_bytes() != 0 && absl::Now() < released_by)
    absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(budget.reserved_bytes(), 0);
}

// A source waiting for the budget stops when removed, and so does the
// whole ingest, without the budget ever coming free.
TEST(IngestDecodeBudget, StopEndsADecodeWaitingForTheBudget) {
  Publisher a, b;
  a.Publish(StoredPayload({1}, 0), /*drop=*/true);
  b.Publish(StoredPayload({1}, 0), /*drop=*/true);
  FleetIndex index(IndexOptions{kBs, 1000000});
  IngestOptions o;
  o.sources.push_back({"a", a.endpoint(), a.replay_endpoint()});
  o.sources.push_back({"b", b.endpoint(), b.replay_endpoint()});
  o.poll_interval = absl::Milliseconds(5);
  auto ingest = Ingest::Start(&index, o);
  ASSERT_TRUE(ingest.ok()) << ingest.status();
  DecodeBudget& budget = (*ingest)->decode_budget();
  const std::atomic<bool> no_stop{false};
  DecodeBudget::Reservation all =
      budget.Reserve(o.decode_budget_bytes, no_stop);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (budget.waiting() < 2 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(budget.waiting(), 2u);
  EXPECT_TRUE((*ingest)->RemoveSource("a").ok());
  EXPECT_EQ(budget.waiting(), 1u);
  (*ingest)->Stop();
  EXPECT_EQ(budget.waiting(), 0u);
  EXPECT_EQ(budget.reserved_bytes(), o.decode_budget_bytes);  // only ours
  EXPECT_EQ(Matched(index, {1}, "b"), 0u);
}

TEST(IngestOptions, ADecodeBudgetMustBePositive) {
  IngestOptions o;
  o.decode_budget_bytes = 0;
  EXPECT_THAT(ValidateIngestOptions(o).message(),
              HasSubstr("index decode_budget 0 must be positive"));
}

}  // namespace
}  // namespace prefixd
