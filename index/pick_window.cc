#include "index/pick_window.h"

namespace prefixd {

void PickWindow::Add(absl::string_view worker, int64_t now_ms,
                     double prefill_tokens) {
  auto it = loads_.find(worker);
  if (it == loads_.end())
    it = loads_.emplace(std::string(worker), Load()).first;
  it->second.picks += 1;
  it->second.prefill_tokens += prefill_tokens;
  picks_.push_back({now_ms, prefill_tokens, &*it});
  while (picks_.size() > max_picks_) PopFront();
}

PickWindow::Load PickWindow::Of(absl::string_view worker) const {
  auto it = loads_.find(worker);
  return it == loads_.end() ? Load() : it->second;
}

void PickWindow::Expire(int64_t now_ms) {
  while (!picks_.empty() && picks_.front().ms <= now_ms - window_ms_)
    PopFront();
}

void PickWindow::PopFront() {
  const Picked p = picks_.front();
  picks_.pop_front();
  Load& load = p.worker->second;
  load.picks -= 1;
  load.prefill_tokens -= p.prefill_tokens;
  // No other pick points at it: the map forgets workers with none.
  if (load.picks == 0) loads_.erase(loads_.find(p.worker->first));
}

}  // namespace prefixd
