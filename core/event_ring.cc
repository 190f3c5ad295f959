#include "core/event_ring.h"

#include <algorithm>
#include <utility>

namespace prefixd {

void EventRing::Append(Event e) {
  e.sequence = next_++;
  e.order = order_ != nullptr ? order_->fetch_add(1) + 1 : e.sequence;
  bytes_ += Bytes(e);
  ring_.push_back(std::move(e));
  while (ring_.size() > 1 && (ring_.size() > capacity_ ||
                              (max_bytes_ != 0 && bytes_ > max_bytes_))) {
    bytes_ -= Bytes(ring_.front());
    ring_.pop_front();
  }
}

uint64_t EventRing::Bytes(const Event& e) {
  return sizeof(Event) + e.ns.capacity() +
         e.block_ids.capacity() * sizeof(BlockId) +
         e.tokens.capacity() * sizeof(Token);
}

std::vector<Event> EventRing::Read(uint64_t from, size_t max, bool* missed,
                                   uint64_t* next) const {
  if (from == 0) from = 1;
  const uint64_t oldest = ring_.empty() ? next_ : ring_.front().sequence;
  *missed = from < oldest;
  uint64_t start = std::max(from, oldest);
  std::vector<Event> out;
  if (start < next_) {
    size_t i = static_cast<size_t>(start - oldest);
    for (; i < ring_.size() && out.size() < max; ++i) out.push_back(ring_[i]);
    start = out.empty() ? start : out.back().sequence + 1;
  }
  *next = std::max(start, std::min(from, next_));
  return out;
}

}  // namespace prefixd
