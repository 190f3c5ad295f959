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
// ADAPTIVE's replay time (docs/performance.md).
//
// Thread safety: none (a plain container).
class U64Map {
 public:
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
  static constexpr uint64_t kFree = ~uint64_t{0};  // a key, kept aside
  size_t Home(uint64_t key) const {
    return static_cast<size_t>((key * 0x9e3779b97f4a7c15ULL) >> shift_);
  }
  // The slot holding key, or the free slot where it would go.
  size_t Probe(uint64_t key) const;
  void Grow();

  std::vector<Slot> slots_;  // a power of two of them, or none
  int shift_ = 64;           // 64 - log2(slots_.size())
  size_t size_ = 0;
  bool has_free_key_ = false;  // the entry of key kFree
  uint64_t free_key_value_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_U64_MAP_H_
