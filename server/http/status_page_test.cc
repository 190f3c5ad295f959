// The status page and the calculator's data (server/http/status_page.h), and
// the HTTP listener they are served on, over real TCP. The pages in a real
// browser: tests/python/test_web_ui.py.
#include "server/http/status_page.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/fleet_index.h"
#include "index/instrumented_index.h"
#include "server/http/html.h"
#include "server/http/metrics.h"
#include "server/http/metrics_listener.h"
#include "server/http/status_history.h"
#include "server/http/svg_plot.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kEvil[] = "<script>alert('x')</script>&\"";

// One HTTP/1.0 request; returns the whole response ("" on failure).
std::string Http(int port, const std::string& method, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = absl::StrCat(
        method, " ", path, " HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
    }
  }
  close(fd);
  return out;
}

std::unique_ptr<PrefixCache> Cache() {
  CacheOptions o;
  o.block_size = 4;
  o.block_bytes = 100;
  o.budget_bytes = 1000;
  o.seed = 1;
  o.dynamic_tenants = true;
  auto c = PrefixCache::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

// Inserts 2 blocks for `tenant` and matches 9 tokens (8 hit).
void Traffic(PrefixCache& cache, const std::string& tenant) {
  std::vector<Token> tokens(8);
  std::iota(tokens.begin(), tokens.end(), 1);
  const std::vector<BlockId> ids = {11, 12};  // outlives the request's span
  InsertRequest ins;
  ins.tokens = tokens;
  ins.block_ids = ids;
  ASSERT_TRUE(cache.Insert(tenant, ins).ok());
  tokens.push_back(99);
  MatchQuery match;
  match.tokens = tokens;
  ASSERT_TRUE(cache.Match(tenant, match).ok());
}

DaemonFacts Info() {
  DaemonFacts info;
  info.version = "9.9.9";
  info.epoch = 0xed0299067ab9addcULL;
  info.model.geometry = FindPreset("llama-3-8b").value().geometry;
  info.model_description = "llama-3-8b fp16";
  info.fingerprint = "0123456789abcdef";
  info.bytes_per_token = 131072;
  return info;
}

TEST(HtmlEscapeTest, EscapesEveryMarkupCharacter) {
  EXPECT_EQ(HtmlEscape(kEvil),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;");
  EXPECT_EQ(HtmlEscape("acme-1"), "acme-1");
}

TEST(HitRateWindowTest, CountsOnlyTheLastWindow) {
  HitRateWindow window(absl::Minutes(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  CacheStats stats;
  stats.tenants.resize(1);
  TenantUsage& t = stats.tenants[0];
  t.tenant = "a";
  t.match_hit_tokens = 0;
  t.match_tokens = 100;  // 0% before the window
  window.Record(t0, stats);
  t.match_hit_tokens = 10;
  t.match_tokens = 120;
  window.Record(t0 + absl::Minutes(6), stats);
  t.match_hit_tokens = 30;
  t.match_tokens = 140;
  HitRateWindow::Result r = window.Over(t0 + absl::Minutes(7), stats);
  // The baseline is the newest sample at or before 7 - 5 = 2 min: t0.
  EXPECT_EQ(r.span, absl::Minutes(7));
  EXPECT_EQ(r.tenants["a"].hit_tokens, 30u);
  EXPECT_EQ(r.tenants["a"].looked_up_tokens, 40u);
  // At 12 min it is the sample taken at 7 min: 20 of 20 since then; what
  // came before it (the 100 misses at t0 among it) no longer counts.
  t.match_hit_tokens = 50;
  t.match_tokens = 160;
  r = window.Over(t0 + absl::Minutes(12), stats);
  EXPECT_EQ(r.span, absl::Minutes(5));
  EXPECT_EQ(r.tenants["a"].hit_tokens, 20u);
  EXPECT_EQ(r.tenants["a"].looked_up_tokens, 20u);
  // A tenant that appears later counts from zero.
  stats.tenants.push_back(TenantUsage{.tenant = "b"});
  stats.tenants.back().match_hit_tokens = 3;
  stats.tenants.back().match_tokens = 4;
  r = window.Over(t0 + absl::Minutes(13), stats);
  EXPECT_EQ(r.tenants["b"].hit_tokens, 3u);
  EXPECT_EQ(r.tenants["b"].looked_up_tokens, 4u);
}

TEST(StatusPageTest, ShowsTheCacheAndEscapesTenantNames) {
  std::unique_ptr<PrefixCache> cache = Cache();
  StatusPage page({cache.get(), nullptr, nullptr, Info()});
  Traffic(*cache, kEvil);
  const std::string html = page.StatusHtml(absl::Now());
  EXPECT_THAT(html, HasSubstr("ed0299067ab9addc"));
  EXPECT_THAT(html, HasSubstr("llama-3-8b: 32 layers, 8 KV heads, 32 "
                              "attention heads, head_dim 128; fp16: "
                              "131,072 B (128 KiB) per token"));
  EXPECT_THAT(html, HasSubstr("1000 B = 10 blocks"));
  EXPECT_THAT(html, HasSubstr("2 blocks (200 B, 20.0% of the budget)"));
  const std::string escaped = HtmlEscape(kEvil);
  EXPECT_THAT(html, HasSubstr("<tr data-tenant=\"" + escaped + "\">"));
  EXPECT_THAT(html, HasSubstr("<th>hit rate, last 5m</th>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"recent\">88.9% (8/9)</td>"));
  EXPECT_THAT(html, Not(HasSubstr("<script>")));
  EXPECT_THAT(html, Not(HasSubstr("alert('x')")));
}

TEST(StatusPageTest, CountsBlocksByRetentionClass) {
  std::unique_ptr<PrefixCache> cache = Cache();
  StatusPage page({cache.get(), nullptr, nullptr, Info()});
  Traffic(*cache, "acme");  // 2 blocks at the default priority
  std::vector<Token> tokens = {50, 51, 52, 53};
  const std::vector<BlockId> ids = {21};
  InsertRequest ins;
  ins.tokens = tokens;
  ins.block_ids = ids;
  Retention high;
  high.priority = 90;
  ins.retention = high;
  ASSERT_TRUE(cache->Insert("acme", ins).ok());
  ASSERT_TRUE(cache->Evict(TenantScope::One("acme"), 2).ok());  // 50 before 90
  const std::string html = page.StatusHtml(absl::Now());
  EXPECT_THAT(html, HasSubstr("<table id=\"retention\">"));
  EXPECT_THAT(html, HasSubstr("<th>cached low</th><th>cached default</th>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"cached-default\">0</td>"
                              "<td class=\"cached-high\">1</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"evicted-default\">2</td>"
                              "<td class=\"evicted-high\">0</td>"));
}

// An MLA model's geometry is its latent, not one KV head of head_dim.
TEST(StatusPageTest, ShowsAnMlaModelAsMla) {
  std::unique_ptr<PrefixCache> cache = Cache();
  DaemonFacts info = Info();
  info.model.geometry = FindPreset("deepseek-v3").value().geometry;
  info.model.kv_dtype = KvDtype::kFp8;
  info.bytes_per_token = 35136;
  StatusPage page({cache.get(), nullptr, nullptr, info});
  const std::string html = page.StatusHtml(absl::Now());
  EXPECT_THAT(html, HasSubstr("deepseek-v3: 61 layers, MLA (kv_lora_rank 512, "
                              "qk_rope_head_dim 64), 128 attention heads; "
                              "fp8: 35,136 B (34.31 KiB) per token"));
  EXPECT_THAT(html, Not(HasSubstr("1 KV heads")));
}

// A fleet index with two workers: "<w>&1" holding 2 GPU blocks and 1 CPU
// block after a gap and a replay, and "w2" cleared once (a restart) and
// in ERROR.
class IndexPageTest : public ::testing::Test {
 protected:
  IndexPageTest() : fleet_(IndexOptions{4, 1000}), index_(&fleet_) {
    const WorkerId a = index_.AddWorker("<w>&1", "tcp://127.0.0.1:1");
    const WorkerId b = index_.AddWorker("w2", "tcp://127.0.0.1:2");
    KvEventBatch batch;
    batch.ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    BlockStoredEvent gpu;
    gpu.block_hashes = {101, 102};
    gpu.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
    gpu.block_size = 4;
    gpu.chain_blocks = 2;
    BlockStoredEvent cpu = gpu;
    cpu.block_hashes = {101};
    cpu.token_ids = {1, 2, 3, 4};
    cpu.chain_blocks = 1;
    cpu.medium = "CPU";
    batch.events = {gpu, cpu};
    index_.Apply(a, batch, 7, absl::Now());
    index_.CountGap(a);
    index_.CountReplay(a, true);
    index_.ClearWorker(b, ClearReason::kRestart, "restarted");
    index_.SetState(b, WorkerState::kError, "block_size 8, expected 4");
    const std::vector<Token> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    RouteQuery q;
    q.tokens = prompt;
    index_.Route(q);
  }

  FleetIndex fleet_;
  InstrumentedIndex index_;
};

TEST_F(IndexPageTest, ShowsWorkersAndRoutingEscaped) {
  std::unique_ptr<PrefixCache> cache = Cache();
  StatusPage page({cache.get(), &index_, nullptr, Info()});
  const std::string html = page.StatusHtml(absl::Now());
  EXPECT_THAT(html, HasSubstr("<tr data-worker=\"&lt;w&gt;&amp;1\">"));
  EXPECT_THAT(html, Not(HasSubstr("<w>")));
  EXPECT_THAT(html, HasSubstr("<td class=\"l state\">LIVE</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"seq\">7</td>"));
  EXPECT_THAT(html, HasSubstr("<span data-medium=\"GPU\">GPU 2</span>, "
                              "<span data-medium=\"CPU\">CPU 1</span>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"gaps\">1</td>"
                              "<td class=\"replays-ok\">1</td>"
                              "<td class=\"replays-failed\">0</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"l state\">ERROR</td>"
                              "<td class=\"l detail\">block_size 8, "
                              "expected 4</td>"));
  EXPECT_THAT(html, HasSubstr("<span title=\"restart 1\">1</span>"));
  EXPECT_THAT(html, HasSubstr("<td id=\"route-requests\">1</td>"));
  EXPECT_THAT(html, HasSubstr("<td id=\"route-hit-rate\">100.0% (2/2)</td>"));
  EXPECT_THAT(html, HasSubstr("id=\"plot-routes\""));
  EXPECT_THAT(html, HasSubstr("id=\"plot-lag\""));
}

TEST(StatusPageTest, NoIndexNoIndexTablesOrPlots) {
  std::unique_ptr<PrefixCache> cache = Cache();
  StatusPage page({cache.get(), nullptr, nullptr, Info()});
  const std::string html = page.StatusHtml(absl::Now());
  EXPECT_THAT(html, Not(HasSubstr("id=\"workers\"")));
  EXPECT_THAT(html, Not(HasSubstr("id=\"plot-routes\"")));
  EXPECT_THAT(html, HasSubstr("id=\"plot-hit-rate\""));
  EXPECT_THAT(html, HasSubstr("id=\"plot-evictions\""));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
}

StatusSample At(absl::Time t, uint64_t hit, uint64_t looked_up, uint64_t cached,
                uint64_t budget_evictions) {
  StatusSample s;
  s.time = t;
  s.hit_tokens = hit;
  s.looked_up_tokens = looked_up;
  s.cached_blocks = cached;
  s.budget_blocks = 10;
  s.evicted[static_cast<size_t>(EvictReason::kBudget)] = budget_evictions;
  return s;
}

const PlotLine& Line(const std::vector<Plot>& plots, const std::string& id,
                     const std::string& name) {
  for (const Plot& p : plots) {
    for (const PlotLine& l : p.lines) {
      if (p.id == id && l.name == name) return l;
    }
  }
  ADD_FAILURE() << id << " " << name;
  static const PlotLine kNone;
  return kNone;
}

// Each interval plots its own rate; levels plot each sample; an interval
// without lookups is a gap.
TEST(StatusHistoryTest, PlotsRatesPerIntervalAndLevelsPerSample) {
  const absl::Time t0 = absl::FromUnixSeconds(1000000);
  const std::vector<StatusSample> samples = {
      At(t0, 0, 0, 0, 0), At(t0 + absl::Seconds(10), 3, 4, 2, 0),
      At(t0 + absl::Seconds(20), 3, 4, 5, 6),
      At(t0 + absl::Seconds(50), 11, 14, 5, 9)};
  const std::vector<Plot> plots =
      HistoryPlots(samples, t0 + absl::Minutes(1), absl::Hours(1));
  ASSERT_EQ(plots.size(), 3u);  // no index: no Route, no lag
  const PlotLine& hit = Line(plots, "plot-hit-rate", "hit rate");
  ASSERT_EQ(hit.values.size(), 3u);
  EXPECT_EQ(hit.values[0], 75);
  EXPECT_TRUE(std::isnan(hit.values[1]));
  EXPECT_EQ(hit.values[2], 80);
  EXPECT_EQ(hit.data[0].first, "hit-tokens");
  EXPECT_EQ(hit.data[0].second, (std::vector<double>{3, 0, 8}));
  EXPECT_EQ(Line(plots, "plot-cached", "cached blocks").values,
            (std::vector<double>{0, 2, 5, 5}));
  EXPECT_EQ(Line(plots, "plot-cached", "budget").values,
            (std::vector<double>{10, 10, 10, 10}));
  const PlotLine& budget = Line(plots, "plot-evictions", "budget");
  EXPECT_EQ(budget.values, (std::vector<double>{0, 36, 6}));  // per minute
  EXPECT_EQ(budget.data[0].second, (std::vector<double>{0, 6, 3}));
  EXPECT_EQ(Line(plots, "plot-evictions", "requested").values,
            (std::vector<double>{0, 0, 0}));
}

TEST(StatusHistoryTest, KeepsTheSpanAndOneSampleBeforeIt) {
  StatusHistory history(absl::Minutes(1));
  const absl::Time t0 = absl::FromUnixSeconds(1000000);
  for (int i = 0; i <= 12; ++i) {
    history.Add(At(t0 + absl::Seconds(10 * i), 0, 0, 0, 0));
  }
  const std::vector<StatusSample> s = history.Samples();
  ASSERT_EQ(s.size(), 7u);  // 60 s to 120 s
  EXPECT_EQ(s.front().time, t0 + absl::Seconds(60));
  EXPECT_EQ(s.back().time, t0 + absl::Seconds(120));
}

TEST(SvgPlotTest, DrawsEachLineWithItsDataAndEscapes) {
  const absl::Time end = absl::FromUnixSeconds(7200);
  Plot p{"plot-x", "A <b> plot", "%", end, absl::Hours(1), 100, {}};
  p.lines.push_back({"<l>",
                     {end - absl::Minutes(30), end - absl::Minutes(20), end},
                     {50, std::nan(""), 100},
                     {{"hit-tokens", {1, 2, 3}}}});
  const std::string svg = SvgPlot(p);
  EXPECT_THAT(svg, HasSubstr("<figure class=\"plot\" id=\"plot-x\">"
                             "<figcaption>A &lt;b&gt; plot</figcaption>"));
  EXPECT_THAT(svg, HasSubstr("data-series=\"&lt;l&gt;\" data-times=\"5400 "
                             "6000 7200\" data-values=\"50 nan 100\" "
                             "data-hit-tokens=\"1 2 3\""));
  // x: 58 + 490 * 0.5; y: 10 + 138 * 0.5; the gap lifts the pen, and a
  // lone point is a dot.
  EXPECT_THAT(svg, HasSubstr("d=\"M303.0 79.0 l0 0 M548.0 10.0 l0 0 \""));
  EXPECT_THAT(svg, Not(HasSubstr("<b>")));
  EXPECT_THAT(svg, Not(HasSubstr("href")));
  EXPECT_EQ(NiceCeiling(0), 1);
  EXPECT_EQ(NiceCeiling(3), 5);
  EXPECT_EQ(NiceCeiling(120), 200);
  EXPECT_EQ(NiceCeiling(1000), 1000);
}

// The pages over real TCP beside /metrics; anything but GET and HEAD is
// refused and changes nothing.
TEST(StatusPageTest, ServedReadOnlyBesideMetrics) {
  std::unique_ptr<PrefixCache> cache = Cache();
  Traffic(*cache, "acme");
  Metrics metrics("9.9.9");
  absl::StatusOr<std::unique_ptr<MetricsListener>> http =
      MetricsListener::Start("127.0.0.1:0", &metrics,
                             {cache.get(), nullptr, nullptr, Info()});
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();

  std::string r = Http(port, "GET", "/");
  EXPECT_THAT(r, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(r, HasSubstr("Content-Type: text/html; charset=utf-8"));
  EXPECT_THAT(r, HasSubstr("Content-Security-Policy: default-src 'none'"));
  EXPECT_THAT(r, HasSubstr("<td class=\"cached\">2</td>"));
  r = Http(port, "GET", "/plan");
  EXPECT_THAT(r, HasSubstr("<script src=\"/plan.js\"></script>"));
  EXPECT_THAT(r, Not(HasSubstr("http://")));
  EXPECT_THAT(r, Not(HasSubstr("https://")));
  EXPECT_THAT(Http(port, "GET", "/plan.js"),
              HasSubstr("Content-Type: text/javascript"));
  EXPECT_THAT(Http(port, "GET", "/plan/presets.json"),
              HasSubstr("\"presets\":["));
  EXPECT_THAT(
      Http(port, "GET", "/plan.json?model=llama-3-8b&batch=1&context=1"),
      HasSubstr("\"kv_bytes\":131072"));
  EXPECT_THAT(Http(port, "GET", "/metrics"),
              HasSubstr("prefixd_cached_blocks{tenant=\"acme\"} 2"));
  EXPECT_THAT(Http(port, "GET", "/nothing"), HasSubstr("HTTP/1.1 404"));
  r = Http(port, "HEAD", "/");
  EXPECT_THAT(r, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(r, Not(HasSubstr("<html")));
  for (const char* method : {"POST", "PUT", "DELETE"}) {
    r = Http(port, method, "/");
    EXPECT_THAT(r, HasSubstr("HTTP/1.1 405")) << method;
    EXPECT_THAT(r, HasSubstr("Allow: GET, HEAD")) << method;
  }
  EXPECT_EQ(cache->Stats(TenantScope::All()).resident_blocks, 2u);
}

}  // namespace
}  // namespace prefixd
