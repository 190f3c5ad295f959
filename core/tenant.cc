#include "core/tenant.h"

#include <algorithm>
#include <cassert>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "core/class_priority_stamp.h"
#include "core/fingerprints.h"

namespace prefixd {
namespace {

// CacheOptions' history size: 0 is the budget in blocks (as PrefixCache
// computes it), four times that under SHADOW.
uint64_t HistoryBlocks(const CacheOptions& o) {
  if (o.eviction_history_blocks != 0) return o.eviction_history_blocks;
  const uint64_t times = o.eviction_policy == EvictionPolicy::kShadow ? 4 : 1;
  return std::min<uint64_t>(o.budget_bytes / o.block_bytes, uint64_t{1} << 60) *
         times;
}

}  // namespace

Tenant::Tenant(std::string name, uint32_t tenant_index,
               uint64_t reserved_blocks, uint64_t limit_blocks,
               const CacheOptions& options, BlockIndex* block_index,
               std::atomic<uint64_t>* event_order,
               std::atomic<int64_t>* pinned_over_reserved, uint64_t rng_seed)
    : name_(std::move(name)),
      index_(tenant_index),
      block_size_(options.block_size),
      block_index_(block_index),
      policy_(options.eviction_policy, HistoryBlocks(options), limit_blocks),
      trees_(options.block_size, policy_.keeps_fingerprints()),
      blocks_(reserved_blocks, limit_blocks, pinned_over_reserved, &policy_),
      leases_(rng_seed, &blocks_),
      outbox_(options, event_order) {
  counters_.tenant = name_;
}

Tenant::~Tenant() = default;

Tree* Tenant::GetOrCreateTree(absl::string_view ns) {
  return trees_.GetOrCreate(ns);
}

// --- Eviction order (lazily kept; see tenant.h and eviction.h) -------------

uint64_t Tenant::NextVictimPriorityStamp() {
  const Node* n = policy_.Victim();
  return n == nullptr ? 0 : PriorityStamp(PriorityOf(*n), n->stamp);
}

// --- Retention hints --------------------------------------------------------

void Tenant::SetHint(Node* n, const Hint& hint) {
  hints_.RemoveBlocks(PriorityOf(*n), n->num_blocks());
  hints_.AddBlocks(hint.priority, n->num_blocks());
  policy_.SetPriority(n, hint.priority);
  // The default priority has nothing to lapse back from.
  hints_.SetLapse(n, hint.priority == kDefaultRetentionPriority
                         ? absl::InfiniteFuture()
                         : hint.lapse);
}

void Tenant::LapseHints(absl::Time now) {
  while (Node* n = hints_.FirstLapsed(now)) SetHint(n, Hint());
}

void Tenant::TouchPath(Node* end, uint64_t stamp, bool insert) {
  for (Node* n = end; !n->is_root(); n = n->parent) {
    assert(stamp >= n->stamp);  // so that entry stamps <= stamp stays true
    n->stamp = stamp;
    policy_.Touch(n);
  }
  if (!insert || !policy_.shadow()) return;
  absl::InlinedVector<const Node*, 16> path;  // end first
  for (const Node* n = end; !n->is_root(); n = n->parent) path.push_back(n);
  for (size_t i = path.size(); i-- > 0;)
    policy_.Observe(path[i]->fingerprints());
}

// --- Structural changes -----------------------------------------------------

// The split itself is core's (radix_tree.h); here the head's IDs are
// re-pointed in the block index. The head has a child, so it needs no LRU
// entry.
Node* Tenant::SplitAt(Node* node, size_t blocks) {
  Node* head = SplitNode(node, blocks);
  EvictionState::Split(head, *node);  // the priority too
  hints_.Split(head, *node);
  block_index_->SetNode(head->block_ids(), head);
  blocks_.AddNode();
  return head;
}

Node* Tenant::Attach(Node* parent, absl::Span<const Token> tokens,
                     absl::Span<const BlockId> ids, int64_t position,
                     uint64_t stamp, const Hint& hint) {
  if (!policy_.keeps_fingerprints())
    return AttachRun(parent, tokens, ids, position, stamp, kRecent, {}, hint);
  // Each block's class comes from the history, by its fingerprint, in
  // order (each lookup may adapt the target).
  const size_t bs = static_cast<size_t>(block_size_);
  absl::InlinedVector<uint64_t, 64> fps(ids.size());
  ChainFingerprints(*parent, tokens, absl::MakeSpan(fps));
  policy_.PrefetchClasses(fps);
  policy_.Observe(fps);
  size_t begin = 0;
  int cls = kRecent;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int c = policy_.ClassForNew(fps[i]);
    if (i > begin && c != cls) {
      parent =
          AttachRun(parent, tokens.subspan(begin * bs, (i - begin) * bs),
                    ids.subspan(begin, i - begin),
                    position + static_cast<int64_t>(begin * bs), stamp, cls,
                    absl::MakeConstSpan(fps).subspan(begin, i - begin), hint);
      begin = i;
    }
    cls = c;
  }
  return AttachRun(parent, tokens.subspan(begin * bs), ids.subspan(begin),
                   position + static_cast<int64_t>(begin * bs), stamp, cls,
                   absl::MakeConstSpan(fps).subspan(begin), hint);
}

Node* Tenant::AttachRun(Node* parent, absl::Span<const Token> tokens,
                        absl::Span<const BlockId> ids, int64_t position,
                        uint64_t stamp, int cls, absl::Span<const uint64_t> fps,
                        const Hint& hint) {
  Node* target;
  if (!parent->is_root() && parent->children.empty() && parent->pins == 0 &&
      parent->end_position() == position && ClassOf(*parent) == cls &&
      hints_.Of(*parent) == hint) {
    // Extending a leaf keeps chains of single children in one node.
    target = parent;
    target->Append(tokens, ids, fps);
  } else {
    target = AddChild(parent, tokens, ids, position, fps);
    policy_.SetPriority(target, hint.priority);  // no entry yet
    if (hint.priority != kDefaultRetentionPriority)
      hints_.SetLapse(target, hint.lapse);
  }
  hints_.AddBlocks(hint.priority, ids.size());
  policy_.AddBlocks(target, cls, ids.size());
  target->tree->blocks += ids.size();
  blocks_.AddBlocks(ids.size());
  block_index_->SetNode(ids, target);
  // A leaf extended in place keeps its entry (its key is older than stamp).
  target->stamp = stamp;
  policy_.Sync(target);
  return target;
}

Node* Tenant::AddChild(Node* parent, absl::Span<const Token> tokens,
                       absl::Span<const BlockId> ids, int64_t position,
                       absl::Span<const uint64_t> fps) {
  blocks_.AddNode();
  // The parent stops being evictable and keeps its LRU entry, if any; the
  // child gets one once the caller has stamped it.
  Node* n = prefixd::AddChild(parent, tokens, ids, position, fps);
  policy_.SetPriority(n, kDefaultRetentionPriority);  // no entry yet
  return n;
}

Node* Tenant::AddRestoredNode(Node* parent, absl::Span<const Token> tokens,
                              absl::Span<const BlockId> ids, int64_t position,
                              uint64_t stamp) {
  absl::InlinedVector<uint64_t, 64> fps;
  if (parent->tree->fingerprints) {
    fps.resize(ids.size());
    ChainFingerprints(*parent, tokens, absl::MakeSpan(fps));
  }
  Node* n = AddChild(parent, tokens, ids, position, fps);
  policy_.AddBlocks(n, kRecent, ids.size());  // no history in a snapshot
  n->tree->blocks += ids.size();
  blocks_.AddBlocks(ids.size());
  // Snapshots keep no hints: restored blocks are ordinary.
  hints_.AddBlocks(kDefaultRetentionPriority, ids.size());
  block_index_->SetNode(ids, n);
  n->stamp = stamp;
  policy_.Sync(n);
  return n;
}

void Tenant::NoteRemoved(const Tree& tree, absl::Span<const BlockId> ids,
                         EvictReason reason) {
  outbox_.NoteRemoved(tree, ids, reason);
  counters_.evicted_blocks[static_cast<int>(reason)] += ids.size();
}

size_t Tenant::EvictRun(EvictReason reason, uint64_t limit,
                        std::vector<BlockId>* out) {
  Node* n = policy_.Victim();
  assert(n != nullptr);
  const size_t k = policy_.RunLength(
      *n, static_cast<size_t>(std::min<uint64_t>(limit, n->num_blocks())));
  policy_.RememberTail(*n, k);
  policy_.RemoveBlocks(*n, k);
  hints_.RemoveBlocks(PriorityOf(*n), k);
  if (reason == EvictReason::kBudget || reason == EvictReason::kLimit ||
      reason == EvictReason::kRequested)
    counters_.evicted_blocks_by_retention[RetentionClass(PriorityOf(*n))] += k;
  Tree* tree = n->tree;
  const absl::Span<const BlockId> ids = n->block_ids().last(k);
  block_index_->Erase(ids);
  blocks_.RemoveBlocks(k);
  tree->blocks -= k;
  for (size_t i = k; i-- > 0;) out->push_back(ids[i]);
  NoteRemoved(*tree, absl::MakeConstSpan(*out).last(k), reason);  // tail first
  if (k < n->num_blocks()) {
    n->DropBack(k);
    return k;
  }
  // The node's last blocks: the node itself goes.
  policy_.Erase(n);
  hints_.Forget(n);
  Node* parent = n->parent;
  RemoveLeaf(n);
  blocks_.RemoveNode();
  policy_.Sync(parent);
  if (parent->is_root()) trees_.MarkMaybeEmpty(*tree);
  return k;
}

// One node of a subtree RemoveSubtree removes: its blocks leave every part.
void Tenant::ForgetNode(Node* n, EvictReason reason,
                        std::vector<BlockId>* removed) {
  Tree* tree = n->tree;
  policy_.Erase(n);
  policy_.RemoveBlocks(*n, n->num_blocks());
  hints_.RemoveBlocks(PriorityOf(*n), n->num_blocks());
  hints_.Forget(n);
  for (BlockId id : n->block_ids()) removed->push_back(id);
  NoteRemoved(*tree, n->block_ids(), reason);
  block_index_->Erase(n->block_ids());
  blocks_.RemoveBlocks(n->num_blocks());
  tree->blocks -= n->num_blocks();
  blocks_.RemoveNode();
  --tree->nodes;
}

void Tenant::RemoveSubtree(Node* node, EvictReason reason,
                           std::vector<BlockId>* removed) {
  // The subtree in pre-order, gathered first: the loops below touch the
  // tenant's guarded state, which a callback of ForEachBelow could not be
  // shown to hold the lock for.
  std::vector<Node*> subtree = {node};
  ForEachBelow(*node, [&](const Node& n, int) {
    subtree.push_back(const_cast<Node*>(&n));
  });
  // End the leases whose path runs through the subtree: those that end in
  // it, found by their end node.
  leases_.EndAt(subtree);
  for (Node* n : subtree) ForgetNode(n, reason, removed);

  Node* parent = node->parent;
  auto handle =
      parent->children.extract(BlockKey{node->block(0), node->key_hash});
  assert(!handle.empty());
  policy_.Sync(parent);
  if (parent->is_root()) trees_.MarkMaybeEmpty(*node->tree);
}

void Tenant::Clear(std::vector<BlockId>* removed) {
  const size_t first = removed->size();
  for (const auto& [ns, tree] : trees_.all()) {
    ForEachBelow(tree->root, [&](const Node& n, int) {
      removed->insert(removed->end(), n.block_ids().begin(),
                      n.block_ids().end());
      block_index_->Erase(n.block_ids());
    });
  }
  counters_.evicted_blocks[static_cast<int>(EvictReason::kReset)] +=
      blocks_.cached();
  trees_.Clear();
  policy_.Clear();
  hints_.Clear();
  leases_.Clear();
  blocks_.Clear();
  outbox_.LogCleared(absl::MakeConstSpan(*removed).subspan(first));
}

void Tenant::FlushRemovals() {
  outbox_.FlushRemovals();
  trees_.DropEmpty();
}

// --- Leases -----------------------------------------------------------------

size_t Tenant::ExpireLeases(absl::Time now) {
  LapseHints(now);
  const size_t n = leases_.ExpireUpTo(now);
  counters_.lease_expired += n;
  return n;
}

// --- Reading ----------------------------------------------------------------

TenantUsage Tenant::Stats(uint64_t block_bytes, absl::Time now) {
  LapseHints(now);
  TenantUsage s = counters_;
  s.reserved_bytes = blocks_.reserved() * block_bytes;
  s.limit_bytes = blocks_.limit() * block_bytes;
  s.cached_blocks = blocks_.cached();
  s.pinned_blocks = blocks_.pinned();
  s.tree_nodes = blocks_.nodes();
  s.namespaces = trees_.size();
  s.active_leases = leases_.size();
  for (int c = 0; c < 3; ++c)
    s.cached_blocks_by_retention[c] = hints_.blocks(c);
  return s;
}

// --- Invariants -------------------------------------------------------------

namespace {

// The children of `parent`: linked both ways, in its tree, not empty, keyed
// by their first block, and no more recent than their parent.
absl::Status CheckChildren(const Node& parent) {
  for (const auto& c : parent.children) {
    const Node& n = *c;
    if (n.parent != &parent)
      return absl::InternalError("child's parent pointer is wrong");
    if (n.tree != parent.tree)
      return absl::InternalError("node points at another tree");
    if (n.num_blocks() == 0) return absl::InternalError("empty non-root node");
    if (n.key_hash != MakeBlockKey(n.block(0)).hash)
      return absl::InternalError("stale child key");
    if (!parent.is_root() && n.stamp > parent.stamp)
      return absl::InternalError("a node is more recent than its parent");
  }
  return absl::OkStatus();
}

// Every block of n is indexed at n, for `tenant`.
absl::Status CheckIndexed(const Node& n, const BlockIndex& index,
                          uint32_t tenant) {
  for (BlockId id : n.block_ids()) {
    auto owner = index.Find(id);
    if (!owner || owner->tenant != tenant || owner->node != &n) {
      return absl::InternalError(
          absl::StrFormat("block %d is not indexed at its node", id));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Tenant::CheckTree(const Tree& tree, const BlockIndex& index,
                               absl::flat_hash_set<const Node*>* live,
                               Totals* totals) const {
  std::vector<const Node*> nodes;
  ForEachBelow(tree.root, [&](const Node& n, int) { nodes.push_back(&n); });
  RETURN_IF_ERROR(CheckChildren(tree.root));
  uint64_t blocks = 0;
  for (const Node* n : nodes) {
    RETURN_IF_ERROR(CheckChildren(*n));
    RETURN_IF_ERROR(CheckIndexed(*n, index, index_));
    RETURN_IF_ERROR(policy_.CheckNode(*n));
    RETURN_IF_ERROR(CheckFingerprints(*n));
    blocks += n->num_blocks();
    if (n->pins > 0) totals->pinned += n->num_blocks();
    live->insert(n);
  }
  if (blocks != tree.blocks || nodes.size() != tree.nodes) {
    return absl::InternalError(
        absl::StrCat("tree '", tree.ns, "' counts are off"));
  }
  totals->cached += blocks;
  totals->nodes += nodes.size();
  return absl::OkStatus();
}

absl::Status Tenant::CheckParts(const BlockIndex& index) const {
  RETURN_IF_ERROR(trees_.CheckTrees());
  absl::flat_hash_set<const Node*> live;  // every node of this tenant
  Totals totals;
  for (const auto& [ns, tree] : trees_.all())
    RETURN_IF_ERROR(CheckTree(*tree, index, &live, &totals));
  RETURN_IF_ERROR(leases_.CheckInvariants(live));
  RETURN_IF_ERROR(policy_.CheckInvariants(live));
  RETURN_IF_ERROR(hints_.CheckInvariants(live));
  return blocks_.CheckCounts(totals.cached, totals.pinned, totals.nodes);
}

absl::Status Tenant::CheckInvariants(const BlockIndex& index) const {
  const absl::Status s = CheckParts(index);
  if (s.ok()) return s;
  return absl::InternalError(
      absl::StrCat("tenant '", name_, "': ", s.message()));
}

}  // namespace prefixd
