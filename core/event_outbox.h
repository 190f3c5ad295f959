// EventOutbox: what one tenant owes its clients, gathered while a call runs
// and handed out when it ends.
//
//   - Events for its watchers (EventRing). A call's stores go to the ring
//     as they happen; its removals are gathered and logged at the end of
//     the call (FlushRemovals), one event per run of one namespace and
//     reason, so that a call that evicts a thousand blocks logs one event.
//   - Parked IDs for its engine: blocks of this tenant that a call by a
//     principal who may not act for it evicted (the budget is shared). They
//     wait here, so that no response carries another tenant's IDs, and go
//     out exactly once, with this tenant's next Insert, Evict or Reset.
//
// Thread safety: none; the owning tenant's mutex guards it.
#ifndef PREFIXD_CORE_EVENT_OUTBOX_H_
#define PREFIXD_CORE_EVENT_OUTBOX_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "core/cache_types.h"
#include "core/event_ring.h"
#include "core/radix_tree.h"
#include "core/types.h"

namespace prefixd {

class EventOutbox {
 public:
  // `event_order`: the cache-wide counter of Event::order (EventRing).
  EventOutbox(const CacheOptions& options, std::atomic<uint64_t>* event_order)
      : detailed_(options.detailed_events),
        ring_(options.events_per_tenant, event_order,
              options.event_ring_bytes) {}

  const EventRing& ring() const { return ring_; }

  // Blocks `ids` were stored below `parent` (nullopt: at the root).
  // `tokens`: theirs (kept with CacheOptions::detailed_events);
  // `prefix_tokens`: the tokens before them on the path.
  void LogStored(const Tree& tree, std::optional<BlockId> parent,
                 absl::Span<const Token> tokens, absl::Span<const BlockId> ids,
                 int64_t position, int64_t prefix_tokens);
  // Blocks `ids`, in that order, left `tree` for `reason`; logged by
  // FlushRemovals.
  void NoteRemoved(const Tree& tree, absl::Span<const BlockId> ids,
                   EvictReason reason);
  // Logs the removals noted since the last flush. `tree` pointers are only
  // compared, never followed: a tree may be gone by then.
  void FlushRemovals();
  // Every tree was dropped (Reset), with these blocks: the noted removals
  // are part of it and are not logged apart.
  void LogCleared(absl::Span<const BlockId> removed);
  // Continues the ring's numbering at `next` (a restored snapshot).
  void ContinueAt(uint64_t next) { ring_.SkipTo(next); }

  void Park(BlockId id) { parked_.push_back(id); }
  // Appends the parked IDs to *out and forgets them.
  void TakeParked(std::vector<BlockId>* out);
  const std::vector<BlockId>& parked() const { return parked_; }
  // The parked IDs of a restored snapshot. REQUIRES: none parked.
  void RestoreParked(std::vector<BlockId> ids) { parked_ = std::move(ids); }

 private:
  struct PendingRemoval {
    const Tree* tree;
    std::string ns;
    EvictReason reason;
    std::vector<BlockId> ids;
  };

  const bool detailed_;
  EventRing ring_;
  std::vector<PendingRemoval> pending_removals_;
  std::vector<BlockId> parked_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_EVENT_OUTBOX_H_
