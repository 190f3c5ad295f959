#include "core/leases.h"

#include <cassert>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"

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

absl::Status LeaseTable::CheckInvariants() const {
  for (const auto& [id, lease] : leases_) {
    if (!by_expiry_.contains({lease.expiry, id})) {
      return absl::InternalError(
          absl::StrFormat("lease %016x missing from the expiry order", id));
    }
    if (!by_end_.contains({lease.end, id})) {
      return absl::InternalError(
          absl::StrFormat("lease %016x missing from the end-node index", id));
    }
  }
  if (by_expiry_.size() != leases_.size())
    return absl::InternalError("lease expiry order has extra entries");
  if (by_end_.size() != leases_.size())
    return absl::InternalError("lease end-node index has extra entries");
  return absl::OkStatus();
}

// --- Leases -----------------------------------------------------------------

LeaseId Leases::Add(Node* end, absl::Duration ttl, absl::Time now) {
  const LeaseId id = table_.Add(end, ttl, now);
  blocks_->PinPath(end, +1);
  return id;
}

bool Leases::End(LeaseId id) {
  Node* end = table_.Remove(id);
  if (end == nullptr) return false;
  blocks_->PinPath(end, -1);
  return true;
}

size_t Leases::ExpireUpTo(absl::Time now) {
  size_t n = 0;
  while (const LeaseId id = table_.FirstExpired(now)) {
    End(id);
    ++n;
  }
  return n;
}

void Leases::EndAt(absl::Span<Node* const> nodes) {
  std::vector<LeaseId> ending;
  for (const Node* n : nodes) table_.EndingAt(n, &ending);
  for (LeaseId id : ending) End(id);
}

void Leases::Restore(LeaseId id, Node* end, absl::Duration ttl,
                     absl::Time expiry) {
  blocks_->PinPath(end, +1);
  table_.Restore(id, end, ttl, expiry);
}

absl::Status Leases::CheckInvariants(
    const absl::flat_hash_set<const Node*>& live) const {
  RETURN_IF_ERROR(table_.CheckInvariants());
  // Pins a node must have: one per lease whose end is in its subtree.
  absl::flat_hash_map<const Node*, int32_t> expected;
  for (const auto& [id, lease] : table_.all()) {
    for (const Node* n = lease.end; !n->is_root(); n = n->parent) ++expected[n];
  }
  for (const Node* n : live) {
    auto it = expected.find(n);
    const int32_t want = it == expected.end() ? 0 : it->second;
    if (n->pins != want) {
      return absl::InternalError(absl::StrFormat(
          "node pinned %d times, leases say %d", n->pins, want));
    }
  }
  return absl::OkStatus();
}

}  // namespace prefixd
