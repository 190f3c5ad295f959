// The group an engine that declares no KV-cache group kinds is routed by
// (docs/index.md, "Hybrid models"). Such an engine's stores and removals
// in that group count as group 0's; its other undeclared groups are
// skipped. The group is the first undeclared one it stores into, or 0 once
// it stores into 0:
//
//   TensorRT-LLM, one named group   group_idx 2 only      -> routed by 2
//   older vLLM, several groups      group_idx 0, 1, ...   -> routed by 0
//
// Kept in WorkerRecord::routed_group.
//
// Thread safety: plain functions; the caller holds the index's lock.
#ifndef PREFIXD_INDEX_ROUTED_GROUP_H_
#define PREFIXD_INDEX_ROUTED_GROUP_H_

#include <cstdint>

#include "index/events.h"
#include "index/worker_registry.h"

namespace prefixd {

// Learns w's routed group from the batch's stores that declare no kind.
void LearnRoutedGroup(const KvEventBatch& batch, WorkerRecord* w);

// The group an event of w counts in: 0 for its routed group (unless the
// event or a store before it declared the group's kind), else its own.
int64_t RoutedGroupOf(const WorkerRecord& w, const BlockStoredEvent& ev);
int64_t RoutedGroupOf(const WorkerRecord& w, const BlockRemovedEvent& ev);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_ROUTED_GROUP_H_
