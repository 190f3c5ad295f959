// PickWindow: the prompts Pick sent to each worker lately, as the load the
// index can see without the router (docs/index.md, "Pick"): per worker,
// the picks of the last `window` and the prefill tokens they left it.
//
// Memory: at most max_picks picks (about 40 bytes each) and an entry per
// worker with a pick in the window; past it the oldest picks go first.
//
// Thread safety: none; its owner (Picker) locks.
#ifndef PREFIXD_INDEX_PICK_WINDOW_H_
#define PREFIXD_INDEX_PICK_WINDOW_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/container/node_hash_map.h"
#include "absl/strings/string_view.h"

namespace prefixd {

class PickWindow {
 public:
  PickWindow(int64_t window_ms, size_t max_picks)
      : window_ms_(window_ms), max_picks_(max_picks) {}

  struct Load {
    int64_t picks = 0;
    double prefill_tokens = 0;
  };
  void Add(absl::string_view worker, int64_t now_ms, double prefill_tokens);
  // What the window holds for `worker` (call Expire first).
  Load Of(absl::string_view worker) const;
  // Drops the picks older than the window at now_ms.
  void Expire(int64_t now_ms);

  size_t picks() const { return picks_.size(); }
  size_t workers() const { return loads_.size(); }

 private:
  using Entry = std::pair<const std::string, Load>;
  struct Picked {
    int64_t ms;
    double prefill_tokens;
    Entry* worker;  // node_hash_map's nodes do not move
  };
  void PopFront();

  const int64_t window_ms_;
  const size_t max_picks_;
  absl::node_hash_map<std::string, Load> loads_;  // workers with picks only
  std::deque<Picked> picks_;                      // oldest first
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_PICK_WINDOW_H_
