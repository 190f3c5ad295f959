// What one Route or RouteBatch may cost (server/route_limits.h), over a
// real channel to an in-process server whose fleet index holds many
// workers: an answer past limits.max_message_size is refused as soon as
// the batch gets there (its remaining items are not routed), a `workers`
// filter past its bounds is refused before any routing, and an answer lists
// only the workers with a match unless the caller asks for the others.
#include "server/route_limits.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/kv_index.h"
#include "prefixd/v1/prefix_index.grpc.pb.h"
#include "server/test_server.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

constexpr int kBlockSize = 4;
constexpr int kWorkers = 200;

// AnswerBytes counts what the objects take, which bounds the wire size
// too: an answer within max_message_size can always be sent.
TEST(AnswerBytesTest, AtLeastTheWireSizeAndGrowingWithWorkers) {
  v1::RouteBatchItem item;
  v1::RouteResponse* r = item.mutable_response();
  uint64_t last = AnswerBytes(item);
  for (int i = 0; i < 100; ++i) {
    v1::WorkerMatch* w = r->add_workers();
    w->set_worker(std::string(static_cast<size_t>(i), 'w'));
    w->set_matched_blocks(~uint64_t{0});
    w->set_last_seq(-1);
    w->set_lag_ms(INT64_MIN);
    w->set_state(v1::LIVE);
    for (int m = 0; m < i % 3; ++m) {
      v1::MediumMatch* medium = w->add_mediums();
      medium->set_medium(std::string(static_cast<size_t>(i), 'M'));
      medium->set_matched_blocks(~uint64_t{0});
    }
    const uint64_t now = AnswerBytes(item);
    EXPECT_GE(now, item.ByteSizeLong()) << i << " workers";
    EXPECT_GT(now, last);
    last = now;
  }
}

class RouteLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<ServerConfig> config = TestServer::Config(absl::StrCat(
        "limits { max_message_size: \"1MiB\" }\n", "index { block_size: ",
        kBlockSize, " listen: \"tcp://127.0.0.1:*\" }\n"));
    ASSERT_TRUE(config.ok()) << config.status();
    ASSERT_TRUE(server_.Start(*std::move(config)).ok());
    // Every worker holds the same two-block prompt: every answer lists all.
    KvIndex* index = server_.server().index();
    for (int i = 0; i < kWorkers; ++i) {
      const WorkerId w = index->AddWorker(absl::StrCat("worker-", i), "test");
      BlockStoredEvent ev;
      ev.block_hashes = {1, 2};
      ev.token_ids = Prompt();
      ev.block_size = kBlockSize;
      ev.chain_blocks = 2;
      KvEventBatch batch;
      batch.events.push_back(ev);
      index->Apply(w, batch, 0, absl::Now());
    }
    stub_ =
        v1::PrefixIndex::NewStub(server_.Channel(TestServer::Transport::kUnix));
  }

  static std::vector<uint32_t> Prompt() { return {1, 2, 3, 4, 5, 6, 7, 8}; }
  static v1::RouteRequest Request() {
    v1::RouteRequest r;
    for (uint32_t t : Prompt()) r.add_tokens(t);
    return r;
  }
  static v1::RouteBatchRequest Batch(int n) {
    v1::RouteBatchRequest b;
    for (int i = 0; i < n; ++i) *b.add_requests() = Request();
    return b;
  }
  uint64_t RoutesAnswered() const {
    return server_.server().index()->Stats().route_requests;
  }

  TestServer server_;
  std::unique_ptr<v1::PrefixIndex::Stub> stub_;
};

// 1,000 items listing 200 workers each would be a 5 MiB answer (and
// 65,536 of them 100 MB): refused once the answer passes 1 MiB, having
// routed only the items up to there.
TEST_F(RouteLimitsTest, ABatchAnswerPastMaxMessageSizeIsRefused) {
  v1::RouteBatchResponse fits;
  auto ctx = TestServer::Context();
  ASSERT_TRUE(stub_->RouteBatch(ctx.get(), Batch(10), &fits).ok());
  ASSERT_EQ(fits.responses_size(), 10);
  EXPECT_EQ(fits.responses(9).response().workers_size(), kWorkers);

  const uint64_t before = RoutesAnswered();
  v1::RouteBatchResponse resp;
  ctx = TestServer::Context();
  const grpc::Status s = stub_->RouteBatch(ctx.get(), Batch(1000), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("RouteBatch: the answer takes "));
  EXPECT_THAT(s.error_message(),
              HasSubstr("of 1000, past limits.max_message_size 1048576 "
                        "bytes; send fewer requests per call"));
  const uint64_t routed = RoutesAnswered() - before;
  EXPECT_GT(routed, 0u);
  EXPECT_LT(routed, 300u) << "the batch went on past its answer's limit";
}

// A filter costs a comparison per name and worker: at most 4,096 names and
// 256 KiB per call, summed over a batch, else INVALID_ARGUMENT before
// anything is routed.
TEST_F(RouteLimitsTest, WorkersFiltersPastTheirBoundsAreRefused) {
  const uint64_t before = RoutesAnswered();
  v1::RouteRequest many = Request();
  for (int i = 0; i < 4097; ++i) many.add_workers(absl::StrCat("w", i));
  v1::RouteResponse resp;
  auto ctx = TestServer::Context();
  grpc::Status s = stub_->Route(ctx.get(), many, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("Route: workers lists 4097 names"));
  EXPECT_THAT(s.error_message(),
              HasSubstr("past the limit of 4096 names and 262144 bytes"));

  v1::RouteRequest long_name = Request();
  long_name.add_workers(std::string(300 << 10, 'w'));
  ctx = TestServer::Context();
  s = stub_->Route(ctx.get(), long_name, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("1 names (307200 bytes)"));

  // Two items of 2,049 names: each would pass alone, not together.
  v1::RouteBatchRequest batch;
  for (int item = 0; item < 2; ++item) {
    v1::RouteRequest* r = batch.add_requests();
    *r = Request();
    for (int i = 0; i < 2049; ++i) r->add_workers(absl::StrCat("w", i));
  }
  v1::RouteBatchResponse batch_resp;
  ctx = TestServer::Context();
  s = stub_->RouteBatch(ctx.get(), batch, &batch_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("RouteBatch: workers lists 4098 names"));
  EXPECT_EQ(RoutesAnswered(), before);

  // Within the bounds a filter works as before.
  v1::RouteRequest two = Request();
  two.add_workers("worker-3");
  two.add_workers("worker-7");
  ctx = TestServer::Context();
  ASSERT_TRUE(stub_->Route(ctx.get(), two, &resp).ok());
  EXPECT_EQ(resp.workers_size(), 2);
}

// Of 200 workers two hold a prompt: the answer lists those two (Route and
// RouteBatch alike), all_workers lists all 200, and a `workers` filter
// every named worker that exists, matched or not.
TEST_F(RouteLimitsTest, AnswersListOnlyTheWorkersWithAMatchUnlessAsked) {
  KvIndex* index = server_.server().index();
  const std::vector<uint32_t> rare = {9, 10, 11, 12, 13, 14, 15, 16};
  for (const auto& [name, blocks] : std::vector<std::pair<std::string, int>>{
           {"worker-5", 1}, {"worker-17", 2}}) {
    BlockStoredEvent ev;
    ev.block_hashes = {101, 102};
    ev.block_hashes.resize(static_cast<size_t>(blocks));
    ev.token_ids.assign(rare.begin(), rare.begin() + blocks * kBlockSize);
    ev.block_size = kBlockSize;
    ev.chain_blocks = blocks;
    KvEventBatch batch;
    batch.events.push_back(ev);
    index->Apply(index->AddWorker(name, "test"), batch, 1, absl::Now());
  }
  v1::RouteRequest req;
  for (uint32_t t : rare) req.add_tokens(t);
  auto listed = [](const v1::RouteResponse& r) {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const v1::WorkerMatch& w : r.workers())
      out.emplace_back(w.worker(), w.matched_blocks());
    return out;
  };
  using Listed = std::vector<std::pair<std::string, uint64_t>>;

  v1::RouteResponse resp;
  auto ctx = TestServer::Context();
  ASSERT_TRUE(stub_->Route(ctx.get(), req, &resp).ok());
  EXPECT_EQ(listed(resp), (Listed{{"worker-17", 2}, {"worker-5", 1}}));
  EXPECT_EQ(resp.best_worker(), "worker-17");
  EXPECT_EQ(resp.prompt_blocks(), 2u);

  v1::RouteBatchRequest batch;
  *batch.add_requests() = req;
  v1::RouteBatchResponse batch_resp;
  ctx = TestServer::Context();
  ASSERT_TRUE(stub_->RouteBatch(ctx.get(), batch, &batch_resp).ok());
  ASSERT_EQ(batch_resp.responses_size(), 1);
  EXPECT_EQ(listed(batch_resp.responses(0).response()),
            (Listed{{"worker-17", 2}, {"worker-5", 1}}));

  v1::RouteRequest all = req;
  all.set_all_workers(true);
  ctx = TestServer::Context();
  ASSERT_TRUE(stub_->Route(ctx.get(), all, &resp).ok());
  ASSERT_EQ(resp.workers_size(), kWorkers);
  EXPECT_EQ(resp.workers(0).worker(), "worker-17");
  EXPECT_EQ(resp.workers(1).worker(), "worker-5");
  EXPECT_EQ(resp.workers(2).worker(), "worker-0");  // then by name, with 0
  EXPECT_EQ(resp.workers(2).matched_blocks(), 0u);
  EXPECT_EQ(resp.best_worker(), "worker-17");

  v1::RouteRequest named = req;
  named.add_workers("worker-3");
  named.add_workers("worker-5");
  named.add_workers("no-such-worker");
  ctx = TestServer::Context();
  ASSERT_TRUE(stub_->Route(ctx.get(), named, &resp).ok());
  EXPECT_EQ(listed(resp), (Listed{{"worker-5", 1}, {"worker-3", 0}}));
  EXPECT_EQ(resp.best_worker(), "worker-5");
}

}  // namespace
}  // namespace prefixd
