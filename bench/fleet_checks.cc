#include "bench/fleet_checks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "index/publisher.h"

namespace prefixd {
namespace bench {

ReferenceCaches::ReferenceCaches(const FleetWorkload& workload)
    : workload_(workload), sets_(workload.options().workers) {}

void ReferenceCaches::Apply(const BatchSpec& b) {
  auto& set = sets_[b.worker];
  const auto removed = absl::MakeConstSpan(workload_.removed())
                           .subspan(b.removed_begin, b.removed_count);
  for (uint32_t key : removed) set.erase(key);
  const QuerySpec& q = workload_.queries()[b.query];
  for (uint32_t i = b.stored_from; i < b.stored_to; ++i)
    set.insert(workload_.Key(q, i));
}

void ReferenceCaches::SetFinal() {
  for (size_t w = 0; w < sets_.size(); ++w) {
    const auto& keys = workload_.final_cached(static_cast<int>(w));
    sets_[w] = absl::flat_hash_set<uint32_t>(keys.begin(), keys.end());
  }
}

uint32_t ReferenceCaches::Matched(const QuerySpec& q, int w) const {
  const auto& set = sets_[w];
  uint32_t n = 0;
  while (n < q.blocks && set.contains(workload_.Key(q, n))) ++n;
  return n;
}

bool ReferenceCaches::Equals(int w, const std::vector<uint32_t>& keys) const {
  if (sets_[w].size() != keys.size()) return false;
  return std::all_of(keys.begin(), keys.end(),
                     [&](uint32_t k) { return sets_[w].contains(k); });
}

bool CheckRoute(const FleetWorkload& workload, const ReferenceCaches& ref,
                const QuerySpec& q, const RouteResult& result,
                const absl::flat_hash_map<std::string, int>& worker_of,
                std::string* error) {
  const int workers = workload.options().workers;
  const auto where = [&] {
    return absl::StrCat("query ", &q - workload.queries().data(),
                        " (trace request ", q.request, ", copy ", q.copy, ", ",
                        q.blocks, " blocks)");
  };
  if (result.prompt_blocks != q.blocks ||
      result.workers.size() != static_cast<size_t>(workers)) {
    *error =
        absl::StrCat(where(), ": Route saw ", result.prompt_blocks,
                     " blocks and scored ", result.workers.size(), " workers");
    return false;
  }
  std::vector<bool> seen(workers);
  for (const WorkerMatch& m : result.workers) {
    auto it = worker_of.find(m.worker);
    if (it == worker_of.end() || seen[it->second]) {
      *error = absl::StrCat(where(), ": worker ", m.worker,
                            " unknown or listed twice");
      return false;
    }
    seen[it->second] = true;
    const uint32_t want = ref.Matched(q, it->second);
    if (m.matched_blocks != want) {
      *error =
          absl::StrCat(where(), ": worker ", m.worker, " matched ",
                       m.matched_blocks, " blocks, its cache holds ", want);
      return false;
    }
  }
  return true;
}

void CheckIndexState(const FleetWorkload& workload, const FleetIndex& index,
                     std::vector<std::string>* failures, size_t limit) {
  const auto fail = [&](std::string what) {
    if (failures->size() < limit) failures->push_back(std::move(what));
  };
  if (const absl::Status s = index.CheckInvariants(); !s.ok())
    fail(absl::StrCat("index invariants: ", s.message()));
  const IndexStats stats = index.Stats();
  for (size_t r = 0; r < stats.dropped.size(); ++r) {
    if (stats.dropped[r] != 0) {
      fail(absl::StrCat("the index dropped ", stats.dropped[r], " blocks (",
                        DropReasonName(static_cast<DropReason>(r)), ")"));
    }
  }
  // Expected per worker, from the batches.
  const int workers = workload.options().workers;
  std::vector<uint64_t> stored(workers), removed(workers);
  for (const BatchSpec& b : workload.batches()) {
    stored[b.worker] += b.stored_blocks() > 0 ? 1 : 0;
    removed[b.worker] += workload.EventsIn(b) - (b.stored_blocks() > 0);
  }
  uint64_t entries = 0;
  for (const WorkerStatus& s : stats.workers) {
    const int w = std::stoi(s.worker.substr(1));
    const uint64_t held = s.mediums.empty() ? 0 : s.mediums[0].blocks;
    const uint64_t want_held = workload.final_cached(w).size();
    const int64_t want_seq =
        static_cast<int64_t>(workload.worker_batches(w)) - 1;
    entries += want_held;
    if (s.last_seq != want_seq || s.events_by_type[0] != stored[w] ||
        s.events_by_type[1] != removed[w] || held != want_held ||
        s.mediums.size() > 1 || s.dropped_blocks != 0 ||
        (want_seq >= 0 && s.state != WorkerState::kLive)) {
      fail(absl::StrCat("worker ", s.worker, ": last seq ", s.last_seq,
                        " (want ", want_seq, "), stored/removed events ",
                        s.events_by_type[0], "/", s.events_by_type[1],
                        " (want ", stored[w], "/", removed[w], "), holds ",
                        held, " blocks (its engine caches ", want_held,
                        "), state ", WorkerStateName(s.state)));
    }
  }
  if (stats.workers.size() != static_cast<size_t>(workers) ||
      stats.entries != entries) {
    fail(absl::StrCat("the index lists ", stats.workers.size(), " workers and ",
                      stats.entries, " entries; the engines ", workers, " and ",
                      entries));
  }
}

std::unique_ptr<FleetIndex> NewFleetIndex(
    const FleetWorkload& workload, std::vector<WorkerId>* ids,
    absl::flat_hash_map<std::string, int>* worker_of, bool key_lookup) {
  IndexOptions o;
  o.block_size = workload.options().block_size;
  o.key_lookup = key_lookup;
  auto index = std::make_unique<FleetIndex>(o);
  ids->clear();
  worker_of->clear();
  for (int w = 0; w < workload.options().workers; ++w) {
    const std::string name = absl::StrCat("w", w);
    ids->push_back(index->AddWorker(name, "index_replay"));
    (*worker_of)[name] = w;
  }
  return index;
}

namespace {

// The sequential check's state: a fresh index, the reference, buffers.
class QuiescedReplay {
 public:
  QuiescedReplay(const FleetWorkload& w, uint64_t every,
                 SequentialCheckResult* out)
      : w_(w), every_(every), out_(out), ref_(w) {
    index_ = NewFleetIndex(w, &ids_, &worker_of_);
  }

  void Batch(const BatchSpec& b, uint32_t index);
  void Query(const QuerySpec& q);
  // The reference against the engines' final caches, and the index state.
  void Finish();

 private:
  void Fail(std::string what) {
    if (out_->failures.size() < 16) out_->failures.push_back(std::move(what));
  }

  const FleetWorkload& w_;
  const uint64_t every_;
  SequentialCheckResult* out_;
  ReferenceCaches ref_;
  std::unique_ptr<FleetIndex> index_;
  std::vector<WorkerId> ids_;
  absl::flat_hash_map<std::string, int> worker_of_;
  std::string payload_, error_;
  KvEventBatch batch_;
  std::vector<Token> tokens_;
  uint64_t queries_ = 0;
};

void QuiescedReplay::Batch(const BatchSpec& b, uint32_t index) {
  const double ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  w_.EncodePayload(b, ts, &payload_);
  if (out_->batches++ % every_ == 0) {
    ++out_->payloads_compared;
    if (payload_ != EncodeEventBatch(w_.Events(b, ts))) {
      Fail(absl::StrCat("batch ", index,
                        ": EncodePayload differs from EncodeEventBatch"));
    }
  }
  if (absl::Status s = DecodeEventBatch(payload_, &batch_); !s.ok()) {
    Fail(absl::StrCat("batch ", index, ": ", s.ToString()));
    return;
  }
  index_->Apply(ids_[b.worker], batch_, b.seq, absl::Now());
  ref_.Apply(b);
}

void QuiescedReplay::Query(const QuerySpec& q) {
  if (queries_++ % every_ != 0) return;
  w_.PromptTokens(q, &tokens_);
  RouteQuery rq;
  rq.filter.all_workers = true;  // every worker is checked
  rq.tokens = absl::MakeConstSpan(tokens_);
  ++out_->queries_checked;
  if (!CheckRoute(w_, ref_, q, index_->Route(rq), worker_of_, &error_)) {
    ++out_->route_mismatches;
    Fail(error_);
  }
}

void QuiescedReplay::Finish() {
  for (int w = 0; w < w_.options().workers; ++w) {
    if (!ref_.Equals(w, w_.final_cached(w))) {
      Fail(absl::StrCat("worker w", w, ": the batches leave ", ref_.cached(w),
                        " blocks, its engine caches ",
                        w_.final_cached(w).size()));
    }
  }
  CheckIndexState(w_, *index_, &out_->failures);
}

}  // namespace

SequentialCheckResult RunSequentialCheck(
    const FleetWorkload& workload, const std::vector<ScheduledOp>& schedule,
    uint64_t every, const std::function<void(const std::string&)>& progress) {
  SequentialCheckResult out;
  const absl::Time t0 = absl::Now();
  absl::Time last_note = t0;
  QuiescedReplay replay(workload, every, &out);
  for (size_t i = 0; i < schedule.size(); ++i) {
    const ScheduledOp& op = schedule[i];
    if (op.is_query) {
      replay.Query(workload.queries()[op.index]);
    } else {
      replay.Batch(workload.batches()[op.index], op.index);
    }
    if (progress && absl::Now() - last_note > absl::Seconds(5)) {
      last_note = absl::Now();
      progress(absl::StrFormat("sequential check: %.0f%% of the schedule",
                               100.0 * static_cast<double>(i) /
                                   static_cast<double>(schedule.size())));
    }
  }
  replay.Finish();
  out.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  return out;
}

}  // namespace bench
}  // namespace prefixd
