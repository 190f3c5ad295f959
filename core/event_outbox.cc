#include "core/event_outbox.h"

#include <utility>

namespace prefixd {

void EventOutbox::LogStored(const Tree& tree, std::optional<BlockId> parent,
                            absl::Span<const Token> tokens,
                            absl::Span<const BlockId> ids, int64_t position,
                            int64_t prefix_tokens) {
  Event e;
  e.type = EventType::kBlockStored;
  e.ns = tree.ns;
  e.block_ids.assign(ids.begin(), ids.end());
  e.position = position;
  e.prefix_tokens = prefix_tokens;
  if (detailed_) e.tokens.assign(tokens.begin(), tokens.end());
  e.has_parent = parent.has_value();
  e.parent_block_id = parent.value_or(0);
  ring_.Append(std::move(e));
}

void EventOutbox::NoteRemoved(const Tree& tree, absl::Span<const BlockId> ids,
                              EvictReason reason) {
  if (ids.empty()) return;
  if (pending_removals_.empty() || pending_removals_.back().tree != &tree ||
      pending_removals_.back().reason != reason) {
    pending_removals_.push_back({&tree, tree.ns, reason, {}});
  }
  // One at a time: the vector grows as it always has, and EventRing counts
  // its capacity against event_ring_bytes.
  std::vector<BlockId>& pending = pending_removals_.back().ids;
  for (BlockId id : ids) pending.push_back(id);
}

void EventOutbox::FlushRemovals() {
  for (PendingRemoval& p : pending_removals_) {
    Event e;
    e.type = EventType::kBlockRemoved;
    e.ns = std::move(p.ns);
    e.block_ids = std::move(p.ids);
    e.reason = p.reason;
    ring_.Append(std::move(e));
  }
  pending_removals_.clear();
}

void EventOutbox::LogCleared(absl::Span<const BlockId> removed) {
  pending_removals_.clear();
  Event e;
  e.type = EventType::kCleared;
  e.reason = EvictReason::kReset;
  if (detailed_) e.block_ids.assign(removed.begin(), removed.end());
  ring_.Append(std::move(e));
}

void EventOutbox::TakeParked(std::vector<BlockId>* out) {
  out->insert(out->end(), parked_.begin(), parked_.end());
  parked_.clear();
}

}  // namespace prefixd
