#include "index/holder_tree.h"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <utility>

#include "absl/hash/hash.h"
#include "index/holder_tree_internal.h"
#include "index/keys.h"

namespace prefixd {
namespace {

// The namespace detached blocks live in: no NamespaceKey starts with 0x01.
constexpr absl::string_view kDetachedNamespace =
    "\x01"
    "detached";

}  // namespace

absl::string_view DropReasonName(DropReason reason) {
  static constexpr absl::string_view kNames[kNumDropReasons] = {
      "unknown_parent", "extra_keys",   "group",       "max_entries",
      "block_size",     "unknown_hash", "other_tenant"};
  return kNames[static_cast<int>(reason)];
}

HolderTree::HolderTree(int block_size, KeyScheme scheme)
    : block_size_(block_size), scheme_(scheme) {
  mediums_.reserve(kMaxMediums);
}
HolderTree::~HolderTree() = default;

void HolderTree::AddWorker(WorkerId worker) {
  // Holders pack the worker in 20 bits; the registry refuses more workers.
  if (worker >= kMaxWorkers) std::abort();
  if (holdings_.size() <= worker) holdings_.resize(worker + 1);
  holdings_[worker].medium_blocks.resize(mediums_.size());
}

HolderTree::Sizes HolderTree::sizes() const {
  Sizes sizes;
  for (const auto& [key, tree] : trees_) {
    sizes.blocks += tree->blocks;
    sizes.nodes += tree->nodes;
  }
  for (const WorkerHoldings& held : holdings_)
    sizes.engine_hashes += held.blocks.size();
  sizes.grown_in_place = grown_in_place_;
  return sizes;
}

// --- Growth aside ------------------------------------------------------------

std::unique_ptr<HolderTree::Growth> HolderTree::GrowthFor(WorkerId worker,
                                                          size_t inserts) {
  const WorkerHoldings& held = holdings_[worker];
  size_t blocks_to = 0;
  if (MayRehash(held.blocks.size(), held.blocks.capacity(), held.erased,
                inserts)) {
    blocks_to = 2 * held.blocks.size() + inserts;
  }
  std::vector<std::unique_ptr<Growth::KeyCopy>> keys;
  if (key_lookup_ != nullptr) {
    for (const KeyLookup::Due& due : key_lookup_->DueFor(inserts))
      keys.push_back(std::make_unique<Growth::KeyCopy>(due));
  }
  // A store adds at most one child per block to a node, and one more where
  // it splits an edge (the head replaces the edge in its parent's set).
  std::vector<WideChildSets::Due> children;
  if (!wide_.empty()) children = wide_.DueFor(inserts + 1);
  if (blocks_to == 0 && keys.empty() && children.empty()) return nullptr;
  return std::unique_ptr<Growth>(new Growth(
      this, worker, blocks_to, std::move(keys), std::move(children)));
}

// A set of the lookup by key and its copy: until Adopt the copy, after it
// the set it replaced.
struct HolderTree::Growth::KeyCopy {
  explicit KeyCopy(KeyLookup::Due due) : due(due) {}

  const KeyLookup::Due due;
  KeyLookup::Set set;
};

// A copy of a node's child set that owns nothing: until Adopt its pointers
// alias the node's children, after it they are the set it replaced, whose
// nodes the copy now owns. Either way they are released, never deleted.
struct HolderTree::Growth::ChildCopy {
  explicit ChildCopy(WideChildSets::Due due)
      : node(due.node), reserve(due.reserve) {}
  ~ChildCopy() {
    // A released pointer no longer hashes as its node, but the set is only
    // destroyed after this.
    for (const std::unique_ptr<Node>& child : set)
      const_cast<std::unique_ptr<Node>&>(child).release();
  }
  ChildCopy(const ChildCopy&) = delete;
  ChildCopy& operator=(const ChildCopy&) = delete;

  Node* const node;
  const size_t reserve;
  ChildSet set;
};

HolderTree::Growth::Growth(HolderTree* tree, WorkerId worker, size_t blocks_to,
                           std::vector<std::unique_ptr<KeyCopy>> keys,
                           std::vector<WideChildSets::Due> children)
    : tree_(tree),
      worker_(worker),
      blocks_to_(blocks_to),
      keys_(std::move(keys)) {
  for (const WideChildSets::Due& due : children)
    children_.push_back(std::make_unique<ChildCopy>(due));
}

HolderTree::Growth::~Growth() = default;

void HolderTree::Growth::Build() {
  if (blocks_to_ > 0) {
    const auto& blocks = tree_->holdings_[worker_].blocks;
    blocks_.reserve(blocks_to_);
    blocks_.insert(blocks.begin(), blocks.end());
  }
  for (const std::unique_ptr<KeyCopy>& copy : keys_)
    copy->set = tree_->key_lookup_->CopyOf(copy->due);
  for (const std::unique_ptr<ChildCopy>& copy : children_) {
    copy->set.reserve(copy->reserve);
    for (const std::unique_ptr<Node>& child : copy->node->children)
      copy->set.insert(std::unique_ptr<Node>(child.get()));
  }
}

void HolderTree::Growth::Adopt() {
  if (blocks_to_ > 0) {
    WorkerHoldings& held = tree_->holdings_[worker_];
    held.blocks.swap(blocks_);
    held.erased = 0;
  }
  for (const std::unique_ptr<KeyCopy>& copy : keys_)
    tree_->key_lookup_->Replace(copy->due.shard, &copy->set);
  for (const std::unique_ptr<ChildCopy>& copy : children_) {
    copy->node->children.swap(copy->set);
    tree_->wide_.Rebuilt(copy->node);
  }
}

size_t HolderTree::Growth::largest_key_copy() const {
  size_t most = 0;
  for (const std::unique_ptr<KeyCopy>& copy : keys_)
    most = std::max(most, copy->set.size());
  return most;
}

// --- Structural edits ------------------------------------------------------

Node* HolderTree::NewChild(Node* parent, absl::Span<const Token> fingerprints,
                           absl::Span<const BlockId> ids) {
  const size_t capacity = parent->children.capacity();
  Node* child = AddChild(parent, fingerprints, ids,
                         parent->is_root() ? 0 : parent->end_position());
  if (wide_.Added(parent, capacity)) ++grown_in_place_;
  return child;
}

// The head takes the edge's place in its parent's set (an erasure and an
// insert there); the tail keeps its node, and with it its child set.
Node* HolderTree::Split(Node* node, size_t blocks) {
  Node* parent = node->parent;
  const size_t capacity = parent->children.capacity();
  Node* head = SplitNode(node, blocks);
  wide_.Erased(parent);
  if (wide_.Added(parent, capacity)) ++grown_in_place_;
  return head;
}

void HolderTree::Unlink(Node* leaf) {
  Node* parent = leaf->parent;
  wide_.Forget(leaf);
  RemoveLeaf(leaf);
  wide_.Erased(parent);
}

void HolderTree::DropTree(const std::string& ns) {
  auto it = trees_.find(ns);
  assert(it != trees_.end() && it->second->root.children.empty());
  wide_.Forget(&it->second->root);
  trees_.erase(it);
}

// --- Slots and holders ------------------------------------------------------

uint32_t HolderTree::NewSlot() {
  if (!free_slots_.empty()) {
    const uint32_t id = free_slots_.back();
    free_slots_.pop_back();
    return id;
  }
  const uint32_t id = static_cast<uint32_t>(slots_.size());
  slots_.emplace_back();
  return id;
}

void HolderTree::FreeSlot(uint32_t id) {
  Slot& s = slots_[id];
  assert(s.holders.empty());
  if (key_lookup_ != nullptr) key_lookup_->Erase(id);
  s.node = nullptr;
  ++s.gen;
  free_slots_.push_back(id);
}

HolderTree::Slot* HolderTree::Resolve(SlotRef ref) {
  Slot& s = slots_[ref.slot];
  return s.node != nullptr && s.gen == ref.gen ? &s : nullptr;
}

const HolderTree::Slot* HolderTree::Resolve(SlotRef ref) const {
  const Slot& s = slots_[ref.slot];
  return s.node != nullptr && s.gen == ref.gen ? &s : nullptr;
}

uint8_t HolderTree::MediumId(absl::string_view medium) {
  const int known = FindMedium(medium);
  if (known >= 0) return static_cast<uint8_t>(known);
  // A stream naming hundreds of tiers is broken; fold the rest into the last.
  if (mediums_.size() == kMaxMediums) return kMaxMediums - 1;
  mediums_.emplace_back(medium);
  for (WorkerHoldings& h : holdings_) h.medium_blocks.resize(mediums_.size());
  return static_cast<uint8_t>(mediums_.size() - 1);
}

int HolderTree::FindMedium(absl::string_view medium) const {
  for (size_t i = 0; i < mediums_.size(); ++i) {
    if (mediums_[i] == medium) return static_cast<int>(i);
  }
  return -1;
}

uint8_t HolderTree::TierId(absl::string_view medium, absl::string_view locality,
                           absl::string_view ownership) {
  if (locality.empty() && ownership.empty()) return MediumId(medium);
  return MediumId(TierName(medium, locality, ownership));
}

void HolderTree::Hold(WorkerId worker, uint32_t holder, uint32_t slot,
                      EngineHash hash) {
  AddHolder(worker, holder, slot);
  MapHash(worker, slot, hash);
}

void HolderTree::AddHolder(WorkerId worker, uint32_t holder, uint32_t slot) {
  Slot& s = slots_[slot];
  // Sorted, so that blocks with the same holders list them alike (a Score
  // passes over a run of them at once; index/prefix_scorer.h).
  const auto at = std::lower_bound(s.holders.begin(), s.holders.end(), holder);
  if (at != s.holders.end() && *at == holder) return;
  const bool new_in_medium =
      std::none_of(s.holders.begin(), s.holders.end(),
                   [&](uint32_t h) { return SameWorkerAndMedium(h, holder); });
  s.holders.insert(at, holder);
  ++entries_;
  if (new_in_medium) ++holdings_[worker].medium_blocks[HolderMedium(holder)];
}

void HolderTree::MapHash(WorkerId worker, uint32_t slot, EngineHash hash) {
  WorkerHoldings& held = holdings_[worker];
  const SlotRef ref{slot, slots_[slot].gen};
  const size_t capacity = held.blocks.capacity();
  auto [it, inserted] = held.blocks.try_emplace(hash, ref);
  if (held.blocks.capacity() != capacity &&
      held.blocks.size() > kGrowAsideFrom) {
    ++grown_in_place_;
  }
  if (inserted) {
    MarkIfStale(worker, held);
    return;
  }
  if (it->second.slot == slot && it->second.gen == ref.gen) return;
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

void HolderTree::MarkIfStale(WorkerId worker, WorkerHoldings& held) {
  constexpr size_t kAtLeast = 4096;  // small maps are never swept
  if (held.sweep_due || held.blocks.size() < kAtLeast) return;
  uint64_t live = 0;
  for (uint64_t n : held.medium_blocks) live += n;
  if (held.blocks.size() <= 2 * live) return;
  held.sweep_due = true;
  sweeps_due_.push_back(worker);
}

bool HolderTree::Unhold(uint32_t holder, uint32_t slot) {
  Slot& s = slots_[slot];
  const auto it = std::lower_bound(s.holders.begin(), s.holders.end(), holder);
  if (it != s.holders.end() && *it == holder) {
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

void HolderTree::UnholdAll(WorkerId worker, uint32_t slot, int medium) {
  Slot& s = slots_[slot];
  std::vector<uint64_t>& per_medium = holdings_[worker].medium_blocks;
  absl::InlinedVector<uint8_t, 4> mediums;
  auto keep = s.holders.begin();
  for (uint32_t h : s.holders) {
    if (HolderWorker(h) != worker ||
        (medium >= 0 && HolderMedium(h) != medium)) {
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

Tree* HolderTree::FindTree(const std::string& key) const {
  auto it = trees_.find(key);
  return it == trees_.end() ? nullptr : it->second.get();
}

void HolderTree::PlaceSlots(Node* node, size_t from) {
  const auto ids = node->block_ids();
  for (size_t k = from; k < ids.size(); ++k) {
    Slot& s = slots_[ids[k]];
    s.node = node;
    s.pos = static_cast<uint16_t>(k);
  }
}

Node* HolderTree::StoreStart(WorkerId worker, const BlockStoredEvent& ev,
                             const StoreDefaults& defaults, size_t* used,
                             DropReason* why) {
  *used = 0;
  *why = DropReason::kUnknownParent;
  const std::string ns =
      NamespaceKey(ev.lora_name.has_value() ? absl::string_view(*ev.lora_name)
                                            : defaults.lora_name,
                   ev.lora_id.value_or(0),
                   ev.cache_salt.empty() ? defaults.salt : ev.cache_salt);
  if (!ev.parent_block_hash.has_value()) return &GetOrCreateTree(ns)->root;
  const WorkerHoldings& held = holdings_[worker];
  auto it = held.blocks.find(*ev.parent_block_hash);
  Slot* parent = it == held.blocks.end() ? nullptr : Resolve(it->second);
  if (parent == nullptr && defaults.hashes_are_keys && key_lookup_ != nullptr) {
    // A publisher of the index's own keys names a parent another worker
    // stored (a storage daemon's copy of a block an engine computed).
    if (const Tree* tree = FindTree(ns); tree != nullptr) {
      const int64_t id = key_lookup_->Find(tree, *ev.parent_block_hash);
      if (id >= 0) parent = &slots_[static_cast<uint32_t>(id)];
    }
  }
  // A block reported by its hash alone has no tokens a chain could hang
  // below: its children's parent is as unknown as a missing one.
  if (parent == nullptr || IsDetached(*parent->node->tree)) return nullptr;
  // A child store that names a salt (SGLang's name it in every store of a
  // salted request) must be in its parent's namespace: nothing says what
  // its hash covered otherwise.
  if (!ev.cache_salt.empty() && parent->node->tree->ns != ns) {
    *why = DropReason::kExtraKeys;
    return nullptr;
  }
  *used = size_t{parent->pos} + 1;
  return parent->node;
}

//   Store(parent = hash(B), blocks C', X):
//   root ── [A B C D]      becomes      root ── [A B C] ─┬─ [D]
//                                                        └─ [X]
// when C' has C's tokens: C gains the holder, the edge splits after it and
// X hangs below as a new child (AttachNew).
void HolderTree::Store(WorkerId worker, const BlockStoredEvent& ev,
                       const StoreDefaults& defaults, uint64_t stamp,
                       DropCounts* drops) {
  assert(ev.group_idx >= 0 && ev.group_idx < kMaxGroups);
  if (ev.placeholder || ev.sparse) {
    StoreByEngineHash(worker, ev, drops);
    return;
  }
  if (ev.token_ids.empty() && !ev.block_hashes.empty()) {
    StoreByKeys(worker, ev, defaults, drops);
    return;
  }
  const size_t n = ev.block_hashes.size();
  const size_t chain = std::min(ev.chain_blocks, n);
  if (chain < n)
    (*drops)[static_cast<int>(DropReason::kExtraKeys)] += n - chain;
  if (chain == 0) return;
  // Each block's entry in the worker's hash map (MapHash, last) is far
  // from the one before: fetch them while the keys are computed.
  const auto& blocks = holdings_[worker].blocks;
  for (size_t i = 0; i < chain; ++i) blocks.prefetch(ev.block_hashes[i]);
  size_t used;
  DropReason why;
  Node* node = StoreStart(worker, ev, defaults, &used, &why);
  if (node == nullptr) {
    (*drops)[static_cast<int>(why)] += chain;
    return;
  }
  fingerprint_scratch_.resize(chain * kKeyTokens);
  scheme_.Fingerprints(ev.token_ids, static_cast<size_t>(block_size_), chain,
                       &ev.content, fingerprint_scratch_.data());
  StoreChain(worker, ev, chain, node, used,
             ev.cache_salt.empty() ? defaults.salt : ev.cache_salt, stamp);
}

// Walks down from after `used` blocks of `node` with the fingerprints in
// fingerprint_scratch_: a block already in the tree gains the holder; where
// the path leaves an edge the edge splits; the rest hangs below as new
// blocks. Only they need their rolling keys (an XXH64 each, one after the
// other): they chain from the key of the block above them, or from the
// namespace's root (Root(salt)).
void HolderTree::StoreChain(WorkerId worker, const BlockStoredEvent& ev,
                            size_t chain, Node* node, size_t used,
                            absl::string_view salt, uint64_t stamp) {
  const uint32_t holder = PackHolder(
      worker, ev.group_idx, TierId(ev.medium, ev.locality, ev.ownership));
  MarkTokened(worker);
  const absl::Span<const Token> fingerprints(fingerprint_scratch_);
  for (size_t i = 0; i < chain; ++i) {
    const absl::Span<const Token> block =
        fingerprints.subspan(i * kKeyTokens, kKeyTokens);
    node->stamp = stamp;
    if (used < node->num_blocks()) {
      if (SameKey(node->block(used), block)) {
        Hold(worker, holder, static_cast<uint32_t>(node->block_ids()[used]),
             ev.block_hashes[i]);
        ++used;
        continue;
      }
      // The path leaves the edge here: split it after `used` blocks; the
      // tail keeps its node, so its slots move up by `used` places.
      Node* head = Split(node, used);
      PlaceSlots(head, 0);
      PlaceSlots(node, 0);
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
    const bool first = node->is_root();  // then i is 0
    const uint64_t parent =
        first ? scheme_.Root(salt) : slots_[node->block_ids()[used - 1]].key;
    key_scratch_.resize(chain - i);
    scheme_.ChainFrom(parent, first, ev.token_ids,
                      static_cast<size_t>(block_size_), i, chain, &ev.content,
                      key_scratch_.data());
    std::vector<BlockId> ids(chain - i);
    for (BlockId& id : ids) id = NewSlot();
    AttachNew(node, fingerprints.subspan(i * kKeyTokens), key_scratch_, ids,
              stamp);
    // Every new block is held before any hash names it: a hash the chain
    // repeats (an engine reusing one) takes the worker off its earlier
    // block, and the prune that follows must not reach new blocks after
    // it that nobody holds yet.
    for (BlockId id : ids) AddHolder(worker, holder, static_cast<uint32_t>(id));
    for (size_t k = 0; k < ids.size(); ++k)
      MapHash(worker, static_cast<uint32_t>(ids[k]), ev.block_hashes[i + k]);
    return;
  }
}

// Keys without tokens (RFC #1527's store events of a storage daemon): each
// key is held where the namespace's tree has it; a key the tree lacks
// cannot be placed (no tokens say where it hangs).
void HolderTree::StoreByKeys(WorkerId worker, const BlockStoredEvent& ev,
                             const StoreDefaults& defaults, DropCounts* drops) {
  uint64_t& unknown = (*drops)[static_cast<int>(DropReason::kUnknownHash)];
  const std::string ns =
      NamespaceKey(ev.lora_name.has_value() ? absl::string_view(*ev.lora_name)
                                            : defaults.lora_name,
                   ev.lora_id.value_or(0),
                   ev.cache_salt.empty() ? defaults.salt : ev.cache_salt);
  const Tree* tree = FindTree(ns);
  if (tree == nullptr || key_lookup_ == nullptr) {
    unknown += ev.block_hashes.size();
    return;
  }
  const uint32_t holder = PackHolder(
      worker, ev.group_idx, TierId(ev.medium, ev.locality, ev.ownership));
  MarkTokened(worker);
  for (EngineHash key : ev.block_hashes) {
    const int64_t id = key_lookup_->Find(tree, key);
    if (id < 0) {
      ++unknown;
      continue;
    }
    Hold(worker, holder, static_cast<uint32_t>(id), key);
  }
}

// vLLM's offloading placeholders and sparse stores: each hash names a block
// the worker stored before with its tokens (in another tier or group),
// which it now holds in this tier and group too. A hash the worker does
// not hold cannot be placed.
void HolderTree::StoreByEngineHash(WorkerId worker, const BlockStoredEvent& ev,
                                   DropCounts* drops) {
  uint64_t& unknown = (*drops)[static_cast<int>(DropReason::kUnknownHash)];
  const uint32_t holder = PackHolder(
      worker, ev.group_idx, TierId(ev.medium, ev.locality, ev.ownership));
  const WorkerHoldings& held = holdings_[worker];
  for (EngineHash hash : ev.block_hashes) {
    auto it = held.blocks.find(hash);
    if (it == held.blocks.end() || Resolve(it->second) == nullptr) {
      ++unknown;
      continue;
    }
    AddHolder(worker, holder, it->second.slot);
  }
}

// A childless edge is extended in place (a chain of single children stays
// one node) up to kMaxEdgeBlocks; the rest becomes children, each at most
// that long.
void HolderTree::AttachNew(Node* node, absl::Span<const Token> fingerprints,
                           absl::Span<const uint64_t> keys,
                           absl::Span<const BlockId> ids, uint64_t stamp) {
  size_t done = 0;
  while (done < ids.size()) {
    const size_t left = ids.size() - done;
    Node* target;
    size_t take;
    size_t first_pos;
    if (!node->is_root() && node->children.empty() &&
        node->num_blocks() < kMaxEdgeBlocks) {
      take = std::min(kMaxEdgeBlocks - node->num_blocks(), left);
      target = node;
      first_pos = target->num_blocks();
      target->Append(fingerprints.subspan(done * kKeyTokens, take * kKeyTokens),
                     ids.subspan(done, take));
    } else {
      take = std::min(kMaxEdgeBlocks, left);
      first_pos = 0;
      target = NewChild(
          node, fingerprints.subspan(done * kKeyTokens, take * kKeyTokens),
          ids.subspan(done, take));
    }
    target->stamp = stamp;
    target->tree->blocks += take;
    PlaceSlots(target, first_pos);
    for (size_t k = done; k < done + take; ++k)
      slots_[static_cast<uint32_t>(ids[k])].key = keys[k];
    if (key_lookup_ != nullptr) {
      for (size_t k = done; k < done + take; ++k) {
        if (key_lookup_->Insert(static_cast<uint32_t>(ids[k])))
          ++grown_in_place_;
      }
    }
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
  // The map's entry is asked for kMapAhead hashes ahead and the slot it
  // names kSlotAhead ahead (by then the entry has arrived), so that the
  // misses overlap.
  const absl::Span<const EngineHash> hashes = ev.block_hashes;
  for (size_t i = 0; i < std::min(kMapAhead, hashes.size()); ++i)
    held.blocks.prefetch(hashes[i]);
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (i + kMapAhead < hashes.size())
      held.blocks.prefetch(hashes[i + kMapAhead]);
    if (i + kSlotAhead < hashes.size()) {
      auto ahead = held.blocks.find(hashes[i + kSlotAhead]);
      if (ahead != held.blocks.end())
        __builtin_prefetch(&slots_[ahead->second.slot]);
    }
    auto it = held.blocks.find(hashes[i]);
    if (it == held.blocks.end()) continue;
    const SlotRef ref = it->second;
    Slot* s = Resolve(ref);
    if (s == nullptr) {
      held.blocks.erase(it);
      ++held.erased;
      continue;
    }
    if (Unhold(holder, ref.slot)) {
      held.blocks.erase(it);
      ++held.erased;
    }
    if (s->holders.empty()) Prune(s->node);
  }
}

// Each node loses all its trailing blocks without holders at once: one
// edit of the edge, not one per block.
void HolderTree::Prune(Node* node) {
  node = PruneEmptyTail(node);
  if (node->is_root() && node->children.empty()) {
    DropTree(node->tree->ns);  // frees `node`
  }
}

Node* HolderTree::PruneEmptyTail(Node* node) {
  while (!node->is_root() && node->children.empty()) {
    Tree* tree = node->tree;
    const auto ids = node->block_ids();
    size_t empty = 0;
    while (empty < ids.size() &&
           slots_[ids[ids.size() - 1 - empty]].holders.empty()) {
      ++empty;
    }
    if (empty == 0) return node;
    for (size_t k = ids.size() - empty; k < ids.size(); ++k)
      FreeSlot(static_cast<uint32_t>(ids[k]));
    tree->blocks -= empty;
    if (empty < ids.size()) {
      node->DropBack(empty);
      return node;
    }
    Node* parent = node->parent;
    Unlink(node);
    node = parent;
  }
  return node;
}

// --- Engine hashes without tokens ------------------------------------------

const HolderTree::Slot* HolderTree::FindEngineHash(EngineHash hash,
                                                   WorkerId* hint) const {
  if (const Slot* s = FindHeldEngineHash(hash, hint); s != nullptr) return s;
  return FindDetached(FindTree(std::string(kDetachedNamespace)), hash, hint);
}

const HolderTree::Slot* HolderTree::FindDetached(const Tree* detached,
                                                 EngineHash hash,
                                                 WorkerId* hint) const {
  if (detached == nullptr) return nullptr;
  std::array<Token, kKeyTokens> key;
  StoreKey(hash, key.data());
  const Node* node = detached->root.FindChild(key);
  if (node == nullptr) return nullptr;
  const Slot& s = slots_[node->block_ids()[0]];
  // The next hash is likely held by the same worker (a run of its pages).
  if (!s.holders.empty()) *hint = HolderWorker(s.holders.front());
  return &s;
}

bool HolderTree::IsDetached(const Tree& tree) {
  return tree.ns == kDetachedNamespace;
}

void HolderTree::MarkTokened(WorkerId worker) {
  WorkerHoldings& held = holdings_[worker];
  if (held.tokened) return;
  held.tokened = true;
  tokened_workers_.push_back(worker);
}

void HolderTree::Untokened(WorkerId worker) {
  WorkerHoldings& held = holdings_[worker];
  if (!held.tokened) return;
  held.tokened = false;
  const auto it =
      std::find(tokened_workers_.begin(), tokened_workers_.end(), worker);
  *it = tokened_workers_.back();
  tokened_workers_.pop_back();
}

const HolderTree::Slot* HolderTree::FindHeldEngineHash(EngineHash hash,
                                                       WorkerId* hint) const {
  auto lookup = [&](WorkerId w) -> const Slot* {
    const auto& blocks = holdings_[w].blocks;
    auto it = blocks.find(hash);
    return it == blocks.end() ? nullptr : Resolve(it->second);
  };
  if (*hint < holdings_.size()) {
    if (const Slot* s = lookup(*hint); s != nullptr) return s;
  }
  for (WorkerId w : tokened_workers_) {
    if (w == *hint) continue;
    if (const Slot* s = lookup(w); s != nullptr) {
      *hint = w;
      return s;
    }
  }
  return nullptr;
}

uint32_t HolderTree::DetachedSlot(Tree* detached, EngineHash hash,
                                  uint64_t stamp) {
  std::array<Token, kKeyTokens> key;
  StoreKey(hash, key.data());
  if (Node* node = detached->root.FindChild(key); node != nullptr) {
    node->stamp = stamp;
    return static_cast<uint32_t>(node->block_ids()[0]);
  }
  const BlockId id = NewSlot();
  AttachNew(&detached->root, key, absl::MakeConstSpan(&hash, 1),
            absl::MakeConstSpan(&id, 1), stamp);
  return static_cast<uint32_t>(id);
}

void HolderTree::StoreHashes(WorkerId worker,
                             absl::Span<const EngineHash> hashes, int group,
                             absl::string_view medium, uint64_t stamp) {
  assert(group >= 0 && group < kMaxGroups);
  const uint32_t holder = PackHolder(worker, group, MediumId(medium));
  WorkerId hint = worker;
  const std::string detached_ns(kDetachedNamespace);
  for (EngineHash hash : hashes) {
    const Slot* found = FindHeldEngineHash(hash, &hint);
    // Looked up per hash, not once: a Hold can move the worker's hold of a
    // hash off its detached block and so drop the detached blocks' tree.
    Tree* detached = nullptr;
    if (found == nullptr) {
      detached = FindTree(detached_ns);  // null: none yet
      found = FindDetached(detached, hash, &hint);
    }
    uint32_t slot;
    if (found != nullptr) {
      slot = static_cast<uint32_t>(found->node->block_ids()[found->pos]);
      if (!IsDetached(*found->node->tree)) MarkTokened(worker);
    } else {
      if (detached == nullptr) detached = GetOrCreateTree(detached_ns);
      slot = DetachedSlot(detached, hash, stamp);
    }
    Hold(worker, holder, slot, hash);
  }
}

// --- Trim -------------------------------------------------------------------

Node* HolderTree::DropTail(Node* leaf, size_t blocks, Trimmed* trimmed) {
  const auto ids = leaf->block_ids();
  for (size_t k = ids.size() - blocks; k < ids.size(); ++k) {
    Slot& s = slots_[ids[k]];
    while (!s.holders.empty()) {
      const WorkerId w = HolderWorker(s.holders.back());
      const uint64_t before = entries_;
      UnholdAll(w, static_cast<uint32_t>(ids[k]));
      trimmed->entries_by_worker[w] += before - entries_;
    }
    FreeSlot(static_cast<uint32_t>(ids[k]));  // references to it go stale
  }
  leaf->tree->blocks -= blocks;
  if (blocks < ids.size()) {
    leaf->DropBack(blocks);
    return nullptr;
  }
  Node* parent = leaf->parent;
  Unlink(leaf);
  return parent;
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

}  // namespace prefixd
