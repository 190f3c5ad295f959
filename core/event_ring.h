// The change log a tenant's watchers read: every state change appends an
// Event with the next sequence number to a ring bounded by a count of
// events and by their bytes (one event may carry 65,536 IDs, so a count
// alone bounds nothing). When either bound is passed the oldest events are
// dropped (the newest is always kept); a reader asking for one learns that
// it missed events instead of silently skipping them.
//
// Events of different tenants are ordered by `order`, a cache-wide counter
// taken under the tenant's mutex as the event is appended: a reader that
// merges several rings (the KV event publisher, docs/index.md) publishes a
// block ID's removal from one tenant before its store in another.
#ifndef PREFIXD_CORE_EVENT_RING_H_
#define PREFIXD_CORE_EVENT_RING_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/types.h"

namespace prefixd {

enum class EventType : int {
  kBlockStored = 0,   // block_ids were adopted under parent_block_id
  kBlockRemoved = 1,  // block_ids left the cache for `reason`
  kCleared = 2,       // every tree of the tenant was dropped (Reset)
};

struct Event {
  uint64_t sequence = 0;  // per tenant, from 1, no gaps
  uint64_t order = 0;     // cache-wide append order, from 1 (see above)
  EventType type = EventType::kBlockStored;
  std::string ns;
  // kBlockStored, kBlockRemoved: the blocks. kCleared: every block the reset
  // removed, with CacheOptions::detailed_events (else empty).
  std::vector<BlockId> block_ids;
  bool has_parent = false;  // kBlockStored: false when stored at the root
  BlockId parent_block_id = 0;
  int64_t position = 0;  // kBlockStored: position of the first block
  // kBlockStored: tokens on the tree path before the first block, so that
  // position - prefix_tokens is the Insert's position_offset.
  int64_t prefix_tokens = 0;
  // kBlockStored, with CacheOptions::detailed_events: the stored blocks'
  // tokens, block_size per block (else empty).
  std::vector<Token> tokens;
  EvictReason reason = EvictReason::kBudget;  // kBlockRemoved, kCleared
};

// Thread safety: none; the owning tenant's mutex guards it.
class EventRing {
 public:
  // `order`: the cache-wide counter events take their `order` from (not
  // owned; nullptr: the ring's own sequence numbers).
  // `max_bytes`: the bound on Bytes() of the events kept (0: none).
  explicit EventRing(size_t capacity, std::atomic<uint64_t>* order = nullptr,
                     uint64_t max_bytes = 0)
      : capacity_(capacity == 0 ? 1 : capacity),
        max_bytes_(max_bytes),
        order_(order) {}

  // The memory an event holds: the struct and its arrays.
  static uint64_t Bytes(const Event& e);
  // Bytes() summed over the events kept.
  uint64_t bytes() const { return bytes_; }
  size_t size() const { return ring_.size(); }

  // Assigns the next sequence number and order, and appends.
  void Append(Event e);

  // Events with sequence >= from, at most max. *missed is set when events in
  // [from, first returned) were dropped. *next is where to continue.
  std::vector<Event> Read(uint64_t from, size_t max, bool* missed,
                          uint64_t* next) const;

  uint64_t next_sequence() const { return next_; }
  // Continues numbering at `next` (a restored snapshot); REQUIRES empty.
  void SkipTo(uint64_t next) { next_ = next; }

 private:
  size_t capacity_;
  uint64_t max_bytes_;
  std::atomic<uint64_t>* order_;
  uint64_t bytes_ = 0;
  uint64_t next_ = 1;
  std::deque<Event> ring_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_EVENT_RING_H_
