// PredictedHolds: the blocks of the prompts Pick sent to a worker
// (docs/index.md, "Pick"). A prompt picked for a worker is computed there
// within a few hundred milliseconds, but its BlockStored events arrive
// later; until they do, a sibling prompt would not see the worker holds its
// prefix and could be sent elsewhere. Each entry says "worker W holds the
// block with rolling key K until time T"; which blocks get entries is the
// caller's rule (Picker::Record). Route never reports them.
//
// Memory: at most max_entries entries (about 40 bytes each with the
// expiry queue); past it the oldest go first.
//
// Thread safety: none; its owner (Picker) locks.
#ifndef PREFIXD_INDEX_PREDICTED_HOLDS_H_
#define PREFIXD_INDEX_PREDICTED_HOLDS_H_

#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace prefixd {

class PredictedHolds {
 public:
  explicit PredictedHolds(size_t max_entries) : max_entries_(max_entries) {}

  // Counts the blocks keyed `keys` as held by `worker` (a tag, e.g. a hash
  // of its name) until expiry_ms; an entry already there gets the later
  // expiry.
  void Add(uint64_t worker, absl::Span<const uint64_t> keys, int64_t expiry_ms);
  // How many of keys[from], keys[from + 1], ... in a row `worker` is
  // predicted to hold at now_ms.
  size_t Run(uint64_t worker, absl::Span<const uint64_t> keys, size_t from,
             int64_t now_ms) const;
  // Drops the entries that lapsed by now_ms.
  void Expire(int64_t now_ms);

  size_t size() const { return expiry_.size(); }

 private:
  // One map key per (worker, block).
  static uint64_t Slot(uint64_t worker, uint64_t key);
  void PopFront();

  struct Queued {
    uint64_t slot;
    int64_t expiry_ms;
  };
  const size_t max_entries_;
  absl::flat_hash_map<uint64_t, int64_t> expiry_;  // slot -> expiry
  // Every Add in order (and so by expiry, the TTL being one); an entry
  // whose expiry was extended later is here twice, the older one stale.
  std::deque<Queued> order_;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_PREDICTED_HOLDS_H_
