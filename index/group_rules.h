// How far a hybrid model's prefix is usable (docs/index.md, "Hybrid
// models"). An engine serving such a model keeps several KV-cache groups:
// full attention needs every block of a prefix, a sliding window only the
// blocks within its window ending at the prefix's end, a state (Mamba)
// group only the state at that end. A prefix of n blocks is usable on a
// worker when every group of the worker holds what it needs for n:
//
//   blocks       0 1 2 3 4 5 6 7
//   full         x x x x x x x .      full run 7
//   window (3)   . . . . x x x .      blocks 4..6 end at n = 7
//   state        . . . . . . x .      block 6
//   usable n = 7; with the window group missing block 5, only n = 0.
//
// Thread safety: plain values.
#ifndef PREFIXD_INDEX_GROUP_RULES_H_
#define PREFIXD_INDEX_GROUP_RULES_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"

namespace prefixd {

// KV-cache groups a worker's holders can name (group_idx 0 .. 15).
inline constexpr int kMaxGroups = 16;

enum class GroupKind : uint8_t {
  kNone = 0,           // never declared: not part of the usable-prefix rule
  kFull = 1,           // every block of the prefix
  kSlidingWindow = 2,  // the window_blocks blocks ending at the prefix's end
  kState = 3,          // the prefix's last block (Mamba-like state)
  kUnsupported = 4,    // declared, but no rule here: nothing is usable
};

// SGLang's components of a hybrid model's KV cache, each a group: FULL is
// group 0 (full attention), SWA group 1 (sliding window), MAMBA group 2
// (state). As bits (1 << group), a set of groups: its KV indexer's
// component masks, and its events' component_types.
inline constexpr uint32_t kComponentFull = 1;
inline constexpr uint32_t kComponentSwa = 2;
inline constexpr uint32_t kComponentMamba = 4;
inline constexpr uint32_t kAllComponents = 7;

// The bit of a component as SGLang's events name it ("full", "swa",
// "mamba"), 0 for a name it does not have.
uint32_t ComponentBit(absl::string_view name);

// "full_attention", "sliding_window", "mamba", "unsupported" ("" for kNone).
absl::string_view GroupKindName(GroupKind kind);

struct GroupRule {
  GroupKind kind = GroupKind::kNone;
  // kSlidingWindow only; 0: its length is unknown (SGLang's events do not
  // give it), so it needs every block of the prefix, as full attention
  // does: never more than the worker can reuse.
  uint32_t window_blocks = 0;

  friend bool operator==(const GroupRule& a, const GroupRule& b) {
    return a.kind == b.kind && a.window_blocks == b.window_blocks;
  }
};

// The rule for a group vLLM describes by kv_cache_spec_kind and
// kv_cache_spec_sliding_window (tokens), with blocks of `block_size`. An
// empty kind is kNone. A sliding window needs cdiv(window - 1, block_size)
// blocks, as vLLM's own prefix-cache hit does; a window of 0 (not given)
// counts as full attention, which never over-reports.
GroupRule RuleForSpec(absl::string_view kind, int64_t sliding_window,
                      int block_size);

// The blocks a group needs before a boundary of `n` blocks, by its rule.
// Given per group: the leading run it holds (run), and the last block it
// holds and where that block's unbroken streak started.
struct GroupTally {
  uint32_t run = 0;
  uint32_t last = UINT32_MAX;  // none
  uint32_t streak_start = 0;
};
bool GroupAllowsBoundary(const GroupRule& rule, const GroupTally& tally,
                         uint32_t n);

// The workers whose groups are more than one full-attention group, for
// HolderTree::Score: by worker id, the index of its rules, or -1.
struct HybridRules {
  struct Worker {
    std::array<GroupRule, kMaxGroups> groups;
    int num_groups = 0;  // groups [0, num_groups) have rules
  };
  std::vector<int32_t> of_worker;
  std::vector<Worker> workers;

  bool empty() const { return workers.empty(); }
  int32_t Of(uint32_t worker) const {
    return worker < of_worker.size() ? of_worker[worker] : -1;
  }
  // Sets (or, for a plain worker, clears) `worker`'s rules. A worker is
  // plain when group 0 is full attention (or undeclared) and no other
  // group is declared.
  void Set(uint32_t worker, const std::array<GroupRule, kMaxGroups>& groups);
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_GROUP_RULES_H_
