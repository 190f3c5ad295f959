#include "index/predicted_holds.h"

#include <algorithm>

namespace prefixd {

uint64_t PredictedHolds::Slot(uint64_t worker, uint64_t key) {
  // The worker tag and the key are both hashes; a multiply spreads the tag
  // so that (w, k) and (w', k') meet only by chance (2^-64).
  return key ^ (worker * 0x9E3779B97F4A7C15ull);
}

void PredictedHolds::Add(uint64_t worker, absl::Span<const uint64_t> keys,
                         int64_t expiry_ms) {
  for (uint64_t key : keys) {
    const uint64_t slot = Slot(worker, key);
    auto [it, inserted] = expiry_.try_emplace(slot, expiry_ms);
    if (!inserted) it->second = std::max(it->second, expiry_ms);
    order_.push_back({slot, expiry_ms});
  }
  while (expiry_.size() > max_entries_ || order_.size() > 2 * max_entries_)
    PopFront();
}

size_t PredictedHolds::Run(uint64_t worker, absl::Span<const uint64_t> keys,
                           size_t from, int64_t now_ms) const {
  if (expiry_.empty()) return 0;
  size_t i = from;
  for (; i < keys.size(); ++i) {
    auto it = expiry_.find(Slot(worker, keys[i]));
    if (it == expiry_.end() || it->second <= now_ms) break;
  }
  return i - from;
}

void PredictedHolds::Expire(int64_t now_ms) {
  while (!order_.empty() && order_.front().expiry_ms <= now_ms) PopFront();
}

void PredictedHolds::PopFront() {
  const Queued q = order_.front();
  order_.pop_front();
  auto it = expiry_.find(q.slot);
  // Not when a later Add extended it: its own queue entry removes it.
  if (it != expiry_.end() && it->second == q.expiry_ms) expiry_.erase(it);
}

}  // namespace prefixd
