#include "index/event_tenant.h"

#include <variant>

namespace prefixd {

bool OfAnotherTenant(const WorkerRecord& w, absl::string_view tenant) {
  return !tenant.empty() && tenant != w.labels.Tenant();
}

bool SkipOtherTenants(WorkerRecord& w, const KvEvent& e, DropCounts* drops) {
  const absl::string_view tenant = std::visit(
      [](const auto& ev) -> absl::string_view { return ev.tenant; }, e);
  if (!OfAnotherTenant(w, tenant)) return false;
  ++w.events_by_type[e.index()];
  if (const auto* st = std::get_if<BlockStoredEvent>(&e)) {
    (*drops)[static_cast<int>(DropReason::kOtherTenant)] +=
        st->block_hashes.size();
  }
  return true;
}

}  // namespace prefixd
