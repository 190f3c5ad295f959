#include "index/pick_window.h"

namespace prefixd {

void PickWindow::Add(absl::string_view worker, int64_t now_ms,
                     double prefill_tokens) {
  auto it = tallies_.find(worker);
  if (it == tallies_.end())
    it = tallies_.emplace(std::string(worker), Counts()).first;
  Counts& c = it->second;
  for (int t = 0; t < 2; ++t) {
    c.picks[t] += 1;
    c.tokens[t] += prefill_tokens;
  }
  c.kept += 1;
  picks_.push_back({now_ms, prefill_tokens, &*it});
  while (picks_.size() > max_picks_) PopFront();
}

PickWindow::Load PickWindow::Of(absl::string_view worker) const {
  auto it = tallies_.find(worker);
  if (it == tallies_.end()) return Load();
  const Counts& c = it->second;
  return Load{c.picks[kLoad], c.tokens[kLoad], c.tokens[kChurn]};
}

void PickWindow::Leave(Tally t) {
  const Picked& p = picks_[first_[t]++];
  Counts& c = p.worker->second;
  c.picks[t] -= 1;
  // A tally of no picks is exactly 0, whatever rounding the sums kept.
  c.tokens[t] = c.picks[t] == 0 ? 0 : c.tokens[t] - p.prefill_tokens;
}

void PickWindow::Expire(int64_t now_ms) {
  for (Tally t : {kLoad, kChurn}) {
    while (first_[t] < picks_.size() &&
           picks_[first_[t]].ms <= now_ms - horizon_ms_[t]) {
      Leave(t);
    }
  }
  while (!picks_.empty() && first_[kLoad] > 0 && first_[kChurn] > 0) PopFront();
}

void PickWindow::PopFront() {
  for (Tally t : {kLoad, kChurn}) {
    if (first_[t] == 0) Leave(t);
    first_[t] -= 1;
  }
  const Picked p = picks_.front();
  picks_.pop_front();
  // No other pick points at it: the map forgets workers with none.
  if (--p.worker->second.kept == 0)
    tallies_.erase(tallies_.find(p.worker->first));
}

}  // namespace prefixd
