// RoPE offsets end to end: a test engine keeps, per block ID, the keys it
// computed (K_p = R(p) k for each token at absolute position p), inserts and
// matches through a real prefixd over TCP, and re-rotates each matched
// segment by its rope_delta with the client library's reference rotation.
// The result must equal keys computed afresh at the requested positions.
#include <unistd.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "model/kv_geometry.h"
#include "model/rope.h"
#include "server/config.h"
#include "server/server.h"

namespace prefixd {
namespace {

constexpr int kBlockSize = 4;
constexpr int kHeadDim = 8;

// The raw (unrotated) key of a token: any fixed function of its id.
std::vector<double> RawKey(uint32_t token) {
  std::vector<double> k(kHeadDim);
  for (int i = 0; i < kHeadDim; ++i)
    k[i] = std::sin(0.7 * token + 1.3 * i) + 0.1 * i;
  return k;
}

class TestEngine {
 public:
  explicit TestEngine(RopeConfig rope) : rope_(rope) {}

  // Computes the keys of `tokens` at absolute positions offset.. and stores
  // them under fresh block IDs, one block per kBlockSize tokens.
  std::vector<uint64_t> Prefill(const std::vector<uint32_t>& tokens,
                                int64_t offset) {
    std::vector<uint64_t> ids;
    for (size_t b = 0; b * kBlockSize < tokens.size(); ++b) {
      const uint64_t id = next_id_++;
      for (int j = 0; j < kBlockSize; ++j) {
        const size_t i = b * kBlockSize + j;
        pool_[id].push_back(KeyAt(tokens[i], offset + static_cast<int64_t>(i)));
      }
      ids.push_back(id);
    }
    return ids;
  }

  std::vector<double> KeyAt(uint32_t token, int64_t position) const {
    std::vector<double> k = RawKey(token);
    RotateKey(absl::MakeSpan(k), position, rope_, kHeadDim);
    return k;
  }

  // Re-rotates every key of a match's segments by the segment's delta and
  // returns the largest error against keys computed at the requested
  // positions (requested offset + index in the prompt).
  double MaxErrorAfterReuse(const v1::MatchResponse& m,
                            const std::vector<uint32_t>& tokens,
                            int64_t offset) const {
    double worst = 0;
    size_t token_index = 0;
    for (const v1::Segment& seg : m.segments()) {
      for (uint64_t id : seg.block_ids()) {
        for (const std::vector<double>& cached : pool_.at(id)) {
          std::vector<double> k = cached;
          RotateKey(absl::MakeSpan(k), seg.rope_delta(), rope_, kHeadDim);
          const std::vector<double> want = KeyAt(
              tokens[token_index], offset + static_cast<int64_t>(token_index));
          for (int i = 0; i < kHeadDim; ++i)
            worst = std::max(worst, std::abs(k[i] - want[i]));
          ++token_index;
        }
      }
    }
    return worst;
  }

 private:
  RopeConfig rope_;
  std::map<uint64_t, std::vector<std::vector<double>>> pool_;
  uint64_t next_id_ = 1;
};

std::vector<uint32_t> Tokens(uint32_t first, int n) {
  std::vector<uint32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

class RopeEndToEndTest : public ::testing::TestWithParam<RopeLayout> {
 protected:
  void Start(bool allow) {
    CommandLine flags;
    flags.listen = {"127.0.0.1:0"};
    flags.block_size = kBlockSize;
    absl::StatusOr<ServerConfig> config = LoadServerConfig(flags);
    ASSERT_TRUE(config.ok()) << config.status();
    config->cache.rope_shift = allow ? RopeShift::kAllow : RopeShift::kDeny;
    auto server = Server::Start(*std::move(config));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto client = Client::Connect(server_->addresses()[0]);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  RopeConfig Rope() const {
    RopeConfig r;
    r.theta = 10000;
    r.layout = GetParam();
    return r;
  }

  v1::MatchResponse Match(const std::vector<uint32_t>& tokens, int64_t offset) {
    PrefixOptions o;
    o.position_offset = offset;
    auto m = client_->Match(tokens, o);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? m->response : v1::MatchResponse{};
  }

  void Insert(const std::vector<uint32_t>& tokens,
              const std::vector<uint64_t>& ids, int64_t offset) {
    PrefixOptions o;
    o.position_offset = offset;
    auto r = client_->Insert(tokens, ids, o);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_P(RopeEndToEndTest, ReuseAtAnotherOffsetIsOneSegmentAndReRotatesExactly) {
  Start(/*allow=*/true);
  TestEngine engine(Rope());
  const std::vector<uint32_t> prompt = Tokens(100, 16);
  Insert(prompt, engine.Prefill(prompt, 0), 0);

  const v1::MatchResponse m = Match(prompt, 100);
  ASSERT_EQ(m.matched_tokens(), 16u);
  ASSERT_EQ(m.segments_size(), 1);
  EXPECT_EQ(m.segments(0).rope_delta(), 100);
  EXPECT_EQ(m.segments(0).cached_position(), 0);
  EXPECT_LT(engine.MaxErrorAfterReuse(m, prompt, 100), 1e-9);
}

TEST_P(RopeEndToEndTest, AChildComputedElsewhereIsASecondSegment) {
  Start(/*allow=*/true);
  TestEngine engine(Rope());
  const std::vector<uint32_t> head = Tokens(100, 8);
  std::vector<uint32_t> prompt = head;
  for (uint32_t t : Tokens(500, 8)) prompt.push_back(t);
  Insert(head, engine.Prefill(head, 0), 0);
  // The engine computed the whole prompt at offset 100 and offers its IDs;
  // the head is already cached (its new IDs come back redundant), the tail
  // is adopted at positions 108.. .
  std::vector<uint64_t> ids = engine.Prefill(prompt, 100);
  Insert(prompt, ids, 100);

  const v1::MatchResponse m = Match(prompt, 50);
  ASSERT_EQ(m.matched_tokens(), 16u);
  ASSERT_EQ(m.segments_size(), 2);
  EXPECT_EQ(m.segments(0).rope_delta(), 50);
  EXPECT_EQ(m.segments(1).cached_position(), 108);
  EXPECT_EQ(m.segments(1).rope_delta(), -50);
  EXPECT_LT(engine.MaxErrorAfterReuse(m, prompt, 50), 1e-9);
}

TEST_P(RopeEndToEndTest, IgnoringTheDeltaIsVisiblyWrong) {
  // The control: the same keys without re-rotation are far off, so the
  // check above can fail.
  Start(/*allow=*/true);
  TestEngine engine(Rope());
  const std::vector<uint32_t> prompt = Tokens(100, 8);
  Insert(prompt, engine.Prefill(prompt, 0), 0);
  v1::MatchResponse m = Match(prompt, 100);
  m.mutable_segments(0)->set_rope_delta(0);
  EXPECT_GT(engine.MaxErrorAfterReuse(m, prompt, 100), 0.1);
}

TEST_P(RopeEndToEndTest, DenyStopsAtTheFirstShiftedBlock) {
  Start(/*allow=*/false);
  TestEngine engine(Rope());
  const std::vector<uint32_t> prompt = Tokens(100, 8);
  Insert(prompt, engine.Prefill(prompt, 0), 0);
  EXPECT_EQ(Match(prompt, 100).matched_tokens(), 0u);
  const v1::MatchResponse same = Match(prompt, 0);
  ASSERT_EQ(same.matched_tokens(), 8u);
  EXPECT_EQ(same.segments(0).rope_delta(), 0);
  EXPECT_LT(engine.MaxErrorAfterReuse(same, prompt, 0), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RopeEndToEndTest,
    ::testing::Values(RopeLayout::kNeox, RopeLayout::kGptj),
    [](const auto& info) {
      return std::string(info.param == RopeLayout::kNeox ? "Neox" : "Gptj");
    });

}  // namespace
}  // namespace prefixd
