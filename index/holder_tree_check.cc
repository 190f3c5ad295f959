// HolderTree's invariants, one small check per invariant.
#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "index/holder_tree.h"
#include "index/holder_tree_internal.h"

namespace prefixd {

// Tallies of what the trees hold, for CheckInvariants.
struct HolderTree::Tally {
  uint64_t entries = 0;
  std::vector<std::vector<uint64_t>> held;  // [worker][medium]
  absl::flat_hash_set<uint32_t> live_slots;
  uint64_t looked_up = 0;  // live slots the key lookup must hold
  uint64_t wide = 0;       // nodes wide_ lists
};

// A node with kGrowAsideFrom children or more is listed in wide_ (so that
// its set is grown aside); the listed nodes are counted, to find any that
// is not in a tree any more.
absl::Status HolderTree::CheckWide(const Node& n, Tally* tally) const {
  if (wide_.contains(&n)) {
    ++tally->wide;
  } else if (n.children.size() >= kGrowAsideFrom) {
    return absl::InternalError(absl::StrCat("tree ", n.tree->ns, ": a node of ",
                                            n.children.size(),
                                            " children is not listed wide"));
  }
  return absl::OkStatus();
}

// Every slot of a node names that node and its place in the edge (and the
// key lookup finds it by its key, once the build reached it), no edge is
// longer than kMaxEdgeBlocks, and no leaf ends in a block nobody holds.
absl::Status HolderTree::CheckNode(const Node& n, Tally* tally) const {
  const auto ids = n.block_ids();
  if (ids.size() > kMaxEdgeBlocks) {
    return absl::InternalError(absl::StrCat(
        "tree ", n.tree->ns, ": an edge of ", ids.size(), " blocks"));
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    const Slot& s = slots_[ids[k]];
    if (s.node != &n || s.pos != k) {
      return absl::InternalError(absl::StrCat("tree ", n.tree->ns, ": slot ",
                                              ids[k], " names another place"));
    }
    if (key_lookup_ != nullptr && ids[k] < key_lookup_next_) {
      if (key_lookup_->Find(n.tree, s.key) != static_cast<int64_t>(ids[k]))
        return absl::InternalError(absl::StrCat("tree ", n.tree->ns, ": slot ",
                                                ids[k],
                                                " is not found by its key"));
      ++tally->looked_up;
    }
    tally->live_slots.insert(static_cast<uint32_t>(ids[k]));
    if (!std::is_sorted(s.holders.begin(), s.holders.end()) ||
        std::adjacent_find(s.holders.begin(), s.holders.end()) !=
            s.holders.end()) {
      return absl::InternalError(
          absl::StrCat("tree ", n.tree->ns, ": slot ", ids[k],
                       "'s holders are not sorted and distinct"));
    }
    tally->entries += s.holders.size();
    for (size_t i = 0; i < s.holders.size(); ++i) {
      const uint32_t h = s.holders[i];
      // FindHeldEngineHash searches only listed workers outside the
      // detached tree.
      if (!holdings_[HolderWorker(h)].tokened && !IsDetached(*n.tree)) {
        return absl::InternalError(absl::StrCat(
            "tree ", n.tree->ns, ": slot ", ids[k], " is held by worker ",
            HolderWorker(h), ", which is not listed as tokened"));
      }
      // Blocks per medium: a block the worker holds in several groups
      // counts once.
      if (std::none_of(s.holders.begin(), s.holders.begin() + i,
                       [&](uint32_t x) { return SameWorkerAndMedium(x, h); })) {
        ++tally->held[HolderWorker(h)][HolderMedium(h)];
      }
    }
  }
  if (n.children.empty() && slots_[ids.back()].holders.empty()) {
    return absl::InternalError(absl::StrCat(
        "tree ", n.tree->ns, ": a leaf ends in a block nobody holds"));
  }
  return absl::OkStatus();
}

// The tree's nodes pass CheckNode and its counts are what it holds.
absl::Status HolderTree::CheckTree(const Tree& tree, Tally* tally) const {
  if (tree.root.children.empty()) {
    return absl::InternalError(absl::StrCat("empty tree ", tree.ns, " kept"));
  }
  uint64_t blocks = 0;
  uint64_t nodes = 0;
  absl::Status status = CheckWide(tree.root, tally);
  ForEachBelow(tree.root, [&](const Node& n, int) {
    ++nodes;
    blocks += n.num_blocks();
    if (status.ok()) status = CheckNode(n, tally);
    if (status.ok()) status = CheckWide(n, tally);
  });
  RETURN_IF_ERROR(status);
  if (blocks != tree.blocks || nodes != tree.nodes) {
    return absl::InternalError(absl::StrCat("tree ", tree.ns, ": counts ",
                                            tree.blocks, "/", tree.nodes,
                                            " but holds ", blocks, "/", nodes));
  }
  return absl::OkStatus();
}

// entries_ and every worker's per-medium count are the holders' sums.
absl::Status HolderTree::CheckCounts(const Tally& tally) const {
  if (tally.entries != entries_) {
    return absl::InternalError(absl::StrCat(
        "entries_ is ", entries_, ", holders sum to ", tally.entries));
  }
  for (size_t w = 0; w < holdings_.size(); ++w) {
    for (size_t m = 0; m < mediums_.size(); ++m) {
      if (tally.held[w][m] != holdings_[w].medium_blocks[m]) {
        return absl::InternalError(absl::StrCat(
            "worker ", w, " medium ", mediums_[m], ": counts ",
            holdings_[w].medium_blocks[m], " but holds ", tally.held[w][m]));
      }
    }
  }
  // tokened_workers_ lists each tokened worker once.
  const size_t tokened =
      std::count_if(holdings_.begin(), holdings_.end(),
                    [](const WorkerHoldings& h) { return h.tokened; });
  absl::flat_hash_set<WorkerId> listed(tokened_workers_.begin(),
                                       tokened_workers_.end());
  if (listed.size() != tokened_workers_.size() || tokened != listed.size() ||
      std::any_of(listed.begin(), listed.end(),
                  [&](WorkerId w) { return !holdings_[w].tokened; })) {
    return absl::InternalError(absl::StrCat(
        tokened, " workers are tokened, tokened_workers_ lists ",
        tokened_workers_.size(), " (", listed.size(), " distinct)"));
  }
  return absl::OkStatus();
}

// Every slot is either in a tree or free, never both.
absl::Status HolderTree::CheckSlots(const Tally& tally) const {
  if (tally.live_slots.size() + free_slots_.size() != slots_.size()) {
    return absl::InternalError(absl::StrCat(tally.live_slots.size(), " live + ",
                                            free_slots_.size(),
                                            " free slots != ", slots_.size()));
  }
  for (uint32_t id : free_slots_) {
    if (tally.live_slots.contains(id)) {
      return absl::InternalError(
          absl::StrCat("slot ", id, " is free and live"));
    }
  }
  if (tally.wide != wide_.size()) {
    return absl::InternalError(absl::StrCat(wide_.size(),
                                            " nodes listed wide, ", tally.wide,
                                            " of them in a tree"));
  }
  if (key_lookup_ != nullptr && key_lookup_->size() != tally.looked_up) {
    return absl::InternalError(
        absl::StrCat("the key lookup holds ", key_lookup_->size(),
                     " slots, the trees ", tally.looked_up));
  }
  return absl::OkStatus();
}

absl::Status HolderTree::CheckInvariants() const {
  Tally tally;
  tally.held.assign(holdings_.size(), std::vector<uint64_t>(mediums_.size()));
  for (const auto& [key, tree] : trees_) {
    RETURN_IF_ERROR(CheckTree(*tree, &tally));
  }
  RETURN_IF_ERROR(CheckCounts(tally));
  return CheckSlots(tally);
}

}  // namespace prefixd
