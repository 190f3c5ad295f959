#include "server/http/status_page.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/types.h"
#include "model/plan_report.h"
#include "model/units.h"
#include "server/http/html.h"
#include "server/http/svg_plot.h"

namespace prefixd {
namespace {

// How often the status page reloads itself.
constexpr int kRefreshSeconds = 5;

std::string HitRate(uint64_t hit, uint64_t looked_up) {
  if (looked_up == 0) return "-";
  return absl::StrFormat("%.1f%% (%s/%s)", 100.0 * hit / looked_up,
                         FormatCount(hit), FormatCount(looked_up));
}

std::string Td(absl::string_view cls, absl::string_view text) {
  return absl::StrCat("<td class=\"", cls, "\">", text, "</td>");
}

std::string Bar(double fraction) {
  return absl::StrFormat(
      "<span class=\"bar%s\"><span style=\"width:%.1f%%\"></span></span>",
      fraction > 1 ? " over" : "", std::min(fraction, 1.0) * 100);
}

std::string SummaryTable(const DaemonFacts& info, const CacheStats& s) {
  const ModelGeometry& g = info.model.geometry;
  const double used =
      s.budget_blocks == 0
          ? 0
          : static_cast<double>(s.resident_blocks) / s.budget_blocks;
  auto row = [](absl::string_view id, absl::string_view th,
                absl::string_view td) {
    return absl::StrCat("<tr><th>", th, "</th><td id=\"", id, "\">", td,
                        "</td></tr>\n");
  };
  return absl::StrCat(
      "<table class=\"kv\" id=\"summary\">\n",
      row("epoch", "epoch", absl::StrFormat("%016x", info.epoch)),
      row("model", "model", HtmlEscape(info.model_description)),
      row("geometry", "geometry",
          absl::StrCat(HtmlEscape(ModelText(g)), "; ",
                       KvDtypeName(info.model.kv_dtype), ": ",
                       FormatCount(info.bytes_per_token), " B (",
                       FormatBytes(info.bytes_per_token), ") per token")),
      row("fingerprint", "fingerprint", HtmlEscape(info.fingerprint)),
      row("blocks", "block",
          absl::StrCat(s.block_size, " tokens, ", FormatBytes(s.block_bytes))),
      row("budget", "budget",
          absl::StrCat(FormatBytes(s.budget_bytes), " = ",
                       FormatCount(s.budget_blocks), " blocks")),
      row("resident", "cached",
          absl::StrCat(FormatCount(s.resident_blocks), " blocks (",
                       FormatBytes(s.resident_blocks * s.block_bytes), ", ",
                       absl::StrFormat("%.1f%%", used * 100), " of the budget)",
                       Bar(used))),
      "</table>\n");
}

std::string TenantTable(const CacheStats& s, absl::Duration window_length,
                        const HitRateWindow::Result& window) {
  const std::string span = absl::FormatDuration(window_length);
  std::string out = absl::StrCat(
      "<table id=\"tenants\">\n<tr><th class=\"l\">tenant</th><th>cached "
      "blocks</th><th>cached bytes</th><th>pinned blocks</th>"
      "<th>leases</th><th>leases expired</th><th>hit rate, last ",
      span,
      "</th><th>hit rate, all</th><th>matches</th><th>inserts</th></tr>\n");
  for (const TenantUsage& t : s.tenants) {
    const std::string name = HtmlEscape(t.tenant);
    HitRateWindow::Rate recent;
    if (auto it = window.tenants.find(t.tenant); it != window.tenants.end()) {
      recent = it->second;
    }
    absl::StrAppend(
        &out, "<tr data-tenant=\"", name, "\">", Td("l tenant", name),
        Td("cached", FormatCount(t.cached_blocks)),
        Td("bytes", FormatBytes(t.cached_blocks * s.block_bytes)),
        Td("pinned", FormatCount(t.pinned_blocks)),
        Td("leases", FormatCount(t.active_leases)),
        Td("expired", FormatCount(t.lease_expired)),
        Td("recent", HitRate(recent.hit_tokens, recent.looked_up_tokens)),
        Td("hit", HitRate(t.match_hit_tokens, t.match_tokens)),
        Td("matches", FormatCount(t.match_requests)),
        Td("inserts", FormatCount(t.insert_requests)), "</tr>\n");
  }
  return out + "</table>\n";
}

std::string EvictionTable(const CacheStats& s) {
  std::string out = "<table id=\"evictions\">\n<tr><th class=\"l\">tenant</th>";
  for (int r = 0; r < kNumEvictReasons; ++r) {
    absl::StrAppend(&out, "<th>", EvictReasonName(static_cast<EvictReason>(r)),
                    "</th>");
  }
  out += "</tr>\n";
  for (const TenantUsage& t : s.tenants) {
    const std::string name = HtmlEscape(t.tenant);
    absl::StrAppend(&out, "<tr data-tenant=\"", name, "\">",
                    Td("l tenant", name));
    for (int r = 0; r < kNumEvictReasons; ++r) {
      absl::StrAppend(
          &out, Td(EvictReasonName(static_cast<EvictReason>(r)),
                   FormatCount(t.evicted_blocks[static_cast<size_t>(r)])));
    }
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

// Cached and evicted blocks by retention class (docs/api.md, "Retention").
std::string RetentionTable(const CacheStats& s) {
  std::string out = "<table id=\"retention\">\n<tr><th class=\"l\">tenant</th>";
  for (const char* state : {"cached", "evicted"}) {
    for (const char* cls : kRetentionClassNames)
      absl::StrAppend(&out, "<th>", state, " ", cls, "</th>");
  }
  out += "</tr>\n";
  for (const TenantUsage& t : s.tenants) {
    const std::string name = HtmlEscape(t.tenant);
    absl::StrAppend(&out, "<tr data-tenant=\"", name, "\">",
                    Td("l tenant", name));
    for (int r = 0; r < 3; ++r) {
      absl::StrAppend(&out, Td(absl::StrCat("cached-", kRetentionClassNames[r]),
                               FormatCount(t.cached_blocks_by_retention[r])));
    }
    for (int r = 0; r < 3; ++r) {
      absl::StrAppend(&out,
                      Td(absl::StrCat("evicted-", kRetentionClassNames[r]),
                         FormatCount(t.evicted_blocks_by_retention[r])));
    }
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

// A worker's blocks per medium: "GPU 12, CPU 3" ("-" if none).
std::string Mediums(const WorkerStatus& w) {
  std::vector<std::string> parts;
  for (const MediumCount& m : w.mediums) {
    const std::string medium = HtmlEscape(m.medium);
    parts.push_back(absl::StrCat("<span data-medium=\"", medium, "\">", medium,
                                 " ", FormatCount(m.blocks), "</span>"));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

// The times a worker was cleared, and why ("restart 1, reconnect 2").
std::string Clears(const WorkerStatus& w) {
  uint64_t total = 0;
  std::vector<std::string> reasons;
  for (int r = 0; r < kNumClearReasons; ++r) {
    const uint64_t n = w.clears[static_cast<size_t>(r)];
    total += n;
    if (n > 0) {
      reasons.push_back(absl::StrCat(
          ClearReasonName(static_cast<ClearReason>(r)), " ", FormatCount(n)));
    }
  }
  return absl::StrCat("<span title=\"", absl::StrJoin(reasons, ", "), "\">",
                      FormatCount(total), "</span>");
}

// The fleet index's workers (ListWorkers' figures).
std::string WorkerTable(const IndexStats& s) {
  std::string out =
      "<table id=\"workers\">\n<tr><th class=\"l\">worker</th><th "
      "class=\"l\">state</th><th class=\"l\">detail</th><th>last seq</th>"
      "<th>lag ms</th><th class=\"l\">blocks</th><th>events</th>"
      "<th>gaps</th><th>replays ok</th><th>replays failed</th>"
      "<th>clears</th></tr>\n";
  for (const WorkerStatus& w : s.workers) {
    const std::string name = HtmlEscape(w.worker);
    absl::StrAppend(
        &out, "<tr data-worker=\"", name, "\">", Td("l worker", name),
        Td("l state", WorkerStateName(w.state)),
        Td("l detail", HtmlEscape(w.state_detail)),
        Td("seq", absl::StrCat(w.last_seq)),
        Td("lag",
           FormatCount(static_cast<uint64_t>(std::max<int64_t>(w.lag_ms, 0)))),
        Td("l blocks", Mediums(w)), Td("events", FormatCount(w.events)),
        Td("gaps", FormatCount(w.gaps)),
        Td("replays-ok", FormatCount(w.replays_ok)),
        Td("replays-failed", FormatCount(w.replays_failed)),
        Td("clears", Clears(w)), "</tr>\n");
  }
  return out + "</table>\n";
}

// Routing and the index's size (the prefixd_index_* counters).
std::string RoutingTable(const IndexStats& s) {
  auto row = [](absl::string_view id, absl::string_view th,
                absl::string_view td) {
    return absl::StrCat("<tr><th>", th, "</th><td id=\"", id, "\">", td,
                        "</td></tr>\n");
  };
  uint64_t dropped = 0;
  for (uint64_t n : s.dropped) dropped += n;
  return absl::StrCat(
      "<table class=\"kv\" id=\"routing\">\n",
      row("route-requests", "Route requests", FormatCount(s.route_requests)),
      row("route-prompt-blocks", "prompt blocks",
          FormatCount(s.route_prompt_blocks)),
      row("route-matched-blocks", "matched blocks",
          FormatCount(s.route_matched_blocks)),
      row("route-hit-rate", "routed hit rate",
          HitRate(s.route_matched_blocks, s.route_prompt_blocks)),
      row("index-entries", "entries",
          absl::StrCat(FormatCount(s.entries), " of ",
                       FormatCount(s.max_entries))),
      row("index-blocks", "distinct blocks", FormatCount(s.blocks)),
      row("index-dropped", "dropped blocks", FormatCount(dropped)),
      "</table>\n");
}

std::string IndexSection(const IndexStats& s) {
  return absl::StrCat("<h2>Fleet index: workers</h2>\n", WorkerTable(s),
                      "<h2>Fleet index: routing</h2>\n", RoutingTable(s));
}

std::string PlotSection(const std::vector<Plot>& plots, absl::Duration span) {
  std::string out = absl::StrCat("<h2>The last ", absl::FormatDuration(span),
                                 "</h2>\n<div id=\"plots\">\n");
  for (const Plot& p : plots) out += SvgPlot(p);
  return out + "</div>\n";
}

}  // namespace

void HitRateWindow::Record(absl::Time now, const CacheStats& stats) {
  MutexLock lock(&mu_);
  RecordLocked(now, stats);
}

void HitRateWindow::RecordLocked(absl::Time now, const CacheStats& stats) {
  Sample sample{now, {}};
  for (const TenantUsage& t : stats.tenants) {
    sample.tenants[t.tenant] = {t.match_hit_tokens, t.match_tokens};
  }
  samples_.push_back(std::move(sample));
  // Keep the newest sample at least `window_` old as the baseline.
  while (samples_.size() > 1 && samples_[1].time <= now - window_) {
    samples_.pop_front();
  }
}

HitRateWindow::Result HitRateWindow::Over(absl::Time now,
                                          const CacheStats& stats) {
  MutexLock lock(&mu_);
  RecordLocked(now, stats);
  const Sample& base = samples_.front();
  const Sample& last = samples_.back();
  Result result;
  result.span = last.time - base.time;
  for (const auto& [tenant, rate] : last.tenants) {
    Rate then;  // a tenant created since the baseline started from 0
    if (auto it = base.tenants.find(tenant); it != base.tenants.end()) {
      then = it->second;
    }
    result.tenants[tenant] = {rate.hit_tokens - then.hit_tokens,
                              rate.looked_up_tokens - then.looked_up_tokens};
  }
  return result;
}

StatusPage::StatusPage(const HttpSources& sources, const Options& options)
    : cache_(sources.cache),
      index_(sources.index),
      info_(sources.facts),
      window_(options.window),
      hit_rates_(options.window),
      history_(options.history) {
  const absl::Time now = absl::Now();
  hit_rates_.Record(now, cache_->Stats(TenantScope::All()));
  history_.Add(Sample(now));
  sampler_ = std::make_unique<PeriodicThread>(options.sample_interval, [this] {
    const absl::Time now = absl::Now();
    hit_rates_.Record(now, cache_->Stats(TenantScope::All()));
    history_.Add(Sample(now));
  });
}

StatusSample StatusPage::Sample(absl::Time now) const {
  if (index_ == nullptr) {
    return TakeSample(now, cache_->Stats(TenantScope::All()), nullptr);
  }
  const IndexStats index = index_->Stats();
  return TakeSample(now, cache_->Stats(TenantScope::All()), &index);
}

std::string StatusPage::StatusHtml(absl::Time now) {
  const CacheStats stats = cache_->Stats(TenantScope::All());
  const HitRateWindow::Result window = hit_rates_.Over(now, stats);
  std::optional<IndexStats> index;
  if (index_ != nullptr) index = index_->Stats();
  // The plots end with the figures of now, which the history does not keep.
  std::vector<StatusSample> samples = history_.Samples();
  samples.push_back(TakeSample(now, stats, index ? &*index : nullptr));
  return absl::StrCat(
      PageStart("prefixd status",
                absl::StrCat("<meta http-equiv=\"refresh\" content=\"",
                             kRefreshSeconds, "\">\n")),
      "<h1>prefixd ", HtmlEscape(info_.version), "</h1>\n",
      SummaryTable(info_, stats), "<h2>Tenants</h2>\n",
      TenantTable(stats, window_, window),
      "<h2>Evicted blocks by reason</h2>\n", EvictionTable(stats),
      "<h2>Blocks by retention priority</h2>\n", RetentionTable(stats),
      "<p class=\"muted\">Retention: low below 50, default 50 (unset or "
      "lapsed), high above 50; evicted counts the policy's evictions (budget, "
      "limit, requested).</p>\n",
      index ? IndexSection(*index) : "",
      PlotSection(HistoryPlots(samples, now, history_.span()), history_.span()),
      "<p class=\"muted\">Hit rate: prompt tokens matched / tokens looked "
      "up; the last ",
      absl::FormatDuration(window_),
      " counts from the daemon's start while it is younger. Plots: one point "
      "per sample interval, the last one up to now. Reloads every ",
      kRefreshSeconds, " s; read at <span id=\"now\">",
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", now, absl::UTCTimeZone()),
      "</span>.</p>\n", PageEnd());
}

}  // namespace prefixd
