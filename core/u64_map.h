// U64Map: a hash map from uint64 to uint64 for the eviction history
// (eviction_history.h), whose steady churn std and abseil maps handle badly.
#ifndef PREFIXD_CORE_U64_MAP_H_
#define PREFIXD_CORE_U64_MAP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace prefixd {

// A map from uint64 to uint64: open addressing, linear probing, Fibonacci
// hashing and backward-shift deletion, so that the history's steady churn
// (an insert and an erase per evicted block) leaves no tombstones to probe
// past or to clean up by rehashing. Load at most 1/2: most probes are
// misses (a new block's fingerprint is rarely in the history), and a miss
// or an erase scans the whole cluster, which at 3/4 cost a third of
// ADAPTIVE's replay time (docs/performance.md). Find, Put and Erase are
// inline: the history and the shadows call them once or twice per block,
// and a call costs about as much as a short probe.
//
// Thread safety: none (a plain container).
class U64Map {
 public:
  // The key kept aside (not in the slots): Find, Put and Erase of it probe
  // nothing.
  static constexpr uint64_t kAsideKey = ~uint64_t{0};

  size_t size() const { return size_; }
  const uint64_t* Find(uint64_t key) const;
  // Inserts, or replaces and returns true with the old value in *old.
  bool Put(uint64_t key, uint64_t value, uint64_t* old);
  // Removes key if present (and, with `only_if`, its value is that one);
  // true, with its value in *value if not null, if it did.
  bool Erase(uint64_t key, uint64_t* value = nullptr,
             const uint64_t* only_if = nullptr);
  void Clear();
  // Fetches the slot where key's probe starts into the CPU caches.
  void Prefetch(uint64_t key) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[Home(key)]);
  }

 private:
  struct Slot {
    uint64_t key, value;
  };
  static constexpr uint64_t kFree = kAsideKey;  // marks a free slot
  size_t Home(uint64_t key) const {
    return static_cast<size_t>((key * 0x9e3779b97f4a7c15ULL) >> shift_);
  }
  // The slot holding key, or the free slot where it would go.
  size_t Probe(uint64_t key) const;
  bool PutAside(uint64_t value, uint64_t* old);
  bool EraseAside(uint64_t* value, const uint64_t* only_if);
  // Empties slot `hole`, moving later entries of its cluster back.
  void ShiftBack(size_t hole);
  void Grow();

  std::vector<Slot> slots_;  // a power of two of them, or none
  int shift_ = 64;           // 64 - log2(slots_.size())
  size_t size_ = 0;
  bool has_free_key_ = false;  // the entry of key kFree
  uint64_t free_key_value_ = 0;
};

inline size_t U64Map::Probe(uint64_t key) const {
  const size_t mask = slots_.size() - 1;
  size_t i = Home(key);
  while (slots_[i].key != kFree && slots_[i].key != key) i = (i + 1) & mask;
  return i;
}

inline const uint64_t* U64Map::Find(uint64_t key) const {
  if (key == kFree) return has_free_key_ ? &free_key_value_ : nullptr;
  if (slots_.empty()) return nullptr;
  const Slot& s = slots_[Probe(key)];
  return s.key == key ? &s.value : nullptr;
}

inline bool U64Map::Put(uint64_t key, uint64_t value, uint64_t* old) {
  if (key == kFree) return PutAside(value, old);
  if ((size_ + 1) * 2 > slots_.size()) Grow();
  Slot& s = slots_[Probe(key)];
  if (s.key == key) {
    *old = s.value;
    s.value = value;
    return true;
  }
  s = Slot{key, value};
  ++size_;
  return false;
}

// Backward shift: an entry after the hole moves into it unless its home
// lies cyclically in (hole, its slot].
inline void U64Map::ShiftBack(size_t hole) {
  const size_t mask = slots_.size() - 1;
  for (size_t j = (hole + 1) & mask; slots_[j].key != kFree;
       j = (j + 1) & mask) {
    if (((j - Home(slots_[j].key)) & mask) >= ((j - hole) & mask)) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].key = kFree;
  --size_;
}

inline bool U64Map::Erase(uint64_t key, uint64_t* value,
                          const uint64_t* only_if) {
  if (key == kFree) return EraseAside(value, only_if);
  if (slots_.empty()) return false;
  const size_t hole = Probe(key);
  if (slots_[hole].key != key || (only_if && *only_if != slots_[hole].value))
    return false;
  if (value != nullptr) *value = slots_[hole].value;
  ShiftBack(hole);
  return true;
}

}  // namespace prefixd

#endif  // PREFIXD_CORE_U64_MAP_H_
