#include "bench/fleet_workload.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <queue>
#include <random>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "bench/bench_util.h"

// As index/events.cc: Debian's msgpack-cxx needs Boost unless told not to.
#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

namespace prefixd {
namespace bench {
namespace {

// One worker's paged KV pool with prefix caching (see the header). Blocks
// are numbered 0..capacity-1; the free queue is a doubly linked list
// through them, with `capacity` as its sentinel.
class SimPool {
 public:
  explicit SimPool(uint32_t capacity) : capacity_(capacity) {
    blocks_.resize(capacity + 1);
    blocks_[capacity].prev = blocks_[capacity].next = capacity;
    for (uint32_t b = 0; b < capacity; ++b) PushBack(b);
    cached_.reserve(capacity);
  }

  // Admits a prompt whose full blocks are `keys` and which takes `blocks`
  // blocks in all, if it fits now: its cached prefix is a hit (*hit), the
  // rest is allocated, and the keys of evicted blocks are appended to
  // *evicted. *held receives every block it holds, in prompt order.
  bool Admit(absl::Span<const uint32_t> keys, uint32_t blocks, uint32_t* hit,
             std::vector<uint32_t>* evicted, std::vector<uint32_t>* held) {
    held->clear();
    for (uint32_t key : keys) {
      auto it = cached_.find(key);
      if (it == cached_.end()) break;
      held->push_back(it->second);
    }
    *hit = static_cast<uint32_t>(held->size());
    uint32_t in_queue = 0;  // hit blocks nobody holds: taken off the queue
    for (uint32_t b : *held) in_queue += blocks_[b].ref == 0 ? 1 : 0;
    const uint32_t need = blocks - *hit;
    if (free_ - in_queue < need) return false;
    for (uint32_t b : *held) {
      if (blocks_[b].ref++ == 0) Unlink(b);
    }
    for (uint32_t i = 0; i < need; ++i) {
      const uint32_t b = blocks_[capacity_].next;
      Unlink(b);
      Block& block = blocks_[b];
      if (block.key != kNone) {
        evicted->push_back(block.key);
        cached_.erase(block.key);
        block.key = kNone;
      }
      block.ref = 1;
      held->push_back(b);
    }
    // The newly computed full blocks enter the cache (a partial tail
    // block, the last one allocated, does not).
    for (size_t i = *hit; i < keys.size(); ++i) {
      blocks_[(*held)[i]].key = keys[i];
      cached_.emplace(keys[i], (*held)[i]);
    }
    return true;
  }

  // The blocks of a finished request, its last block first.
  void Release(absl::Span<const uint32_t> held) {
    for (size_t i = held.size(); i-- > 0;) {
      if (--blocks_[held[i]].ref == 0) PushBack(held[i]);
    }
  }

  std::vector<uint32_t> CachedKeys() const {
    std::vector<uint32_t> keys;
    keys.reserve(cached_.size());
    for (const auto& [key, block] : cached_) keys.push_back(key);
    std::sort(keys.begin(), keys.end());
    return keys;
  }

 private:
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  struct Block {
    uint32_t key = kNone;  // the cached block's key; kNone: not cached
    uint32_t ref = 0;
    uint32_t prev = 0, next = 0;  // the free queue, while ref == 0
  };

  void Unlink(uint32_t b) {
    blocks_[blocks_[b].prev].next = blocks_[b].next;
    blocks_[blocks_[b].next].prev = blocks_[b].prev;
    --free_;
  }
  void PushBack(uint32_t b) {
    const uint32_t last = blocks_[capacity_].prev;
    blocks_[b].prev = last;
    blocks_[b].next = capacity_;
    blocks_[last].next = b;
    blocks_[capacity_].prev = b;
    ++free_;
  }

  const uint32_t capacity_;
  std::vector<Block> blocks_;
  absl::flat_hash_map<uint32_t, uint32_t> cached_;  // key -> block
  uint32_t free_ = 0;
};

absl::Status CheckOptions(const FleetWorkloadOptions& o) {
  const auto bad = [](absl::string_view flag, auto value,
                      absl::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", value, ": ", rule));
  };
  if (o.block_size < 1) return bad("block_size", o.block_size, "must be >= 1");
  if (o.trace_block_size < 1 || o.trace_block_size % o.block_size != 0) {
    return bad("trace_block_size", o.trace_block_size,
               absl::StrCat("must be a positive multiple of --block_size (",
                            o.block_size, ")"));
  }
  if (o.length_factor < 1) {
    return bad("length_factor", o.length_factor, "must be >= 1");
  }
  if (o.duplication < 1) {
    return bad("duplication", o.duplication, "must be >= 1");
  }
  if (o.workers < 1 || o.workers > 65536) {
    return bad("workers", o.workers, "must be in [1, 65536]");
  }
  if (o.gpu_blocks < 1) return bad("gpu_blocks", o.gpu_blocks, "must be >= 1");
  if (!(o.decode_ms_per_token >= 0)) {
    return bad("decode_ms_per_token", o.decode_ms_per_token, "must be >= 0");
  }
  return absl::OkStatus();
}

// msgpack-cxx writes into any stream with write(const char*, size_t).
struct Appender {
  std::string* out;
  void write(const char* p, size_t n) { out->append(p, n); }
};

void PackStr(msgpack::packer<Appender>& pk, absl::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// Appends `unit` `count` times, doubling the copied run.
void AppendRepeated(std::string* out, absl::string_view unit, size_t count) {
  if (count == 0) return;
  const size_t begin = out->size();
  const size_t total = unit.size() * count;
  out->resize(begin + total);
  char* p = out->data() + begin;
  std::copy(unit.begin(), unit.end(), p);
  for (size_t done = unit.size(); done < total;) {
    const size_t n = std::min(done, total - done);
    std::copy(p, p + n, p + done);
    done += n;
  }
}

}  // namespace

// What one worker's simulation produced; batches' removed_begin is an
// offset into its own `removed`.
struct FleetWorkload::WorkerResult {
  std::vector<TimelineEntry> timeline;  // batches: index into `batches`
  std::vector<BatchSpec> batches;
  std::vector<uint32_t> removed;
  std::vector<uint32_t> final_cached;
  EngineCounts counts;
};

EngineHash FleetWorkload::HashOf(uint32_t key) {
  return Mix64(uint64_t{key} + 0x9e3779b97f4a7c15ULL);
}

uint32_t FleetWorkload::Key(const QuerySpec& q, uint32_t block) const {
  const uint64_t factor = static_cast<uint64_t>(options_.length_factor);
  const uint64_t per_hash_id = blocks_per_id_ * factor;
  const uint64_t h =
      trace_->ids[trace_->requests[q.request].first + block / per_hash_id];
  const uint64_t id =
      q.copy * copy_stride_ + h * factor + (block / blocks_per_id_) % factor;
  return static_cast<uint32_t>(id * blocks_per_id_ + block % blocks_per_id_);
}

// One worker's engine over its requests, in arrival order (see the
// header): what it publishes and when.
class FleetWorkload::WorkerSim {
 public:
  WorkerSim(const FleetWorkload& w, int worker)
      : w_(w),
        worker_(static_cast<uint32_t>(worker)),
        pool_(w.options_.gpu_blocks) {}

  WorkerResult Run(const std::vector<uint32_t>& arrivals) {
    for (uint32_t qid : arrivals) {
      const double t = ArrivalMs(qid);
      FinishUntil(t);
      out_.timeline.push_back({t, qid, true});
      if (Blocks(w_.queries_[qid]) > w_.options_.gpu_blocks) {
        ++out_.counts.refused;  // routed, but the engine can never run it
        continue;
      }
      waiting_.push_back(qid);
      AdmitWaiting(t);
    }
    FinishUntil(std::numeric_limits<double>::infinity());
    out_.final_cached = pool_.CachedKeys();
    return std::move(out_);
  }

 private:
  struct Running {
    double finish_ms;
    uint64_t order;
    std::vector<uint32_t> held;
    bool operator>(const Running& o) const {
      return finish_ms != o.finish_ms ? finish_ms > o.finish_ms
                                      : order > o.order;
    }
  };

  double ArrivalMs(uint32_t qid) const {
    return static_cast<double>(
        w_.trace_->requests[w_.queries_[qid].request].timestamp_ms);
  }
  // Blocks the prompt takes in the pool, a partial tail block included.
  uint64_t Blocks(const QuerySpec& q) const {
    const Request& r = w_.trace_->requests[q.request];
    const uint64_t tokens =
        std::min<uint64_t>(r.input_length,
                           r.blocks * w_.options_.trace_block_size) *
        w_.options_.length_factor;
    return (tokens + w_.options_.block_size - 1) / w_.options_.block_size;
  }

  // Admits waiting requests in order, at time t, while they fit.
  void AdmitWaiting(double t) {
    while (next_ < waiting_.size() && Admit(waiting_[next_], t)) ++next_;
  }

  bool Admit(uint32_t qid, double t) {
    const QuerySpec& q = w_.queries_[qid];
    keys_.resize(q.blocks);
    for (uint32_t b = 0; b < q.blocks; ++b) keys_[b] = w_.Key(q, b);
    BatchSpec batch;
    batch.worker = worker_;
    batch.query = qid;
    batch.removed_begin = out_.removed.size();
    uint32_t hit;
    if (!pool_.Admit(keys_, static_cast<uint32_t>(Blocks(q)), &hit,
                     &out_.removed, &held_)) {
      return false;
    }
    ++out_.counts.admitted;
    out_.counts.hit_blocks += hit;
    if (t > ArrivalMs(qid)) ++out_.counts.waited;
    batch.stored_from = hit;
    batch.stored_to = q.blocks;
    batch.removed_count =
        static_cast<uint32_t>(out_.removed.size() - batch.removed_begin);
    if (batch.stored_blocks() > 0 || batch.removed_count > 0) {
      batch.seq = static_cast<uint32_t>(out_.batches.size());
      out_.timeline.push_back({t, batch.seq, false});
      out_.batches.push_back(batch);
    }
    const double hold =
        static_cast<double>(w_.trace_->requests[q.request].output_length) *
        w_.options_.decode_ms_per_token;
    running_.push({t + hold, order_++, held_});
    return true;
  }

  // Frees the requests that finish by time t, admitting at each finish.
  void FinishUntil(double t) {
    while (!running_.empty() && running_.top().finish_ms <= t) {
      const double at = running_.top().finish_ms;
      pool_.Release(running_.top().held);
      running_.pop();
      AdmitWaiting(at);
    }
  }

  const FleetWorkload& w_;
  const uint32_t worker_;
  SimPool pool_;
  WorkerResult out_;
  std::priority_queue<Running, std::vector<Running>, std::greater<Running>>
      running_;
  std::vector<uint32_t> waiting_;  // query ids, FIFO from next_
  size_t next_ = 0;
  std::vector<uint32_t> keys_, held_;
  uint64_t order_ = 0;
};

void FleetWorkload::AssignSessions(
    size_t requests, std::vector<std::vector<uint32_t>>* arrivals) {
  std::mt19937_64 rng(options_.seed);
  arrivals->assign(options_.workers, {});
  for (int c = 0; c < options_.duplication; ++c) {
    for (size_t r = 0; r < requests; ++r) {
      QuerySpec q;
      q.request = static_cast<uint32_t>(r);
      q.copy = static_cast<uint32_t>(c);
      q.worker = static_cast<uint32_t>(rng() % options_.workers);
      q.blocks = request_blocks_[r];
      (*arrivals)[q.worker].push_back(static_cast<uint32_t>(queries_.size()));
      queries_.push_back(q);
    }
  }
  for (auto& a : *arrivals) {
    std::stable_sort(a.begin(), a.end(), [&](uint32_t x, uint32_t y) {
      return trace_->requests[queries_[x].request].timestamp_ms <
             trace_->requests[queries_[y].request].timestamp_ms;
    });
  }
}

std::vector<FleetWorkload::WorkerResult> FleetWorkload::SimulateAll(
    const std::vector<std::vector<uint32_t>>& arrivals,
    const std::function<void(const std::string&)>& progress) const {
  const int workers = options_.workers;
  std::vector<WorkerResult> results(workers);
  std::atomic<int> next{0}, done{0};
  const auto run = [&] {
    for (int i; (i = next.fetch_add(1)) < workers;) {
      results[i] = WorkerSim(*this, i).Run(arrivals[i]);
      const int d = done.fetch_add(1) + 1;
      if (progress && d % 16 == 0 && d < workers) {
        progress(absl::StrCat("simulated ", d, " of ", workers, " workers"));
      }
    }
  };
  // The workers are independent: simulated on every core.
  std::vector<std::thread> threads;
  const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 1; i < n; ++i) threads.emplace_back(run);
  run();
  for (std::thread& t : threads) t.join();
  return results;
}

// In worker order, so that the result does not depend on the threads.
void FleetWorkload::Merge(std::vector<WorkerResult> results) {
  const int workers = options_.workers;
  timelines_.resize(workers);
  final_cached_.resize(workers);
  worker_batches_.resize(workers);
  for (int i = 0; i < workers; ++i) {
    WorkerResult& r = results[i];
    const uint32_t base = static_cast<uint32_t>(batches_.size());
    for (TimelineEntry& e : r.timeline) {
      if (!e.is_query) e.index += base;
    }
    for (BatchSpec& b : r.batches) {
      b.removed_begin += removed_.size();
      batches_.push_back(b);
    }
    removed_.insert(removed_.end(), r.removed.begin(), r.removed.end());
    timelines_[i] = std::move(r.timeline);
    final_cached_[i] = std::move(r.final_cached);
    worker_batches_[i] = static_cast<uint32_t>(r.batches.size());
    counts_.admitted += r.counts.admitted;
    counts_.refused += r.counts.refused;
    counts_.waited += r.counts.waited;
    counts_.hit_blocks += r.counts.hit_blocks;
    r = WorkerResult();
  }
  totals_.requests = queries_.size();
  totals_.batches = batches_.size();
  for (const QuerySpec& q : queries_) totals_.request_blocks += q.blocks;
  for (const BatchSpec& b : batches_) {
    totals_.stored_blocks += b.stored_blocks();
    totals_.removed_blocks += b.removed_count;
    totals_.stored_events += b.stored_blocks() > 0 ? 1 : 0;
    totals_.removed_events += EventsIn(b) - (b.stored_blocks() > 0 ? 1 : 0);
  }
}

absl::StatusOr<FleetWorkload> FleetWorkload::Build(
    const Trace& trace, const FleetWorkloadOptions& options,
    const std::function<void(const std::string&)>& progress) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  FleetWorkload w;
  w.options_ = options;
  w.trace_ = &trace;
  w.blocks_per_id_ =
      static_cast<uint32_t>(options.trace_block_size / options.block_size);
  w.copy_stride_ = (trace.max_id + 1) * options.length_factor;
  const uint64_t keys = w.copy_stride_ * options.duplication * w.blocks_per_id_;
  if (keys > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the workload names ", keys,
        " blocks, more than 2^32: lower --duplication or --length_factor"));
  }
  const size_t requests =
      options.max_requests == 0
          ? trace.requests.size()
          : std::min(options.max_requests, trace.requests.size());
  for (size_t r = 0; r < requests; ++r) {
    const Request& req = trace.requests[r];
    w.request_blocks_.push_back(static_cast<uint32_t>(
        std::min<uint64_t>(req.input_length,
                           req.blocks * options.trace_block_size) *
        options.length_factor / options.block_size));
  }
  std::vector<std::vector<uint32_t>> arrivals;
  w.AssignSessions(requests, &arrivals);
  w.Merge(w.SimulateAll(arrivals, progress));
  return w;
}

std::vector<ScheduledOp> FleetWorkload::Schedule(uint64_t window_ns) const {
  struct Keyed {
    ScheduledOp op;
    uint32_t worker;
    uint32_t position;
  };
  std::vector<Keyed> all;
  all.reserve(queries_.size() + batches_.size());
  for (size_t w = 0; w < timelines_.size(); ++w) {
    const auto& t = timelines_[w];
    if (t.empty()) continue;
    const double first = t.front().time_ms;
    const double span = t.back().time_ms - first;
    for (size_t i = 0; i < t.size(); ++i) {
      const double f = span > 0 ? (t[i].time_ms - first) / span : 0;
      all.push_back({{static_cast<uint64_t>(f * static_cast<double>(window_ns)),
                      t[i].index, t[i].is_query},
                     static_cast<uint32_t>(w),
                     static_cast<uint32_t>(i)});
    }
  }
  std::sort(all.begin(), all.end(), [](const Keyed& a, const Keyed& b) {
    if (a.op.deadline_ns != b.op.deadline_ns)
      return a.op.deadline_ns < b.op.deadline_ns;
    if (a.op.is_query != b.op.is_query) return a.op.is_query;
    if (a.worker != b.worker) return a.worker < b.worker;
    return a.position < b.position;
  });
  std::vector<ScheduledOp> ops;
  ops.reserve(all.size());
  for (const Keyed& k : all) ops.push_back(k.op);
  return ops;
}

void FleetWorkload::PromptTokens(const QuerySpec& q,
                                 std::vector<Token>* tokens) const {
  const size_t bs = static_cast<size_t>(options_.block_size);
  tokens->resize(q.blocks * bs);
  // A stretched id's blocks share one token value: fill them at once.
  for (uint32_t b = 0; b < q.blocks; b += blocks_per_id_) {
    const uint32_t n = std::min(blocks_per_id_, q.blocks - b);
    std::fill_n(tokens->data() + b * bs, n * bs, TokenOf(Key(q, b)));
  }
}

uint32_t FleetWorkload::EventsIn(const BatchSpec& b) const {
  const uint32_t removed =
      options_.removed_per_block ? b.removed_count : (b.removed_count > 0);
  return removed + (b.stored_blocks() > 0 ? 1 : 0);
}

KvEventBatch FleetWorkload::Events(const BatchSpec& b, double ts) const {
  KvEventBatch batch;
  batch.ts = ts;
  const auto removed =
      absl::MakeConstSpan(removed_).subspan(b.removed_begin, b.removed_count);
  if (options_.removed_per_block) {
    for (uint32_t key : removed) {
      BlockRemovedEvent ev;
      ev.block_hashes.push_back(HashOf(key));
      batch.events.push_back(std::move(ev));
    }
  } else if (!removed.empty()) {
    BlockRemovedEvent ev;
    for (uint32_t key : removed) ev.block_hashes.push_back(HashOf(key));
    batch.events.push_back(std::move(ev));
  }
  if (b.stored_blocks() > 0) {
    const QuerySpec& q = queries_[b.query];
    BlockStoredEvent ev;
    for (uint32_t i = b.stored_from; i < b.stored_to; ++i) {
      const uint32_t key = Key(q, i);
      ev.block_hashes.push_back(HashOf(key));
      ev.token_ids.insert(ev.token_ids.end(), options_.block_size,
                          TokenOf(key));
    }
    if (b.stored_from > 0)
      ev.parent_block_hash = HashOf(Key(q, b.stored_from - 1));
    ev.block_size = options_.block_size;
    ev.chain_blocks = ev.block_hashes.size();
    batch.events.push_back(std::move(ev));
  }
  return batch;
}

namespace {

// One BlockRemoved of the blocks `keys`, as EncodeEventBatch writes it.
void PackRemoved(msgpack::packer<Appender>& pk,
                 absl::Span<const uint32_t> keys) {
  pk.pack_map(3);
  PackStr(pk, "type");
  PackStr(pk, "BlockRemoved");
  PackStr(pk, "block_hashes");
  pk.pack_array(static_cast<uint32_t>(keys.size()));
  for (uint32_t key : keys) pk.pack_uint64(FleetWorkload::HashOf(key));
  PackStr(pk, "medium");
  PackStr(pk, "GPU");
}

}  // namespace

// The BlockStored of batch b, as EncodeEventBatch writes it; each block's
// equal token ids are packed once and copied.
void FleetWorkload::PackStored(const BatchSpec& b, std::string* out) const {
  Appender app{out};
  msgpack::packer<Appender> pk(app);
  const QuerySpec& q = queries_[b.query];
  pk.pack_map(9);
  PackStr(pk, "type");
  PackStr(pk, "BlockStored");
  PackStr(pk, "block_hashes");
  pk.pack_array(b.stored_blocks());
  for (uint32_t i = b.stored_from; i < b.stored_to; ++i)
    pk.pack_uint64(HashOf(Key(q, i)));
  PackStr(pk, "parent_block_hash");
  if (b.stored_from > 0) {
    pk.pack_uint64(HashOf(Key(q, b.stored_from - 1)));
  } else {
    pk.pack_nil();
  }
  PackStr(pk, "token_ids");
  const uint32_t bs = static_cast<uint32_t>(options_.block_size);
  pk.pack_array(b.stored_blocks() * bs);
  std::string unit;
  Appender unit_app{&unit};
  msgpack::packer<Appender> unit_pk(unit_app);
  for (uint32_t i = b.stored_from; i < b.stored_to; ++i) {
    unit.clear();
    unit_pk.pack_uint32(TokenOf(Key(q, i)));
    AppendRepeated(out, unit, bs);
  }
  PackStr(pk, "block_size");
  pk.pack_int64(options_.block_size);
  PackStr(pk, "lora_id");
  pk.pack_nil();
  PackStr(pk, "medium");
  PackStr(pk, "GPU");
  PackStr(pk, "lora_name");
  pk.pack_nil();
  PackStr(pk, "extra_keys");
  pk.pack_nil();
}

void FleetWorkload::EncodePayload(const BatchSpec& b, double ts,
                                  std::string* out) const {
  out->clear();
  Appender app{out};
  msgpack::packer<Appender> pk(app);
  pk.pack_map(2);
  PackStr(pk, "ts");
  pk.pack_double(ts);
  PackStr(pk, "events");
  pk.pack_array(EventsIn(b));
  const auto removed =
      absl::MakeConstSpan(removed_).subspan(b.removed_begin, b.removed_count);
  if (options_.removed_per_block) {
    for (size_t i = 0; i < removed.size(); ++i)
      PackRemoved(pk, removed.subspan(i, 1));
  } else if (!removed.empty()) {
    PackRemoved(pk, removed);
  }
  if (b.stored_blocks() > 0) PackStored(b, out);
}

}  // namespace bench
}  // namespace prefixd
