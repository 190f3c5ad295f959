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
// blocks of tokens [1..4], [5..8], ... (`blocks` of them) in `medium`; a
// Mooncake store's (hashes_are_keys) when `store`.
void AddHolder(FleetIndex* index, const std::string& name,
               const std::string& instance, int dp, const std::string& tenant,
               int blocks, const std::string& medium, bool store = false) {
  const WorkerId w = index->AddWorker(name, "tcp://127.0.0.1:1");
  WorkerLabels labels;
  labels.instance_id = instance;
  labels.tenant = tenant;
  labels.model = "llama";
  labels.dp_rank = dp;
  labels.hashes_are_keys = store;
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

// A MessagePack body as Mooncake's current Conductor clients send one:
// token_ids as one bin of little-endian int32.
std::string Msgpack(Json body, const std::vector<int32_t>& tokens) {
  std::vector<uint8_t> bin;
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    for (int shift = 0; shift < 32; shift += 8)
      bin.push_back(static_cast<uint8_t>(u >> shift));
  }
  body["token_ids"] = Json::binary(std::move(bin));
  std::string out;
  Json::to_msgpack(body, out);
  return out;
}

std::vector<int32_t> Int32Prompt(int blocks) {
  std::vector<int32_t> out;
  for (Token t : Prompt(blocks)) out.push_back(static_cast<int32_t>(t));
  return out;
}

// Mooncake's current Conductor: MessagePack in and out, the answer by
// instance with cumulative tiers; a store is no instance, but its blocks
// extend every engine's CPU and disk tiers.
TEST(ConductorMsgpackTest, QueryAnswersByInstanceWithTheStoresTiers) {
  FleetIndex index(IndexOptions{kBs, 1000000});
  AddHolder(&index, "a0", "vllm-a", 0, "", 3, "GPU");
  AddHolder(&index, "a1", "vllm-a", 1, "", 1, "GPU");
  AddHolder(&index, "b0", "vllm-b", 0, "", 2, "CPU");
  AddHolder(&index, "store", "store-0", 0, "", 4, "cpu", true);
  AddHolder(&index, "disk", "store-1", 0, "", 2, "DISK", true);
  ConductorApi api(&index, nullptr, ConductorLimits());
  const Json q = {{"model", "llama"},
                  {"block_size", kBs},
                  {"tenant_id", "default"},
                  {"lora_name", ""}};
  const ConductorAnswer a = api.Query(Engine(), Msgpack(q, Int32Prompt(5)),
                                      false, BodyFormat::kMsgpack);
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(a.format, BodyFormat::kMsgpack);
  const Json got = Json::from_msgpack(a.body);
  const auto rank = [](int npu, int cpu_local, int cpu_share, int disk) {
    return Json{{"npu", npu},
                {"cpu_local", cpu_local},
                {"cpu_share", cpu_share},
                {"disk", disk}};
  };
  const auto instance = [](Json tiers, Json dp, Json ranks) {
    tiers["longest_matched"] = tiers["disk"];
    tiers["dp"] = std::move(dp);
    tiers["rank_matches"] = std::move(ranks);
    return tiers;
  };
  const Json want = {
      {"instances",
       {{"vllm-a",
         instance(rank(12, 12, 16, 16), {{"0", 12}, {"1", 4}},
                  {{"0", rank(12, 12, 16, 16)}, {"1", rank(4, 4, 16, 16)}})},
        {"vllm-b", instance(rank(0, 8, 16, 16), {{"0", 0}},
                            {{"0", rank(0, 8, 16, 16)}})}}}};
  EXPECT_EQ(got, want) << got.dump();
  Json one = q;
  one["instance_id"] = "vllm-b";
  const Json b =
      Json::from_msgpack(api.Query(Engine(), Msgpack(one, Int32Prompt(5)),
                                   false, BodyFormat::kMsgpack)
                             .body);
  EXPECT_EQ(b, (Json{{"instances", {{"vllm-b", want["instances"]["vllm-b"]}}}}))
      << b.dump();
  // The same query in JSON answers by tenant, the stores as instances;
  // by instance where the daemon is told to (index.http_answer).
  Json text = q;
  text["token_ids"] = Prompt(5);
  const Json by_tenant =
      Json::parse(api.Query(Engine(), text.dump(), false).body);
  EXPECT_EQ(by_tenant["default"]["store-0"]["CPU"], 16) << by_tenant.dump();
  EXPECT_EQ(by_tenant["default"]["vllm-a"]["longest_matched"], 12);
  ConductorApi by_instance(&index, nullptr, ConductorLimits(),
                           AnswerForm::kByInstance);
  const ConductorAnswer json = by_instance.Query(Engine(), text.dump(), false);
  EXPECT_EQ(json.format, BodyFormat::kJson);
  EXPECT_EQ(Json::parse(json.body), want) << json.body;
}

// Each tier is one run from the prompt's first block through any source
// of it or a faster one: a store's blocks carry an engine on where its own
// stop, and the engine's own carry it past the store's gaps.
TEST(ConductorMsgpackTest, StoreBlocksCarryAnEnginesRunOn) {
  FleetIndex index(IndexOptions{
      .block_size = kBs, .max_entries = 1000000, .key_lookup = true});
  AddHolder(&index, "a0", "vllm-a", 0, "", 2, "GPU");
  AddHolder(&index, "store", "store-0", 0, "", 4, "cpu", true);
  AddHolder(&index, "disk", "store-1", 0, "", 5, "DISK", true);
  // The store has since dropped the engine's blocks from its CPU pool, and
  // the disk store block 3 (hashes 100 + b).
  BlockRemovedEvent gone;
  gone.block_hashes = {100, 101};
  gone.medium = "cpu";
  KvEventBatch batch;
  batch.events.push_back(gone);
  index.Apply(index.AddWorker("store", "tcp://127.0.0.1:1"), batch, 1,
              absl::Now());
  gone.block_hashes = {103};
  gone.medium = "DISK";
  batch.events = {gone};
  index.Apply(index.AddWorker("disk", "tcp://127.0.0.1:1"), batch, 1,
              absl::Now());
  ConductorApi api(&index, nullptr, ConductorLimits());
  const Json q = {{"model", "llama"}, {"block_size", kBs}};
  const Json got =
      Json::from_msgpack(api.Query(Engine(), Msgpack(q, Int32Prompt(6)), false,
                                   BodyFormat::kMsgpack)
                             .body);
  // GPU 0-1, then the store's CPU 2-3, then its disk's 4 (block 5 no one).
  const Json& a = got["instances"]["vllm-a"];
  EXPECT_EQ(
      a["rank_matches"]["0"],
      (Json{{"npu", 8}, {"cpu_local", 8}, {"cpu_share", 16}, {"disk", 20}}))
      << got.dump();
  EXPECT_EQ(a["longest_matched"], 20) << got.dump();
  // By the prompt's rolling keys, the same.
  const KeyScheme scheme;
  const std::vector<Token> prompt = Prompt(6);
  std::vector<uint64_t> keys;
  uint64_t parent = scheme.Root("");
  for (size_t b = 0; b < 6; ++b) {
    parent = scheme.Next(parent, b == 0,
                         absl::MakeConstSpan(prompt).subspan(b * kBs, kBs));
    keys.push_back(parent);
  }
  Json by_hash = q;
  by_hash["seq_hashes"] = keys;
  std::string body;
  Json::to_msgpack(by_hash, body);
  EXPECT_EQ(Json::from_msgpack(
                api.Query(Engine(), body, true, BodyFormat::kMsgpack).body),
            got);
}

// A bad MessagePack body is 400 naming what is wrong, answered in
// MessagePack.
TEST(ConductorMsgpackTest, BadBodiesAre400InMsgpack) {
  FleetIndex index(IndexOptions{kBs, 1000000});
  ConductorApi api(&index, nullptr, ConductorLimits{64, 16});
  const Json q = {{"model", "llama"}, {"block_size", kBs}};
  std::string odd = Msgpack(q, {});
  {
    Json j = q;
    j["token_ids"] = Json::binary({1, 0, 0, 0, 2, 0});
    odd.clear();
    Json::to_msgpack(j, odd);
  }
  std::string nested(200, '\x91');  // [[[[...
  nested.insert(0, "\x81\xa1x");    // {"x": ...}
  const std::pair<std::string, std::string> cases[] = {
      {Msgpack(q, {1, -5}), "token_ids: entry 1 (-5) is not an integer"},
      {odd, "token_ids: entry 1 (2 bytes past the last int32)"},
      {Msgpack(q, std::vector<int32_t>(65, 1)),
       "token_ids: 65 entries exceed the limit of 64"},
      {std::string("\xc1", 1), "the body is not MessagePack"},
      {std::string("\x92\x01\x02"), "must be a MessagePack object, not array"},
      {nested, "the body nests deeper than 32 levels"},
  };
  for (const auto& [body, error] : cases) {
    const ConductorAnswer a =
        api.Query(Engine(), body, false, BodyFormat::kMsgpack);
    EXPECT_EQ(a.status, 400);
    EXPECT_THAT(Json::from_msgpack(a.body)["error"].get<std::string>(),
                HasSubstr(error));
  }
  // A positive integer MessagePack sends as a signed type reads as any.
  Json j = q;
  j["token_ids"] = Json::array({1, 2, 3, 4});
  std::string small;
  Json::to_msgpack(j, small);
  const size_t at = small.find(std::string("\xaa") + "block_size") + 11;
  ASSERT_EQ(small[at], '\x04');
  small.replace(at, 1, "\xd0\x04");  // int8 4
  EXPECT_EQ(api.Query(Engine(), small, false, BodyFormat::kMsgpack).status,
            200);
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
    // Mooncake's current Conductor's registration, in MessagePack: a hash
    // profile (not needed here) and cache group 0 (every group is followed).
    body = RegisterBody("m", 0);
    body.erase("replay_endpoint");
    body["hash_profile"] = {{"strategy", "vllm_v1"},
                            {"algorithm", "sha256_cbor"},
                            {"python_hash_seed", "0"},
                            {"index_projection", "low64_be"}};
    body["cache_group"] = 1;
    std::string packed;
    Json::to_msgpack(body, packed);
    a = api.Register(Engine(), packed, BodyFormat::kMsgpack);
    EXPECT_EQ(a.status, 400);
    EXPECT_THAT(Json::from_msgpack(a.body)["error"].get<std::string>(),
                HasSubstr("cache_group: 1 is not served"));
    body["cache_group"] = "x";
    body["hash_profile"] = "vllm_v1";
    packed.clear();
    Json::to_msgpack(body, packed);
    EXPECT_THAT(Json::from_msgpack(
                    api.Register(Engine(), packed, BodyFormat::kMsgpack).body)
                    .dump(),
                HasSubstr("hash_profile: must be an object, not string"));
    ASSERT_EQ((*ingest)->Sources().size(), 2u);
    body["hash_profile"] = {{"strategy", "vllm_v1"}};
    body["cache_group"] = 0;
    packed.clear();
    Json::to_msgpack(body, packed);
    a = api.Register(Engine(), packed, BodyFormat::kMsgpack);
    EXPECT_EQ(a.status, 200) << Json::from_msgpack(a.body).dump();
    EXPECT_EQ(
        Json::from_msgpack(a.body),
        (Json{{"status", "registered successfully"}, {"instance_id", "m"}}));
    packed.clear();
    Json::to_msgpack(
        Json{{"instance_id", "m"}, {"tenant_id", "acme"}, {"dp_rank", 0}},
        packed);
    a = api.Unregister(Engine(), packed, BodyFormat::kMsgpack);
    EXPECT_EQ(Json::from_msgpack(a.body)["removed_instances"],
              Json::array({"m|acme|0"}));
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

// GET /services lists the registrations with the field names of the
// Conductor's ServiceConfig, by name: every one for an ENGINE or ADMIN
// principal, its own tenant's for a TENANT principal.
TEST(ConductorRegistryTest, ServicesListsTheRegistrationsACallerMaySee) {
  FleetIndex index(IndexOptions{kBs, 1000000});
  auto ingest = Ingest::Start(&index, IngestOptions());
  ASSERT_TRUE(ingest.ok());
  ConductorRegistry registry(ingest->get(), "", kBs);
  ConductorApi api(&index, &registry, ConductorLimits());
  ConductorAnswer a = api.Services(Engine());
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.format, BodyFormat::kJson);
  EXPECT_EQ(Json::parse(a.body),
            (Json{{"count", 0}, {"services", Json::array()}}));
  ASSERT_EQ(api.Register(Engine(), RegisterBody("b", 1).dump()).status, 200);
  Json other = RegisterBody("a", 0);
  other["tenant_id"] = "default";
  other["type"] = "mooncake";
  other.erase("replay_endpoint");
  other.erase("additionalsalt");
  other["lora_name"] = "sql";
  ASSERT_EQ(api.Register(Engine(), other.dump()).status, 200);
  const Json b = {{"Endpoint", "tcp://127.0.0.1:1"},
                  {"ReplayEndpoint", "tcp://127.0.0.1:2"},
                  {"Type", "vLLM"},
                  {"ModelName", "llama"},
                  {"LoraName", ""},
                  {"TenantID", "acme"},
                  {"InstanceID", "b"},
                  {"BlockSize", kBs},
                  {"DPRank", 1},
                  {"AdditionalSalt", "s1"}};
  const Json a0 = {{"Endpoint", "tcp://127.0.0.1:1"},
                   {"ReplayEndpoint", ""},
                   {"Type", "Mooncake"},
                   {"ModelName", "llama"},
                   {"LoraName", "sql"},
                   {"TenantID", "default"},
                   {"InstanceID", "a"},
                   {"BlockSize", kBs},
                   {"DPRank", 0},
                   {"AdditionalSalt", ""}};
  a = api.Services(Engine());
  EXPECT_EQ(Json::parse(a.body),
            (Json{{"count", 2}, {"services", Json::array({a0, b})}}))
      << a.body;
  ConductorCaller acme;
  acme.principal = "acme-router";
  acme.tenant = "acme";
  a = api.Services(acme);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(Json::parse(a.body),
            (Json{{"count", 1}, {"services", Json::array({b})}}))
      << a.body;
  ASSERT_EQ(api.Unregister(Engine(), RegisterBody("b", 1).dump()).status, 200);
  EXPECT_EQ(Json::parse(api.Services(acme).body)["count"], 0);
  // Without a registry (a daemon that serves no /register), none.
  const ConductorApi bare(&index, nullptr, ConductorLimits());
  EXPECT_EQ(Json::parse(bare.Services(Engine()).body),
            (Json{{"count", 0}, {"services", Json::array()}}));
}

}  // namespace
}  // namespace prefixd
