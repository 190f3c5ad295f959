#include "server/http/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "kv_indexer/v1/kv_indexer.pb.h"
#include "prefixd/v1/prefix_cache.pb.h"
#include "prefixd/v1/prefix_index.pb.h"
#include "server/http/metrics_listener.h"

namespace prefixd {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;
using ::testing::HasSubstr;
using ::testing::Not;

const MetricFamily* FindFamily(const std::vector<MetricFamily>& families,
                               const std::string& name) {
  for (const MetricFamily& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// The value of the sample of `name` whose labels are exactly `labels`, or
// -1 if there is none.
double Value(const std::vector<MetricFamily>& families, const std::string& name,
             std::map<std::string, std::string> labels = {}) {
  const MetricFamily* f = FindFamily(families, name);
  if (f == nullptr) return -1;
  for (const prometheus::ClientMetric& m : f->metric) {
    std::map<std::string, std::string> got;
    for (const auto& l : m.label) got[l.name] = l.value;
    if (got != labels) continue;
    return f->type == MetricType::Counter ? m.counter.value : m.gauge.value;
  }
  return -1;
}

CacheStats TwoTenants() {
  CacheStats s;
  s.block_size = 16;
  s.block_bytes = 1000;
  s.budget_bytes = 64000;
  TenantUsage a;
  a.tenant = "acme";
  a.reserved_bytes = 8000;
  a.limit_bytes = 32000;
  a.cached_blocks = 7;
  a.pinned_blocks = 3;
  a.tree_nodes = 2;
  a.active_leases = 1;
  a.match_requests = 5;
  a.match_tokens = 400;
  a.match_hit_tokens = 96;
  a.insert_requests = 4;
  a.inserted_blocks = 9;
  a.redundant_blocks = 1;
  a.lease_expired = 2;
  a.evicted_blocks = {1, 0, 2, 0, 0};
  TenantUsage b;
  b.tenant = "default";
  b.limit_bytes = 64000;
  s.tenants = {a, b};
  return s;
}

TEST(CacheMetricFamiliesTest, CountersAndGaugesComeFromStats) {
  const std::vector<MetricFamily> f =
      CacheMetricFamilies(TwoTenants(), "1.2.3");
  const std::map<std::string, std::string> acme = {{"tenant", "acme"}};
  EXPECT_EQ(Value(f, "prefixd_match_requests_total", acme), 5);
  EXPECT_EQ(Value(f, "prefixd_match_tokens_total", acme), 400);
  EXPECT_EQ(Value(f, "prefixd_match_hit_tokens_total", acme), 96);
  EXPECT_EQ(Value(f, "prefixd_insert_requests_total", acme), 4);
  EXPECT_EQ(Value(f, "prefixd_inserted_blocks_total", acme), 9);
  EXPECT_EQ(Value(f, "prefixd_redundant_blocks_total", acme), 1);
  EXPECT_EQ(Value(f, "prefixd_lease_expired_total", acme), 2);
  EXPECT_EQ(Value(f, "prefixd_cached_blocks", acme), 7);
  EXPECT_EQ(Value(f, "prefixd_cached_bytes", acme), 7000);
  EXPECT_EQ(Value(f, "prefixd_pinned_blocks", acme), 3);
  EXPECT_EQ(Value(f, "prefixd_tree_nodes", acme), 2);
  EXPECT_EQ(Value(f, "prefixd_active_leases", acme), 1);
  EXPECT_EQ(Value(f, "prefixd_tenant_reserved_bytes", acme), 8000);
  EXPECT_EQ(Value(f, "prefixd_tenant_limit_bytes", acme), 32000);
  EXPECT_EQ(Value(f, "prefixd_evicted_blocks_total",
                  {{"tenant", "acme"}, {"reason", "requested"}}),
            2);
  EXPECT_EQ(Value(f, "prefixd_evicted_bytes_total",
                  {{"tenant", "acme"}, {"reason", "budget"}}),
            1000);
  EXPECT_EQ(Value(f, "prefixd_budget_bytes"), 64000);
  EXPECT_EQ(Value(f, "prefixd_block_bytes"), 1000);
  EXPECT_EQ(Value(f, "prefixd_build_info", {{"version", "1.2.3"}}), 1);
  EXPECT_EQ(Value(f, "prefixd_cached_bytes", {{"tenant", "default"}}), 0);
}

TEST(CacheMetricFamiliesTest, EveryReasonOfEveryTenantIsPresentZeroIncluded) {
  const std::vector<MetricFamily> f = CacheMetricFamilies(TwoTenants(), "v");
  for (const char* tenant : {"acme", "default"}) {
    for (const char* reason :
         {"budget", "limit", "requested", "invalidated", "reset"}) {
      for (const char* name :
           {"prefixd_evicted_blocks_total", "prefixd_evicted_bytes_total"}) {
        EXPECT_GE(Value(f, name, {{"tenant", tenant}, {"reason", reason}}), 0)
            << name << " " << tenant << " " << reason;
      }
    }
  }
  EXPECT_EQ(FindFamily(f, "prefixd_evicted_blocks_total")->metric.size(), 10u);
}

TEST(CacheMetricFamiliesTest, RetentionClassesComeFromStats) {
  CacheStats s = TwoTenants();
  TenantUsage& acme = s.tenants[0];
  acme.cached_blocks_by_retention[0] = 2;
  acme.cached_blocks_by_retention[1] = 4;
  acme.cached_blocks_by_retention[2] = 1;
  acme.evicted_blocks_by_retention[0] = 3;
  acme.evicted_blocks_by_retention[2] = 5;
  const std::vector<MetricFamily> f = CacheMetricFamilies(s, "v");
  const std::string cached = "prefixd_cached_blocks_by_retention";
  const std::string evicted = "prefixd_evicted_blocks_by_retention_total";
  ASSERT_NE(FindFamily(f, cached), nullptr);
  ASSERT_NE(FindFamily(f, evicted), nullptr);
  EXPECT_EQ(FindFamily(f, cached)->type, MetricType::Gauge);
  EXPECT_EQ(FindFamily(f, evicted)->type, MetricType::Counter);
  EXPECT_EQ(Value(f, cached, {{"tenant", "acme"}, {"retention", "low"}}), 2);
  EXPECT_EQ(Value(f, cached, {{"tenant", "acme"}, {"retention", "default"}}),
            4);
  EXPECT_EQ(Value(f, cached, {{"tenant", "acme"}, {"retention", "high"}}), 1);
  EXPECT_EQ(Value(f, evicted, {{"tenant", "acme"}, {"retention", "low"}}), 3);
  EXPECT_EQ(Value(f, evicted, {{"tenant", "acme"}, {"retention", "default"}}),
            0);
  EXPECT_EQ(Value(f, evicted, {{"tenant", "acme"}, {"retention", "high"}}), 5);
  // Every class of every tenant, zero included.
  EXPECT_EQ(FindFamily(f, cached)->metric.size(), 6u);
  EXPECT_EQ(Value(f, evicted, {{"tenant", "default"}, {"retention", "high"}}),
            0);
}

TEST(CacheMetricFamiliesTest, NoTenantsStillExportsTheGlobalGauges) {
  CacheStats s;
  s.block_bytes = 10;
  s.budget_bytes = 100;
  const std::vector<MetricFamily> f = CacheMetricFamilies(s, "v");
  EXPECT_EQ(Value(f, "prefixd_budget_bytes"), 100);
  EXPECT_TRUE(FindFamily(f, "prefixd_cached_bytes")->metric.empty());
}

TEST(CacheMetricFamiliesTest, NamesFollowPrometheusConventions) {
  for (const MetricFamily& f : CacheMetricFamilies(TwoTenants(), "v")) {
    EXPECT_FALSE(f.help.empty()) << f.name;
    EXPECT_TRUE(absl::StartsWith(f.name, "prefixd_")) << f.name;
    EXPECT_EQ(f.type == MetricType::Counter, absl::EndsWith(f.name, "_total"))
        << f.name;
  }
}

TEST(PoolLookupFamiliesTest, EachPoolBySource) {
  std::vector<PoolLookups> pools(2);
  pools[0].source = "vllm";
  pools[0].answered = 4;
  pools[0].failed = 9;
  pools[0].addresses = 3;
  pools[1].source = "sg";
  pools[1].answered = 13;
  const std::vector<MetricFamily> f = PoolLookupFamilies(pools);
  EXPECT_EQ(Value(f, "prefixd_index_pool_lookups_total",
                  {{"source", "vllm"}, {"result", "answered"}}),
            4);
  EXPECT_EQ(Value(f, "prefixd_index_pool_lookups_total",
                  {{"source", "vllm"}, {"result", "failed"}}),
            9);
  EXPECT_EQ(Value(f, "prefixd_index_pool_lookups_total",
                  {{"source", "sg"}, {"result", "failed"}}),
            0);
  EXPECT_EQ(Value(f, "prefixd_index_pool_addresses", {{"source", "vllm"}}), 3);
  EXPECT_EQ(Value(f, "prefixd_index_pool_addresses", {{"source", "sg"}}), 0);
  for (const MetricFamily& family : f) {
    EXPECT_EQ(family.type == MetricType::Counter,
              absl::EndsWith(family.name, "_total"))
        << family.name;
    EXPECT_FALSE(family.help.empty()) << family.name;
  }
}

TEST(EventsPublishMetricFamiliesTest, CountersComeFromStats) {
  EventsPublishStats st;
  st.wire.batches = 12;
  st.wire.bytes = 3456;
  st.wire.replay_requests = 2;
  st.wire.buffered_bytes = 65536;
  st.events = {30, 7, 1};
  st.resyncs = {1, 3};
  const std::vector<MetricFamily> f = EventsPublishMetricFamilies(st);
  EXPECT_EQ(Value(f, "prefixd_events_published_batches_total"), 12);
  EXPECT_EQ(Value(f, "prefixd_events_published_bytes_total"), 3456);
  EXPECT_EQ(Value(f, "prefixd_events_replay_requests_total"), 2);
  EXPECT_EQ(Value(f, "prefixd_events_replay_buffer_bytes"), 65536);
  EXPECT_EQ(
      Value(f, "prefixd_events_published_total", {{"type", "BlockStored"}}),
      30);
  EXPECT_EQ(
      Value(f, "prefixd_events_published_total", {{"type", "BlockRemoved"}}),
      7);
  EXPECT_EQ(Value(f, "prefixd_events_published_total",
                  {{"type", "AllBlocksCleared"}}),
            1);
  EXPECT_EQ(Value(f, "prefixd_events_resyncs_total", {{"reason", "start"}}), 1);
  EXPECT_EQ(Value(f, "prefixd_events_resyncs_total", {{"reason", "overflow"}}),
            3);
  for (const MetricFamily& family : f) {
    // Counters end in _total; the one gauge is the replay buffer's size.
    EXPECT_EQ(family.type == MetricType::Counter,
              absl::EndsWith(family.name, "_total"))
        << family.name;
    EXPECT_FALSE(family.help.empty()) << family.name;
  }
}

TEST(ProcessMetricFamiliesTest, ReadsThisProcess) {
  const std::vector<MetricFamily> f = ProcessMetricFamilies();
  EXPECT_GT(Value(f, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GT(Value(f, "process_virtual_memory_bytes"), 1 << 20);
  EXPECT_GE(Value(f, "process_cpu_seconds_total"), 0);
  EXPECT_GE(Value(f, "process_open_fds"), 3);
  EXPECT_GT(Value(f, "process_max_fds"), 0);
  const double start = Value(f, "process_start_time_seconds");
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(start, now + 1);
  EXPECT_GT(start, now - 3600);
  for (const MetricFamily& m : f) EXPECT_FALSE(m.help.empty()) << m.name;
}

class FakeProcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("metrics_test_proc_", getpid());
    std::filesystem::create_directories(dir_ / "self" / "fd");
    for (const char* fd : {"0", "1", "2", "5"}) {
      std::ofstream(dir_ / "self" / "fd" / fd) << "";
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& rel, const std::string& text) {
    std::ofstream(dir_ / rel) << text;
  }

  std::filesystem::path dir_;
};

TEST_F(FakeProcTest, ParsesStatAfterTheCommandName) {
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);
  // The command name holds spaces and a ')': fields count from the last one.
  Write("self/stat",
        absl::StrCat("42 (pre fix) d) S 1 42 42 0 -1 4194304 100 0 0 0 ",
                     3 * ticks, " ", 2 * ticks, " 0 0 20 0 8 0 ", 50 * ticks,
                     " 123456789 1000 18446744073709551615\n"));
  Write("stat", "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n");
  Write("self/limits",
        "Limit                     Soft Limit           Hard Limit           "
        "Units\nMax open files            1024                 524288          "
        "     files\n");
  const std::vector<MetricFamily> f = ProcessMetricFamilies(dir_.string());
  EXPECT_EQ(Value(f, "process_cpu_seconds_total"), 5);
  EXPECT_EQ(Value(f, "process_resident_memory_bytes"), 1000.0 * page);
  EXPECT_EQ(Value(f, "process_virtual_memory_bytes"), 123456789);
  EXPECT_EQ(Value(f, "process_start_time_seconds"), 1700000050);
  EXPECT_EQ(Value(f, "process_open_fds"), 4);
  EXPECT_EQ(Value(f, "process_max_fds"), 1024);
}

TEST_F(FakeProcTest, LeavesOutWhatItCannotRead) {
  Write("self/stat", "garbage");
  const std::vector<MetricFamily> f = ProcessMetricFamilies(dir_.string());
  EXPECT_EQ(FindFamily(f, "process_resident_memory_bytes"), nullptr);
  EXPECT_EQ(FindFamily(f, "process_max_fds"), nullptr);
  EXPECT_EQ(Value(f, "process_open_fds"), 4);
}

TEST(MetricsTest, RpcChildrenExistBeforeAnyCall) {
  Metrics metrics("v");
  const std::string text = metrics.ScrapeText();
  for (absl::string_view method : kRpcMethods) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat(
                          "prefixd_rpc_duration_seconds_count{method=\"",
                          method, "\"} 0")));
    EXPECT_THAT(text,
                HasSubstr(absl::StrCat(
                    "prefixd_rpc_errors_total{code=\"NOT_FOUND\",method=\"",
                    method, "\"} 0")));
  }
  EXPECT_THAT(text, Not(HasSubstr("code=\"OK\"")));
}

// A method missing from kRpcMethods has its calls dropped from the metrics
// (Pick and PickBatch were, until this test).
TEST(MetricsTest, EveryMethodOfTheServicesHasItsSeries) {
  const google::protobuf::ServiceDescriptor* services[] = {
      ::prefixd::v1::RouteRequest::descriptor()->file()->FindServiceByName(
          "PrefixIndex"),
      ::prefixd::v1::MatchRequest::descriptor()->file()->FindServiceByName(
          "PrefixCache"),
      ::kv_indexer::v1::MatchExternalKvPrefixRequest::descriptor()
          ->file()
          ->FindServiceByName("KVIndexer")};
  size_t methods = 0;
  for (const google::protobuf::ServiceDescriptor* service : services) {
    ASSERT_NE(service, nullptr);
    for (int i = 0; i < service->method_count(); ++i, ++methods) {
      const std::string& name = service->method(i)->name();
      EXPECT_NE(std::find(kRpcMethods.begin(), kRpcMethods.end(), name),
                kRpcMethods.end())
          << service->full_name() << "." << name;
    }
  }
  EXPECT_EQ(methods, kRpcMethods.size());
}

TEST(MetricsTest, ObserveRpcRecordsLatencyAndErrors) {
  Metrics metrics("v");
  metrics.ObserveRpc("Match", absl::StatusCode::kOk, absl::Microseconds(30));
  metrics.ObserveRpc("Match", absl::StatusCode::kNotFound,
                     absl::Milliseconds(3));
  metrics.OnRpcDone("Insert", absl::StatusCode::kResourceExhausted,
                    absl::Seconds(2));
  const std::string text = metrics.ScrapeText();
  EXPECT_THAT(
      text,
      HasSubstr("prefixd_rpc_duration_seconds_count{method=\"Match\"} 2"));
  EXPECT_THAT(text, HasSubstr("prefixd_rpc_duration_seconds_bucket{method="
                              "\"Match\",le=\"2.5e-05\"} 0"));
  EXPECT_THAT(text, HasSubstr("prefixd_rpc_duration_seconds_bucket{method="
                              "\"Match\",le=\"5e-05\"} 1"));
  EXPECT_THAT(text, HasSubstr("prefixd_rpc_duration_seconds_bucket{method="
                              "\"Match\",le=\"0.005\"} 2"));
  EXPECT_THAT(text, HasSubstr("prefixd_rpc_duration_seconds_bucket{method="
                              "\"Insert\",le=\"1\"} 0"));
  EXPECT_THAT(text, HasSubstr("prefixd_rpc_duration_seconds_bucket{method="
                              "\"Insert\",le=\"+Inf\"} 1"));
  EXPECT_THAT(text, HasSubstr("prefixd_rpc_errors_total{code=\"NOT_FOUND\","
                              "method=\"Match\"} 1"));
  EXPECT_THAT(text, HasSubstr("prefixd_rpc_errors_total{code="
                              "\"RESOURCE_EXHAUSTED\",method=\"Insert\"} 1"));
}

// The Conductor API's families exist only once the daemon turns it on, then
// every (endpoint, code) child at 0; a status outside the list counts as 500.
TEST(MetricsTest, ConductorRequestsByEndpointAndCode) {
  Metrics metrics("v");
  metrics.OnConductorRequest("query", 200, absl::Microseconds(30));
  EXPECT_THAT(metrics.ScrapeText(),
              Not(HasSubstr("prefixd_index_http_requests_total")));
  metrics.EnableConductorMetrics();
  metrics.OnConductorRequest("query", 200, absl::Microseconds(30));
  metrics.OnConductorRequest("query", 400, absl::Microseconds(30));
  metrics.OnConductorRequest("register", 418, absl::Milliseconds(3));
  const std::string text = metrics.ScrapeText();
  EXPECT_THAT(text, HasSubstr("prefixd_index_http_requests_total{code=\"200\","
                              "endpoint=\"query\"} 1"));
  EXPECT_THAT(text, HasSubstr("prefixd_index_http_requests_total{code=\"400\","
                              "endpoint=\"query\"} 1"));
  EXPECT_THAT(text, HasSubstr("prefixd_index_http_requests_total{code=\"500\","
                              "endpoint=\"register\"} 1"));
  EXPECT_THAT(text, HasSubstr("prefixd_index_http_requests_total{code=\"404\","
                              "endpoint=\"other\"} 0"));
  EXPECT_THAT(text, HasSubstr("prefixd_index_http_request_seconds_count{"
                              "endpoint=\"query\"} 2"));
}

TEST(MetricsTest, BucketsSpan25MicrosecondsToOneSecond) {
  const std::vector<double> b = RpcDurationBuckets();
  EXPECT_EQ(b.front(), 25e-6);
  EXPECT_EQ(b.back(), 1.0);
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
}

// A plain HTTP/1.0 GET; returns the whole response ("" on failure).
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
    }
  }
  close(fd);
  return out;
}

HttpSources CacheOnly(const PrefixCache* cache) {
  HttpSources sources;
  sources.cache = cache;
  return sources;
}

std::unique_ptr<PrefixCache> SmallCache() {
  CacheOptions o;
  o.block_size = 4;
  o.block_bytes = 100;
  o.budget_bytes = 1000;
  o.seed = 1;
  auto c = PrefixCache::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

TEST(MetricsTest, ServesTheCacheAsItIsAtScrapeTime) {
  std::unique_ptr<PrefixCache> cache = SmallCache();
  Metrics metrics("9.9.9");
  absl::StatusOr<std::unique_ptr<MetricsListener>> http =
      MetricsListener::Start("127.0.0.1:0", &metrics, CacheOnly(cache.get()));
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  ASSERT_GT(port, 0);

  std::vector<Token> tokens(8);
  std::iota(tokens.begin(), tokens.end(), 1);
  const std::vector<BlockId> ids = {11, 12};
  InsertRequest ins;
  ins.tokens = tokens;
  ins.block_ids = ids;
  ASSERT_TRUE(cache->Insert("t1", ins).ok());
  tokens.push_back(99);
  MatchQuery match;
  match.tokens = tokens;
  ASSERT_TRUE(cache->Match("t1", match).ok());

  const std::string body = HttpGet(port, "/metrics");
  EXPECT_THAT(body, HasSubstr("200 OK"));
  EXPECT_THAT(body, HasSubstr("prefixd_match_tokens_total{tenant=\"t1\"} 9"));
  EXPECT_THAT(body,
              HasSubstr("prefixd_match_hit_tokens_total{tenant=\"t1\"} 8"));
  EXPECT_THAT(body, HasSubstr("prefixd_cached_bytes{tenant=\"t1\"} 200"));
  EXPECT_THAT(body, HasSubstr("prefixd_build_info{version=\"9.9.9\"} 1"));
  EXPECT_THAT(body, HasSubstr("# HELP prefixd_rpc_errors_total"));
  EXPECT_THAT(body, HasSubstr("process_resident_memory_bytes "));

  http->reset();
  EXPECT_EQ(HttpGet(port, "/metrics"), "");
}

TEST(MetricsTest, ABusyPortIsAnErrorNamingTheAddress) {
  std::unique_ptr<PrefixCache> cache = SmallCache();
  Metrics metrics("v");
  absl::StatusOr<std::unique_ptr<MetricsListener>> first =
      MetricsListener::Start("127.0.0.1:0", &metrics, CacheOnly(cache.get()));
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string busy = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::Status s =
      MetricsListener::Start(busy, &metrics, CacheOnly(cache.get())).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr(busy));
}

TEST(MetricsTest, RejectsAUnixSocketAddress) {
  std::unique_ptr<PrefixCache> cache = SmallCache();
  Metrics metrics("v");
  EXPECT_EQ(MetricsListener::Start("unix:///tmp/m.sock", &metrics,
                                   CacheOnly(cache.get()))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace prefixd
