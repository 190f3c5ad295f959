#include "server/config.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// ctest runs each test case as its own process, in parallel: the pid keeps
// their files apart.
std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path =
      ::testing::TempDir() + "/" + std::to_string(getpid()) + "-" + name;
  std::ofstream(path) << text;
  return path;
}

absl::StatusOr<ServerConfig> FromText(const std::string& textproto) {
  CommandLine flags;
  flags.config_paths = {WriteFile("config_test.textproto", textproto)};
  return LoadServerConfig(flags);
}

TEST(ConfigTest, EmbeddedDefault) {
  absl::StatusOr<ServerConfig> c = LoadServerConfig(CommandLine{});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->listen.size(), 2u);
  EXPECT_EQ(c->listen[0].ToGrpcUri(), "127.0.0.1:50051");
  EXPECT_EQ(c->listen[1].kind, ListenAddress::Kind::kUnix);
  EXPECT_EQ(c->listen[1].path, "/tmp/prefixd.sock");
  EXPECT_EQ(c->metrics_listen, "127.0.0.1:9464");
  EXPECT_EQ(c->model.geometry.name, "llama-3-8b");
  EXPECT_EQ(c->model.kv_dtype, KvDtype::kFp16);
  EXPECT_EQ(c->bytes_per_token, 131072u);
  EXPECT_EQ(c->cache.block_size, 16);
  EXPECT_EQ(c->cache.block_bytes, 16u * 131072u);
  EXPECT_EQ(c->cache.budget_bytes, uint64_t{4} << 30);
  EXPECT_EQ(c->cache.default_lease_ttl, absl::Seconds(300));
  EXPECT_EQ(c->cache.rope_shift, RopeShift::kDeny);
  EXPECT_TRUE(c->cache.dynamic_tenants);
  EXPECT_EQ(c->proto.auth().mode(), v1::AuthConfig::NONE);
  EXPECT_EQ(c->drain_timeout, absl::Seconds(10));
  EXPECT_EQ(c->max_message_bytes, uint64_t{16} << 20);
  EXPECT_EQ(c->fingerprint, Fingerprint(c->model));
  EXPECT_EQ(c->fingerprint.size(), 16u);
  EXPECT_THAT(c->model_description,
              HasSubstr("32 layers x 8 KV heads x 128 head_dim, fp16"));
  EXPECT_TRUE(c->snapshot_path.empty());
}

TEST(ConfigTest, Textproto) {
  absl::StatusOr<ServerConfig> c = FromText(R"pb(
    listen: "127.0.0.1:7000"
    listen: "unix:///tmp/prefixd-test/x.sock"
    model { layers: 80 kv_heads: 8 head_dim: 128 }
    kv_dtype: "fp8"
    block_size: 32
    kv_budget: "160GB"
    lease_ttl: "5m"
    rope { theta: 500000 shift: ALLOW }
    tenants { name: "acme" reserved: "1GiB" limit: "2GiB" }
    tenants { name: "beta" }
    limits {
      max_tokens_per_request: 4096
      max_lease_ttl: "1h"
      max_message_size: "1MiB"
    }
    drain_timeout: "30s"
    events_per_tenant: 8
    snapshot_path: "/var/lib/prefixd/snapshot.bin"
  )pb");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->listen.size(), 2u);
  EXPECT_EQ(c->listen[0].port, 7000);
  EXPECT_EQ(c->bytes_per_token, 2u * 80 * 8 * 128);
  EXPECT_EQ(c->cache.block_size, 32);
  EXPECT_EQ(c->cache.block_bytes, 32u * c->bytes_per_token);
  EXPECT_EQ(c->cache.budget_bytes, 160000000000u);
  EXPECT_EQ(c->cache.default_lease_ttl, absl::Minutes(5));
  EXPECT_EQ(c->cache.rope_shift, RopeShift::kAllow);
  EXPECT_EQ(c->model.rope.theta, 500000);
  ASSERT_EQ(c->cache.tenants.size(), 2u);
  EXPECT_EQ(c->cache.tenants[0].name, "acme");
  EXPECT_EQ(c->cache.tenants[0].quota.reserved_bytes, uint64_t{1} << 30);
  EXPECT_EQ(c->cache.tenants[0].quota.limit_bytes, uint64_t{2} << 30);
  EXPECT_EQ(c->cache.tenants[1].quota.reserved_bytes, 0u);
  EXPECT_EQ(c->cache.tenants[1].quota.limit_bytes, c->cache.budget_bytes);
  EXPECT_EQ(c->cache.limits.max_tokens_per_request, 4096u);
  EXPECT_EQ(c->cache.limits.max_lease_ttl, absl::Hours(1));
  EXPECT_EQ(c->max_message_bytes, uint64_t{1} << 20);
  EXPECT_EQ(c->drain_timeout, absl::Seconds(30));
  EXPECT_EQ(c->cache.events_per_tenant, 8u);
  EXPECT_EQ(c->snapshot_path, "/var/lib/prefixd/snapshot.bin");
  // Unset fields keep the embedded default.
  EXPECT_EQ(c->metrics_listen, "127.0.0.1:9464");
}

TEST(ConfigTest, Json) {
  CommandLine flags;
  flags.config_paths = {WriteFile("config_test.json", R"({
    "listen": ["127.0.0.1:7001"],
    "model": {"preset": "llama-3-70b"},
    "kvDtype": "bf16",
    "kvBudget": "1000000tokens",
    "rope": {"shift": "ALLOW"},
    "auth": {"mode": "NONE"}
  })")};
  absl::StatusOr<ServerConfig> c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen[0].port, 7001);
  EXPECT_EQ(c->bytes_per_token, 327680u);
  EXPECT_EQ(c->cache.budget_bytes, uint64_t{1000000} * 327680);
  EXPECT_EQ(c->cache.rope_shift, RopeShift::kAllow);
}

TEST(ConfigTest, FlagsOverrideTheFile) {
  CommandLine flags;
  flags.config_paths = {WriteFile("override.textproto", R"pb(
    listen: "127.0.0.1:7002"
    block_size: 32
    kv_budget: "1GiB"
    model { layers: 2 kv_heads: 2 head_dim: 64 }
    lease_ttl: "10s"
  )pb")};
  flags.listen = {"127.0.0.1:7003", "unix:///tmp/prefixd-override.sock"};
  flags.block_size = 64;
  flags.model = "mistral-7b";
  flags.kv_dtype = "int8";
  flags.metrics_listen = "127.0.0.1:9999";
  flags.snapshot_path = "/tmp/snap.bin";
  absl::StatusOr<ServerConfig> c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->listen.size(), 2u);
  EXPECT_EQ(c->listen[0].port, 7003);
  EXPECT_EQ(c->listen[1].path, "/tmp/prefixd-override.sock");
  EXPECT_EQ(c->cache.block_size, 64);
  EXPECT_EQ(c->model.geometry.name,
            "mistral-7b");  // the file's numbers are dropped
  EXPECT_EQ(c->model.kv_dtype, KvDtype::kInt8);
  EXPECT_EQ(c->metrics_listen, "127.0.0.1:9999");
  EXPECT_EQ(c->snapshot_path, "/tmp/snap.bin");
  EXPECT_EQ(c->cache.budget_bytes, uint64_t{1} << 30);       // from the file
  EXPECT_EQ(c->cache.default_lease_ttl, absl::Seconds(10));  // from the file
}

TEST(ConfigTest, ModelFlagWithJsonPathMeansHfConfig) {
  CommandLine flags;
  flags.model = "/models/llama/config.json";
  v1::Config config;
  ApplyCommandLine(flags, &config);
  EXPECT_EQ(config.model().hf_config_path(), "/models/llama/config.json");
  EXPECT_TRUE(config.model().preset().empty());
}

TEST(ConfigTest, HuggingFaceConfigJson) {
  CommandLine flags;
  flags.model = WriteFile("hf_config.json", R"({
    "model_type": "llama", "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "hidden_size": 2048, "torch_dtype": "bfloat16",
    "rope_theta": 500000.0
  })");
  absl::StatusOr<ServerConfig> c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.geometry.layers, 16);
  EXPECT_EQ(c->model.geometry.kv_heads, 8);
  EXPECT_EQ(c->model.geometry.head_dim, 64);
  EXPECT_EQ(c->model.kv_dtype, KvDtype::kBf16);  // the weights' dtype
  EXPECT_EQ(c->model.rope.theta, 500000);
  EXPECT_EQ(c->bytes_per_token, 2u * 16 * 8 * 64 * 2);

  flags.kv_dtype = "fp8";  // an explicit kv_dtype wins
  c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.kv_dtype, KvDtype::kFp8);

  flags.model = "/nonexistent/config.json";
  c = LoadServerConfig(flags);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr("model.hf_config_path"),
                    HasSubstr("/nonexistent/config.json")));
}

// The budget follows the model's real cache: DeepSeek-V3's latent
// attention, Qwen3-Next's 12 attention layers of 48.
TEST(ConfigTest, BudgetFollowsLatentAndHybridGeometry) {
  absl::StatusOr<ServerConfig> c = FromText(R"pb(
    model { preset: "deepseek-v3" }
    kv_dtype: "bf16"
    kv_budget: "1000tokens"
  )pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bytes_per_token, 70272u);  // (512 + 64) x 61 x 2
  EXPECT_EQ(c->cache.block_bytes, 16u * 70272);
  EXPECT_EQ(c->cache.budget_bytes, 1000u * 70272);
  EXPECT_THAT(FingerprintText(c->model), HasSubstr("kv_lora_rank=512"));
  EXPECT_THAT(c->model_description, HasSubstr("MLA (512 + 64)"));

  CommandLine flags;
  flags.model = std::string(PREFIXD_SOURCE_DIR) +
                "/tests/data/hf_configs/qwen3-next-80b-a3b-instruct.json";
  c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.geometry.layers, 12);
  EXPECT_THAT(c->model_description,
              HasSubstr("12 layers x 2 KV heads x 256 head_dim + 36 state "
                        "layers"));
  EXPECT_EQ(c->bytes_per_token, 24576u);  // 2 x 12 x 2 x 256 x 2
  EXPECT_EQ(c->cache.block_bytes, 16u * 24576);
}

// The same kinds of layer by numbers, for models without a preset or a
// config.json the reader sizes.
TEST(ConfigTest, LatentSlidingAndStateLayersByNumbers) {
  absl::StatusOr<ServerConfig> c = FromText(R"pb(
    model { layers: 61 kv_heads: 1 head_dim: 64 kv_lora_rank: 512 }
  )pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bytes_per_token, 70272u);
  c = FromText(R"pb(
    model {
      layers: 12
      kv_heads: 2
      head_dim: 256
      state_layers: 36
      state_bytes: "1097728B"
      sliding_window: 4096
      sliding_layers: 6
    }
  )pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bytes_per_token, 24576u);  // sliding layers are charged too
  EXPECT_EQ(c->model.geometry.state_bytes_per_layer, 1097728u);
  EXPECT_THAT(c->model_description,
              HasSubstr("(6 sliding over 4096 tokens) + 36 state layers"));
}

// "4294967296" could be bytes or tokens.
TEST(ConfigTest, BareKvBudgetIsRefused) {
  absl::StatusOr<ServerConfig> c = FromText(R"pb(kv_budget: "4294967296")pb");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr("kv_budget"), HasSubstr("4294967296"),
                    HasSubstr("bytes or tokens")));
  c = FromText(R"pb(kv_budget: "4294967296B")pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cache.budget_bytes, uint64_t{4} << 30);
}

TEST(ConfigTest, AuthOffAllowsNetworkListenOnlyWithTheOverride) {
  absl::StatusOr<ServerConfig> c = FromText(R"pb(
    listen: "0.0.0.0:7004"
    auth { insecure_allow_unauthenticated_network: true }
  )pb");
  EXPECT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(
      FromText(R"pb(listen: "[::1]:7005" listen: "localhost:7006")pb").ok());
}

TEST(ConfigTest, EventsPublish) {
  absl::StatusOr<ServerConfig> off = LoadServerConfig(CommandLine{});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->events_publish_enabled);
  EXPECT_FALSE(off->cache.detailed_events);

  absl::StatusOr<ServerConfig> c = FromText(
      "events_publish { endpoint: \"tcp://*:5557\" replay_endpoint: "
      "\"tcp://*:5558\" topic: \"kv@s0@m\" }");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->events_publish_enabled);
  EXPECT_TRUE(c->cache.detailed_events);
  EXPECT_EQ(c->events_publish.endpoint, "tcp://*:5557");
  EXPECT_EQ(c->events_publish.replay_endpoint, "tcp://*:5558");
  EXPECT_EQ(c->events_publish.topic, "kv@s0@m");
  EXPECT_EQ(c->events_publish.buffer_batches, 10000u);
  EXPECT_EQ(c->events_publish_limits.buffer_bytes, uint64_t{64} << 20);
  EXPECT_EQ(c->events_publish_limits.queue_bytes, uint64_t{4} << 20);
  EXPECT_EQ(c->events_publish_limits.stall_timeout, absl::Seconds(30));

  c = FromText(
      "events_publish { endpoint: \"tcp://*:5557\" buffer_bytes: \"1MiB\" "
      "queue_bytes: \"128KiB\" stall_timeout: \"5s\" }");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->events_publish_limits.buffer_bytes, uint64_t{1} << 20);
  EXPECT_EQ(c->events_publish_limits.queue_bytes, uint64_t{128} << 10);
  EXPECT_EQ(c->events_publish_limits.stall_timeout, absl::Seconds(5));
  c = FromText(
      "events_publish { endpoint: \"tcp://*:5557\" queue_bytes: \"1KiB\" }");
  EXPECT_THAT(c.status().message(),
              HasSubstr("events_publish.queue_bytes: 1024 bytes is less than "
                        "one batch"));
  c = FromText(
      "events_publish { endpoint: \"tcp://*:5557\" stall_timeout: \"2h\" }");
  EXPECT_THAT(c.status().message(), HasSubstr("events_publish.stall_timeout"));
  c = FromText(
      "events_publish { endpoint: \"tcp://*:5557\" buffer_bytes: \"lots\" }");
  EXPECT_THAT(c.status().message(), HasSubstr("events_publish.buffer_bytes"));

  CommandLine flags;
  flags.events_publish = "ipc:///tmp/pub";
  c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->events_publish.endpoint, "ipc:///tmp/pub");
  EXPECT_EQ(c->events_publish.replay_endpoint, "");

  c = FromText("events_publish { endpoint: \"5557\" }");
  EXPECT_THAT(c.status().message(), HasSubstr("\"5557\""));
  c = FromText("events_publish { replay_endpoint: \"tcp://*:5558\" }");
  EXPECT_THAT(c.status().message(), HasSubstr("events_publish.endpoint"));
}

TEST(ConfigTest, EvictionDefaultsToLru) {
  absl::StatusOr<ServerConfig> c = LoadServerConfig(CommandLine{});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cache.eviction_policy, EvictionPolicy::kLru);
  EXPECT_EQ(c->cache.eviction_history_blocks, 0u);
  EXPECT_THAT(ModelAndSizeLines(*c, 2048, "# "),
              HasSubstr("# eviction     LRU\n"));
}

TEST(ConfigTest, EvictionFromTheFileAndTheFlagOverIt) {
  absl::StatusOr<ServerConfig> c = FromText(R"pb(
    eviction { policy: ADAPTIVE history_blocks: 512 }
  )pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cache.eviction_policy, EvictionPolicy::kAdaptive);
  EXPECT_EQ(c->cache.eviction_history_blocks, 512u);
  EXPECT_THAT(
      ModelAndSizeLines(*c, 2048, "  "),
      HasSubstr("eviction     ADAPTIVE, history 512 blocks per tenant"));

  CommandLine flags;
  flags.config_paths = {
      WriteFile("eviction.textproto", "eviction { policy: ADAPTIVE }")};
  flags.eviction_policy = "LRU";
  c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cache.eviction_policy, EvictionPolicy::kLru);

  flags.eviction_policy = "ADAPTIVE";
  flags.config_paths.clear();
  c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cache.eviction_policy, EvictionPolicy::kAdaptive);
  // History 0 is the budget: 4 GiB of 2 MiB blocks.
  EXPECT_THAT(ModelAndSizeLines(*c, 2048, "  "),
              HasSubstr("ADAPTIVE, history 2,048 blocks per tenant"));

  // SHADOW from the flag; its history 0 is four times the budget.
  flags.eviction_policy = "SHADOW";
  c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cache.eviction_policy, EvictionPolicy::kShadow);
  EXPECT_THAT(ModelAndSizeLines(*c, 2048, "  "),
              HasSubstr("SHADOW, history 8,192 blocks per tenant"));
  c = FromText("eviction { policy: SHADOW history_blocks: 100 }");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cache.eviction_policy, EvictionPolicy::kShadow);
  EXPECT_EQ(c->cache.eviction_history_blocks, 100u);
}

TEST(ConfigTest, UnknownEvictionPolicyIsNamed) {
  absl::StatusOr<ServerConfig> c = FromText("eviction { policy: LFU }");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("LFU"));

  CommandLine flags;
  flags.config_paths = {
      WriteFile("eviction.json", R"({"eviction": {"policy": 7}})")};
  c = LoadServerConfig(flags);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("7"));
}

TEST(ConfigTest, IndexHashProfile) {
  absl::StatusOr<ServerConfig> c =
      FromText(R"pb(index { listen: "tcp://127.0.0.1:0" })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->index.hash_profile, HashProfile::kConductorXxh64);

  c = FromText(R"pb(index {
                      listen: "tcp://127.0.0.1:0"
                      hash_profile: "xxh3"
                      hash_seed: 42
                    })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->index.hash_profile, HashProfile::kRfcXxh3);
  EXPECT_EQ(c->index.hash_seed, 42u);

  c = FromText(R"pb(index { hash_profile: "fnv" })pb");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("index.hash_profile"));
  EXPECT_THAT(c.status().message(), HasSubstr("\"fnv\""));

  // The Conductor's XXH64 is unseeded: a seed there would be ignored.
  c = FromText(R"pb(index { hash_seed: 7 })pb");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("index.hash_seed: 7"));
}

TEST(ConfigTest, IndexDecodeBudget) {
  absl::StatusOr<ServerConfig> c =
      FromText(R"pb(index { listen: "tcp://127.0.0.1:0" })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ingest.decode_budget_bytes, int64_t{512} << 20);

  c = FromText(R"pb(index { decode_budget: "2GiB" })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ingest.decode_budget_bytes, int64_t{2} << 30);

  c = FromText(R"pb(index { decode_budget: "1KiB" })pb");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              HasSubstr("index.decode_budget: 1024 bytes is not between 1 "
                        "MiB and 1 PiB"));
  c = FromText(R"pb(index { decode_budget: "lots" })pb");
  EXPECT_THAT(c.status().message(), HasSubstr("index.decode_budget"));

  CommandLine flags;
  flags.index_decode_budget = "64MiB";
  c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ingest.decode_budget_bytes, int64_t{64} << 20);
}

TEST(ConfigTest, IndexPick) {
  absl::StatusOr<ServerConfig> c =
      FromText(R"pb(index { listen: "tcp://127.0.0.1:0" })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  const PickerOptions defaults;
  EXPECT_EQ(c->pick.request_tokens, defaults.request_tokens);
  EXPECT_EQ(c->pick.predicted_ttl, defaults.predicted_ttl);
  EXPECT_FALSE(c->pick.replay_clock);

  c = FromText(R"pb(index {
                      pick {
                        request_tokens: 0
                        kv_tokens: 2048
                        affinity_blocks: 4
                        tier_credits { key: "cpu" value: 0.75 }
                        tier_credits { key: "NVME" value: 0.1 }
                        predicted_ttl: "2s"
                        max_predicted: 1000
                        churn_weight: 0
                        churn_window: "5m"
                        replay_clock: true
                      }
                    })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->pick.replay_clock);
  EXPECT_EQ(c->pick.request_tokens, 0);  // set to zero, not left default
  EXPECT_EQ(c->pick.kv_tokens, 2048);
  EXPECT_EQ(c->pick.affinity_blocks, 4);
  EXPECT_EQ(c->pick.predicted_ttl, absl::Seconds(2));
  EXPECT_EQ(c->pick.max_predicted, 1000u);
  EXPECT_EQ(c->pick.churn_weight, 0);  // off, not left default
  EXPECT_EQ(c->pick.churn_window, absl::Minutes(5));
  double cpu = -1, nvme = -1;
  for (const TierCredit& t : c->pick.tier_credits) {
    if (t.medium == "CPU") cpu = t.credit;
    if (t.medium == "NVME") nvme = t.credit;
  }
  EXPECT_EQ(cpu, 0.75);
  EXPECT_EQ(nvme, 0.1);

  c = FromText(R"pb(index { pick { queued_weight: -1 } })pb");
  EXPECT_THAT(c.status().message(),
              HasSubstr("index.pick.queued_weight: -1 is not between 0 and"));
  c = FromText(
      R"pb(index { pick { tier_credits { key: "GPU" value: 2 } } })pb");
  EXPECT_THAT(c.status().message(),
              HasSubstr("index.pick.tier_credits[\"GPU\"]: 2 is not between "
                        "0 and 1"));
  c = FromText(
      R"pb(index { pick { tier_credits { key: "CPU/X" value: 1 } } })pb");
  EXPECT_THAT(c.status().message(), HasSubstr("without '/'"));
  c = FromText(R"pb(index { pick { predicted_ttl: "0s" } })pb");
  EXPECT_THAT(c.status().message(), HasSubstr("index.pick.predicted_ttl"));
  c = FromText(R"pb(index { pick { churn_weight: -0.5 } })pb");
  EXPECT_THAT(c.status().message(),
              HasSubstr("index.pick.churn_weight: -0.5 is not between 0 and"));
  c = FromText(R"pb(index { pick { churn_window: "-1s" } })pb");
  EXPECT_THAT(c.status().message(), HasSubstr("index.pick.churn_window"));
  c = FromText(R"pb(index { pick { max_window_picks: 999999999999 } })pb");
  EXPECT_THAT(c.status().message(), HasSubstr("index.pick.max_window_picks"));
}

// The engines' metrics endpoints: targets with sorted labels, the interval
// and a max age of three intervals unless given; each bad value named.
TEST(ConfigTest, IndexPickEngineMetrics) {
  absl::StatusOr<ServerConfig> c =
      FromText(R"pb(index {
                      listen: "tcp://127.0.0.1:0"
                      pick {
                        engine_metrics {
                          worker: "vllm-0"
                          url: "http://10.0.0.1:8000/metrics"
                          labels { key: "model_name" value: "m" }
                          labels { key: "engine" value: "1" }
                        }
                        engine_metrics {
                          worker: "sglang-0"
                          url: "HTTPS://h:30000/metrics"
                        }
                        engine_metrics_interval: "500ms"
                      }
                    })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  const EngineScrapeOptions& e = c->engine_scrape;
  ASSERT_EQ(e.targets.size(), 2u);
  EXPECT_EQ(e.targets[0].worker, "vllm-0");
  EXPECT_EQ(e.targets[0].url, "http://10.0.0.1:8000/metrics");
  ASSERT_EQ(e.targets[0].labels.size(), 2u);
  EXPECT_EQ(e.targets[0].labels[0].name, "engine");
  EXPECT_EQ(e.targets[0].labels[0].value, "1");
  EXPECT_EQ(e.interval, absl::Milliseconds(500));
  EXPECT_EQ(e.max_age, absl::Milliseconds(1500));

  c = FromText(R"pb(index { listen: "tcp://127.0.0.1:0" })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->engine_scrape.targets.empty());

  const struct {
    const char* pick;
    const char* error;
  } bad[] = {
      {R"pb(engine_metrics { url: "http://h/metrics" })pb",
       "index.pick.engine_metrics[0].worker: is 0 bytes"},
      {R"pb(engine_metrics { worker: "a" url: "ftp://h/metrics" })pb",
       "index.pick.engine_metrics[0].url: \"ftp://h/metrics\" is not an "
       "http://"},
      {R"pb(engine_metrics { worker: "a" url: "http://h/a b" })pb",
       "index.pick.engine_metrics[0].url"},
      {R"pb(engine_metrics { worker: "a" url: "http://h/" }
            engine_metrics { worker: "a" url: "http://g/" })pb",
       "index.pick.engine_metrics[1].worker: \"a\" is named by an earlier"},
      {R"pb(engine_metrics {
              worker: "a"
              url: "http://h/"
              labels { key: "1x" value: "" }
            })pb",
       "index.pick.engine_metrics[0].labels: \"1x\" is not a label name"},
      {R"pb(engine_metrics { worker: "a" url: "http://h/" }
            engine_metrics_interval: "0s")pb",
       "index.pick.engine_metrics_interval"},
      {R"pb(engine_metrics { worker: "a" url: "http://h/" }
            engine_metrics_interval: "2s"
            engine_metrics_max_age: "1s")pb",
       "index.pick.engine_metrics_max_age: 1s is shorter than "
       "engine_metrics_interval (2s)"},
      {R"pb(engine_metrics { worker: "a" url: "http://h/" }
            replay_clock: true)pb",
       "index.pick.engine_metrics: is read on the daemon's clock"},
  };
  for (const auto& b : bad) {
    c = FromText(absl::StrCat(
        R"pb(index { listen: "tcp://127.0.0.1:0" pick {)pb", b.pick, " } }"));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << b.pick;
    EXPECT_THAT(c.status().message(), HasSubstr(b.error)) << b.pick;
  }
}

// SGLang's load sockets: each a worker and a tcp:// endpoint, their
// readings' max age engine_metrics_max_age's; each bad value named.
TEST(ConfigTest, IndexPickEngineLoadSockets) {
  absl::StatusOr<ServerConfig> c =
      FromText(R"pb(index {
                      listen: "tcp://127.0.0.1:0"
                      pick {
                        engine_load_sockets {
                          worker: "sglang-0"
                          endpoint: "tcp://10.0.0.3:5559"
                        }
                        engine_load_sockets {
                          worker: "sglang-0/dp1"
                          endpoint: "tcp://10.0.0.3:5560"
                        }
                        engine_metrics_max_age: "2s"
                      }
                    })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->engine_load_sockets.size(), 2u);
  EXPECT_EQ(c->engine_load_sockets[1].worker, "sglang-0/dp1");
  EXPECT_EQ(c->engine_load_sockets[1].endpoint, "tcp://10.0.0.3:5560");
  EXPECT_TRUE(c->engine_scrape.targets.empty());
  EXPECT_EQ(c->engine_scrape.max_age, absl::Seconds(2));

  const struct {
    const char* pick;
    const char* error;
  } bad[] = {
      {R"pb(engine_load_sockets { endpoint: "tcp://h:1" })pb",
       "index.pick.engine_load_sockets[0].worker: is 0 bytes"},
      {R"pb(engine_load_sockets { worker: "a" endpoint: "http://h:1/" })pb",
       "index.pick.engine_load_sockets[0].endpoint: \"http://h:1/\" is not "
       "tcp://HOST:PORT"},
      {R"pb(engine_load_sockets { worker: "a" endpoint: "tcp://h" })pb",
       "index.pick.engine_load_sockets[0].endpoint: \"tcp://h\""},
      {R"pb(engine_load_sockets { worker: "a" endpoint: "ipc:///tmp/l" })pb",
       "index.pick.engine_load_sockets[0].endpoint"},
      {R"pb(engine_load_sockets { worker: "a" endpoint: "tcp://h:1" }
            engine_load_sockets { worker: "a" endpoint: "tcp://h:2" })pb",
       "index.pick.engine_load_sockets[1].worker: \"a\" is named by an "
       "earlier"},
      {R"pb(engine_load_sockets { worker: "a" endpoint: "tcp://h:1" }
            replay_clock: true)pb",
       "index.pick.engine_load_sockets: is read on the daemon's clock"},
  };
  for (const auto& b : bad) {
    c = FromText(absl::StrCat(
        R"pb(index { listen: "tcp://127.0.0.1:0" pick {)pb", b.pick, " } }"));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << b.pick;
    EXPECT_THAT(c.status().message(), HasSubstr(b.error)) << b.pick;
  }
}

// The Conductor API: on by http_listen alone (the index with it), loopback
// only with auth off; sources carry a registration's labels.
// An SGLang worker named by URL (sources { server_info_url }, or
// --index_source=NAME=http://...): a discovery entry with the source's
// labels, not an ingest source; its name is checked against the others.
TEST(ConfigTest, SglangWorkerByUrl) {
  absl::StatusOr<ServerConfig> c = FromText(R"pb(
    index {
      block_size: 32
      sources {
        name: "sg"
        server_info_url: "http://10.0.0.3:30000"
        replay_port: 5657
        resolve_interval: "3s"
        model: "m"
      }
      sources { name: "v" endpoint: "tcp://10.0.0.4:5557" }
    })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->sglang_discovery.workers.size(), 1u);
  const SglangWorker& w = c->sglang_discovery.workers[0];
  EXPECT_EQ(w.name, "sg");
  EXPECT_EQ(w.url, "http://10.0.0.3:30000");
  EXPECT_EQ(w.replay_port, 5657);
  EXPECT_EQ(w.interval, absl::Seconds(3));
  EXPECT_EQ(w.labels.model, "m");
  EXPECT_EQ(c->sglang_discovery.block_size, 32);
  ASSERT_EQ(c->ingest.sources.size(), 1u);
  EXPECT_EQ(c->ingest.sources[0].name, "v");

  c = FromText(R"pb(index {
                      sources { name: "v" server_info_url: "http://h:1" }
                      sources { name: "v" endpoint: "tcp://h:2" }
                    })pb");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("index.sources[v]: the name is used twice"));
  c = FromText(R"pb(index {
                      sources {
                        name: "sg"
                        server_info_url: "http://h:1"
                        replay_port: 70000
                      }
                    })pb");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("index.sources[sg].replay_port: 70000 is not a port"));
  c = FromText(
      R"pb(index { sources { name: "a/b" server_info_url: "http://h:1" } })pb");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("must be non-empty and contain no '/'"));

  // A pool: a worker per address, each its own instance and address, so
  // neither may be configured.
  c = FromText(R"pb(index {
                      sources {
                        name: "sg"
                        server_info_url: "http://sglang.svc:30000"
                        server_info_pool: true
                      }
                    })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->sglang_discovery.workers[0].pool);
  for (const char* field : {"instance_id", "address"}) {
    c = FromText(absl::StrCat(
        "index { sources { name: 'sg' server_info_url: 'http://h:1' ",
        "server_info_pool: true ", field, ": 'x' } }"));
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_THAT(c.status().message(),
                HasSubstr(absl::StrCat("index.sources[sg].", field,
                                       ": \"x\" names one worker")));
  }

  // SGLang's --api-key from a file, white space around it left out.
  const std::string key = WriteFile("sglang_key", "  sk-7\n");
  c = FromText(absl::StrCat(
      "index { sources { name: 'sg' server_info_url: 'http://h:1' ",
      "server_info_api_key_file: '", key, "' } }"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sglang_discovery.workers[0].api_key, "sk-7");
  for (const auto& [text, want] :
       {std::pair<const char*, const char*>{" \n", "is empty"},
        {"a\nb\n", "holds more than one line"}}) {
    const std::string bad = WriteFile("sglang_bad_key", text);
    c = FromText(absl::StrCat(
        "index { sources { name: 'sg' server_info_url: 'http://h:1' ",
        "server_info_api_key_file: '", bad, "' } }"));
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_THAT(
        c.status().message(),
        HasSubstr(absl::StrCat("index.sources[sg].server_info_api_key_file: \"",
                               bad, "\" ", want)));
  }

  CommandLine flags;
  flags.index_sources = {"sg=http://10.0.0.3:30000", "v=tcp://h:1,tcp://h:2"};
  v1::Config config;
  ApplyCommandLine(flags, &config);
  ASSERT_EQ(config.index().sources_size(), 2);
  EXPECT_EQ(config.index().sources(0).server_info_url(),
            "http://10.0.0.3:30000");
  EXPECT_TRUE(config.index().sources(0).endpoint().empty());
  EXPECT_EQ(config.index().sources(1).replay_endpoint(), "tcp://h:2");
}

TEST(ConfigTest, IndexHttpListenAndSourceLabels) {
  absl::StatusOr<ServerConfig> c = FromText(
      R"pb(index { http_listen: "127.0.0.1:0" state_dir: "/var/lib/x" })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->index_enabled);
  EXPECT_EQ(c->index_http_listen, "127.0.0.1:0");
  EXPECT_EQ(c->index_state_dir, "/var/lib/x");

  c = FromText(R"pb(index { http_listen: "0.0.0.0:9470" })pb");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("index.http_listen: \"0.0.0.0:9470\" is reachable"));
  // With TLS on the gRPC side the Conductor API serves HTTPS with the same
  // certificate: any address, in TOKEN and in MTLS.
  for (const char* mode : {"TOKEN", "MTLS"}) {
    const bool mtls = absl::string_view(mode) == "MTLS";
    c = FromText(absl::StrCat(
        "auth { mode: ", mode, mtls ? " client_ca_path: '/ca.pem'" : "",
        " tls_cert_path: '/c.pem' tls_key_path: '/k.pem' }\n",
        "principals { name: 'e' role: ENGINE tenants: '*'",
        mtls ? " cert_subject: 'e'" : "", " token_sha256: '",
        std::string(64, 'a'), "' }\n",
        "index { http_listen: '10.0.0.5:9470' }"));
    ASSERT_TRUE(c.ok()) << mode << ": " << c.status();
    EXPECT_EQ(c->index_http_listen, "10.0.0.5:9470") << mode;
  }
  c = FromText(R"pb(index { http_listen: "unix:///tmp/x" })pb");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("must be host:port"));
  EXPECT_EQ(FromText(R"pb(index { http_listen: "127.0.0.1:0" })pb")
                ->index_http_answer,
            AnswerForm::kByTenant);
  c = FromText(
      R"pb(index { http_listen: "127.0.0.1:0" http_answer: "by_instance" })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->index_http_answer, AnswerForm::kByInstance);
  c = FromText(
      R"pb(index { http_listen: "127.0.0.1:0" http_answer: "flat" })pb");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("index.http_answer: \"flat\" is neither \"by_tenant\" "
                        "nor \"by_instance\""));
  CommandLine flags;
  flags.index_http_listen = "127.0.0.1:0";
  flags.index_http_answer = "by_instance";
  c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->index_http_answer, AnswerForm::kByInstance);

  c = FromText(R"pb(index {
                      sources {
                        name: "store"
                        endpoint: "tcp://127.0.0.1:1"
                        instance_id: "vllm-a"
                        tenant: "acme"
                        model: "llama"
                        dp_rank: 2
                        lora_name: "l"
                        salt: "s"
                        address: "10.0.0.7:8000"
                        type: "mooncake"
                        swa_window_tokens: 4096
                      }
                    })pb");
  ASSERT_TRUE(c.ok()) << c.status();
  const IndexSource& s = c->ingest.sources[0];
  EXPECT_TRUE(s.pinned);
  EXPECT_EQ(s.labels.instance_id, "vllm-a");
  EXPECT_EQ(s.labels.tenant, "acme");
  EXPECT_EQ(s.labels.model, "llama");
  EXPECT_EQ(s.labels.dp_rank, 2);
  EXPECT_EQ(s.labels.lora_name, "l");
  EXPECT_EQ(s.labels.salt, "s");
  EXPECT_EQ(s.labels.address, "10.0.0.7:8000");
  EXPECT_TRUE(s.labels.hashes_are_keys);
  EXPECT_EQ(s.labels.swa_window_tokens, 4096u);

  c = FromText(
      R"pb(index {
             sources { name: "e" endpoint: "tcp://127.0.0.1:1" type: "trt" }
           })pb");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("index.sources[e].type: \"trt\" is none of"));
}

TEST(ConfigTest, MissingFileIsNotFoundWithItsPath) {
  CommandLine flags;
  flags.config_paths = {"/nonexistent/prefixd.textproto"};
  absl::StatusOr<ServerConfig> c = LoadServerConfig(flags);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(),
              HasSubstr("/nonexistent/prefixd.textproto"));
}

TEST(ConfigTest, SyntaxErrorsNameFileAndLine) {
  absl::StatusOr<ServerConfig> c =
      FromText("block_size: 16\nkv_budgett: \"1GiB\"\n");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), AllOf(HasSubstr("config_test.textproto:2:"),
                                          HasSubstr("kv_budgett")));

  CommandLine flags;
  flags.config_paths = {WriteFile("bad.json", R"({"blockSize": "many"})")};
  c = LoadServerConfig(flags);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("bad.json"));
}

// A pod's init container joins its ConfigMap's config and its Secret's
// principals with cat; several --config files are joined the same way.
TEST(ConfigTest, SeveralFilesAreJoinedInOrder) {
  CommandLine flags;
  flags.config_paths = {
      WriteFile("base.textproto",
                "listen: \"0.0.0.0:50051\"\nauth { mode: TOKEN }\n"
                "tenants { name: \"a\" }"),  // no final newline
      WriteFile("principals.textproto",
                "principals { name: \"p\" role: ENGINE token_sha256: \"" +
                    std::string(64, 'a') + "\" tenants: \"*\" }\n"),
      WriteFile("more.textproto", "tenants { name: \"b\" }\n")};
  absl::StatusOr<ServerConfig> c = LoadServerConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->proto.principals_size(), 1);
  EXPECT_EQ(c->proto.tenants_size(), 2);  // repeated fields add up

  // Errors name the file and its own line.
  flags.config_paths = {
      WriteFile("one.textproto", "# a\nkv_budget: \"1GiB\"\n"),
      WriteFile("two.textproto", "\n\nkv_budget: \"2GiB\"\n")};
  c = LoadServerConfig(flags);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr("two.textproto:3:"),
                    HasSubstr("\"kv_budget\" is specified multiple times")));
  flags.config_paths = {WriteFile("one.textproto", "kv_budget: \"1GiB\"\n"),
                        WriteFile("three.textproto", "\nblock_sise: 16\n")};
  EXPECT_THAT(LoadServerConfig(flags).status().message(),
              AllOf(HasSubstr("three.textproto:2:"), HasSubstr("block_sise")));
  // JSON cannot be joined.
  flags.config_paths = {WriteFile("one.textproto", ""),
                        WriteFile("x.json", "{}")};
  EXPECT_THAT(LoadServerConfig(flags).status().message(),
              HasSubstr("only textproto files can be joined"));
}

struct BadValue {
  std::string textproto;
  std::vector<std::string> message_has;  // the field and the value
};

void PrintTo(const BadValue& v, std::ostream* os) { *os << v.textproto; }

class BadValueTest : public ::testing::TestWithParam<BadValue> {};

TEST_P(BadValueTest, IsInvalidArgumentNamingFieldAndValue) {
  absl::StatusOr<ServerConfig> c = FromText(GetParam().textproto);
  ASSERT_FALSE(c.ok()) << GetParam().textproto;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument)
      << c.status();
  for (const std::string& s : GetParam().message_has) {
    EXPECT_THAT(c.status().message(), HasSubstr(s));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Config, BadValueTest,
    ::testing::Values(
        BadValue{R"pb(kv_budget: "4GiX")pb", {"kv_budget", "4GiX"}},
        BadValue{R"pb(kv_budget: "-1GiB")pb", {"kv_budget", "-1GiB"}},
        BadValue{R"pb(kv_budget: "lots tokens")pb",
                 {"kv_budget", "lots tokens"}},
        BadValue{R"pb(kv_dtype: "fp7")pb", {"kv_dtype", "fp7"}},
        BadValue{R"pb(model { preset: "llama-9" })pb",
                 {"model.preset", "llama-9"}},
        BadValue{R"pb(model { preset: "llama-3-8b" layers: 2 })pb",
                 {"model", "exactly one"}},
        BadValue{R"pb(model { layers: 32 head_dim: 128 })pb", {"kv_heads 0"}},
        BadValue{R"pb(model {
                        layers: 4
                        kv_heads: 8
                        head_dim: 64
                        kv_lora_rank: 512
                      })pb",
                 {"kv_lora_rank 512", "kv_heads 8"}},
        BadValue{R"pb(model {
                        layers: 4
                        kv_heads: 8
                        head_dim: 64
                        sliding_layers: 5
                        sliding_window: 64
                      })pb",
                 {"sliding_layers 5", "layers 4"}},
        BadValue{R"pb(model {
                        layers: 4
                        kv_heads: 8
                        head_dim: 64
                        state_layers: 2
                        state_bytes: "1Mi"
                      })pb",
                 {"model.state_bytes", "1Mi"}},
        BadValue{R"pb(model { preset: "llama-3-8b" kv_lora_rank: 512 })pb",
                 {"model", "exactly one"}},
        BadValue{
            R"pb(model { layers: 4000000000 kv_heads: 8 head_dim: 128 })pb",
            {"model.layers", "4000000000"}},
        BadValue{R"pb(rope { scaling: "dynamic" factor: 2 shift: ALLOW })pb",
                 {"dynamic"}},
        BadValue{R"pb(rope { scaling: "wavy" })pb", {"rope.scaling", "wavy"}},
        BadValue{R"pb(rope { layout: "sideways" })pb",
                 {"rope.layout", "sideways"}},
        BadValue{R"pb(listen: "127.0.0.1:99999")pb", {"listen", "99999"}},
        BadValue{R"pb(listen: "localhost")pb", {"listen", "localhost"}},
        BadValue{R"pb(listen: "unix://")pb", {"listen", "unix://"}},
        BadValue{R"pb(listen: "::1:50051")pb",
                 {"listen", "::1:50051", "brackets"}},
        BadValue{R"pb(listen: "127.0.0.1:7000" listen: "127.0.0.1:7000")pb",
                 {"listen", "127.0.0.1:7000", "twice"}},
        BadValue{R"pb(listen: "0.0.0.0:50051")pb",
                 {"listen", "0.0.0.0:50051", "auth"}},
        BadValue{R"pb(listen: "10.1.2.3:50051")pb",
                 {"listen", "10.1.2.3:50051"}},
        BadValue{R"pb(metrics_listen: "unix:///tmp/m.sock")pb",
                 {"metrics_listen", "m.sock"}},
        BadValue{R"pb(lease_ttl: "-5s")pb", {"lease_ttl", "-5s"}},
        BadValue{R"pb(lease_ttl: "0s")pb", {"lease_ttl", "0s"}},
        BadValue{R"pb(lease_ttl: "forever")pb", {"lease_ttl", "forever"}},
        BadValue{R"pb(drain_timeout: "soon")pb", {"drain_timeout", "soon"}},
        BadValue{R"pb(limits { max_message_size: "10" })pb",
                 {"limits.max_message_size", "10"}},
        BadValue{R"pb(limits { max_lease_ttl: "1y" })pb",
                 {"limits.max_lease_ttl", "1y"}},
        BadValue{R"pb(tenants { name: "acme" reserved: "lots" })pb",
                 {"tenants[0] (acme).reserved", "lots"}},
        BadValue{R"pb(dynamic_tenants { limit: "2XB" })pb",
                 {"dynamic_tenants.limit", "2XB"}},
        BadValue{R"pb(events_per_tenant: 100000000)pb",
                 {"events_per_tenant", "100000000"}},
        BadValue{R"pb(event_ring_bytes: "1KiB")pb",
                 {"event_ring_bytes", "1KiB", "1024 bytes"}},
        BadValue{R"pb(event_ring_bytes: "2GiB")pb",
                 {"event_ring_bytes", "2GiB"}},
        BadValue{R"pb(limits { watch_reply_bytes: "1KiB" })pb",
                 {"limits.watch_reply_bytes", "1KiB", "1024 bytes"}},
        BadValue{R"pb(limits { watch_stall_timeout: "0s" })pb",
                 {"limits.watch_stall_timeout", "0s"}},
        BadValue{R"pb(limits { max_bytes_before_auth: "1KiB" })pb",
                 {"limits.max_bytes_before_auth", "1KiB", "1024 bytes"}},
        BadValue{R"pb(limits { max_bytes_before_auth: "32MiB" })pb",
                 {"limits.max_bytes_before_auth", "33554432 bytes",
                  "max_message_size (16777216)"}}));

TEST(ConfigTest, UnixPathLongerThanSunPathIsRefused) {
  std::string path(120, 'x');
  absl::StatusOr<ServerConfig> c = FromText("listen: \"unix:///" + path + "\"");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("121 bytes"));
}

}  // namespace
}  // namespace prefixd
