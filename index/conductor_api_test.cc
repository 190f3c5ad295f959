// The Mooncake Conductor API over a real FleetIndex: request checking (every
// error path names its field and changes nothing), the answer's shape, the
// principals' rules, and registrations kept in the state directory.
#include "index/conductor_api.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/fleet_index.h"
#include "index/keys.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr int kBs = 4;

// Worker `name` of instance `instance`, rank `dp`, tenant `tenant`, holding
// blocks of tokens [1..4], [5..8], ... (`blocks` of them) in `medium`.
void AddHolder(FleetIndex* index, const std::string& name,
               const std::string& instance, int dp, const std::string& tenant,
               int blocks, const std::string& medium) {
  const WorkerId w = index->AddWorker(name, "tcp://127.0.0.1:1");
  WorkerLabels labels;
  labels.instance_id = instance;
  labels.tenant = tenant;
  labels.model = "llama";
  labels.dp_rank = dp;
  index->SetLabels(w, labels);
  BlockStoredEvent ev;
  for (int b = 0; b < blocks; ++b) {
    ev.block_hashes.push_back(static_cast<EngineHash>(100 + b));
    for (int t = 1; t <= kBs; ++t)
      ev.token_ids.push_back(static_cast<Token>(b * kBs + t));
  }
  ev.block_size = kBs;
  ev.medium = medium;
  ev.chain_blocks = ev.block_hashes.size();
  KvEventBatch batch;
  batch.events.push_back(ev);
  index->Apply(w, batch, 0, absl::Now());
}

std::vector<Token> Prompt(int blocks) {
  std::vector<Token> out;
  for (int t = 1; t <= blocks * kBs; ++t) out.push_back(static_cast<Token>(t));
  return out;
}

ConductorCaller Engine() {
  ConductorCaller c;
  c.principal = "engine-0";
  c.may_register = true;
  c.any_tenant = true;
  return c;
}

class ConductorApiTest : public ::testing::Test {
 protected:
  ConductorApiTest() {
    AddHolder(&index_, "a0", "vllm-a", 0, "", 3, "GPU");
    AddHolder(&index_, "a1", "vllm-a", 1, "", 2, "GPU");
    AddHolder(&index_, "store", "vllm-a", 0, "", 4, "cpu");
    AddHolder(&index_, "b0", "vllm-b", 0, "acme", 1, "GPU");
  }
  Json Query(const Json& body, bool by_hash = false,
             const ConductorCaller& caller = Engine()) {
    const ConductorAnswer a = api_.Query(caller, body.dump(), by_hash);
    EXPECT_EQ(a.status, 200) << a.body;
    return Json::parse(a.body);
  }

  // The lookup by key, as the daemon turns it on with the API.
  FleetIndex index_{IndexOptions{
      .block_size = kBs, .max_entries = 1000000, .key_lookup = true}};
  ConductorApi api_{&index_, nullptr, ConductorLimits{64, 16}};
};

// Matched prefix tokens per instance, per medium and per rank, whole blocks
// only; the tenant and the model filter.
TEST_F(ConductorApiTest, QueryAnswersTokensPerInstanceMediumAndRank) {
  const std::vector<Token> prompt = Prompt(5);
  std::vector<Token> ragged = prompt;
  ragged.push_back(99);  // a partial block counts for nothing
  const Json got =
      Query({{"model", "llama"}, {"token_ids", ragged}, {"block_size", kBs}});
  const Json want = {{"default",
                      {{"vllm-a",
                        {{"longest_matched", 16},
                         {"GPU", 12},
                         {"CPU", 16},
                         {"DISK", 0},
                         {"DP", {{"0", 16}, {"1", 8}}}}}}}};
  EXPECT_EQ(got, want) << got.dump();
  const Json acme = Query({{"model", "llama"},
                           {"token_ids", prompt},
                           {"tenant_id", "acme"},
                           {"block_size", kBs}});
  EXPECT_EQ(acme["acme"]["vllm-b"]["longest_matched"], 4);
  EXPECT_EQ(
      Query({{"model", "mistral"}, {"token_ids", prompt}, {"block_size", kBs}}),
      Json::object());
  const Json one = Query({{"model", "llama"},
                          {"token_ids", prompt},
                          {"instance_id", "nobody"},
                          {"block_size", kBs}});
  EXPECT_EQ(one, Json::object());
}

// /query_by_hash with keys computed by the Conductor's recipe (XXH64 over
// the parent and the tokens, index/keys.h, whose goldens keys_test pins)
// answers as /query does; block_hash is its other name.
TEST_F(ConductorApiTest, QueryByHashAgreesWithQuery) {
  const KeyScheme scheme;
  const std::vector<Token> prompt = Prompt(5);
  std::vector<uint64_t> keys;
  uint64_t parent = scheme.Root("");
  for (int b = 0; b < 5; ++b) {
    parent = scheme.Next(
        parent, b == 0,
        absl::MakeConstSpan(prompt).subspan(static_cast<size_t>(b) * kBs, kBs));
    keys.push_back(parent);
  }
  const Json by_tokens =
      Query({{"model", "llama"}, {"token_ids", prompt}, {"block_size", kBs}});
  EXPECT_EQ(
      Query({{"model", "llama"}, {"seq_hashes", keys}, {"block_size", kBs}},
            true),
      by_tokens);
  EXPECT_EQ(
      Query({{"model", "llama"}, {"block_hash", keys}, {"block_size", kBs}},
            true),
      by_tokens);
}

// The RFC's deprecated lora_id names the LoRA a worker's events name by ID
// only; null is the base model, as an absent one is.
TEST_F(ConductorApiTest, QueryByLoraIdFindsTheEventsLoraId) {
  const WorkerId w = index_.AddWorker("l0", "tcp://127.0.0.1:1");
  WorkerLabels labels;
  labels.instance_id = "vllm-lora";
  labels.model = "llama";
  index_.SetLabels(w, labels);
  BlockStoredEvent ev;
  ev.block_hashes = {500, 501};
  ev.token_ids = Prompt(2);
  ev.block_size = kBs;
  ev.lora_id = 7;
  ev.chain_blocks = 2;
  KvEventBatch batch;
  batch.events.push_back(ev);
  index_.Apply(w, batch, 0, absl::Now());
  const Json lora = Query({{"model", "llama"},
                           {"token_ids", Prompt(2)},
                           {"lora_id", 7},
                           {"instance_id", "vllm-lora"},
                           {"block_size", kBs}});
  EXPECT_EQ(lora["default"]["vllm-lora"]["longest_matched"], 8) << lora.dump();
  for (const bool null_id : {true, false}) {
    Json q = {{"model", "llama"},
              {"token_ids", Prompt(2)},
              {"instance_id", "vllm-lora"},
              {"block_size", kBs}};
    if (null_id) q["lora_id"] = nullptr;
    EXPECT_EQ(Query(q)["default"]["vllm-lora"]["longest_matched"], 0)
        << q.dump();
  }
}

struct BadCase {
  const char* body;
  const char* field;  // what the message must name
  bool by_hash = false;
};

TEST_F(ConductorApiTest, BadQueriesAre400NamingTheField) {
  const BadCase cases[] = {
      {"{", "not JSON"},
      {"[1, 2]", "JSON object"},
      {R"({"token_ids": [1], "block_size": 4})", "model"},
      {R"({"model": "m", "block_size": 4})", "token_ids"},
      {R"({"model": "m", "token_ids": [1]})", "block_size"},
      {R"({"model": "m", "token_ids": [1], "block_size": 16})",
       "block_size: 16 differs from the index's block size 4"},
      {R"({"model": "m", "token_ids": [1], "block_size": "4"})",
       "block_size: must be an integer, not string"},
      {R"({"model": 7, "token_ids": [1], "block_size": 4})",
       "model: must be a string, not number"},
      {R"({"model": "m", "token_ids": [1, -2], "block_size": 4})",
       "token_ids: entry 1 (-2)"},
      {R"({"model": "m", "token_ids": [4294967296], "block_size": 4})",
       "0..4294967295"},
      {R"({"model": "m", "token_ids": 5, "block_size": 4})",
       "token_ids: must be an array, not number"},
      {R"({"model": "m", "block_size": 4})", "seq_hashes: is required", true},
      {R"({"model": "m", "block_size": 4, "seq_hashes": [1], "block_hash": [1]})",
       "both given", true},
      {R"({"model": "m", "block_size": 4, "seq_hashes": [1.5]})",
       "seq_hashes: entry 0 (1.5)", true},
      {R"({"model": "m", "token_ids": [1], "block_size": 4, "lora_id": 7,
           "lora_name": "sql"})",
       "lora_id: 7 is given beside lora_name \"sql\""},
      {R"({"model": "m", "token_ids": [1], "block_size": 4, "lora_id": "7"})",
       "lora_id: must be an integer, not string"},
      {R"({"model": "m", "token_ids": [1], "block_size": 4, "lora_id": 0})",
       "lora_id: 0 is outside 1..2147483647"},
  };
  for (const BadCase& c : cases) {
    const ConductorAnswer a = api_.Query(Engine(), c.body, c.by_hash);
    EXPECT_EQ(a.status, 400) << c.body;
    EXPECT_THAT(Json::parse(a.body)["error"].get<std::string>(),
                HasSubstr(c.field))
        << c.body;
  }
  // Over the limits: 64 tokens, 16 hashes.
  const ConductorAnswer tokens = api_.Query(
      Engine(),
      Json{{"model", "m"}, {"token_ids", Prompt(17)}, {"block_size", kBs}}
          .dump(),
      false);
  EXPECT_EQ(tokens.status, 400);
  EXPECT_THAT(tokens.body, HasSubstr("token_ids: 68 entries exceed the limit "
                                     "of 64"));
  const ConductorAnswer hashes =
      api_.Query(Engine(),
                 Json{{"model", "m"},
                      {"seq_hashes", std::vector<uint64_t>(17, 1)},
                      {"block_size", kBs}}
                     .dump(),
                 true);
  EXPECT_EQ(hashes.status, 400);
  EXPECT_THAT(hashes.body, HasSubstr("seq_hashes: 17 entries exceed the "
                                     "limit of 16"));
}

// A TENANT principal queries within its tenant and with one of its salts;
// an ENGINE-less caller may not register.
TEST_F(ConductorApiTest, PrincipalsRules) {
  ConductorCaller tenant;
  tenant.principal = "acme-router";
  tenant.tenant = "acme";
  tenant.salts = {"s1"};
  const Json q = {{"model", "llama"},
                  {"token_ids", Prompt(1)},
                  {"block_size", kBs},
                  {"cache_salt", "s1"}};
  const Json own = Query(q, false, tenant);
  EXPECT_TRUE(own.contains("acme")) << own.dump();  // its tenant by default
  Json other = q;
  other["tenant_id"] = "default";
  ConductorAnswer a = api_.Query(tenant, other.dump(), false);
  EXPECT_EQ(a.status, 403);
  EXPECT_THAT(a.body, HasSubstr("acts for tenant \\\"acme\\\""));
  Json salt = q;
  salt["cache_salt"] = "s2";
  a = api_.Query(tenant, salt.dump(), false);
  EXPECT_EQ(a.status, 403);
  EXPECT_THAT(a.body, HasSubstr("cache_salt"));
  a = api_.Register(tenant, "{}");
  EXPECT_EQ(a.status, 403);
  EXPECT_THAT(a.body, HasSubstr("ENGINE"));
}

std::string TempDir() {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR") != nullptr
                                     ? std::getenv("TEST_TMPDIR")
                                     : "/tmp",
                                 "/conductor_api_test.XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

Json RegisterBody(const std::string& instance, int dp) {
  return {{"endpoint", "tcp://127.0.0.1:1"},
          {"replay_endpoint", "tcp://127.0.0.1:2"},
          {"type", "vLLM"},
          {"modelname", "llama"},
          {"tenant_id", "acme"},
          {"instance_id", instance},
          {"block_size", kBs},
          {"dp_rank", dp},
          {"additionalsalt", "s1"}};
}

// Registrations follow a source each, kept in the state directory: a new
// registry over the same directory (a restarted daemon) follows them again.
// Bad registrations are 400 and change nothing.
TEST(ConductorRegistryTest, RegistrationsPersistAndBadOnesChangeNothing) {
  const std::string dir = TempDir();
  FleetIndex index(IndexOptions{kBs, 1000000});
  {
    auto ingest = Ingest::Start(&index, IngestOptions());
    ASSERT_TRUE(ingest.ok());
    ConductorRegistry registry(ingest->get(), dir, kBs);
    ASSERT_TRUE(registry.Restore().ok());
    ConductorApi api(&index, &registry, ConductorLimits());
    ConductorAnswer a = api.Register(Engine(), RegisterBody("a", 1).dump());
    EXPECT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(Json::parse(a.body), (Json{{"status", "registered successfully"},
                                         {"instance_id", "a"}}));
    EXPECT_EQ(api.Register(Engine(), RegisterBody("b", 0).dump()).status, 200);
    const BadCase bad[] = {
        {R"({"type": "vLLM"})", "modelname"},
        {"not json", "not JSON"},
    };
    for (const BadCase& c : bad) {
      a = api.Register(Engine(), c.body);
      EXPECT_EQ(a.status, 400);
      EXPECT_THAT(a.body, HasSubstr(c.field));
    }
    Json body = RegisterBody("c", 0);
    body["type"] = "TensorRT";
    a = api.Register(Engine(), body.dump());
    EXPECT_THAT(a.body, HasSubstr("type: \\\"TensorRT\\\" is none of"));
    body = RegisterBody("c", 0);
    body["block_size"] = 16;
    EXPECT_THAT(api.Register(Engine(), body.dump()).body,
                HasSubstr("block_size: 16 differs"));
    body = RegisterBody("c", 0);
    body["endpoint"] = "http://x";
    EXPECT_THAT(api.Register(Engine(), body.dump()).body,
                HasSubstr("is not tcp://HOST:PORT"));
    body = RegisterBody("c", -1);
    EXPECT_THAT(api.Register(Engine(), body.dump()).body,
                HasSubstr("dp_rank: -1 is outside 0..65536"));
    body = RegisterBody("c|d", 0);
    EXPECT_THAT(api.Register(Engine(), body.dump()).body,
                HasSubstr("instance_id: must not contain"));
    ASSERT_EQ((*ingest)->Sources().size(), 2u);

    a = api.Unregister(Engine(), RegisterBody("b", 0).dump());
    EXPECT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(Json::parse(a.body)["removed_instances"],
              Json::array({"b|acme|0"}));
    a = api.Unregister(Engine(), RegisterBody("b", 0).dump());
    EXPECT_EQ(a.status, 404);
    EXPECT_THAT(a.body, HasSubstr("b|acme|0"));
    // Mooncake's current Conductor's form: the registration's name alone;
    // what else is given is checked.
    body = RegisterBody("c", 0);
    body["block_size"] = 32;
    EXPECT_THAT(api.Unregister(Engine(), body.dump()).body,
                HasSubstr("block_size: 32 differs"));
    ASSERT_EQ(api.Register(Engine(), RegisterBody("c", 0).dump()).status, 200);
    const Json name = {
        {"instance_id", "c"}, {"tenant_id", "acme"}, {"dp_rank", 0}};
    a = api.Unregister(Engine(), name.dump());
    EXPECT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(Json::parse(a.body)["removed_instances"],
              Json::array({"c|acme|0"}));
  }
  auto ingest = Ingest::Start(&index, IngestOptions());
  ASSERT_TRUE(ingest.ok());
  ConductorRegistry registry(ingest->get(), dir, kBs);
  ASSERT_TRUE(registry.Restore().ok());
  const std::vector<IndexSource> sources = (*ingest)->Sources();
  ASSERT_EQ(sources.size(), 1u);
  EXPECT_EQ(sources[0].name, "a|acme|1");
  EXPECT_EQ(sources[0].labels.instance_id, "a");
  EXPECT_EQ(sources[0].labels.salt, "s1");
  EXPECT_EQ(sources[0].labels.dp_rank, 1);
  EXPECT_TRUE(sources[0].pinned);
  EXPECT_EQ(sources[0].replay_endpoint, "tcp://127.0.0.1:2");
  // A registry whose block size changed refuses the file, naming it.
  ConductorRegistry other(ingest->get(), dir, 16);
  const absl::Status s = other.Restore();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("conductor_registrations.json: entry 0: "
                                     "block_size: 4 differs"));
}

}  // namespace
}  // namespace prefixd
