// Which of a worker's events are about its own tenant's blocks (docs/index.md,
// "Wire"). RFC #1527's events name their object's tenant_id: Mooncake's
// store master publishes every tenant's objects on one stream, and a
// registration (or source) follows it for one tenant, the worker's label
// (WorkerLabels::Tenant(), "default" when unset). An event naming another
// tenant is skipped: its stores are dropped (DropReason::kOtherTenant), its
// removals and clears are of blocks the worker never held. An event that
// names no tenant (every vLLM, SGLang and TensorRT-LLM event) is the
// worker's.
//
// Thread safety: plain functions; the caller holds the index's lock.
#ifndef PREFIXD_INDEX_EVENT_TENANT_H_
#define PREFIXD_INDEX_EVENT_TENANT_H_

#include "absl/strings/string_view.h"
#include "index/events.h"
#include "index/holder_tree.h"
#include "index/worker_registry.h"

namespace prefixd {

// Whether an event naming `tenant` is about another tenant's object than w's.
bool OfAnotherTenant(const WorkerRecord& w, absl::string_view tenant);

// True when `e` is about another tenant's object than w's: it is then
// counted among w's events by type, and its stored blocks in *drops
// (other_tenant), and the caller skips it.
bool SkipOtherTenants(WorkerRecord& w, const KvEvent& e, DropCounts* drops);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_EVENT_TENANT_H_
