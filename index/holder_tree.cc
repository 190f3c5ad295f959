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
#include "core/status_macros.h"
#include "index/keys.h"

namespace prefixd {
namespace {

// A holder packs (worker, medium): 24 bits of worker, 8 of medium.
uint32_t PackHolder(WorkerId w, uint8_t medium) { return (w << 8) | medium; }
WorkerId HolderWorker(uint32_t h) { return h >> 8; }
uint8_t HolderMedium(uint32_t h) { return static_cast<uint8_t>(h & 0xff); }

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
  // Holders pack the worker in 24 bits.
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

void HolderTree::Hold(WorkerId worker, uint32_t slot, uint8_t medium,
                      EngineHash hash) {
  WorkerHoldings& held = holdings_[worker];
  const uint32_t h = PackHolder(worker, medium);
  {
    Slot& s = slots_[slot];
    if (std::find(s.holders.begin(), s.holders.end(), h) == s.holders.end()) {
      s.holders.push_back(h);
      ++entries_;
      ++held.medium_blocks[medium];
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
    for (size_t m = 0; m < mediums_.size(); ++m)
      Unhold(worker, old.slot, static_cast<uint8_t>(m));
    if (s->holders.empty()) Prune(s->node);
  }
}

bool HolderTree::Unhold(WorkerId worker, uint32_t slot, uint8_t medium) {
  Slot& s = slots_[slot];
  const uint32_t h = PackHolder(worker, medium);
  auto it = std::find(s.holders.begin(), s.holders.end(), h);
  if (it != s.holders.end()) {
    s.holders.erase(it);
    --entries_;
    --holdings_[worker].medium_blocks[medium];
  }
  return std::none_of(s.holders.begin(), s.holders.end(),
                      [&](uint32_t x) { return HolderWorker(x) == worker; });
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
// X hangs below as a new child. A childless edge is extended in place.
void HolderTree::Store(WorkerId worker, const BlockStoredEvent& ev,
                       uint64_t stamp, DropCounts* drops) {
  const size_t n = ev.block_hashes.size();
  if (ev.group_idx != 0) {
    (*drops)[static_cast<int>(DropReason::kGroup)] += n;
    return;
  }
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
  const uint8_t medium = MediumId(ev.medium);
  key_scratch_.resize(chain * kKeyTokens);
  BlockKeys(ev.token_ids, static_cast<size_t>(block_size_), chain,
            key_scratch_.data());
  const absl::Span<const Token> keys(key_scratch_);
  for (size_t i = 0; i < chain; ++i) {
    const absl::Span<const Token> block =
        keys.subspan(i * kKeyTokens, kKeyTokens);
    node->stamp = stamp;
    if (used < node->num_blocks()) {
      if (SameKey(node->block(used), block)) {
        Hold(worker, static_cast<uint32_t>(node->block_ids()[used]), medium,
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
      Hold(worker, static_cast<uint32_t>(node->block_ids()[0]), medium,
           ev.block_hashes[i]);
      continue;
    }
    // Nothing below holds block i: the rest of the chain is new.
    std::vector<BlockId> ids(chain - i);
    for (BlockId& id : ids) id = NewSlot(nullptr);
    const absl::Span<const Token> rest = keys.subspan(i * kKeyTokens);
    Node* target;
    if (!node->is_root() && node->children.empty()) {
      target = node;  // a chain of single children stays one node
      target->Append(rest, ids);
    } else {
      target =
          AddChild(node, rest, ids, node->is_root() ? 0 : node->end_position());
    }
    target->stamp = stamp;
    target->tree->blocks += ids.size();
    for (size_t k = 0; k < ids.size(); ++k) {
      slots_[ids[k]].node = target;
      Hold(worker, static_cast<uint32_t>(ids[k]), medium,
           ev.block_hashes[i + k]);
    }
    return;
  }
}

void HolderTree::Remove(WorkerId worker, const BlockRemovedEvent& ev) {
  // Other KV-cache groups reuse hashes: skipped before any lookup.
  if (ev.group_idx != 0) return;
  const uint8_t medium = MediumId(ev.medium);
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
    if (Unhold(worker, ref.slot, medium)) held.blocks.erase(it);
    if (s->holders.empty()) Prune(s->node);
  }
}

void HolderTree::Prune(Node* node) {
  while (!node->is_root() && node->children.empty()) {
    Tree* tree = node->tree;
    while (node->num_blocks() > 1 &&
           slots_[node->block_ids().back()].holders.empty()) {
      FreeSlot(static_cast<uint32_t>(node->block_ids().back()));
      node->DropBack();
      --tree->blocks;
    }
    if (!slots_[node->block_ids().back()].holders.empty()) return;
    FreeSlot(static_cast<uint32_t>(node->block_ids().back()));
    --tree->blocks;
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
    for (size_t m = 0; m < mediums_.size(); ++m)
      Unhold(worker, ref.slot, static_cast<uint8_t>(m));
    if (s->holders.empty()) emptied.push_back(ref);
  }
  // A prune frees only blocks without holders, so a later ref that still
  // resolves is still the emptied block.
  for (SlotRef ref : emptied) {
    if (Slot* s = Resolve(ref); s != nullptr) Prune(s->node);
  }
  absl::flat_hash_map<EngineHash, SlotRef>().swap(held.blocks);
  std::fill(held.medium_blocks.begin(), held.medium_blocks.end(), 0);
}

// The scan of the leaves that finds the least recent ones is paid once per
// 1% of churn.
uint64_t HolderTree::Trim(uint64_t max_entries,
                          absl::FunctionRef<void(WorkerId)> dropped) {
  if (entries_ <= max_entries) return 0;
  uint64_t dropped_blocks = 0;
  const uint64_t target = max_entries - max_entries / 100;
  using Leaf = std::pair<uint64_t, Node*>;
  std::priority_queue<Leaf, std::vector<Leaf>, std::greater<Leaf>> leaves;
  for (auto& [key, tree] : trees_) {
    ForEachBelow(tree->root, [&](const Node& n, int) {
      if (n.children.empty()) leaves.push({n.stamp, const_cast<Node*>(&n)});
    });
  }
  std::vector<std::string> empty_trees;
  while (entries_ > target && !leaves.empty()) {
    Node* node = leaves.top().second;
    leaves.pop();
    Tree* tree = node->tree;
    while (entries_ > target) {
      const uint32_t id = static_cast<uint32_t>(node->block_ids().back());
      Slot& s = slots_[id];
      for (uint32_t h : s.holders) {
        --holdings_[HolderWorker(h)].medium_blocks[HolderMedium(h)];
        dropped(HolderWorker(h));
        --entries_;
      }
      s.holders.clear();
      ++dropped_blocks;
      FreeSlot(id);  // the workers' references to it go stale
      --tree->blocks;
      if (node->num_blocks() > 1) {
        node->DropBack();
        continue;
      }
      Node* parent = node->parent;
      RemoveLeaf(node);
      if (!parent->is_root() && parent->children.empty()) {
        leaves.push({parent->stamp, parent});
      } else if (parent->is_root() && parent->children.empty()) {
        empty_trees.push_back(tree->ns);
      }
      break;
    }
  }
  for (const std::string& key : empty_trees) trees_.erase(key);
  return dropped_blocks;
}

// --- Score ------------------------------------------------------------------

// run[w] advances at block b only if it was b, so it ends as the worker's
// longest run from the start (likewise per medium); the pass stops at the
// first block that advanced nobody.
void HolderTree::Score(absl::Span<const Token> keys, const std::string& ns,
                       size_t workers, uint64_t stamp, RouteScores* out) const {
  out->prompt_blocks = keys.size() / kKeyTokens;
  out->num_mediums = std::max<size_t>(mediums_.size(), 1);
  out->run.assign(workers * (1 + out->num_mediums), 0);
  auto tree = trees_.find(ns);
  if (tree == trees_.end()) return;

  uint32_t* run = out->run.data();
  uint32_t* by_medium = run + workers;
  const size_t num_mediums = out->num_mediums;
  const WalkPath path = Walk(*tree->second, keys, 0, false);
  uint32_t b = 0;  // prompt block index
  bool advanced = true;
  for (const WalkStep& step : path) {
    // Other Scores may stamp the same node concurrently.
    std::atomic_ref<uint64_t>(step.node->stamp)
        .store(stamp, std::memory_order_relaxed);
    const auto ids = step.node->block_ids();
    // The slots are scattered: ask for all of this step's at once rather
    // than miss the cache once per block.
    for (size_t k = 0; k < step.blocks; ++k)
      __builtin_prefetch(&slots_[ids[k]]);
    for (size_t k = 0; k < step.blocks && advanced; ++k, ++b) {
      advanced = false;
      for (uint32_t h : slots_[ids[k]].holders) {
        const WorkerId w = HolderWorker(h);
        if (w >= workers) continue;
        if (run[w] == b) {
          run[w] = b + 1;
          advanced = true;
        }
        uint32_t& m = by_medium[w * num_mediums + HolderMedium(h)];
        if (m == b) {
          m = b + 1;
          advanced = true;
        }
      }
    }
    if (!advanced) break;
  }
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
      for (uint32_t h : s.holders)
        ++tally->held[HolderWorker(h)][HolderMedium(h)];
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
