// Tenant isolation over real gRPC (docs/security.md): an in-process prefixd on
// a TCP port with TLS (certificates made by tests/security/pki.h with the
// openssl command line) and a Unix socket, driven by prefixd::Client. Every
// test runs in both authenticated modes:
//   TOKEN  TLS server certificate, principals by bearer token;
//   MTLS   principals by client certificate (the CA must have signed it).
//
// Principals: app-a (TENANT a), app-b (TENANT b), engine-ac (ENGINE a and c),
// ops (ADMIN). Tenant A is app-a and tenant B is app-b throughout.
//
// Nothing here sleeps: waits are bounded by call deadlines.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/server.h"
#include "server/test_server.h"
#include "tests/security/pki.h"

namespace prefixd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAreArray;

constexpr int kBlockSize = 4;
constexpr uint64_t kBlockBytes = kBlockSize * 131072;  // llama-3-8b fp16
constexpr uint64_t kBudgetBlocks = 32;

enum class Mode { kToken, kMtls };

std::string ModeName(const ::testing::TestParamInfo<Mode>& info) {
  return info.param == Mode::kToken ? "Token" : "Mtls";
}

struct Principal {
  const char* name;
  const char* role;
  const char* tenants;                // textproto list body
  const char* cert_subject;           // MTLS: full subject or common name
  const char* cache_salts = nullptr;  // textproto list body, if any
};

// app-a by its full subject (RFC 2253, as gRPC reports it), the others by
// common name.
constexpr Principal kPrincipals[] = {
    {"app-a", "TENANT", "\"a\"", "CN=app-a,O=prefixd test",
     "[\"salt-a\", \"salt-a2\"]"},
    {"app-b", "TENANT", "\"b\"", "app-b"},
    {"engine-ac", "ENGINE", "[\"a\", \"c\"]", "engine-ac"},
    {"ops", "ADMIN", "[]", "ops"},
};

std::string TokenOf(absl::string_view principal) {
  return absl::StrCat("token-of-", principal, "-9f2c");
}

std::vector<uint32_t> Tokens(uint32_t first, int blocks) {
  std::vector<uint32_t> t(blocks * kBlockSize);
  for (size_t i = 0; i < t.size(); ++i) t[i] = first + static_cast<uint32_t>(i);
  return t;
}

std::vector<uint64_t> Ids(uint64_t first, int n) {
  std::vector<uint64_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = first + i;
  return ids;
}

template <typename T>
std::vector<T> Vec(const google::protobuf::RepeatedField<T>& f) {
  return std::vector<T>(f.begin(), f.end());
}

const v1::TenantStats* FindTenant(const v1::StatsResponse& s,
                                  absl::string_view tenant) {
  for (const v1::TenantStats& t : s.tenants())
    if (t.tenant() == tenant) return &t;
  return nullptr;
}

uint64_t Evicted(const v1::TenantStats& t) {
  uint64_t n = 0;
  for (const v1::EvictionCount& e : t.evictions()) n += e.blocks();
  return n;
}

#define ASSERT_OK_AND_MOVE(lhs, expr)                               \
  auto lhs##_or = (expr);                                           \
  ASSERT_TRUE(lhs##_or.ok()) << #expr << ": " << lhs##_or.status(); \
  auto lhs = *std::move(lhs##_or)

#define EXPECT_CODE(expr, code_)                                   \
  do {                                                             \
    const absl::Status status_ = (expr);                           \
    EXPECT_EQ(status_.code(), absl::StatusCode::code_) << status_; \
  } while (0)

#define EXPECT_OK_STATUS(expr)            \
  do {                                    \
    const absl::Status status_ = (expr);  \
    EXPECT_TRUE(status_.ok()) << status_; \
  } while (0)

const testing::Pki& TestPki();

// Removes the PKI's directory when the binary is done (if it made one).
class PkiCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    if (made_) std::filesystem::remove_all(TestPki().dir());
  }
  static inline bool made_ = false;
};
[[maybe_unused]] const ::testing::Environment* const kPkiCleanup =
    ::testing::AddGlobalTestEnvironment(new PkiCleanup);

// The PKI is made once for the whole binary.
const testing::Pki& TestPki() {
  static const testing::Pki* pki = [] {
    absl::StatusOr<testing::Pki> p = testing::Pki::Create(::testing::TempDir());
    if (!p.ok()) {
      std::fprintf(stderr, "cannot make test certificates: %s\n",
                   std::string(p.status().message()).c_str());
      std::abort();
    }
    PkiCleanup::made_ = true;
    return new testing::Pki(*std::move(p));
  }();
  return *pki;
}

const testing::CertFiles& ClientCert(const std::string& cn,
                                     bool rogue = false) {
  static auto* certs = new std::map<std::string, testing::CertFiles>;
  const std::string key = absl::StrCat(rogue ? "rogue/" : "", cn);
  auto it = certs->find(key);
  if (it == certs->end()) {
    absl::StatusOr<testing::CertFiles> c = TestPki().Client(cn, rogue);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", std::string(c.status().message()).c_str());
      std::abort();
    }
    it = certs->emplace(key, *std::move(c)).first;
  }
  return it->second;
}

class SecurityTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override { StartServer(""); }
  void TearDown() override { test_server_.Stop(); }

  // `tenant_quota` is the body of every tenants { } after its name.
  void StartServer(const std::string& tenant_quota,
                   const std::string& extra = "") {
    const testing::Pki& pki = TestPki();
    const bool mtls = GetParam() == Mode::kMtls;
    std::string text = absl::StrCat(
        "block_size: ", kBlockSize, "\n", "kv_budget: \"",
        kBudgetBlocks * kBlockBytes, "B\"\n",
        "auth { mode: ", mtls ? "MTLS" : "TOKEN", " tls_cert_path: \"",
        pki.server().cert, "\" tls_key_path: \"", pki.server().key, "\"",
        mtls ? absl::StrCat(" client_ca_path: \"", pki.ca(), "\"") : "",
        " }\n");
    for (const char* t : {"a", "b", "c"})
      absl::StrAppend(&text, "tenants { name: \"", t, "\" ", tenant_quota,
                      " }\n");
    for (const Principal& p : kPrincipals) {
      absl::StrAppend(
          &text, "principals { name: \"", p.name, "\" role: ", p.role,
          " tenants: ", p.tenants, " token_sha256: \"",
          Sha256Hex(TokenOf(p.name)), "\"",
          mtls ? absl::StrCat(" cert_subject: \"", p.cert_subject, "\"") : "",
          p.cache_salts != nullptr
              ? absl::StrCat(" cache_salts: ", p.cache_salts)
              : "",
          " }\n");
    }
    absl::StrAppend(&text, extra);
    absl::StatusOr<ServerConfig> config = TestServer::Config(text);
    ASSERT_TRUE(config.ok()) << config.status() << "\n" << text;
    absl::Status started = test_server_.Start(*std::move(config));
    ASSERT_TRUE(started.ok()) << started;
    server_ = &test_server_.server();
    ASSERT_EQ(server_->addresses().size(), 2u);
  }

  const std::string& tcp() const {
    return test_server_.address(TestServer::Transport::kTcp);
  }
  const std::string& unix_socket() const {
    return test_server_.address(TestServer::Transport::kUnix);
  }

  // Options that present `principal`'s credential for this mode over TLS.
  ClientOptions As(const std::string& principal,
                   const std::string& tenant = "") const {
    ClientOptions o;
    o.deadline = absl::Seconds(10);
    o.tenant = tenant;
    o.tls_ca_file = TestPki().ca();
    if (GetParam() == Mode::kMtls) {
      const testing::CertFiles& c = ClientCert(principal);
      o.tls_cert_file = c.cert;
      o.tls_key_file = c.key;
    } else {
      o.token = TokenOf(principal);
    }
    return o;
  }

  std::unique_ptr<Client> Dial(const std::string& target,
                               const ClientOptions& options) {
    absl::StatusOr<std::unique_ptr<Client>> c =
        Client::Connect(target, options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  std::unique_ptr<Client> Connect(const std::string& principal,
                                  const std::string& tenant = "") {
    return Dial(tcp(), As(principal, tenant));
  }

  // A and B, as most tests use them.
  void ConnectAB() {
    a_ = Connect("app-a");
    b_ = Connect("app-b");
    ops_a_ = Connect("ops", "a");
    ops_b_ = Connect("ops", "b");
  }

  v1::StatsResponse StatsOf(Client* c, bool all = false) {
    absl::StatusOr<v1::StatsResponse> s = c->Stats(all);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : v1::StatsResponse();
  }

  // The tree of a tenant without recency stamps (a Match moves those).
  std::vector<std::string> Tree(Client* c, const std::string& ns = "") {
    absl::StatusOr<v1::DumpResponse> d = c->Dump(ns);
    EXPECT_TRUE(d.ok()) << d.status();
    std::vector<std::string> out;
    if (!d.ok()) return out;
    for (v1::DumpNode n : d->nodes()) {
      n.clear_stamp();
      out.push_back(n.ShortDebugString());
    }
    return out;
  }

  TestServer test_server_;
  Server* server_ = nullptr;  // test_server_'s
  std::unique_ptr<Client> a_, b_, ops_a_, ops_b_;
};

// --- 1. Paired: the positive control and its mirror ------------------------

TEST_P(SecurityTest, PairedHitForOwnerMissForOtherTenant) {
  ConnectAB();
  const std::vector<uint32_t> p = Tokens(100, 4);
  PrefixOptions pin;
  pin.pin = true;
  ASSERT_OK_AND_MOVE(ins_a, a_->Insert(p, Ids(1000, 4), pin));
  EXPECT_EQ(ins_a.response.cached_tokens(), 0u);
  ASSERT_TRUE(ins_a.lease.valid());

  // Positive control: A hits on P with its own blocks.
  ASSERT_OK_AND_MOVE(hit, a_->Match(p));
  EXPECT_EQ(hit.matched_tokens(), p.size());
  EXPECT_THAT(hit.block_ids(), ElementsAreArray(Ids(1000, 4)));
  const std::vector<std::string> tree_a = Tree(a_.get());
  const v1::TenantStats stats_a = *FindTenant(StatsOf(a_.get()), "a");

  // B sees nothing of it.
  ASSERT_OK_AND_MOVE(miss, b_->Match(p, pin));
  EXPECT_EQ(miss.matched_tokens(), 0u);
  EXPECT_THAT(miss.response.segments(), IsEmpty());
  EXPECT_EQ(miss.response.lease_id(), 0u);
  EXPECT_FALSE(miss.lease.valid());

  // B inserts P: its own IDs are adopted, none is redundant.
  ASSERT_OK_AND_MOVE(ins_b, b_->Insert(p, Ids(2000, 4), pin));
  EXPECT_EQ(ins_b.response.cached_tokens(), 0u);
  EXPECT_THAT(ins_b.response.redundant_block_ids(), IsEmpty());
  EXPECT_THAT(ins_b.response.evicted_block_ids(), IsEmpty());
  ASSERT_OK_AND_MOVE(hit_b, b_->Match(p));
  EXPECT_THAT(hit_b.block_ids(), ElementsAreArray(Ids(2000, 4)));

  // A's blocks and lease are as they were.
  ASSERT_OK_AND_MOVE(hit_again, a_->Match(p));
  EXPECT_THAT(hit_again.block_ids(), ElementsAreArray(Ids(1000, 4)));
  EXPECT_EQ(Tree(a_.get()), tree_a);
  ASSERT_OK_AND_MOVE(left, ins_a.lease.KeepAlive());
  EXPECT_GT(left, absl::ZeroDuration());
  const v1::TenantStats now_a = *FindTenant(StatsOf(a_.get()), "a");
  EXPECT_EQ(now_a.cached_blocks(), stats_a.cached_blocks());
  EXPECT_EQ(now_a.pinned_blocks(), stats_a.pinned_blocks());
  EXPECT_EQ(now_a.active_leases(), 1u);
  EXPECT_EQ(now_a.inserted_blocks(), 4u);
  EXPECT_EQ(Evicted(now_a), 0u);
}

TEST_P(SecurityTest, BatchesAreAsIsolatedAsSingleCalls) {
  ConnectAB();
  const std::vector<uint32_t> p = Tokens(600, 2);
  v1::InsertBatchRequest ins;
  v1::InsertRequest* one = ins.add_requests();
  one->mutable_tokens()->Add(p.begin(), p.end());
  for (uint64_t id : Ids(6000, 2)) one->add_block_ids(id);
  ASSERT_OK_AND_MOVE(ins_a, a_->InsertBatch(ins));
  ASSERT_EQ(ins_a.results_size(), 1);
  EXPECT_EQ(ins_a.results(0).code(), 0) << ins_a.results(0).message();

  v1::MatchBatchRequest match;
  match.add_requests()->mutable_tokens()->Add(p.begin(), p.end());
  ASSERT_OK_AND_MOVE(hit, a_->MatchBatch(match));  // the positive control
  EXPECT_EQ(hit.results(0).response().matched_tokens(), p.size());
  ASSERT_OK_AND_MOVE(miss, b_->MatchBatch(match));
  EXPECT_EQ(miss.results(0).code(), 0) << miss.results(0).message();
  EXPECT_EQ(miss.results(0).response().matched_tokens(), 0u);
  EXPECT_THAT(miss.results(0).response().segments(), IsEmpty());

  // B's batch insert of the same prefix adopts B's own IDs.
  for (int i = 0; i < 2; ++i) one->set_block_ids(i, 7000 + i);
  ASSERT_OK_AND_MOVE(ins_b, b_->InsertBatch(ins));
  EXPECT_EQ(ins_b.results(0).code(), 0) << ins_b.results(0).message();
  EXPECT_EQ(ins_b.results(0).response().cached_tokens(), 0u);
  EXPECT_THAT(ins_b.results(0).response().redundant_block_ids(), IsEmpty());

  // A's credential naming B is refused for the whole batch.
  EXPECT_CODE(Connect("app-a", "b")->MatchBatch(match).status(),
              kPermissionDenied);
  EXPECT_CODE(Connect("engine-ac")->MatchBatch(match).status(),
              kInvalidArgument);
}

// --- 2. Impersonation -------------------------------------------------------

TEST_P(SecurityTest, TenantCredentialNamingAnotherTenantIsRefused) {
  ConnectAB();
  std::unique_ptr<Client> a_as_b = Connect("app-a", "b");
  const std::vector<uint32_t> p = Tokens(300, 2);
  ASSERT_TRUE(b_->Insert(p, Ids(3000, 2)).ok());
  const v1::TenantStats before = *FindTenant(StatsOf(b_.get()), "b");

  absl::StatusOr<Client::MatchResult> m = a_as_b->Match(p);
  EXPECT_CODE(m.status(), kPermissionDenied);
  EXPECT_THAT(
      m.status().message(),
      AllOf(HasSubstr("\"app-a\""), HasSubstr("\"a\""), HasSubstr("\"b\"")));
  EXPECT_CODE(a_as_b->Insert(Tokens(400, 1), Ids(4000, 1)).status(),
              kPermissionDenied);
  EXPECT_CODE(a_as_b->Stats().status(), kPermissionDenied);
  EXPECT_CODE(a_as_b->Dump().status(), kPermissionDenied);
  EXPECT_CODE(a_as_b->Reset().status(), kPermissionDenied);
  EXPECT_CODE(a_->Reset("b").status(), kPermissionDenied);
  EXPECT_CODE(a_->Reset("", /*all=*/true).status(), kPermissionDenied);
  EXPECT_CODE(a_->Stats(/*all_tenants=*/true).status(), kPermissionDenied);

  // Nothing happened to B: same blocks, no lookups or inserts counted.
  const v1::TenantStats after = *FindTenant(StatsOf(b_.get()), "b");
  EXPECT_EQ(after.ShortDebugString(), before.ShortDebugString());
  ASSERT_OK_AND_MOVE(still, b_->Match(p));
  EXPECT_THAT(still.block_ids(), ElementsAreArray(Ids(3000, 2)));
}

TEST_P(SecurityTest, EngineActsOnlyForTheTenantsInItsList) {
  std::unique_ptr<Client> to_b = Connect("engine-ac", "b");
  absl::StatusOr<Client::MatchResult> m = to_b->Match(Tokens(1, 1));
  EXPECT_CODE(m.status(), kPermissionDenied);
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("\"engine-ac\""), HasSubstr("\"b\"")));
  EXPECT_CODE(to_b->Insert(Tokens(1, 1), Ids(1, 1)).status(),
              kPermissionDenied);

  // In its list: served.
  std::unique_ptr<Client> to_c = Connect("engine-ac", "c");
  ASSERT_TRUE(to_c->Insert(Tokens(1, 1), Ids(1, 1)).ok());
  std::unique_ptr<Client> c_reader = Connect("ops", "c");
  EXPECT_EQ(FindTenant(StatsOf(c_reader.get()), "c")->cached_blocks(), 1u);

  // No header with two tenants: single-tenant calls must name one; calls
  // over all of its tenants need none.
  std::unique_ptr<Client> unnamed = Connect("engine-ac");
  absl::StatusOr<Client::MatchResult> none = unnamed->Match(Tokens(1, 1));
  EXPECT_CODE(none.status(), kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr(kTenantHeader));
  EXPECT_TRUE(unnamed->GetInfo().ok());
  ASSERT_OK_AND_MOVE(evicted, unnamed->Evict(10));
  EXPECT_THAT(evicted, ElementsAre(1u));

  // A tenant that is not configured (dynamic tenants are off).
  std::unique_ptr<Client> zeta = Connect("ops", "zeta");
  absl::StatusOr<Client::MatchResult> z = zeta->Match(Tokens(1, 1));
  EXPECT_CODE(z.status(), kPermissionDenied);
  EXPECT_THAT(z.status().message(), HasSubstr("\"zeta\" is not configured"));
}

TEST_P(SecurityTest, DynamicTenantsTakeTheDefaultQuotaUpToMaxTenants) {
  const uint64_t limit = 4 * kBlockBytes;
  StartServer("", absl::StrCat("dynamic_tenants { enabled: true limit: \"",
                               limit, "\" }\nlimits { max_tenants: 4 }\n"));
  std::unique_ptr<Client> d = Connect("ops", "d");
  ASSERT_TRUE(d->Insert(Tokens(1, 1), Ids(1, 1)).ok());
  const v1::StatsResponse all = StatsOf(d.get());  // outlives `stats`
  const v1::TenantStats* stats = FindTenant(all, "d");
  ASSERT_NE(stats, nullptr);
  EXPECT_EQ(stats->limit_bytes(), limit);
  EXPECT_EQ(stats->reserved_bytes(), 0u);
  // a, b, c and d exist: a fifth is refused.
  absl::Status e = Connect("ops", "e")->Match(Tokens(1, 1)).status();
  EXPECT_CODE(e, kResourceExhausted);
  EXPECT_THAT(e.message(), HasSubstr("max_tenants 4"));
  // Dynamic tenants do not widen an engine's list.
  EXPECT_CODE(Connect("engine-ac", "d")->Match(Tokens(1, 1)).status(),
              kPermissionDenied);
}

// Messages of refused credentials never name a principal.
void ExpectNoPrincipalNamed(const absl::Status& s) {
  for (const Principal& p : kPrincipals)
    EXPECT_THAT(s.message(), Not(HasSubstr(p.name))) << s;
}

TEST_P(SecurityTest, MissingOrWrongCredentialsAreUnauthenticated) {
  // Over the Unix socket (plaintext, either mode): tokens only.
  ClientOptions plain;
  plain.deadline = absl::Seconds(10);
  std::unique_ptr<Client> nobody = Dial(unix_socket(), plain);
  absl::Status s = nobody->Match(Tokens(1, 1)).status();
  EXPECT_CODE(s, kUnauthenticated);
  ExpectNoPrincipalNamed(s);
  EXPECT_CODE(nobody->GetInfo().status(), kUnauthenticated);
  EXPECT_CODE(nobody->WatchEvents(0, absl::Seconds(10))->Finish(),
              kUnauthenticated);

  plain.token = "token-of-app-a-9f2d";  // one character off
  s = Dial(unix_socket(), plain)->Match(Tokens(1, 1)).status();
  EXPECT_CODE(s, kUnauthenticated);
  ExpectNoPrincipalNamed(s);
  plain.token = Sha256Hex(TokenOf("app-a"));  // the stored hash is no token
  EXPECT_CODE(Dial(unix_socket(), plain)->Match(Tokens(1, 1)).status(),
              kUnauthenticated);

  plain.token = TokenOf("app-a");
  ASSERT_TRUE(Dial(unix_socket(), plain)->Insert(Tokens(1, 1), Ids(1, 1)).ok());
  ASSERT_OK_AND_MOVE(hit, Connect("app-a")->Match(Tokens(1, 1)));
  EXPECT_EQ(hit.matched_tokens(), static_cast<uint64_t>(kBlockSize));

  if (GetParam() == Mode::kToken) {
    // TLS without a token, or with a wrong one.
    ClientOptions o = As("app-a");
    o.token.clear();
    s = Dial(tcp(), o)->Match(Tokens(1, 1)).status();
    EXPECT_CODE(s, kUnauthenticated);
    ExpectNoPrincipalNamed(s);
    o.token = "guess";
    s = Dial(tcp(), o)->Match(Tokens(1, 1)).status();
    EXPECT_CODE(s, kUnauthenticated);
    ExpectNoPrincipalNamed(s);
  }
}

TEST_P(SecurityTest, TcpNeedsTlsAndTheRightCa) {
  // Plaintext to the TLS port.
  ClientOptions plain = As("app-a");
  plain.tls_ca_file.clear();
  plain.tls_cert_file.clear();
  plain.tls_key_file.clear();
  plain.token = TokenOf("app-a");
  plain.deadline = absl::Seconds(5);
  EXPECT_CODE(Dial(tcp(), plain)->Match(Tokens(1, 1)).status(), kUnavailable);
  // A client that trusts another CA than the one that signed the server.
  ClientOptions wrong_ca = As("app-a");
  wrong_ca.tls_ca_file = ClientCert("app-a", /*rogue=*/true).cert;
  wrong_ca.deadline = absl::Seconds(5);
  EXPECT_CODE(Dial(tcp(), wrong_ca)->Match(Tokens(1, 1)).status(),
              kUnavailable);
}

// MTLS only.
class MtlsTest : public SecurityTest {};

TEST_P(MtlsTest, ClientWithoutAValidCertificateCannotConnect) {
  ClientOptions o;
  o.deadline = absl::Seconds(5);
  o.tls_ca_file = TestPki().ca();
  o.token = TokenOf("app-a");  // a token does not replace the certificate
  EXPECT_CODE(Dial(tcp(), o)->Match(Tokens(1, 1)).status(), kUnavailable);
  // A certificate for the same name from a CA the server does not trust.
  const testing::CertFiles& rogue = ClientCert("app-a", /*rogue=*/true);
  o.tls_cert_file = rogue.cert;
  o.tls_key_file = rogue.key;
  EXPECT_CODE(Dial(tcp(), o)->Match(Tokens(1, 1)).status(), kUnavailable);
  // Signed by the CA but mapped to no principal: connects, then refused.
  const testing::CertFiles& stranger = ClientCert("stranger");
  o.tls_cert_file = stranger.cert;
  o.tls_key_file = stranger.key;
  absl::Status s = Dial(tcp(), o)->Match(Tokens(1, 1)).status();
  EXPECT_CODE(s, kUnauthenticated);
  ExpectNoPrincipalNamed(s);
  // With a valid certificate, the certificate decides, not a token.
  ClientOptions b_with_a_token = As("app-b");
  b_with_a_token.token = TokenOf("app-a");
  ASSERT_TRUE(
      Dial(tcp(), b_with_a_token)->Insert(Tokens(1, 1), Ids(1, 1)).ok());
  ASSERT_OK_AND_MOVE(b_hit, Connect("app-b")->Match(Tokens(1, 1)));
  EXPECT_EQ(b_hit.matched_tokens(), static_cast<uint64_t>(kBlockSize));
  ASSERT_OK_AND_MOVE(a_miss, Connect("app-a")->Match(Tokens(1, 1)));
  EXPECT_EQ(a_miss.matched_tokens(), 0u);
}

// --- 3. Handle confusion ----------------------------------------------------

// `message` with every spelling of `id` replaced, so that two NOT_FOUNDs for
// different IDs can be compared.
std::string WithoutId(absl::string_view message, uint64_t id) {
  return absl::StrReplaceAll(message, {{absl::StrFormat("%016x", id), "<id>"},
                                       {absl::StrCat(id), "<id>"}});
}

TEST_P(SecurityTest, AnotherTenantsLeaseIsNotFoundLikeARandomOne) {
  ConnectAB();
  PrefixOptions pin;
  pin.pin = true;
  ASSERT_OK_AND_MOVE(ins, a_->Insert(Tokens(500, 3), Ids(5000, 3), pin));
  const uint64_t lease = ins.lease.id();
  ASSERT_NE(lease, 0u);
  const uint64_t random = lease ^ 0x5a5a5a5a12345678ULL;

  const absl::Status release_a = b_->Release(lease);
  const absl::Status release_r = b_->Release(random);
  EXPECT_CODE(release_a, kNotFound);
  EXPECT_CODE(release_r, kNotFound);
  EXPECT_EQ(WithoutId(release_a.message(), lease),
            WithoutId(release_r.message(), random));
  const std::vector<uint64_t> one = {lease}, other = {random};
  const absl::Status keep_a = b_->KeepAlive(one).status();
  const absl::Status keep_r = b_->KeepAlive(other).status();
  EXPECT_CODE(keep_a, kNotFound);
  EXPECT_EQ(WithoutId(keep_a.message(), lease),
            WithoutId(keep_r.message(), random));

  // Block IDs too: B cannot invalidate A's blocks, and learns only "not
  // cached", exactly as for an ID nobody has.
  const std::vector<uint64_t> a_block = {5001}, no_block = {9999};
  const absl::Status inv_a = b_->Invalidate(a_block).status();
  const absl::Status inv_r = b_->Invalidate(no_block).status();
  EXPECT_CODE(inv_a, kNotFound);
  EXPECT_EQ(WithoutId(inv_a.message(), 5001), WithoutId(inv_r.message(), 9999));
  ASSERT_OK_AND_MOVE(evicted, b_->Evict(100));
  EXPECT_THAT(evicted, IsEmpty());

  // A's lease still holds and pins its blocks.
  ASSERT_OK_AND_MOVE(left, ins.lease.KeepAlive());
  EXPECT_GT(left, absl::ZeroDuration());
  const v1::TenantStats a = *FindTenant(StatsOf(a_.get()), "a");
  EXPECT_EQ(a.pinned_blocks(), 3u);
  EXPECT_EQ(a.cached_blocks(), 3u);
  EXPECT_EQ(a.active_leases(), 1u);
  ASSERT_TRUE(ins.lease.Release().ok());
}

// --- 4. Eviction independence -----------------------------------------------

// B inserts `blocks` blocks in two-block prefixes, unpinned; returns every ID
// it got back as evicted.
std::vector<uint64_t> Flood(Client* b, int blocks) {
  std::vector<uint64_t> evicted;
  for (int i = 0; i < blocks / 2; ++i) {
    absl::StatusOr<Client::InsertResult> r =
        b->Insert(Tokens(1000000 + i * 100, 2), Ids(100000 + 2 * i, 2));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
    evicted.insert(evicted.end(), r->response.evicted_block_ids().begin(),
                   r->response.evicted_block_ids().end());
  }
  return evicted;
}

void ExpectAllOfAStays(Client* a, const std::vector<uint32_t>& p,
                       const std::vector<uint64_t>& ids) {
  absl::StatusOr<Client::MatchResult> m = a->Match(p);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->matched_tokens(), p.size());
  EXPECT_THAT(m->block_ids(), ElementsAreArray(ids));
}

TEST_P(SecurityTest, StrictQuotasFloodingNeverEvictsAnotherTenant) {
  // reserved == limit == a third of the budget for every tenant.
  const uint64_t share = kBudgetBlocks / 3 * kBlockBytes;
  StartServer(absl::StrCat("reserved: \"", share, "\" limit: \"", share, "\""));
  ConnectAB();
  const int a_blocks = static_cast<int>(kBudgetBlocks / 3);
  const std::vector<uint32_t> p = Tokens(7, a_blocks);
  ASSERT_TRUE(a_->Insert(p, Ids(7000, a_blocks)).ok());

  const std::vector<uint64_t> evicted = Flood(b_.get(), 20 * kBudgetBlocks);
  EXPECT_GE(evicted.size(), 19 * kBudgetBlocks);
  for (uint64_t id : evicted) ASSERT_GE(id, 100000u) << "A's block evicted";
  ExpectAllOfAStays(a_.get(), p, Ids(7000, a_blocks));
  const v1::StatsResponse all = StatsOf(ops_a_.get(), /*all=*/true);
  EXPECT_EQ(Evicted(*FindTenant(all, "a")), 0u);
  EXPECT_LE(FindTenant(all, "b")->cached_blocks(), kBudgetBlocks / 3);
}

TEST_P(SecurityTest, WithBorrowingBlocksWithinTheReservationStay) {
  // a and b are guaranteed a quarter each and may borrow up to the budget.
  const uint64_t quarter = kBudgetBlocks / 4 * kBlockBytes;
  StartServer(absl::StrCat("reserved: \"", quarter, "\""));
  ConnectAB();
  const int a_blocks = static_cast<int>(kBudgetBlocks / 4);
  const std::vector<uint32_t> p = Tokens(7, a_blocks);
  ASSERT_TRUE(a_->Insert(p, Ids(7000, a_blocks)).ok());

  const std::vector<uint64_t> evicted = Flood(b_.get(), 20 * kBudgetBlocks);
  for (uint64_t id : evicted) ASSERT_GE(id, 100000u) << "A's block evicted";
  ExpectAllOfAStays(a_.get(), p, Ids(7000, a_blocks));
  const v1::StatsResponse all = StatsOf(ops_a_.get(), /*all=*/true);
  EXPECT_EQ(Evicted(*FindTenant(all, "a")), 0u);
  // B borrowed everything A did not use, c's idle reservation included: a
  // reservation protects blocks a tenant has, it does not hold space free.
  EXPECT_EQ(FindTenant(all, "b")->cached_blocks(), kBudgetBlocks - a_blocks);
}

// With borrowing, B's inserts evict A's blocks. B must not learn A's IDs;
// A's principal gets each of them exactly once, in its next Insert or Evict.
TEST_P(SecurityTest, BudgetEvictionsGoOnlyToAPrincipalOfTheirTenant) {
  StartServer("");  // no reservations: the budget is shared
  ConnectAB();
  const int a_blocks = static_cast<int>(kBudgetBlocks);
  ASSERT_TRUE(a_->Insert(Tokens(7, a_blocks), Ids(7000, a_blocks)).ok());

  const std::vector<uint64_t> b_got = Flood(b_.get(), a_blocks / 2);
  EXPECT_THAT(b_got, IsEmpty()) << "B was handed A's block IDs";
  // A's insert evicts one more of A's (the oldest leaf), and carries the 16
  // that B's inserts evicted.
  absl::StatusOr<Client::InsertResult> next =
      a_->Insert(Tokens(900000, 1), Ids(9000, 1));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(next->response.evicted_block_ids(),
              UnorderedElementsAreArray(
                  Ids(7000 + a_blocks / 2 - 1, a_blocks / 2 + 1)));
  // Exactly once: the next eviction returns only the block it evicts.
  absl::StatusOr<std::vector<uint64_t>> evicted = a_->Evict(1);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_THAT(*evicted, ElementsAre(7000 + a_blocks / 2 - 2));
}

// An engine acting for both tenants (the sidecar case) frees the victims'
// blocks itself, so its insert for c returns a's IDs directly.
TEST_P(SecurityTest, AnEngineForBothTenantsGetsTheirEvictionsDirectly) {
  StartServer("");
  std::unique_ptr<Client> engine_a = Connect("engine-ac", "a");
  std::unique_ptr<Client> engine_c = Connect("engine-ac", "c");
  const int a_blocks = static_cast<int>(kBudgetBlocks);
  ASSERT_TRUE(engine_a->Insert(Tokens(7, a_blocks), Ids(7000, a_blocks)).ok());
  absl::StatusOr<Client::InsertResult> r =
      engine_c->Insert(Tokens(900000, 2), Ids(9000, 2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->response.evicted_block_ids(),
              UnorderedElementsAreArray(Ids(7000 + a_blocks - 2, 2)));
  absl::StatusOr<Client::InsertResult> again =
      engine_a->Insert(Tokens(800000, 1), Ids(8000, 1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(again->response.evicted_block_ids(),
              ElementsAre(7000 + a_blocks - 3));
}

// --- 5. Stats and WatchEvents -----------------------------------------------

// Reads `client`'s events from the start until one stores `marker`;
// returns them all.
std::vector<v1::Event> EventsUntil(Client* client, uint64_t marker) {
  std::vector<v1::Event> out;
  std::unique_ptr<Client::EventStream> stream =
      client->WatchEvents(0, absl::Seconds(20));
  v1::WatchEventsResponse batch;
  bool seen = false;
  while (!seen && stream->Read(&batch)) {
    for (const v1::Event& e : batch.events()) {
      out.push_back(e);
      for (uint64_t id : e.block_stored().block_ids()) seen |= id == marker;
    }
  }
  EXPECT_TRUE(seen) << "stream ended before block " << marker;
  stream->Cancel();
  stream->Finish().IgnoreError();
  return out;
}

// Reads `stream` until a batch stores `marker` (true) or it ends (false).
bool ReadUntilStored(Client::EventStream* stream, uint64_t marker) {
  v1::WatchEventsResponse batch;
  while (stream->Read(&batch)) {
    for (const v1::Event& e : batch.events()) {
      for (uint64_t id : e.block_stored().block_ids()) {
        if (id == marker) return true;
      }
    }
  }
  return false;
}

// A SIGHUP that takes a principal away, or a tenant from one, ends the
// WatchEvents streams it had open: they would otherwise deliver that
// tenant's events for as long as the client reads. Streams of principals
// the reload leaves as they were go on.
TEST_P(SecurityTest, AReloadEndsTheWatchStreamsOfRevokedPrincipals) {
  struct Watch {
    const char* principal;
    std::string tenant;  // x-prefixd-tenant ("": the principal's own)
    uint64_t first_id;   // of the blocks inserted for it
    std::unique_ptr<Client::EventStream> stream;
  };
  std::vector<Watch> watches;
  watches.push_back({"app-b", "", 10, nullptr});       // removed
  watches.push_back({"engine-ac", "c", 20, nullptr});  // loses tenant c
  watches.push_back({"app-a", "", 30, nullptr});       // moved to tenant c
  watches.push_back({"engine-ac", "a", 40, nullptr});  // unchanged
  const std::vector<std::string> tenants = {"b", "c", "a", "a"};
  std::vector<std::unique_ptr<Client>> writers;
  for (size_t i = 0; i < watches.size(); ++i) {
    Watch& w = watches[i];
    w.stream =
        Connect(w.principal, w.tenant)->WatchEvents(0, absl::Seconds(20));
    writers.push_back(Connect("ops", tenants[i]));
  }
  // Every stream is open and delivering.
  for (size_t i = 0; i < watches.size(); ++i) {
    ASSERT_TRUE(writers[i]
                    ->Insert(Tokens(100 * i, 1), Ids(watches[i].first_id, 1))
                    .ok());
    ASSERT_TRUE(ReadUntilStored(watches[i].stream.get(), watches[i].first_id));
  }

  v1::Config reloaded = server_->config().proto;
  reloaded.clear_principals();
  for (const v1::PrincipalConfig& p : server_->config().proto.principals()) {
    if (p.name() == "app-b") continue;
    v1::PrincipalConfig* kept = reloaded.add_principals();
    *kept = p;
    if (p.name() == "engine-ac" || p.name() == "app-a") {
      kept->clear_tenants();
      kept->add_tenants(p.name() == "app-a" ? "c" : "a");
    }
  }
  ASSERT_TRUE(server_->ReloadPrincipals(reloaded).ok());

  // Events after the reload reach only the stream still allowed; the others
  // end, saying why.
  for (size_t i = 0; i < watches.size(); ++i) {
    ASSERT_TRUE(
        writers[i]
            ->Insert(Tokens(100 * i + 50, 1), Ids(watches[i].first_id + 1, 1))
            .ok());
  }
  const std::vector<std::pair<absl::StatusCode, std::string>> ends = {
      {absl::StatusCode::kUnauthenticated,
       "since the principals were reloaded (SIGHUP), this call's credentials "
       "may no longer act for tenant 'b': the bearer token is not valid"},
      {absl::StatusCode::kPermissionDenied,
       "may no longer act for tenant 'c': principal \"engine-ac\" may not "
       "act for tenant"},
      {absl::StatusCode::kPermissionDenied,
       "since the principals were reloaded (SIGHUP), principal \"app-a\" acts "
       "for tenant 'c', not 'a'"},
  };
  for (size_t i = 0; i < ends.size(); ++i) {
    SCOPED_TRACE(watches[i].principal);
    EXPECT_FALSE(
        ReadUntilStored(watches[i].stream.get(), watches[i].first_id + 1))
        << "a revoked stream delivered an event after the reload";
    const absl::Status end = watches[i].stream->Finish();
    EXPECT_EQ(end.code(), ends[i].first) << end;
    if (GetParam() == Mode::kMtls && i == 0) {
      // In MTLS the certificate names no principal any more.
      EXPECT_THAT(end.message(), HasSubstr("is not mapped to a principal"));
    } else {
      EXPECT_THAT(end.message(), HasSubstr(ends[i].second));
    }
  }
  Watch& kept = watches.back();
  EXPECT_TRUE(ReadUntilStored(kept.stream.get(), kept.first_id + 1));
  kept.stream->Cancel();
  kept.stream->Finish().IgnoreError();
}

TEST_P(SecurityTest, StatsAndEventsOfBContainNothingOfA) {
  ConnectAB();
  PrefixOptions in_ns;
  in_ns.ns = "secret-adapter";
  ASSERT_TRUE(a_->Insert(Tokens(10, 3), Ids(10, 3), in_ns).ok());
  ASSERT_TRUE(b_->Insert(Tokens(20, 2), Ids(20, 2)).ok());
  ASSERT_TRUE(a_->Match(Tokens(10, 3), in_ns).ok());
  ASSERT_TRUE(a_->Invalidate(std::vector<uint64_t>{12}).ok());
  ASSERT_TRUE(b_->Insert(Tokens(30, 1), Ids(30, 1)).ok());  // marker

  const v1::StatsResponse sb = StatsOf(b_.get());
  ASSERT_EQ(sb.tenants_size(), 1);
  const v1::TenantStats& b = sb.tenants(0);
  EXPECT_EQ(b.tenant(), "b");
  EXPECT_EQ(b.cached_blocks(), 3u);
  EXPECT_EQ(b.insert_requests(), 2u);
  EXPECT_EQ(b.match_requests(), 0u);
  EXPECT_EQ(b.namespaces(), 1u);
  EXPECT_EQ(Evicted(b), 0u);
  EXPECT_CODE(b_->Stats(/*all_tenants=*/true).status(), kPermissionDenied);
  absl::StatusOr<v1::DumpResponse> dump = b_->Dump("secret-adapter");
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_THAT(dump->namespaces(), ElementsAre(""));
  EXPECT_THAT(dump->nodes(), IsEmpty());

  const std::vector<v1::Event> events = EventsUntil(b_.get(), 30);
  ASSERT_EQ(events.size(), 2u);
  // B's sequence numbers start at 1 and count only B's events.
  EXPECT_EQ(events[0].sequence(), 1u);
  EXPECT_EQ(events[1].sequence(), 2u);
  EXPECT_THAT(Vec(events[0].block_stored().block_ids()), ElementsAre(20, 21));
  for (const v1::Event& e : events) {
    EXPECT_THAT(e.ShortDebugString(), Not(HasSubstr("secret-adapter")));
    EXPECT_FALSE(e.has_block_removed()) << e.ShortDebugString();
  }

  // The admin sees both (the positive control for the stats and the stream).
  const v1::StatsResponse all = StatsOf(ops_a_.get(), /*all=*/true);
  EXPECT_EQ(FindTenant(all, "a")->cached_blocks(), 2u);  // 12 invalidated
  EXPECT_EQ(FindTenant(all, "b")->cached_blocks(), 3u);
  const std::vector<v1::Event> a_events = EventsUntil(ops_a_.get(), 10);
  ASSERT_FALSE(a_events.empty());
  EXPECT_EQ(a_events[0].block_stored().namespace_(), "secret-adapter");
}

// --- The command line -------------------------------------------------------

TEST_P(SecurityTest, PrefixctlSpeaksTlsAndPresentsItsCredential) {
  ConnectAB();
  ASSERT_TRUE(a_->Insert(Tokens(40, 2), Ids(40, 2)).ok());
  const ClientOptions o = As("app-a");
  std::string cmd = absl::StrCat(PREFIXCTL_PATH, " --addr ", tcp(),
                                 " --tls_ca ", o.tls_ca_file, " --json");
  if (GetParam() == Mode::kMtls) {
    absl::StrAppend(&cmd, " --tls_cert ", o.tls_cert_file, " --tls_key ",
                    o.tls_key_file);
  } else {
    absl::StrAppend(&cmd, " --token ", o.token);
  }
  absl::StrAppend(&cmd, " match --tokens ", 40, "-", 40 + 2 * kBlockSize - 1,
                  " 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  const int rc = pclose(pipe);
  EXPECT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_THAT(out, HasSubstr("\"matched_tokens\""));
  EXPECT_THAT(out, HasSubstr(absl::StrCat(2 * kBlockSize))) << out;
}

// --- The fleet index: who may Route over which namespace -----------------

// A fleet index whose one worker holds a chain under salt-a and another
// under salt-b: TENANT app-a may Route with its own salts only, and never
// list the workers; engines and admins may do both.
TEST_P(SecurityTest, IndexRoutesATenantOnlyOverItsOwnSalts) {
  StartServer("", "index { block_size: 4 listen: \"tcp://127.0.0.1:*\" }\n");
  KvIndex* index = server_->index();
  ASSERT_NE(index, nullptr);
  const WorkerId w = index->AddWorker("w0", "test");
  const std::vector<uint32_t> p = Tokens(100, 2);
  int64_t seq = 0;
  for (const char* salt : {"salt-a", "salt-b"}) {
    BlockStoredEvent ev;
    ev.block_hashes = {static_cast<EngineHash>(seq * 10 + 1),
                       static_cast<EngineHash>(seq * 10 + 2)};
    ev.token_ids = p;
    ev.block_size = kBlockSize;
    ev.cache_salt = salt;
    ev.chain_blocks = 2;
    KvEventBatch batch;
    batch.events.push_back(ev);
    index->Apply(w, batch, seq++, absl::Now());
  }
  auto app_a = Connect("app-a");
  auto app_b = Connect("app-b");
  auto engine = Connect("engine-ac");
  auto ops = Connect("ops");
  RouteOptions salt_a;
  salt_a.cache_salt = "salt-a";
  RouteOptions salt_b;
  salt_b.cache_salt = "salt-b";

  // Positive control: app-a over its own salt sees the worker's 2 blocks.
  ASSERT_OK_AND_MOVE(own, app_a->Route(p, salt_a));
  EXPECT_EQ(own.best_worker(), "w0");
  EXPECT_EQ(own.workers(0).matched_blocks(), 2u);
  // Another tenant's salt, or none: refused, not answered with 0.
  absl::Status other = app_a->Route(p, salt_b).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied) << other;
  EXPECT_THAT(other.message(), HasSubstr("salt-b"));
  EXPECT_CODE(app_a->Route(p).status(), kPermissionDenied);
  // app-b has no salts at all.
  EXPECT_CODE(app_b->Route(p, salt_a).status(), kPermissionDenied);
  // In a batch, the item with a foreign salt fails alone.
  v1::RouteBatchRequest batch;
  *batch.add_requests() = RouteRequestFor(p, salt_a);
  *batch.add_requests() = RouteRequestFor(p, salt_b);
  ASSERT_OK_AND_MOVE(items, app_a->RouteBatch(batch));
  ASSERT_EQ(items.responses_size(), 2);
  EXPECT_EQ(items.responses(0).code(), 0);
  EXPECT_EQ(items.responses(0).response().workers(0).matched_blocks(), 2u);
  EXPECT_EQ(items.responses(1).code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_FALSE(items.responses(1).has_response());
  // ListWorkers: engines and admins only.
  EXPECT_CODE(app_a->ListWorkers().status(), kPermissionDenied);
  ASSERT_OK_AND_MOVE(listed, engine->ListWorkers());
  ASSERT_EQ(listed.workers_size(), 1);
  EXPECT_EQ(listed.workers(0).worker(), "w0");
  EXPECT_OK_STATUS(ops->ListWorkers().status());
  // Engines and admins Route over any namespace; salts still partition.
  ASSERT_OK_AND_MOVE(by_engine, engine->Route(p, salt_b));
  EXPECT_EQ(by_engine.workers(0).matched_blocks(), 2u);
  ASSERT_OK_AND_MOVE(unsalted, ops->Route(p));
  EXPECT_EQ(unsalted.best_worker(), "");
}

// Pick follows Route's rule: a TENANT picks over its own salts only (a
// refused Pick records nothing: no decision, no predicted block), engines
// and admins over any; a PickBatch item with a foreign salt fails alone.
TEST_P(SecurityTest, IndexPicksForATenantOnlyOverItsOwnSalts) {
  StartServer("", "index { block_size: 4 listen: \"tcp://127.0.0.1:*\" }\n");
  KvIndex* index = server_->index();
  ASSERT_NE(index, nullptr);
  index->AddWorker("w0", "test");
  index->AddWorker("w1", "test");
  const std::vector<uint32_t> p = Tokens(100, 3);
  auto app_a = Connect("app-a");
  auto engine = Connect("engine-ac");
  PickOptions salt_a;
  salt_a.prompt.cache_salt = "salt-a";
  PickOptions salt_b;
  salt_b.prompt.cache_salt = "salt-b";

  absl::Status other = app_a->Pick(p, salt_b).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied) << other;
  EXPECT_THAT(other.message(), HasSubstr("salt-b"));
  EXPECT_CODE(app_a->Pick(p).status(), kPermissionDenied);
  EXPECT_EQ(server_->picker()->counts().picks, 0u);
  EXPECT_EQ(server_->picker()->counts().predicted, 0u);

  ASSERT_OK_AND_MOVE(own, app_a->Pick(p, salt_a));
  EXPECT_FALSE(own.worker().empty());
  EXPECT_EQ(own.ranked_size(), 2);
  EXPECT_EQ(server_->picker()->counts().picks, 1u);
  EXPECT_EQ(server_->picker()->counts().predicted, 3u);  // the prompt's blocks

  v1::PickBatchRequest batch;
  *batch.add_requests() = PickRequestFor(p, salt_a);
  *batch.add_requests() = PickRequestFor(p, salt_b);
  ASSERT_OK_AND_MOVE(items, app_a->PickBatch(batch));
  ASSERT_EQ(items.responses_size(), 2);
  EXPECT_EQ(items.responses(0).code(), 0);
  EXPECT_EQ(items.responses(1).code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_FALSE(items.responses(1).has_response());

  ASSERT_OK_AND_MOVE(by_engine, engine->Pick(p, salt_b));
  EXPECT_EQ(by_engine.ranked_size(), 2);
}

// A namespace key that joined LoRA and salt with a separator let a tenant
// reach another tenant's salt: the victim's blocks sit under (LoRA "L",
// salt "x\x1fsalt-a2"), whose old key "n:L\x1fx\x1fsalt-a2" was also the
// key of (LoRA "L\x1fx", salt "salt-a2"), a salt app-a owns.
TEST_P(SecurityTest, IndexNamespacesWithSeparatorsStayApart) {
  StartServer("", "index { block_size: 4 listen: \"tcp://127.0.0.1:*\" }\n");
  KvIndex* index = server_->index();
  ASSERT_NE(index, nullptr);
  const WorkerId w = index->AddWorker("w0", "test");
  const std::vector<uint32_t> p = Tokens(100, 2);
  BlockStoredEvent ev;
  ev.block_hashes = {11, 12};
  ev.token_ids = p;
  ev.block_size = kBlockSize;
  ev.lora_name = "L";
  ev.cache_salt = std::string("x\x1fsalt-a2");
  ev.chain_blocks = 2;
  KvEventBatch batch;
  batch.events.push_back(ev);
  index->Apply(w, batch, 0, absl::Now());

  auto app_a = Connect("app-a");
  auto engine = Connect("engine-ac");
  // Positive control: the victim's own namespace holds both blocks.
  RouteOptions victim;
  victim.lora_name = "L";
  victim.cache_salt = std::string("x\x1fsalt-a2");
  ASSERT_OK_AND_MOVE(own, engine->Route(p, victim));
  EXPECT_EQ(own.workers(0).matched_blocks(), 2u);
  // app-a, with a salt it owns and a LoRA name carrying the separator.
  RouteOptions crafted;
  crafted.lora_name = std::string("L\x1fx");
  crafted.cache_salt = "salt-a2";
  ASSERT_OK_AND_MOVE(got, app_a->Route(p, crafted));
  EXPECT_EQ(got.best_worker(), "");
  EXPECT_EQ(got.workers_size(), 0);  // only workers with a match are listed
  crafted.all_workers = true;
  ASSERT_OK_AND_MOVE(all, app_a->Route(p, crafted));
  ASSERT_EQ(all.workers_size(), 1);
  EXPECT_EQ(all.workers(0).matched_blocks(), 0u);
}

TEST(IndexAuthConfig, CacheSaltsAreForTenantPrincipalsOnly) {
  v1::Config proto;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "auth { mode: TOKEN }\n"
      "principals { name: \"e\" role: ENGINE tenants: \"*\" token_sha256: "
      "\"" +
          Sha256Hex("t") + "\" cache_salts: \"s\" }\n",
      &proto));
  FillDefaults(&proto);
  absl::StatusOr<ServerConfig> config = ResolveConfig(proto);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("cache_salts"));
}

INSTANTIATE_TEST_SUITE_P(Modes, SecurityTest,
                         ::testing::Values(Mode::kToken, Mode::kMtls),
                         ModeName);
INSTANTIATE_TEST_SUITE_P(Modes, MtlsTest, ::testing::Values(Mode::kMtls),
                         ModeName);

}  // namespace
}  // namespace prefixd
