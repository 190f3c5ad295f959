#include "server/http/metrics.h"

#include <unistd.h>

#include <cassert>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "prometheus/text_serializer.h"

namespace prefixd {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily NewFamily(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddSample(MetricFamily* f, std::vector<ClientMetric::Label> labels,
               double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f->type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f->metric.push_back(std::move(m));
}

// One per-tenant family: its value read from a tenant's stats.
struct TenantMetric {
  const char* name;
  const char* help;
  MetricType type;
  double (*value)(const TenantUsage& t, uint64_t block_bytes);
};

#define PREFIXD_FIELD(field) \
  [](const TenantUsage& t, uint64_t) { return static_cast<double>(t.field); }

constexpr TenantMetric kTenantMetrics[] = {
    {"prefixd_match_requests_total", "Match calls the cache answered.",
     MetricType::Counter, PREFIXD_FIELD(match_requests)},
    {"prefixd_match_tokens_total",
     "Tokens asked for by Match calls (the denominator of the hit rate).",
     MetricType::Counter, PREFIXD_FIELD(match_tokens)},
    {"prefixd_match_hit_tokens_total",
     "Tokens Match found cached, whole blocks only (the numerator of the hit "
     "rate).",
     MetricType::Counter, PREFIXD_FIELD(match_hit_tokens)},
    {"prefixd_insert_requests_total", "Insert calls that succeeded.",
     MetricType::Counter, PREFIXD_FIELD(insert_requests)},
    {"prefixd_inserted_blocks_total",
     "Blocks adopted by Insert (new to the cache).", MetricType::Counter,
     PREFIXD_FIELD(inserted_blocks)},
    {"prefixd_redundant_blocks_total",
     "Block IDs Insert handed back because the prefix was already cached "
     "under other IDs.",
     MetricType::Counter, PREFIXD_FIELD(redundant_blocks)},
    {"prefixd_lease_expired_total",
     "Leases that ended because their TTL passed without a KeepAlive.",
     MetricType::Counter, PREFIXD_FIELD(lease_expired)},
    {"prefixd_cached_blocks", "KV blocks cached now.", MetricType::Gauge,
     PREFIXD_FIELD(cached_blocks)},
    {"prefixd_cached_bytes",
     "KV bytes cached now (cached blocks x block bytes).", MetricType::Gauge,
     [](const TenantUsage& t, uint64_t block_bytes) {
       return static_cast<double>(t.cached_blocks * block_bytes);
     }},
    {"prefixd_pinned_blocks",
     "Cached blocks pinned by at least one lease (never evicted).",
     MetricType::Gauge, PREFIXD_FIELD(pinned_blocks)},
    {"prefixd_tree_nodes", "Radix-tree nodes over all namespaces.",
     MetricType::Gauge, PREFIXD_FIELD(tree_nodes)},
    {"prefixd_active_leases", "Leases held now.", MetricType::Gauge,
     PREFIXD_FIELD(active_leases)},
    {"prefixd_tenant_reserved_bytes",
     "Bytes of cache guaranteed to the tenant: others never evict it below.",
     MetricType::Gauge, PREFIXD_FIELD(reserved_bytes)},
    {"prefixd_tenant_limit_bytes", "Hard cap on the tenant's cached bytes.",
     MetricType::Gauge, PREFIXD_FIELD(limit_bytes)},
};

#undef PREFIXD_FIELD

void AddEvictions(const CacheStats& stats,
                  std::vector<MetricFamily>* families) {
  MetricFamily blocks = NewFamily(
      "prefixd_evicted_blocks_total",
      "Blocks that left the cache and were handed back to the engine, by "
      "reason: budget (global budget full), limit (tenant over its limit), "
      "requested (Evict), invalidated (Invalidate), reset (Reset).",
      MetricType::Counter);
  MetricFamily bytes =
      NewFamily("prefixd_evicted_bytes_total",
                "KV bytes of prefixd_evicted_blocks_total (blocks x block "
                "bytes), by reason.",
                MetricType::Counter);
  for (const TenantUsage& t : stats.tenants) {
    for (int r = 0; r < kNumEvictReasons; ++r) {
      std::vector<ClientMetric::Label> labels = {
          {"reason", std::string(EvictReasonName(static_cast<EvictReason>(r)))},
          {"tenant", t.tenant}};
      const uint64_t n = t.evicted_blocks[r];
      AddSample(&blocks, labels, static_cast<double>(n));
      AddSample(&bytes, std::move(labels),
                static_cast<double>(n * stats.block_bytes));
    }
  }
  families->push_back(std::move(blocks));
  families->push_back(std::move(bytes));
}

void AddRetention(const CacheStats& stats,
                  std::vector<MetricFamily>* families) {
  MetricFamily cached = NewFamily(
      "prefixd_cached_blocks_by_retention",
      "KV blocks cached now, by the priority of their retention hint: low "
      "(below 50), default (50, no hint or a lapsed one), high (above 50).",
      MetricType::Gauge);
  MetricFamily evicted = NewFamily(
      "prefixd_evicted_blocks_by_retention_total",
      "Blocks evicted, by the priority their retention hint had when they "
      "went: low (below 50), default (50), high (above 50).",
      MetricType::Counter);
  for (const TenantUsage& t : stats.tenants) {
    for (int r = 0; r < 3; ++r) {
      std::vector<ClientMetric::Label> labels = {
          {"retention", kRetentionClassNames[r]}, {"tenant", t.tenant}};
      AddSample(&cached, labels,
                static_cast<double>(t.cached_blocks_by_retention[r]));
      AddSample(&evicted, std::move(labels),
                static_cast<double>(t.evicted_blocks_by_retention[r]));
    }
  }
  families->push_back(std::move(cached));
  families->push_back(std::move(evicted));
}

// Reads a whole small file ("" if it cannot).
std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

void AddGauge(std::vector<MetricFamily>* families, const char* name,
              const char* help, MetricType type, double value) {
  MetricFamily f = NewFamily(name, help, type);
  AddSample(&f, {}, value);
  families->push_back(std::move(f));
}

// /proc/<pid>/stat fields 14..24 (1-based), parsed after the ')' that ends
// the command name (which may itself hold spaces and parentheses).
struct ProcStat {
  uint64_t utime_ticks = 0, stime_ticks = 0, start_ticks = 0;
  uint64_t vsize_bytes = 0, rss_pages = 0;
};

bool ParseProcStat(const std::string& text, ProcStat* out) {
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return false;
  std::vector<absl::string_view> f = absl::StrSplit(
      absl::string_view(text).substr(paren + 1), ' ', absl::SkipEmpty());
  // f[0] is field 3 (state), so field N is f[N - 3].
  if (f.size() < 22) return false;
  return absl::SimpleAtoi(f[11], &out->utime_ticks) &&
         absl::SimpleAtoi(f[12], &out->stime_ticks) &&
         absl::SimpleAtoi(f[19], &out->start_ticks) &&
         absl::SimpleAtoi(f[20], &out->vsize_bytes) &&
         absl::SimpleAtoi(f[21], &out->rss_pages);
}

// The value of the "btime" line of /proc/stat: boot time, Unix seconds.
bool BootTime(const std::string& proc_dir, uint64_t* out) {
  std::istringstream in(ReadFile(proc_dir + "/stat"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "btime ")) {
      return absl::SimpleAtoi(absl::string_view(line).substr(6), out);
    }
  }
  return false;
}

// The soft "Max open files" limit of /proc/self/limits.
bool MaxOpenFiles(const std::string& proc_dir, uint64_t* out) {
  std::istringstream in(ReadFile(proc_dir + "/self/limits"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "Max open files")) continue;
    std::vector<absl::string_view> f = absl::StrSplit(
        absl::string_view(line).substr(14), ' ', absl::SkipEmpty());
    return !f.empty() && absl::SimpleAtoi(f[0], out);
  }
  return false;
}

bool OpenFiles(const std::string& proc_dir, uint64_t* out) {
  std::error_code ec;
  std::filesystem::directory_iterator it(proc_dir + "/self/fd", ec);
  if (ec) return false;
  uint64_t n = 0;
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) return false;
    ++n;
  }
  *out = n;
  return true;
}

// Per-worker counters of the index: one family, one sample per worker
// (and per value of `label`, when the counter is an array).
template <size_t N>
void AddWorkerCounters(std::vector<MetricFamily>* out, const char* name,
                       const char* help, const IndexStats& stats,
                       const char* label,
                       const std::array<absl::string_view, N>& values,
                       std::array<uint64_t, N> (*get)(const WorkerStatus&)) {
  MetricFamily f = NewFamily(name, help, MetricType::Counter);
  for (const WorkerStatus& w : stats.workers) {
    const std::array<uint64_t, N> v = get(w);
    for (size_t i = 0; i < N; ++i) {
      AddSample(&f, {{label, std::string(values[i])}, {"worker", w.worker}},
                static_cast<double>(v[i]));
    }
  }
  out->push_back(std::move(f));
}

int MethodIndex(absl::string_view method) {
  for (size_t i = 0; i < kRpcMethods.size(); ++i) {
    if (kRpcMethods[i] == method) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

std::vector<MetricFamily> EventsPublishMetricFamilies(
    const EventsPublishStats& stats) {
  std::vector<MetricFamily> out;
  AddGauge(&out, "prefixd_events_published_batches_total",
           "KV event batches this daemon published (events_publish); the "
           "last sequence number is this minus 1.",
           MetricType::Counter, static_cast<double>(stats.wire.batches));
  AddGauge(&out, "prefixd_events_published_bytes_total",
           "Bytes of msgpack payload in the published batches.",
           MetricType::Counter, static_cast<double>(stats.wire.bytes));
  MetricFamily events = NewFamily("prefixd_events_published_total",
                                  "KV events this daemon published, by type.",
                                  MetricType::Counter);
  for (size_t i = 0; i < stats.events.size(); ++i) {
    AddSample(&events, {{"type", std::string(kEventTypeNames[i])}},
              static_cast<double>(stats.events[i]));
  }
  out.push_back(std::move(events));
  MetricFamily resyncs = NewFamily(
      "prefixd_events_resyncs_total",
      "Times the whole cache was published again after AllBlocksCleared, "
      "by reason: start, overflow (an event ring dropped events before "
      "they were published).",
      MetricType::Counter);
  for (int r = 0; r < kNumResyncReasons; ++r) {
    AddSample(&resyncs, {{"reason", std::string(kResyncReasonNames[r])}},
              static_cast<double>(stats.resyncs[r]));
  }
  out.push_back(std::move(resyncs));
  AddGauge(&out, "prefixd_events_replay_requests_total",
           "Replay requests answered on the events_publish replay socket.",
           MetricType::Counter,
           static_cast<double>(stats.wire.replay_requests));
  AddGauge(&out, "prefixd_events_replay_buffer_bytes",
           "Bytes of payload the replay socket keeps now (at most "
           "events_publish.buffer_bytes).",
           MetricType::Gauge, static_cast<double>(stats.wire.buffered_bytes));
  return out;
}

namespace {

// The counters kept per worker and label: events by type, replays by
// result, clears by reason.
void AddIndexWorkerCounters(const IndexStats& stats,
                            std::vector<MetricFamily>* out) {
  AddWorkerCounters<kNumEventTypes>(
      out, "prefixd_index_events_total",
      "KV events received from each worker, by type (unknown: types the "
      "index does not know, skipped).",
      stats, "type", kEventTypeNames,
      [](const WorkerStatus& w) { return w.events_by_type; });
  AddWorkerCounters<2>(
      out, "prefixd_index_replays_total",
      "Replay requests to a worker's replay endpoint, by result (ok: the "
      "missing batches came; failed: the worker was cleared).",
      stats, "result", std::array<absl::string_view, 2>{"ok", "failed"},
      [](const WorkerStatus& w) {
        return std::array<uint64_t, 2>{w.replays_ok, w.replays_failed};
      });
  std::array<absl::string_view, kNumClearReasons> clear_names;
  for (int r = 0; r < kNumClearReasons; ++r)
    clear_names[r] = ClearReasonName(static_cast<ClearReason>(r));
  AddWorkerCounters<kNumClearReasons>(
      out, "prefixd_index_clears_total",
      "Times a worker's blocks were all dropped from the index, by reason.",
      stats, "reason", clear_names,
      [](const WorkerStatus& w) { return w.clears; });
}

// Per worker: gaps, unknown fields, blocks by medium, state.
void AddIndexWorkerGauges(const IndexStats& stats,
                          std::vector<MetricFamily>* out) {
  MetricFamily gaps =
      NewFamily("prefixd_index_gaps_total",
                "Sequence gaps seen in a worker's event stream (lost batches).",
                MetricType::Counter);
  MetricFamily blocks =
      NewFamily("prefixd_index_blocks",
                "Blocks the index lists a worker as holding, by medium.",
                MetricType::Gauge);
  MetricFamily state =
      NewFamily("prefixd_index_worker_state",
                "1 for the state a worker is in now, 0 for the others.",
                MetricType::Gauge);
  constexpr WorkerState kStates[] = {
      WorkerState::kConnecting, WorkerState::kLive, WorkerState::kReplaying,
      WorkerState::kError};
  MetricFamily unknown_fields =
      NewFamily("prefixd_index_unknown_fields_total",
                "Fields of a worker's events the index does not know (a newer "
                "engine), skipped.",
                MetricType::Counter);
  for (const WorkerStatus& w : stats.workers) {
    AddSample(&gaps, {{"worker", w.worker}}, static_cast<double>(w.gaps));
    AddSample(&unknown_fields, {{"worker", w.worker}},
              static_cast<double>(w.unknown_fields));
    for (const MediumCount& m : w.mediums) {
      AddSample(&blocks, {{"medium", m.medium}, {"worker", w.worker}},
                static_cast<double>(m.blocks));
    }
    for (WorkerState s : kStates) {
      AddSample(
          &state,
          {{"state", std::string(WorkerStateName(s))}, {"worker", w.worker}},
          w.state == s ? 1 : 0);
    }
  }
  out->push_back(std::move(gaps));
  out->push_back(std::move(unknown_fields));
  out->push_back(std::move(blocks));
  out->push_back(std::move(state));
}

// Dropped blocks by reason and the event lag histogram.
void AddIndexDropsAndLag(const IndexStats& stats,
                         std::vector<MetricFamily>* out) {
  MetricFamily dropped = NewFamily(
      "prefixd_index_dropped_blocks_total",
      "Blocks of stored events the index did not keep, by reason: "
      "unknown_parent, extra_keys (multimodal), group (KV-cache group > 0), "
      "max_entries, block_size.",
      MetricType::Counter);
  for (int r = 0; r < kNumDropReasons; ++r) {
    AddSample(
        &dropped,
        {{"reason", std::string(DropReasonName(static_cast<DropReason>(r)))}},
        static_cast<double>(stats.dropped[r]));
  }
  out->push_back(std::move(dropped));

  MetricFamily lag = NewFamily(
      "prefixd_index_event_lag_seconds",
      "Time from an engine stamping a batch to the index applying it.",
      MetricType::Histogram);
  ClientMetric h;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kLagBuckets.size(); ++i) {
    cumulative += stats.lag_counts[i];
    h.histogram.bucket.push_back({cumulative, kLagBuckets[i]});
  }
  cumulative += stats.lag_counts.back();
  h.histogram.bucket.push_back(
      {cumulative, std::numeric_limits<double>::infinity()});
  h.histogram.sample_count = cumulative;
  h.histogram.sample_sum = stats.lag_sum;
  lag.metric.push_back(std::move(h));
  out->push_back(std::move(lag));
}

}  // namespace

std::vector<MetricFamily> PickMetricFamilies(const Picker::Counts& counts) {
  std::vector<MetricFamily> out;
  AddGauge(&out, "prefixd_index_picks_total",
           "Pick decisions recorded (each item of a PickBatch counts; dry "
           "runs do not).",
           MetricType::Counter, static_cast<double>(counts.picks));
  AddGauge(&out, "prefixd_index_pick_predicted_blocks",
           "(worker, block) pairs Pick predicts a worker holds, each until "
           "index.pick.predicted_ttl lapses.",
           MetricType::Gauge, static_cast<double>(counts.predicted));
  AddGauge(&out, "prefixd_index_pick_window_picks",
           "Picks within index.pick.load_window, the load Pick charges "
           "workers the router gives none for.",
           MetricType::Gauge, static_cast<double>(counts.window_picks));
  return out;
}

std::vector<MetricFamily> EngineLoadReadingFamilies(
    absl::string_view name, absl::string_view help,
    const std::vector<EngineLoadFiler::Counts>& counts) {
  MetricFamily f =
      NewFamily(std::string(name), std::string(help), MetricType::Counter);
  for (const EngineLoadFiler::Counts& c : counts) {
    AddSample(&f, {{"worker", std::string(c.worker)}, {"result", "ok"}},
              static_cast<double>(c.ok));
    AddSample(&f, {{"worker", std::string(c.worker)}, {"result", "failed"}},
              static_cast<double>(c.failed));
  }
  std::vector<MetricFamily> out;
  out.push_back(std::move(f));
  return out;
}

// The pools' lookups of their host names (index/pool_resolver.h): event
// pools and SGLang pools alike, by source name.
std::vector<MetricFamily> PoolLookupFamilies(
    const std::vector<PoolLookups>& pools) {
  MetricFamily lookups = NewFamily(
      "prefixd_index_pool_lookups_total",
      "Lookups of each pool source's host name, by result (answered: "
      "addresses or none; failed: the resolver could not answer, and the "
      "pool kept its workers).",
      MetricType::Counter);
  MetricFamily addresses =
      NewFamily("prefixd_index_pool_addresses",
                "Addresses in the last answer for each pool source's host "
                "name: one pod each.",
                MetricType::Gauge);
  for (const PoolLookups& p : pools) {
    AddSample(&lookups, {{"source", p.source}, {"result", "answered"}},
              static_cast<double>(p.answered));
    AddSample(&lookups, {{"source", p.source}, {"result", "failed"}},
              static_cast<double>(p.failed));
    AddSample(&addresses, {{"source", p.source}},
              static_cast<double>(p.addresses));
  }
  std::vector<MetricFamily> out;
  out.push_back(std::move(lookups));
  out.push_back(std::move(addresses));
  return out;
}

std::vector<MetricFamily> IndexMetricFamilies(const IndexStats& stats) {
  std::vector<MetricFamily> out;
  AddIndexWorkerCounters(stats, &out);
  AddIndexWorkerGauges(stats, &out);
  AddIndexDropsAndLag(stats, &out);
  AddGauge(&out, "prefixd_index_route_requests_total",
           "Route requests answered (each item of a RouteBatch counts).",
           MetricType::Counter, static_cast<double>(stats.route_requests));
  AddGauge(&out, "prefixd_index_route_prompt_blocks_total",
           "Whole blocks in the prompts Route was asked about.",
           MetricType::Counter, static_cast<double>(stats.route_prompt_blocks));
  AddGauge(&out, "prefixd_index_route_matched_blocks_total",
           "Blocks the best worker held of those prompts (routed hit rate = "
           "rate of this / rate of prompt blocks).",
           MetricType::Counter,
           static_cast<double>(stats.route_matched_blocks));
  AddGauge(&out, "prefixd_index_entries",
           "(block, holder) entries in the index now.", MetricType::Gauge,
           static_cast<double>(stats.entries));
  AddGauge(&out, "prefixd_index_max_entries",
           "index.max_entries: past it the least recent leaf blocks go.",
           MetricType::Gauge, static_cast<double>(stats.max_entries));
  return out;
}

std::vector<double> RpcDurationBuckets() {
  return {25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3, 5e-3,
          10e-3, 25e-3, 50e-3,  100e-3, 250e-3, 500e-3, 1.0};
}

std::vector<MetricFamily> CacheMetricFamilies(const CacheStats& stats,
                                              absl::string_view version) {
  std::vector<MetricFamily> out;
  for (const TenantMetric& m : kTenantMetrics) {
    MetricFamily f = NewFamily(m.name, m.help, m.type);
    for (const TenantUsage& t : stats.tenants) {
      AddSample(&f, {{"tenant", t.tenant}}, m.value(t, stats.block_bytes));
    }
    out.push_back(std::move(f));
  }
  AddEvictions(stats, &out);
  AddRetention(stats, &out);
  AddGauge(&out, "prefixd_budget_bytes",
           "KV bytes the whole cache may hold (kv_budget).", MetricType::Gauge,
           static_cast<double>(stats.budget_bytes));
  AddGauge(&out, "prefixd_block_bytes",
           "KV bytes of one block (block_size x bytes per token).",
           MetricType::Gauge, static_cast<double>(stats.block_bytes));
  MetricFamily build = NewFamily(
      "prefixd_build_info", "Always 1; the version label says which prefixd.",
      MetricType::Gauge);
  AddSample(&build, {{"version", std::string(version)}}, 1);
  out.push_back(std::move(build));
  return out;
}

std::vector<MetricFamily> ProcessMetricFamilies(const std::string& proc_dir) {
  std::vector<MetricFamily> out;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  ProcStat st;
  if (ParseProcStat(ReadFile(proc_dir + "/self/stat"), &st)) {
    AddGauge(&out, "process_cpu_seconds_total",
             "Total user and system CPU time spent in seconds.",
             MetricType::Counter, (st.utime_ticks + st.stime_ticks) / ticks);
    AddGauge(&out, "process_resident_memory_bytes",
             "Resident memory size in bytes.", MetricType::Gauge,
             st.rss_pages * page);
    AddGauge(&out, "process_virtual_memory_bytes",
             "Virtual memory size in bytes.", MetricType::Gauge,
             static_cast<double>(st.vsize_bytes));
    uint64_t boot = 0;
    if (BootTime(proc_dir, &boot)) {
      AddGauge(&out, "process_start_time_seconds",
               "Start time of the process since unix epoch in seconds.",
               MetricType::Gauge, boot + st.start_ticks / ticks);
    }
  }
  uint64_t n = 0;
  if (OpenFiles(proc_dir, &n)) {
    AddGauge(&out, "process_open_fds", "Number of open file descriptors.",
             MetricType::Gauge, static_cast<double>(n));
  }
  if (MaxOpenFiles(proc_dir, &n)) {
    AddGauge(&out, "process_max_fds",
             "Maximum number of open file descriptors.", MetricType::Gauge,
             static_cast<double>(n));
  }
  return out;
}

Metrics::Metrics(std::string version)
    : registry_(std::make_shared<prometheus::Registry>()),
      version_(std::move(version)) {
  auto& duration =
      prometheus::BuildHistogram()
          .Name("prefixd_rpc_duration_seconds")
          .Help(
              "Time from receiving an RPC to finishing it (WatchEvents: to "
              "the start of its stream), by method.")
          .Register(*registry_);
  auto& errors = prometheus::BuildCounter()
                     .Name("prefixd_rpc_errors_total")
                     .Help(
                         "RPCs that ended with a status other than OK, by "
                         "method and canonical code.")
                     .Register(*registry_);
  const std::vector<double> buckets = RpcDurationBuckets();
  for (size_t m = 0; m < kRpcMethods.size(); ++m) {
    const std::string method(kRpcMethods[m]);
    rpc_[m].duration = &duration.Add({{"method", method}}, buckets);
    for (int c = 1; c <= kNumErrorCodes; ++c) {
      const std::string code =
          absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
      rpc_[m].errors[c - 1] = &errors.Add({{"code", code}, {"method", method}});
    }
  }
}

void Metrics::EnableConductorMetrics() {
  const std::vector<double> buckets = RpcDurationBuckets();
  auto& http_seconds =
      prometheus::BuildHistogram()
          .Name("prefixd_index_http_request_seconds")
          .Help(
              "Time to answer a request of the Mooncake Conductor API "
              "(index.http_listen), by endpoint.")
          .Register(*registry_);
  auto& http_requests =
      prometheus::BuildCounter()
          .Name("prefixd_index_http_requests_total")
          .Help(
              "Requests of the Mooncake Conductor API (index.http_listen), "
              "by endpoint and HTTP status.")
          .Register(*registry_);
  for (size_t e = 0; e < kConductorEndpoints.size(); ++e) {
    const std::string endpoint(kConductorEndpoints[e]);
    conductor_[e].seconds =
        &http_seconds.Add({{"endpoint", endpoint}}, buckets);
    for (size_t c = 0; c < kConductorStatuses.size(); ++c) {
      conductor_[e].requests[c] =
          &http_requests.Add({{"code", absl::StrCat(kConductorStatuses[c])},
                              {"endpoint", endpoint}});
    }
  }
}

Metrics::~Metrics() = default;

void Metrics::OnConductorRequest(absl::string_view endpoint, int status,
                                 absl::Duration elapsed) {
  const auto e = std::find(kConductorEndpoints.begin(),
                           kConductorEndpoints.end(), endpoint);
  if (e == kConductorEndpoints.end()) return;
  EndpointChildren& children =
      conductor_[static_cast<size_t>(e - kConductorEndpoints.begin())];
  if (children.seconds == nullptr) return;  // not enabled
  children.seconds->Observe(absl::ToDoubleSeconds(elapsed));
  auto c =
      std::find(kConductorStatuses.begin(), kConductorStatuses.end(), status);
  if (c == kConductorStatuses.end()) c = kConductorStatuses.end() - 1;  // 500
  children.requests[static_cast<size_t>(c - kConductorStatuses.begin())]
      ->Increment();
}

void Metrics::ObserveRpc(absl::string_view method, absl::StatusCode code,
                         absl::Duration elapsed) {
  const int m = MethodIndex(method);
  assert(m >= 0 && "ObserveRpc: method not in kRpcMethods");
  if (m < 0) return;
  rpc_[m].duration->Observe(absl::ToDoubleSeconds(elapsed));
  if (code == absl::StatusCode::kOk) return;
  int c = static_cast<int>(code);
  if (c < 1 || c > kNumErrorCodes)
    c = static_cast<int>(absl::StatusCode::kUnknown);
  rpc_[m].errors[c - 1]->Increment();
}

std::string Metrics::ScrapeText(const HttpSources* sources) const {
  std::vector<MetricFamily> families = registry_->Collect();
  if (sources == nullptr) {
    return prometheus::TextSerializer().Serialize(families);
  }
  auto append = [&families](std::vector<MetricFamily> more) {
    std::move(more.begin(), more.end(), std::back_inserter(families));
  };
  append(
      CacheMetricFamilies(sources->cache->Stats(TenantScope::All()), version_));
  if (sources->index != nullptr) {
    append(IndexMetricFamilies(sources->index->Stats()));
  }
  if (sources->picker != nullptr) {
    append(PickMetricFamilies(sources->picker->counts()));
  }
  if (sources->engine_scraper != nullptr) {
    append(EngineLoadReadingFamilies(
        "prefixd_index_engine_scrapes_total",
        "Reads of each engine's own metrics endpoint for Pick's load "
        "(index.pick.engine_metrics), by result (ok, failed).",
        sources->engine_scraper->counts()));
  }
  if (sources->engine_load_feed != nullptr) {
    append(EngineLoadReadingFamilies(
        "prefixd_index_engine_load_messages_total",
        "Messages of each SGLang engine's load socket for Pick's load "
        "(index.pick.engine_load_sockets), by result (ok, failed).",
        sources->engine_load_feed->counts()));
  }
  if (sources->sglang_discovery != nullptr) {
    append(EngineLoadReadingFamilies(
        "prefixd_index_sglang_server_info_reads_total",
        "Reads of each SGLang worker's /server_info (index.sources "
        "server_info_url), by result (ok: followed, failed).",
        sources->sglang_discovery->counts()));
  }
  std::vector<PoolLookups> pools;
  if (sources->ingest != nullptr) pools = sources->ingest->pool_lookups();
  if (sources->sglang_discovery != nullptr) {
    std::vector<PoolLookups> more = sources->sglang_discovery->pool_lookups();
    std::move(more.begin(), more.end(), std::back_inserter(pools));
  }
  if (!pools.empty()) append(PoolLookupFamilies(pools));
  if (sources->events_publisher != nullptr) {
    append(EventsPublishMetricFamilies(sources->events_publisher->stats()));
  }
  append(ProcessMetricFamilies());
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace prefixd
