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
  assert(capacity > 0 && capacity < kNone - 2);
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

void ShadowCache::EvictOne() {
  uint32_t list = 0;
  if (rule_ == Rule::kLirs && (sizes_[0] <= probation_ || sizes_[0] == 0))
    list = sizes_[1] > 0 ? 1 : 0;
  const uint32_t victim = slab_[list].next;  // the least recent
  assert(victim > 1);
  Unlink(victim);
  const uint64_t fp = slab_[victim].fp;
  index_.Erase(fp);
  if (rule_ == Rule::kLirs) ghosts_.Push(0, fp);
  free_.push_back(victim);
}

bool ShadowCache::Access(uint64_t fp) {
  if (const uint64_t* slot = index_.Find(fp)) {
    const uint32_t s = static_cast<uint32_t>(*slot);
    Unlink(s);
    Link(s, rule_ == Rule::kLirs ? 1 : 0);
    return true;
  }
  if (size() == capacity_) EvictOne();
  uint32_t s;
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
  const bool again = rule_ == Rule::kLirs && ghosts_.Take(fp) == 0;
  Link(s, again ? 1 : 0);
  return false;
}

void ShadowCache::Clear() {
  slab_.assign(2, Entry{});
  for (uint32_t list = 0; list < 2; ++list) {
    slab_[list] = Entry{0, list, list, list};
    sizes_[list] = 0;
  }
  free_.clear();
  index_.Clear();
  ghosts_.Clear();
}

absl::Status ShadowCache::CheckInvariants() const {
  uint64_t seen = 0;
  for (uint32_t list = 0; list < 2; ++list) {
    uint64_t n = 0;
    for (uint32_t s = slab_[list].next; s != list; s = slab_[s].next) {
      const uint64_t* slot = index_.Find(slab_[s].fp);
      if (slot == nullptr || *slot != s || slab_[s].list != list ||
          slab_[slab_[s].next].prev != s || ++n > capacity_) {
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
  if (seen > capacity_ || seen != index_.size() ||
      seen + free_.size() + 2 != slab_.size() ||
      (rule_ == Rule::kLru && sizes_[1] != 0)) {
    return absl::InternalError(absl::StrFormat(
        "shadow holds %d of %d, its map %d, its slab %d with %d free", seen,
        capacity_, index_.size(), slab_.size(), free_.size()));
  }
  return ghosts_.CheckInvariants();
}

}  // namespace prefixd
