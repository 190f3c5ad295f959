// The fleet index's client side against a fake PrefixIndex service: what
// Client::Route, RouteBatch and ListWorkers send (tokens_le32, namespace
// fields, workers, metadata) and how they map results and errors; what
// `prefixctl route` and `prefixctl workers` print, byte for byte; and the
// one actionable line for a daemon that runs no index (UNIMPLEMENTED). The
// fake checks the client, not the index: client_server_test runs the client
// against the real daemon.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "client/client.h"
#include "client/output.h"
#include "client/prefixctl_cli.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<uint32_t> Tokens(uint32_t n) {
  std::vector<uint32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = i + 1;
  return t;
}

// The tokens of a request, decoded from tokens_le32 by hand (4 bytes each,
// little-endian) so the tests check what went over the wire.
std::vector<uint32_t> SentTokens(const v1::RouteRequest& req) {
  std::vector<uint32_t> t(req.tokens().begin(), req.tokens().end());
  const std::string& b = req.tokens_le32();
  for (size_t i = 0; i + 4 <= b.size(); i += 4) {
    t.push_back(static_cast<uint8_t>(b[i]) |
                static_cast<uint32_t>(static_cast<uint8_t>(b[i + 1])) << 8 |
                static_cast<uint32_t>(static_cast<uint8_t>(b[i + 2])) << 16 |
                static_cast<uint32_t>(static_cast<uint8_t>(b[i + 3])) << 24);
  }
  return t;
}

std::string Metadata(grpc::ServerContext* ctx, const std::string& key) {
  auto it = ctx->client_metadata().find(key);
  if (it == ctx->client_metadata().end()) return "";
  return std::string(it->second.data(), it->second.size());
}

void AddMedium(v1::WorkerMatch* w, const std::string& medium, uint64_t n) {
  v1::MediumMatch* m = w->add_mediums();
  m->set_medium(medium);
  m->set_matched_blocks(n);
}

// What a fleet of three vLLM workers with block_size 16 might answer for a
// 64-token prompt: vllm-1 holds 3 blocks (3 on GPU, 1 on CPU), vllm-0 one,
// vllm-2 none and it is replaying.
v1::RouteResponse ThreeWorkers() {
  v1::RouteResponse r;
  r.set_best_worker("vllm-1");
  r.set_prompt_blocks(4);
  r.set_block_size(16);
  v1::WorkerMatch* w = r.add_workers();
  w->set_worker("vllm-1");
  w->set_matched_blocks(3);
  AddMedium(w, "GPU", 3);
  AddMedium(w, "CPU", 1);
  w->set_state(v1::LIVE);
  w->set_last_seq(1042);
  w->set_lag_ms(12);
  w = r.add_workers();
  w->set_worker("vllm-0");
  w->set_matched_blocks(1);
  AddMedium(w, "GPU", 1);
  w->set_state(v1::LIVE);
  w->set_last_seq(977);
  w->set_lag_ms(1500);
  w = r.add_workers();
  w->set_worker("vllm-2");
  w->set_state(v1::REPLAYING);
  w->set_last_seq(310);
  w->set_lag_ms(250);
  return r;
}

// A fleet index whose one worker has not connected yet, for a 17-token
// prompt.
v1::RouteResponse OneConnectingWorker() {
  v1::RouteResponse r;
  r.set_prompt_blocks(1);
  r.set_block_size(16);
  v1::WorkerMatch* w = r.add_workers();
  w->set_worker("w0");
  w->set_state(v1::CONNECTING);
  w->set_last_seq(-1);
  return r;
}

// Fixed "now" of the ListWorkers tests: 2025-01-01T00:00:00Z.
constexpr int64_t kNowMs = 1735689600000;

v1::ListWorkersResponse TwoWorkers() {
  v1::ListWorkersResponse r;
  r.set_block_size(16);
  r.set_entries(1234);
  r.set_max_entries(50000000);
  v1::WorkerInfo* w = r.add_workers();
  w->set_worker("vllm-0");
  w->set_endpoint("tcp://10.0.0.5:5557");
  w->set_state(v1::LIVE);
  v1::MediumBlocks* m = w->add_mediums();
  m->set_medium("GPU");
  m->set_blocks(120);
  m = w->add_mediums();
  m->set_medium("CPU");
  m->set_blocks(8);
  w->set_events(5230);
  w->set_gaps(1);
  w->set_replays(1);
  w->set_clears(0);
  w->set_dropped_blocks(0);
  w->set_last_seq(1042);
  w->set_last_event_unix_ms(kNowMs - 1500);
  w->set_last_error(
      "replay_failed: batch 1021 is gone from the replay buffer of "
      "tcp://10.0.0.5:5558");
  v1::KvCacheGroup* g = w->add_groups();
  g->set_group(0);
  g->set_kind("full_attention");
  g = w->add_groups();
  g->set_group(1);
  g->set_kind("sliding_window");
  g->set_window_blocks(256);
  g = w->add_groups();  // SGLang's component "swa": its length unknown
  g->set_group(2);
  g->set_kind("sliding_window");
  w = r.add_workers();
  w->set_worker("vllm-1");
  w->set_endpoint("tcp://10.0.0.6:5557");
  w->set_state(v1::ERROR);
  w->set_state_detail("batch 88: BlockStored with block_size 32, not 16");
  w->set_last_error(w->state_detail());
  w->set_clears(2);
  w->set_dropped_blocks(3);
  w->set_last_seq(-1);
  return r;
}

// Answers with the canned responses above and records what it was sent.
// Tokens decide the error cases: a Route whose first token is 0 fails
// INVALID_ARGUMENT, the way the daemon refuses a bad request.
class FakePrefixIndex final : public v1::PrefixIndex::Service {
 public:
  grpc::Status Route(grpc::ServerContext* ctx, const v1::RouteRequest* request,
                     v1::RouteResponse* response) override {
    Record(ctx, *request);
    return Answer(*request, response);
  }

  grpc::Status RouteBatch(grpc::ServerContext* ctx,
                          const v1::RouteBatchRequest* request,
                          v1::RouteBatchResponse* response) override {
    if (request->requests().empty())
      return {grpc::StatusCode::INVALID_ARGUMENT, "RouteBatch has no requests"};
    for (const v1::RouteRequest& r : request->requests()) {
      Record(ctx, r);
      v1::RouteBatchItem* item = response->add_responses();
      grpc::Status s = Answer(r, item->mutable_response());
      item->set_code(s.error_code());
      item->set_message(s.error_message());
      if (!s.ok()) item->clear_response();
    }
    return grpc::Status::OK;
  }

  grpc::Status ListWorkers(grpc::ServerContext* ctx,
                           const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    MutexLock lock(&mu_);
    last_tenant_ = Metadata(ctx, "x-prefixd-tenant");
    *response = TwoWorkers();
    response->mutable_workers(0)->set_last_event_unix_ms(0);  // "never": no
                                                              // clock here
    return grpc::Status::OK;
  }

  std::vector<v1::RouteRequest> sent() {
    MutexLock lock(&mu_);
    return sent_;
  }
  std::pair<std::string, std::string> last_metadata() {
    MutexLock lock(&mu_);
    return {last_authorization_, last_tenant_};
  }

 private:
  static grpc::Status Answer(const v1::RouteRequest& request,
                             v1::RouteResponse* response) {
    const std::vector<uint32_t> tokens = SentTokens(request);
    if (!tokens.empty() && tokens[0] == 0)
      return {grpc::StatusCode::INVALID_ARGUMENT, "token 0 is reserved"};
    *response = ThreeWorkers();
    response->set_prompt_blocks(tokens.size() / 16);
    if (!request.workers().empty()) {  // keep only the workers asked for
      v1::RouteResponse all = *response;
      response->clear_workers();
      for (const v1::WorkerMatch& w : all.workers()) {
        for (const std::string& name : request.workers()) {
          if (w.worker() == name) *response->add_workers() = w;
        }
      }
      response->set_best_worker(response->workers().empty() ||
                                        response->workers(0).matched_blocks() ==
                                            0
                                    ? ""
                                    : response->workers(0).worker());
    }
    return grpc::Status::OK;
  }

  void Record(grpc::ServerContext* ctx, const v1::RouteRequest& request) {
    MutexLock lock(&mu_);
    sent_.push_back(request);
    last_authorization_ = Metadata(ctx, "authorization");
    last_tenant_ = Metadata(ctx, "x-prefixd-tenant");
  }

  Mutex mu_;
  std::vector<v1::RouteRequest> sent_ ABSL_GUARDED_BY(mu_);
  std::string last_authorization_ ABSL_GUARDED_BY(mu_);
  std::string last_tenant_ ABSL_GUARDED_BY(mu_);
};

class IndexClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    addr_ = Serve(&index_, &index_server_);
    // A daemon without the index: PrefixCache only (every method of the
    // generated base class answers UNIMPLEMENTED, but the point is that
    // PrefixIndex is not registered at all).
    no_index_addr_ = Serve(&cache_only_, &no_index_server_);
  }
  void TearDown() override {
    for (auto* s : {&index_server_, &no_index_server_}) {
      if (*s) (*s)->Shutdown(absl::ToChronoTime(absl::Now()));
    }
  }

  static std::string Serve(grpc::Service* service,
                           std::unique_ptr<grpc::Server>* server) {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service);
    *server = builder.BuildAndStart();
    EXPECT_NE(*server, nullptr);
    EXPECT_GT(port, 0);
    return absl::StrCat("127.0.0.1:", port);
  }

  std::unique_ptr<Client> Connect(const std::string& addr,
                                  ClientOptions options = {}) {
    auto client = Client::Connect(addr, std::move(options));
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  // Runs prefixctl against `addr`; returns the exit code.
  int Ctl(const std::string& addr, std::vector<std::string> args,
          std::string* out, std::string* err = nullptr) {
    args.insert(args.begin(), {"prefixctl", "--addr", addr});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    std::ostringstream o, e;
    const int rc =
        RunPrefixctl(static_cast<int>(argv.size()), argv.data(), o, e);
    *out = o.str();
    if (err != nullptr) *err = e.str();
    return rc;
  }

  FakePrefixIndex index_;
  v1::PrefixCache::Service cache_only_;
  std::unique_ptr<grpc::Server> index_server_;
  std::unique_ptr<grpc::Server> no_index_server_;
  std::string addr_;
  std::string no_index_addr_;
};

// ---- the client library ----

TEST_F(IndexClientTest, RouteSendsTokensAsLe32AndTheNamespace) {
  ClientOptions creds;
  creds.token = "s3cret";
  creds.tenant = "acme";
  auto client = Connect(addr_, creds);
  RouteOptions options;
  options.lora_name = "sql-adapter";
  options.lora_id = 7;
  options.cache_salt = "salt-1";
  options.workers = {"vllm-1", "vllm-2"};
  auto r = client->Route(Tokens(64), options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->best_worker(), "vllm-1");
  EXPECT_EQ(r->prompt_blocks(), 4u);
  ASSERT_EQ(r->workers_size(), 2);
  EXPECT_EQ(r->workers(0).worker(), "vllm-1");
  EXPECT_EQ(r->workers(0).matched_blocks(), 3u);
  EXPECT_EQ(r->workers(1).state(), v1::REPLAYING);

  ASSERT_EQ(index_.sent().size(), 1u);
  const v1::RouteRequest sent = index_.sent()[0];
  EXPECT_EQ(sent.tokens_size(), 0);  // they travel in tokens_le32
  EXPECT_EQ(SentTokens(sent), Tokens(64));
  EXPECT_EQ(sent.lora_name(), "sql-adapter");
  EXPECT_EQ(sent.lora_id(), 7);
  EXPECT_EQ(sent.cache_salt(), "salt-1");
  EXPECT_THAT(sent.workers(), ElementsAre("vllm-1", "vllm-2"));
  EXPECT_EQ(index_.last_metadata().first, "Bearer s3cret");
  EXPECT_EQ(index_.last_metadata().second, "acme");
}

TEST_F(IndexClientTest, RouteDefaultsSendNoNamespaceAndAllWorkers) {
  auto client = Connect(addr_);
  auto r = client->Route(Tokens(20));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->workers_size(), 3);
  const v1::RouteRequest sent = index_.sent().back();
  EXPECT_EQ(sent.lora_name(), "");
  EXPECT_EQ(sent.lora_id(), 0);
  EXPECT_EQ(sent.cache_salt(), "");
  EXPECT_TRUE(sent.workers().empty());
  EXPECT_EQ(index_.last_metadata().first, "");
  EXPECT_EQ(index_.last_metadata().second, "");
}

TEST_F(IndexClientTest, RouteRequestForBuildsWhatRouteSends) {
  RouteOptions options;
  options.lora_id = 3;
  options.workers = {"a"};
  const v1::RouteRequest r = RouteRequestFor(Tokens(2), options);
  EXPECT_EQ(r.tokens_le32(), std::string("\x01\0\0\0\x02\0\0\0", 8));
  EXPECT_EQ(r.tokens_size(), 0);
  EXPECT_EQ(r.lora_id(), 3);
  EXPECT_THAT(r.workers(), ElementsAre("a"));
}

TEST_F(IndexClientTest, RouteBatchAnswersEachItem) {
  auto client = Connect(addr_);
  v1::RouteBatchRequest batch;
  *batch.add_requests() = RouteRequestFor(Tokens(32));
  *batch.add_requests() = RouteRequestFor(std::vector<uint32_t>{0, 1, 2});
  RouteOptions only;
  only.workers = {"vllm-2"};
  *batch.add_requests() = RouteRequestFor(Tokens(16), only);
  auto r = client->RouteBatch(batch);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->responses_size(), 3);
  EXPECT_EQ(r->responses(0).code(), 0);
  EXPECT_EQ(r->responses(0).response().best_worker(), "vllm-1");
  EXPECT_EQ(r->responses(0).response().prompt_blocks(), 2u);
  EXPECT_EQ(r->responses(1).code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(r->responses(1).message(), "token 0 is reserved");
  EXPECT_EQ(r->responses(2).response().best_worker(), "");
  EXPECT_EQ(r->responses(2).response().workers_size(), 1);
  ASSERT_EQ(index_.sent().size(), 3u);
  EXPECT_EQ(SentTokens(index_.sent()[0]), Tokens(32));

  auto empty = client->RouteBatch(v1::RouteBatchRequest());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(), "RouteBatch has no requests");
}

TEST_F(IndexClientTest, ListWorkersReturnsTheResponse) {
  auto client = Connect(addr_, [] {
    ClientOptions o;
    o.tenant = "ops";
    return o;
  }());
  auto r = client->ListWorkers();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->workers_size(), 2);
  EXPECT_EQ(r->workers(0).endpoint(), "tcp://10.0.0.5:5557");
  EXPECT_EQ(r->workers(1).state(), v1::ERROR);
  EXPECT_EQ(r->max_entries(), 50000000u);
  EXPECT_EQ(index_.last_metadata().second, "ops");
}

TEST_F(IndexClientTest, ErrorsKeepCodeAndMessage) {
  auto client = Connect(addr_);
  auto r = client->Route(std::vector<uint32_t>{0, 5});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "token 0 is reserved");
}

TEST_F(IndexClientTest, ADaemonWithoutTheIndexIsUnimplemented) {
  auto client = Connect(no_index_addr_);
  EXPECT_EQ(client->Route(Tokens(16)).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(client->RouteBatch(v1::RouteBatchRequest()).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(client->ListWorkers().status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST_F(IndexClientTest, DeadlineApplies) {
  ClientOptions options;
  options.deadline = absl::Milliseconds(200);
  auto client = Client::Connect("unix:///nonexistent/prefixd.sock", options);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->ListWorkers().status().code(),
            absl::StatusCode::kUnavailable);
  options.wait_for_ready = true;  // waits, up to the deadline
  client = Client::Connect("unix:///nonexistent/prefixd.sock", options);
  ASSERT_TRUE(client.ok());
  const absl::Time start = absl::Now();
  EXPECT_EQ((*client)->Route(Tokens(16)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// ---- output: exact text for hand-built responses ----

TEST(IndexOutputTest, RouteTable) {
  std::ostringstream out;
  PrintRoute(ThreeWorkers(), 64, out);
  EXPECT_EQ(out.str(),
            "prompt 4 blocks (64 tokens, block_size 16)  best worker vllm-1 "
            "(3 blocks)\n"
            "WORKER  MATCHED_BLOCKS  MATCHED_TOKENS  MEDIUMS      STATE      "
            "LAST_SEQ  LAG\n"
            "vllm-1  3               48              GPU=3,CPU=1  LIVE       "
            "1042      12ms\n"
            "vllm-0  1               16              GPU=1        LIVE       "
            "977       1.5s\n"
            "vllm-2  0               0               -            REPLAYING  "
            "310       250ms\n");
}

TEST(IndexOutputTest, RouteWithNoHolder) {
  std::ostringstream out;
  PrintRoute(OneConnectingWorker(), 17, out);
  EXPECT_EQ(out.str(),
            "prompt 1 block (17 tokens, block_size 16)  no worker holds the "
            "first block\n"
            "WORKER  MATCHED_BLOCKS  MATCHED_TOKENS  MEDIUMS  STATE       "
            "LAST_SEQ  LAG\n"
            "w0      0               0               -        CONNECTING  -"
            "         -\n");
}

// An answer that lists no worker (none matched, all_workers not asked):
// the first line alone, no table header over no rows.
TEST(IndexOutputTest, RouteListingNoWorker) {
  v1::RouteResponse none;
  none.set_prompt_blocks(1);
  none.set_block_size(16);
  std::ostringstream out;
  PrintRoute(none, 17, out);
  EXPECT_EQ(out.str(),
            "prompt 1 block (17 tokens, block_size 16)  no worker holds the "
            "first block\n");
}

TEST(IndexOutputTest, WorkersTableWithStateDetail) {
  std::ostringstream out;
  PrintWorkers(TwoWorkers(), absl::FromUnixMillis(kNowMs), out);
  EXPECT_EQ(out.str(),
            "2 workers  entries 1234/50000000  block_size 16\n"
            "WORKER  STATE  ENDPOINT             BLOCKS         EVENTS  GAPS  "
            "REPLAYS  CLEARS  DROPPED  LAST_SEQ  LAST_EVENT\n"
            "vllm-0  LIVE   tcp://10.0.0.5:5557  GPU=120,CPU=8  5230    1     "
            "1        0       0        1042      1.5s ago\n"
            "  last_error: replay_failed: batch 1021 is gone from the replay "
            "buffer of tcp://10.0.0.5:5558\n"
            "  group 0: full_attention\n"
            "  group 1: sliding_window, window 256 blocks\n"
            "  group 2: sliding_window, window unknown (every block)\n"
            "vllm-1  ERROR  tcp://10.0.0.6:5557  -              0       0     "
            "0        2       3        -         never\n"
            "  state_detail: batch 88: BlockStored with block_size 32, not 16\n"
            "  last_error: batch 88: BlockStored with block_size 32, not 16\n");
}

TEST(IndexOutputTest, StateDetailStaysOnOneLine) {
  v1::ListWorkersResponse r;
  v1::WorkerInfo* w = r.add_workers();
  w->set_worker("w");
  w->set_state_detail("first\nsecond\tthird");
  std::ostringstream out;
  PrintWorkers(r, absl::FromUnixMillis(kNowMs), out);
  EXPECT_THAT(out.str(), HasSubstr("\n  state_detail: first second third\n"));
}

TEST(IndexOutputTest, LastEventAges) {
  v1::ListWorkersResponse r;
  v1::WorkerInfo* w = r.add_workers();
  w->set_worker("w");
  const absl::Time now = absl::FromUnixMillis(kNowMs);
  auto last_event = [&](int64_t unix_ms) {
    w->set_last_event_unix_ms(unix_ms);
    std::ostringstream out;
    PrintWorkers(r, now, out);
    const std::string text = out.str();
    const size_t end = text.rfind('\n');
    const size_t start = text.rfind("  ", end) + 2;
    return text.substr(start, end - start);
  };
  EXPECT_EQ(last_event(0), "never");
  EXPECT_EQ(last_event(kNowMs - 250), "250ms ago");
  EXPECT_EQ(last_event(kNowMs - 125'000), "2m5s ago");
  EXPECT_EQ(last_event(kNowMs - 3'725'400), "1h2m5s ago");
  EXPECT_EQ(last_event(kNowMs + 40), "now");  // the daemon's clock is ahead
}

// docs/client.md shows these outputs; they must be what prefixctl prints.
TEST(IndexOutputTest, DocsShowWhatPrefixctlPrints) {
  const std::string path = PREFIXD_SOURCE_DIR "/docs/client.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string doc = buffer.str();
  std::ostringstream route, workers, none;
  PrintRoute(ThreeWorkers(), 64, route);
  PrintWorkers(TwoWorkers(), absl::FromUnixMillis(kNowMs), workers);
  PrintRoute(OneConnectingWorker(), 17, none);
  v1::RouteResponse unmatched = OneConnectingWorker();
  unmatched.clear_workers();  // without --all_workers
  for (const std::string& shown :
       {"$ prefixctl route --tokens 1-64 --all_workers\n" + route.str(),
        "$ prefixctl workers\n" + workers.str(),
        "$ prefixctl --json route --tokens 1-17\n" + ToJson(unmatched) +
            "\n$ prefixctl --json route --tokens 1-17 --all_workers\n" +
            ToJson(OneConnectingWorker()) + "\n",
        none.str().substr(0, none.str().find('\n') + 1)}) {
    EXPECT_NE(doc.find(shown), std::string::npos)
        << path << " does not show, byte for byte:\n"
        << shown;
  }
}

TEST(IndexOutputTest, WorkerStateNames) {
  EXPECT_EQ(WorkerStateName(v1::CONNECTING), "CONNECTING");
  EXPECT_EQ(WorkerStateName(v1::LIVE), "LIVE");
  EXPECT_EQ(WorkerStateName(v1::REPLAYING), "REPLAYING");
  EXPECT_EQ(WorkerStateName(v1::ERROR), "ERROR");
  EXPECT_EQ(WorkerStateName(v1::WORKER_STATE_UNSPECIFIED), "UNSPECIFIED");
  EXPECT_EQ(WorkerStateName(99), "99");  // from a newer daemon
}

TEST(IndexOutputTest, JsonUsesProtoNamesAndEnumNames) {
  const std::string json = ToJson(ThreeWorkers());
  EXPECT_THAT(json, HasSubstr("\"best_worker\":\"vllm-1\""));
  EXPECT_THAT(json, HasSubstr("\"prompt_blocks\":\"4\""));
  EXPECT_THAT(json, HasSubstr("\"block_size\":16"));
  EXPECT_THAT(json, HasSubstr("\"state\":\"REPLAYING\""));
  EXPECT_THAT(json, HasSubstr("\"last_seq\":\"1042\""));
  EXPECT_THAT(json, HasSubstr("{\"medium\":\"CPU\",\"matched_blocks\":\"1\"}"));
  EXPECT_EQ(json.find('\n'), std::string::npos);
}

// ---- prefixctl route / workers ----

TEST_F(IndexClientTest, CtlRouteTable) {
  std::string out;
  ASSERT_EQ(Ctl(addr_, {"route", "--tokens", "1-64"}, &out), kExitOk);
  std::ostringstream want;
  PrintRoute(ThreeWorkers(), 64, want);
  EXPECT_EQ(out, want.str());
  const v1::RouteRequest sent = index_.sent().back();
  EXPECT_EQ(SentTokens(sent), Tokens(64));
  EXPECT_TRUE(sent.workers().empty());
}

TEST_F(IndexClientTest, CtlRouteSendsItsFlags) {
  std::string out;
  ASSERT_EQ(Ctl(addr_,
                {"route", "--tokens", "1-32", "--lora_name", "sql", "--lora_id",
                 "12", "--cache_salt", "s", "--workers", "vllm-2, vllm-0"},
                &out),
            kExitOk);
  const v1::RouteRequest sent = index_.sent().back();
  EXPECT_EQ(sent.lora_name(), "sql");
  EXPECT_EQ(sent.lora_id(), 12);
  EXPECT_EQ(sent.cache_salt(), "s");
  EXPECT_THAT(sent.workers(), ElementsAre("vllm-2", "vllm-0"));
  EXPECT_EQ(out,
            "prompt 2 blocks (32 tokens, block_size 16)  best worker vllm-0 "
            "(1 block)\n"
            "WORKER  MATCHED_BLOCKS  MATCHED_TOKENS  MEDIUMS  STATE      "
            "LAST_SEQ  LAG\n"
            "vllm-0  1               16              GPU=1    LIVE       "
            "977       1.5s\n"
            "vllm-2  0               0               -        REPLAYING  "
            "310       250ms\n");
}

TEST_F(IndexClientTest, CtlRouteJsonIsTheResponse) {
  std::string out;
  ASSERT_EQ(Ctl(addr_, {"--json", "route", "--tokens", "1-64"}, &out), kExitOk);
  EXPECT_EQ(out, ToJson(ThreeWorkers()) + "\n");
}

TEST_F(IndexClientTest, CtlWorkersTableAndJson) {
  std::string out;
  ASSERT_EQ(Ctl(addr_, {"workers"}, &out), kExitOk);
  EXPECT_EQ(out,
            "2 workers  entries 1234/50000000  block_size 16\n"
            "WORKER  STATE  ENDPOINT             BLOCKS         EVENTS  GAPS  "
            "REPLAYS  CLEARS  DROPPED  LAST_SEQ  LAST_EVENT\n"
            "vllm-0  LIVE   tcp://10.0.0.5:5557  GPU=120,CPU=8  5230    1     "
            "1        0       0        1042      never\n"
            "  last_error: replay_failed: batch 1021 is gone from the replay "
            "buffer of tcp://10.0.0.5:5558\n"
            "  group 0: full_attention\n"
            "  group 1: sliding_window, window 256 blocks\n"
            "  group 2: sliding_window, window unknown (every block)\n"
            "vllm-1  ERROR  tcp://10.0.0.6:5557  -              0       0     "
            "0        2       3        -         never\n"
            "  state_detail: batch 88: BlockStored with block_size 32, not 16\n"
            "  last_error: batch 88: BlockStored with block_size 32, not 16\n");
  ASSERT_EQ(Ctl(addr_, {"workers", "--json"}, &out), kExitOk);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
  EXPECT_THAT(out, HasSubstr("\"endpoint\":\"tcp://10.0.0.5:5557\""));
  EXPECT_THAT(out, HasSubstr("\"state\":\"ERROR\""));
  EXPECT_THAT(out, HasSubstr("\"max_entries\":\"50000000\""));
  EXPECT_THAT(out, HasSubstr("\"last_event_unix_ms\":\"0\""));
}

TEST_F(IndexClientTest, CtlWithoutTheIndexSaysHowToStartIt) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"route", "--tokens", "1-16"},
        std::vector<std::string>{"workers"},
        std::vector<std::string>{"--json", "workers"}}) {
    std::string out, err;
    EXPECT_EQ(Ctl(no_index_addr_, args, &out, &err), kExitRpcError);
    EXPECT_EQ(out, "");
    EXPECT_EQ(err, "error: the daemon at " + no_index_addr_ +
                       " does not serve the fleet index: start it with "
                       "--index_source=NAME=ENDPOINT or an index { } config "
                       "(docs/index.md)\n");
  }
}

TEST_F(IndexClientTest, CtlRouteRpcErrorsExit1WithCodeAndMessage) {
  std::string out, err;
  EXPECT_EQ(Ctl(addr_, {"route", "--tokens", "0,1"}, &out, &err),
            kExitRpcError);
  EXPECT_EQ(err, "error: INVALID_ARGUMENT: token 0 is reserved\n");
}

TEST_F(IndexClientTest, CtlRouteUsageErrorsNameTheValue) {
  std::string out, err;
  EXPECT_EQ(Ctl(addr_, {"route"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("--tokens or --tokens_file is required"));
  EXPECT_EQ(Ctl(addr_, {"route", "--tokens", "1-x"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("'1-x'"));
  EXPECT_EQ(
      Ctl(addr_, {"route", "--tokens", "1", "--lora_id", "seven"}, &out, &err),
      kExitUsage);
  EXPECT_EQ(err,
            "prefixctl route: --lora_id takes a non-negative integer, not "
            "'seven'\nsee: prefixctl route --help\n");
  EXPECT_EQ(
      Ctl(addr_, {"route", "--tokens", "1", "--lora_id", "-1"}, &out, &err),
      kExitUsage);
  EXPECT_THAT(err, HasSubstr("not '-1'"));
  EXPECT_EQ(
      Ctl(addr_, {"route", "--tokens", "1", "--lora_id", "9223372036854775808"},
          &out, &err),
      kExitUsage);
  EXPECT_THAT(err, HasSubstr("--lora_id 9223372036854775808 is above the "
                             "maximum 9223372036854775807"));
  EXPECT_EQ(
      Ctl(addr_, {"route", "--tokens", "1", "--workers", "a,,b"}, &out, &err),
      kExitUsage);
  EXPECT_THAT(err, HasSubstr("'a,,b' has an empty name"));
  EXPECT_EQ(Ctl(addr_, {"route", "--tokens", "1", "--workers="}, &out, &err),
            kExitUsage);
  EXPECT_THAT(err, HasSubstr("'' has an empty name"));
  EXPECT_EQ(Ctl(addr_, {"workers", "--tokens", "1"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("unknown flag --tokens"));
  EXPECT_EQ(Ctl(addr_, {"workers", "vllm-0"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("unexpected argument \"vllm-0\""));
  EXPECT_TRUE(index_.sent().empty());  // nothing reached the daemon
}

TEST_F(IndexClientTest, CtlHelpListsRouteAndWorkers) {
  std::string out;
  ASSERT_EQ(Ctl(addr_, {"--help"}, &out), kExitOk);
  EXPECT_THAT(out, HasSubstr("\n  route "));
  EXPECT_THAT(out, HasSubstr("\n  workers "));
  EXPECT_THAT(out, HasSubstr("\nroute flags:\n"));
  for (const char* flag : {"--lora_name=NAME", "--lora_id=N",
                           "--cache_salt=SALT", "--workers=A,B"}) {
    EXPECT_THAT(out, HasSubstr(flag)) << flag;
  }
  ASSERT_EQ(Ctl(addr_, {"route", "--help"}, &out), kExitOk);
  EXPECT_THAT(out, HasSubstr("usage: prefixctl [global flags] route --tokens "
                             "LIST [--lora_name X] [--lora_id N] "
                             "[--cache_salt S] [--workers A,B] "
                             "[--all_workers]\n"));
  for (const char* flag :
       {"--tokens=LIST", "--tokens_file=FILE", "--lora_name=NAME",
        "--lora_id=N", "--cache_salt=SALT", "--workers=A,B", "--all_workers",
        "--addr"}) {
    EXPECT_THAT(out, HasSubstr(flag)) << flag;
  }
  EXPECT_THAT(out, HasSubstr("docs/index.md"));
  ASSERT_EQ(Ctl(addr_, {"help", "workers"}, &out), kExitOk);
  EXPECT_THAT(out, HasSubstr("usage: prefixctl [global flags] workers"));
  EXPECT_THAT(out, HasSubstr("state_detail"));
  EXPECT_THAT(out, HasSubstr("--json"));
}

}  // namespace
}  // namespace prefixd
