#include "core/u64_map.h"

#include <utility>

namespace prefixd {

size_t U64Map::Probe(uint64_t key) const {
  const size_t mask = slots_.size() - 1;
  size_t i = Home(key);
  while (slots_[i].key != kFree && slots_[i].key != key) i = (i + 1) & mask;
  return i;
}

const uint64_t* U64Map::Find(uint64_t key) const {
  if (key == kFree) return has_free_key_ ? &free_key_value_ : nullptr;
  if (slots_.empty()) return nullptr;
  const Slot& s = slots_[Probe(key)];
  return s.key == key ? &s.value : nullptr;
}

bool U64Map::Put(uint64_t key, uint64_t value, uint64_t* old) {
  if (key == kFree) {
    const bool had = has_free_key_;
    *old = free_key_value_;
    has_free_key_ = true;
    free_key_value_ = value;
    return had;
  }
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

bool U64Map::Erase(uint64_t key, uint64_t* value, const uint64_t* only_if) {
  if (key == kFree) {
    if (!has_free_key_ || (only_if && *only_if != free_key_value_))
      return false;
    if (value != nullptr) *value = free_key_value_;
    has_free_key_ = false;
    return true;
  }
  if (slots_.empty()) return false;
  size_t hole = Probe(key);
  if (slots_[hole].key != key || (only_if && *only_if != slots_[hole].value))
    return false;
  if (value != nullptr) *value = slots_[hole].value;
  // Backward shift: an entry after the hole moves into it unless its home
  // lies cyclically in (hole, its slot].
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
