#include "index/engine_metrics.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/engine_loads.h"
#include "index/fleet_index.h"
#include "index/picker.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

// The shape of vLLM's /metrics: HELP and TYPE lines, one series per engine
// (DP rank), histograms and counters around the gauges.
constexpr char kVllm[] =
    R"(# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:num_requests_running_total counter
vllm:num_requests_running_total{engine="0",model_name="m"} 99.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
)";

// SGLang's, as its production metrics document shows it.
constexpr char kSglang[] = R"(# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
)";

TEST(EngineMetricsTest, ReadsVllmSummingRequestsAndTakingTheFullestEngine) {
  absl::StatusOr<EngineLoad> all = ReadEngineMetrics(kVllm, {});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->running, 7);
  EXPECT_EQ(all->waiting, 2);
  EXPECT_DOUBLE_EQ(all->kv_usage, 0.5);
  const LabelPair rank0[] = {{"engine", "0"}};
  absl::StatusOr<EngineLoad> one = ReadEngineMetrics(kVllm, rank0);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->running, 3);
  EXPECT_EQ(one->waiting, 2);
  EXPECT_DOUBLE_EQ(one->kv_usage, 0.25);
}

TEST(EngineMetricsTest, ReadsSglang) {
  absl::StatusOr<EngineLoad> l = ReadEngineMetrics(kSglang, {});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->running, 12);
  EXPECT_EQ(l->waiting, 5);
  EXPECT_DOUBLE_EQ(l->kv_usage, 0.28);
}

TEST(EngineMetricsTest, OlderVllmUsageNameCountsOnlyWithoutTheNewer) {
  const std::string old =
      "vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.75\n";
  absl::StatusOr<EngineLoad> l = ReadEngineMetrics(old, {});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_DOUBLE_EQ(l->kv_usage, 0.75);
  l = ReadEngineMetrics(old + "vllm:kv_cache_usage_perc 0.5\n", {});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_DOUBLE_EQ(l->kv_usage, 0.5);
}

TEST(EngineMetricsTest, TheFormatsLatitudes) {
  // Escaped label values, a trailing comma, blanks, a timestamp, CRLF,
  // exponent notation, no trailing newline, usage above 1 clamped.
  const char text[] =
      "vllm:num_requests_running{a=\"x\\\"y\\\\z\\n\" , engine=\"0\",} "
      "2e0 1700000000000\r\n"
      "  vllm:num_requests_waiting {engine=\"0\"}\t1\n"
      "vllm:kv_cache_usage_perc{engine=\"0\"} 1.0000001";
  const LabelPair match[] = {{"a", "x\"y\\z\n"}};
  absl::StatusOr<EngineLoad> l = ReadEngineMetrics(text, match);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->running, 2);
  EXPECT_EQ(l->waiting, 0);  // its series lacks label a
  EXPECT_DOUBLE_EQ(l->kv_usage, 0);
  l = ReadEngineMetrics(text, {});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->waiting, 1);
  EXPECT_DOUBLE_EQ(l->kv_usage, 1.0);
}

TEST(EngineMetricsTest, ErrorsNameTheLine) {
  const struct {
    const char* text;
    const char* error;
  } cases[] = {
      {"# ok\nvllm:num_requests_running{engine=\"0\" 1\n",
       "line 2 (vllm:num_requests_running{engine=\\\"0\\\" 1): labels are not "
       "separated by ','"},
      {"vllm:num_requests_running{engine=0} 1", "label engine's value is not"},
      {"vllm:num_requests_running{engine=\"0} 1", "no closing quote"},
      {"vllm:num_requests_running{engine=\"\\t\"} 1", "the escape \\t ("},
      {"vllm:num_requests_running{=\"0\"} 1", "a label name is missing"},
      {"vllm:num_requests_running", "the value is missing"},
      {"vllm:num_requests_running abc", "the value \"abc\" is not a number"},
      {"vllm:num_requests_running -1", "the value -1 is not a finite number"},
      {"vllm:num_requests_running NaN", "the value nan is not a finite"},
      {"vllm:num_requests_running +Inf", "the value inf is not a finite"},
      {"vllm:num_requests_running 1 2 3", "more follows the value"},
      {"vllm:num_requests_running 1 x", "the timestamp \"x\" is not"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<EngineLoad> l = ReadEngineMetrics(c.text, {});
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(l.status().message(), HasSubstr(c.error)) << c.text;
  }
}

TEST(EngineMetricsTest, NoRequestGaugeIsNotFound) {
  absl::StatusOr<EngineLoad> l =
      ReadEngineMetrics("process_cpu_seconds_total 3\n", {});
  EXPECT_EQ(l.status().code(), absl::StatusCode::kNotFound);
  const LabelPair rank7[] = {{"engine", "7"}};
  l = ReadEngineMetrics(kVllm, rank7);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(l.status().message(), HasSubstr("with labels {engine=\"7\"}"));
  // Lines of other names are not read, however malformed.
  EXPECT_TRUE(
      ReadEngineMetrics("vllm:other{{{ x\nvllm:num_requests_running 1", {})
          .ok());
}

TEST(EngineLoadsTest, ReadingsAgeOutAndNeverGoBack) {
  EngineLoads loads(absl::Seconds(3));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  loads.Set("a", EngineLoad{1, 2, 0.5}, t0);
  ASSERT_TRUE(loads.Fresh("a", t0 + absl::Seconds(3)).has_value());
  EXPECT_EQ(loads.Fresh("a", t0 + absl::Seconds(3))->running, 1);
  EXPECT_FALSE(loads.Fresh("a", t0 + absl::Seconds(4)).has_value());
  EXPECT_FALSE(loads.Fresh("b", t0).has_value());
  loads.Set("a", EngineLoad{9, 9, 0.9}, t0 - absl::Seconds(1));  // older
  EXPECT_EQ(loads.Fresh("a", t0)->running, 1);
}

// A candidate the query gives no load for is charged its engine's figures
// while they are fresh, with the window's queued tokens; then the window's.
TEST(PickerEngineLoadTest, FreshEngineFiguresReplaceTheWindowsGuess) {
  IndexOptions io;
  io.block_size = 4;
  FleetIndex index(io);
  index.AddWorker("a", "tcp://a");
  index.AddWorker("b", "tcp://b");
  EngineLoads loads(absl::Seconds(2));
  PickerOptions o;
  o.request_tokens = 10;
  o.kv_tokens = 100;
  o.queued_weight = 1;
  o.churn_weight = 0;
  o.load_window = absl::Seconds(5);
  Picker picker(&index, o, &loads);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  loads.Set("a", EngineLoad{3, 2, 0.5}, t0);
  std::vector<Token> tokens(8, 1);
  PickQuery q;
  q.prompt.tokens = tokens;
  absl::StatusOr<PickResult> r = picker.Pick(q, t0 + absl::Seconds(1));
  ASSERT_TRUE(r.ok()) << r.status();
  // a: 8 + 5 x 10 + 0.5 x 100 = 108; b, idle: 8.
  EXPECT_EQ(r->worker, "b");
  const PickCandidate& a = r->ranked[1];
  ASSERT_EQ(a.worker, "a");
  EXPECT_TRUE(a.load_from_engine);
  EXPECT_FALSE(a.load_from_request);
  EXPECT_EQ(a.requests_in_flight, 5);
  EXPECT_DOUBLE_EQ(a.kv_usage, 0.5);
  EXPECT_DOUBLE_EQ(a.load_term, 100);
  EXPECT_FALSE(r->ranked[0].load_from_engine);

  // Three seconds on, a's figures are stale: b's pick is its window load.
  q.dry_run = true;
  r = picker.Pick(q, t0 + absl::Seconds(3));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->worker, "a");
  for (const PickCandidate& c : r->ranked) {
    EXPECT_FALSE(c.load_from_engine) << c.worker;
    EXPECT_DOUBLE_EQ(c.kv_usage, 0) << c.worker;
  }
  EXPECT_EQ(r->ranked[1].requests_in_flight, 1);  // b: the pick above

  // Loads the router gives win over the engine's.
  loads.Set("a", EngineLoad{3, 2, 0.5}, t0 + absl::Seconds(3));
  const WorkerLoadInput given[] = {{"a", 0, 0, 0}};
  q.loads = given;
  r = picker.Pick(q, t0 + absl::Seconds(3));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ranked[0].load_from_request);
  EXPECT_FALSE(r->ranked[0].load_from_engine);
}

}  // namespace
}  // namespace prefixd
