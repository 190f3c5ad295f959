// index_bench: the fleet index's ingest rate and memory (docs/performance.md,
// "Fleet index", targets I1 and I2), and Route in process.
//
// The workload is the Mooncake conversation trace as 8 engines would publish
// it: each request goes to one worker (by a hash of its session, the first
// hash id that not every request shares; --spread of them to a worker picked
// by a hash of the request instead, as a load balancer spills), and that
// worker emits one BlockStored for the request's blocks it does not hold yet,
// parented on the engine hash of the block before them (nil at the root).
// The block of hash id h has the 16 tokens h*16 .. h*16+15 and, at every
// worker, the engine hash h*0x9e3779b97f4a7c15+1. Events go out in vLLM's
// array encoding, ["BlockStored", hashes, parent, token_ids, 16, nil, "GPU"],
// --events_per_batch to a payload [ts, events, nil] per worker, packed with
// msgpack-cxx up front (not timed).
//
//   I1 ingest: stored blocks per second on one thread, DecodeEventBatch +
//      FleetIndex::Apply of every payload into a fresh index, against
//      msgpack::unpack of the same payloads alone (and DecodeEventBatch
//      alone, to split the difference). Each measurement repeats whole
//      passes until it has taken --min_time; the best of --repetitions.
//   I2 memory: the trace replicated with disjoint tokens and hashes (each
//      replica adds (max id + 1) * r to every hash id) until the index holds
//      --memory_entries (block, holder) entries; RSS (/proc/self/statm)
//      growth per entry. Measured first, before the process frees anything.
//   Route in process: the index of the gRPC Route benchmark (16 workers,
//      bench/load/route_index.h), one Route of a 2k-token prompt at a time.
//   stall (not run by default): how long Routes wait while one worker's
//      chain of --stall_chain identical blocks is stored, removed leaf
//      first and cleared, each in one event, a tier of it cleared and the
//      key lookup built over it; while max_entries trims it and then
//      sweeps its worker's stale hashes; and while a trim scans as many
//      leaves (StallPhase).
//
// Prints a table and PASS/FAIL per target; exits 0 either way (it is a
// benchmark), 1 only if the workload could not be built or applied.
//
//   reports (not run by default): SGLang KV-indexer reports (hashes without
//      tokens, ApplyHashes in batches of 64) in fleets of 16 and 128
//      workers that each hold 5,000 hashes: a hash no worker holds yet, and
//      one another worker holds (ReportsPhase).
//
//   index_bench [--trace=PATH]
//   [--phases=memory,ingest,route,stall,pick,reports]
#include <malloc.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "bench/bench_util.h"
#include "bench/load/route_index.h"
#include "index/engine_loads.h"
#include "index/events.h"
#include "index/fleet_index.h"
#include "index/picker.h"

// As index/events.cc: Debian's msgpack-cxx needs Boost unless told not to.
#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

ABSL_FLAG(std::string, trace,
          PREFIXD_SOURCE_DIR "/tests/data/mooncake/conversation_trace.jsonl",
          "Mooncake trace (JSON lines with \"hash_ids\")");
ABSL_FLAG(
    std::string, phases, "memory,ingest,route",
    "which measurements, in this order: memory, ingest, route, stall, pick, "
    "reports "
    "(ingest_only: the ingest passes without their baselines, for "
    "profilers)");
ABSL_FLAG(int, workers, 8, "engines (workers) the trace is spread over");
ABSL_FLAG(double, spread, 0.25,
          "fraction of requests sent to a worker picked by a hash of the "
          "request rather than of its session");
ABSL_FLAG(int, events_per_batch, 4, "BlockStored events per payload");
ABSL_FLAG(absl::Duration, min_time, absl::Seconds(1),
          "least time per ingest measurement (whole passes)");
ABSL_FLAG(int, repetitions, 3, "ingest measurements; the best counts");
ABSL_FLAG(uint64_t, memory_entries, 10000000,
          "(block, holder) entries to fill the index with for I2");
ABSL_FLAG(bool, key_lookup, false,
          "index blocks by their rolling keys too, as the daemon does with "
          "the Conductor API on (index.http_listen)");
ABSL_FLAG(int, route_workers, 16, "Route in process: workers");
ABSL_FLAG(size_t, stall_chain, 200000,
          "stall: blocks of the chain (and hashes reported) the changes apply");
ABSL_FLAG(int, route_prompt_tokens, 2048, "Route in process: prompt tokens");

namespace prefixd::bench {
namespace {

constexpr int kBlockSize = 16;
constexpr uint64_t kHashMul = 0x9e3779b97f4a7c15ULL;
// Targets (docs/performance.md, "Fleet index").
constexpr double kIngestVsUnpack = 0.5;
constexpr double kIngestBlocksPerS = 3e6;
constexpr double kBytesPerEntry = 100;
// With the lookup by key (the Conductor API's /query_by_hash) on.
constexpr double kBytesPerEntryWithKeyLookup = 110;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "index_bench: %s\n", what.c_str());
  std::exit(1);
}

// --- The trace ----------------------------------------------------------

struct Trace {
  std::vector<uint64_t> ids;  // every request's hash ids, back to back
  std::vector<size_t> first;  // request i: ids[first[i] .. first[i+1])
  uint64_t max_id = 0;
  size_t requests() const { return first.size() - 1; }
  absl::Span<const uint64_t> request(size_t i) const {
    return absl::MakeConstSpan(ids).subspan(first[i], first[i + 1] - first[i]);
  }
};

// Reads the "hash_ids" arrays; everything else is ignored.
Trace LoadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) Die(absl::StrCat("cannot open ", path));
  Trace t;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    size_t at = line.find("\"hash_ids\"");
    if (at != std::string::npos) at = line.find('[', at);
    const size_t end = at == std::string::npos ? at : line.find(']', at);
    if (end == std::string::npos)
      Die(absl::StrCat(path, ":", n, ": no \"hash_ids\" array"));
    t.first.push_back(t.ids.size());
    for (absl::string_view v :
         absl::StrSplit(absl::string_view(line).substr(at + 1, end - at - 1),
                        ',', absl::SkipWhitespace())) {
      uint64_t id;
      if (!absl::SimpleAtoi(v, &id))
        Die(absl::StrCat(path, ":", n, ": bad hash id \"", v, "\""));
      t.ids.push_back(id);
      t.max_id = std::max(t.max_id, id);
    }
    if (t.ids.size() == t.first.back())
      Die(absl::StrCat(path, ":", n, ": empty hash_ids"));
  }
  if (t.first.empty()) Die(absl::StrCat(path, " has no requests"));
  t.first.push_back(t.ids.size());
  return t;
}

// --- The events ---------------------------------------------------------

// One BlockStored: request `request`'s blocks from position `from` on.
struct EventSpec {
  uint32_t request;
  uint32_t from;
};

// One payload: a worker's next events.
struct BatchSpec {
  uint32_t worker;
  int64_t seq;
  std::vector<EventSpec> events;
};

struct Workload {
  std::vector<BatchSpec> batches;
  uint64_t events = 0;
  uint64_t blocks = 0;  // stored blocks per replica = entries it adds
  uint64_t distinct = 0;
  std::vector<uint64_t> worker_blocks;
};

// Which worker serves each request, and what it stores (see the top).
Workload BuildWorkload(const Trace& t, int workers, double spread,
                       int per_batch) {
  Workload w;
  w.worker_blocks.assign(workers, 0);
  std::vector<absl::flat_hash_set<uint64_t>> held(workers);
  // The session: the first hash id that not every request shares (in the
  // conversation trace every request starts with id 0).
  size_t common = 0;
  while (true) {
    bool all = true;
    for (size_t r = 0; r < t.requests() && all; ++r) {
      const auto ids = t.request(r);
      all = ids.size() > common && ids[common] == t.request(0)[common];
    }
    if (!all) break;
    ++common;
  }
  std::vector<std::vector<EventSpec>> pending(workers);
  std::vector<int64_t> seq(workers, 0);
  const auto flush = [&](int worker) {
    if (pending[worker].empty()) return;
    w.batches.push_back({static_cast<uint32_t>(worker), seq[worker]++,
                         std::move(pending[worker])});
    pending[worker].clear();
  };
  absl::flat_hash_set<uint64_t> distinct;
  for (size_t r = 0; r < t.requests(); ++r) {
    const auto ids = t.request(r);
    const uint64_t session = ids[std::min(common, ids.size() - 1)];
    int worker = static_cast<int>(Mix64(session) % workers);
    if (static_cast<double>(Mix64(r + 0x51ed) % 1000000) < spread * 1e6) {
      worker = static_cast<int>(Mix64(r * 7 + 1) % workers);
    }
    // What a worker holds is prefix-closed (every id has one parent).
    size_t from = 0;
    while (from < ids.size() && held[worker].contains(ids[from])) ++from;
    if (from == ids.size()) continue;
    for (size_t i = from; i < ids.size(); ++i) {
      held[worker].insert(ids[i]);
      distinct.insert(ids[i]);
    }
    w.blocks += ids.size() - from;
    w.worker_blocks[worker] += ids.size() - from;
    ++w.events;
    pending[worker].push_back(
        {static_cast<uint32_t>(r), static_cast<uint32_t>(from)});
    if (static_cast<int>(pending[worker].size()) >= per_batch) flush(worker);
  }
  for (int i = 0; i < workers; ++i) flush(i);
  w.distinct = distinct.size();
  return w;
}

// Appends to a std::string whose capacity is kept between packings.
struct Buffer {
  std::string* out;
  void write(const char* p, size_t n) { out->append(p, n); }
};

struct Payloads {
  std::string bytes;
  std::vector<size_t> end;  // payload i: bytes[end[i-1] .. end[i])
  absl::string_view at(size_t i) const {
    const size_t begin = i == 0 ? 0 : end[i - 1];
    return absl::string_view(bytes).substr(begin, end[i] - begin);
  }
};

// Packs the workload with every hash id shifted by `shift` (replicas).
void Pack(const Trace& t, const Workload& w, uint64_t shift, Payloads* out) {
  out->bytes.clear();
  out->end.clear();
  Buffer buf{&out->bytes};
  msgpack::packer<Buffer> pk(buf);
  const double ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  for (const BatchSpec& b : w.batches) {
    pk.pack_array(3);
    pk.pack_double(ts);
    pk.pack_array(static_cast<uint32_t>(b.events.size()));
    for (const EventSpec& e : b.events) {
      const auto ids = t.request(e.request);
      const uint32_t n = static_cast<uint32_t>(ids.size() - e.from);
      pk.pack_array(7);
      pk.pack_str(11);
      pk.pack_str_body("BlockStored", 11);
      pk.pack_array(n);
      for (size_t i = e.from; i < ids.size(); ++i)
        pk.pack_uint64((ids[i] + shift) * kHashMul + 1);
      if (e.from == 0) {
        pk.pack_nil();
      } else {
        pk.pack_uint64((ids[e.from - 1] + shift) * kHashMul + 1);
      }
      pk.pack_array(n * kBlockSize);
      for (size_t i = e.from; i < ids.size(); ++i) {
        for (int j = 0; j < kBlockSize; ++j) {
          pk.pack_uint32(static_cast<uint32_t>((ids[i] + shift) * kBlockSize +
                                               static_cast<uint64_t>(j)));
        }
      }
      pk.pack_int(kBlockSize);
      pk.pack_nil();
      pk.pack_str(3);
      pk.pack_str_body("GPU", 3);
    }
    pk.pack_nil();
    out->end.push_back(out->bytes.size());
  }
}

// --- Measurements -------------------------------------------------------

uint64_t RssBytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) Die("cannot read /proc/self/statm");
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

uint64_t HeapInUse() {
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

std::unique_ptr<FleetIndex> NewIndex(int workers, std::vector<WorkerId>* ids,
                                     uint64_t max_entries = 50000000) {
  IndexOptions o;
  o.block_size = kBlockSize;
  o.max_entries = max_entries;
  o.key_lookup = absl::GetFlag(FLAGS_key_lookup);
  auto index = std::make_unique<FleetIndex>(o);
  ids->clear();
  for (int i = 0; i < workers; ++i)
    ids->push_back(index->AddWorker(absl::StrCat("w", i), "bench"));
  return index;
}

void DecodeOrDie(absl::string_view payload, KvEventBatch* batch) {
  if (absl::Status s = DecodeEventBatch(payload, batch); !s.ok())
    Die(absl::StrCat("DecodeEventBatch: ", s.ToString()));
}

// Times a region by this thread's CPU time (what the rates are: robust to
// other processes on the machine, as trace_replay's cpu_ops/s) and by the
// wall clock.
struct Stopwatch {
  double cpu0 = ThreadCpuSeconds();
  absl::Time wall0 = absl::Now();
  struct Lap {
    double cpu, wall;
  };
  Lap Stop() const {
    return {ThreadCpuSeconds() - cpu0,
            absl::ToDoubleSeconds(absl::Now() - wall0)};
  }
};

// One rate: whole passes of `pass` (which returns the time it measured)
// until their CPU time adds up to min_time; the best of `repetitions` such.
struct Rate {
  double best = 0;       // per CPU second
  double best_wall = 0;  // per wall second, of the same measurement
  std::vector<double> all;
};

using Pass = std::function<Stopwatch::Lap()>;

// Several rates measured together: in each repetition the passes take
// turns (one of each, round robin, until each has its min_time), so that
// the sides of a ratio see the same machine even when other processes
// come and go.
std::vector<Rate> MeasureTogether(uint64_t items_per_pass,
                                  const std::vector<Pass>& passes) {
  std::vector<Rate> rates(passes.size());
  const double min_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_min_time));
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repetitions); ++rep) {
    std::vector<double> cpu(passes.size()), wall(passes.size());
    std::vector<uint64_t> items(passes.size());
    bool more = true;
    while (more) {
      more = false;
      for (size_t k = 0; k < passes.size(); ++k) {
        if (cpu[k] >= min_s) continue;
        const Stopwatch::Lap lap = passes[k]();
        cpu[k] += lap.cpu;
        wall[k] += lap.wall;
        items[k] += items_per_pass;
        more = more || cpu[k] < min_s;
      }
    }
    for (size_t k = 0; k < passes.size(); ++k) {
      Rate& r = rates[k];
      r.all.push_back(static_cast<double>(items[k]) / cpu[k]);
      if (r.all.back() > r.best) {
        r.best = r.all.back();
        r.best_wall = static_cast<double>(items[k]) / wall[k];
      }
    }
  }
  return rates;
}

Rate Measure(uint64_t items_per_pass, const Pass& pass) {
  return MeasureTogether(items_per_pass, {pass})[0];
}

std::string Rates(const Rate& r) {
  std::string out;
  for (double v : r.all) absl::StrAppendFormat(&out, " %.2f", v / 1e6);
  return out;
}

const char* Verdict(bool met) { return met ? "PASS" : "FAIL"; }

struct Verdicts {
  std::vector<std::string> lines;
  void Add(const std::string& line) { lines.push_back(line); }
};

void MemoryPhase(const Trace& t, const Workload& w, Verdicts* v) {
  const uint64_t target = absl::GetFlag(FLAGS_memory_entries);
  const int workers = absl::GetFlag(FLAGS_workers);
  std::printf(
      "\nI2 memory: the trace replicated (disjoint tokens and hashes) "
      "until %llu entries\n",
      static_cast<unsigned long long>(target));
  // Everything the fill reuses is allocated and touched before the first
  // reading: the payload buffer (with room for the replicas' longer ints),
  // the payload ends, the decoded batch's vectors.
  Payloads payloads;
  Pack(t, w, t.max_id + 1, &payloads);
  payloads.bytes.reserve(payloads.bytes.size() * 5 / 4);
  payloads.bytes.resize(payloads.bytes.capacity(), 'x');
  const size_t room = payloads.bytes.capacity();
  KvEventBatch batch;
  Pack(t, w, t.max_id + 1, &payloads);
  for (size_t i = 0; i < payloads.end.size(); ++i)
    DecodeOrDie(payloads.at(i), &batch);
  std::vector<WorkerId> ids;
  std::unique_ptr<FleetIndex> index =
      NewIndex(workers, &ids, std::numeric_limits<uint64_t>::max());

  const uint64_t rss0 = RssBytes();
  const uint64_t heap0 = HeapInUse();
  const struct mallinfo2 mi0 = mallinfo2();
  uint64_t entries = 0, replicas = 0;
  double seconds = 0, cpu_seconds = 0;
  int64_t seq_base = 0;
  while (entries < target) {
    if ((replicas + 1) * (t.max_id + 1) * kBlockSize >
        std::numeric_limits<Token>::max()) {
      Die("the replicas' token ids would pass 2^32: --memory_entries too big");
    }
    Pack(t, w, replicas * (t.max_id + 1), &payloads);
    if (payloads.bytes.capacity() != room) Die("the payload buffer grew");
    ++replicas;
    const Stopwatch watch;
    for (size_t i = 0; i < payloads.end.size() && entries < target; ++i) {
      DecodeOrDie(payloads.at(i), &batch);
      const BatchSpec& b = w.batches[i];
      index->Apply(ids[b.worker], batch, seq_base + b.seq, absl::Now());
      for (const EventSpec& e : b.events)
        entries += t.request(e.request).size() - e.from;
    }
    const Stopwatch::Lap lap = watch.Stop();
    seconds += lap.wall;
    cpu_seconds += lap.cpu;
    seq_base += static_cast<int64_t>(w.batches.size());
  }
  const uint64_t rss1 = RssBytes();
  const uint64_t heap1 = HeapInUse();
  const struct mallinfo2 mi1 = mallinfo2();
  const IndexStats stats = index->Stats();
  uint64_t dropped = 0;
  for (uint64_t d : stats.dropped) dropped += d;
  if (stats.entries != entries || dropped != 0) {
    Die(absl::StrCat("the index holds ", stats.entries, " entries, ", dropped,
                     " blocks dropped; the events stored ", entries));
  }
  const double per_entry =
      static_cast<double>(rss1 - rss0) / static_cast<double>(stats.entries);
  const double heap_per_entry =
      static_cast<double>(heap1 - heap0) / static_cast<double>(stats.entries);
  std::printf("  replicas       %llu (the last one partly)\n",
              static_cast<unsigned long long>(replicas));
  std::printf(
      "  blocks         %llu (tree blocks) in %llu nodes, %.2f "
      "blocks per node\n",
      static_cast<unsigned long long>(stats.blocks),
      static_cast<unsigned long long>(stats.nodes),
      static_cast<double>(stats.blocks) /
          static_cast<double>(std::max<uint64_t>(stats.nodes, 1)));
  std::printf("  entries        %llu ((block, holder) pairs)\n",
              static_cast<unsigned long long>(stats.entries));
  std::printf("  entries/block  %.3f\n", static_cast<double>(stats.entries) /
                                             static_cast<double>(stats.blocks));
  std::printf("  RSS            %.1f MiB -> %.1f MiB (+%.1f MiB)\n",
              rss0 / 1048576.0, rss1 / 1048576.0, (rss1 - rss0) / 1048576.0);
  std::printf(
      "  bytes/entry    %.1f of RSS (%.1f per block); %.1f of malloc "
      "in use\n",
      per_entry,
      static_cast<double>(rss1 - rss0) / static_cast<double>(stats.blocks),
      heap_per_entry);
  const auto mib = [](size_t a, size_t b) {
    return (static_cast<double>(b) - static_cast<double>(a)) / 1048576.0;
  };
  std::printf(
      "  malloc         small chunks in use +%.1f MiB (heap +%.1f MiB; "
      "free in it after: %.1f MiB); mmapped +%.1f MiB (large arrays, "
      "at capacity, resident only where touched)\n",
      mib(mi0.uordblks, mi1.uordblks), mib(mi0.arena, mi1.arena),
      mib(0, mi1.fordblks), mib(mi0.hblkhd, mi1.hblkhd));
  std::printf(
      "  ingest time    %.2f s wall, %.2f s thread CPU (decode + "
      "apply, packing excluded): %.2f M blocks/s of CPU into the "
      "growing index\n",
      seconds, cpu_seconds, static_cast<double>(entries) / cpu_seconds / 1e6);
  const bool by_key = absl::GetFlag(FLAGS_key_lookup);
  const double bound = by_key ? kBytesPerEntryWithKeyLookup : kBytesPerEntry;
  v->Add(absl::StrFormat(
      "I2  RSS per (block, holder) entry at %llu entries%s <= %.0f B: "
      "%.1f B (%.3f entries per block)  %s",
      static_cast<unsigned long long>(stats.entries),
      by_key ? " with the lookup by key" : "", bound, per_entry,
      static_cast<double>(stats.entries) / static_cast<double>(stats.blocks),
      Verdict(per_entry <= bound)));
}

// The memory phase in a child process: a heap that has freed nothing yet
// (the other phases free whole indexes, whose chunks a new index would
// reuse without growing RSS). Its verdict comes back through a pipe.
void MemoryInChild(const Trace& t, const Workload& w, Verdicts* v) {
  int fds[2];
  if (pipe(fds) != 0) Die("pipe");
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    close(fds[0]);
    Verdicts mine;
    MemoryPhase(t, w, &mine);
    std::fflush(stdout);
    for (const std::string& line : mine.lines) {
      const std::string l = line + "\n";
      if (write(fds[1], l.data(), l.size()) < 0) _exit(1);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0)
    got.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    Die("the memory phase failed");
  for (absl::string_view line : absl::StrSplit(got, '\n', absl::SkipEmpty()))
    v->Add(std::string(line));
}

void IngestPhase(const Trace& t, const Workload& w, bool only_apply,
                 Verdicts* v) {
  const int workers = absl::GetFlag(FLAGS_workers);
  Payloads payloads;
  Pack(t, w, 0, &payloads);
  const size_t n = payloads.end.size();
  std::printf(
      "\nI1 ingest, one thread: %zu payloads, %llu BlockStored, %llu "
      "blocks, %.1f MiB (%.1f bytes per block) per pass\n",
      n, static_cast<unsigned long long>(w.events),
      static_cast<unsigned long long>(w.blocks),
      payloads.bytes.size() / 1048576.0,
      static_cast<double>(payloads.bytes.size()) /
          static_cast<double>(w.blocks));

  // The index a pass builds must hold every stored block.
  {
    std::vector<WorkerId> ids;
    std::unique_ptr<FleetIndex> index = NewIndex(workers, &ids);
    KvEventBatch batch;
    for (size_t i = 0; i < n; ++i) {
      DecodeOrDie(payloads.at(i), &batch);
      index->Apply(ids[w.batches[i].worker], batch, w.batches[i].seq,
                   absl::Now());
    }
    const IndexStats s = index->Stats();
    const absl::Status invariants = index->CheckInvariants();
    if (s.entries != w.blocks || !invariants.ok()) {
      Die(absl::StrCat("a pass indexed ", s.entries, " entries of ", w.blocks,
                       " stored blocks ", invariants.ToString()));
    }
  }

  uint64_t sink = 0;
  KvEventBatch batch;
  const Pass unpack_pass = [&] {
    const Stopwatch watch;
    for (size_t i = 0; i < n; ++i) {
      const absl::string_view p = payloads.at(i);
      msgpack::object_handle h;
      msgpack::unpack(h, p.data(), p.size());
      sink += h.get().via.array.size;
    }
    return watch.Stop();
  };
  // The same, as DecodeEventBatch called it before it read payloads in
  // place: strings referenced in the payload rather than copied, and
  // limits.
  const Pass unpack_ref_pass = [&] {
    const Stopwatch watch;
    for (size_t i = 0; i < n; ++i) {
      const absl::string_view p = payloads.at(i);
      msgpack::object_handle h;
      size_t offset = 0;
      bool referenced;
      msgpack::unpack(
          h, p.data(), p.size(), offset, referenced,
          [](msgpack::type::object_type, size_t, void*) { return true; },
          nullptr,
          msgpack::unpack_limit(p.size(), p.size() / 2, size_t{1} << 24,
                                size_t{1} << 24, size_t{1} << 24, 32));
      sink += h.get().via.array.size;
    }
    return watch.Stop();
  };
  const Pass decode_pass = [&] {
    const Stopwatch watch;
    for (size_t i = 0; i < n; ++i) {
      DecodeOrDie(payloads.at(i), &batch);
      sink += batch.events.size();
    }
    return watch.Stop();
  };
  const Pass ingest_pass = [&] {
    std::vector<WorkerId> ids;
    std::unique_ptr<FleetIndex> index = NewIndex(workers, &ids);
    const Stopwatch watch;
    for (size_t i = 0; i < n; ++i) {
      DecodeOrDie(payloads.at(i), &batch);
      index->Apply(ids[w.batches[i].worker], batch, w.batches[i].seq,
                   absl::Now());
    }
    const Stopwatch::Lap lap = watch.Stop();
    index.reset();  // not timed
    return lap;
  };
  if (only_apply) {  // for profilers: the ingest passes alone
    const Rate r = Measure(w.blocks, ingest_pass);
    std::printf("  DecodeEventBatch + FleetIndex::Apply alone: %.2f M/s\n",
                r.best / 1e6);
    return;
  }
  const std::vector<Rate> rates = MeasureTogether(
      w.blocks, {unpack_pass, unpack_ref_pass, decode_pass, ingest_pass});
  const Rate& unpack = rates[0];
  const Rate& unpack_ref = rates[1];
  const Rate& decode = rates[2];
  const Rate& ingest = rates[3];
  if (sink == 0) Die("nothing decoded");

  const auto row = [&](const char* what, const Rate& r) {
    std::printf("  %-44s %6.2f M/s %7.1f ns/block  (wall %5.2f M/s)  runs:%s\n",
                what, r.best / 1e6, 1e9 / r.best, r.best_wall / 1e6,
                Rates(r).c_str());
  };
  std::printf(
      "  blocks per second of thread CPU time; best of %d, each >= %s "
      "of whole passes, the four taking turns; a fresh index per "
      "ingest pass\n",
      absl::GetFlag(FLAGS_repetitions),
      absl::FormatDuration(absl::GetFlag(FLAGS_min_time)).c_str());
  row("msgpack::unpack alone (baseline)", unpack);
  row("msgpack::unpack, strings referenced, limits", unpack_ref);
  row("DecodeEventBatch alone", decode);
  row("DecodeEventBatch + FleetIndex::Apply", ingest);
  std::printf("  %-44s %18.1f ns/block\n", "Apply alone (by difference)",
              1e9 / ingest.best - 1e9 / decode.best);
  std::string ratios;
  for (size_t i = 0; i < ingest.all.size(); ++i)
    absl::StrAppendFormat(&ratios, " %.3f", ingest.all[i] / unpack.all[i]);
  std::printf("  ingest / unpack in each repetition:%s\n", ratios.c_str());
  const double ratio = ingest.best / unpack.best;
  v->Add(
      absl::StrFormat("I1a ingest >= %.1fx msgpack::unpack alone: %.3fx "
                      "(%.2f vs %.2f M blocks/s)  %s",
                      kIngestVsUnpack, ratio, ingest.best / 1e6,
                      unpack.best / 1e6, Verdict(ratio >= kIngestVsUnpack)));
  v->Add(absl::StrFormat("I1b ingest >= %.0f M blocks/s: %.2f M  %s",
                         kIngestBlocksPerS / 1e6, ingest.best / 1e6,
                         Verdict(ingest.best >= kIngestBlocksPerS)));
}

void RoutePhase() {
  const int workers = absl::GetFlag(FLAGS_route_workers);
  const int tokens = absl::GetFlag(FLAGS_route_prompt_tokens);
  IndexOptions o;
  o.block_size = kBlockSize;
  FleetIndex index(o);
  const uint64_t entries = FillRouteIndex(&index, workers, 64, tokens);
  std::vector<std::vector<uint32_t>> prompts;
  for (int p = 0; p < 64; ++p) prompts.push_back(IndexPrompt(p, tokens));
  uint64_t matched = 0;
  const Rate r = Measure(64, [&] {
    const Stopwatch watch;
    for (const auto& p : prompts) {
      RouteQuery q;
      q.tokens = absl::MakeConstSpan(p);
      const RouteResult res = index.Route(q);
      matched += res.workers.size() == static_cast<size_t>(workers)
                     ? res.workers[0].matched_blocks
                     : 0;
    }
    return watch.Stop();
  });
  if (matched == 0) Die("Route matched nothing");
  std::printf(
      "\nRoute in process (%d workers, %d-token prompts, %llu "
      "entries): %.2f us of CPU per Route (%.0f Routes/s; wall %.0f)"
      "   runs:%s (M/s)\n",
      workers, tokens, static_cast<unsigned long long>(entries), 1e6 / r.best,
      r.best, r.best_wall, Rates(r).c_str());
}

// Pick against Route of the same prompts in the same index (every worker a
// candidate, each Pick recorded), alternating runs: what choosing adds to
// measuring. Three times: prompts every worker holds whole (no key is
// hashed, nothing predicted), prompts whose second half no worker holds (the
// prompt's rolling keys are hashed, the tail predicted for the chosen
// worker and looked up for every candidate), and the first again with every
// worker's engine load read (index.pick.engine_metrics).
void PickPhase() {
  const int workers = absl::GetFlag(FLAGS_route_workers);
  const int tokens = absl::GetFlag(FLAGS_route_prompt_tokens);
  IndexOptions o;
  o.block_size = kBlockSize;
  FleetIndex index(o);
  FillRouteIndex(&index, workers, 64, tokens);
  std::vector<std::vector<uint32_t>> held, half;
  for (int p = 0; p < 64; ++p) {
    held.push_back(IndexPrompt(p, tokens));
    std::vector<uint32_t> h = held.back();
    for (size_t i = h.size() / 2; i < h.size(); ++i)
      h[i] = static_cast<uint32_t>(1'000'000 + p * tokens + i);  // not held
    half.push_back(std::move(h));
  }
  // Every worker's engine read a moment ago (index.pick.engine_metrics).
  EngineLoads engine_loads(absl::Hours(1));
  for (const WorkerStatus& w : index.Stats().workers)
    engine_loads.Set(w.worker, EngineLoad{2, 1, 0.5}, absl::Now());
  struct Variant {
    const std::vector<std::vector<uint32_t>>* prompts;
    const EngineLoads* engines;
    const char* what;
  };
  const Variant variants[] = {
      {&held, nullptr, "held whole"},
      {&half, nullptr, "with a tail no worker holds"},
      {&held, &engine_loads, "held whole, every engine's load read"}};
  for (const Variant& v : variants) {
    const auto* prompts = v.prompts;
    Picker picker(&index, PickerOptions(), v.engines);
    uint64_t listed = 0;
    const auto route = [&] {
      const Stopwatch watch;
      for (const auto& p : *prompts) {
        RouteQuery q;
        q.tokens = absl::MakeConstSpan(p);
        q.filter.all_workers = true;
        listed += index.Route(q).workers.size();
      }
      return watch.Stop();
    };
    const auto pick = [&] {
      const Stopwatch watch;
      for (const auto& p : *prompts) {
        PickQuery q;
        q.prompt.tokens = absl::MakeConstSpan(p);
        absl::StatusOr<PickResult> r = picker.Pick(q, absl::Now());
        if (!r.ok()) Die(std::string(r.status().message()));
        listed += r->ranked.size();
      }
      return watch.Stop();
    };
    double route_us = 0, pick_us = 0;
    constexpr int kRounds = 4;
    for (int round = 0; round < kRounds; ++round) {
      route_us += 1e6 / Measure(64, route).best;
      pick_us += 1e6 / Measure(64, pick).best;
    }
    if (listed == 0) Die("nothing ranked");
    route_us /= kRounds;
    pick_us /= kRounds;
    std::printf(
        "\nPick vs Route in process (%d workers, %d-token prompts %s; means "
        "of %d alternations): Route %.2f us, Pick %.2f us of CPU: pick/route "
        "%.2f (%zu predicted blocks kept)\n",
        workers, tokens, v.what, kRounds, route_us, pick_us, pick_us / route_us,
        picker.counts().predicted);
  }
}

// How long Routes wait while one worker's long chain (or as many reported
// hashes) changes: a thread Routes another worker's 2-block prompt without
// pause and records each Route's wall time; the applying thread is timed
// per change. Routes are counted from just before each change to its end.
class StallProbe {
 public:
  // An index of `max_entries` with the worker "chain" (chain()) and the
  // worker "other" holding the 2-block prompt the thread Routes.
  explicit StallProbe(uint64_t max_entries) : index_(Options(max_entries)) {
    chain_ = index_.AddWorker("chain", "bench");
    const WorkerId other = index_.AddWorker("other", "bench");
    prompt_.resize(2 * kBlockSize);
    for (size_t t = 0; t < prompt_.size(); ++t) prompt_[t] = 1 + t;
    BlockStoredEvent own;
    own.block_hashes = {1, 2};
    own.token_ids = prompt_;
    own.block_size = kBlockSize;
    own.chain_blocks = 2;
    KvEventBatch batch;
    batch.events.emplace_back(own);
    index_.Apply(other, batch, 0, absl::Now());
    router_ = std::thread([this] { RouteUntilStopped(); });
  }
  ~StallProbe() {
    stop_.store(true);
    router_.join();
  }

  FleetIndex& index() { return index_; }
  WorkerId chain() const { return chain_; }
  // Applies one event of the chain's worker as a timed change.
  void Apply(const char* what, KvEvent ev) {
    KvEventBatch b;
    b.events.push_back(std::move(ev));
    Change(what, [&] { index_.Apply(chain_, b, seq_++, absl::Now()); });
  }
  // Runs `change` and prints its time and the Routes' waits meanwhile.
  void Change(const char* what, const std::function<void()>& change) {
    absl::SleepFor(absl::Milliseconds(50));
    counting_.store(true);
    absl::SleepFor(absl::Milliseconds(5));
    const absl::Time t0 = absl::Now();
    change();
    const double apply = absl::ToDoubleSeconds(absl::Now() - t0);
    absl::SleepFor(absl::Milliseconds(5));
    counting_.store(false);
    absl::SleepFor(absl::Milliseconds(50));
    MutexLock lock(&mu_);
    std::sort(waits_.begin(), waits_.end());
    const double p50 = waits_.empty() ? 0 : waits_[waits_.size() / 2];
    const double max = waits_.empty() ? 0 : waits_.back();
    std::printf("  %-30s %10.1f %8zu %12.1f %12.2f\n", what, apply * 1e3,
                waits_.size(), p50 * 1e6, max * 1e3);
    waits_.clear();
  }

 private:
  static IndexOptions Options(uint64_t max_entries) {
    IndexOptions o;
    o.block_size = kBlockSize;
    o.max_entries = max_entries;
    return o;
  }
  void RouteUntilStopped() {
    RouteQuery q;
    q.tokens = absl::MakeConstSpan(prompt_);
    std::vector<double> mine;
    while (!stop_.load()) {
      const bool on = counting_.load();
      const absl::Time t0 = absl::Now();
      if (index_.Route(q).workers.empty()) Die("the other worker vanished");
      if (on) mine.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
      if (!on && !mine.empty()) {
        MutexLock lock(&mu_);
        waits_.insert(waits_.end(), mine.begin(), mine.end());
        mine.clear();
      }
    }
  }

  FleetIndex index_;
  WorkerId chain_;
  std::vector<uint32_t> prompt_;
  int64_t seq_ = 1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> counting_{false};
  Mutex mu_;
  std::vector<double> waits_;  // seconds, while counting
  std::thread router_;
};

// The engine's reports of `hashes` (SGLang's KV indexer API), or the clear
// of a tier, as one update.
void ApplyHashes(StallProbe& probe, const char* what, HashUpdate::Op op,
                 absl::Span<const EngineHash> hashes, const char* medium) {
  HashUpdate u;
  u.op = op;
  u.medium = medium;
  u.hashes = hashes;
  probe.Change(what, [&] { probe.index().ApplyHashes(probe.chain(), {u}); });
}

// The changes of a long chain of identical blocks: stored, removed leaf
// first, cleared, a tier of it cleared, the key lookup built over it; with
// max_entries at a quarter of it, trimmed and then its worker's stale
// engine-hash map swept; as many reported hashes (each a leaf of its own)
// at max_entries, then one more: the trim's scan of every leaf.
void StallPhase() {
  const size_t chain = absl::GetFlag(FLAGS_stall_chain);
  BlockStoredEvent store;
  store.block_size = kBlockSize;
  store.chain_blocks = chain;
  store.token_ids.assign(chain * kBlockSize, 7);  // identical blocks
  BlockRemovedEvent reverse;
  for (size_t b = 0; b < chain; ++b) store.block_hashes.push_back(100 + b);
  for (size_t b = chain; b-- > 0;) reverse.block_hashes.push_back(100 + b);
  const std::vector<EngineHash> hashes(store.block_hashes.begin(),
                                       store.block_hashes.end());
  std::printf(
      "\nRoute while one worker's %zu-block chain changes (a thread Routing "
      "another worker's prompt without pause):\n",
      chain);
  std::printf("  %-30s %10s %8s %12s %12s\n", "change", "apply ms", "routes",
              "p50 route us", "max route ms");
  {
    StallProbe probe(IndexOptions().max_entries);
    probe.Apply("store", store);
    probe.Apply("BlockRemoved, leaf first", reverse);
    probe.Apply("store again", store);
    probe.Apply("AllBlocksCleared", AllBlocksClearedEvent{});
    probe.Apply("store again", store);
    ApplyHashes(probe, "hashes reported in CPU", HashUpdate::Op::kReport,
                hashes, "CPU");
    ApplyHashes(probe, "tier GPU cleared (hashes)", HashUpdate::Op::kClearTier,
                {}, "GPU");
    WorkerLabels labels;
    labels.hashes_are_keys = true;
    probe.Change("key lookup built",
                 [&] { probe.index().SetLabels(probe.chain(), labels); });
  }
  {
    StallProbe probe(chain / 4);
    probe.Apply("store, max_entries trim", store);
    BlockStoredEvent one;
    one.block_size = kBlockSize;
    one.chain_blocks = 1;
    one.block_hashes = {1};
    one.token_ids.assign(kBlockSize, 8);
    probe.Apply("one block: stale map swept", one);
  }
  {
    StallProbe probe(chain + 2);
    ApplyHashes(probe, "hashes reported, detached", HashUpdate::Op::kReport,
                hashes, "GPU");
    const EngineHash more = 1;
    ApplyHashes(probe, "one more: trim scans leaves", HashUpdate::Op::kReport,
                {&more, 1}, "GPU");
  }
}

// A distinct engine hash per (worker, i): splitmix64 of both.
EngineHash ReportedHash(uint64_t worker, uint64_t i) {
  uint64_t z = (worker << 32 | i) + 0x9e3779b97f4a7c15;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  return z ^ (z >> 31);
}

// Each worker reports hashes [from, to) of worker (w + owner_shift) % n, in
// batches of 64; returns the wall seconds.
double Report(FleetIndex& index, const std::vector<WorkerId>& ids,
              size_t owner_shift, uint64_t from, uint64_t to) {
  constexpr uint64_t kBatch = 64;
  std::vector<EngineHash> batch;
  const absl::Time start = absl::Now();
  for (size_t w = 0; w < ids.size(); ++w) {
    const uint64_t owner = (w + owner_shift) % ids.size();
    for (uint64_t i = from; i < to; i += kBatch) {
      batch.clear();
      for (uint64_t k = i; k < std::min(to, i + kBatch); ++k)
        batch.push_back(ReportedHash(owner, k));
      HashUpdate u;
      u.op = HashUpdate::Op::kReport;
      u.medium = "GPU";
      u.hashes = batch;
      index.ApplyHashes(ids[w], {u});
    }
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

void ReportsPhase() {
  constexpr uint64_t kHeld = 5000;
  constexpr uint64_t kTimed = 1000;
  std::printf(
      "\nReported hashes (SGLang's KV indexer, batches of 64; every worker "
      "holding %llu):\n  %-8s %16s %22s\n",
      static_cast<unsigned long long>(kHeld), "workers", "new hash, ns",
      "another's hash, ns");
  for (int workers : {16, 128}) {
    IndexOptions o;
    o.block_size = kBlockSize;
    FleetIndex index(o);
    std::vector<WorkerId> ids;
    for (int w = 0; w < workers; ++w)
      ids.push_back(index.AddWorker(absl::StrCat("bridge-", w), "bench"));
    Report(index, ids, 0, 0, kHeld);
    const double hashes = static_cast<double>(workers * kTimed);
    const double fresh = Report(index, ids, 0, kHeld, kHeld + kTimed);
    const double shared = Report(index, ids, 1, 0, kTimed);
    std::printf("  %-8d %16.0f %22.0f\n", workers, 1e9 * fresh / hashes,
                1e9 * shared / hashes);
  }
}

int Run() {
  const std::string path = absl::GetFlag(FLAGS_trace);
  const Trace t = LoadTrace(path);
  const int workers = absl::GetFlag(FLAGS_workers);
  if (workers < 1) Die("--workers must be positive");
  const Workload w =
      BuildWorkload(t, workers, absl::GetFlag(FLAGS_spread),
                    std::max(1, absl::GetFlag(FLAGS_events_per_batch)));
  std::printf("index_bench: %s\n", path.c_str());
  std::printf(
      "  %zu requests, %zu block ids (%llu distinct); %d workers, "
      "spread %.2f, %d events per payload\n",
      t.requests(), t.ids.size(), static_cast<unsigned long long>(w.distinct),
      workers, absl::GetFlag(FLAGS_spread),
      absl::GetFlag(FLAGS_events_per_batch));
  std::string per_worker;
  for (uint64_t b : w.worker_blocks) absl::StrAppend(&per_worker, " ", b);
  std::printf(
      "  per replica: %zu payloads, %llu BlockStored events, %llu "
      "stored blocks = entries (%.3f per distinct block); per "
      "worker:%s\n",
      w.batches.size(), static_cast<unsigned long long>(w.events),
      static_cast<unsigned long long>(w.blocks),
      static_cast<double>(w.blocks) / static_cast<double>(w.distinct),
      per_worker.c_str());
  std::printf("  load average: %s\n", LoadAverage().c_str());

  Verdicts v;
  for (absl::string_view phase :
       absl::StrSplit(absl::GetFlag(FLAGS_phases), ',', absl::SkipEmpty())) {
    if (phase == "memory") {
      MemoryInChild(t, w, &v);
    } else if (phase == "ingest" || phase == "ingest_only") {
      IngestPhase(t, w, phase == "ingest_only", &v);
    } else if (phase == "route") {
      RoutePhase();
    } else if (phase == "stall") {
      StallPhase();
    } else if (phase == "pick") {
      PickPhase();
    } else if (phase == "reports") {
      ReportsPhase();
    } else {
      Die(absl::StrCat(
          "unknown phase \"", phase,
          "\" (memory, ingest, ingest_only, route, stall, pick, reports)"));
    }
  }
  std::printf("\ntargets (docs/performance.md, \"Fleet index\"):\n");
  for (const std::string& line : v.lines) std::printf("  %s\n", line.c_str());
  return 0;
}

}  // namespace
}  // namespace prefixd::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the fleet index's ingest rate and memory (docs/performance.md)");
  absl::ParseCommandLine(argc, argv);
  // As the daemon: abseil's deadlock detector off.
  prefixd::DisableMutexDeadlockDetection();
  return prefixd::bench::Run();
}
