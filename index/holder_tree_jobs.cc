// HolderTree's jobs (holder_tree.h, "The changes whose work grows..."): each
// keeps where it stopped, so that its owner can let Scores in between steps.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "index/holder_tree.h"
#include "index/holder_tree_internal.h"

namespace prefixd {
namespace {

bool HeldBy(absl::Span<const uint32_t> holders, WorkerId worker) {
  return std::any_of(holders.begin(), holders.end(),
                     [&](uint32_t h) { return HolderWorker(h) == worker; });
}

}  // namespace

// --- Clear ------------------------------------------------------------------

// The worker's holdings are taken out at the start (its new stores would go
// to a new map), then released a step at a time.
class HolderTree::ClearJob : public HolderTree::Job {
 public:
  ClearJob(HolderTree* tree, WorkerId worker) : tree_(tree), worker_(worker) {
    blocks_.swap(tree_->holdings_[worker].blocks);
    tree_->holdings_[worker].erased = 0;
    next_ = blocks_.begin();
  }

  size_t Step(size_t max_ops, bool* done) override {
    std::vector<SlotRef> emptied;
    size_t n = 0;
    for (; next_ != blocks_.end() && n < max_ops; ++next_, ++n) {
      const SlotRef ref = next_->second;
      Slot* s = tree_->Resolve(ref);
      if (s == nullptr) continue;
      tree_->UnholdAll(worker_, ref.slot);
      if (s->holders.empty()) emptied.push_back(ref);
    }
    // A prune frees only blocks without holders, so a later ref that still
    // resolves is still the emptied block.
    for (SlotRef ref : emptied) {
      if (Slot* s = tree_->Resolve(ref); s != nullptr) tree_->Prune(s->node);
    }
    *done = next_ == blocks_.end();
    if (*done) {
      absl::flat_hash_map<EngineHash, SlotRef>().swap(blocks_);
      const WorkerHoldings& held = tree_->holdings_[worker_];
      assert(std::all_of(held.medium_blocks.begin(), held.medium_blocks.end(),
                         [](uint64_t k) { return k == 0; }));
      (void)held;
      // Holding nothing, it need not be searched for reported hashes.
      tree_->Untokened(worker_);
    }
    return n;
  }

 private:
  HolderTree* const tree_;
  const WorkerId worker_;
  absl::flat_hash_map<EngineHash, SlotRef> blocks_;
  absl::flat_hash_map<EngineHash, SlotRef>::iterator next_;
};

std::unique_ptr<HolderTree::Job> HolderTree::BeginClear(WorkerId worker) {
  return std::make_unique<ClearJob>(this, worker);
}

// --- Sweeps and a tier's clear ----------------------------------------------

// A pass over one worker's engine-hash map, in place: the entries that no
// longer name a block the worker holds are dropped, after (for a tier's
// clear) the worker's holders in `medium` are removed. Erasing from the map
// moves nothing (absl's flat maps never rehash on erase), so next_ stays
// valid across steps as long as nothing is inserted, which the steps' owner
// ensures.
class HolderTree::SweepJob : public HolderTree::Job {
 public:
  // medium: the tier cleared, or -1 for a sweep alone.
  SweepJob(HolderTree* tree, WorkerId worker, int medium)
      : tree_(tree),
        worker_(worker),
        medium_(medium),
        next_(tree->holdings_[worker].blocks.begin()) {}

  size_t Step(size_t max_ops, bool* done) override {
    absl::flat_hash_map<EngineHash, SlotRef>& blocks =
        tree_->holdings_[worker_].blocks;
    std::vector<SlotRef> emptied;
    size_t n = 0;
    for (; next_ != blocks.end() && n < max_ops; ++n) {
      const SlotRef ref = next_->second;
      Slot* s = tree_->Resolve(ref);
      if (s != nullptr && medium_ >= 0) {
        tree_->UnholdAll(worker_, ref.slot, medium_);
        if (s->holders.empty()) emptied.push_back(ref);
      }
      if (s != nullptr && HeldBy(s->holders, worker_)) {
        ++next_;
      } else {
        blocks.erase(next_++);
        ++tree_->holdings_[worker_].erased;
      }
    }
    // As in ClearJob: a ref that still resolves is still the emptied block.
    for (SlotRef ref : emptied) {
      if (Slot* s = tree_->Resolve(ref); s != nullptr) tree_->Prune(s->node);
    }
    *done = next_ == blocks.end();
    return n;
  }

 private:
  HolderTree* const tree_;
  const WorkerId worker_;
  const int medium_;
  absl::flat_hash_map<EngineHash, SlotRef>::iterator next_;
};

std::unique_ptr<HolderTree::Job> HolderTree::BeginSweep() {
  if (sweeps_due_.empty()) return nullptr;
  const WorkerId worker = sweeps_due_.back();
  sweeps_due_.pop_back();
  holdings_[worker].sweep_due = false;
  return std::make_unique<SweepJob>(this, worker, -1);
}

std::unique_ptr<HolderTree::Job> HolderTree::BeginClearTier(
    WorkerId worker, absl::string_view medium) {
  const int m = FindMedium(medium);
  if (m < 0) return nullptr;
  return std::make_unique<SweepJob>(this, worker, m);
}

// --- Trim -------------------------------------------------------------------

// The scan of the leaves that finds the least recent ones is paid once per
// 1% of churn; each leaf then loses its tail in one edit.
class HolderTree::TrimJob : public HolderTree::Job {
 public:
  TrimJob(HolderTree* tree, uint64_t max_entries, Trimmed* trimmed)
      : tree_(tree),
        trimmed_(trimmed),
        target_(max_entries - max_entries / 100),
        next_tree_(tree->trees_.begin()),
        leaves_(std::greater<Leaf>(), ReservedForLeaves(*tree)) {
    trimmed_->blocks = 0;
    trimmed_->entries_by_worker.assign(tree->holdings_.size(), 0);
  }

  size_t Step(size_t max_ops, bool* done) override {
    *done = false;
    if (!scanned_) return Scan(max_ops);
    return Drop(max_ops, done);
  }

 private:
  // A leaf, by its stamp when scanned, then by its first block's slot (not
  // its address, which the allocator picks: slots follow the index's own
  // operations).
  struct Leaf {
    uint64_t stamp;
    BlockId first;
    Node* node;
    friend bool operator>(const Leaf& a, const Leaf& b) {
      return a.stamp != b.stamp ? a.stamp > b.stamp : a.first > b.first;
    }
  };
  static Leaf LeafOf(Node* node) {
    return {node->stamp, node->block_ids()[0], node};
  }

  // Room for a leaf per node, taken at once: growing by doubling would copy
  // (and fault in) the whole heap inside one step; reserved, each step
  // touches only the pages its own leaves fill.
  static std::vector<Leaf> ReservedForLeaves(const HolderTree& tree) {
    std::vector<Leaf> leaves;
    leaves.reserve(tree.sizes().nodes);
    return leaves;
  }

  // A depth-first walk that can stop after any node: path_ holds, per
  // depth, the children of the node above still to visit. Each iteration
  // enters a tree, visits one node or leaves a depth.
  size_t Scan(size_t max_ops) {
    size_t n = 0;
    for (; n < max_ops; ++n) {
      if (path_.empty()) {
        if (next_tree_ == tree_->trees_.end()) break;
        const ChildSet& roots = next_tree_->second->root.children;
        path_.emplace_back(roots.begin(), roots.end());
        ++next_tree_;
        continue;
      }
      auto& [next, end] = path_.back();
      if (next == end) {
        path_.pop_back();
        continue;
      }
      Node* node = (next++)->get();
      if (node->children.empty()) {
        leaves_.push(LeafOf(node));
      } else {
        path_.emplace_back(node->children.begin(), node->children.end());
      }
    }
    scanned_ = path_.empty() && next_tree_ == tree_->trees_.end();
    return n;
  }

  // Drops leaves' tails, least recent first, until the entries are down to
  // the target.
  size_t Drop(size_t max_ops, bool* done) {
    size_t dropped = 0;
    std::vector<std::string> empty_trees;
    while (tree_->entries_ > target_ && !leaves_.empty() && dropped < max_ops) {
      const Leaf leaf = leaves_.top();
      leaves_.pop();
      const auto [counted, tail] = TailOf(*leaf.node, max_ops - dropped);
      dropped += counted;
      Tree* tree = leaf.node->tree;
      Node* parent = tree_->DropTail(leaf.node, tail, trimmed_);
      if (parent == nullptr) {
        if (tree_->entries_ > target_) leaves_.push(leaf);  // what is left
        continue;
      }
      // A node left childless may end in blocks that lost their holders
      // while it had children: they go now, so that no leaf ends in one
      // (not counted: they held no entry).
      parent = tree_->PruneEmptyTail(parent);
      if (!parent->is_root() && parent->children.empty()) {
        leaves_.push(LeafOf(parent));
      } else if (parent->is_root() && parent->children.empty()) {
        empty_trees.push_back(tree->ns);
      }
    }
    for (const std::string& key : empty_trees) tree_->DropTree(key);
    trimmed_->blocks += dropped;
    *done = tree_->entries_ <= target_ || leaves_.empty();
    return dropped;
  }

  // The leaf's tail to drop: its last blocks until the entries would be
  // down to the target or `budget` blocks are counted (the leaf then waits
  // for the next step), then the blocks nobody holds before them (not
  // counted: they held no entry), so that a leaf never ends in one.
  // Returns {counted, tail}.
  std::pair<size_t, size_t> TailOf(const Node& leaf, size_t budget) const {
    const auto ids = leaf.block_ids();
    const auto& slots = tree_->slots_;
    size_t tail = 0;
    for (uint64_t e = tree_->entries_;
         tail < ids.size() && e > target_ && tail < budget;) {
      e -= slots[ids[ids.size() - 1 - tail]].holders.size();
      ++tail;
    }
    const size_t counted = tail;
    while (tail < ids.size() &&
           slots[ids[ids.size() - 1 - tail]].holders.empty())
      ++tail;
    return {counted, tail};
  }

  HolderTree* const tree_;
  Trimmed* const trimmed_;
  const uint64_t target_;  // the entries to get down to
  // The scan for leaves: the trees not entered yet, then the children left
  // to visit at each depth of the current tree.
  bool scanned_ = false;
  absl::flat_hash_map<std::string, std::unique_ptr<Tree>>::const_iterator
      next_tree_;
  std::vector<std::pair<ChildSet::const_iterator, ChildSet::const_iterator>>
      path_;
  // Leaves, least recent first (as stamped when scanned).
  std::priority_queue<Leaf, std::vector<Leaf>, std::greater<Leaf>> leaves_;
};

std::unique_ptr<HolderTree::Job> HolderTree::BeginTrim(uint64_t max_entries,
                                                       Trimmed* trimmed) {
  if (entries_ <= max_entries) return nullptr;
  return std::make_unique<TrimJob>(this, max_entries, trimmed);
}

// --- The lookup by key ------------------------------------------------------

// Reserved whole at the start, so that no step pays for a rehash of what
// the steps before it added.
class HolderTree::KeyLookupJob : public HolderTree::Job {
 public:
  explicit KeyLookupJob(HolderTree* tree) : tree_(tree) {
    tree_->key_lookup_ = std::make_unique<KeyLookup>(tree);
    tree_->key_lookup_->Reserve(tree->slots_.size() - tree->free_slots_.size());
    tree_->key_lookup_next_ = 0;
  }

  size_t Step(size_t max_ops, bool* done) override {
    size_t& next = tree_->key_lookup_next_;
    size_t n = 0;
    for (; next < tree_->slots_.size() && n < max_ops; ++n) {
      const uint32_t id = static_cast<uint32_t>(next++);
      if (tree_->slots_[id].node != nullptr) tree_->key_lookup_->Insert(id);
    }
    *done = next >= tree_->slots_.size();
    if (*done) next = SIZE_MAX;
    return n;
  }

 private:
  HolderTree* const tree_;
};

std::unique_ptr<HolderTree::Job> HolderTree::BeginKeyLookup() {
  if (key_lookup_ != nullptr) return nullptr;
  return std::make_unique<KeyLookupJob>(this);
}

}  // namespace prefixd
