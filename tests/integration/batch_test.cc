// MatchBatch and InsertBatch end to end over real gRPC channels (TCP and a
// Unix socket): a batch gives exactly what the same calls one by one give,
// items fail alone, a batch past the limits is refused whole and changes
// nothing, and the RPC observer sees one call per batch. Tokens sent as
// tokens_le32 give exactly what the repeated field gives.
#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "prefixd/v1/prefix_cache.grpc.pb.h"
#include "server/config.h"
#include "server/server.h"
#include "server/test_server.h"

namespace prefixd {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kBlockSize = 4;
constexpr uint64_t kBlockBytes = kBlockSize * 131072;  // llama-3-8b fp16
constexpr uint64_t kBudgetBlocks = 8;
constexpr uint64_t kEpoch = 0xb47c4;
constexpr int kOk = 0;
constexpr int kInvalidArgument = 3;

using Transport = TestServer::Transport;

std::vector<uint32_t> Tokens(uint32_t first, int n) {
  std::vector<uint32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

v1::InsertRequest InsertReq(const std::vector<uint32_t>& tokens,
                            const std::vector<uint64_t>& ids,
                            bool pin = false) {
  v1::InsertRequest r;
  r.mutable_tokens()->Add(tokens.begin(), tokens.end());
  r.mutable_block_ids()->Add(ids.begin(), ids.end());
  r.set_pin(pin);
  return r;
}

v1::MatchRequest MatchReq(const std::vector<uint32_t>& tokens,
                          bool pin = false) {
  v1::MatchRequest r;
  r.mutable_tokens()->Add(tokens.begin(), tokens.end());
  r.set_pin(pin);
  return r;
}

// Records what the service reports to the metrics hook.
class RecordingObserver : public RpcObserver {
 public:
  void OnRpcDone(absl::string_view method, absl::StatusCode code,
                 absl::Duration) override {
    MutexLock lock(&mu_);
    calls_.emplace_back(std::string(method), code);
  }
  std::vector<std::pair<std::string, absl::StatusCode>> calls() {
    MutexLock lock(&mu_);
    return calls_;
  }
  void Clear() {
    MutexLock lock(&mu_);
    calls_.clear();
  }

 private:
  Mutex mu_;
  std::vector<std::pair<std::string, absl::StatusCode>> calls_
      ABSL_GUARDED_BY(mu_);
};

#define ASSERT_OK(status) ASSERT_TRUE((status).ok()) << (status).error_message()

class BatchTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override { Start(); }
  void TearDown() override { test_server_.Stop(); }

  // (Re)starts the server: a fixed epoch and lease-id seed, so two servers
  // fed the same calls answer byte for byte alike.
  void Start(const std::function<void(ServerConfig*)>& adjust = {}) {
    absl::StatusOr<ServerConfig> config = TestServer::Config(
        absl::StrCat("block_size: ", kBlockSize, " kv_budget: \"",
                     kBudgetBlocks * kBlockBytes, "B\""));
    ASSERT_TRUE(config.ok()) << config.status();
    config->cache.clock = &clock_;
    config->cache.seed = 42;
    if (adjust) adjust(&*config);
    ServerDeps deps;
    deps.epoch = kEpoch;
    deps.observer = &observer_;
    absl::Status started =
        test_server_.Start(*std::move(config), std::move(deps));
    ASSERT_TRUE(started.ok()) << started;
    channel_ = test_server_.Channel(GetParam());
    stub_ = v1::PrefixCache::NewStub(channel_);
    observer_.Clear();
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& tenant = "") {
    return TestServer::Context(tenant);
  }

  grpc::Status MatchBatch(const std::vector<v1::MatchRequest>& reqs,
                          v1::MatchBatchResponse* resp,
                          const std::string& tenant = "") {
    v1::MatchBatchRequest batch;
    for (const auto& r : reqs) *batch.add_requests() = r;
    return stub_->MatchBatch(Ctx(tenant).get(), batch, resp);
  }

  grpc::Status InsertBatch(const std::vector<v1::InsertRequest>& reqs,
                           v1::InsertBatchResponse* resp,
                           const std::string& tenant = "") {
    v1::InsertBatchRequest batch;
    for (const auto& r : reqs) *batch.add_requests() = r;
    return stub_->InsertBatch(Ctx(tenant).get(), batch, resp);
  }

  uint64_t CachedBlocks() {
    v1::StatsResponse s;
    grpc::Status status = stub_->Stats(Ctx().get(), v1::StatsRequest(), &s);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return s.tenants().empty() ? 0 : s.tenants(0).cached_blocks();
  }

  ManualClock clock_;
  RecordingObserver observer_;  // outlives test_server_
  TestServer test_server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::PrefixCache::Stub> stub_;
};

INSTANTIATE_TEST_SUITE_P(Transports, BatchTest,
                         ::testing::Values(Transport::kTcp, Transport::kUnix),
                         [](const ::testing::TestParamInfo<Transport>& info) {
                           return TestServer::TransportName(info.param);
                         });

// Inserts that adopt, confirm, return redundant IDs, pin, and evict (the
// budget is 8 blocks), then matches that hit, miss, stop inside an edge and
// pin: run one call at a time on one server, then as two batches on a fresh
// server with the same epoch and lease seed. Every item equals its call.
TEST_P(BatchTest, BatchResultsEqualSingleCalls) {
  const std::vector<v1::InsertRequest> inserts = {
      InsertReq(Tokens(0, 8), {1, 2}),
      InsertReq(Tokens(0, 12), {1, 2, 3}, /*pin=*/true),  // confirms 1, 2
      InsertReq(Tokens(0, 16), {7, 8, 9, 10}),            // 7, 8, 9 redundant
      InsertReq(Tokens(100, 20), {20, 21, 22, 23, 24}),   // evicts
      InsertReq(Tokens(200, 8), {30, 31}, /*pin=*/true),  // evicts
  };
  const std::vector<v1::MatchRequest> matches = {
      MatchReq(Tokens(0, 16)),
      MatchReq(Tokens(0, 6), /*pin=*/true),  // one whole block
      MatchReq(Tokens(100, 20)),
      MatchReq(Tokens(500, 8)),  // miss
      MatchReq(Tokens(200, 8), /*pin=*/true),
  };

  std::vector<v1::InsertResponse> single_inserts;
  for (const auto& r : inserts) {
    v1::InsertResponse resp;
    ASSERT_OK(stub_->Insert(Ctx().get(), r, &resp));
    single_inserts.push_back(resp);
  }
  std::vector<v1::MatchResponse> single_matches;
  for (const auto& r : matches) {
    v1::MatchResponse resp;
    ASSERT_OK(stub_->Match(Ctx().get(), r, &resp));
    single_matches.push_back(resp);
  }
  // The sequence exercises what it claims to.
  EXPECT_EQ(single_inserts[1].cached_tokens(), 8u);
  EXPECT_THAT(single_inserts[2].redundant_block_ids(), ElementsAre(7, 8, 9));
  EXPECT_FALSE(single_inserts[3].evicted_block_ids().empty());
  EXPECT_NE(single_matches[1].lease_id(), 0u);
  EXPECT_EQ(single_matches[3].matched_tokens(), 0u);

  Start();
  v1::InsertBatchResponse ib;
  ASSERT_OK(InsertBatch(inserts, &ib));
  v1::MatchBatchResponse mb;
  ASSERT_OK(MatchBatch(matches, &mb));
  EXPECT_EQ(ib.epoch(), kEpoch);
  EXPECT_EQ(mb.epoch(), kEpoch);
  ASSERT_EQ(ib.results_size(), static_cast<int>(inserts.size()));
  ASSERT_EQ(mb.results_size(), static_cast<int>(matches.size()));
  for (size_t i = 0; i < inserts.size(); ++i) {
    EXPECT_EQ(ib.results(i).code(), kOk) << ib.results(i).message();
    EXPECT_TRUE(
        MessageDifferencer::Equals(ib.results(i).response(), single_inserts[i]))
        << "insert " << i << ": " << ib.results(i).response().DebugString()
        << " vs " << single_inserts[i].DebugString();
  }
  for (size_t i = 0; i < matches.size(); ++i) {
    EXPECT_EQ(mb.results(i).code(), kOk) << mb.results(i).message();
    EXPECT_TRUE(
        MessageDifferencer::Equals(mb.results(i).response(), single_matches[i]))
        << "match " << i << ": " << mb.results(i).response().DebugString()
        << " vs " << single_matches[i].DebugString();
  }
}

// The same requests with their tokens in tokens_le32 instead of the
// repeated field, one call at a time and in batches, on fresh servers with
// the same epoch and lease seed: every response is byte for byte the same.
TEST_P(BatchTest, TokensLe32EqualsRepeatedTokens) {
  const std::vector<v1::InsertRequest> inserts = {
      InsertReq(Tokens(0, 8), {1, 2}),
      InsertReq(Tokens(0, 12), {1, 2, 3}, /*pin=*/true),
      InsertReq(Tokens(0xfffffff0u, 16), {7, 8, 9, 10}),  // all 4 bytes used
      InsertReq(Tokens(100, 20), {20, 21, 22, 23, 24}),   // evicts
  };
  const std::vector<v1::MatchRequest> matches = {
      MatchReq(Tokens(0, 16)),           MatchReq(Tokens(0, 6), /*pin=*/true),
      MatchReq(Tokens(0xfffffff0u, 16)), MatchReq(Tokens(500, 8)),  // miss
      MatchReq(Tokens(0, 10)),  // stops inside a block
  };
  auto le32 = [](auto r) {
    std::vector<uint32_t> t(r.tokens().begin(), r.tokens().end());
    r.clear_tokens();
    r.set_tokens_le32(TokensLe32(t));
    return r;
  };
  // Runs every insert and match one by one, then both as batches; with
  // `encode`, their tokens go in tokens_le32.
  auto run = [&](bool encode) {
    std::vector<std::string> out;
    Start();
    for (const auto& r : inserts) {
      v1::InsertResponse resp;
      EXPECT_TRUE(stub_->Insert(Ctx().get(), encode ? le32(r) : r, &resp).ok());
      out.push_back(resp.SerializeAsString());
    }
    for (const auto& r : matches) {
      v1::MatchResponse resp;
      EXPECT_TRUE(stub_->Match(Ctx().get(), encode ? le32(r) : r, &resp).ok());
      out.push_back(resp.SerializeAsString());
    }
    std::vector<v1::InsertRequest> ib_reqs = inserts;
    std::vector<v1::MatchRequest> mb_reqs = matches;
    if (encode) {
      for (auto& r : ib_reqs) r = le32(r);
      for (auto& r : mb_reqs) r = le32(r);
    }
    Start();
    v1::InsertBatchResponse ib;
    EXPECT_TRUE(InsertBatch(ib_reqs, &ib).ok());
    v1::MatchBatchResponse mb;
    EXPECT_TRUE(MatchBatch(mb_reqs, &mb).ok());
    out.push_back(ib.SerializeAsString());
    out.push_back(mb.SerializeAsString());
    return out;
  };
  const std::vector<std::string> repeated = run(false);
  const std::vector<std::string> encoded = run(true);
  ASSERT_EQ(repeated.size(), inserts.size() + matches.size() + 2);
  EXPECT_EQ(encoded, repeated);
  // And the sequence hit, pinned and evicted, so the equality means something.
  v1::MatchResponse pinned;
  ASSERT_TRUE(pinned.ParseFromString(encoded[inserts.size() + 1]));
  EXPECT_EQ(pinned.matched_tokens(), 4u);
  EXPECT_NE(pinned.lease_id(), 0u);
  v1::InsertResponse evicting;
  ASSERT_TRUE(evicting.ParseFromString(encoded[3]));
  EXPECT_FALSE(evicting.evicted_block_ids().empty());
}

// A tokens_le32 that is not whole tokens, or tokens in both fields, is
// INVALID_ARGUMENT naming the sizes; in a batch it refuses the whole batch
// (naming the item) before any item runs. Nothing changes.
TEST_P(BatchTest, MalformedTokensLe32IsRefusedAndChangesNothing) {
  v1::InsertRequest ragged = InsertReq({}, {1, 2});
  ragged.set_tokens_le32(std::string(7, '\x01'));
  v1::InsertResponse ir;
  grpc::Status s = stub_->Insert(Ctx().get(), ragged, &ir);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("tokens_le32 is 7 bytes, not a multiple of 4"));

  v1::InsertRequest both = InsertReq(Tokens(0, 8), {1, 2});
  both.set_tokens_le32(TokensLe32(Tokens(0, 4)));
  s = stub_->Insert(Ctx().get(), both, &ir);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("both tokens (8 tokens) and tokens_le32 (4 tokens)"));

  v1::MatchRequest m = MatchReq({});
  m.set_tokens_le32(std::string(5, '\0'));
  v1::MatchResponse mr;
  s = stub_->Match(Ctx().get(), m, &mr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("tokens_le32 is 5 bytes"));

  v1::InsertBatchResponse ib;
  s = InsertBatch({InsertReq(Tokens(0, 8), {1, 2}), ragged}, &ib);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("requests[1]: tokens_le32 is 7 bytes"));
  v1::MatchBatchResponse mb;
  s = MatchBatch({MatchReq(Tokens(0, 8), /*pin=*/true), m}, &mb);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("requests[1]: tokens_le32 is 5"));

  EXPECT_EQ(CachedBlocks(), 0u);  // item 0 of the insert batch did not run
  // And the IDs are still free to use: nothing kept them.
  ASSERT_OK(stub_->Insert(Ctx().get(), InsertReq(Tokens(0, 8), {1, 2}), &ir));
  EXPECT_EQ(CachedBlocks(), 2u);
}

TEST_P(BatchTest, ItemsFailAloneAndTheRestApply) {
  v1::InsertBatchResponse ib;
  ASSERT_OK(InsertBatch(
      {
          InsertReq(Tokens(0, 8), {1, 2}),
          InsertReq(Tokens(20, 8), {3}),  // one ID for two blocks
          InsertReq(Tokens(40, 4), {4}),
          InsertReq(Tokens(60, 4), {1}),     // 1 is cached elsewhere
          InsertReq(Tokens(80, 6), {5, 6}),  // not whole blocks
      },
      &ib));
  ASSERT_EQ(ib.results_size(), 5);
  EXPECT_EQ(ib.results(0).code(), kOk);
  EXPECT_EQ(ib.results(1).code(), kInvalidArgument);
  EXPECT_THAT(ib.results(1).message(), HasSubstr("1 block_ids for 8 tokens"));
  EXPECT_FALSE(ib.results(1).has_response());
  EXPECT_EQ(ib.results(2).code(), kOk);
  EXPECT_EQ(ib.results(2).response().epoch(), kEpoch);
  EXPECT_EQ(ib.results(3).code(), kInvalidArgument);
  EXPECT_THAT(ib.results(3).message(),
              HasSubstr("block id 1 is already cached"));
  EXPECT_EQ(ib.results(4).code(), kInvalidArgument);
  EXPECT_THAT(ib.results(4).message(), HasSubstr("6 tokens"));
  EXPECT_EQ(CachedBlocks(), 3u);  // items 0 and 2 only

  v1::MatchBatchResponse mb;
  v1::MatchRequest negative = MatchReq(Tokens(0, 8));
  negative.set_position_offset(-1);
  ASSERT_OK(MatchBatch(
      {MatchReq({}), MatchReq(Tokens(0, 8)), negative, MatchReq(Tokens(40, 4))},
      &mb));
  ASSERT_EQ(mb.results_size(), 4);
  EXPECT_EQ(mb.results(0).code(), kInvalidArgument);
  EXPECT_FALSE(mb.results(0).message().empty());
  EXPECT_EQ(mb.results(1).code(), kOk);
  EXPECT_EQ(mb.results(1).response().matched_tokens(), 8u);
  EXPECT_EQ(mb.results(2).code(), kInvalidArgument);
  EXPECT_THAT(mb.results(2).message(), HasSubstr("-1"));
  EXPECT_EQ(mb.results(3).code(), kOk);
  EXPECT_EQ(mb.results(3).response().matched_tokens(), 4u);

  // Items failing alone do not fail the call: the observer sees OK.
  EXPECT_THAT(observer_.calls(),
              ElementsAre(std::make_pair("InsertBatch", absl::StatusCode::kOk),
                          std::make_pair("Stats", absl::StatusCode::kOk),
                          std::make_pair("MatchBatch", absl::StatusCode::kOk)));
}

TEST_P(BatchTest, BatchesPastTheLimitsAreRefusedWhole) {
  Start([](ServerConfig* c) {
    c->cache.limits.max_tokens_per_request = 32;
    c->cache.limits.max_block_ids_per_request = 4;
  });
  v1::MatchBatchResponse mb;
  std::vector<v1::MatchRequest> five(5, MatchReq(Tokens(0, 4)));
  grpc::Status s = MatchBatch(five, &mb);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("MatchBatch of 5 requests"));
  EXPECT_THAT(s.error_message(), HasSubstr("max_block_ids_per_request 4"));

  std::vector<v1::MatchRequest> long_ones(3, MatchReq(Tokens(0, 12)));
  s = MatchBatch(long_ones, &mb);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("36 tokens"));
  EXPECT_THAT(s.error_message(), HasSubstr("max_tokens_per_request 32"));

  v1::InsertBatchResponse ib;
  s = InsertBatch(
      {InsertReq(Tokens(0, 8), {1, 2}), InsertReq(Tokens(10, 8), {3, 4}),
       InsertReq(Tokens(20, 8), {5, 6})},
      &ib);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("6 block_ids"));
  EXPECT_THAT(s.error_message(), HasSubstr("max_block_ids_per_request 4"));

  s = InsertBatch({}, &ib);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("no requests"));

  EXPECT_EQ(CachedBlocks(), 0u);  // nothing of the refused batches applied
  EXPECT_THAT(
      observer_.calls(),
      ElementsAre(
          std::make_pair("MatchBatch", absl::StatusCode::kInvalidArgument),
          std::make_pair("MatchBatch", absl::StatusCode::kInvalidArgument),
          std::make_pair("InsertBatch", absl::StatusCode::kInvalidArgument),
          std::make_pair("InsertBatch", absl::StatusCode::kInvalidArgument),
          std::make_pair("Stats", absl::StatusCode::kOk)));

  // At the limits exactly, the batch runs.
  ASSERT_OK(InsertBatch(
      {InsertReq(Tokens(0, 8), {1, 2}), InsertReq(Tokens(10, 8), {3, 4})},
      &ib));
  EXPECT_EQ(CachedBlocks(), 4u);
}

TEST_P(BatchTest, BatchesStayInTheirTenant) {
  v1::InsertBatchResponse ib;
  ASSERT_OK(InsertBatch({InsertReq(Tokens(0, 8), {1, 2})}, &ib, "a"));
  v1::MatchBatchResponse mb;
  ASSERT_OK(MatchBatch({MatchReq(Tokens(0, 8))}, &mb, "b"));
  EXPECT_EQ(mb.results(0).response().matched_tokens(), 0u);
  ASSERT_OK(MatchBatch({MatchReq(Tokens(0, 8))}, &mb, "a"));
  EXPECT_EQ(mb.results(0).response().matched_tokens(), 8u);
}

TEST_P(BatchTest, ClientMethods) {
  std::unique_ptr<Client> client = Client::FromChannel(channel_);
  v1::InsertBatchRequest ins;
  *ins.add_requests() = InsertReq(Tokens(0, 8), {1, 2});
  *ins.add_requests() = InsertReq(Tokens(0, 4), {9});  // 9 redundant
  absl::StatusOr<v1::InsertBatchResponse> ib = client->InsertBatch(ins);
  ASSERT_TRUE(ib.ok()) << ib.status();
  EXPECT_EQ(client->epoch(), kEpoch);
  EXPECT_THAT(ib->results(1).response().redundant_block_ids(), ElementsAre(9));

  v1::MatchBatchRequest m;
  *m.add_requests() = MatchReq(Tokens(0, 8));
  absl::StatusOr<v1::MatchBatchResponse> mb = client->MatchBatch(m);
  ASSERT_TRUE(mb.ok()) << mb.status();
  EXPECT_EQ(mb->results(0).response().matched_tokens(), 8u);

  absl::StatusOr<v1::MatchBatchResponse> empty =
      client->MatchBatch(v1::MatchBatchRequest());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace prefixd
