// Retention hints and eviction policies end to end: a Server on port 0
// driven over a real gRPC channel with a small budget, under each policy.
// The daemon's clock is a ManualClock, so a hint lapses without sleeping.
#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prefixd/v1/prefix_cache.grpc.pb.h"
#include "server/config.h"
#include "server/test_server.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr int kBlockSize = 4;
constexpr uint64_t kBlockBytes = kBlockSize * 131072;  // llama-3-8b fp16
constexpr uint64_t kBudgetBlocks = 8;

// n blocks of tokens unique to `first`.
std::vector<uint32_t> Tokens(uint32_t first, int blocks) {
  std::vector<uint32_t> t(blocks * kBlockSize);
  for (size_t i = 0; i < t.size(); ++i) t[i] = first * 1000 + i;
  return t;
}

v1::InsertRequest InsertReq(uint32_t first, std::vector<uint64_t> ids) {
  v1::InsertRequest r;
  const std::vector<uint32_t> t = Tokens(first, static_cast<int>(ids.size()));
  r.mutable_tokens()->Add(t.begin(), t.end());
  r.mutable_block_ids()->Add(ids.begin(), ids.end());
  return r;
}

v1::InsertRequest WithPriority(v1::InsertRequest r, uint32_t priority,
                               uint64_t duration_ms = 0) {
  r.mutable_retention()->set_priority(priority);
  r.mutable_retention()->set_duration_ms(duration_ms);
  return r;
}

std::vector<uint64_t> Evicted(const v1::InsertResponse& r) {
  return {r.evicted_block_ids().begin(), r.evicted_block_ids().end()};
}

class RetentionTest : public ::testing::TestWithParam<EvictionPolicy> {
 protected:
  void SetUp() override {
    absl::StatusOr<ServerConfig> config = TestServer::Config(absl::StrCat(
        "block_size: ", kBlockSize, " kv_budget: \"",
        kBudgetBlocks * kBlockBytes,
        "B\" eviction { policy: ", EvictionPolicyName(GetParam()), " }"));
    ASSERT_TRUE(config.ok()) << config.status();
    ASSERT_EQ(config->cache.eviction_policy, GetParam());
    config->cache.clock = &clock_;
    ASSERT_TRUE(server_.Start(*std::move(config)).ok());
    stub_ = server_.Stub(TestServer::Transport::kTcp);
  }

  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (v1::PrefixCache::Stub::*method)(
                        grpc::ClientContext*, const Req&, Resp*),
                    const Req& req, Resp* resp) {
    return ((*stub_).*method)(TestServer::Context().get(), req, resp);
  }

  v1::InsertResponse Insert(const v1::InsertRequest& req) {
    v1::InsertResponse r;
    grpc::Status s = Call(&v1::PrefixCache::Stub::Insert, req, &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return r;
  }

  std::string StatsText() {
    v1::StatsResponse r;
    grpc::Status s =
        Call(&v1::PrefixCache::Stub::Stats, v1::StatsRequest(), &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return r.DebugString();
  }

  ManualClock clock_;
  TestServer server_;
  std::unique_ptr<v1::PrefixCache::Stub> stub_;
};

INSTANTIATE_TEST_SUITE_P(Policies, RetentionTest,
                         ::testing::Values(EvictionPolicy::kLru,
                                           EvictionPolicy::kAdaptive),
                         [](const auto& info) {
                           return std::string(EvictionPolicyName(info.param));
                         });

TEST_P(RetentionTest, GetInfoNamesThePolicy) {
  v1::GetInfoResponse info;
  ASSERT_TRUE(
      Call(&v1::PrefixCache::Stub::GetInfo, v1::GetInfoRequest(), &info).ok());
  EXPECT_EQ(info.eviction_policy(), EvictionPolicyName(GetParam()));
}

// B is older than A, so recency alone would take B; its priority keeps it.
TEST_P(RetentionTest, LowerPriorityGoesFirst) {
  Insert(WithPriority(InsertReq(1, {10, 11}), 80));  // B
  Insert(WithPriority(InsertReq(2, {20, 21}), 20));  // A
  v1::InsertResponse c = Insert(InsertReq(3, {30, 31, 32, 33, 34, 35}));
  EXPECT_THAT(Evicted(c), UnorderedElementsAre(20, 21));
}

TEST_P(RetentionTest, AHintLapsesAfterItsDuration) {
  // B at 80 for one second, then A without a hint (50).
  Insert(WithPriority(InsertReq(1, {10, 11}), 80, 1000));
  Insert(InsertReq(2, {20, 21}));
  clock_.Advance(absl::Seconds(2));
  // B is ordinary again, and the older of the two.
  v1::InsertResponse c = Insert(InsertReq(3, {30, 31, 32, 33, 34, 35}));
  EXPECT_THAT(Evicted(c), UnorderedElementsAre(10, 11));
}

TEST_P(RetentionTest, BeforeItLapsesTheHintHolds) {
  Insert(WithPriority(InsertReq(1, {10, 11}), 80, 1000));
  Insert(InsertReq(2, {20, 21}));
  clock_.Advance(absl::Milliseconds(500));
  v1::InsertResponse c = Insert(InsertReq(3, {30, 31, 32, 33, 34, 35}));
  EXPECT_THAT(Evicted(c), UnorderedElementsAre(20, 21));
}

TEST_P(RetentionTest, HintsNeverBreakTheBudget) {
  Insert(WithPriority(InsertReq(1, {10, 11, 12, 13}), 100));
  Insert(WithPriority(InsertReq(2, {20, 21, 22, 23}), 100));
  v1::InsertResponse c = Insert(InsertReq(3, {30, 31}));
  EXPECT_EQ(c.evicted_block_ids_size(), 2);
  v1::StatsResponse s;
  ASSERT_TRUE(Call(&v1::PrefixCache::Stub::Stats, v1::StatsRequest(), &s).ok());
  ASSERT_EQ(s.tenants_size(), 1);
  EXPECT_EQ(s.tenants(0).cached_blocks(), kBudgetBlocks);
}

// Stats carries the counts /metrics exports, by class name.
TEST_P(RetentionTest, StatsCountsBlocksByRetentionClass) {
  Insert(WithPriority(InsertReq(1, {10, 11}), 20));  // low
  Insert(WithPriority(InsertReq(2, {20, 21}), 90));  // high
  Insert(InsertReq(3, {30, 31}));                    // default
  // Two of the budget's eight blocks must go: the low ones.
  Insert(InsertReq(4, {40, 41, 42, 43}));
  v1::StatsResponse s;
  ASSERT_TRUE(Call(&v1::PrefixCache::Stub::Stats, v1::StatsRequest(), &s).ok());
  ASSERT_EQ(s.tenants_size(), 1);
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_class;
  for (const v1::RetentionCount& c : s.tenants(0).retention())
    by_class[c.retention()] = {c.cached_blocks(), c.evicted_blocks()};
  using Counts = std::pair<uint64_t, uint64_t>;  // cached, evicted
  EXPECT_THAT(by_class, ElementsAre(Pair("default", Counts{6, 0}),
                                    Pair("high", Counts{2, 0}),
                                    Pair("low", Counts{0, 2})));
}

TEST_P(RetentionTest, ARangeGivesPartOfTheInsertItsOwnHint) {
  // One Insert: its first block at 90, the rest at 10.
  v1::InsertRequest req = WithPriority(InsertReq(1, {10, 11, 12, 13}), 10);
  v1::RetentionRange* head = req.mutable_retention()->add_ranges();
  head->set_token_begin(0);
  head->set_token_end(kBlockSize);
  head->set_priority(90);
  Insert(req);
  Insert(InsertReq(2, {20, 21}));  // 50, newer
  // Four blocks must go: only leaves go, so the tail 13, 12, 11 (at 10),
  // then the lowest of what is left: 21 (50) before 10 (90).
  v1::InsertResponse c = Insert(InsertReq(3, {30, 31, 32, 33, 34, 35}));
  EXPECT_THAT(Evicted(c), UnorderedElementsAre(11, 12, 13, 21));
}

TEST_P(RetentionTest, BadHintsAreInvalidArgumentAndChangeNothing) {
  Insert(InsertReq(1, {10, 11}));
  const std::string before = StatsText();
  struct Case {
    std::function<void(v1::Retention*)> set;
    std::vector<std::string> message_has;
  };
  const std::vector<Case> cases = {
      {[](v1::Retention* r) { r->set_priority(101); }, {"101", "100"}},
      {[](v1::Retention* r) {
         v1::RetentionRange* g = r->add_ranges();
         g->set_token_end(8);
         g->set_priority(101);
       },
       {"101", "100"}},
      {[](v1::Retention* r) {
         v1::RetentionRange* g = r->add_ranges();
         g->set_token_begin(4);
         g->set_token_end(4);
       },
       {"4"}},
      {[](v1::Retention* r) { r->add_ranges()->set_token_end(40); },
       {"40", "8"}},
      {[](v1::Retention* r) {
         v1::RetentionRange* a = r->add_ranges();
         a->set_token_begin(0);
         a->set_token_end(8);
         v1::RetentionRange* b = r->add_ranges();
         b->set_token_begin(4);
         b->set_token_end(8);
       },
       {"0", "1"}},
  };
  for (const Case& c : cases) {
    // Over cached blocks 10, 11: a refused hint must not touch them either.
    v1::InsertRequest req = InsertReq(1, {10, 11});
    c.set(req.mutable_retention());
    v1::InsertResponse resp;
    grpc::Status s = Call(&v1::PrefixCache::Stub::Insert, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << req.retention().DebugString();
    for (const std::string& m : c.message_has) {
      EXPECT_THAT(s.error_message(), HasSubstr(m));
    }
    // In a batch the bad item fails alone.
    v1::InsertBatchRequest batch;
    *batch.add_requests() = req;
    v1::InsertBatchResponse batch_resp;
    ASSERT_TRUE(
        Call(&v1::PrefixCache::Stub::InsertBatch, batch, &batch_resp).ok());
    ASSERT_EQ(batch_resp.results_size(), 1);
    EXPECT_EQ(batch_resp.results(0).code(), 3);  // INVALID_ARGUMENT
  }
  EXPECT_EQ(StatsText(), before);
  // Nothing took the refused priorities: 10, 11 are still plain 50 and the
  // oldest, so they go first.
  Insert(InsertReq(2, {20, 21}));
  v1::InsertResponse c = Insert(InsertReq(3, {30, 31, 32, 33, 34, 35}));
  EXPECT_THAT(Evicted(c), UnorderedElementsAre(10, 11));
}

}  // namespace
}  // namespace prefixd
