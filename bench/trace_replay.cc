// Replays Mooncake request traces through core/ in process
// (docs/performance.md, benchmark 2) and reports hit rates, block operations
// per second, per-request latency and resident bytes per cached block.
//
// Each trace hash id stands for one block: block_size tokens
// id * block_size + j, so the trace's prefix structure is kept exactly. Per
// request, as an engine does: Match with pin; Insert of the whole prompt with
// the matched IDs passed back and fresh IDs for the rest; Release.
//
//   trace_replay [--traces=conversation,synthetic]
//                [--capacities=10000,50000,infinite]
//                [--eviction_policy=lru,adaptive,shadow] [--json]
//
// A block operation is one block matched or inserted, so every prompt block
// is one operation. Throughput and latency time only the three core calls
// (not the expansion of ids into tokens). Memory: the trace is replayed, with
// its ids shifted on each pass, into an unbounded cache until it holds
// --memory_blocks blocks (default 625,000 = 10^7 tokens at block_size 16);
// VmRSS after minus VmRSS before, divided by the cached blocks. It runs first,
// in a process that has not freed anything yet, so freed memory cannot hide
// the growth.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/mutex.h"
#include "bench/trace.h"
#include "core/cache.h"
#ifdef PREFIXD_TRACE_REPLAY_RPC
#include "bench/load/common.h"
#include "client/client.h"
#endif

#ifndef PREFIXD_DAEMON_PATH
#define PREFIXD_DAEMON_PATH ""
#endif

ABSL_FLAG(std::vector<std::string>, capacities,
          std::vector<std::string>({"10000", "50000", "infinite"}),
          "cache capacities in blocks; 'infinite' for no limit");
ABSL_FLAG(std::vector<std::string>, eviction_policy,
          std::vector<std::string>({"lru"}),
          "eviction policies to replay under (lru, adaptive, shadow): one row "
          "per policy");
ABSL_FLAG(int, block_size, 16, "tokens per block");
ABSL_FLAG(int, trace_block_tokens, 512,
          "input tokens per trace hash id (Mooncake: 512), for the token hit "
          "rate");
ABSL_FLAG(int, runs, 3,
          "timed runs per (trace, capacity); the run with the median "
          "throughput is reported");
ABSL_FLAG(uint64_t, memory_blocks, 625000,
          "measure RSS per cached block at this many cached blocks (0: skip)");
ABSL_FLAG(std::string, memory_trace, "conversation",
          "trace replayed (repeatedly) for the memory measurement");
ABSL_FLAG(bool, check, true, "CheckInvariants() after each replay (untimed)");
ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "keep absl::Mutex deadlock detection on, as Debian's abseil (built "
          "without NDEBUG) sets it; false (the default) turns it off, as the "
          "daemon does (server/main.cc)");
ABSL_FLAG(std::vector<std::string>, paths, {"core"},
          "where to send the calls: core (in process), tcp and unix (a prefixd "
          "daemon started per replay with --prefixd, over TCP or its Unix "
          "socket); every path must reach the same hits and evictions as "
          "core's");
ABSL_FLAG(std::string, prefixd, PREFIXD_DAEMON_PATH,
          "the prefixd binary for the tcp and unix paths");
ABSL_FLAG(bool, json, false, "print JSON instead of a table");
ABSL_FLAG(bool, progress, true, "progress lines on stderr");

namespace prefixd {
namespace {

using bench::CapacityName;
using bench::kInfinite;
using bench::Request;
using bench::Trace;

constexpr char kTenant[] = "replay";

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "trace_replay: %s\n", what.c_str());
  std::exit(1);
}

Trace LoadOrDie(const std::string& name_or_path, const std::string& dir) {
  absl::StatusOr<Trace> t = bench::LoadTrace(name_or_path, dir);
  if (!t.ok()) Die(std::string(t.status().message()));
  return *std::move(t);
}

// --- Replay
// -------------------------------------------------------------------

EvictionPolicy ParsePolicy(const std::string& name) {
  EvictionPolicy p;
  if (!ParseEvictionPolicy(name, &p))
    Die(absl::StrCat("bad eviction policy '", name,
                     "' (lru, adaptive or shadow)"));
  return p;
}

std::unique_ptr<PrefixCache> NewCache(uint64_t capacity_blocks,
                                      EvictionPolicy policy) {
  CacheOptions o;
  o.eviction_policy = policy;
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.block_bytes = 1;
  o.budget_bytes = capacity_blocks;
  o.seed = 1;
  auto cache = PrefixCache::Create(o);
  if (!cache.ok()) Die(cache.status().ToString());
  return *std::move(cache);
}

struct Totals {
  uint64_t requests = 0;
  uint64_t blocks = 0;      // prompt blocks: each one is one block operation
  uint64_t hit_blocks = 0;  // matched
  uint64_t inserted_blocks = 0;
  uint64_t refused = 0;  // Inserts refused (prompt longer than the capacity)
  uint64_t evicted_blocks = 0;
  uint64_t input_tokens = 0;
  uint64_t hit_input_tokens = 0;
  double seconds = 0;      // sum of per-request latencies (wall clock)
  double cpu_seconds = 0;  // this thread's CPU time over the whole replay
  std::vector<uint32_t> latency_ns;
  uint64_t cached_blocks = 0;
  uint64_t tree_nodes = 0;
};

// Replays one request: Match (pinned), Insert, Release. Returns false if
// the Insert was refused.
// Appends the tokens of hash ids (shifted by `shift`): block_size tokens
// (id + shift) * block_size + j per id.
void Expand(absl::Span<const uint64_t> ids, uint64_t shift, int bs,
            std::vector<Token>* out) {
  for (uint64_t id : ids) {
    const uint64_t base = (id + shift) * static_cast<uint64_t>(bs);
    if (base + bs > UINT32_MAX) Die("token ids overflow uint32");
    for (int j = 0; j < bs; ++j) out->push_back(static_cast<Token>(base + j));
  }
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

// Where a replay sends its calls: core in process, or a prefixd daemon over
// gRPC (TCP or a Unix socket). One request is Match (pinned), Insert of the
// whole prompt (matched IDs passed back, fresh IDs for the rest), Release.
class Backend {
 public:
  virtual ~Backend() = default;
  // The matched block IDs in order into *ids; *lease is 0 if none.
  virtual void Match(absl::Span<const Token> tokens, std::vector<BlockId>* ids,
                     uint64_t* lease) = 0;
  // False if the Insert was refused (RESOURCE_EXHAUSTED: the prompt is
  // longer than the capacity); else the tokens already cached.
  virtual bool Insert(absl::Span<const Token> tokens,
                      absl::Span<const BlockId> ids, uint64_t* cached_tokens,
                      uint64_t* evicted) = 0;
  virtual void Release(uint64_t lease) = 0;
  // Fills cached blocks and tree nodes, and checks what it can.
  virtual void Finish(Totals* t) = 0;
  // CPU seconds spent by both sides so far (this thread for core).
  virtual double CpuSeconds() = 0;
};

class CoreBackend final : public Backend {
 public:
  CoreBackend(uint64_t capacity, EvictionPolicy policy)
      : cache_(NewCache(capacity, policy)) {}

  void Match(absl::Span<const Token> tokens, std::vector<BlockId>* ids,
             uint64_t* lease) override {
    MatchQuery m;
    m.tokens = tokens;
    m.pin = true;
    auto match = cache_->Match(kTenant, m);
    if (!match.ok()) Die(match.status().ToString());
    for (const Segment& s : match->segments)
      ids->insert(ids->end(), s.block_ids.begin(), s.block_ids.end());
    *lease = match->lease_id;
  }
  bool Insert(absl::Span<const Token> tokens, absl::Span<const BlockId> ids,
              uint64_t* cached_tokens, uint64_t* evicted) override {
    InsertRequest ins;
    ins.tokens = tokens;
    ins.block_ids = ids;
    auto r = cache_->Insert(kTenant, ins);
    if (!r.ok()) {
      if (!absl::IsResourceExhausted(r.status())) Die(r.status().ToString());
      return false;
    }
    if (!r->redundant_block_ids.empty()) Die("Insert found redundant IDs");
    *cached_tokens = r->cached_tokens;
    *evicted += r->evicted_block_ids.size();
    return true;
  }
  void Release(uint64_t lease) override {
    absl::Status s = cache_->Release(kTenant, lease);
    if (!s.ok()) Die(s.ToString());
  }
  void Finish(Totals* t) override {
    const CacheStats s = cache_->Stats(TenantScope::All());
    t->cached_blocks = s.resident_blocks;
    for (const TenantUsage& ts : s.tenants) t->tree_nodes += ts.tree_nodes;
    if (absl::GetFlag(FLAGS_check)) {
      absl::Status ok = cache_->CheckInvariants();
      if (!ok.ok()) Die(ok.ToString());
    }
  }
  double CpuSeconds() override { return ThreadCpuSeconds(); }

 private:
  std::unique_ptr<PrefixCache> cache_;
};

#ifdef PREFIXD_TRACE_REPLAY_RPC
// A prefixd daemon started for one replay (--prefixd), with a budget of
// `capacity` blocks, reached over TCP or its Unix socket.
class RpcBackend final : public Backend {
 public:
  RpcBackend(uint64_t capacity, EvictionPolicy policy, bool unix_socket) {
    const int bs = absl::GetFlag(FLAGS_block_size);
    absl::StatusOr<int> port = bench::FreeTcpPort();
    if (!port.ok()) Die(port.status().ToString());
    socket_ = absl::StrCat("/tmp/prefixd-replay-", getpid(), ".sock");
    const std::string tcp = absl::StrCat("127.0.0.1:", *port);
    const uint64_t budget_tokens =
        capacity == kInfinite ? uint64_t{1} << 40 : capacity * bs;
    std::vector<std::string> argv = {
        absl::GetFlag(FLAGS_prefixd),
        absl::StrCat("--listen=", tcp),
        absl::StrCat("--listen=unix://", socket_),
        "--metrics_listen=127.0.0.1:0",
        absl::StrCat("--block_size=", bs),
        absl::StrCat("--kv_budget=", budget_tokens, "tokens")};
    // Only when not the default, so that LRU runs against any daemon.
    if (policy != EvictionPolicy::kLru) {
      argv.push_back(
          absl::StrCat("--eviction_policy=", EvictionPolicyName(policy)));
    }
    auto daemon = bench::Subprocess::Start(argv);
    if (!daemon.ok()) Die(daemon.status().ToString());
    daemon_ = *std::move(daemon);
    ClientOptions o;
    o.tenant = kTenant;
    o.wait_for_ready = true;
    o.deadline = absl::Seconds(30);
    auto client = Client::Connect(
        unix_socket ? absl::StrCat("unix://", socket_) : tcp, o);
    if (!client.ok()) Die(client.status().ToString());
    client_ = *std::move(client);
    auto info = client_->GetInfo();
    if (!info.ok()) Die(info.status().ToString());
    if (capacity != kInfinite && info->budget_blocks() != capacity) {
      Die(absl::StrCat("daemon budget is ", info->budget_blocks(),
                       " blocks, wanted ", capacity));
    }
  }
  ~RpcBackend() override {
    client_.reset();
    daemon_->Stop();
    unlink(socket_.c_str());
  }

  void Match(absl::Span<const Token> tokens, std::vector<BlockId>* ids,
             uint64_t* lease) override {
    PrefixOptions pin;
    pin.pin = true;
    auto m = client_->Match(tokens, pin);
    if (!m.ok()) Die(m.status().ToString());
    for (const auto& s : m->response.segments())
      ids->insert(ids->end(), s.block_ids().begin(), s.block_ids().end());
    *lease = m->lease.Detach();
  }
  bool Insert(absl::Span<const Token> tokens, absl::Span<const BlockId> ids,
              uint64_t* cached_tokens, uint64_t* evicted) override {
    auto r = client_->Insert(tokens, ids);
    if (!r.ok()) {
      if (!absl::IsResourceExhausted(r.status())) Die(r.status().ToString());
      return false;
    }
    if (r->response.redundant_block_ids_size() != 0)
      Die("Insert found redundant IDs");
    *cached_tokens = r->response.cached_tokens();
    *evicted += static_cast<uint64_t>(r->response.evicted_block_ids_size());
    return true;
  }
  void Release(uint64_t lease) override {
    absl::Status s = client_->Release(lease);
    if (!s.ok()) Die(s.ToString());
  }
  void Finish(Totals* t) override {
    auto stats = client_->Stats();
    if (!stats.ok()) Die(stats.status().ToString());
    for (const auto& ts : stats->tenants()) {
      t->cached_blocks += ts.cached_blocks();
      t->tree_nodes += ts.tree_nodes();
    }
  }
  double CpuSeconds() override {
    return bench::SelfCpuSeconds() + bench::ProcessCpuSeconds(daemon_->pid());
  }

 private:
  std::string socket_;
  std::unique_ptr<bench::Subprocess> daemon_;
  std::unique_ptr<Client> client_;
};
#endif  // PREFIXD_TRACE_REPLAY_RPC

std::unique_ptr<Backend> NewBackend(const std::string& path, uint64_t capacity,
                                    EvictionPolicy policy) {
  if (path == "core") return std::make_unique<CoreBackend>(capacity, policy);
#ifdef PREFIXD_TRACE_REPLAY_RPC
  if (path == "tcp" || path == "unix") {
    return std::make_unique<RpcBackend>(capacity, policy, path == "unix");
  }
#endif
  Die(absl::StrCat("unknown or unbuilt path '", path,
                   "' (core; tcp and unix need the gRPC client)"));
}

class Replayer {
 public:
  Replayer(Backend* backend, int block_size)
      : backend_(backend), bs_(block_size) {}

  // Returns the matched blocks; *inserted gets the adopted ones.
  uint64_t Run(absl::Span<const Token> tokens, uint64_t* inserted,
               uint64_t* evicted, bool* refused) {
    ids_.clear();
    uint64_t lease = 0;
    backend_->Match(tokens, &ids_, &lease);
    const uint64_t matched = ids_.size();
    const size_t blocks = tokens.size() / bs_;
    while (ids_.size() < blocks) ids_.push_back(next_id_++);
    uint64_t cached_tokens = 0;
    *refused = !backend_->Insert(tokens, ids_, &cached_tokens, evicted);
    *inserted = *refused ? 0 : blocks - cached_tokens / bs_;
    if (lease != 0) backend_->Release(lease);
    return matched;
  }

 private:
  Backend* backend_;
  const int bs_;
  std::vector<BlockId> ids_;
  BlockId next_id_ = 1;
};

class Progress {
 public:
  explicit Progress(std::string what) : what_(std::move(what)) {}
  // Cheap enough per request: looks at the clock every 256 calls.
  void Update(size_t done, size_t total, const char* unit = "requests") {
    if (!absl::GetFlag(FLAGS_progress) || ++calls_ % 256 != 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    std::fprintf(stderr, "trace_replay: %s: %zu/%zu %s\n", what_.c_str(), done,
                 total, unit);
  }

 private:
  std::string what_;
  uint64_t calls_ = 0;
  std::chrono::steady_clock::time_point last_ =
      std::chrono::steady_clock::now();
};

// `tokens`: the whole trace expanded (Expand), request after request.
Totals ReplayOnce(const Trace& trace, absl::Span<const Token> tokens,
                  const std::string& path, uint64_t capacity,
                  EvictionPolicy policy, const std::string& label) {
  std::unique_ptr<Backend> backend = NewBackend(path, capacity, policy);
  const int bs = absl::GetFlag(FLAGS_block_size);
  Replayer replayer(backend.get(), bs);
  const uint64_t block_tokens = absl::GetFlag(FLAGS_trace_block_tokens);
  Totals t;
  t.latency_ns.reserve(trace.requests.size());
  Progress progress(label);
  const double cpu_start = backend->CpuSeconds();
  for (const Request& r : trace.requests) {
    const auto prompt = tokens.subspan(r.first * bs, r.blocks * bs);
    uint64_t inserted = 0;
    bool refused = false;
    const auto start = std::chrono::steady_clock::now();
    const uint64_t matched =
        replayer.Run(prompt, &inserted, &t.evicted_blocks, &refused);
    const auto stop = std::chrono::steady_clock::now();
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(stop - start)
            .count();
    t.latency_ns.push_back(static_cast<uint32_t>(
        std::min<int64_t>(ns, std::numeric_limits<uint32_t>::max())));
    t.seconds += static_cast<double>(ns) * 1e-9;
    ++t.requests;
    t.blocks += r.blocks;
    t.hit_blocks += matched;
    t.inserted_blocks += inserted;
    t.refused += refused;
    t.input_tokens += r.input_length;
    t.hit_input_tokens += std::min(matched * block_tokens, r.input_length);
    progress.Update(t.requests, trace.requests.size());
  }
  t.cpu_seconds = backend->CpuSeconds() - cpu_start;
  backend->Finish(&t);
  return t;
}

double Percentile(std::vector<uint32_t> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

struct Row {
  std::string trace;
  std::string policy;  // EvictionPolicyName
  std::string path;    // core, tcp or unix
  uint64_t capacity;
  Totals t;
  double p50_us, p99_us;
  double ops_per_s;      // block operations per second of summed latencies
  double cpu_ops_per_s;  // block operations per second of CPU time (core:
                         // this thread; tcp/unix: this process + the daemon)
};

Row Replay(const Trace& trace, absl::Span<const Token> tokens,
           const std::string& path, uint64_t capacity, EvictionPolicy policy) {
  const int runs = std::max(1, absl::GetFlag(FLAGS_runs));
  std::vector<Totals> all;
  for (int i = 0; i < runs; ++i) {
    all.push_back(
        ReplayOnce(trace, tokens, path, capacity, policy,
                   absl::StrCat(trace.name, " ", EvictionPolicyName(policy),
                                " ", path, " capacity ", CapacityName(capacity),
                                " run ", i + 1, "/", runs)));
  }
  std::sort(all.begin(), all.end(), [](const Totals& a, const Totals& b) {
    return a.cpu_seconds < b.cpu_seconds;
  });
  Row row{trace.name,
          std::string(EvictionPolicyName(policy)),
          path,
          capacity,
          std::move(all[all.size() / 2]),
          0,
          0,
          0,
          0};
  row.p50_us = Percentile(row.t.latency_ns, 0.50) / 1e3;
  row.p99_us = Percentile(row.t.latency_ns, 0.99) / 1e3;
  row.ops_per_s = row.t.blocks / row.t.seconds;
  row.cpu_ops_per_s = row.t.blocks / row.t.cpu_seconds;
  return row;
}

// --- Memory
// -------------------------------------------------------------------

uint64_t VmRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      uint64_t kb = 0;
      absl::string_view v(line);
      v.remove_prefix(6);
      v = absl::StripAsciiWhitespace(v);
      absl::ConsumeSuffix(&v, "kB");
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kb)) break;
      return kb * 1024;
    }
  }
  Die("cannot read VmRSS from /proc/self/status");
}

// Bytes the allocator has handed out and not had back (small chunks plus
// mmapped ones): what the data structures use, without page-level effects.
uint64_t HeapInUse() {
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

struct Memory {
  std::string trace;
  uint64_t passes = 0;
  uint64_t cached_blocks = 0;
  uint64_t tree_nodes = 0;
  uint64_t rss_before = 0, rss_after = 0;
  uint64_t heap_before = 0, heap_after = 0;  // malloc'd bytes in use
  double bytes_per_block = 0;                // VmRSS growth per cached block
  double heap_bytes_per_block = 0;  // malloc in-use growth per cached block
};

// Replays `trace` with ids shifted by (max_id + 1) on each pass into an
// unbounded cache until it caches `target` blocks.
Memory MeasureMemory(const Trace& trace, uint64_t target) {
  Memory m;
  m.trace = trace.name;
  // Nothing is evicted, so the policy shows only in what it keeps per
  // block: the first one listed is measured.
  CoreBackend backend(kInfinite,
                      ParsePolicy(absl::GetFlag(FLAGS_eviction_policy)[0]));
  Replayer replayer(&backend, absl::GetFlag(FLAGS_block_size));
  size_t longest = 0;
  for (const Request& r : trace.requests) longest = std::max(longest, r.blocks);
  const int bs = absl::GetFlag(FLAGS_block_size);
  std::vector<Token> prompt;
  prompt.reserve(longest * bs);
  Progress progress("memory");
  m.heap_before = HeapInUse();
  m.rss_before = VmRssBytes();
  uint64_t cached = 0, evicted = 0;
  while (cached < target) {
    const uint64_t shift = m.passes * (trace.max_id + 1);
    ++m.passes;
    for (const Request& r : trace.requests) {
      prompt.clear();
      Expand(absl::MakeConstSpan(trace.ids).subspan(r.first, r.blocks), shift,
             bs, &prompt);
      uint64_t inserted = 0;
      bool refused = false;
      replayer.Run(prompt, &inserted, &evicted, &refused);
      cached += inserted;
      if (cached >= target) break;
      progress.Update(cached, target, "blocks");
    }
  }
  m.rss_after = VmRssBytes();
  m.heap_after = HeapInUse();
  Totals t;
  backend.Finish(&t);
  m.cached_blocks = t.cached_blocks;
  m.tree_nodes = t.tree_nodes;
  if (m.cached_blocks != cached || evicted != 0)
    Die("memory replay lost blocks");
  m.bytes_per_block = static_cast<double>(m.rss_after - m.rss_before) /
                      static_cast<double>(m.cached_blocks);
  m.heap_bytes_per_block = static_cast<double>(m.heap_after - m.heap_before) /
                           static_cast<double>(m.cached_blocks);
  return m;
}

// --- Output
// -------------------------------------------------------------------

double Ratio(uint64_t a, uint64_t b) {
  return b == 0 ? 0 : static_cast<double>(a) / static_cast<double>(b);
}

void PrintTable(const std::vector<Row>& rows, const std::optional<Memory>& m) {
  if (!rows.empty()) {
    std::printf(
        "%-14s %-8s %-5s %10s %8s %9s %9s %9s %8s %9s %7s %12s %12s %8s "
        "%8s\n",
        "trace", "policy", "path", "capacity", "requests", "blocks", "hit_blk",
        "blk_hit", "tok_hit", "evicted", "refused", "blk_ops/s", "cpu_ops/s",
        "p50_us", "p99_us");
  }
  for (const Row& r : rows) {
    std::printf(
        "%-14s %-8s %-5s %10s %8llu %9llu %9llu %8.4f%% %7.3f%% %9llu %7llu "
        "%12.0f %12.0f %8.2f %8.2f\n",
        r.trace.c_str(), r.policy.c_str(), r.path.c_str(),
        CapacityName(r.capacity).c_str(),
        static_cast<unsigned long long>(r.t.requests),
        static_cast<unsigned long long>(r.t.blocks),
        static_cast<unsigned long long>(r.t.hit_blocks),
        100 * Ratio(r.t.hit_blocks, r.t.blocks),
        100 * Ratio(r.t.hit_input_tokens, r.t.input_tokens),
        static_cast<unsigned long long>(r.t.evicted_blocks),
        static_cast<unsigned long long>(r.t.refused), r.ops_per_s,
        r.cpu_ops_per_s, r.p50_us, r.p99_us);
  }
  if (m) {
    std::printf(
        "\nmemory: %s replayed %llu time(s) (ids shifted per pass), "
        "unbounded cache, block_size %d\n"
        "  cached blocks %llu (%llu tokens) in %llu tree nodes; VmRSS %.1f -> "
        "%.1f MiB\n"
        "  resident bytes per cached block: %.1f (malloc in use: %.1f)\n",
        m->trace.c_str(), static_cast<unsigned long long>(m->passes),
        absl::GetFlag(FLAGS_block_size),
        static_cast<unsigned long long>(m->cached_blocks),
        static_cast<unsigned long long>(m->cached_blocks *
                                        absl::GetFlag(FLAGS_block_size)),
        static_cast<unsigned long long>(m->tree_nodes),
        m->rss_before / 1048576.0, m->rss_after / 1048576.0, m->bytes_per_block,
        m->heap_bytes_per_block);
  }
}

void PrintJson(const std::vector<Row>& rows, const std::optional<Memory>& m) {
  std::vector<std::string> items;
  for (const Row& r : rows) {
    items.push_back(absl::StrFormat(
        "    {\"trace\": \"%s\", \"eviction_policy\": \"%s\", "
        "\"path\": \"%s\", \"capacity\": \"%s\", "
        "\"requests\": %d, "
        "\"blocks\": %d, \"hit_blocks\": %d, \"inserted_blocks\": %d, "
        "\"evicted_blocks\": %d, \"refused_inserts\": %d, "
        "\"block_hit_rate\": %.6f, \"input_tokens\": %d, "
        "\"hit_input_tokens\": %d, \"token_hit_rate\": %.6f, "
        "\"block_ops_per_second\": %.0f, \"block_ops_per_cpu_second\": %.0f, "
        "\"p50_us\": %.3f, \"p99_us\": %.3f, "
        "\"cached_blocks\": %d, \"tree_nodes\": %d}",
        r.trace, r.policy, r.path, CapacityName(r.capacity), r.t.requests,
        r.t.blocks, r.t.hit_blocks, r.t.inserted_blocks, r.t.evicted_blocks,
        r.t.refused, Ratio(r.t.hit_blocks, r.t.blocks), r.t.input_tokens,
        r.t.hit_input_tokens, Ratio(r.t.hit_input_tokens, r.t.input_tokens),
        r.ops_per_s, r.cpu_ops_per_s, r.p50_us, r.p99_us, r.t.cached_blocks,
        r.t.tree_nodes));
  }
  std::printf("{\n  \"block_size\": %d,\n  \"replays\": [\n%s\n  ]",
              absl::GetFlag(FLAGS_block_size),
              absl::StrJoin(items, ",\n").c_str());
  if (m) {
    std::printf(
        ",\n  \"memory\": {\"trace\": \"%s\", \"passes\": %llu, "
        "\"cached_blocks\": %llu, \"tree_nodes\": %llu, \"rss_before\": %llu, "
        "\"rss_after\": %llu, \"bytes_per_block\": %.1f, "
        "\"heap_bytes_per_block\": %.1f}",
        m->trace.c_str(), static_cast<unsigned long long>(m->passes),
        static_cast<unsigned long long>(m->cached_blocks),
        static_cast<unsigned long long>(m->tree_nodes),
        static_cast<unsigned long long>(m->rss_before),
        static_cast<unsigned long long>(m->rss_after), m->bytes_per_block,
        m->heap_bytes_per_block);
  }
  std::printf("\n}\n");
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_trace_dir);
  std::vector<uint64_t> capacities;
  for (const std::string& c : absl::GetFlag(FLAGS_capacities)) {
    absl::StatusOr<uint64_t> cap = bench::ParseCapacity(c);
    if (!cap.ok()) Die(std::string(cap.status().message()));
    capacities.push_back(*cap);
  }
  if (absl::GetFlag(FLAGS_block_size) < 1) Die("block_size must be >= 1");
  std::vector<EvictionPolicy> policies;
  for (const std::string& p : absl::GetFlag(FLAGS_eviction_policy))
    policies.push_back(ParsePolicy(p));
  if (policies.empty()) Die("--eviction_policy lists no policy");
  if (!absl::GetFlag(FLAGS_mutex_deadlock_detection))
    prefixd::DisableMutexDeadlockDetection();

  std::optional<Memory> memory;
  if (absl::GetFlag(FLAGS_memory_blocks) > 0) {
    const Trace t = LoadOrDie(absl::GetFlag(FLAGS_memory_trace), dir);
    memory = MeasureMemory(t, absl::GetFlag(FLAGS_memory_blocks));
  }
  std::vector<Row> rows;
  for (const std::string& name : absl::GetFlag(FLAGS_traces)) {
    const Trace trace = LoadOrDie(name, dir);
    std::vector<Token> tokens;
    tokens.reserve(trace.ids.size() * absl::GetFlag(FLAGS_block_size));
    Expand(trace.ids, 0, absl::GetFlag(FLAGS_block_size), &tokens);
    for (uint64_t cap : capacities) {
      for (EvictionPolicy policy : policies) {
        std::optional<size_t> core;  // index of this capacity's core row
        for (const std::string& path : absl::GetFlag(FLAGS_paths)) {
          rows.push_back(Replay(trace, tokens, path, cap, policy));
          if (path == "core") core = rows.size() - 1;
          // Every path must reach the same cache: same hits, adoptions,
          // evictions and refusals, block for block.
          if (core.has_value() && *core != rows.size() - 1) {
            const Totals &a = rows[*core].t, &b = rows.back().t;
            if (a.hit_blocks != b.hit_blocks ||
                a.inserted_blocks != b.inserted_blocks ||
                a.evicted_blocks != b.evicted_blocks ||
                a.refused != b.refused || a.cached_blocks != b.cached_blocks) {
              Die(absl::StrCat(trace.name, " capacity ", CapacityName(cap),
                               ": ", path, " differs from core (hit ",
                               b.hit_blocks, " vs ", a.hit_blocks, ", evicted ",
                               b.evicted_blocks, " vs ", a.evicted_blocks,
                               ")"));
            }
          }
        }
      }
    }
  }
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(rows, memory);
  } else {
    PrintTable(rows, memory);
  }
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Replays Mooncake traces through prefixd's core in process, or "
      "through the daemon over TCP and a Unix socket (--paths); see "
      "docs/performance.md.");
  prefixd::bench::ListBenchFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  return prefixd::Main();
}
