#include "core/leases.h"

#include <cassert>

#include "absl/strings/str_format.h"

namespace prefixd {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

LeaseId LeaseTable::NextId() {
  LeaseId id;
  do {
    id = SplitMix64(&rng_state_);
  } while (id == 0 || leases_.contains(id));
  return id;
}

LeaseId LeaseTable::Add(Node* end, absl::Duration ttl, absl::Time now) {
  const LeaseId id = NextId();
  Restore(id, end, ttl, now + ttl);
  return id;
}

void LeaseTable::Restore(LeaseId id, Node* end, absl::Duration ttl,
                         absl::Time expiry) {
  assert(id != 0 && !leases_.contains(id));
  leases_[id] = LeaseRecord{end, ttl, expiry};
  by_end_.insert({end, id});
  by_expiry_.insert({expiry, id});
}

Node* LeaseTable::Remove(LeaseId id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return nullptr;
  Node* end = it->second.end;
  by_expiry_.erase({it->second.expiry, id});
  by_end_.erase({end, id});
  leases_.erase(it);
  return end;
}

void LeaseTable::Renew(LeaseId id, absl::Time now) {
  LeaseRecord& lease = leases_.at(id);
  by_expiry_.erase({lease.expiry, id});
  lease.expiry = now + lease.ttl;
  by_expiry_.insert({lease.expiry, id});
}

void LeaseTable::EndingAt(const Node* n, std::vector<LeaseId>* out) const {
  for (auto it = by_end_.lower_bound({n, 0});
       it != by_end_.end() && it->first == n; ++it) {
    out->push_back(it->second);
  }
}

void LeaseTable::Clear() {
  leases_.clear();
  by_expiry_.clear();
  by_end_.clear();
}

bool LeaseTable::CheckInvariants(std::string* error) const {
  for (const auto& [id, lease] : leases_) {
    if (!by_expiry_.contains({lease.expiry, id})) {
      *error = absl::StrFormat("lease %016x missing from the expiry order", id);
      return false;
    }
    if (!by_end_.contains({lease.end, id})) {
      *error =
          absl::StrFormat("lease %016x missing from the end-node index", id);
      return false;
    }
  }
  if (by_expiry_.size() != leases_.size()) {
    *error = "lease expiry order has extra entries";
    return false;
  }
  if (by_end_.size() != leases_.size()) {
    *error = "lease end-node index has extra entries";
    return false;
  }
  return true;
}

}  // namespace prefixd
