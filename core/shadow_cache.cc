#include "core/shadow_cache.h"

#include <cassert>

#include "absl/strings/str_format.h"

namespace prefixd {

ShadowCache::ShadowCache(Rule rule, uint64_t capacity, uint64_t probation,
                         uint64_t ghosts)
    : rule_(rule),
      capacity_(capacity),
      probation_(probation),
      ghosts_(rule == Rule::kLirs ? ghosts : 0) {
  assert(capacity > 0 && capacity + ghosts_ < kNone - kLists);
  Clear();
}

void ShadowCache::Link(uint32_t slot, uint32_t list) {
  Entry& e = slab_[slot];
  Entry& head = slab_[list];
  e.list = list;
  e.next = list;
  e.prev = head.prev;
  slab_[head.prev].next = slot;
  head.prev = slot;
  ++sizes_[list];
}

void ShadowCache::Unlink(uint32_t slot) {
  Entry& e = slab_[slot];
  slab_[e.prev].next = e.next;
  slab_[e.next].prev = e.prev;
  --sizes_[e.list];
}

void ShadowCache::Forget(uint32_t slot) {
  Unlink(slot);
  index_.Erase(slab_[slot].fp);
  free_.push_back(slot);
}

void ShadowCache::EvictOne() {
  uint32_t list = kProbation;
  if (rule_ == Rule::kLirs && sizes_[kProbation] <= probation_ &&
      sizes_[kProtected] > 0)
    list = kProtected;
  const uint32_t victim = slab_[list].next;  // the least recent
  assert(victim >= kLists);
  if (ghosts_ == 0) {
    Forget(victim);
    return;
  }
  Unlink(victim);
  Link(victim, kGhost);
  if (sizes_[kGhost] > ghosts_) Forget(slab_[kGhost].next);
}

bool ShadowCache::Access(uint64_t fp) {
  const uint64_t* found = index_.Find(fp);
  if (found != nullptr && slab_[*found].list != kGhost) {
    const uint32_t s = static_cast<uint32_t>(*found);
    Unlink(s);
    Link(s, rule_ == Rule::kLirs ? kProtected : kProbation);
    return true;
  }
  // A miss. A ghost leaves the ghost list before the eviction can push
  // its oldest out, and comes back protected.
  uint32_t s = kNone;
  if (found != nullptr) {
    s = static_cast<uint32_t>(*found);
    Unlink(s);
  }
  if (size() == capacity_) EvictOne();
  if (s != kNone) {
    Link(s, kProtected);
    return false;
  }
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    s = static_cast<uint32_t>(slab_.size());
    slab_.push_back({});
  }
  slab_[s].fp = fp;
  uint64_t old;
  index_.Put(fp, s, &old);
  Link(s, kProbation);
  return false;
}

void ShadowCache::Clear() {
  slab_.assign(kLists, Entry{});
  for (uint32_t list = 0; list < kLists; ++list) {
    slab_[list] = Entry{0, list, list, list};
    sizes_[list] = 0;
  }
  free_.clear();
  index_.Clear();
}

absl::Status ShadowCache::CheckInvariants() const {
  uint64_t seen = 0;
  for (uint32_t list = 0; list < kLists; ++list) {
    uint64_t n = 0;
    for (uint32_t s = slab_[list].next; s != list; s = slab_[s].next) {
      const uint64_t* slot = index_.Find(slab_[s].fp);
      if (slot == nullptr || *slot != s || slab_[s].list != list ||
          slab_[slab_[s].next].prev != s || ++n > capacity_ + ghosts_) {
        return absl::InternalError(
            absl::StrFormat("shadow list %d is broken at slot %d", list, s));
      }
    }
    if (n != sizes_[list]) {
      return absl::InternalError(absl::StrFormat(
          "shadow list %d holds %d, counted %d", list, n, sizes_[list]));
    }
    seen += n;
  }
  if (size() > capacity_ || sizes_[kGhost] > ghosts_ || seen != index_.size() ||
      seen + free_.size() + kLists != slab_.size() ||
      (rule_ == Rule::kLru && sizes_[kProtected] != 0)) {
    return absl::InternalError(absl::StrFormat(
        "shadow holds %d of %d and %d ghosts of %d, its map %d, its slab %d "
        "with %d free",
        size(), capacity_, sizes_[kGhost], ghosts_, index_.size(), slab_.size(),
        free_.size()));
  }
  return absl::OkStatus();
}

}  // namespace prefixd
