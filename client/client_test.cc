// The client library and prefixctl against a fake PrefixCache service: what
// the client sends (metadata, deadlines, fields), how it maps results and
// errors, leases, epochs, streams, and what prefixctl prints. The fake keeps
// these tests independent of the daemon; tests/integration runs the client
// against the real server.
#include "client/client.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/mutex.h"
#include "client/health.h"
#include "client/id_list.h"
#include "client/output.h"
#include "client/prefixctl_cli.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// The tokens a request carries, from whichever field: the fake service
// decodes tokens_le32 itself (4 bytes each, little-endian), so the tests
// check what went over the wire.
template <typename Req>
std::vector<uint32_t> SentTokens(const Req& req) {
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

constexpr uint64_t kEpoch = 0x1234abcd5678ef00;
constexpr uint64_t kLease = 42;

std::string Metadata(grpc::ServerContext* ctx, const std::string& key) {
  auto it = ctx->client_metadata().find(key);
  if (it == ctx->client_metadata().end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// Answers like a daemon with block_size 16 would, records what it was sent.
class FakePrefixCache final : public v1::PrefixCache::Service {
 public:
  std::atomic<uint64_t> epoch{kEpoch};

  grpc::Status GetInfo(grpc::ServerContext* ctx, const v1::GetInfoRequest*,
                       v1::GetInfoResponse* response) override {
    Record(ctx);
    response->set_epoch(epoch);
    response->set_block_size(16);
    response->set_block_bytes(16 * 131072);
    response->set_budget_bytes(uint64_t{4} << 30);
    response->set_budget_blocks(2048);
    response->set_model("llama-3-8b");
    return grpc::Status::OK;
  }

  grpc::Status Handshake(grpc::ServerContext* ctx,
                         const v1::HandshakeRequest* request,
                         v1::HandshakeResponse* response) override {
    Record(ctx);
    if (request->model_fingerprint() != "00000000000000ff") {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              "model fingerprint " + request->model_fingerprint() +
                  " != 00000000000000ff"};
    }
    response->set_epoch(epoch);
    return grpc::Status::OK;
  }

  grpc::Status Match(grpc::ServerContext* ctx, const v1::MatchRequest* request,
                     v1::MatchResponse* response) override {
    Record(ctx);
    {
      MutexLock lock(&mu_);
      last_match_ = *request;
    }
    response->set_epoch(epoch);
    const uint64_t blocks = SentTokens(*request).size() / 16;
    response->set_matched_tokens(blocks * 16);
    if (blocks > 0) {
      v1::Segment* s = response->add_segments();
      for (uint64_t b = 0; b < blocks; ++b) s->add_block_ids(100 + b);
      s->set_cached_position(0);
      s->set_rope_delta(request->position_offset());
      if (request->pin()) response->set_lease_id(kLease);
    }
    return grpc::Status::OK;
  }

  grpc::Status Insert(grpc::ServerContext* ctx,
                      const v1::InsertRequest* request,
                      v1::InsertResponse* response) override {
    Record(ctx);
    if (SentTokens(*request).size() != 16u * request->block_ids_size()) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat("len(tokens)=", SentTokens(*request).size(),
                           " != len(block_ids)=", request->block_ids_size(),
                           " x block_size=16")};
    }
    response->set_epoch(epoch);
    response->set_cached_tokens(16);
    response->add_redundant_block_ids(request->block_ids(0));
    response->add_evicted_block_ids(7);
    if (request->pin()) response->set_lease_id(kLease);
    return grpc::Status::OK;
  }

  grpc::Status Release(grpc::ServerContext* ctx,
                       const v1::ReleaseRequest* request,
                       v1::ReleaseResponse*) override {
    Record(ctx);
    MutexLock lock(&mu_);
    if (request->lease_id() != kLease) {
      return {grpc::StatusCode::NOT_FOUND,
              absl::StrCat("lease ", request->lease_id(), " not found")};
    }
    released_.push_back(request->lease_id());
    return grpc::Status::OK;
  }

  grpc::Status KeepAlive(grpc::ServerContext* ctx,
                         const v1::KeepAliveRequest* request,
                         v1::KeepAliveResponse* response) override {
    Record(ctx);
    for (int i = 0; i < request->lease_ids_size(); ++i)
      response->add_expires_in_ms(30000);
    return grpc::Status::OK;
  }

  grpc::Status Evict(grpc::ServerContext* ctx, const v1::EvictRequest* request,
                     v1::EvictResponse* response) override {
    Record(ctx);
    for (uint64_t i = 0; i < request->blocks(); ++i)
      response->add_evicted_block_ids(200 + i);
    return grpc::Status::OK;
  }

  grpc::Status Invalidate(grpc::ServerContext* ctx,
                          const v1::InvalidateRequest* request,
                          v1::InvalidateResponse* response) override {
    Record(ctx);
    *response->mutable_removed_block_ids() = request->block_ids();
    response->add_removed_block_ids(999);
    return grpc::Status::OK;
  }

  grpc::Status Reset(grpc::ServerContext* ctx, const v1::ResetRequest* request,
                     v1::ResetResponse* response) override {
    Record(ctx);
    if (request->all()) response->add_removed_block_ids(1);
    response->set_epoch(epoch);
    return grpc::Status::OK;
  }

  grpc::Status Stats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                     v1::StatsResponse* response) override {
    Record(ctx);
    if (Metadata(ctx, "x-prefixd-tenant") == "slow") {
      while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(1));
      return {grpc::StatusCode::CANCELLED, "cancelled"};
    }
    response->set_epoch(epoch);
    response->set_block_size(16);
    response->set_block_bytes(2 << 20);
    response->set_budget_bytes(uint64_t{4} << 30);
    response->set_budget_blocks(2048);
    v1::TenantStats* t = response->add_tenants();
    t->set_tenant("default");
    t->set_cached_blocks(2);
    t->set_cached_bytes(4 << 20);
    t->set_match_requests(2);
    t->set_match_tokens(64);
    t->set_match_hit_tokens(32);
    t->set_active_leases(1);
    v1::EvictionCount* e = t->add_evictions();
    e->set_reason("requested");
    e->set_blocks(3);
    // Out of the table's order: the CLI places classes by name.
    v1::RetentionCount* high = t->add_retention();
    high->set_retention("high");
    high->set_cached_blocks(1);
    v1::RetentionCount* def = t->add_retention();
    def->set_retention("default");
    def->set_cached_blocks(1);
    def->set_evicted_blocks(3);
    return grpc::Status::OK;
  }

  grpc::Status WatchEvents(
      grpc::ServerContext* ctx, const v1::WatchEventsRequest* request,
      grpc::ServerWriter<v1::WatchEventsResponse>* writer) override {
    Record(ctx);
    uint64_t seq = std::max<uint64_t>(request->from_sequence(), 1);
    for (int batch = 0; batch < 2; ++batch) {
      v1::WatchEventsResponse r;
      r.set_epoch(epoch);
      r.set_missed_events(batch == 0 && request->from_sequence() > 1);
      for (int i = 0; i < 2; ++i, ++seq) {
        v1::Event* e = r.add_events();
        e->set_sequence(seq);
        if (i == 0) {
          e->mutable_block_stored()->add_block_ids(100 + seq);
        } else {
          e->mutable_block_removed()->add_block_ids(100 + seq);
          e->mutable_block_removed()->set_reason("requested");
        }
      }
      r.set_next_sequence(seq);
      writer->Write(r);
    }
    if (Metadata(ctx, "x-prefixd-tenant") == "hold") {
      while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(1));
    }
    return grpc::Status::OK;
  }

  grpc::Status Dump(grpc::ServerContext* ctx, const v1::DumpRequest* request,
                    v1::DumpResponse* response) override {
    Record(ctx);
    response->set_epoch(epoch);
    response->add_namespaces(request->namespace_());
    v1::DumpNode* n = response->add_nodes();
    n->set_depth(1);
    for (uint32_t t = 1; t <= 32; ++t) n->add_tokens(t);
    n->add_block_ids(100);
    n->add_block_ids(101);
    return grpc::Status::OK;
  }

  std::vector<uint64_t> released() {
    MutexLock lock(&mu_);
    return released_;
  }
  v1::MatchRequest last_match() {
    MutexLock lock(&mu_);
    return last_match_;
  }
  std::pair<std::string, std::string> last_metadata() {
    MutexLock lock(&mu_);
    return {last_authorization_, last_tenant_};
  }

 private:
  void Record(grpc::ServerContext* ctx) {
    MutexLock lock(&mu_);
    last_authorization_ = Metadata(ctx, "authorization");
    last_tenant_ = Metadata(ctx, "x-prefixd-tenant");
  }

  Mutex mu_;
  std::vector<uint64_t> released_ ABSL_GUARDED_BY(mu_);
  v1::MatchRequest last_match_ ABSL_GUARDED_BY(mu_);
  std::string last_authorization_ ABSL_GUARDED_BY(mu_);
  std::string last_tenant_ ABSL_GUARDED_BY(mu_);
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    addr_ = absl::StrCat("127.0.0.1:", port_);
  }
  void TearDown() override {
    server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }

  std::unique_ptr<Client> Connect(ClientOptions options = {}) {
    auto client = Client::Connect(addr_, std::move(options));
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  // Runs prefixctl with --addr set; returns the exit code.
  int Ctl(std::vector<std::string> args, std::string* out,
          std::string* err = nullptr) {
    args.insert(args.begin(), {"prefixctl", "--addr", addr_});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    std::ostringstream o, e;
    const int rc =
        RunPrefixctl(static_cast<int>(argv.size()), argv.data(), o, e);
    *out = o.str();
    if (err != nullptr) *err = e.str();
    return rc;
  }

  FakePrefixCache service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string addr_;
};

std::vector<uint32_t> Tokens(uint32_t n) {
  std::vector<uint32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = i + 1;
  return t;
}

// (GCC's -Wmissing-field-initializers rejects partial designated initializers.)
ClientOptions WithTenant(std::string tenant, std::string token = "") {
  ClientOptions o;
  o.tenant = std::move(tenant);
  o.token = std::move(token);
  return o;
}

PrefixOptions Pinned() {
  PrefixOptions o;
  o.pin = true;
  return o;
}

// ---- client library ----

TEST_F(ClientTest, SendsTokenAndTenantMetadata) {
  auto client = Connect(WithTenant("acme", "s3cret"));
  ASSERT_TRUE(client->GetInfo().ok());
  EXPECT_EQ(service_.last_metadata().first, "Bearer s3cret");
  EXPECT_EQ(service_.last_metadata().second, "acme");
}

TEST_F(ClientTest, NoMetadataWhenUnset) {
  auto client = Connect();
  ASSERT_TRUE(client->GetInfo().ok());
  EXPECT_EQ(service_.last_metadata().first, "");
  EXPECT_EQ(service_.last_metadata().second, "");
}

TEST_F(ClientTest, ErrorsKeepCodeAndMessage) {
  auto client = Connect();
  auto r = client->Insert(Tokens(20), std::vector<uint64_t>{1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "len(tokens)=20 != len(block_ids)=1 x block_size=16");
  auto h = client->Handshake("vllm-0", "0000000000000001");
  EXPECT_EQ(h.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client->Release(7).code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, EveryCallHasADeadline) {
  ClientOptions options = WithTenant("slow");
  options.deadline = absl::Milliseconds(100);
  auto client = Connect(options);
  const absl::Time start = absl::Now();
  auto r = client->Stats();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(ClientTest, UnreachableIsUnavailable) {
  auto client = Client::Connect("unix:///nonexistent/prefixd.sock");
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->GetInfo().status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(ClientTest, ConnectRejectsBadArguments) {
  EXPECT_EQ(Client::Connect("").status().code(),
            absl::StatusCode::kInvalidArgument);
  ClientOptions options;
  options.tls_ca_file = "/nonexistent.pem";
  EXPECT_EQ(Client::Connect(addr_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.tls_ca_file = "";
  options.tls_cert_file = "/etc/hostname";  // without a key
  EXPECT_EQ(Client::Connect(addr_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, MatchSendsOptionsAndReturnsBlocks) {
  auto client = Connect();
  PrefixOptions options;
  options.ns = "lora-a";
  options.position_offset = 5;
  options.lease_ttl = absl::Seconds(3);
  auto m = client->Match(Tokens(37), options);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->matched_tokens(), 32u);
  EXPECT_THAT(m->block_ids(), ElementsAre(100, 101));
  EXPECT_FALSE(m->lease.valid());
  const v1::MatchRequest sent = service_.last_match();
  EXPECT_EQ(sent.namespace_(), "lora-a");
  EXPECT_EQ(sent.tokens_size(), 0);  // they travel in tokens_le32
  EXPECT_EQ(SentTokens(sent), Tokens(37));
  EXPECT_EQ(sent.position_offset(), 5);
  EXPECT_EQ(sent.lease_ttl_ms(), 3000u);
  EXPECT_FALSE(sent.pin());
}

TEST_F(ClientTest, LeaseReleasesOnDestruction) {
  auto client = Connect();
  {
    auto m = client->Match(Tokens(32), Pinned());
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->lease.id(), kLease);
    EXPECT_TRUE(service_.released().empty());
  }
  EXPECT_THAT(service_.released(), ElementsAre(kLease));
}

TEST_F(ClientTest, LeaseMovesReleasesOnceAndDetaches) {
  auto client = Connect();
  Client::Lease outer;
  {
    auto ins =
        client->Insert(Tokens(32), std::vector<uint64_t>{1, 2}, Pinned());
    ASSERT_TRUE(ins.ok()) << ins.status();
    outer = std::move(ins->lease);
    EXPECT_FALSE(ins->lease.valid());
  }
  EXPECT_TRUE(service_.released().empty());
  auto left = outer.KeepAlive();
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(*left, absl::Seconds(30));
  EXPECT_TRUE(outer.Release().ok());
  EXPECT_FALSE(outer.valid());
  EXPECT_EQ(outer.Release().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(service_.released(), ElementsAre(kLease));

  auto m = client->Match(Tokens(32), Pinned());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->lease.Detach(), kLease);
  m->lease = Client::Lease();
  EXPECT_THAT(service_.released(), ElementsAre(kLease));  // not released again
}

TEST_F(ClientTest, LeaseOutlivesItsClient) {
  Client::Lease lease;
  {
    auto client = Connect();
    auto m = client->Match(Tokens(16), Pinned());
    ASSERT_TRUE(m.ok());
    lease = std::move(m->lease);
  }
  EXPECT_TRUE(lease.Release().ok());
  EXPECT_THAT(service_.released(), ElementsAre(kLease));
}

TEST_F(ClientTest, EpochChangeIsReported) {
  auto client = Connect();
  std::vector<std::pair<uint64_t, uint64_t>> changes;
  client->OnEpochChange([&](uint64_t old, uint64_t now) {
    changes.push_back({old, now});
  });
  EXPECT_EQ(client->epoch(), 0u);
  ASSERT_TRUE(client->GetInfo().ok());
  EXPECT_EQ(client->epoch(), kEpoch);
  EXPECT_FALSE(client->epoch_changed());
  service_.epoch = kEpoch + 1;
  ASSERT_TRUE(client->Match(Tokens(16)).ok());
  EXPECT_TRUE(client->epoch_changed());
  EXPECT_EQ(client->epoch(), kEpoch + 1);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0], std::make_pair(kEpoch, kEpoch + 1));
  ASSERT_TRUE(client->Stats().ok());
  EXPECT_EQ(changes.size(), 1u);  // same epoch again: no new report
  client->AcceptEpoch();
  EXPECT_FALSE(client->epoch_changed());
}

TEST_F(ClientTest, OtherCallsReturnTheirIds) {
  auto client = Connect();
  auto left = client->KeepAlive(std::vector<uint64_t>{1, 2});
  ASSERT_TRUE(left.ok());
  EXPECT_THAT(*left, ElementsAre(absl::Seconds(30), absl::Seconds(30)));
  auto evicted = client->Evict(2);
  ASSERT_TRUE(evicted.ok());
  EXPECT_THAT(*evicted, ElementsAre(200, 201));
  auto removed = client->Invalidate(std::vector<uint64_t>{5});
  ASSERT_TRUE(removed.ok());
  EXPECT_THAT(*removed, ElementsAre(5, 999));
  auto reset = client->Reset("", true);
  ASSERT_TRUE(reset.ok());
  EXPECT_EQ(reset->removed_block_ids_size(), 1);
  auto dump = client->Dump("ns");
  ASSERT_TRUE(dump.ok());
  EXPECT_EQ(dump->nodes_size(), 1);
}

TEST_F(ClientTest, WatchEventsReadsBatchesUntilTheEnd) {
  auto client = Connect();
  auto stream = client->WatchEvents(0);
  v1::WatchEventsResponse batch;
  std::vector<uint64_t> seqs;
  while (stream->Read(&batch)) {
    for (const auto& e : batch.events()) seqs.push_back(e.sequence());
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_THAT(seqs, ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(client->epoch(), kEpoch);
}

TEST_F(ClientTest, WatchEventsCallbackStopsWhenAsked) {
  auto client = Connect(WithTenant("hold"));  // the fake holds the stream open
  int batches = 0;
  absl::Status s = client->WatchEvents(
      0, [&](const v1::WatchEventsResponse&) { return ++batches < 2; });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(batches, 2);
}

TEST_F(ClientTest, HealthCheckAndWatch) {
  auto client = Connect();
  auto h = client->Health();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, HealthStatus::kServing);
  EXPECT_EQ(client->Health("no.such.Service").status().code(),
            absl::StatusCode::kNotFound);

  auto stream = client->WatchHealth();
  HealthStatus status;
  ASSERT_TRUE(stream->Read(&status));
  EXPECT_EQ(status, HealthStatus::kServing);
  server_->GetHealthCheckService()->SetServingStatus(false);
  ASSERT_TRUE(stream->Read(&status));
  EXPECT_EQ(status, HealthStatus::kNotServing);
  stream->Cancel();
  EXPECT_FALSE(stream->Read(&status));
  EXPECT_EQ(stream->Finish().code(), absl::StatusCode::kCancelled);
}

// ---- health wire format ----

TEST(HealthCodecTest, EncodesAndDecodes) {
  EXPECT_EQ(client_internal::EncodeHealthCheckRequest(""), "");
  EXPECT_EQ(client_internal::EncodeHealthCheckRequest("ab"),
            std::string("\x0a\x02"
                        "ab",
                        4));
  EXPECT_EQ(*client_internal::DecodeHealthCheckResponse(""),
            HealthStatus::kUnknown);
  EXPECT_EQ(
      *client_internal::DecodeHealthCheckResponse(std::string("\x08\x01", 2)),
      HealthStatus::kServing);
  // Unknown fields are skipped.
  EXPECT_EQ(*client_internal::DecodeHealthCheckResponse(
                std::string("\x12\x01x\x08\x02", 5)),
            HealthStatus::kNotServing);
  EXPECT_FALSE(
      client_internal::DecodeHealthCheckResponse(std::string("\x08", 1)).ok());
  EXPECT_FALSE(
      client_internal::DecodeHealthCheckResponse(std::string("\x08\x09", 2))
          .ok());
  EXPECT_FALSE(
      client_internal::DecodeHealthCheckResponse(std::string("\x12\x05x", 3))
          .ok());
}

// ---- ID lists ----

TEST(IdListTest, ParsesItemsAndRanges) {
  EXPECT_THAT(*ParseIdList("1,2,3", 100), ElementsAre(1, 2, 3));
  EXPECT_THAT(*ParseIdList("1-4", 100), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(*ParseIdList(" 7 , 1-2\n\t9 # comment 5\n10", 100),
              ElementsAre(7, 1, 2, 9, 10));
  EXPECT_THAT(*ParseIdList("5-5", 100), ElementsAre(5));
  EXPECT_TRUE(ParseIdList("", 100)->empty());
  EXPECT_THAT(*ParseIdList("18446744073709551615", UINT64_MAX),
              ElementsAre(UINT64_MAX));
  EXPECT_THAT(
      *ParseIdList("18446744073709551614-18446744073709551615", UINT64_MAX),
      ElementsAre(UINT64_MAX - 1, UINT64_MAX));
}

TEST(IdListTest, RejectsBadItemsNamingThem) {
  for (const char* bad : {"x", "1,,y", "-1", "1-", "-", "5-3", "1.5", "+3",
                          "1-2-3", "101", "0-101"}) {
    auto r = ParseIdList(bad, 100);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(std::string(ParseIdList("1,5-3", 100).status().message()),
              HasSubstr("5-3"));
  EXPECT_THAT(std::string(ParseIdList("7,101", 100).status().message()),
              HasSubstr("above the maximum 100"));
  EXPECT_FALSE(ParseIdList("0-4294967295", UINT64_MAX).ok());  // too long
}

TEST(IdListTest, TokensMustFitUint32) {
  EXPECT_THAT(*ToTokens({1, 4294967295}), ElementsAre(1u, 4294967295u));
  EXPECT_FALSE(ToTokens({4294967296}).ok());
}

TEST(IdListTest, ReadsFiles) {
  const std::string path =
      ::testing::TempDir() + "/ids." + std::to_string(getpid()) + ".txt";
  std::ofstream(path) << "1 2\n3-5,\n# done\n";
  EXPECT_THAT(*ReadIdListFile(path, 100), ElementsAre(1, 2, 3, 4, 5));
  std::ofstream(path) << "1 2 zz\n";
  EXPECT_THAT(std::string(ReadIdListFile(path, 100).status().message()),
              HasSubstr(path));
  EXPECT_FALSE(ReadIdListFile("/nonexistent/ids", 100).ok());
}

TEST(IdListTest, FormatsRunsAsRanges) {
  EXPECT_EQ(FormatIdList(std::vector<uint64_t>{}), "-");
  EXPECT_EQ(FormatIdList(std::vector<uint64_t>{100, 101}), "100,101");
  EXPECT_EQ(FormatIdList(std::vector<uint64_t>{1, 2, 3, 4, 9, 7, 8}),
            "1-4,9,7,8");
  EXPECT_EQ(FormatIdList(std::vector<uint32_t>{4294967294u, 4294967295u, 0u}),
            "4294967294,4294967295,0");
  const std::vector<uint64_t> ids = {3, 4, 5, 6, 10, 12, 13, 14};
  EXPECT_EQ(*ParseIdList(FormatIdList(ids), UINT64_MAX), ids);  // round trip
}

// ---- output ----

TEST(OutputTest, HumanNumbers) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(2 << 20), "2.0 MiB");
  EXPECT_EQ(HumanBytes(uint64_t{4} << 30), "4.0 GiB");
  EXPECT_EQ(HitRate(0, 0), "-");
  EXPECT_EQ(HitRate(32, 64), "50.0%");
  EXPECT_EQ(Hex64(0xab), "00000000000000ab");
}

TEST(OutputTest, TableAlignsColumns) {
  Table t({"A", "LONG_HEADER"});
  t.AddRow({"wide cell", "x"});
  std::ostringstream out;
  t.Print(out);
  EXPECT_EQ(out.str(), "A          LONG_HEADER\nwide cell  x\n");
}

TEST(OutputTest, JsonUsesProtoFieldNamesAndPrintsDefaults) {
  v1::MatchResponse m;
  m.set_epoch(0x8ab3f00d12345678);
  const std::string json = ToJson(m);
  EXPECT_THAT(json, HasSubstr("\"matched_tokens\":\"0\""));
  // The epoch in hex, as the tables print it; other 64-bit numbers decimal.
  EXPECT_THAT(json, HasSubstr("\"epoch\":\"8ab3f00d12345678\""));
  EXPECT_THAT(json, Not(HasSubstr("9994595936995923576")));
  EXPECT_THAT(json, HasSubstr("\"segments\":[]"));
  EXPECT_EQ(json.find('\n'), std::string::npos);
}

// ---- prefixctl ----

TEST_F(ClientTest, CtlHelpListsEveryCommandAndFlag) {
  std::string out;
  ASSERT_EQ(Ctl({"--help"}, &out), kExitOk);
  for (const char* cmd :
       {"health", "info", "stats", "match", "insert", "release", "keepalive",
        "evict", "invalidate", "reset", "watch", "dump", "plan"}) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("\n  ", cmd, " "))) << cmd;
  }
  for (const char* flag :
       {"--addr",           "--tenant",  "--token",       "--timeout",
        "--json",           "--tokens=", "--tokens_file", "--block_ids=",
        "--block_ids_file", "--pin",     "--position",    "--namespace",
        "--lease_ttl",      "--lease=",  "--blocks",      "--count",
        "--from",           "--all",     "--watch",       "--service"}) {
    EXPECT_THAT(out, HasSubstr(flag)) << flag;
  }
  ASSERT_EQ(Ctl({"insert", "--help"}, &out), kExitOk);
  EXPECT_THAT(out, HasSubstr("--block_ids_file"));
  EXPECT_THAT(out, HasSubstr("--addr"));
  ASSERT_EQ(Ctl({"help", "watch"}, &out), kExitOk);
  EXPECT_THAT(out, HasSubstr("--count"));
}

TEST_F(ClientTest, CtlUsageErrorsExit2) {
  std::string out, err;
  EXPECT_EQ(Ctl({}, &out, &err), kExitUsage);
  EXPECT_EQ(Ctl({"frobnicate"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("unknown command 'frobnicate'"));
  EXPECT_EQ(Ctl({"match"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("--tokens"));
  EXPECT_EQ(Ctl({"match", "--tokens", "1-x"}, &out, &err), kExitUsage);
  EXPECT_EQ(Ctl({"match", "--tokens", "1", "--tokens_file", "f"}, &out, &err),
            kExitUsage);
  EXPECT_EQ(Ctl({"insert", "--tokens", "1-16"}, &out, &err), kExitUsage);
  EXPECT_EQ(Ctl({"release"}, &out, &err), kExitUsage);
  EXPECT_EQ(Ctl({"evict", "--blocks", "many"}, &out, &err), kExitUsage);
  EXPECT_EQ(Ctl({"stats", "--frob"}, &out, &err), kExitUsage);
  EXPECT_EQ(Ctl({"stats", "extra"}, &out, &err), kExitUsage);
  EXPECT_EQ(Ctl({"--timeout", "soon", "stats"}, &out, &err), kExitUsage);
}

TEST_F(ClientTest, CtlRpcErrorsExit1WithCodeAndMessage) {
  std::string out, err;
  EXPECT_EQ(Ctl({"release", "--lease", "7"}, &out, &err), kExitRpcError);
  EXPECT_EQ(err, "error: NOT_FOUND: lease 7 not found\n");
  EXPECT_EQ(Ctl({"insert", "--tokens", "1-20", "--block_ids", "1"}, &out, &err),
            kExitRpcError);
  EXPECT_THAT(err, HasSubstr("INVALID_ARGUMENT: len(tokens)=20"));
}

TEST_F(ClientTest, CtlGlobalFlagsGoAnywhere) {
  std::string out;
  ASSERT_EQ(Ctl({"--tenant", "acme", "info", "--token=t0k"}, &out), kExitOk);
  EXPECT_EQ(service_.last_metadata().first, "Bearer t0k");
  EXPECT_EQ(service_.last_metadata().second, "acme");
}

TEST_F(ClientTest, CtlInsertAndMatchTables) {
  std::string out;
  ASSERT_EQ(Ctl({"insert", "--tokens", "1-32", "--block_ids", "100,101"}, &out),
            kExitOk);
  EXPECT_THAT(
      out,
      HasSubstr("inserted 32 tokens: 16 already cached, 1 of 2 blocks new"));
  EXPECT_THAT(out, HasSubstr("redundant_block_ids  100"));
  EXPECT_THAT(out, HasSubstr("evicted_block_ids    7"));
  ASSERT_EQ(
      Ctl({"match", "--tokens", "1-37", "--pin", "--position", "16"}, &out),
      kExitOk);
  EXPECT_THAT(out, HasSubstr("matched 32 of 37 tokens (2 blocks, 1 segment)"));
  EXPECT_THAT(
      out,
      HasSubstr("SEGMENT  BLOCKS  CACHED_POSITION  ROPE_DELTA  BLOCK_IDS"));
  EXPECT_THAT(
      out, HasSubstr("0        2       0                16          100,101"));
  EXPECT_THAT(out, HasSubstr("lease 42"));
  EXPECT_TRUE(
      service_.released().empty());  // prefixctl leaves the lease to `release`
  ASSERT_EQ(Ctl({"release", "--lease", "42"}, &out), kExitOk);
  EXPECT_EQ(out, "released lease 42\n");
}

TEST_F(ClientTest, CtlReadsTokensFromFile) {
  const std::string path =
      ::testing::TempDir() + "/tokens." + std::to_string(getpid()) + ".txt";
  std::ofstream(path) << "1 2 3 4 5 6 7 8\n9-16\n";
  std::string out;
  ASSERT_EQ(Ctl({"match", "--tokens_file", path, "--json"}, &out), kExitOk);
  EXPECT_EQ(SentTokens(service_.last_match()), Tokens(16));
  EXPECT_THAT(out, HasSubstr("\"matched_tokens\":\"16\""));
}

TEST_F(ClientTest, CtlStatsTable) {
  std::string out;
  ASSERT_EQ(Ctl({"stats"}, &out), kExitOk);
  EXPECT_EQ(
      out,
      "epoch 1234abcd5678ef00  block_size 16  block_bytes 2.0 MiB  budget "
      "4.0 GiB (2048 blocks)\n"
      "\n"
      "TENANT   HIT_RATE  HIT/LOOKED_UP  MATCHES  INSERTS  CACHED        "
      "      PINNED          LEASES\n"
      "default  50.0%     32/64          2        0        2 blocks (4.0 "
      "MiB)  0 blocks (0 B)  1\n"
      "\n"
      "EVICTED_BLOCKS  budget  limit  requested  invalidated  reset\n"
      "default         0       0      3          0            0\n"
      "\n"
      "RETENTION  cached low  default  high  evicted low  default  high\n"
      "default    -           1        1     -            3        0\n");
}

TEST_F(ClientTest, CtlJsonIsOneObjectPerLine) {
  std::string out;
  ASSERT_EQ(Ctl({"--json", "stats"}, &out), kExitOk);
  EXPECT_THAT(out, HasSubstr("\"match_hit_tokens\":\"32\""));
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
  ASSERT_EQ(Ctl({"--json", "evict", "--blocks", "2"}, &out), kExitOk);
  EXPECT_EQ(out, "{\"evicted_block_ids\":[\"200\",\"201\"]}\n");
  ASSERT_EQ(Ctl({"--json", "keepalive", "--lease", "1,2"}, &out), kExitOk);
  EXPECT_EQ(out,
            "{\"lease_ids\":[\"1\",\"2\"],\"expires_in_ms\":[\"30000\","
            "\"30000\"]}\n");
  ASSERT_EQ(Ctl({"--json", "health"}, &out), kExitOk);
  EXPECT_EQ(out, "{\"status\":\"SERVING\"}\n");
}

TEST_F(ClientTest, CtlWatchStopsAfterCount) {
  std::string out;
  ASSERT_EQ(Ctl({"--tenant", "hold", "watch", "--count", "3"}, &out), kExitOk);
  EXPECT_EQ(out,
            "#1 stored ns=\"\" position=0 parent=- blocks=101\n"
            "#2 removed ns=\"\" reason=requested blocks=102\n"
            "#3 stored ns=\"\" position=0 parent=- blocks=103\n");
  ASSERT_EQ(Ctl({"watch", "--from", "5", "--json"}, &out), kExitOk);
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_THAT(lines[0], HasSubstr("\"missed_events\":true"));
  EXPECT_THAT(lines[1], HasSubstr("\"sequence\":\"5\""));
}

TEST_F(ClientTest, CtlDumpAndInvalidate) {
  std::string out;
  ASSERT_EQ(Ctl({"dump", "--namespace", "a"}, &out), kExitOk);
  EXPECT_THAT(out, HasSubstr("namespace \"a\": 1 nodes"));
  EXPECT_THAT(
      out,
      HasSubstr("- [0,32) blocks=100,101 pins=0 stamp=0 tokens=1-16,...(+16)"));
  ASSERT_EQ(Ctl({"invalidate", "--block_ids", "5"}, &out), kExitOk);
  EXPECT_EQ(out, "removed 2 blocks: 5,999\n");
}

}  // namespace
}  // namespace prefixd
