// SeqTracker: what to do with a batch, given its sequence number and what a
// stream has applied so far. Publishers number their batches 0, 1, 2, ...
// (vLLM: per publisher, from 0 at every start).
//
//   last applied 41, batch 42      -> kApply
//   last applied 41, batch 45      -> kGap (replay 42..44 first)
//   replayed 42..47, then 43 on PUB -> kDuplicate (the replay had it)
//   last applied 41, batch 3        -> kRestart (the engine started over)
#ifndef PREFIXD_INDEX_SEQUENCE_H_
#define PREFIXD_INDEX_SEQUENCE_H_

#include <cstdint>

namespace prefixd {

class SeqTracker {
 public:
  enum class Verdict { kApply, kGap, kDuplicate, kRestart };

  // `seq` >= 0. Compared as seq - 1 against last_, so that a stream at
  // INT64_MAX never wraps (a next batch can then only be a restart).
  Verdict Classify(int64_t seq) const {
    if (last_ < 0 || seq - 1 == last_) return Verdict::kApply;
    if (seq - 1 > last_) return Verdict::kGap;
    // Batches a replay delivered may also arrive on the PUB socket, which
    // queued them meanwhile; anything older is a new run of numbers.
    if (seq > floor_) return Verdict::kDuplicate;
    return Verdict::kRestart;
  }

  // A batch from the PUB socket was applied (or consumed): PUB delivers in
  // order, so nothing older can follow as a duplicate.
  void Applied(int64_t seq) { last_ = floor_ = seq; }
  // A replay is about to apply batches after last(); until the next PUB
  // batch, PUB copies of them are duplicates.
  void BeginReplay() { floor_ = last_; }
  void ReplayApplied(int64_t seq) { last_ = seq; }
  void Reset() { last_ = floor_ = -1; }
  int64_t last() const { return last_; }

 private:
  int64_t last_ = -1;   // the last batch applied; -1: none
  int64_t floor_ = -1;  // batches numbered <= floor_ mean a restart
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_SEQUENCE_H_
