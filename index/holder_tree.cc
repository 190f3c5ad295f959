#include "index/holder_tree.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdlib>
#include <functional>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "index/keys.h"

namespace prefixd {
namespace {

// A holder packs (worker, group, medium): 20 bits of worker, 4 of KV-cache
// group, 8 of medium.
uint32_t PackHolder(WorkerId w, int64_t group, uint8_t medium) {
  return (w << 12) | (static_cast<uint32_t>(group) << 8) | medium;
}
WorkerId HolderWorker(uint32_t h) { return h >> 12; }
int HolderGroup(uint32_t h) { return static_cast<int>((h >> 8) & 0xf); }
uint8_t HolderMedium(uint32_t h) { return static_cast<uint8_t>(h & 0xff); }
bool SameWorkerAndMedium(uint32_t a, uint32_t b) {
  return HolderWorker(a) == HolderWorker(b) &&
         HolderMedium(a) == HolderMedium(b);
}

static_assert(HolderTree::kMaxWorkers == 1u << 20 && kMaxGroups == 16,
              "holders pack 20 bits of worker and 4 of group");

}  // namespace

absl::string_view DropReasonName(DropReason reason) {
  static constexpr absl::string_view kNames[kNumDropReasons] = {
      "unknown_parent", "extra_keys", "group", "max_entries", "block_size"};
  return kNames[static_cast<int>(reason)];
}

// One indexed block: where it sits and who holds it. A free slot has no
// node; its generation advances whenever it is freed.
struct HolderTree::Slot {
  Node* node = nullptr;
  uint32_t gen = 0;
  absl::InlinedVector<uint32_t, 2> holders;  // PackHolder values
};

HolderTree::HolderTree(int block_size) : block_size_(block_size) {
  mediums_.reserve(kMaxMediums);
}
HolderTree::~HolderTree() = default;

void HolderTree::AddWorker(WorkerId worker) {
  // Holders pack the worker in 20 bits; the registry refuses more workers.
  if (worker >= kMaxWorkers) std::abort();
  if (holdings_.size() <= worker) holdings_.resize(worker + 1);
  holdings_[worker].medium_blocks.resize(mediums_.size());
}

uint64_t HolderTree::blocks() const {
  uint64_t n = 0;
  for (const auto& [key, tree] : trees_) n += tree->blocks;
  return n;
}

uint64_t HolderTree::nodes() const {
  uint64_t n = 0;
  for (const auto& [key, tree] : trees_) n += tree->nodes;
  return n;
}

// --- Slots and holders ------------------------------------------------------

uint32_t HolderTree::NewSlot(Node* node) {
  uint32_t id;
  if (!free_slots_.empty()) {
    id = free_slots_.back();
    free_slots_.pop_back();
  } else {
    id = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  slots_[id].node = node;
  return id;
}

void HolderTree::FreeSlot(uint32_t id) {
  Slot& s = slots_[id];
  assert(s.holders.empty());
  s.node = nullptr;
  ++s.gen;
  free_slots_.push_back(id);
}

HolderTree::Slot* HolderTree::Resolve(SlotRef ref) {
  Slot& s = slots_[ref.slot];
  return s.node != nullptr && s.gen == ref.gen ? &s : nullptr;
}

uint8_t HolderTree::MediumId(absl::string_view medium) {
  for (size_t i = 0; i < mediums_.size(); ++i) {
    if (mediums_[i] == medium) return static_cast<uint8_t>(i);
  }
  // A stream naming hundreds of tiers is broken; fold the rest into the last.
  if (mediums_.size() == kMaxMediums) return kMaxMediums - 1;
  mediums_.emplace_back(medium);
  for (WorkerHoldings& h : holdings_) h.medium_blocks.resize(mediums_.size());
  return static_cast<uint8_t>(mediums_.size() - 1);
}

uint8_t HolderTree::TierId(absl::string_view medium, absl::string_view locality,
                           absl::string_view ownership) {
  if (locality.empty() && ownership.empty()) return MediumId(medium);
  return MediumId(TierName(medium, locality, ownership));
}

void HolderTree::Hold(WorkerId worker, uint32_t holder, uint32_t slot,
                      EngineHash hash) {
  WorkerHoldings& held = holdings_[worker];
  {
    Slot& s = slots_[slot];
    if (std::find(s.holders.begin(), s.holders.end(), holder) ==
        s.holders.end()) {
      const bool new_in_medium = std::none_of(
          s.holders.begin(), s.holders.end(),
          [&](uint32_t h) { return SameWorkerAndMedium(h, holder); });
      s.holders.push_back(holder);
      ++entries_;
      if (new_in_medium) ++held.medium_blocks[HolderMedium(holder)];
    }
  }
  const SlotRef ref{slot, slots_[slot].gen};
  auto [it, inserted] = held.blocks.try_emplace(hash, ref);
  if (inserted || (it->second.slot == slot && it->second.gen == ref.gen)) {
    return;
  }
  // The hash named another block of this worker before (a collision of
  // folded hashes, or an engine reusing a hash): that block loses the
  // worker, or a later removal could never reach it.
  const SlotRef old = it->second;
  it->second = ref;
  if (Slot* s = Resolve(old); s != nullptr) {
    UnholdAll(worker, old.slot);
    if (s->holders.empty()) Prune(s->node);
  }
}

bool HolderTree::Unhold(uint32_t holder, uint32_t slot) {
  Slot& s = slots_[slot];
  auto it = std::find(s.holders.begin(), s.holders.end(), holder);
  if (it != s.holders.end()) {
    s.holders.erase(it);
    --entries_;
    if (std::none_of(s.holders.begin(), s.holders.end(), [&](uint32_t h) {
          return SameWorkerAndMedium(h, holder);
        })) {
      --holdings_[HolderWorker(holder)].medium_blocks[HolderMedium(holder)];
    }
  }
  const WorkerId worker = HolderWorker(holder);
  return std::none_of(s.holders.begin(), s.holders.end(),
                      [&](uint32_t h) { return HolderWorker(h) == worker; });
}

void HolderTree::UnholdAll(WorkerId worker, uint32_t slot) {
  Slot& s = slots_[slot];
  std::vector<uint64_t>& per_medium = holdings_[worker].medium_blocks;
  absl::InlinedVector<uint8_t, 4> mediums;
  auto keep = s.holders.begin();
  for (uint32_t h : s.holders) {
    if (HolderWorker(h) != worker) {
      *keep++ = h;
      continue;
    }
    --entries_;
    if (std::find(mediums.begin(), mediums.end(), HolderMedium(h)) ==
        mediums.end()) {
      mediums.push_back(HolderMedium(h));
      --per_medium[HolderMedium(h)];
    }
  }
  s.holders.erase(keep, s.holders.end());
}

// --- Tree edits -------------------------------------------------------------

Tree* HolderTree::GetOrCreateTree(const std::string& key) {
  auto& tree = trees_[key];
  if (tree == nullptr) tree = std::make_unique<Tree>(key, kKeyTokens);
  return tree.get();
}

Node* HolderTree::StoreStart(WorkerId worker, const BlockStoredEvent& ev,
                             size_t* used) {
  *used = 0;
  if (!ev.parent_block_hash.has_value()) {
    return &GetOrCreateTree(NamespaceKey(ev.lora_name.value_or(""),
                                         ev.lora_id.value_or(0), ev.cache_salt))
                ->root;
  }
  const WorkerHoldings& held = holdings_[worker];
  auto it = held.blocks.find(*ev.parent_block_hash);
  Slot* parent = it == held.blocks.end() ? nullptr : Resolve(it->second);
  if (parent == nullptr) return nullptr;
  const auto ids = parent->node->block_ids();
  *used =
      static_cast<size_t>(std::find(ids.begin(), ids.end(), it->second.slot) -
                          ids.begin()) +
      1;
  return parent->node;
}

//   Store(parent = hash(B), blocks C', X):
//   root ── [A B C D]      becomes      root ── [A B C] ─┬─ [D]
//                                                        └─ [X]
// when C' has C's tokens: C gains the holder, the edge splits after it and
// X hangs below as a new child (AttachNew).
void HolderTree::Store(WorkerId worker, const BlockStoredEvent& ev,
                       uint64_t stamp, DropCounts* drops) {
  assert(ev.group_idx >= 0 && ev.group_idx < kMaxGroups);
  const size_t n = ev.block_hashes.size();
  const size_t chain = std::min(ev.chain_blocks, n);
  if (chain < n)
    (*drops)[static_cast<int>(DropReason::kExtraKeys)] += n - chain;
  if (chain == 0) return;

  size_t used;
  Node* node = StoreStart(worker, ev, &used);
  if (node == nullptr) {
    (*drops)[static_cast<int>(DropReason::kUnknownParent)] += chain;
    return;
  }
  const uint32_t holder = PackHolder(
      worker, ev.group_idx, TierId(ev.medium, ev.locality, ev.ownership));
  key_scratch_.resize(chain * kKeyTokens);
  BlockKeys(ev.token_ids, static_cast<size_t>(block_size_), chain, &ev.content,
            key_scratch_.data());
  const absl::Span<const Token> keys(key_scratch_);
  for (size_t i = 0; i < chain; ++i) {
    const absl::Span<const Token> block =
        keys.subspan(i * kKeyTokens, kKeyTokens);
    node->stamp = stamp;
    if (used < node->num_blocks()) {
      if (SameKey(node->block(used), block)) {
        Hold(worker, holder, static_cast<uint32_t>(node->block_ids()[used]),
             ev.block_hashes[i]);
        ++used;
        continue;
      }
      // The path leaves the edge here: split it after `used` blocks.
      Node* head = SplitNode(node, used);
      for (BlockId id : head->block_ids()) slots_[id].node = head;
      node = head;
    }
    if (Node* child = node->FindChild(block); child != nullptr) {
      node = child;
      used = 1;
      Hold(worker, holder, static_cast<uint32_t>(node->block_ids()[0]),
           ev.block_hashes[i]);
      continue;
    }
    // Nothing below holds block i: the rest of the chain is new.
    std::vector<BlockId> ids(chain - i);
    for (BlockId& id : ids) id = NewSlot(nullptr);
    AttachNew(node, keys.subspan(i * kKeyTokens), ids, stamp);
    for (size_t k = 0; k < ids.size(); ++k) {
      Hold(worker, holder, static_cast<uint32_t>(ids[k]),
           ev.block_hashes[i + k]);
    }
    return;
  }
}

// A childless edge is extended in place (a chain of single children stays
// one node) up to kMaxEdgeBlocks; the rest becomes children, each at most
// that long.
void HolderTree::AttachNew(Node* node, absl::Span<const Token> keys,
                           absl::Span<const BlockId> ids, uint64_t stamp) {
  size_t done = 0;
  while (done < ids.size()) {
    const size_t left = ids.size() - done;
    Node* target;
    size_t take;
    if (!node->is_root() && node->children.empty() &&
        node->num_blocks() < kMaxEdgeBlocks) {
      take = std::min(kMaxEdgeBlocks - node->num_blocks(), left);
      target = node;
      target->Append(keys.subspan(done * kKeyTokens, take * kKeyTokens),
                     ids.subspan(done, take));
    } else {
      take = std::min(kMaxEdgeBlocks, left);
      target = AddChild(
          node, keys.subspan(done * kKeyTokens, take * kKeyTokens),
          ids.subspan(done, take), node->is_root() ? 0 : node->end_position());
    }
    target->stamp = stamp;
    target->tree->blocks += take;
    for (size_t k = done; k < done + take; ++k) slots_[ids[k]].node = target;
    done += take;
    node = target;
  }
}

void HolderTree::Remove(WorkerId worker, const BlockRemovedEvent& ev) {
  // A group no store could name holds nothing.
  if (ev.group_idx < 0 || ev.group_idx >= kMaxGroups) return;
  const uint32_t holder = PackHolder(
      worker, ev.group_idx, TierId(ev.medium, ev.locality, ev.ownership));
  WorkerHoldings& held = holdings_[worker];
  for (EngineHash hash : ev.block_hashes) {
    auto it = held.blocks.find(hash);
    if (it == held.blocks.end()) continue;
    const SlotRef ref = it->second;
    Slot* s = Resolve(ref);
    if (s == nullptr) {
      held.blocks.erase(it);
      continue;
    }
    if (Unhold(holder, ref.slot)) held.blocks.erase(it);
    if (s->holders.empty()) Prune(s->node);
  }
}

// Each node loses all its trailing blocks without holders at once: one
// edit of the edge, not one per block.
void HolderTree::Prune(Node* node) {
  while (!node->is_root() && node->children.empty()) {
    Tree* tree = node->tree;
    const auto ids = node->block_ids();
    size_t empty = 0;
    while (empty < ids.size() &&
           slots_[ids[ids.size() - 1 - empty]].holders.empty()) {
      ++empty;
    }
    if (empty == 0) return;
    for (size_t k = ids.size() - empty; k < ids.size(); ++k)
      FreeSlot(static_cast<uint32_t>(ids[k]));
    tree->blocks -= empty;
    if (empty < ids.size()) {
      node->DropBack(empty);
      return;
    }
    Node* parent = node->parent;
    RemoveLeaf(node);
    node = parent;
  }
  if (node->is_root() && node->children.empty()) {
    trees_.erase(node->tree->ns);  // frees the tree and `node`
  }
}

void HolderTree::Clear(WorkerId worker) {
  WorkerHoldings& held = holdings_[worker];
  std::vector<SlotRef> emptied;
  for (const auto& [hash, ref] : held.blocks) {
    Slot* s = Resolve(ref);
    if (s == nullptr) continue;
    UnholdAll(worker, ref.slot);
    if (s->holders.empty()) emptied.push_back(ref);
  }
  // A prune frees only blocks without holders, so a later ref that still
  // resolves is still the emptied block.
  for (SlotRef ref : emptied) {
    if (Slot* s = Resolve(ref); s != nullptr) Prune(s->node);
  }
  absl::flat_hash_map<EngineHash, SlotRef>().swap(held.blocks);
  assert(std::all_of(held.medium_blocks.begin(), held.medium_blocks.end(),
                     [](uint64_t n) { return n == 0; }));
}

Node* HolderTree::DropTail(Node* leaf, size_t blocks,
                           absl::FunctionRef<void(WorkerId)> dropped) {
  const auto ids = leaf->block_ids();
  for (size_t k = ids.size() - blocks; k < ids.size(); ++k) {
    Slot& s = slots_[ids[k]];
    while (!s.holders.empty()) {
      const WorkerId w = HolderWorker(s.holders.back());
      const uint64_t before = entries_;
      UnholdAll(w, static_cast<uint32_t>(ids[k]));
      for (uint64_t e = entries_; e < before; ++e) dropped(w);
    }
    FreeSlot(static_cast<uint32_t>(ids[k]));  // references to it go stale
  }
  leaf->tree->blocks -= blocks;
  if (blocks < ids.size()) {
    leaf->DropBack(blocks);
    return nullptr;
  }
  Node* parent = leaf->parent;
  RemoveLeaf(leaf);
  return parent;
}

// The scan of the leaves that finds the least recent ones is paid once per
// 1% of churn; each leaf loses its tail in one edit.
uint64_t HolderTree::Trim(uint64_t max_entries,
                          absl::FunctionRef<void(WorkerId)> dropped) {
  if (entries_ <= max_entries) return 0;
  const uint64_t target = max_entries - max_entries / 100;
  using Leaf = std::pair<uint64_t, Node*>;
  std::priority_queue<Leaf, std::vector<Leaf>, std::greater<Leaf>> leaves;
  for (auto& [key, tree] : trees_) {
    ForEachBelow(tree->root, [&](const Node& n, int) {
      if (n.children.empty()) leaves.push({n.stamp, const_cast<Node*>(&n)});
    });
  }
  uint64_t dropped_blocks = 0;
  std::vector<std::string> empty_trees;
  while (entries_ > target && !leaves.empty()) {
    Node* node = leaves.top().second;
    leaves.pop();
    // Tail blocks, until the entries would be down to the target.
    const auto ids = node->block_ids();
    size_t tail = 0;
    for (uint64_t e = entries_; tail < ids.size() && e > target;) {
      e -= slots_[ids[ids.size() - 1 - tail]].holders.size();
      ++tail;
    }
    Tree* tree = node->tree;
    dropped_blocks += tail;
    Node* parent = DropTail(node, tail, dropped);
    if (parent == nullptr) continue;
    if (!parent->is_root() && parent->children.empty()) {
      leaves.push({parent->stamp, parent});
    } else if (parent->is_root() && parent->children.empty()) {
      empty_trees.push_back(tree->ns);
    }
  }
  for (const std::string& key : empty_trees) trees_.erase(key);
  return dropped_blocks;
}

// --- Score ------------------------------------------------------------------

// One pass over the holders of a prompt's matched blocks. A plain worker's
// run[w] advances at block b only if it was b, so it ends as the worker's
// longest run from the start (likewise per medium). A hybrid worker's
// groups keep a GroupTally each, and after every block the worker is asked
// whether its groups allow a boundary there (index/group_rules.h).
class HolderTree::Scorer {
 public:
  Scorer(const HolderTree& tree, size_t workers, const HybridRules& hybrid,
         RouteScores* out)
      : hybrid_(hybrid), out_(out) {
    out->num_workers = workers;
    out->num_mediums = std::max<size_t>(tree.mediums_.size(), 1);
    out->run.assign(workers * (1 + out->num_mediums), 0);
    out->full.clear();
    if (!hybrid.empty()) {
      tallies_.assign(hybrid.workers.size() * kMaxGroups, GroupTally());
      usable_.assign(hybrid.workers.size(), 0);
      seen_at_.assign(hybrid.workers.size(), UINT32_MAX);
    }
  }

  // False once no worker can gain from a later block.
  bool Block(uint32_t b, absl::Span<const uint32_t> holders) {
    bool advanced = false;
    for (uint32_t h : holders) {
      const WorkerId w = HolderWorker(h);
      if (w >= out_->num_workers) continue;
      const int32_t hw = hybrid_.Of(w);
      if (hw < 0) {
        advanced |= Advance(w, HolderMedium(h), b);
      } else {
        HybridHolder(hw, h, b);
      }
    }
    for (int32_t hw : touched_) Boundary(hw, b + 1);
    touched_.clear();
    // A window or state group may make a later boundary usable although
    // nobody's run went on.
    return advanced || !hybrid_.empty();
  }

  void Finish() {
    if (hybrid_.empty()) return;
    out_->full.assign(out_->run.begin(),
                      out_->run.begin() + static_cast<long>(out_->num_workers));
    for (WorkerId w = 0; w < out_->num_workers; ++w) {
      const int32_t hw = hybrid_.Of(w);
      if (hw < 0) continue;
      out_->run[w] = usable_[static_cast<size_t>(hw)];
      out_->full[w] = FullRun(hw);
    }
  }

 private:
  bool Advance(WorkerId w, uint8_t medium, uint32_t b) {
    bool advanced = false;
    uint32_t* run = out_->run.data();
    if (run[w] == b) {
      run[w] = b + 1;
      advanced = true;
    }
    uint32_t& m = run[out_->num_workers + w * out_->num_mediums + medium];
    if (m == b) {
      m = b + 1;
      advanced = true;
    }
    return advanced;
  }

  void HybridHolder(int32_t hw, uint32_t h, uint32_t b) {
    const int g = HolderGroup(h);
    GroupTally& t = tallies_[static_cast<size_t>(hw) * kMaxGroups + g];
    if (t.run == b) t.run = b + 1;
    if (t.last != b) {
      if (t.last == UINT32_MAX || t.last + 1 != b) t.streak_start = b;
      t.last = b;
    }
    const HybridRules::Worker& rules = hybrid_.workers[static_cast<size_t>(hw)];
    if (rules.groups[g].kind == GroupKind::kFull) {
      // Per medium: the full-attention groups' runs.
      uint32_t& m =
          out_->run[out_->num_workers + HolderWorker(h) * out_->num_mediums +
                    HolderMedium(h)];
      if (m == b) m = b + 1;
    }
    if (seen_at_[static_cast<size_t>(hw)] != b) {
      seen_at_[static_cast<size_t>(hw)] = b;
      touched_.push_back(hw);
    }
  }

  void Boundary(int32_t hw, uint32_t n) {
    const HybridRules::Worker& rules = hybrid_.workers[static_cast<size_t>(hw)];
    const GroupTally* t = &tallies_[static_cast<size_t>(hw) * kMaxGroups];
    for (int g = 0; g < rules.num_groups; ++g) {
      if (!GroupAllowsBoundary(rules.groups[g], t[g], n)) return;
    }
    usable_[static_cast<size_t>(hw)] = n;
  }

  uint32_t FullRun(int32_t hw) const {
    const HybridRules::Worker& rules = hybrid_.workers[static_cast<size_t>(hw)];
    uint32_t full = UINT32_MAX;
    for (int g = 0; g < rules.num_groups; ++g) {
      if (rules.groups[g].kind != GroupKind::kFull) continue;
      full = std::min(full,
                      tallies_[static_cast<size_t>(hw) * kMaxGroups + g].run);
    }
    return full == UINT32_MAX ? 0 : full;
  }

  const HybridRules& hybrid_;
  RouteScores* const out_;
  std::vector<GroupTally> tallies_;  // [hybrid worker][group]
  std::vector<uint32_t> usable_;     // by hybrid worker
  std::vector<uint32_t> seen_at_;    // the last block that touched it
  absl::InlinedVector<int32_t, 8> touched_;
};

void HolderTree::Score(absl::Span<const Token> keys, const std::string& ns,
                       size_t workers, const HybridRules& hybrid,
                       uint64_t stamp, RouteScores* out) const {
  out->prompt_blocks = keys.size() / kKeyTokens;
  Scorer scorer(*this, workers, hybrid, out);
  auto tree = trees_.find(ns);
  if (tree != trees_.end()) {
    const WalkPath path = Walk(*tree->second, keys, 0, false);
    uint32_t b = 0;  // prompt block index
    bool go_on = true;
    for (const WalkStep& step : path) {
      // Other Scores may stamp the same node concurrently.
      std::atomic_ref<uint64_t>(step.node->stamp)
          .store(stamp, std::memory_order_relaxed);
      const auto ids = step.node->block_ids();
      // The slots are scattered: ask for all of this step's at once rather
      // than miss the cache once per block.
      for (size_t k = 0; k < step.blocks; ++k)
        __builtin_prefetch(&slots_[ids[k]]);
      for (size_t k = 0; k < step.blocks && go_on; ++k, ++b) {
        go_on = scorer.Block(b, slots_[ids[k]].holders);
      }
      if (!go_on) break;
    }
  }
  scorer.Finish();
}

// --- Introspection ----------------------------------------------------------

std::vector<HolderTree::MediumBlocks> HolderTree::Holdings(
    WorkerId worker) const {
  std::vector<MediumBlocks> out;
  if (worker >= holdings_.size()) return out;
  const WorkerHoldings& held = holdings_[worker];
  for (size_t m = 0; m < mediums_.size(); ++m) {
    if (held.medium_blocks[m] > 0)
      out.push_back({mediums_[m], held.medium_blocks[m]});
  }
  return out;
}

// Tallies of what the trees hold, for CheckInvariants.
struct HolderTree::Tally {
  uint64_t entries = 0;
  std::vector<std::vector<uint64_t>> held;  // [worker][medium]
  absl::flat_hash_set<uint32_t> live_slots;
};

// Every slot of a node names that node, no leaf ends in a block nobody
// holds, and the tree's counts are what it holds.
absl::Status HolderTree::CheckTree(const Tree& tree, Tally* tally) const {
  uint64_t blocks = 0;
  uint64_t nodes = 0;
  absl::Status status;
  ForEachBelow(tree.root, [&](const Node& n, int) {
    ++nodes;
    blocks += n.num_blocks();
    for (BlockId id : n.block_ids()) {
      const Slot& s = slots_[id];
      if (s.node != &n && status.ok()) {
        status = absl::InternalError(absl::StrCat("tree ", tree.ns, ": slot ",
                                                  id, " names another node"));
      }
      tally->live_slots.insert(static_cast<uint32_t>(id));
      tally->entries += s.holders.size();
      for (size_t i = 0; i < s.holders.size(); ++i) {
        const uint32_t h = s.holders[i];
        // Blocks per medium: a block the worker holds in several groups
        // counts once.
        if (std::none_of(
                s.holders.begin(), s.holders.begin() + i,
                [&](uint32_t x) { return SameWorkerAndMedium(x, h); })) {
          ++tally->held[HolderWorker(h)][HolderMedium(h)];
        }
      }
    }
    if (n.children.empty() && slots_[n.block_ids().back()].holders.empty() &&
        status.ok()) {
      status = absl::InternalError(absl::StrCat(
          "tree ", tree.ns, ": a leaf ends in a block nobody holds"));
    }
  });
  if (!status.ok()) return status;
  if (tree.root.children.empty()) {
    return absl::InternalError(absl::StrCat("empty tree ", tree.ns, " kept"));
  }
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
