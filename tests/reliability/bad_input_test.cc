// Malformed and hostile requests over a real gRPC channel (docs/api.md
// "Errors"). Each row of the table gets its documented code,
// a message that names the offending values, and leaves the daemon's state
// byte-identical: Stats of every tenant and a Dump of every namespace of
// every tenant are compared before and after.
//
// The server runs with small limits so each one can be crossed cheaply, on a
// ManualClock so no lease expires between the two state reads.
//
// A second table runs against auth TOKEN: missing, wrong and malformed
// credentials, and principals reaching for other tenants.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "prefixd/v1/prefix_cache.grpc.pb.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/server.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;
using Stub = v1::PrefixCache::Stub;

constexpr int kBlockSize = 4;
constexpr uint64_t kBlockBytes = kBlockSize * 131072;  // llama-3-8b fp16
constexpr uint64_t kBudgetBlocks = 8;
constexpr uint64_t kMaxMessage = 64 << 10;

std::vector<uint32_t> Tokens(uint32_t first, int n) {
  std::vector<uint32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

std::vector<uint64_t> Ids(uint64_t first, int n) {
  std::vector<uint64_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = first + i;
  return ids;
}

v1::MatchRequest MatchReq(const std::vector<uint32_t>& tokens,
                          const std::string& ns = "", bool pin = false) {
  v1::MatchRequest r;
  r.set_namespace_(ns);
  r.mutable_tokens()->Add(tokens.begin(), tokens.end());
  r.set_pin(pin);
  return r;
}

v1::InsertRequest InsertReq(const std::vector<uint32_t>& tokens,
                            const std::vector<uint64_t>& ids,
                            const std::string& ns = "", bool pin = false) {
  v1::InsertRequest r;
  r.set_namespace_(ns);
  r.mutable_tokens()->Add(tokens.begin(), tokens.end());
  r.mutable_block_ids()->Add(ids.begin(), ids.end());
  r.set_pin(pin);
  return r;
}

// Metadata for one call: tenant headers and authorization values (none,
// one or several of each).
struct Meta {
  std::vector<std::string> tenants;
  std::vector<std::string> auth;
  static Meta Tenant(std::string t) { return {{std::move(t)}, {}}; }
  // A bearer token, and the tenant header unless `tenant` is empty.
  static Meta Bearer(const std::string& token, std::string tenant = "") {
    Meta m{{}, {absl::StrCat("Bearer ", token)}};
    if (!tenant.empty()) m.tenants.push_back(std::move(tenant));
    return m;
  }
};

#define ASSERT_OK(status) ASSERT_TRUE((status).ok()) << (status).error_message()

struct Row {
  std::string name;
  std::function<grpc::Status()> call;
  grpc::StatusCode code;
  std::vector<std::string> message;  // substrings, numbers included
};

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandLine flags;
    flags.listen = {"127.0.0.1:0"};
    flags.block_size = kBlockSize;
    flags.kv_budget = absl::StrCat(kBudgetBlocks * kBlockBytes, "B");
    absl::StatusOr<ServerConfig> config = LoadServerConfig(flags);
    ASSERT_TRUE(config.ok()) << config.status();
    ASSERT_NO_FATAL_FAILURE(Start(*std::move(config)));
    Fill();
  }

  void Start(ServerConfig config) {
    config.cache.clock = &clock_;
    config.max_message_bytes = kMaxMessage;
    CacheLimits& l = config.cache.limits;
    l.max_tokens_per_request = 64;
    l.max_block_ids_per_request = 8;
    l.max_namespaces_per_tenant = 2;
    l.max_tenants = 4;
    l.max_leases_per_tenant = 3;
    l.max_namespace_bytes = 16;
    l.max_lease_ttl = absl::Hours(1);
    absl::StatusOr<std::unique_ptr<Server>> server =
        Server::Start(std::move(config));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::PrefixCache::NewStub(grpc::CreateChannel(
        server_->addresses()[0], grpc::InsecureChannelCredentials()));
  }

  // Every limit is reached and every block pinned except budget room for
  // one more: tenant a has 2 namespaces and 3 leases, four tenants exist.
  void Fill() {
    v1::InsertResponse ir;
    ASSERT_OK(
        Insert(InsertReq(Tokens(0, 12), {101, 102, 103}, "", true), "a", &ir));
    a_lease_ = ir.lease_id();
    ASSERT_OK(Insert(InsertReq(Tokens(100, 4), {111}, "x", true), "a", &ir));
    v1::MatchResponse mr;
    ASSERT_OK(Match(MatchReq(Tokens(0, 8), "", true), "a", &mr));
    ASSERT_EQ(mr.matched_tokens(), 8u);
    ASSERT_OK(Insert(InsertReq(Tokens(0, 8), {201, 202}, "", true), "b", &ir));
    b_lease_ = ir.lease_id();
    ASSERT_OK(Insert(InsertReq(Tokens(50, 4), {301}, "", true), "c", &ir));
    ASSERT_OK(Match(MatchReq(Tokens(7, 4)), "d", &mr));  // creates tenant d
    v1::StatsRequest all;
    all.set_all_tenants(true);
    v1::StatsResponse stats;
    ASSERT_OK(Call(&Stub::Stats, all, &stats, {}));
    ASSERT_EQ(stats.tenants_size(), 4);
    ASSERT_EQ(stats.tenants(0).active_leases(), 3u);
    ASSERT_EQ(stats.tenants(0).namespaces(), 2u);
  }

  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                 const Req&, Resp*),
                    const Req& req, Resp* resp, const Meta& meta) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    for (const std::string& t : meta.tenants)
      ctx.AddMetadata("x-prefixd-tenant", t);
    for (const std::string& a : meta.auth) ctx.AddMetadata("authorization", a);
    return ((*stub_).*method)(&ctx, req, resp);
  }

  // A call whose response is dropped (the row only checks the status).
  template <typename Req, typename Resp>
  std::function<grpc::Status()> Rpc(
      grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
      Req req, Meta meta = Meta::Tenant("a")) {
    return [this, method, req = std::move(req), meta = std::move(meta)] {
      Resp resp;
      return Call(method, req, &resp, meta);
    };
  }

  grpc::Status Insert(const v1::InsertRequest& req, const std::string& tenant,
                      v1::InsertResponse* resp) {
    return Call(&Stub::Insert, req, resp, Meta::Tenant(tenant));
  }
  grpc::Status Match(const v1::MatchRequest& req, const std::string& tenant,
                     v1::MatchResponse* resp) {
    return Call(&Stub::Match, req, resp, Meta::Tenant(tenant));
  }

  // Stats of every tenant, then every namespace's Dump of every tenant, as
  // bytes (deterministic serialization, so equal state is equal bytes).
  std::string State() {
    std::string out;
    auto append = [&out](const google::protobuf::Message& m) {
      std::string bytes;
      google::protobuf::io::StringOutputStream stream(&bytes);
      google::protobuf::io::CodedOutputStream coded(&stream);
      coded.SetSerializationDeterministic(true);
      m.SerializeToCodedStream(&coded);
      coded.Trim();
      absl::StrAppend(&out, m.GetTypeName(), ":", bytes.size(), ":", bytes);
    };
    v1::StatsRequest all;
    all.set_all_tenants(true);
    v1::StatsResponse stats;
    grpc::Status s = Call(&Stub::Stats, all, &stats, reader_);
    EXPECT_TRUE(s.ok()) << s.error_message();
    append(stats);
    for (const v1::TenantStats& t : stats.tenants()) {
      v1::DumpResponse names;
      s = Call(&Stub::Dump, v1::DumpRequest(), &names, ReaderFor(t.tenant()));
      EXPECT_TRUE(s.ok()) << s.error_message();
      for (const std::string& ns : names.namespaces()) {
        v1::DumpRequest req;
        req.set_namespace_(ns);
        v1::DumpResponse dump;
        s = Call(&Stub::Dump, req, &dump, ReaderFor(t.tenant()));
        EXPECT_TRUE(s.ok()) << s.error_message();
        EXPECT_GT(dump.nodes_size(), 0) << t.tenant() << "/" << ns;
        append(dump);
      }
    }
    return out;
  }

  // Each row: its code, its message parts, and no change to the state.
  void RunRows(const std::vector<Row>& rows) {
    for (const Row& row : rows) {
      SCOPED_TRACE(row.name);
      const std::string before = State();
      const grpc::Status s = row.call();
      EXPECT_EQ(s.error_code(), row.code) << s.error_message();
      for (const std::string& part : row.message)
        EXPECT_THAT(s.error_message(), HasSubstr(part));
      EXPECT_TRUE(State() == before) << "state changed";
    }
    EXPECT_TRUE(server_->cache()->CheckInvariants().ok());
  }

  // Who reads the state: nobody in particular with auth off, else an admin.
  Meta ReaderFor(const std::string& tenant) const {
    Meta m = reader_;
    m.tenants = {tenant};
    return m;
  }

  ManualClock clock_;
  Meta reader_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Stub> stub_;
  uint64_t a_lease_ = 0;
  uint64_t b_lease_ = 0;
};

std::string Repeat(char c, int n) { return std::string(n, c); }

TEST_F(BadInputTest, EveryBadRequestGetsItsCodeAndChangesNothing) {
  using grpc::StatusCode;
  constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

  auto match_at = [](int64_t offset) {
    v1::MatchRequest r = MatchReq(Tokens(0, 8));
    r.set_position_offset(offset);
    return r;
  };
  auto insert_at = [](int64_t offset) {
    v1::InsertRequest r = InsertReq(Tokens(900, 4), {901});
    r.set_position_offset(offset);
    return r;
  };
  auto match_ttl = [](uint64_t ms) {
    v1::MatchRequest r = MatchReq(Tokens(0, 8), "", true);
    r.set_lease_ttl_ms(ms);
    return r;
  };
  auto keepalive = [](std::vector<uint64_t> ids) {
    v1::KeepAliveRequest r;
    r.mutable_lease_ids()->Add(ids.begin(), ids.end());
    return r;
  };
  auto release = [](uint64_t id) {
    v1::ReleaseRequest r;
    r.set_lease_id(id);
    return r;
  };
  auto evict = [](uint64_t n) {
    v1::EvictRequest r;
    r.set_blocks(n);
    return r;
  };
  auto invalidate = [](std::vector<uint64_t> ids) {
    v1::InvalidateRequest r;
    r.mutable_block_ids()->Add(ids.begin(), ids.end());
    return r;
  };
  auto handshake = [](std::string fingerprint) {
    v1::HandshakeRequest r;
    r.set_engine_id("engine-7");
    r.set_model_fingerprint(std::move(fingerprint));
    return r;
  };
  v1::ResetRequest reset_both;
  reset_both.set_tenant("b");
  reset_both.set_all(true);
  // 30,000 tokens of 3 bytes each: past the 64 KiB message limit.
  const v1::InsertRequest huge =
      InsertReq(Tokens(1 << 20, 30000), Ids(5000, 7500));

  const std::vector<Row> rows = {
      // --- Match
      {"match: empty tokens",
       Rpc(&Stub::Match, MatchReq({})),
       StatusCode::INVALID_ARGUMENT,
       {"tokens is empty"}},
      {"match: past max_tokens_per_request",
       Rpc(&Stub::Match, MatchReq(Tokens(0, 65))),
       StatusCode::INVALID_ARGUMENT,
       {"65 tokens exceed max_tokens_per_request 64"}},
      {"match: negative position_offset",
       Rpc(&Stub::Match, match_at(-1)),
       StatusCode::INVALID_ARGUMENT,
       {"position_offset -1 is negative"}},
      {"match: most negative position_offset",
       Rpc(&Stub::Match, match_at(kI64Min)),
       StatusCode::INVALID_ARGUMENT,
       {absl::StrCat("position_offset ", kI64Min, " is negative")}},
      {"match: position_offset at max_position",
       Rpc(&Stub::Match, match_at(int64_t{1} << 32)),
       StatusCode::INVALID_ARGUMENT,
       {"position_offset 4294967296 + 8 tokens exceeds max_position "
        "4294967296"}},
      {"match: largest position_offset",
       Rpc(&Stub::Match, match_at(kI64Max)),
       StatusCode::INVALID_ARGUMENT,
       {absl::StrCat("position_offset ", kI64Max, " + 8 tokens")}},
      {"match: namespace past max_namespace_bytes",
       Rpc(&Stub::Match, MatchReq(Tokens(0, 8), Repeat('n', 17))),
       StatusCode::INVALID_ARGUMENT,
       {"namespace of 17 bytes exceeds the limit of 16 bytes"}},
      {"match: namespace with a space",
       Rpc(&Stub::Match, MatchReq(Tokens(0, 8), "lora 1")),
       StatusCode::INVALID_ARGUMENT,
       {"byte 0x20 at offset 4"}},
      {"match: namespace with a NUL byte",
       Rpc(&Stub::Match, MatchReq(Tokens(0, 8), std::string("x\0y", 3))),
       StatusCode::INVALID_ARGUMENT,
       {"byte 0x00 at offset 1"}},
      {"match: namespace in UTF-8",
       Rpc(&Stub::Match, MatchReq(Tokens(0, 8), "caf\xc3\xa9")),
       StatusCode::INVALID_ARGUMENT,
       {"byte 0xc3 at offset 3"}},
      {"match: lease ttl past max_lease_ttl",
       Rpc(&Stub::Match, match_ttl(3600001)),
       StatusCode::INVALID_ARGUMENT,
       {"lease_ttl 1h0.001s exceeds the limit of 1h"}},
      {"match: lease ttl of 2^64-1 ms",
       Rpc(&Stub::Match, match_ttl(kU64Max)),
       StatusCode::INVALID_ARGUMENT,
       {"exceeds the limit of 1h"}},
      {"match: pin past max_leases_per_tenant",
       Rpc(&Stub::Match, MatchReq(Tokens(0, 4), "", true)),
       StatusCode::RESOURCE_EXHAUSTED,
       {"tenant 'a' holds 3 leases", "max_leases_per_tenant"}},
      // --- Insert
      {"insert: empty tokens",
       Rpc(&Stub::Insert, InsertReq({}, {})),
       StatusCode::INVALID_ARGUMENT,
       {"tokens is empty"}},
      {"insert: tokens not whole blocks",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 10), {901, 902, 903})),
       StatusCode::INVALID_ARGUMENT,
       {"10 tokens are not a whole number of blocks of 4"}},
      {"insert: too few block ids",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 8), {901})),
       StatusCode::INVALID_ARGUMENT,
       {"1 block_ids for 8 tokens; block_size 4 needs 2"}},
      {"insert: too many block ids",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 8), {901, 902, 903})),
       StatusCode::INVALID_ARGUMENT,
       {"3 block_ids for 8 tokens; block_size 4 needs 2"}},
      {"insert: block ids but no tokens",
       Rpc(&Stub::Insert, InsertReq({}, {901})),
       StatusCode::INVALID_ARGUMENT,
       {"tokens is empty"}},
      {"insert: repeated block id",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 12), {901, 902, 901})),
       StatusCode::INVALID_ARGUMENT,
       {"block id 901 appears twice in block_ids"}},
      {"insert: id cached by another tenant",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 4), {201})),
       StatusCode::INVALID_ARGUMENT,
       {"block id 201 is already cached"}},
      {"insert: id cached elsewhere in the same tenant",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 8), {901, 103})),
       StatusCode::INVALID_ARGUMENT,
       {"block id 103 is already cached"}},
      {"insert: cached prefix under another id that is cached",
       Rpc(&Stub::Insert, InsertReq(Tokens(0, 8), {111, 102})),
       StatusCode::INVALID_ARGUMENT,
       {"block id 111 is already cached"}},
      {"insert: past max_tokens_per_request",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 68), Ids(901, 17))),
       StatusCode::INVALID_ARGUMENT,
       {"68 tokens exceed max_tokens_per_request 64"}},
      {"insert: past max_block_ids_per_request",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 36), Ids(901, 9))),
       StatusCode::INVALID_ARGUMENT,
       {"9 block_ids exceed max_block_ids_per_request 8"}},
      {"insert: negative position_offset",
       Rpc(&Stub::Insert, insert_at(-4)),
       StatusCode::INVALID_ARGUMENT,
       {"position_offset -4 is negative"}},
      {"insert: position past max_position",
       Rpc(&Stub::Insert, insert_at((int64_t{1} << 32) - 2)),
       StatusCode::INVALID_ARGUMENT,
       {"position_offset 4294967294 + 4 tokens exceeds max_position "
        "4294967296"}},
      {"insert: namespace past max_namespace_bytes",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 4), {901}, Repeat('n', 200))),
       StatusCode::INVALID_ARGUMENT,
       {"namespace of 200 bytes exceeds the limit of 16 bytes"}},
      {"insert: namespace with a tab",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 4), {901}, "a\tb")),
       StatusCode::INVALID_ARGUMENT,
       {"byte 0x09 at offset 1"}},
      {"insert: third namespace past max_namespaces_per_tenant",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 4), {901}, "y")),
       StatusCode::RESOURCE_EXHAUSTED,
       {"tenant 'a' has 2 namespaces, the limit max_namespaces_per_tenant"}},
      {"insert: pin past max_leases_per_tenant",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 4), {901}, "", true)),
       StatusCode::RESOURCE_EXHAUSTED,
       {"tenant 'a' holds 3 leases"}},
      {"insert: budget full of pinned blocks",
       Rpc(&Stub::Insert, InsertReq(Tokens(900, 8), {901, 902}, "", false),
           Meta::Tenant("c")),
       StatusCode::RESOURCE_EXHAUSTED,
       {"budget is 8 blocks: 7 cached (7 pinned), this insert adds 2, and "
        "only 0 can be evicted"}},
      {"insert: past max_message_size",
       Rpc(&Stub::Insert, huge),
       StatusCode::RESOURCE_EXHAUSTED,
       {"larger than max", absl::StrCat(kMaxMessage)}},
      // --- Leases
      {"release: unknown lease",
       Rpc(&Stub::Release, release(0xdeadbeef)),
       StatusCode::NOT_FOUND,
       {"lease 00000000deadbeef not found"}},
      {"release: lease 0",
       Rpc(&Stub::Release, release(0)),
       StatusCode::NOT_FOUND,
       {"lease 0000000000000000 not found"}},
      {"release: another tenant's lease",
       [&] { return Rpc(&Stub::Release, release(b_lease_))(); },
       StatusCode::NOT_FOUND,
       {"not found (never issued, expired or released)"}},
      {"keepalive: empty",
       Rpc(&Stub::KeepAlive, keepalive({})),
       StatusCode::INVALID_ARGUMENT,
       {"lease_ids is empty"}},
      {"keepalive: one unknown among known",
       [&] { return Rpc(&Stub::KeepAlive, keepalive({a_lease_, 0xabc}))(); },
       StatusCode::NOT_FOUND,
       {"lease 0000000000000abc not found"}},
      {"keepalive: another tenant's lease",
       [&] { return Rpc(&Stub::KeepAlive, keepalive({b_lease_}))(); },
       StatusCode::NOT_FOUND,
       {"not found"}},
      {"keepalive: past max_leases_per_tenant",
       Rpc(&Stub::KeepAlive, keepalive({1, 2, 3, 4})),
       StatusCode::INVALID_ARGUMENT,
       {"4 lease_ids exceed max_leases_per_tenant 3"}},
      // --- Evict, Invalidate, Reset
      {"evict: 0 blocks",
       Rpc(&Stub::Evict, evict(0)),
       StatusCode::INVALID_ARGUMENT,
       {"blocks is 0"}},
      {"evict: 2^64-1 blocks",
       Rpc(&Stub::Evict, evict(kU64Max)),
       StatusCode::INVALID_ARGUMENT,
       {"blocks 18446744073709551615 exceeds max_block_ids_per_request 8"}},
      {"invalidate: empty",
       Rpc(&Stub::Invalidate, invalidate({})),
       StatusCode::INVALID_ARGUMENT,
       {"block_ids is empty"}},
      {"invalidate: unknown ids",
       Rpc(&Stub::Invalidate, invalidate({999, 998})),
       StatusCode::NOT_FOUND,
       {"2 of 2 block ids are not cached: 999, 998"}},
      {"invalidate: one unknown among cached",
       Rpc(&Stub::Invalidate, invalidate({101, 997, 202})),
       StatusCode::NOT_FOUND,
       {"1 of 3 block ids are not cached: 997"}},
      {"invalidate: past max_block_ids_per_request",
       Rpc(&Stub::Invalidate, invalidate(Ids(101, 9))),
       StatusCode::INVALID_ARGUMENT,
       {"9 block_ids exceed max_block_ids_per_request 8"}},
      {"reset: a tenant and all",
       Rpc(&Stub::Reset, reset_both),
       StatusCode::INVALID_ARGUMENT,
       {"Reset names tenant \"b\" and all=true"}},
      // --- Handshake
      {"handshake: no fingerprint",
       Rpc(&Stub::Handshake, handshake("")),
       StatusCode::INVALID_ARGUMENT,
       {"model_fingerprint is empty"}},
      {"handshake: another fingerprint",
       Rpc(&Stub::Handshake, handshake("00000000000000ff")),
       StatusCode::FAILED_PRECONDITION,
       {"engine \"engine-7\" sent 00000000000000ff"}},
      // --- Metadata
      {"tenant header past max_namespace_bytes",
       Rpc(&Stub::Match, MatchReq(Tokens(0, 8)), Meta::Tenant(Repeat('t', 40))),
       StatusCode::INVALID_ARGUMENT,
       {"of 40 bytes exceeds the limit of 16"}},
      {"tenant header with a space",
       Rpc(&Stub::Match, MatchReq(Tokens(0, 8)), Meta::Tenant("ten ant")),
       StatusCode::INVALID_ARGUMENT,
       {"byte 0x20 at offset 3"}},
      {"tenant header twice",
       Rpc(&Stub::Match, MatchReq(Tokens(0, 8)), Meta{{"a", "b"}, {}}),
       StatusCode::INVALID_ARGUMENT,
       {"metadata x-prefixd-tenant is given 2 times"}},
      {"a fifth tenant past max_tenants",
       Rpc(&Stub::Match, MatchReq(Tokens(0, 8)), Meta::Tenant("e")),
       StatusCode::RESOURCE_EXHAUSTED,
       {"tenant 'e' cannot be created: max_tenants 4 reached"}},
  };
  ASSERT_GE(rows.size(), 30u);
  RunRows(rows);
}

// Auth TOKEN (server/auth.h): tenant principals alice (tenant a) and bob
// (b), an engine for a and b, an admin; tenants a and b configured, no
// dynamic tenants. Plaintext on loopback TCP, as a test may.
class CredentialsTest : public BadInputTest {
 protected:
  void SetUp() override {
    std::string text =
        absl::StrCat("listen: \"127.0.0.1:0\"\nblock_size: ", kBlockSize,
                     "\nkv_budget: \"", kBudgetBlocks * kBlockBytes, "B",
                     "\"\nauth { mode: TOKEN }\n"
                     "tenants { name: \"a\" }\ntenants { name: \"b\" }\n");
    for (auto [name, role, tenants] :
         {std::tuple{"alice", "TENANT", "\"a\""},
          std::tuple{"bob", "TENANT", "\"b\""},
          std::tuple{"engine", "ENGINE", "[\"a\", \"b\"]"},
          std::tuple{"ops", "ADMIN", "[]"}}) {
      absl::StrAppend(&text, "principals { name: \"", name, "\" role: ", role,
                      " tenants: ", tenants, " token_sha256: \"",
                      Sha256Hex(absl::StrCat(name, "-token")), "\" }\n");
    }
    v1::Config proto;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &proto));
    FillDefaults(&proto);
    absl::StatusOr<ServerConfig> config = ResolveConfig(proto);
    ASSERT_TRUE(config.ok()) << config.status();
    reader_ = Meta::Bearer("ops-token");
    ASSERT_NO_FATAL_FAILURE(Start(*std::move(config)));
    v1::InsertResponse ir;
    ASSERT_OK(Call(&Stub::Insert, InsertReq(Tokens(0, 8), {101, 102}, "", true),
                   &ir, Meta::Bearer("alice-token")));
    ASSERT_OK(Call(&Stub::Insert, InsertReq(Tokens(0, 8), {201, 202}, "", true),
                   &ir, Meta::Bearer("bob-token")));
    b_lease_ = ir.lease_id();
  }
};

TEST_F(CredentialsTest, MissingOrWrongCredentialsAndForeignTenants) {
  using grpc::StatusCode;
  const Meta alice = Meta::Bearer("alice-token");
  v1::StatsRequest stats_all;
  stats_all.set_all_tenants(true);
  v1::ResetRequest reset_all;
  reset_all.set_all(true);
  v1::ResetRequest reset_b;
  reset_b.set_tenant("b");
  v1::InvalidateRequest invalidate_bobs;
  invalidate_bobs.add_block_ids(201);
  v1::ReleaseRequest release_bobs;
  const v1::MatchRequest match = MatchReq(Tokens(0, 8));
  const std::vector<Row> rows = {
      {"no credentials",
       Rpc(&Stub::Match, match, Meta{}),
       StatusCode::UNAUTHENTICATED,
       {"no credentials: send metadata \"authorization: Bearer <token>\""}},
      {"no credentials, with a tenant",
       Rpc(&Stub::Insert, InsertReq(Tokens(0, 4), {9}), Meta::Tenant("a")),
       StatusCode::UNAUTHENTICATED,
       {"no credentials"}},
      {"a wrong token",
       Rpc(&Stub::Match, match, Meta::Bearer("alice-tokem")),
       StatusCode::UNAUTHENTICATED,
       {"the bearer token is not valid"}},
      {"another scheme",
       Rpc(&Stub::Match, match, Meta{{}, {"Basic YTpi"}}),
       StatusCode::UNAUTHENTICATED,
       {"must be \"Bearer <token>\""}},
      {"an empty bearer token",
       Rpc(&Stub::Match, match, Meta{{}, {"Bearer  "}}),
       StatusCode::UNAUTHENTICATED,
       {"empty bearer token"}},
      {"two authorization values",
       Rpc(&Stub::Match, match,
           Meta{{}, {"Bearer alice-token", "Bearer bob-token"}}),
       StatusCode::UNAUTHENTICATED,
       {"is given 2 times"}},
      {"a tenant principal naming another tenant",
       Rpc(&Stub::Match, match, Meta::Bearer("alice-token", "b")),
       StatusCode::PERMISSION_DENIED,
       {"alice", "\"b\""}},
      {"a tenant principal reading every tenant's stats",
       Rpc(&Stub::Stats, stats_all, alice),
       StatusCode::PERMISSION_DENIED,
       {"principal \"alice\" may not read the stats of all tenants"}},
      {"a tenant principal resetting every tenant",
       Rpc(&Stub::Reset, reset_all, alice),
       StatusCode::PERMISSION_DENIED,
       {"principal \"alice\" may not reset all tenants"}},
      {"a tenant principal resetting another tenant",
       Rpc(&Stub::Reset, reset_b, alice),
       StatusCode::PERMISSION_DENIED,
       {"principal \"alice\" may not reset tenant \"b\""}},
      {"invalidating another tenant's block",
       Rpc(&Stub::Invalidate, invalidate_bobs, alice),
       StatusCode::NOT_FOUND,
       {"1 of 1 block ids are not cached: 201"}},
      {"releasing another tenant's lease",
       [&] {
         release_bobs.set_lease_id(b_lease_);
         return Rpc(&Stub::Release, release_bobs, alice)();
       },
       StatusCode::NOT_FOUND,
       {"not found"}},
      {"an engine for two tenants naming none",
       Rpc(&Stub::Match, match, Meta::Bearer("engine-token")),
       StatusCode::INVALID_ARGUMENT,
       {"x-prefixd-tenant"}},
      {"an admin naming a tenant that is not configured",
       Rpc(&Stub::Match, match, Meta::Bearer("ops-token", "zed")),
       StatusCode::PERMISSION_DENIED,
       {"zed"}},
  };
  RunRows(rows);
}

}  // namespace
}  // namespace prefixd
