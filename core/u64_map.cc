#include "core/u64_map.h"

#include <utility>

namespace prefixd {

bool U64Map::PutAside(uint64_t value, uint64_t* old) {
  const bool had = has_free_key_;
  *old = free_key_value_;
  has_free_key_ = true;
  free_key_value_ = value;
  return had;
}

bool U64Map::EraseAside(uint64_t* value, const uint64_t* only_if) {
  if (!has_free_key_ || (only_if && *only_if != free_key_value_)) return false;
  if (value != nullptr) *value = free_key_value_;
  has_free_key_ = false;
  return true;
}

void U64Map::Grow() {
  std::vector<Slot> old = std::move(slots_);
  const size_t n = old.empty() ? 16 : old.size() * 2;
  slots_.assign(n, Slot{kFree, 0});
  shift_ = 64 - __builtin_ctzll(n);
  for (const Slot& s : old) {
    if (s.key != kFree) slots_[Probe(s.key)] = s;
  }
}

void U64Map::Clear() {
  slots_.clear();
  shift_ = 64;
  size_ = 0;
  has_free_key_ = false;
}

}  // namespace prefixd
