// Picker: which worker should serve a prompt (PrefixIndex/Pick;
// docs/index.md, "Pick"). Route says how much of the prompt each worker
// holds; Pick turns that and the workers' load into one cost per
// candidate, in prompt tokens, and chooses the cheapest:
//
//   credited_w = tier-weighted leading blocks w's events say it holds
//                (GPU 1.0, CPU 0.5, DISK 0.25 by default; a worker not
//                LIVE: none) + predicted_credit x the further leading
//                blocks earlier Picks sent it (PredictedHolds)
//   prefill_w  = max(prompt tokens - credited_w x block_size, 0)
//   load_w     = queued_weight x queued prefill tokens
//                + request_tokens x requests in flight
//                + kv_tokens x KV-cache usage (0..1)
//                (the router's figures when it gives them; else, while
//                the engine's own metrics endpoint was read within
//                max_age, its requests and KV usage (EngineLoads) with
//                the window's queued tokens; else the index's window of
//                recent picks: PickWindow)
//   churn_w    = churn_weight x prefill tokens of the prompts Pick sent w
//                within churn_window (PickWindow): how fast Pick has been
//                filling, and so evicting, w's cache
//   affinity_w = -affinity_tokens for the candidate that rendezvous
//                hashing of the prompt's first affinity_blocks blocks
//                names, else 0
//   cost_w     = prefill_weight x prefill_w + load_w + churn_w + affinity_w
//
// Ties go to fewer requests in flight, then the affinity winner (by the
// first block when affinity_blocks is 0, so that cold prompts of an idle
// fleet spread by their first block, not all to the first name), then the
// name. The chosen worker is then predicted to hold the prompt's blocks
// (Record says which) until predicted_ttl, and charged the pick in its
// window, unless the query is a dry run.
//
// Thread safety: Pick may be called from any thread. mu_ guards the
// predicted holds and the window; the index is asked (Route), and the
// engines' readings read, before mu_ is taken.
#ifndef PREFIXD_INDEX_PICKER_H_
#define PREFIXD_INDEX_PICKER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "index/engine_loads.h"
#include "index/keys.h"
#include "index/kv_index.h"
#include "index/pick_window.h"
#include "index/predicted_holds.h"

namespace prefixd {

// How much a block held in a medium is worth, as a fraction of computing
// it (a GPU block: 1; a block on the host must still be copied back).
struct TierCredit {
  std::string medium;  // upper case; matched against a tier name's first part
  double credit = 1.0;
};

struct PickerOptions {
  double prefill_weight = 1.0;
  double queued_weight = 0.05;
  double request_tokens = 0;
  double kv_tokens = 64;
  // Per prefill token Pick sent the worker within churn_window.
  double churn_weight = 0.003;
  absl::Duration churn_window = absl::Seconds(60);
  double affinity_tokens = 0;
  int affinity_blocks = 0;  // 0: no affinity term
  double predicted_credit = 1.0;
  std::vector<TierCredit> tier_credits = {
      {"GPU", 1.0}, {"CPU", 0.5}, {"DISK", 0.25}};
  double other_tier_credit = 0.25;  // a medium tier_credits does not name
  absl::Duration predicted_ttl = absl::Seconds(5);
  size_t max_predicted = size_t{1} << 20;  // predicted (worker, block) pairs
  absl::Duration load_window = absl::Seconds(2);
  size_t max_window_picks = size_t{1} << 16;
  // Time comes from each query's replay_time_ms (a replay of a recorded
  // trace), not from the caller's clock.
  bool replay_clock = false;
};

// A candidate's load as the router sees it.
struct WorkerLoadInput {
  absl::string_view worker;
  int64_t requests_in_flight = 0;
  int64_t queued_prefill_tokens = 0;
  double kv_usage = 0;
};

struct PickQuery {
  RouteQuery prompt;  // its filter is not read
  // Who may be chosen (engines only); empty: every engine of the index.
  std::vector<std::string> candidates;
  absl::Span<const WorkerLoadInput> loads;
  bool dry_run = false;
  // The decision's time on a replay's clock (options' replay_clock), ms.
  int64_t replay_time_ms = 0;
};

struct PickCandidate {
  absl::string_view worker;  // the index's name (lives as long as it)
  double cost = 0;
  double prefill_tokens = 0;
  double load_term = 0;
  double churn_term = 0;
  double affinity_term = 0;
  uint64_t matched_blocks = 0;
  uint64_t predicted_blocks = 0;
  double credited_blocks = 0;
  WorkerState state = WorkerState::kConnecting;
  bool load_from_request = false;
  bool load_from_engine = false;  // requests and KV usage: EngineLoads
  int64_t requests_in_flight = 0;
  double queued_prefill_tokens = 0;
  double kv_usage = 0;
  double churn_tokens = 0;  // prefill tokens Pick sent it within churn_window
};

struct PickResult {
  absl::string_view worker;  // ranked[0]'s
  std::vector<PickCandidate> ranked;
  uint64_t decision_id = 0;  // 0: a dry run
  uint64_t prompt_blocks = 0;
};

class Picker {
 public:
  // `index` and `engine_loads` (nullable: no engine is read) must outlive
  // the picker.
  Picker(const KvIndex* index, PickerOptions options,
         const EngineLoads* engine_loads = nullptr);
  Picker(const Picker&) = delete;
  Picker& operator=(const Picker&) = delete;

  // INVALID_ARGUMENT naming the field for an empty prompt, a candidate
  // the index does not know or named twice, a load of a worker that is not
  // a candidate or with a negative figure or a kv_usage outside [0, 1],
  // a replay_time_ms that is not positive under replay_clock or is given
  // without it; FAILED_PRECONDITION when there is no candidate at all. A
  // rejected query changes nothing. `now` is the caller's clock, unread
  // under replay_clock.
  absl::StatusOr<PickResult> Pick(const PickQuery& query, absl::Time now);

  const PickerOptions& options() const { return options_; }
  struct Counts {
    uint64_t picks = 0;       // decisions recorded (not dry runs)
    size_t predicted = 0;     // predicted (worker, block) pairs held
    size_t window_picks = 0;  // within load_window
    size_t kept_picks = 0;    // within load_window or churn_window
  };
  Counts counts() const;

 private:
  // The prompt's rolling keys (index/keys.h), for the predicted holds and
  // the affinity: computed when first asked (a Pick whose candidates hold
  // the whole prompt, with no prediction kept, needs none), then kept.
  class PromptKeys {
   public:
    PromptKeys(const Picker* picker, const RouteQuery& prompt, uint64_t blocks)
        : picker_(picker), prompt_(prompt), blocks_(blocks) {}
    absl::Span<const uint64_t> Get();
    uint64_t First();  // Get()[0], hashing the first block alone if needed

   private:
    const Picker* const picker_;
    const RouteQuery& prompt_;
    const uint64_t blocks_;
    std::vector<uint64_t> keys_;
  };

  // The candidates Route lists (checked against the query's) and their
  // loads from the query (null: none given), in the same order.
  absl::Status Find(const PickQuery& query, RouteResult* found,
                    std::vector<const WorkerLoadInput*>* loads) const;
  // The candidate that rendezvous hashing of the prompt's first
  // affinity_blocks blocks names (its first block's with the affinity off:
  // it then only breaks ties); empty for a prompt shorter than a block.
  absl::string_view AffinityWinner(const RouteResult& found,
                                   PromptKeys& keys) const;
  // `given`: the query's load of the candidate, `engine`: its engine's
  // fresh reading (either null: none).
  PickCandidate Cost(const WorkerMatch& m, const WorkerLoadInput* given,
                     const EngineLoad* engine, double prompt_tokens,
                     uint64_t blocks, absl::string_view affinity_winner,
                     int64_t now_ms, PromptKeys& keys) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The chosen worker's predicted blocks (every block of the prompt unless
  // it is LIVE and its events report them all: the worker holds them all
  // once it runs it, whatever its events report now) and window pick.
  void Record(const PickCandidate& chosen, uint64_t blocks, int64_t now_ms,
              PromptKeys& keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The decision's time: `now`, or the replay's clock (never backwards).
  int64_t ClockMs(const PickQuery& query, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckClock(const PickQuery& query) const;
  double EngineCredit(const WorkerMatch& m, uint64_t vouched) const;
  double TierCreditOf(absl::string_view medium) const;

  // The engines' fresh readings for `found`'s workers, in its order (none
  // without engine_loads or under replay_clock).
  std::vector<std::optional<EngineLoad>> EngineReadings(
      const RouteResult& found, absl::Time now) const;

  const KvIndex* const index_;
  const PickerOptions options_;
  const EngineLoads* const engine_loads_;
  const KeyScheme keys_;
  std::atomic<uint64_t> next_decision_{1};
  mutable Mutex mu_;
  PredictedHolds predicted_ ABSL_GUARDED_BY(mu_);
  PickWindow window_ ABSL_GUARDED_BY(mu_);
  int64_t replay_ms_ ABSL_GUARDED_BY(mu_) = 0;  // latest recorded replay time
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_PICKER_H_
