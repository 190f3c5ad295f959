// The PrefixCache service end to end in one process: a Server on port 0 and
// a Unix socket in a temporary directory, driven through real gRPC channels
// (each test runs over both). Lease expiry runs on a ManualClock, so no test
// sleeps; waits on streams are bounded by call deadlines.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "prefixd/v1/prefix_cache.grpc.pb.h"
#include "server/config.h"
#include "server/server.h"
#include "server/test_server.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr int kBlockSize = 4;
constexpr uint64_t kBlockBytes = kBlockSize * 131072;  // llama-3-8b fp16
constexpr uint64_t kBudgetBlocks = 8;

using Transport = TestServer::Transport;

std::vector<uint32_t> Tokens(uint32_t first, int n) {
  std::vector<uint32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

template <typename T>
std::vector<T> Vec(const google::protobuf::RepeatedField<T>& f) {
  return std::vector<T>(f.begin(), f.end());
}

#define EXPECT_CODE(status, code)                          \
  EXPECT_EQ((status).error_code(), grpc::StatusCode::code) \
      << (status).error_message()
#define ASSERT_OK(status) ASSERT_TRUE((status).ok()) << (status).error_message()

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

// grpc.reflection.v1alpha without its generated code (Debian ships none,
// and a second copy would clash with the one in libgrpc++_reflection):
// ServerReflectionRequest{list_services: ""} is the two bytes 0x3a 0x00.
std::vector<std::string> ListServicesByReflection(
    const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
      stream(grpc::internal::ClientReaderWriterFactory<
             grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel.get(), method,
                                                         &ctx));
  grpc::Slice request(std::string("\x3a\x00", 2));
  EXPECT_TRUE(stream->Write(grpc::ByteBuffer(&request, 1)));
  stream->WritesDone();
  std::vector<std::string> names;
  grpc::ByteBuffer response;
  while (stream->Read(&response)) {
    grpc::Slice all;
    EXPECT_TRUE(response.DumpToSingleSlice(&all).ok());
    google::protobuf::UnknownFieldSet top, list, service;
    top.ParseFromArray(all.begin(), static_cast<int>(all.size()));
    for (int i = 0; i < top.field_count(); ++i) {
      if (top.field(i).number() != 6) continue;  // list_services_response
      list.ParseFromString(top.field(i).length_delimited());
      for (int j = 0; j < list.field_count(); ++j) {
        service.Clear();
        service.ParseFromString(list.field(j).length_delimited());
        if (service.field_count() > 0)
          names.push_back(service.field(0).length_delimited());
      }
    }
  }
  grpc::Status s = stream->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  return names;
}

class ServiceTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override { Start(); }
  void TearDown() override { test_server_.Stop(); }

  // (Re)starts the server with the test defaults, then `adjust`.
  void Start(const std::function<void(ServerConfig*)>& adjust = {}) {
    absl::StatusOr<ServerConfig> config = TestServer::Config(
        absl::StrCat("block_size: ", kBlockSize, " kv_budget: \"",
                     kBudgetBlocks * kBlockBytes, "B\""));
    ASSERT_TRUE(config.ok()) << config.status();
    config->cache.clock = &clock_;
    if (adjust) adjust(&*config);
    absl::Status started = test_server_.Start(*std::move(config));
    ASSERT_TRUE(started.ok()) << started;
    server_ = &test_server_.server();
    ASSERT_EQ(server_->addresses().size(), 2u);
    channel_ = test_server_.Channel(GetParam());
    stub_ = v1::PrefixCache::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& tenant = "") {
    return TestServer::Context(tenant);
  }

  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (v1::PrefixCache::Stub::*method)(
                        grpc::ClientContext*, const Req&, Resp*),
                    const Req& req, Resp* resp,
                    const std::string& tenant = "") {
    return ((*stub_).*method)(Ctx(tenant).get(), req, resp);
  }

  v1::InsertResponse Insert(const std::vector<uint32_t>& tokens,
                            const std::vector<uint64_t>& ids,
                            const std::string& tenant = "", bool pin = false) {
    v1::InsertResponse r;
    grpc::Status s = Call(&v1::PrefixCache::Stub::Insert,
                          InsertReq(tokens, ids, pin), &r, tenant);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.epoch(), server_->epoch());
    return r;
  }

  v1::MatchResponse Match(const std::vector<uint32_t>& tokens,
                          const std::string& tenant = "", bool pin = false) {
    v1::MatchResponse r;
    grpc::Status s =
        Call(&v1::PrefixCache::Stub::Match, MatchReq(tokens, pin), &r, tenant);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.epoch(), server_->epoch());
    return r;
  }

  v1::StatsResponse Stats(const std::string& tenant = "", bool all = false) {
    v1::StatsRequest req;
    req.set_all_tenants(all);
    v1::StatsResponse r;
    grpc::Status s = Call(&v1::PrefixCache::Stub::Stats, req, &r, tenant);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.epoch(), server_->epoch());
    return r;
  }

  uint64_t CachedBlocks(const std::string& tenant = "") {
    v1::StatsResponse s = Stats(tenant);
    return s.tenants().empty() ? 0 : s.tenants(0).cached_blocks();
  }

  ManualClock clock_;
  TestServer test_server_;
  Server* server_ = nullptr;  // test_server_'s
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::PrefixCache::Stub> stub_;
};

INSTANTIATE_TEST_SUITE_P(Transports, ServiceTest,
                         ::testing::Values(Transport::kTcp, Transport::kUnix),
                         [](const ::testing::TestParamInfo<Transport>& info) {
                           return TestServer::TransportName(info.param);
                         });

TEST_P(ServiceTest, GetInfoReportsModelBudgetAndEpoch) {
  v1::GetInfoResponse info;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::GetInfo, v1::GetInfoRequest(), &info));
  EXPECT_NE(info.epoch(), 0u);
  EXPECT_EQ(info.epoch(), server_->epoch());
  EXPECT_EQ(info.block_size(), static_cast<uint32_t>(kBlockSize));
  EXPECT_EQ(info.block_bytes(), kBlockBytes);
  EXPECT_EQ(info.budget_bytes(), kBudgetBlocks * kBlockBytes);
  EXPECT_EQ(info.budget_blocks(), kBudgetBlocks);
  EXPECT_EQ(info.bytes_per_token(), 131072u);
  EXPECT_EQ(info.model_fingerprint(), server_->config().fingerprint);
  EXPECT_THAT(info.model(), HasSubstr("llama-3-8b"));
  EXPECT_EQ(info.rope_shift(), "DENY");
  EXPECT_EQ(info.auth_mode(), "NONE");
  EXPECT_EQ(info.default_lease_ttl_ms(), 300000u);
  EXPECT_EQ(info.limits().max_tokens_per_request(),
            CacheLimits().max_tokens_per_request);
  EXPECT_EQ(info.limits().max_message_bytes(), uint64_t{16} << 20);
  EXPECT_FALSE(info.version().empty());
}

TEST_P(ServiceTest, GetInfoReportsTheEvictionPolicy) {
  v1::GetInfoResponse info;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::GetInfo, v1::GetInfoRequest(), &info));
  EXPECT_EQ(info.eviction_policy(), "LRU");
  Start([](ServerConfig* c) {
    c->cache.eviction_policy = EvictionPolicy::kAdaptive;
  });
  ASSERT_OK(Call(&v1::PrefixCache::Stub::GetInfo, v1::GetInfoRequest(), &info));
  EXPECT_EQ(info.eviction_policy(), "ADAPTIVE");
}

// Retention numbers that do not fit core's types are refused at the wire,
// naming the field and the value; nothing changes.
TEST_P(ServiceTest, RetentionBeyondCoresTypesIsInvalidArgument) {
  const v1::StatsResponse before = Stats("acme");
  struct Case {
    std::function<void(v1::Retention*)> set;
    std::vector<std::string> message_has;
  };
  const std::vector<Case> cases = {
      {[](v1::Retention* r) { r->set_priority(4294967295u); },
       {"retention.priority 4294967295", "100"}},
      {[](v1::Retention* r) { r->set_duration_ms(~uint64_t{0}); },
       {"retention.duration_ms 18446744073709551615"}},
      {[](v1::Retention* r) {
         r->add_ranges()->set_priority(80);
         r->add_ranges()->set_priority(2147483648u);
       },
       {"retention.ranges[1].priority 2147483648", "100"}},
      {[](v1::Retention* r) {
         r->add_ranges()->set_duration_ms(uint64_t{1} << 63);
       },
       {"retention.ranges[0].duration_ms 9223372036854775808"}},
  };
  for (const Case& c : cases) {
    v1::InsertRequest req = InsertReq(Tokens(1, 8), {10, 11});
    c.set(req.mutable_retention());
    v1::InsertResponse resp;
    grpc::Status s = Call(&v1::PrefixCache::Stub::Insert, req, &resp, "acme");
    EXPECT_CODE(s, INVALID_ARGUMENT);
    for (const std::string& m : c.message_has) {
      EXPECT_THAT(s.error_message(), HasSubstr(m));
    }
    // In a batch the item is named and the whole batch is refused, like a
    // malformed tokens_le32.
    v1::InsertBatchRequest batch;
    *batch.add_requests() = InsertReq(Tokens(100, 4), {20});
    *batch.add_requests() = req;
    v1::InsertBatchResponse batch_resp;
    s = Call(&v1::PrefixCache::Stub::InsertBatch, batch, &batch_resp, "acme");
    EXPECT_CODE(s, INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(),
                HasSubstr("requests[1]: " + c.message_has[0]));
  }
  const v1::StatsResponse after = Stats("acme");
  EXPECT_EQ(after.DebugString(), before.DebugString());
  EXPECT_EQ(CachedBlocks("acme"), 0u);

  // The same Insert with a hint that fits is served.
  v1::InsertRequest ok = InsertReq(Tokens(1, 8), {10, 11});
  ok.mutable_retention()->set_priority(90);
  ok.mutable_retention()->set_duration_ms(600000);
  v1::InsertResponse resp;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Insert, ok, &resp, "acme"));
  EXPECT_EQ(CachedBlocks("acme"), 2u);
}

TEST_P(ServiceTest, HandshakeChecksTheModelFingerprint) {
  v1::HandshakeRequest req;
  req.set_engine_id("vllm-0");
  req.set_model_fingerprint(server_->config().fingerprint);
  v1::HandshakeResponse resp;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Handshake, req, &resp));
  EXPECT_EQ(resp.epoch(), server_->epoch());
  EXPECT_EQ(resp.model_fingerprint(), server_->config().fingerprint);

  req.set_model_fingerprint("0123456789abcdef");
  grpc::Status s = Call(&v1::PrefixCache::Stub::Handshake, req, &resp);
  EXPECT_CODE(s, FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("0123456789abcdef"));
  EXPECT_THAT(s.error_message(), HasSubstr(server_->config().fingerprint));
  EXPECT_THAT(s.error_message(), HasSubstr("vllm-0"));

  // With its fingerprint text the engine learns which settings differ.
  ModelSpec engine = server_->config().model;
  engine.kv_dtype = KvDtype::kFp8;
  req.set_model_fingerprint(Fingerprint(engine));
  req.set_model_fingerprint_text(FingerprintText(engine));
  s = Call(&v1::PrefixCache::Stub::Handshake, req, &resp);
  EXPECT_CODE(s, FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("kv_dtype: fp8 vs fp16"));

  req.clear_model_fingerprint();
  EXPECT_CODE(Call(&v1::PrefixCache::Stub::Handshake, req, &resp),
              INVALID_ARGUMENT);
}

TEST_P(ServiceTest, InsertThenMatchReturnsTheCachedBlocks) {
  v1::InsertResponse ins = Insert(Tokens(0, 12), {101, 102, 103});
  EXPECT_EQ(ins.cached_tokens(), 0u);
  EXPECT_THAT(ins.redundant_block_ids(), IsEmpty());
  EXPECT_THAT(ins.evicted_block_ids(), IsEmpty());
  EXPECT_EQ(ins.lease_id(), 0u);

  // 14 tokens: only whole blocks count.
  v1::MatchResponse m = Match(Tokens(0, 14));
  EXPECT_EQ(m.matched_tokens(), 12u);
  ASSERT_EQ(m.segments_size(), 1);
  EXPECT_THAT(Vec(m.segments(0).block_ids()), ElementsAre(101, 102, 103));
  EXPECT_EQ(m.segments(0).cached_position(), 0);
  EXPECT_EQ(m.segments(0).rope_delta(), 0);
  EXPECT_EQ(m.lease_id(), 0u);

  EXPECT_EQ(Match(Tokens(1000, 8)).matched_tokens(), 0u);

  // Another engine computed the same prefix into other blocks: those come
  // back as redundant; the extra block is adopted.
  ins = Insert(Tokens(0, 16), {201, 202, 203, 204});
  EXPECT_EQ(ins.cached_tokens(), 12u);
  EXPECT_THAT(Vec(ins.redundant_block_ids()), ElementsAre(201, 202, 203));
  // The IDs a Match returned are confirmed, not redundant.
  ins = Insert(Tokens(0, 16), {101, 102, 103, 204});
  EXPECT_EQ(ins.cached_tokens(), 16u);
  EXPECT_THAT(ins.redundant_block_ids(), IsEmpty());
  EXPECT_EQ(CachedBlocks(), 4u);
}

TEST_P(ServiceTest, RopeDeltaPerSegmentWhenShiftIsAllowed) {
  Start([](ServerConfig* c) { c->cache.rope_shift = RopeShift::kAllow; });
  v1::InsertRequest ins = InsertReq(Tokens(0, 8), {1, 2});
  ins.set_position_offset(100);
  v1::InsertResponse ir;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Insert, ins, &ir));
  v1::MatchRequest req = MatchReq(Tokens(0, 8));
  req.set_position_offset(40);
  v1::MatchResponse m;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Match, req, &m));
  EXPECT_EQ(m.matched_tokens(), 8u);
  ASSERT_EQ(m.segments_size(), 1);
  EXPECT_EQ(m.segments(0).cached_position(), 100);
  EXPECT_EQ(m.segments(0).rope_delta(), -60);
}

TEST_P(ServiceTest, MalformedInsertsAreInvalidArgumentAndChangeNothing) {
  Insert(Tokens(0, 12), {101, 102, 103});
  v1::InsertResponse r;
  grpc::Status s = Call(&v1::PrefixCache::Stub::Insert,
                        InsertReq(Tokens(50, 10), {1, 2, 3}), &r);
  EXPECT_CODE(s, INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("10"));
  EXPECT_CODE(Call(&v1::PrefixCache::Stub::Insert,
                   InsertReq(Tokens(50, 8), {7, 7}), &r),
              INVALID_ARGUMENT);
  s = Call(&v1::PrefixCache::Stub::Insert, InsertReq(Tokens(50, 8), {8, 101}),
           &r);
  EXPECT_CODE(s, INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("101"));
  v1::InsertRequest negative = InsertReq(Tokens(50, 4), {9});
  negative.set_position_offset(-1);
  EXPECT_CODE(Call(&v1::PrefixCache::Stub::Insert, negative, &r),
              INVALID_ARGUMENT);
  v1::MatchResponse m;
  EXPECT_CODE(Call(&v1::PrefixCache::Stub::Match, MatchReq({}), &m),
              INVALID_ARGUMENT);
  EXPECT_EQ(CachedBlocks(), 3u);
}

TEST_P(ServiceTest, RequestLimits) {
  Start([](ServerConfig* c) {
    c->cache.limits.max_tokens_per_request = 64;
    c->max_message_bytes = 64 << 10;
  });
  v1::MatchResponse m;
  grpc::Status s =
      Call(&v1::PrefixCache::Stub::Match, MatchReq(Tokens(0, 68)), &m);
  EXPECT_CODE(s, INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("64"));
  // 40,000 three-byte varints: past the 64 KiB message limit.
  s = Call(&v1::PrefixCache::Stub::Match, MatchReq(Tokens(1 << 20, 40000)), &m);
  EXPECT_CODE(s, RESOURCE_EXHAUSTED);
}

TEST_P(ServiceTest, LeaseLifecycle) {
  Insert(Tokens(0, 12), {101, 102, 103});
  v1::MatchResponse m = Match(Tokens(0, 12), "", /*pin=*/true);
  ASSERT_NE(m.lease_id(), 0u);
  EXPECT_EQ(Stats().tenants(0).pinned_blocks(), 3u);

  v1::KeepAliveRequest ka;
  ka.add_lease_ids(m.lease_id());
  v1::KeepAliveResponse kr;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::KeepAlive, ka, &kr));
  EXPECT_THAT(Vec(kr.expires_in_ms()), ElementsAre(300000u));

  v1::ReleaseRequest rel;
  rel.set_lease_id(m.lease_id());
  v1::ReleaseResponse rr;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Release, rel, &rr));
  EXPECT_EQ(Stats().tenants(0).pinned_blocks(), 0u);
  grpc::Status s = Call(&v1::PrefixCache::Stub::Release, rel, &rr);
  EXPECT_CODE(s, NOT_FOUND);
  EXPECT_CODE(Call(&v1::PrefixCache::Stub::KeepAlive, ka, &kr), NOT_FOUND);
  EXPECT_CODE(
      Call(&v1::PrefixCache::Stub::KeepAlive, v1::KeepAliveRequest(), &kr),
      INVALID_ARGUMENT);

  v1::InsertResponse ins = Insert(Tokens(500, 4), {600}, "", /*pin=*/true);
  EXPECT_NE(ins.lease_id(), 0u);
}

TEST_P(ServiceTest, LeaseExpiresOnTheInjectedClock) {
  Insert(Tokens(0, 12), {101, 102, 103});
  v1::MatchRequest req = MatchReq(Tokens(0, 12), /*pin=*/true);
  req.set_lease_ttl_ms(1000);
  v1::MatchResponse m;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Match, req, &m));
  ASSERT_NE(m.lease_id(), 0u);
  clock_.Advance(absl::Milliseconds(999));
  v1::KeepAliveRequest ka;
  ka.add_lease_ids(m.lease_id());
  v1::KeepAliveResponse kr;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::KeepAlive, ka, &kr));
  EXPECT_THAT(Vec(kr.expires_in_ms()), ElementsAre(1000u));

  clock_.Advance(absl::Milliseconds(1001));
  EXPECT_CODE(Call(&v1::PrefixCache::Stub::KeepAlive, ka, &kr), NOT_FOUND);
  EXPECT_EQ(Stats().tenants(0).pinned_blocks(), 0u);
  EXPECT_EQ(Stats().tenants(0).lease_expired(), 1u);

  req.set_lease_ttl_ms(uint64_t{48} * 3600 * 1000);  // past max_lease_ttl (24h)
  grpc::Status s = Call(&v1::PrefixCache::Stub::Match, req, &m);
  EXPECT_CODE(s, INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("24h"));
}

TEST_P(ServiceTest, TenantsComeFromMetadataAndAreIsolated) {
  Insert(Tokens(0, 8), {1, 2}, "acme");
  EXPECT_EQ(Match(Tokens(0, 8), "acme").matched_tokens(), 8u);
  EXPECT_EQ(Match(Tokens(0, 8), "beta").matched_tokens(), 0u);
  EXPECT_EQ(Match(Tokens(0, 8)).matched_tokens(), 0u);  // "default"

  v1::MatchResponse pinned = Match(Tokens(0, 8), "acme", /*pin=*/true);
  v1::ReleaseRequest rel;
  rel.set_lease_id(pinned.lease_id());
  v1::ReleaseResponse rr;
  EXPECT_CODE(Call(&v1::PrefixCache::Stub::Release, rel, &rr, "beta"),
              NOT_FOUND);
  EXPECT_EQ(Stats("acme").tenants(0).pinned_blocks(), 2u);

  v1::StatsResponse beta = Stats("beta");
  ASSERT_EQ(beta.tenants_size(), 1);
  EXPECT_EQ(beta.tenants(0).tenant(), "beta");
  EXPECT_EQ(beta.tenants(0).cached_blocks(), 0u);
  v1::StatsResponse all =
      Stats("beta", /*all=*/true);  // auth off: every caller may
  std::vector<std::string> names;
  for (const auto& t : all.tenants()) names.push_back(t.tenant());
  EXPECT_THAT(names, ElementsAre("acme", "beta", "default"));
}

TEST_P(ServiceTest, BadTenantMetadataIsInvalidArgument) {
  v1::MatchResponse m;
  auto ctx = Ctx();
  ctx->AddMetadata("x-prefixd-tenant", "a");
  ctx->AddMetadata("x-prefixd-tenant", "b");
  grpc::Status s = stub_->Match(ctx.get(), MatchReq(Tokens(0, 4)), &m);
  EXPECT_CODE(s, INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("x-prefixd-tenant"));
  EXPECT_CODE(Call(&v1::PrefixCache::Stub::Match, MatchReq(Tokens(0, 4)), &m,
                   "bad tenant"),
              INVALID_ARGUMENT);
}

TEST_P(ServiceTest, InsertEvictsLeastRecentlyUsedBlocksToFitTheBudget) {
  Insert(Tokens(0, 16), {1, 2, 3, 4});
  Insert(Tokens(100, 16), {11, 12, 13, 14});
  Match(Tokens(0, 16));  // the first path is now the most recently used
  v1::InsertResponse r = Insert(Tokens(200, 8), {21, 22});
  EXPECT_THAT(Vec(r.evicted_block_ids()), UnorderedElementsAre(13, 14));
  EXPECT_EQ(CachedBlocks(), kBudgetBlocks);
  // One tenant whose limit is the whole budget: core may book these as
  // "budget" or "limit"; either way two blocks, in bytes too.
  uint64_t evicted = 0;
  v1::StatsResponse stats = Stats();
  for (const auto& e : stats.tenants(0).evictions()) {
    EXPECT_EQ(e.bytes(), e.blocks() * kBlockBytes);
    if (e.reason() == "budget" || e.reason() == "limit") evicted += e.blocks();
  }
  EXPECT_EQ(evicted, 2u);
}

TEST_P(ServiceTest, ResourceExhaustedWhenPinnedBlocksFillTheBudget) {
  Insert(Tokens(0, 32), {1, 2, 3, 4, 5, 6, 7, 8}, "", /*pin=*/true);
  v1::InsertResponse r;
  grpc::Status s =
      Call(&v1::PrefixCache::Stub::Insert, InsertReq(Tokens(100, 4), {9}), &r);
  EXPECT_CODE(s, RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("8"));
  EXPECT_EQ(CachedBlocks(), 8u);
}

TEST_P(ServiceTest, ResourceExhaustedPastMaxTenants) {
  Start([](ServerConfig* c) { c->cache.limits.max_tenants = 2; });
  Match(Tokens(0, 4), "t1");
  Match(Tokens(0, 4), "t2");
  v1::MatchResponse m;
  grpc::Status s =
      Call(&v1::PrefixCache::Stub::Match, MatchReq(Tokens(0, 4)), &m, "t3");
  EXPECT_CODE(s, RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("max_tenants 2"));
}

TEST_P(ServiceTest, EvictAndInvalidate) {
  Insert(Tokens(0, 12), {1, 2, 3});
  Insert(Tokens(100, 8), {11, 12});
  v1::EvictRequest ev;
  ev.set_blocks(1);
  v1::EvictResponse er;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Evict, ev, &er));
  EXPECT_THAT(Vec(er.evicted_block_ids()), ElementsAre(3));  // LRU tail
  ev.set_blocks(0);
  EXPECT_CODE(Call(&v1::PrefixCache::Stub::Evict, ev, &er), INVALID_ARGUMENT);

  v1::InvalidateRequest inv;
  inv.add_block_ids(1);
  v1::InvalidateResponse ir;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Invalidate, inv, &ir));
  EXPECT_THAT(Vec(ir.removed_block_ids()), UnorderedElementsAre(1, 2));
  inv.set_block_ids(0, 999);
  grpc::Status s = Call(&v1::PrefixCache::Stub::Invalidate, inv, &ir);
  EXPECT_CODE(s, NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("999"));
  EXPECT_CODE(
      Call(&v1::PrefixCache::Stub::Invalidate, v1::InvalidateRequest(), &ir),
      INVALID_ARGUMENT);
  EXPECT_EQ(CachedBlocks(), 2u);
}

TEST_P(ServiceTest, ResetOneTenantOrAll) {
  Insert(Tokens(0, 8), {1, 2}, "acme");
  Insert(Tokens(0, 8), {11, 12}, "beta");
  Insert(Tokens(0, 8), {21, 22}, "gamma");
  v1::ResetResponse r;
  ASSERT_OK(
      Call(&v1::PrefixCache::Stub::Reset, v1::ResetRequest(), &r, "acme"));
  EXPECT_THAT(Vec(r.removed_block_ids()), UnorderedElementsAre(1, 2));
  EXPECT_EQ(r.epoch(),
            server_->epoch());  // every ID was handed back: no state lost

  v1::ResetRequest named;
  named.set_tenant("beta");
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Reset, named, &r, "acme"));
  EXPECT_THAT(Vec(r.removed_block_ids()), UnorderedElementsAre(11, 12));

  named.set_all(true);
  EXPECT_CODE(Call(&v1::PrefixCache::Stub::Reset, named, &r), INVALID_ARGUMENT);
  v1::ResetRequest all;
  all.set_all(true);
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Reset, all, &r));
  EXPECT_THAT(Vec(r.removed_block_ids()), UnorderedElementsAre(21, 22));
  EXPECT_EQ(r.epoch(), server_->epoch());
}

TEST_P(ServiceTest, StatsCountTraffic) {
  Insert(Tokens(0, 12), {1, 2, 3});
  Match(Tokens(0, 14));
  Insert(Tokens(0, 12), {4, 5, 6});  // all redundant
  v1::StatsResponse s = Stats();
  EXPECT_EQ(s.block_size(), static_cast<uint32_t>(kBlockSize));
  EXPECT_EQ(s.block_bytes(), kBlockBytes);
  EXPECT_EQ(s.budget_bytes(), kBudgetBlocks * kBlockBytes);
  EXPECT_EQ(s.budget_blocks(), kBudgetBlocks);
  ASSERT_EQ(s.tenants_size(), 1);
  const v1::TenantStats& t = s.tenants(0);
  EXPECT_EQ(t.tenant(), "default");
  EXPECT_EQ(t.cached_blocks(), 3u);
  EXPECT_EQ(t.cached_bytes(), 3 * kBlockBytes);
  EXPECT_EQ(t.match_requests(), 1u);
  EXPECT_EQ(t.match_tokens(), 14u);
  EXPECT_EQ(t.match_hit_tokens(), 12u);
  EXPECT_EQ(t.insert_requests(), 2u);
  EXPECT_EQ(t.inserted_blocks(), 3u);
  EXPECT_EQ(t.redundant_blocks(), 3u);
  EXPECT_EQ(t.limit_bytes(), kBudgetBlocks * kBlockBytes);
  std::vector<std::string> reasons;
  for (const auto& e : t.evictions()) reasons.push_back(e.reason());
  EXPECT_THAT(reasons, ElementsAre("budget", "limit", "requested",
                                   "invalidated", "reset"));
}

TEST_P(ServiceTest, DumpShowsTheTreeOfTheCallersTenant) {
  v1::InsertRequest in = InsertReq(Tokens(0, 8), {1, 2});
  in.set_namespace_("lora-a");
  v1::InsertResponse ir;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Insert, in, &ir));
  v1::DumpRequest req;
  req.set_namespace_("lora-a");
  v1::DumpResponse d;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Dump, req, &d));
  EXPECT_EQ(d.epoch(), server_->epoch());
  EXPECT_THAT(d.namespaces(), ElementsAre("lora-a"));
  ASSERT_EQ(d.nodes_size(), 1);
  EXPECT_EQ(d.nodes(0).depth(), 1u);
  EXPECT_THAT(Vec(d.nodes(0).block_ids()), ElementsAre(1, 2));
  EXPECT_THAT(Vec(d.nodes(0).tokens()), ElementsAreArray(Tokens(0, 8)));

  ASSERT_OK(Call(&v1::PrefixCache::Stub::Dump, v1::DumpRequest(),
                 &d));  // "" is empty
  EXPECT_THAT(d.nodes(), IsEmpty());
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Dump, req, &d, "beta"));
  EXPECT_THAT(d.nodes(), IsEmpty());
  EXPECT_THAT(d.namespaces(), IsEmpty());
}

TEST_P(ServiceTest, WatchEventsStreamsStoredAndRemovedBlocks) {
  auto ctx = Ctx("acme");
  v1::WatchEventsRequest req;
  std::unique_ptr<grpc::ClientReader<v1::WatchEventsResponse>> stream =
      stub_->WatchEvents(ctx.get(), req);
  Insert(Tokens(0, 12), {101, 102, 103}, "acme");
  Insert(Tokens(0, 12), {201, 202, 203},
         "beta");  // another tenant: never seen here

  std::vector<v1::Event> events;
  v1::WatchEventsResponse batch;
  while (events.empty() && stream->Read(&batch)) {
    EXPECT_EQ(batch.epoch(), server_->epoch());
    EXPECT_FALSE(batch.missed_events());
    events.insert(events.end(), batch.events().begin(), batch.events().end());
  }
  ASSERT_THAT(events, testing::SizeIs(1));
  EXPECT_EQ(events[0].sequence(), 1u);
  ASSERT_TRUE(events[0].has_block_stored());
  EXPECT_THAT(Vec(events[0].block_stored().block_ids()),
              ElementsAre(101, 102, 103));
  EXPECT_FALSE(events[0].block_stored().has_parent());
  EXPECT_EQ(batch.next_sequence(), 2u);

  v1::EvictRequest ev;
  ev.set_blocks(1);
  v1::EvictResponse er;
  ASSERT_OK(Call(&v1::PrefixCache::Stub::Evict, ev, &er, "acme"));
  ASSERT_THAT(Vec(er.evicted_block_ids()), testing::SizeIs(1));
  ASSERT_TRUE(stream->Read(&batch));
  ASSERT_EQ(batch.events_size(), 1);
  EXPECT_EQ(batch.events(0).sequence(), 2u);
  ASSERT_TRUE(batch.events(0).has_block_removed());
  EXPECT_EQ(batch.events(0).block_removed().reason(), "requested");
  EXPECT_THAT(Vec(batch.events(0).block_removed().block_ids()),
              ElementsAreArray(Vec(er.evicted_block_ids())));

  v1::ResetResponse rr;
  ASSERT_OK(
      Call(&v1::PrefixCache::Stub::Reset, v1::ResetRequest(), &rr, "acme"));
  bool cleared = false;
  while (!cleared && stream->Read(&batch)) {
    for (const auto& e : batch.events()) cleared = cleared || e.has_cleared();
  }
  EXPECT_TRUE(cleared);

  ctx->TryCancel();
  while (stream->Read(&batch)) {
  }
  EXPECT_CODE(stream->Finish(), CANCELLED);
}

TEST_P(ServiceTest, WatchEventsFlagsEventsDroppedFromTheRing) {
  Start([](ServerConfig* c) { c->cache.events_per_tenant = 3; });
  for (uint32_t i = 0; i < 6; ++i) Insert(Tokens(1000 * i, 4), {i + 1});

  auto first_batch = [&](uint64_t from) {
    auto ctx = Ctx();
    v1::WatchEventsRequest req;
    req.set_from_sequence(from);
    auto stream = stub_->WatchEvents(ctx.get(), req);
    v1::WatchEventsResponse batch;
    EXPECT_TRUE(stream->Read(&batch));
    ctx->TryCancel();
    stream->Finish().ok();
    return batch;
  };
  v1::WatchEventsResponse b = first_batch(1);
  EXPECT_TRUE(b.missed_events());
  ASSERT_EQ(b.events_size(), 3);
  EXPECT_EQ(b.events(0).sequence(), 4u);
  EXPECT_EQ(b.next_sequence(), 7u);

  b = first_batch(0);  // "the oldest kept": nothing was asked for that is gone
  EXPECT_FALSE(b.missed_events());
  EXPECT_EQ(b.events(0).sequence(), 4u);

  b = first_batch(5);
  EXPECT_FALSE(b.missed_events());
  EXPECT_EQ(b.events(0).sequence(), 5u);
}

TEST_P(ServiceTest, HealthAndReflection) {
  std::unique_ptr<Client> client = Client::FromChannel(channel_);
  EXPECT_EQ(client->Health().value_or(HealthStatus::kUnknown),
            HealthStatus::kServing);
  EXPECT_EQ(
      client->Health("prefixd.v1.PrefixCache").value_or(HealthStatus::kUnknown),
      HealthStatus::kServing);
  std::vector<std::string> services = ListServicesByReflection(channel_);
  EXPECT_THAT(services, testing::Contains("prefixd.v1.PrefixCache"));
  EXPECT_THAT(services, testing::Contains("grpc.health.v1.Health"));
}

TEST_P(ServiceTest, ShutdownGoesNotServingAndEndsWatchStreams) {
  std::unique_ptr<Client> client = Client::FromChannel(channel_);
  auto health = client->WatchHealth("", absl::Seconds(30));
  HealthStatus status = HealthStatus::kUnknown;
  ASSERT_TRUE(health->Read(&status));
  EXPECT_EQ(status, HealthStatus::kServing);

  Insert(Tokens(0, 4), {1});
  auto ctx = Ctx();
  auto events = stub_->WatchEvents(ctx.get(), v1::WatchEventsRequest());
  v1::WatchEventsResponse batch;
  ASSERT_TRUE(events->Read(&batch));  // the stream is open at the server

  std::thread stopper([&] { server_->Shutdown(); });
  ASSERT_TRUE(health->Read(&status));
  EXPECT_EQ(status, HealthStatus::kNotServing);
  health->Cancel();  // the drain waits for open calls; this one is done
  while (events->Read(&batch)) {
  }
  grpc::Status s = events->Finish();
  EXPECT_CODE(s, UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("shutting down"));
  stopper.join();

  v1::GetInfoResponse info;
  EXPECT_CODE(
      Call(&v1::PrefixCache::Stub::GetInfo, v1::GetInfoRequest(), &info),
      UNAVAILABLE);
}

TEST_P(ServiceTest, ManyWatchersThroughChurnCancelsAndShutdown) {
  constexpr int kStreams = 8;
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::WatchEventsResponse>>>
      streams;
  std::vector<uint64_t> last_sequence(kStreams, 0);
  std::vector<bool> in_order(kStreams, true);
  std::vector<std::thread> readers;
  for (int i = 0; i < kStreams; ++i) {
    ctxs.push_back(Ctx());
    streams.push_back(
        stub_->WatchEvents(ctxs.back().get(), v1::WatchEventsRequest()));
  }
  for (int i = 0; i < kStreams; ++i) {
    readers.emplace_back([&, i] {
      v1::WatchEventsResponse batch;
      while (streams[i]->Read(&batch)) {
        for (const v1::Event& e : batch.events()) {
          in_order[i] = in_order[i] && e.sequence() == last_sequence[i] + 1;
          last_sequence[i] = e.sequence();
        }
      }
    });
  }
  // 40 one-block inserts into an 8-block budget: every insert past the
  // eighth also evicts, so events outpace the poller.
  for (uint32_t i = 0; i < 40; ++i) {
    Insert(Tokens(10000 * i, 4), {i + 1});
    if (i == 20) {
      for (int j = 0; j < kStreams; j += 2) ctxs[j]->TryCancel();
    }
  }
  server_->Shutdown();
  for (std::thread& t : readers) t.join();
  for (int i = 0; i < kStreams; ++i) {
    grpc::Status s = streams[i]->Finish();
    if (i % 2 == 0) {
      EXPECT_CODE(s, CANCELLED);
    } else {
      EXPECT_CODE(s, UNAVAILABLE);
    }
    EXPECT_TRUE(in_order[i]) << "stream " << i;
  }
}

TEST(ServerTest, SecondServerOnALiveUnixSocketFails) {
  std::string dir =
      absl::StrCat(::testing::TempDir(), "/prefixd-server-test-", getpid());
  CommandLine flags;
  flags.listen = {absl::StrCat("unix://", dir, "/prefixd.sock")};
  absl::StatusOr<ServerConfig> config = LoadServerConfig(flags);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Server>> first = Server::Start(*config);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<Server>> second = Server::Start(*config);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("another process"));
  first->reset();
  // Shut down cleanly, the first leaves no socket behind to trip the next.
  absl::StatusOr<std::unique_ptr<Server>> third = Server::Start(*config);
  EXPECT_TRUE(third.ok()) << third.status();
  third->reset();
  std::filesystem::remove_all(dir);
}

// A config that serves on a loopback TCP port the system picks.
absl::StatusOr<ServerConfig> LoopbackConfig() {
  CommandLine flags;
  flags.listen = {"127.0.0.1:0"};
  return LoadServerConfig(flags);
}

// A server started with serve_later (as Daemon starts it, its HTTP
// listeners still to open) answers NOT_SERVING until Serve.
TEST(ServerTest, ServeLaterHoldsHealthUntilServe) {
  absl::StatusOr<ServerConfig> config = LoopbackConfig();
  ASSERT_TRUE(config.ok()) << config.status();
  ServerDeps deps;
  deps.serve_later = true;
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Start(*config, std::move(deps));
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<Client> client = Client::FromChannel(grpc::CreateChannel(
      (*server)->addresses()[0], grpc::InsecureChannelCredentials()));
  EXPECT_EQ(client->Health().value_or(HealthStatus::kUnknown),
            HealthStatus::kNotServing);
  (*server)->Serve();
  EXPECT_EQ(client->Health().value_or(HealthStatus::kUnknown),
            HealthStatus::kServing);
}

TEST(ServerTest, SecondServerOnABoundTcpPortFails) {
  CommandLine flags;
  flags.listen = {"127.0.0.1:0"};
  absl::StatusOr<ServerConfig> config = LoadServerConfig(flags);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Server>> first = Server::Start(*config);
  ASSERT_TRUE(first.ok()) << first.status();
  // No SO_REUSEPORT: the second must not silently share the port.
  flags.listen = {(*first)->addresses()[0]};
  config = LoadServerConfig(flags);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Server>> second = Server::Start(*config);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr((*first)->addresses()[0]));
}

TEST(ServerTest, EpochIsRandomUnlessRestored) {
  absl::StatusOr<ServerConfig> config = LoopbackConfig();
  ASSERT_TRUE(config.ok()) << config.status();
  ServerDeps deps;
  deps.epoch = 0x1234;
  absl::StatusOr<std::unique_ptr<Server>> a =
      Server::Start(*config, std::move(deps));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->epoch(), 0x1234u);
  absl::StatusOr<std::unique_ptr<Server>> b = Server::Start(*config);
  absl::StatusOr<std::unique_ptr<Server>> c = Server::Start(*config);
  ASSERT_TRUE(b.ok() && c.ok());
  EXPECT_NE((*b)->epoch(), 0u);
  EXPECT_NE((*b)->epoch(), (*c)->epoch());
}

}  // namespace
}  // namespace prefixd
