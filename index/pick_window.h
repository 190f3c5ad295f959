// PickWindow: the prompts Pick sent to each worker lately (docs/index.md,
// "Pick"). Per worker, two tallies of its picks:
//   - load: the picks of the last `load_window` and the prefill tokens they
//     left it, the load the index can see without the router;
//   - churn: the prefill tokens of its picks of the last `churn_window`,
//     how fast Pick has been filling (and so evicting) its cache.
//
// Memory: at most max_picks picks (about 40 bytes each) and an entry per
// worker with a pick in either window; past max_picks the oldest picks
// leave both tallies first.
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
  PickWindow(int64_t load_window_ms, int64_t churn_window_ms, size_t max_picks)
      : horizon_ms_{load_window_ms, churn_window_ms}, max_picks_(max_picks) {}

  struct Load {
    int64_t picks = 0;          // within the load window
    double prefill_tokens = 0;  // theirs
    double churn_tokens = 0;    // of the picks within the churn window
  };
  void Add(absl::string_view worker, int64_t now_ms, double prefill_tokens);
  // What the windows hold for `worker` (call Expire first).
  Load Of(absl::string_view worker) const;
  // Drops the picks older than each window at now_ms.
  void Expire(int64_t now_ms);

  // Picks within the load window.
  size_t picks() const { return picks_.size() - first_[kLoad]; }
  // Picks kept for either window.
  size_t kept() const { return picks_.size(); }
  size_t workers() const { return tallies_.size(); }

 private:
  enum Tally { kLoad = 0, kChurn = 1 };
  struct Counts {
    int64_t picks[2] = {0, 0};  // within each window
    double tokens[2] = {0, 0};
    int64_t kept = 0;  // picks_ entries pointing at it
  };
  using Entry = std::pair<const std::string, Counts>;
  struct Picked {
    int64_t ms;
    double prefill_tokens;
    Entry* worker;  // node_hash_map's nodes do not move
  };
  // Takes picks_[first_[t]] out of tally t.
  void Leave(Tally t);
  void PopFront();

  const int64_t horizon_ms_[2];
  const size_t max_picks_;
  absl::node_hash_map<std::string, Counts> tallies_;  // workers with picks
  // Oldest first; picks_[first_[t]...] are within window t.
  std::deque<Picked> picks_;
  size_t first_[2] = {0, 0};
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_PICK_WINDOW_H_
