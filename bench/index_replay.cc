// index_replay: the fleet index measured the way NVIDIA Dynamo measures its
// KV-router indexer (mooncake_bench; docs/performance.md, "Fleet index at
// Dynamo's definition").
//
// A Mooncake trace is re-chunked to 128-token blocks, stretched (length
// factor 4), duplicated (20 copies) and served by 128 simulated workers
// with 16,384-block LRU pools (bench/fleet_workload.h). Their requests
// become Route queries and their KV events (BlockStored, BlockRemoved)
// batches, each on a deadline within the replay window. The replay then
// issues every operation at its deadline, without waiting for earlier ones:
// queries on --query_threads threads (worker % threads), batches on
// --event_threads threads (contiguous groups of workers, so each worker's
// batches stay in order). An event thread encodes each batch as vLLM's
// msgpack payload, then DecodeEventBatch + FleetIndex::Apply, as prefixd's
// ingest does; a query thread writes the prompt's tokens, then
// FleetIndex::Route, as prefixd's Route handler does. Queries and events
// run concurrently on one index.
//
// Reported as Dynamo does: block ops = request blocks + the blocks of
// Stored and Removed events; achieved = block ops / (the last completion -
// the start); a run keeps up when that time is within 1.10x the window.
// Write capacity is the achieved rate of an overloaded (short) window, read
// cost the Route service time of a keep-up (long) one.
//
// Exactness (the run fails, exit 1, if any check fails):
//   - every operation completes exactly once, each worker's batches in
//     order (its seq 0, 1, 2, ...), none before its deadline;
//   - after the drain (quiesced), the index holds what the engines cache:
//     per worker the last seq, the events of each kind, the blocks held,
//     no drops, the invariants; and --final_checks Routes, spread over the
//     schedule, each worker's matched blocks equal to its engine's cache;
//   - --sequential_check: before the timed run, one thread replays the
//     same schedule in order, and every --check_every-th Route's answer is
//     compared with the workers' caches at that point, and every
//     --check_every-th payload with EncodeEventBatch's bytes.
//
// --decode_floor_every=N also measures, before the replay, how much of the
// event thread's decoding is msgpack-cxx's parse itself (bench/decode_floor.h).
//
//   index_replay [--trace=conversation] [--window_ms=60000] [--json=FILE]
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/bench_util.h"
#include "bench/decode_floor.h"
#include "bench/fleet_checks.h"
#include "bench/fleet_workload.h"
#include "bench/trace.h"
#include "index/events.h"
#include "index/fleet_index.h"
#include "index/keys.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, trace, "conversation",
          "Mooncake trace: a name (<trace_dir>/<name>_trace.jsonl) or a path "
          "ending in .jsonl");
ABSL_FLAG(int, trace_block_size, 512, "tokens per trace hash id");
ABSL_FLAG(int, block_size, 128,
          "tokens per block of the engines and the index (the trace is "
          "re-chunked to it)");
ABSL_FLAG(int, length_factor, 4,
          "each hash id becomes this many, input_length this many times");
ABSL_FLAG(int, duplication, 20,
          "copies of the trace, each with its own hash ids");
ABSL_FLAG(int, workers, 128, "simulated inference workers");
ABSL_FLAG(uint32_t, gpu_blocks, 16384, "blocks in each worker's KV pool");
ABSL_FLAG(double, decode_ms_per_token, 2,
          "a request holds its blocks for output_length times this (trace "
          "milliseconds) after admission");
ABSL_FLAG(uint64_t, seed, 42, "seed of the session-to-worker assignment");
ABSL_FLAG(uint64_t, max_requests, 0,
          "replay only the trace's first N lines (0: all)");
ABSL_FLAG(bool, removed_per_block, false,
          "one BlockRemoved per evicted block, as vLLM's block pool emits "
          "them, instead of one per admission listing every block it "
          "evicted");
ABSL_FLAG(int64_t, window_ms, 60000,
          "replay window: every worker's timeline is stretched to it");
ABSL_FLAG(int, query_threads, 1, "threads serving Route queries");
ABSL_FLAG(std::string, route_by, "tokens",
          "what a query gives Route: tokens (Route hashes the prompt: part "
          "of the service time) or keys (the query thread first computes "
          "the prompt's rolling keys, untimed, as Dynamo's issuer hands its "
          "lookup block hashes; the index keeps its lookup by key)");
ABSL_FLAG(int, event_threads, 1,
          "threads decoding and applying event batches, each its own "
          "contiguous group of workers, as prefixd's ingest has a thread "
          "per source: decoding runs in parallel, FleetIndex::Apply one "
          "at a time (on 2 cores, 2 threads reach about 1.4x the block "
          "ops/s of 1)");
ABSL_FLAG(bool, sequential_check, true,
          "before the timed run, replay the schedule in order on one thread "
          "and check Route answers and payloads (see --check_every)");
ABSL_FLAG(uint64_t, check_every, 1,
          "the sequential check compares every Nth Route answer and every "
          "Nth payload");
ABSL_FLAG(uint64_t, decode_floor_every, 0,
          "before the replay, parse every N-th batch's payload with msgpack "
          "alone (a visitor that keeps nothing) and with DecodeEventBatch, "
          "and report both per block and the block ops/s the parse alone "
          "would allow on this machine's cores; 0: not measured");
ABSL_FLAG(uint64_t, final_checks, 2000,
          "Routes checked against the engines' final caches after the drain");
ABSL_FLAG(std::string, json, "",
          "also write the results as JSON to this file ('-': stdout)");
ABSL_FLAG(bool, progress, true, "progress lines on stderr");
ABSL_FLAG(int64_t, drop_batch, -1,
          "for testing the checks: the timed replay does not apply this "
          "batch (by number), so the exactness checks must fail");

namespace prefixd {
namespace bench {
namespace {

constexpr double kKeepUpFactor = 1.10;  // Dynamo's keep-up bound

[[noreturn]] void Die(const std::string& what, int code = 1) {
  std::fprintf(stderr, "index_replay: %s\n", what.c_str());
  std::exit(code);
}

void Progress(const std::string& line) {
  if (absl::GetFlag(FLAGS_progress)) {
    std::fprintf(stderr, "index_replay: %s\n", line.c_str());
  }
}

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL +
         static_cast<uint64_t>(ts.tv_nsec);
}

// Returns at once when `t` has passed (no system call).
void SleepUntilNs(uint64_t t) {
  if (MonotonicNs() >= t) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(t / 1000000000ULL);
  ts.tv_nsec = static_cast<long>(t % 1000000000ULL);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) != 0) {
  }
}

// --- The timed replay ---------------------------------------------------

// Times in ns from the replay's start.
struct QueryRecord {
  uint64_t dequeued = 0;  // the thread took it (deadline passed)
  uint64_t started = 0;   // prompt written, Route called
  uint64_t finished = 0;
  uint32_t matched = 0;  // workers with a matched block
  uint32_t deepest = 0;  // the most blocks any worker matched
  bool done = false;
};

struct BatchRecord {
  uint64_t started = 0;
  uint64_t encoded = 0;  // payload bytes ready, DecodeEventBatch called
  uint64_t finished = 0;
  uint32_t thread = 0;
  uint32_t order = 0;  // completion order within its thread
  bool done = false;
  bool decoded = false;
};

// One thread's operations, in schedule order.
struct Lane {
  std::vector<ScheduledOp> ops;
  std::atomic<uint64_t> done{0};
  double cpu_seconds = 0;
};

// Thread safety: Run starts and joins the threads; each record is written
// by the one thread that serves its operation and read after the join.
class TimedReplay {
 public:
  TimedReplay(const FleetWorkload& w, const std::vector<ScheduledOp>& schedule,
              int query_threads, int event_threads, int64_t drop_batch,
              bool by_keys)
      : w_(w),
        drop_batch_(drop_batch),
        by_keys_(by_keys),
        query_lanes_(query_threads),
        event_lanes_(event_threads),
        queries_(w.queries().size()),
        batches_(w.batches().size()) {
    index_ = NewFleetIndex(w, &ids_, &worker_of_, by_keys);
    const uint32_t workers = static_cast<uint32_t>(w.options().workers);
    for (const ScheduledOp& op : schedule) {
      if (op.is_query) {
        query_lanes_[w.queries()[op.index].worker % query_threads]
            .ops.push_back(op);
      } else {
        const uint64_t worker = w.batches()[op.index].worker;
        event_lanes_[worker * event_threads / workers].ops.push_back(op);
      }
    }
  }

  void Run();
  // The query's prompt as Route takes it: its tokens, or with
  // --route_by=keys its rolling keys (the tokens kept in *tokens).
  void Prompt(const QuerySpec& q, std::vector<Token>* tokens,
              std::vector<uint64_t>* keys, RouteQuery* rq) const;

  const FleetIndex& index() const { return *index_; }
  const absl::flat_hash_map<std::string, int>& worker_of() const {
    return worker_of_;
  }
  const std::vector<QueryRecord>& queries() const { return queries_; }
  const std::vector<BatchRecord>& batches() const { return batches_; }
  const std::vector<Lane>& query_lanes() const { return query_lanes_; }
  const std::vector<Lane>& event_lanes() const { return event_lanes_; }

 private:
  void QueryLoop(Lane* lane);
  void EventLoop(Lane* lane, uint32_t thread);
  void Warmup();
  void ShowProgress(const std::atomic<int>& running) const;

  const FleetWorkload& w_;
  const int64_t drop_batch_;  // not applied (--drop_batch); -1: none
  const bool by_keys_;        // --route_by=keys
  std::unique_ptr<FleetIndex> index_;
  std::vector<WorkerId> ids_;
  absl::flat_hash_map<std::string, int> worker_of_;
  std::vector<Lane> query_lanes_;
  std::vector<Lane> event_lanes_;
  std::vector<QueryRecord> queries_;
  std::vector<BatchRecord> batches_;
  uint64_t start_ns_ = 0;          // CLOCK_MONOTONIC
  double start_unix_seconds_ = 0;  // the same instant, for payloads' ts
};

void TimedReplay::Prompt(const QuerySpec& q, std::vector<Token>* tokens,
                         std::vector<uint64_t>* keys, RouteQuery* rq) const {
  w_.PromptTokens(q, tokens);
  if (!by_keys_) {
    rq->tokens = absl::MakeConstSpan(*tokens);
    return;
  }
  const IndexOptions& o = index_->options();
  const KeyScheme scheme(o.hash_profile, o.hash_seed);
  const size_t bs = static_cast<size_t>(o.block_size);
  keys->resize(tokens->size() / bs);
  scheme.Chain(scheme.Root(/*salt=*/""), /*first=*/true, *tokens, bs,
               keys->size(), nullptr, keys->data());
  rq->keys = absl::MakeConstSpan(*keys);
}

void TimedReplay::QueryLoop(Lane* lane) {
  const double cpu0 = ThreadCpuSeconds();
  std::vector<Token> tokens;
  std::vector<uint64_t> keys;
  RouteQuery rq;
  for (const ScheduledOp& op : lane->ops) {
    SleepUntilNs(start_ns_ + op.deadline_ns);
    QueryRecord& r = queries_[op.index];
    r.dequeued = MonotonicNs() - start_ns_;
    Prompt(w_.queries()[op.index], &tokens, &keys, &rq);
    r.started = MonotonicNs() - start_ns_;
    const RouteResult result = index_->Route(rq);
    r.finished = MonotonicNs() - start_ns_;
    for (const WorkerMatch& m : result.workers) {
      r.matched += m.matched_blocks > 0;
      r.deepest = std::max<uint32_t>(r.deepest, m.matched_blocks);
    }
    r.done = true;
    lane->done.store(lane->done.load(std::memory_order_relaxed) + 1,
                     std::memory_order_relaxed);
  }
  lane->cpu_seconds = ThreadCpuSeconds() - cpu0;
}

void TimedReplay::EventLoop(Lane* lane, uint32_t thread) {
  const double cpu0 = ThreadCpuSeconds();
  std::string payload;
  KvEventBatch batch;
  uint32_t order = 0;
  for (const ScheduledOp& op : lane->ops) {
    SleepUntilNs(start_ns_ + op.deadline_ns);
    const BatchSpec& b = w_.batches()[op.index];
    BatchRecord& r = batches_[op.index];
    r.started = MonotonicNs() - start_ns_;
    // The engine's payload as it would arrive; ts = its deadline.
    w_.EncodePayload(
        b, start_unix_seconds_ + static_cast<double>(op.deadline_ns) * 1e-9,
        &payload);
    r.encoded = MonotonicNs() - start_ns_;
    r.decoded = DecodeEventBatch(payload, &batch).ok();
    if (r.decoded && op.index != drop_batch_) {
      index_->Apply(ids_[b.worker], batch, b.seq, absl::Now());
    }
    r.finished = MonotonicNs() - start_ns_;
    r.thread = thread;
    r.order = order++;
    r.done = true;
    lane->done.store(lane->done.load(std::memory_order_relaxed) + 1,
                     std::memory_order_relaxed);
  }
  lane->cpu_seconds = ThreadCpuSeconds() - cpu0;
}

// As Dynamo: a fixed lookup warm-up on the empty index, untimed.
void TimedReplay::Warmup() {
  std::vector<Token> tokens;
  std::vector<uint64_t> keys;
  RouteQuery rq;
  const size_t n = std::min<size_t>(128, w_.queries().size());
  for (size_t i = 0; i < n; ++i) {
    Prompt(w_.queries()[i], &tokens, &keys, &rq);
    index_->Route(rq);
  }
}

void TimedReplay::ShowProgress(const std::atomic<int>& running) const {
  uint64_t total_q = 0, total_b = 0;
  for (const Lane& l : query_lanes_) total_q += l.ops.size();
  for (const Lane& l : event_lanes_) total_b += l.ops.size();
  while (running.load() > 0) {
    for (int i = 0; i < 50 && running.load() > 0; ++i)
      absl::SleepFor(absl::Milliseconds(100));
    if (running.load() == 0) break;
    uint64_t q = 0, b = 0;
    for (const Lane& l : query_lanes_)
      q += l.done.load(std::memory_order_relaxed);
    for (const Lane& l : event_lanes_)
      b += l.done.load(std::memory_order_relaxed);
    Progress(absl::StrFormat(
        "replay %.1f s: batches %.1f%%, queries %.1f%%",
        static_cast<double>(MonotonicNs() - start_ns_) * 1e-9,
        100.0 * static_cast<double>(b) /
            static_cast<double>(std::max<uint64_t>(total_b, 1)),
        100.0 * static_cast<double>(q) /
            static_cast<double>(std::max<uint64_t>(total_q, 1))));
  }
}

void TimedReplay::Run() {
  Warmup();
  // The threads start 50 ms from now, each sleeping to its first deadline.
  const uint64_t now = MonotonicNs();
  start_ns_ = now + 50000000;
  start_unix_seconds_ =
      absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()) + 0.05;
  std::atomic<int> running{
      static_cast<int>(query_lanes_.size() + event_lanes_.size())};
  std::vector<std::thread> threads;
  for (Lane& l : event_lanes_) {
    const uint32_t t = static_cast<uint32_t>(threads.size());
    threads.emplace_back([this, &l, t, &running] {
      EventLoop(&l, t);
      running.fetch_sub(1);
    });
  }
  for (Lane& l : query_lanes_) {
    threads.emplace_back([this, &l, &running] {
      QueryLoop(&l);
      running.fetch_sub(1);
    });
  }
  ShowProgress(running);
  for (std::thread& t : threads) t.join();
}

// --- Results ------------------------------------------------------------

struct Dist {
  uint64_t p50 = 0, p99 = 0, p999 = 0, max = 0;
};

Dist Percentiles(std::vector<uint64_t> v) {
  Dist d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) {
    return v[std::min(v.size() - 1,
                      static_cast<size_t>(q * static_cast<double>(v.size())))];
  };
  d.p50 = at(0.50);
  d.p99 = at(0.99);
  d.p999 = at(0.999);
  d.max = v.back();
  return d;
}

nlohmann::json DistJson(const Dist& d) {
  return {{"p50_ns", d.p50},
          {"p99_ns", d.p99},
          {"p999_ns", d.p999},
          {"max_ns", d.max}};
}

std::string DistText(const Dist& d) {
  return absl::StrFormat("p50 %.2f  p99 %.2f  p99.9 %.2f  max %.1f us",
                         d.p50 * 1e-3, d.p99 * 1e-3, d.p999 * 1e-3,
                         d.max * 1e-3);
}

// Dynamo's bookkeeping: every operation done once, none before its
// deadline, each worker's batches applied in order by one thread.
void CheckRecords(const FleetWorkload& w,
                  const std::vector<ScheduledOp>& schedule,
                  const TimedReplay& r, std::vector<std::string>* failures) {
  const auto fail = [&](std::string what) {
    if (failures->size() < 16) failures->push_back(std::move(what));
  };
  uint64_t early = 0, undone = 0, undecoded = 0;
  for (const ScheduledOp& op : schedule) {
    if (op.is_query) {
      const QueryRecord& q = r.queries()[op.index];
      undone += !q.done;
      early += q.dequeued < op.deadline_ns;
    } else {
      const BatchRecord& b = r.batches()[op.index];
      undone += !b.done;
      undecoded += b.done && !b.decoded;
      early += b.started < op.deadline_ns;
    }
  }
  if (schedule.size() != w.queries().size() + w.batches().size()) {
    fail(absl::StrCat("the schedule has ", schedule.size(),
                      " operations, the "
                      "workload ",
                      w.queries().size() + w.batches().size()));
  }
  if (undone > 0) fail(absl::StrCat(undone, " operations never completed"));
  if (undecoded > 0) fail(absl::StrCat(undecoded, " payloads did not decode"));
  if (early > 0) fail(absl::StrCat(early, " operations started early"));
  // Batches are numbered worker by worker, seq ascending.
  for (size_t i = 1; i < w.batches().size(); ++i) {
    const BatchSpec& a = w.batches()[i - 1];
    const BatchSpec& b = w.batches()[i];
    if (a.worker != b.worker) continue;
    const BatchRecord& ra = r.batches()[i - 1];
    const BatchRecord& rb = r.batches()[i];
    if (b.seq != a.seq + 1 || ra.thread != rb.thread || ra.order >= rb.order ||
        ra.finished > rb.started) {
      fail(absl::StrCat("worker w", b.worker, ": batch ", b.seq,
                        " was not applied after batch ", a.seq, " (FIFO)"));
      break;
    }
  }
}

// After the drain: the index against the engines' final caches.
struct FinalCheck {
  uint64_t routes = 0;
  uint64_t mismatches = 0;
  Dist route_ns;    // the quiesced index
  Dist hashing_ns;  // the prompt's block keys alone (absl::HashOf per block)
};

FinalCheck CheckFinalState(const FleetWorkload& w, const TimedReplay& r,
                           uint64_t samples,
                           std::vector<std::string>* failures) {
  FinalCheck out;
  CheckIndexState(w, r.index(), failures);
  ReferenceCaches ref(w);
  ref.SetFinal();
  std::vector<Token> tokens;
  std::vector<uint64_t> keys;
  std::vector<uint64_t> route_ns, hash_ns;
  std::string error;
  const size_t n = w.queries().size();
  const size_t step = std::max<size_t>(1, n / std::max<uint64_t>(samples, 1));
  uint64_t sink = 0;
  for (size_t i = 0; i < n && out.routes < samples; i += step) {
    const QuerySpec& q = w.queries()[i];
    RouteQuery rq;
    r.Prompt(q, &tokens, &keys, &rq);
    rq.filter.all_workers = true;  // every worker is checked
    const uint64_t t0 = MonotonicNs();
    const RouteResult result = r.index().Route(rq);
    const uint64_t t1 = MonotonicNs();
    const size_t bs = static_cast<size_t>(w.options().block_size);
    for (size_t b = 0; b < q.blocks; ++b) {
      sink += absl::HashOf(absl::MakeConstSpan(tokens).subspan(b * bs, bs));
    }
    hash_ns.push_back(MonotonicNs() - t1);
    route_ns.push_back(t1 - t0);
    ++out.routes;
    if (!CheckRoute(w, ref, q, result, r.worker_of(), &error)) {
      if (out.mismatches++ == 0)
        failures->push_back("after the drain: " + error);
    }
  }
  asm volatile("" : : "r"(sink));  // the hashing is not optimized away
  out.route_ns = Percentiles(std::move(route_ns));
  out.hashing_ns = Percentiles(std::move(hash_ns));
  return out;
}

struct Summary {
  uint64_t window_ns = 0;
  uint64_t end_ns = 0;            // the last completion
  uint64_t last_deadline_ns = 0;  // the producers stop
  bool kept_up = false;
  Dist query_wait, query_prompt, query_service, query_total;
  Dist batch_encode, batch_service, batch_total;
  double encode_share = 0;  // of the batches' service time
  double event_cpu = 0, query_cpu = 0, process_cpu = 0;
  uint64_t matched_workers_sum = 0;
  uint64_t deepest_sum = 0;  // of every Route's deepest match, in blocks
  double offered(uint64_t ops) const {
    return static_cast<double>(ops) / (static_cast<double>(window_ns) * 1e-9);
  }
  double achieved(uint64_t ops) const {
    return static_cast<double>(ops) / (static_cast<double>(end_ns) * 1e-9);
  }
  uint64_t drain_ns() const {
    return end_ns > last_deadline_ns ? end_ns - last_deadline_ns : 0;
  }
};

Summary Summarize(const std::vector<ScheduledOp>& schedule,
                  const TimedReplay& r, uint64_t window_ns) {
  Summary s;
  s.window_ns = window_ns;
  std::vector<uint64_t> wait, prompt, service, total, encode, bservice, btotal;
  uint64_t encode_sum = 0, bservice_sum = 0;
  for (const ScheduledOp& op : schedule) {
    s.last_deadline_ns = std::max(s.last_deadline_ns, op.deadline_ns);
    if (op.is_query) {
      const QueryRecord& q = r.queries()[op.index];
      s.end_ns = std::max(s.end_ns, q.finished);
      wait.push_back(q.dequeued - op.deadline_ns);
      prompt.push_back(q.started - q.dequeued);
      service.push_back(q.finished - q.started);
      total.push_back(q.finished - op.deadline_ns);
      s.matched_workers_sum += q.matched;
      s.deepest_sum += q.deepest;
    } else {
      const BatchRecord& b = r.batches()[op.index];
      s.end_ns = std::max(s.end_ns, b.finished);
      encode.push_back(b.encoded - b.started);
      bservice.push_back(b.finished - b.started);
      btotal.push_back(b.finished - op.deadline_ns);
      encode_sum += b.encoded - b.started;
      bservice_sum += b.finished - b.started;
    }
  }
  s.kept_up = static_cast<double>(s.end_ns) <=
              kKeepUpFactor * static_cast<double>(window_ns);
  s.query_wait = Percentiles(std::move(wait));
  s.query_prompt = Percentiles(std::move(prompt));
  s.query_service = Percentiles(std::move(service));
  s.query_total = Percentiles(std::move(total));
  s.batch_encode = Percentiles(std::move(encode));
  s.batch_service = Percentiles(std::move(bservice));
  s.batch_total = Percentiles(std::move(btotal));
  s.encode_share = bservice_sum > 0 ? static_cast<double>(encode_sum) /
                                          static_cast<double>(bservice_sum)
                                    : 0;
  for (const Lane& l : r.event_lanes()) s.event_cpu += l.cpu_seconds;
  for (const Lane& l : r.query_lanes()) s.query_cpu += l.cpu_seconds;
  return s;
}

// --- Command line and report ----------------------------------------------

struct Config {
  std::string trace;
  FleetWorkloadOptions workload;
  uint64_t window_ns = 0;
  int query_threads = 1;
  int event_threads = 1;
  bool sequential = true;
  uint64_t check_every = 1;
  uint64_t final_checks = 0;
  uint64_t decode_floor_every = 0;  // 0: not measured
  std::string json;
  int64_t drop_batch = -1;
  bool route_by_keys = false;
};

absl::Status Bad(absl::string_view flag, const std::string& value,
                 absl::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": ", rule));
}

absl::StatusOr<Config> ConfigFromFlags() {
  const absl::CommandLineFlag& traces =
      absl::GetFlagReflectionHandle(FLAGS_traces);
  if (traces.CurrentValue() != traces.DefaultValue()) {
    return absl::InvalidArgumentError(
        "index_replay replays one trace per run: use --trace, not --traces");
  }
  Config c;
  c.trace = absl::GetFlag(FLAGS_trace);
  FleetWorkloadOptions& o = c.workload;
  o.trace_block_size = absl::GetFlag(FLAGS_trace_block_size);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.length_factor = absl::GetFlag(FLAGS_length_factor);
  o.duplication = absl::GetFlag(FLAGS_duplication);
  o.workers = absl::GetFlag(FLAGS_workers);
  o.gpu_blocks = absl::GetFlag(FLAGS_gpu_blocks);
  o.decode_ms_per_token = absl::GetFlag(FLAGS_decode_ms_per_token);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.max_requests = absl::GetFlag(FLAGS_max_requests);
  o.removed_per_block = absl::GetFlag(FLAGS_removed_per_block);
  const int64_t window_ms = absl::GetFlag(FLAGS_window_ms);
  if (window_ms < 1 || window_ms > 86400000) {
    return Bad("window_ms", absl::StrCat(window_ms),
               "must be in [1, 86400000]");
  }
  c.window_ns = static_cast<uint64_t>(window_ms) * 1000000;
  c.query_threads = absl::GetFlag(FLAGS_query_threads);
  c.event_threads = absl::GetFlag(FLAGS_event_threads);
  if (c.query_threads < 1 || c.query_threads > 256) {
    return Bad("query_threads", absl::StrCat(c.query_threads),
               "must be in [1, 256]");
  }
  if (c.event_threads < 1 || c.event_threads > o.workers) {
    return Bad("event_threads", absl::StrCat(c.event_threads),
               absl::StrCat("must be in [1, --workers (", o.workers, ")]"));
  }
  c.sequential = absl::GetFlag(FLAGS_sequential_check);
  c.check_every = absl::GetFlag(FLAGS_check_every);
  if (c.check_every < 1) return Bad("check_every", "0", "must be >= 1");
  c.final_checks = absl::GetFlag(FLAGS_final_checks);
  c.decode_floor_every = absl::GetFlag(FLAGS_decode_floor_every);
  c.json = absl::GetFlag(FLAGS_json);
  c.drop_batch = absl::GetFlag(FLAGS_drop_batch);
  const std::string route_by = absl::GetFlag(FLAGS_route_by);
  if (route_by != "tokens" && route_by != "keys") {
    return Bad("route_by", route_by, "must be tokens or keys");
  }
  c.route_by_keys = route_by == "keys";
  return c;
}

std::string Millions(double v) { return absl::StrFormat("%.2fM", v / 1e6); }

void PrintWorkload(const Config& c, const FleetWorkload& w) {
  const FleetWorkloadOptions& o = c.workload;
  const WorkloadTotals& tt = w.totals();
  const EngineCounts& e = w.engine_counts();
  std::printf(
      "index_replay: %s (%zu requests used), hash id = %d tokens, blocks of "
      "%d, length x%d, duplication x%d, %d workers of %u blocks\n",
      c.trace.c_str(), w.queries().size() / o.duplication, o.trace_block_size,
      o.block_size, o.length_factor, o.duplication, o.workers, o.gpu_blocks);
  std::printf(
      "  corpus: %llu requests + %llu events (%llu stored, %llu removed) in "
      "%llu batches\n",
      (unsigned long long)tt.requests,
      (unsigned long long)(tt.stored_events + tt.removed_events),
      (unsigned long long)tt.stored_events,
      (unsigned long long)tt.removed_events, (unsigned long long)tt.batches);
  std::printf("  block ops: %llu request + %llu stored + %llu removed = %llu\n",
              (unsigned long long)tt.request_blocks,
              (unsigned long long)tt.stored_blocks,
              (unsigned long long)tt.removed_blocks,
              (unsigned long long)tt.block_ops());
  std::printf(
      "  engines: %.1f%% of request blocks hit; %llu of %llu admissions "
      "waited for blocks; %llu refused (too long)\n",
      100.0 * static_cast<double>(e.hit_blocks) /
          static_cast<double>(std::max<uint64_t>(tt.request_blocks, 1)),
      (unsigned long long)e.waited, (unsigned long long)e.admitted,
      (unsigned long long)e.refused);
  std::printf("  machine: %u CPUs, load average %s\n",
              std::thread::hardware_concurrency(), LoadAverage().c_str());
}

void PrintSummary(const Config& c, const WorkloadTotals& tt, const Summary& s,
                  const FinalCheck& f) {
  std::printf(
      "\nreplay: window %.3f s, %d query thread(s), %d event thread(s)\n",
      static_cast<double>(c.window_ns) * 1e-9, c.query_threads,
      c.event_threads);
  std::printf("  offered   %s block ops/s, %s logical ops/s\n",
              Millions(s.offered(tt.block_ops())).c_str(),
              Millions(s.offered(tt.logical_ops())).c_str());
  std::printf("  achieved  %s block ops/s, %s logical ops/s\n",
              Millions(s.achieved(tt.block_ops())).c_str(),
              Millions(s.achieved(tt.logical_ops())).c_str());
  std::printf("  replay + drain %.3f s = %.2fx the window (drain %.3f s): %s\n",
              static_cast<double>(s.end_ns) * 1e-9,
              static_cast<double>(s.end_ns) / static_cast<double>(c.window_ns),
              static_cast<double>(s.drain_ns()) * 1e-9,
              s.kept_up ? "KEPT UP (<= 1.10x)" : "did not keep up (> 1.10x)");
  std::printf("  Route service (%s)  %s\n",
              c.route_by_keys ? "keys  " : "tokens",
              DistText(s.query_service).c_str());
  std::printf(
      "    per Route: %.1f prompt blocks, the deepest match %.1f blocks, "
      "%.2f workers with a match\n",
      static_cast<double>(tt.request_blocks) / static_cast<double>(tt.requests),
      static_cast<double>(s.deepest_sum) / static_cast<double>(tt.requests),
      static_cast<double>(s.matched_workers_sum) /
          static_cast<double>(tt.requests));
  std::printf("  Route queue wait       %s\n", DistText(s.query_wait).c_str());
  std::printf("  prompt tokens written  %s\n",
              DistText(s.query_prompt).c_str());
  std::printf("  Route deadline->done   %s\n", DistText(s.query_total).c_str());
  std::printf("  batch service          %s\n",
              DistText(s.batch_service).c_str());
  std::printf("    of which the payload %s (%.1f%% of all batch service)\n",
              DistText(s.batch_encode).c_str(), 100 * s.encode_share);
  std::printf("  batch deadline->done   %s\n", DistText(s.batch_total).c_str());
  std::printf(
      "  CPU: event thread(s) %.2f s, query thread(s) %.2f s, process %.2f s "
      "over %.2f s\n",
      s.event_cpu, s.query_cpu, s.process_cpu,
      static_cast<double>(s.end_ns) * 1e-9);
  std::printf(
      "  quiesced index, %llu Routes: service %s; hashing the prompt's "
      "blocks alone %s\n",
      (unsigned long long)f.routes, DistText(f.route_ns).c_str(),
      DistText(f.hashing_ns).c_str());
}

nlohmann::json WorkloadJson(const Config& c, const FleetWorkload& w) {
  const FleetWorkloadOptions& o = c.workload;
  const WorkloadTotals& t = w.totals();
  const EngineCounts& e = w.engine_counts();
  return {{"options",
           {{"trace_block_size", o.trace_block_size},
            {"block_size", o.block_size},
            {"length_factor", o.length_factor},
            {"duplication", o.duplication},
            {"workers", o.workers},
            {"gpu_blocks", o.gpu_blocks},
            {"decode_ms_per_token", o.decode_ms_per_token},
            {"seed", o.seed},
            {"max_requests", o.max_requests},
            {"removed_per_block", o.removed_per_block},
            {"window_ms", c.window_ns / 1000000},
            {"query_threads", c.query_threads},
            {"event_threads", c.event_threads}}},
          {"totals",
           {{"requests", t.requests},
            {"batches", t.batches},
            {"stored_events", t.stored_events},
            {"removed_events", t.removed_events},
            {"request_blocks", t.request_blocks},
            {"stored_blocks", t.stored_blocks},
            {"removed_blocks", t.removed_blocks},
            {"logical_ops", t.logical_ops()},
            {"block_ops", t.block_ops()}}},
          {"engines",
           {{"admitted", e.admitted},
            {"waited", e.waited},
            {"refused", e.refused},
            {"hit_blocks", e.hit_blocks}}}};
}

nlohmann::json ResultJson(const Config& c, const FleetWorkload& w,
                          const Summary& s, const FinalCheck& f,
                          const SequentialCheckResult* seq,
                          const std::vector<std::string>& failures) {
  const WorkloadTotals& t = w.totals();
  const double requests = static_cast<double>(t.requests);
  nlohmann::json j = WorkloadJson(c, w);
  j["benchmark"] = "index_replay";
  j["trace"] = c.trace;
  j["route_by"] = c.route_by_keys ? "keys" : "tokens";
  j["machine"] = {{"cpus", std::thread::hardware_concurrency()},
                  {"load_average", LoadAverage()}};
  j["offered_block_ops_per_sec"] = s.offered(t.block_ops());
  j["achieved_block_ops_per_sec"] = s.achieved(t.block_ops());
  j["offered_logical_ops_per_sec"] = s.offered(t.logical_ops());
  j["achieved_logical_ops_per_sec"] = s.achieved(t.logical_ops());
  j["replay_plus_drain_ns"] = s.end_ns;
  j["drain_ns"] = s.drain_ns();
  j["kept_up"] = s.kept_up;
  j["query_service"] = DistJson(s.query_service);
  j["mean_deepest_match_blocks"] =
      static_cast<double>(s.deepest_sum) / requests;
  j["mean_workers_matched"] =
      static_cast<double>(s.matched_workers_sum) / requests;
  j["query_queue_wait"] = DistJson(s.query_wait);
  j["query_prompt_tokens"] = DistJson(s.query_prompt);
  j["query_scheduled_to_finished"] = DistJson(s.query_total);
  j["update_service"] = DistJson(s.batch_service);
  j["update_payload"] = DistJson(s.batch_encode);
  j["update_scheduled_to_finished"] = DistJson(s.batch_total);
  j["cpu_seconds"] = {{"event_threads", s.event_cpu},
                      {"query_threads", s.query_cpu},
                      {"process", s.process_cpu}};
  j["final_check"] = {{"routes", f.routes},
                      {"mismatches", f.mismatches},
                      {"route_service", DistJson(f.route_ns)},
                      {"prompt_block_hashing", DistJson(f.hashing_ns)}};
  j["exact"] = failures.empty();
  j["failures"] = failures;
  if (seq != nullptr) {
    j["sequential_check"] = {{"batches", seq->batches},
                             {"payloads_compared", seq->payloads_compared},
                             {"routes_checked", seq->queries_checked},
                             {"route_mismatches", seq->route_mismatches},
                             {"seconds", seq->seconds}};
  }
  return j;
}

void PrintDecodeFloor(const WorkloadTotals& t, const DecodeFloor& f,
                      uint64_t every) {
  const unsigned cores = std::thread::hardware_concurrency();
  std::printf(
      "\ndecode floor: 1 batch in %llu, %llu batches, %llu stored and "
      "removed blocks, %.1f payload bytes per block (thread CPU)\n",
      (unsigned long long)every, (unsigned long long)f.batches,
      (unsigned long long)f.blocks,
      f.blocks == 0 ? 0.0
                    : static_cast<double>(f.payload_bytes) /
                          static_cast<double>(f.blocks));
  std::printf(
      "  msgpack::parse, a visitor that keeps nothing  %.0f ns per block\n",
      f.ParseNsPerBlock());
  std::printf(
      "  DecodeEventBatch                              %.0f ns per block\n",
      f.DecodeNsPerBlock());
  std::printf(
      "  the parse alone on %u core(s), doing nothing else, allows at most "
      "%s block ops/s of this corpus\n",
      cores, Millions(f.CeilingBlockOps(t, cores)).c_str());
}

nlohmann::json DecodeFloorJson(const WorkloadTotals& t, const DecodeFloor& f,
                               uint64_t every) {
  const unsigned cores = std::thread::hardware_concurrency();
  return {{"every", every},
          {"batches", f.batches},
          {"blocks", f.blocks},
          {"payload_bytes", f.payload_bytes},
          {"parse_ns_per_block", f.ParseNsPerBlock()},
          {"decode_ns_per_block", f.DecodeNsPerBlock()},
          {"cores", cores},
          {"parse_ceiling_block_ops_per_sec", f.CeilingBlockOps(t, cores)}};
}

void WriteJson(const std::string& path, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  if (path == "-") {
    std::fputs(text.c_str(), stdout);
    return;
  }
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr || std::fputs(text.c_str(), f) < 0 || std::fclose(f) != 0) {
    Die(absl::StrCat("cannot write --json=", path));
  }
}

std::unique_ptr<SequentialCheckResult> SequentialCheck(
    const Config& c, const FleetWorkload& w,
    const std::vector<ScheduledOp>& schedule,
    std::vector<std::string>* failures) {
  if (!c.sequential) return nullptr;
  Progress("sequential check (untimed)");
  auto seq = std::make_unique<SequentialCheckResult>(
      RunSequentialCheck(w, schedule, c.check_every, Progress));
  std::printf(
      "\nsequential check (one thread, schedule order, untimed, %.1f s): "
      "%llu batches, %llu payloads identical to EncodeEventBatch's, %llu "
      "Routes checked, %llu differ from the workers' caches\n",
      seq->seconds, (unsigned long long)seq->batches,
      (unsigned long long)(seq->payloads_compared),
      (unsigned long long)seq->queries_checked,
      (unsigned long long)seq->route_mismatches);
  for (const std::string& f : seq->failures) {
    failures->push_back("sequential check: " + f);
  }
  return seq;
}

int Run() {
  absl::StatusOr<Config> config = ConfigFromFlags();
  if (!config.ok()) Die(std::string(config.status().message()), 2);
  const Config& c = *config;
  absl::StatusOr<Trace> trace =
      LoadTrace(c.trace, absl::GetFlag(FLAGS_trace_dir));
  if (!trace.ok()) Die(std::string(trace.status().message()), 2);
  Progress("simulating the workers");
  absl::StatusOr<FleetWorkload> workload =
      FleetWorkload::Build(*trace, c.workload, Progress);
  if (!workload.ok()) Die(std::string(workload.status().message()), 2);
  const FleetWorkload& w = *workload;
  PrintWorkload(c, w);
  const std::vector<ScheduledOp> schedule = w.Schedule(c.window_ns);

  std::vector<std::string> failures;
  const std::unique_ptr<SequentialCheckResult> seq =
      SequentialCheck(c, w, schedule, &failures);
  std::optional<DecodeFloor> floor;
  if (c.decode_floor_every > 0) {
    Progress("measuring the decode floor");
    floor = MeasureDecodeFloor(w, c.decode_floor_every);
    if (!floor->all_decoded) failures.push_back("a payload did not decode");
  }

  Progress("timed replay");
  malloc_trim(0);  // as Dynamo: the preparation's free pages go back first
  TimedReplay replay(w, schedule, c.query_threads, c.event_threads,
                     c.drop_batch, c.route_by_keys);
  const double cpu0 = ProcessCpuSeconds();
  replay.Run();
  const double cpu = ProcessCpuSeconds() - cpu0;
  Progress("checking the drained index");
  CheckRecords(w, schedule, replay, &failures);
  const FinalCheck final_check =
      CheckFinalState(w, replay, c.final_checks, &failures);
  Summary s = Summarize(schedule, replay, c.window_ns);
  s.process_cpu = cpu;
  PrintSummary(c, w.totals(), s, final_check);
  if (floor) PrintDecodeFloor(w.totals(), *floor, c.decode_floor_every);
  std::printf("\nexactness: %s\n",
              failures.empty() ? "PASS (IDs, per-worker FIFO, index state, "
                                 "Route answers)"
                               : "FAIL");
  for (const std::string& f : failures) std::printf("  %s\n", f.c_str());
  if (!c.json.empty()) {
    nlohmann::json j = ResultJson(c, w, s, final_check, seq.get(), failures);
    if (floor) {
      j["decode_floor"] =
          DecodeFloorJson(w.totals(), *floor, c.decode_floor_every);
    }
    WriteJson(c.json, j);
  }
  return failures.empty() ? 0 : 1;
}

// --help lists this file's flags and --trace_dir.
void HelpListsOwnFlags() {
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = [](absl::string_view file) {
    return absl::StrContains(file, "bench/index_replay") ||
           absl::StrContains(file, "bench/trace.cc");
  };
  config.contains_help_flags = config.contains_helpshort_flags;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace
}  // namespace bench
}  // namespace prefixd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "The fleet index at NVIDIA Dynamo's mooncake_bench definition: a "
      "Mooncake trace (hash id = 512 tokens) re-chunked to 128-token blocks, "
      "length factor 4, duplication 20, 128 simulated LRU workers; Route "
      "queries and KV-event payloads (DecodeEventBatch + FleetIndex::Apply) "
      "issued by deadline over --window_ms on separate threads; reports "
      "block ops/s (request + stored + removed blocks), Route service "
      "percentiles, keep-up (replay + drain <= 1.10x the window), and "
      "exactness checks (exit 1 if one fails, 2 for bad flags). "
      "docs/performance.md, \"Fleet index at Dynamo's definition\".\n\n"
      "  index_replay [--trace=conversation] [--window_ms=60000] "
      "[--json=FILE]\n\n"
      "--traces (shared with other benchmarks) is not used: see --trace.");
  prefixd::bench::HelpListsOwnFlags();
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::fprintf(stderr,
                 "index_replay: unexpected argument '%s' (flags only)\n",
                 rest[1]);
    return 2;
  }
  // As the daemon: abseil's deadlock detector off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return prefixd::bench::Run();
}
