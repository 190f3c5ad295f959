#include "index/routed_group.h"

#include <cstddef>
#include <variant>

#include "index/group_rules.h"

namespace prefixd {
namespace {

// A plain store that declares no kind for its group, in a group no store
// of the worker declared either.
bool Undeclared(const WorkerRecord& w, const BlockStoredEvent& ev) {
  const int64_t g = ev.group_idx;
  return g >= 0 && g < kMaxGroups && ev.kv_cache_spec_kind.empty() &&
         ev.components == 0 && !ev.from_object_key && !ev.placeholder &&
         !ev.sparse &&
         w.groups[static_cast<size_t>(g)].kind == GroupKind::kNone;
}

}  // namespace

void LearnRoutedGroup(const KvEventBatch& batch, WorkerRecord* w) {
  for (const KvEvent& e : batch.events) {
    const auto* st = std::get_if<BlockStoredEvent>(&e);
    if (st == nullptr || !Undeclared(*w, *st)) continue;
    if (w->routed_group < 0 || st->group_idx == 0)
      w->routed_group = static_cast<int>(st->group_idx);
  }
}

int64_t RoutedGroupOf(const WorkerRecord& w, const BlockStoredEvent& ev) {
  return ev.group_idx > 0 && ev.group_idx == w.routed_group && Undeclared(w, ev)
             ? 0
             : ev.group_idx;
}

int64_t RoutedGroupOf(const WorkerRecord& w, const BlockRemovedEvent& ev) {
  return ev.group_idx > 0 && ev.group_idx == w.routed_group &&
                 w.groups[static_cast<size_t>(ev.group_idx)].kind ==
                     GroupKind::kNone
             ? 0
             : ev.group_idx;
}

}  // namespace prefixd
