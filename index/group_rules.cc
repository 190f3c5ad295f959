#include "index/group_rules.h"

#include <algorithm>

namespace prefixd {

uint32_t ComponentBit(absl::string_view name) {
  if (name == "full") return kComponentFull;
  if (name == "swa") return kComponentSwa;
  if (name == "mamba") return kComponentMamba;
  return 0;
}

absl::string_view GroupKindName(GroupKind kind) {
  switch (kind) {
    case GroupKind::kNone:
      return "";
    case GroupKind::kFull:
      return "full_attention";
    case GroupKind::kSlidingWindow:
      return "sliding_window";
    case GroupKind::kState:
      return "mamba";
    case GroupKind::kUnsupported:
      return "unsupported";
  }
  return "";
}

GroupRule RuleForSpec(absl::string_view kind, int64_t sliding_window,
                      int block_size) {
  GroupRule rule;
  if (kind.empty()) return rule;
  // vLLM's KVCacheSpecKind values. MLA keeps one latent vector per token
  // where other attention keeps K and V: its rules are full attention's and
  // the sliding window's. A chunked local attention group needs the blocks
  // from its chunk's start, but the events do not give the chunk's length:
  // it needs every block here, a superset, so never a false hit.
  if (kind == "full_attention" || kind == "sink_full_attention" ||
      kind == "mla_attention" || kind == "chunked_local_attention") {
    rule.kind = GroupKind::kFull;
  } else if (kind == "sliding_window" || kind == "sliding_window_mla") {
    if (sliding_window <= 1) {
      rule.kind = GroupKind::kFull;
    } else {
      rule.kind = GroupKind::kSlidingWindow;
      const int64_t bs = block_size;
      rule.window_blocks = static_cast<uint32_t>(
          std::max<int64_t>(1, (sliding_window - 1 + bs - 1) / bs));
    }
  } else if (kind == "mamba") {
    rule.kind = GroupKind::kState;
  } else {
    rule.kind = GroupKind::kUnsupported;
  }
  return rule;
}

bool GroupAllowsBoundary(const GroupRule& rule, const GroupTally& tally,
                         uint32_t n) {
  switch (rule.kind) {
    case GroupKind::kNone:
      return true;
    case GroupKind::kFull:
      return tally.run >= n;
    case GroupKind::kSlidingWindow: {
      // An unknown window needs the whole prefix.
      const uint32_t need =
          rule.window_blocks == 0 ? n : std::min(rule.window_blocks, n);
      return tally.last == n - 1 && n - tally.streak_start >= need;
    }
    case GroupKind::kState:
      return tally.last == n - 1;
    case GroupKind::kUnsupported:
      return false;
  }
  return false;
}

void HybridRules::Set(uint32_t worker,
                      const std::array<GroupRule, kMaxGroups>& groups) {
  int num_groups = 0;
  bool plain =
      groups[0].kind == GroupKind::kNone || groups[0].kind == GroupKind::kFull;
  for (int g = 0; g < kMaxGroups; ++g) {
    if (groups[g].kind == GroupKind::kNone) continue;
    num_groups = g + 1;
    if (g > 0) plain = false;
  }
  if (of_worker.size() <= worker) of_worker.resize(worker + 1, -1);
  int32_t& index = of_worker[worker];
  if (plain) {
    // Rules are few and never shrink in practice; a plain worker's old
    // entry stays, unused.
    index = -1;
    return;
  }
  if (index < 0) {
    index = static_cast<int32_t>(workers.size());
    workers.emplace_back();
  }
  Worker& w = workers[static_cast<size_t>(index)];
  w.groups = groups;
  // Group 0 is full attention unless declared otherwise.
  if (w.groups[0].kind == GroupKind::kNone) w.groups[0].kind = GroupKind::kFull;
  w.num_groups = num_groups;
}

}  // namespace prefixd
