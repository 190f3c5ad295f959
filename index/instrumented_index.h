// InstrumentedIndex: a KvIndex that counts what passes through it and
// forwards every call to the index it wraps (as llm-d's
// NewInstrumentedIndex(idx) does): the event lag of each applied batch
// (prefixd_index_event_lag_seconds) and the Routes asked
// (prefixd_index_route_*_total). Its Stats are the wrapped index's with
// those filled in.
//
//   FleetIndex index(options);
//   InstrumentedIndex instrumented(&index);   // hand this one out
//
// Thread safety: as the wrapped index; its own counters are atomics and a
// mutex for the lag histogram.
#ifndef PREFIXD_INDEX_INSTRUMENTED_INDEX_H_
#define PREFIXD_INDEX_INSTRUMENTED_INDEX_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"
#include "index/kv_index.h"

namespace prefixd {

class InstrumentedIndex final : public KvIndex {
 public:
  // `index` must outlive this.
  explicit InstrumentedIndex(KvIndex* index) : index_(index) {}

  const IndexOptions& options() const override { return index_->options(); }
  WorkerId AddWorker(absl::string_view name,
                     absl::string_view endpoint) override {
    return index_->AddWorker(name, endpoint);
  }
  void RetireWorker(WorkerId worker) override { index_->RetireWorker(worker); }
  void SetState(WorkerId worker, WorkerState state,
                absl::string_view detail) override {
    index_->SetState(worker, state, detail);
  }
  void CountGap(WorkerId worker) override { index_->CountGap(worker); }
  void CountReplay(WorkerId worker, bool ok) override {
    index_->CountReplay(worker, ok);
  }
  void ClearWorker(WorkerId worker, ClearReason reason,
                   absl::string_view detail) override {
    index_->ClearWorker(worker, reason, detail);
  }
  void SetLastSeq(WorkerId worker, int64_t seq) override {
    index_->SetLastSeq(worker, seq);
  }
  void SetLabels(WorkerId worker, const WorkerLabels& labels) override {
    index_->SetLabels(worker, labels);
  }
  std::optional<std::string> SetAddress(WorkerId worker,
                                        absl::string_view address) override {
    return index_->SetAddress(worker, address);
  }
  std::optional<std::string> EndpointOf(absl::string_view name) const override {
    return index_->EndpointOf(name);
  }
  void ApplyHashes(WorkerId worker,
                   absl::Span<const HashUpdate> updates) override {
    index_->ApplyHashes(worker, updates);
  }
  void SetGroupRules(WorkerId worker,
                     const std::array<GroupRule, kMaxGroups>& rules) override {
    index_->SetGroupRules(worker, rules);
  }
  RouteResult RouteEngineHashes(absl::Span<const EngineHash> hashes,
                                const WorkerFilter& filter) const override {
    return index_->RouteEngineHashes(hashes, filter);
  }
  std::vector<HashHolding> HashHoldings(
      absl::Span<const EngineHash> hashes) const override {
    return index_->HashHoldings(hashes);
  }

  // Records now - batch.ts in the lag histogram, then applies.
  void Apply(WorkerId worker, const KvEventBatch& batch, int64_t seq,
             absl::Time now) override;
  // Counts the Route and the blocks its best worker holds.
  RouteResult Route(const RouteQuery& query) const override;
  IndexStats Stats() const override;

 private:
  KvIndex* const index_;
  mutable Mutex lag_mu_;
  std::array<uint64_t, kLagBuckets.size() + 1> lag_counts_
      ABSL_GUARDED_BY(lag_mu_) = {};
  double lag_sum_ ABSL_GUARDED_BY(lag_mu_) = 0;
  mutable std::atomic<uint64_t> route_requests_{0};
  mutable std::atomic<uint64_t> route_prompt_blocks_{0};
  mutable std::atomic<uint64_t> route_matched_blocks_{0};
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_INSTRUMENTED_INDEX_H_
