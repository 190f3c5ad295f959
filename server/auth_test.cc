#include "server/auth.h"

#include <cctype>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

v1::Config Parse(const std::string& text) {
  v1::Config c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c)) << text;
  return c;
}

// The principals most tests use: tenant "acme-app" for a, engine "vllm" for
// a and b, engine "solo" for b only, engine "any" for "*", admin "ops".
std::string Principals() {
  std::string text =
      "auth { mode: TOKEN } tenants { name: \"a\" } tenants { name: \"b\" } "
      "tenants { name: \"c\" }\n";
  for (auto [name, role, tenants, token] :
       {std::tuple{"acme-app", "TENANT", "\"a\"", "tok-a"},
        std::tuple{"vllm", "ENGINE", "[\"a\", \"b\"]", "tok-vllm"},
        std::tuple{"solo", "ENGINE", "\"b\"", "tok-solo"},
        std::tuple{"any", "ENGINE", "\"*\"", "tok-any"},
        std::tuple{"ops", "ADMIN", "[]", "tok-ops"}}) {
    absl::StrAppend(&text, "principals { name: \"", name, "\" role: ", role,
                    " tenants: ", tenants, " token_sha256: \"",
                    Sha256Hex(token), "\" }\n");
  }
  return text;
}

PrincipalTable Table(const std::string& text = Principals()) {
  absl::StatusOr<PrincipalTable> t = PrincipalTable::FromConfig(Parse(text));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : PrincipalTable();
}

const Principal& ByToken(const PrincipalTable& t, absl::string_view token) {
  const Principal* p = t.FindByToken(token);
  EXPECT_NE(p, nullptr) << token;
  static const Principal kNone;
  return p != nullptr ? *p : kNone;
}

absl::Status ConfigError(const std::string& text) {
  return ValidateAuthConfig(Parse(text));
}

TEST(Sha256HexTest, MatchesSha256sum) {
  // printf %s abc | sha256sum
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(BearerTokenTest, TakesTheSchemeInAnyCase) {
  EXPECT_EQ(*BearerToken("Bearer s3cret"), "s3cret");
  EXPECT_EQ(*BearerToken("bearer s3cret"), "s3cret");
  EXPECT_EQ(*BearerToken("BEARER  s3cret "), "s3cret");
}

TEST(BearerTokenTest, RefusesOtherSchemesAndEmptyTokens) {
  for (const char* bad : {"s3cret", "Basic czNjcmV0", "Bearer", "Bearer ",
                          "Bearer    ", "Bearers3cret"}) {
    absl::StatusOr<std::string> t = BearerToken(bad);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
}

TEST(PrincipalTableTest, FindsThePrincipalOfEachToken) {
  PrincipalTable t = Table();
  EXPECT_EQ(ByToken(t, "tok-a").name, "acme-app");
  EXPECT_EQ(ByToken(t, "tok-vllm").name, "vllm");
  EXPECT_EQ(ByToken(t, "tok-ops").name, "ops");
  EXPECT_EQ(t.FindByToken("tok-b"), nullptr);
  EXPECT_EQ(t.FindByToken(""), nullptr);
  EXPECT_EQ(t.FindByToken("tok-a "), nullptr);
  // The hash itself is not a token.
  EXPECT_EQ(t.FindByToken(Sha256Hex("tok-a")), nullptr);
}

TEST(PrincipalTableTest, UpperCaseHexIsTheSameHash) {
  std::string hex = Sha256Hex("tok");
  for (char& c : hex) c = static_cast<char>(std::toupper(c));
  PrincipalTable t = Table(
      absl::StrCat("auth { mode: TOKEN } principals { name: \"e\" role: ENGINE "
                   "token_sha256: \"",
                   hex, "\" tenants: \"*\" }"));
  EXPECT_EQ(ByToken(t, "tok").name, "e");
}

TEST(PrincipalTableTest, TenantPrincipalActsOnlyForItsTenant) {
  PrincipalTable t = Table();
  const Principal& a = ByToken(t, "tok-a");
  absl::StatusOr<CallContext> c = t.Resolve(a, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tenant, "a");
  EXPECT_EQ(c->principal, "acme-app");
  EXPECT_FALSE(c->all_tenants);
  EXPECT_FALSE(c->scope.all);
  EXPECT_THAT(c->scope.tenants, ::testing::ElementsAre("a"));
  EXPECT_EQ(t.Resolve(a, "a")->tenant, "a");

  absl::StatusOr<CallContext> other = t.Resolve(a, "b");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(
      other.status().message(),
      AllOf(HasSubstr("\"acme-app\""), HasSubstr("\"a\""), HasSubstr("\"b\"")));
}

TEST(PrincipalTableTest, EngineActsForTheTenantsInItsList) {
  PrincipalTable t = Table();
  const Principal& vllm = ByToken(t, "tok-vllm");
  EXPECT_EQ(t.Resolve(vllm, "a")->tenant, "a");
  EXPECT_EQ(t.Resolve(vllm, "b")->tenant, "b");
  EXPECT_THAT(t.Resolve(vllm, "a")->scope.tenants,
              ::testing::ElementsAre("a", "b"));
  absl::StatusOr<CallContext> c = t.Resolve(vllm, "c");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr("\"vllm\""), HasSubstr("\"c\"")));
  EXPECT_FALSE(t.Resolve(vllm, "a")->all_tenants);
}

TEST(PrincipalTableTest, EngineWithoutTheHeader) {
  PrincipalTable t = Table();
  // One tenant: that one.
  EXPECT_EQ(t.Resolve(ByToken(t, "tok-solo"), "")->tenant, "b");
  // Several: none, and single-tenant calls are refused.
  absl::StatusOr<CallContext> c = t.Resolve(ByToken(t, "tok-vllm"), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tenant, "");
  absl::Status need = RequireTenant(*c);
  EXPECT_EQ(need.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(need.message(),
              AllOf(HasSubstr("\"vllm\""), HasSubstr(kTenantHeader)));
  EXPECT_EQ(t.Resolve(ByToken(t, "tok-any"), "")->tenant, "");
}

TEST(PrincipalTableTest, AnyTenantEngineAndAdmin) {
  PrincipalTable t = Table();
  absl::StatusOr<CallContext> any = t.Resolve(ByToken(t, "tok-any"), "c");
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->tenant, "c");
  EXPECT_TRUE(any->scope.all);
  EXPECT_FALSE(any->all_tenants);
  absl::StatusOr<CallContext> ops = t.Resolve(ByToken(t, "tok-ops"), "b");
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->tenant, "b");
  EXPECT_TRUE(ops->scope.all);
  EXPECT_TRUE(ops->all_tenants);
  EXPECT_EQ(t.Resolve(ByToken(t, "tok-ops"), "")->tenant, "");
}

TEST(PrincipalTableTest, UnconfiguredTenantsNeedDynamicTenants) {
  PrincipalTable strict = Table();
  absl::StatusOr<CallContext> c =
      strict.Resolve(ByToken(strict, "tok-any"), "zeta");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(c.status().message(), HasSubstr("\"zeta\" is not configured"));
  EXPECT_EQ(strict.Resolve(ByToken(strict, "tok-ops"), "zeta").status().code(),
            absl::StatusCode::kPermissionDenied);

  PrincipalTable dynamic =
      Table(Principals() + "dynamic_tenants { enabled: true }");
  EXPECT_EQ(dynamic.Resolve(ByToken(dynamic, "tok-any"), "zeta")->tenant,
            "zeta");
}

TEST(PrincipalTableTest, StarIsNotATenantName) {
  PrincipalTable t = Table();
  EXPECT_EQ(t.Resolve(ByToken(t, "tok-any"), "*").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PrincipalTableTest, CertificateBySubjectOrCommonName) {
  PrincipalTable t = Table(R"pb(
    auth {
      mode: MTLS
      tls_cert_path: "s.pem"
      tls_key_path: "k.pem"
      client_ca_path: "ca.pem"
    }
    dynamic_tenants { enabled: true }
    principals {
      name: "full"
      role: TENANT
      cert_subject: "CN=client-a,O=prefixd"
      tenants: "a"
    }
    principals { name: "cn" role: ENGINE cert_subject: "engine-0" tenants: "*" }
  )pb");
  const Principal* p =
      t.FindByCertificate({"CN=client-a,O=prefixd", "client-a"});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name, "full");
  // A full subject must match as a whole, never by its CN.
  EXPECT_EQ(t.FindByCertificate({"CN=client-a,O=other", "client-a"}), nullptr);
  p = t.FindByCertificate({"CN=engine-0,O=x", "engine-0"});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name, "cn");
  EXPECT_EQ(t.FindByCertificate({"CN=engine-1", "engine-1"}), nullptr);
  // Principals without a token are never found by one.
  EXPECT_EQ(t.FindByToken(""), nullptr);
}

// Every config error names the principal it is about (index and name) and
// never echoes what was in token_sha256.
struct BadPrincipal {
  const char* principal;  // the body of principals { }
  const char* want;       // in the message
};

class BadPrincipalTest : public ::testing::TestWithParam<BadPrincipal> {};

TEST_P(BadPrincipalTest, IsRefusedNamingThePrincipal) {
  const std::string text = absl::StrCat(
      "auth { mode: TOKEN } tenants { name: \"a\" } tenants { name: \"b\" } ",
      "principals { name: \"ok\" role: ENGINE tenants: \"*\" token_sha256: \"",
      Sha256Hex("ok"), "\" } principals { ", GetParam().principal, " }");
  absl::Status s = ConfigError(text);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_THAT(s.message(), HasSubstr("principals[1]")) << s;
  EXPECT_THAT(s.message(), HasSubstr(GetParam().want)) << s;
  EXPECT_THAT(s.message(), Not(HasSubstr("not-a-hash-at-all"))) << s;
}

const std::string kHashB = Sha256Hex("b");

INSTANTIATE_TEST_SUITE_P(
    Config, BadPrincipalTest,
    ::testing::Values(
        BadPrincipal{"name: \"x\" role: ENGINE tenants: \"*\" "
                     "token_sha256: \"not-a-hash-at-all\"",
                     "17 characters, not 64 hex digits"},
        BadPrincipal{"name: \"x\" role: ENGINE tenants: \"*\" token_sha256: "
                     "\"zz7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff6"
                     "1f20015ad\"",
                     "not a hex digit at offset 0"},
        BadPrincipal{"name: \"x\" role: ENGINE tenants: \"*\" token_sha256: "
                     "\"2689367b205c16ce32ed4200942b8b8b1e262dfc70d9bc9fbc77c4"
                     "9699a4f1df\"",
                     "same as principals[0] (\"ok\")"},
        BadPrincipal{"name: \"x\" tenants: \"a\" token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "role is not set"},
        BadPrincipal{"name: \"x\" role: 9 tenants: \"a\" token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "unknown role 9"},
        BadPrincipal{"name: \"x\" role: TENANT token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "exactly one named tenant"},
        BadPrincipal{"name: \"x\" role: TENANT tenants: [\"a\", \"b\"] "
                     "token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "exactly one named tenant"},
        BadPrincipal{"name: \"x\" role: TENANT tenants: \"*\" token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "exactly one named tenant"},
        BadPrincipal{"name: \"x\" role: ENGINE token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "needs tenants"},
        BadPrincipal{"name: \"x\" role: ENGINE tenants: [\"*\", \"a\"] "
                     "token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "mixes \"*\""},
        BadPrincipal{"name: \"x\" role: ADMIN tenants: \"a\" token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "leave tenants empty"},
        BadPrincipal{"name: \"x\" role: ENGINE tenants: \"zeta\" "
                     "token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "tenant \"zeta\" is not configured"},
        BadPrincipal{"name: \"ok\" role: ENGINE tenants: \"*\" token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "name is taken by principals[0]"},
        BadPrincipal{"name: \"x\" role: ENGINE tenants: \"*\"",
                     "has no token_sha256"},
        BadPrincipal{"name: \"x\" role: ENGINE tenants: \"*\" cert_subject: "
                     "\"CN=x\" token_sha256: "
                     "\"3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73ee"
                     "aed59c009d\"",
                     "cert_subject needs auth.mode MTLS"}));

TEST(BadPrincipalHashTest, TheDuplicateCaseReallyIsADuplicate) {
  // The third case above hard-codes SHA-256("ok"): printf %s ok | sha256sum
  EXPECT_EQ(Sha256Hex("ok"),
            "2689367b205c16ce32ed4200942b8b8b1e262dfc70d9bc9fbc77c49699a4f1df");
}

TEST(ValidateAuthConfigTest, ModeNoneTakesNoPrincipalsOrTls) {
  EXPECT_TRUE(ValidateAuthConfig(Parse("")).ok());
  EXPECT_TRUE(ValidateAuthConfig(Parse("auth { mode: NONE }")).ok());
  absl::Status s = ConfigError(
      "auth { mode: NONE } principals { name: \"e\" role: ENGINE }");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("auth.mode is NONE"));
  EXPECT_EQ(ConfigError("auth { mode: NONE tls_cert_path: \"c\" }").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ValidateAuthConfigTest, TokenAndMtlsNeedTheirFiles) {
  const std::string principal = absl::StrCat(
      " principals { name: \"e\" role: ENGINE tenants: \"*\" token_sha256: \"",
      Sha256Hex("t"), "\" }");
  EXPECT_TRUE(ConfigError("auth { mode: TOKEN }" + principal).ok());
  EXPECT_TRUE(ConfigError("auth { mode: TOKEN tls_cert_path: \"c\" "
                          "tls_key_path: \"k\" }" +
                          principal)
                  .ok());
  EXPECT_THAT(
      ConfigError("auth { mode: TOKEN tls_cert_path: \"c\" }" + principal)
          .message(),
      HasSubstr("both tls_cert_path and tls_key_path"));
  EXPECT_THAT(ConfigError("auth { mode: TOKEN tls_cert_path: \"c\" "
                          "tls_key_path: \"k\" client_ca_path: \"ca\" }" +
                          principal)
                  .message(),
              HasSubstr("needs auth.mode MTLS"));
  EXPECT_THAT(ConfigError("auth { mode: MTLS tls_cert_path: \"c\" "
                          "tls_key_path: \"k\" }" +
                          principal)
                  .message(),
              HasSubstr("client_ca_path"));
  EXPECT_THAT(ConfigError("auth { mode: TOKEN }").message(),
              HasSubstr("no principals"));
}

TEST(ValidateAuthConfigTest, MtlsPrincipalNeedsACredential) {
  absl::Status s = ConfigError(R"pb(
    auth {
      mode: MTLS
      tls_cert_path: "c"
      tls_key_path: "k"
      client_ca_path: "ca"
    }
    principals { name: "e" role: ENGINE tenants: "*" }
  )pb");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("principals[0] (\"e\")"),
                                 HasSubstr("no credential")));
  s = ConfigError(R"pb(
    auth {
      mode: MTLS
      tls_cert_path: "c"
      tls_key_path: "k"
      client_ca_path: "ca"
    }
    principals { name: "e" role: ENGINE tenants: "*" cert_subject: "CN=e" }
    principals { name: "f" role: ENGINE tenants: "*" cert_subject: "CN=e" }
  )pb");
  EXPECT_THAT(s.message(), AllOf(HasSubstr("principals[1] (\"f\")"),
                                 HasSubstr("\"CN=e\" is also")));
}

TEST(ValidateAuthConfigTest, StarIsNotATenantName) {
  absl::Status s = ConfigError(absl::StrCat(
      "auth { mode: TOKEN } tenants { name: \"*\" } principals { name: \"e\" "
      "role: ENGINE tenants: \"*\" token_sha256: \"",
      Sha256Hex("t"), "\" }"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrincipalAuthorizerTest, WarnsAboutCleartextTokensOnTheNetwork) {
  PrincipalAuthorizer plain(v1::AuthConfig::TOKEN, Table(), nullptr);
  EXPECT_EQ(plain.mode(), "TOKEN");
  std::vector<ListenAddress> listen;
  for (const char* a : {"127.0.0.1:1", "unix:///tmp/x.sock", "0.0.0.0:2"})
    listen.push_back(*ParseListenAddress(a));
  std::vector<std::string> w = plain.Warnings(listen);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_THAT(w[0], AllOf(HasSubstr("cleartext"), HasSubstr("0.0.0.0:2"),
                          HasSubstr("tls_cert_path")));
  listen.pop_back();
  EXPECT_TRUE(plain.Warnings(listen).empty());
}

TEST(LoadTlsMaterialTest, NamesTheFieldAndTheFile) {
  v1::AuthConfig a;
  a.set_tls_cert_path("/nonexistent/prefixd-cert.pem");
  a.set_tls_key_path("/nonexistent/prefixd-key.pem");
  absl::StatusOr<TlsMaterial> m = LoadTlsMaterial(a, false);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("auth.tls_cert_path"),
                    HasSubstr("/nonexistent/prefixd-cert.pem")));

  const std::string junk = ::testing::TempDir() + "/prefixd-junk.pem";
  std::ofstream(junk) << "not a certificate\n";
  a.set_tls_cert_path(junk);
  a.set_tls_key_path(junk);
  m = LoadTlsMaterial(a, false);
  EXPECT_THAT(m.status().message(),
              AllOf(HasSubstr("auth.tls_cert_path"), HasSubstr(junk),
                    HasSubstr("no PEM certificate")));
  std::remove(junk.c_str());
}

}  // namespace
}  // namespace prefixd
