#include "bench/belady.h"

#include <cstddef>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

namespace prefixd {
namespace bench {
namespace {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// next[i]: the index of the next request that holds trace.ids[i], or kNever.
std::vector<uint64_t> NextUses(const Trace& trace) {
  std::vector<uint64_t> next(trace.ids.size(), kNever);
  std::vector<uint64_t> seen(trace.max_id + 1, kNever);
  for (size_t r = trace.requests.size(); r-- > 0;) {
    const Request& q = trace.requests[r];
    for (size_t i = q.first; i < q.first + q.blocks; ++i) {
      next[i] = seen[trace.ids[i]];
      seen[trace.ids[i]] = r;
    }
  }
  return next;
}

struct Block {
  uint64_t next_use = kNever;  // as of the last request that held it
  uint32_t cached_children = 0;
  uint32_t on_path = 0;  // the request being replayed holds it
  uint64_t parent = kNever;
  bool cached = false;
};

class Replay {
 public:
  Replay(const Trace& trace, uint64_t capacity)
      : trace_(trace),
        capacity_(capacity),
        next_(NextUses(trace)),
        blocks_(trace.max_id + 1) {}

  ReplayCounts Run() {
    for (size_t r = 0; r < trace_.requests.size(); ++r)
      Step(trace_.requests[r]);
    return counts_;
  }

 private:
  // Victim candidates, farthest next use first; an entry is stale when its
  // block is gone, has a cached child or was used since (checked on pop).
  using Entry = std::pair<uint64_t, uint64_t>;  // (next use, id)

  void Offer(uint64_t id) {
    const Block& b = blocks_[id];
    if (b.cached && b.cached_children == 0) heap_.push({b.next_use, id});
  }

  void Step(const Request& q) {
    const uint64_t* ids = trace_.ids.data() + q.first;
    counts_.blocks += q.blocks;
    size_t hit = 0;
    while (hit < q.blocks && blocks_[ids[hit]].cached) ++hit;
    counts_.hit_blocks += hit;
    for (size_t i = 0; i < q.blocks; ++i)
      blocks_[ids[i]].next_use = next_[q.first + i];
    if (q.blocks > capacity_) {
      ++counts_.refused_inserts;
      if (hit > 0) Offer(ids[hit - 1]);  // its key changed
      return;
    }
    for (size_t i = hit; i < q.blocks; ++i) {
      Block& b = blocks_[ids[i]];
      b.cached = true;
      b.parent = i == 0 ? kNever : ids[i - 1];
      if (i > 0) ++blocks_[ids[i - 1]].cached_children;
      ++cached_;
    }
    if (q.blocks > 0) Offer(ids[q.blocks - 1]);
    for (size_t i = 0; i < q.blocks; ++i) ++blocks_[ids[i]].on_path;
    EvictOverCapacity();
    for (size_t i = 0; i < q.blocks; ++i) --blocks_[ids[i]].on_path;
  }

  void EvictOverCapacity() {
    std::vector<uint64_t> skipped;  // on the path: offered again after
    while (cached_ > capacity_) {
      const Entry top = heap_.top();
      heap_.pop();
      Block& b = blocks_[top.second];
      if (!b.cached || b.cached_children != 0 || b.next_use != top.first)
        continue;
      if (b.on_path) {
        skipped.push_back(top.second);
        continue;
      }
      b.cached = false;
      --cached_;
      ++counts_.evicted_blocks;
      if (b.parent != kNever && --blocks_[b.parent].cached_children == 0)
        Offer(b.parent);
    }
    for (uint64_t id : skipped) Offer(id);
  }

  const Trace& trace_;
  const uint64_t capacity_;
  const std::vector<uint64_t> next_;
  std::vector<Block> blocks_;
  std::priority_queue<Entry> heap_;
  uint64_t cached_ = 0;
  ReplayCounts counts_;
};

}  // namespace

ReplayCounts ReplayBelady(const Trace& trace, uint64_t capacity) {
  return Replay(trace, capacity).Run();
}

}  // namespace bench
}  // namespace prefixd
