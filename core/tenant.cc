#include "core/tenant.h"

#include <algorithm>
#include <cassert>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace prefixd {
namespace {

// CacheOptions' history size: 0 is the budget in blocks (as PrefixCache
// computes it).
uint64_t HistoryBlocks(const CacheOptions& o) {
  if (o.eviction_history_blocks != 0) return o.eviction_history_blocks;
  return std::min<uint64_t>(o.budget_bytes / o.block_bytes, uint64_t{1} << 62);
}

}  // namespace

Tenant::Tenant(std::string name, uint32_t tenant_index,
               uint64_t reserved_blocks, uint64_t limit_blocks,
               const CacheOptions& options, BlockIndex* block_index,
               std::atomic<uint64_t>* event_order,
               std::atomic<int64_t>* pinned_over_reserved, uint64_t rng_seed)
    : name_(std::move(name)),
      index_(tenant_index),
      reserved_blocks_(reserved_blocks),
      limit_blocks_(limit_blocks),
      block_size_(options.block_size),
      detailed_events_(options.detailed_events),
      block_index_(block_index),
      policy_(options.eviction_policy, HistoryBlocks(options), limit_blocks),
      leases_(rng_seed),
      events_(options.events_per_tenant, event_order, options.event_ring_bytes),
      pinned_over_reserved_(pinned_over_reserved) {
  counters_.tenant = name_;
}

Tenant::~Tenant() = default;

Tree* Tenant::FindTree(absl::string_view ns) const {
  auto it = trees_.find(ns);
  return it == trees_.end() ? nullptr : it->second.get();
}

Tree* Tenant::GetOrCreateTree(absl::string_view ns) {
  auto& slot = trees_[ns];
  if (slot == nullptr)
    slot = std::make_unique<Tree>(std::string(ns), block_size_);
  return slot.get();
}

// --- Eviction order (lazily kept; see tenant.h and eviction.h) -------------

uint64_t Tenant::NextVictimStamp() {
  const Node* n = policy_.Victim();
  return n == nullptr ? 0 : VictimKey(PriorityOf(*n), n->stamp);
}

// --- Retention hints
// ----------------------------------------------------------

Hint Tenant::HintOf(const Node& n) const {
  Hint h;
  h.priority = PriorityOf(n);
  if (!lapses_.empty()) {
    auto it = lapses_.find(&n);
    if (it != lapses_.end()) h.lapse = it->second;
  }
  return h;
}

void Tenant::SetLapse(Node* n, absl::Time lapse) {
  if (!lapses_.empty()) {
    auto it = lapses_.find(n);
    if (it != lapses_.end()) {
      lapse_order_.erase({it->second, n});
      lapses_.erase(it);
    }
  }
  if (lapse == absl::InfiniteFuture()) return;
  lapses_[n] = lapse;
  lapse_order_.insert({lapse, n});
}

void Tenant::SetHint(Node* n, const Hint& hint) {
  const int before = PriorityOf(*n);
  blocks_by_retention_[RetentionClass(before)] -= n->num_blocks();
  blocks_by_retention_[RetentionClass(hint.priority)] += n->num_blocks();
  policy_.SetPriority(n, hint.priority);
  // The default priority has nothing to lapse back from.
  SetLapse(n, hint.priority == kDefaultRetentionPriority
                  ? absl::InfiniteFuture()
                  : hint.lapse);
}

void Tenant::LapseHints(absl::Time now) {
  while (!lapse_order_.empty() && lapse_order_.begin()->first <= now)
    SetHint(lapse_order_.begin()->second, Hint());
}

void Tenant::TouchPath(Node* end, uint64_t stamp) {
  for (Node* n = end; !n->is_root(); n = n->parent) {
    assert(stamp >= n->stamp);  // so that entry keys <= stamp stays true
    n->stamp = stamp;
    policy_.Touch(n);
  }
}

void Tenant::PinPath(Node* end, int delta, bool sync) {
  for (Node* n = end; !n->is_root(); n = n->parent) {
    const int32_t before = n->pins;
    n->pins += delta;
    assert(n->pins >= 0);
    if (before == 0 && n->pins > 0) pinned_blocks_ += n->num_blocks();
    if (before > 0 && n->pins == 0) pinned_blocks_ -= n->num_blocks();
    SyncLru(n);
  }
  if (sync) SyncPinnedOverReserved();
}

void Tenant::SyncPinnedOverReserved() {
  const int64_t now =
      pinned_blocks_ > reserved_blocks_
          ? static_cast<int64_t>(pinned_blocks_ - reserved_blocks_)
          : 0;
  pinned_over_reserved_->fetch_add(now - accounted_over_reserved_);
  accounted_over_reserved_ = now;
}

// --- Structural changes -----------------------------------------------------

// The split itself is core's (radix_tree.h); here the head's IDs are
// re-pointed in the block index. The head has a child, so it needs no LRU
// entry.
Node* Tenant::SplitAt(Node* node, size_t blocks) {
  Node* head = SplitNode(node, blocks);
  EvictionState::Split(head, *node);  // the priority too
  if (!lapses_.empty()) SetLapse(head, HintOf(*node).lapse);
  policy_.SplitFingerprints(head, node, blocks);
  block_index_->SetNode(head->block_ids(), head);
  ++nodes_;
  return head;
}

Node* Tenant::Attach(Node* parent, absl::Span<const Token> tokens,
                     absl::Span<const BlockId> ids, int64_t position,
                     uint64_t stamp, const Hint& hint) {
  if (!policy_.adaptive())
    return AttachRun(parent, tokens, ids, position, stamp, kRecent, {}, hint);
  // Each block's class comes from the history, by its fingerprint, in
  // order (each lookup may adapt the target).
  const size_t bs = static_cast<size_t>(block_size_);
  uint64_t fp = policy_.FingerprintAbove(*parent);
  absl::InlinedVector<uint64_t, 64> fps;
  size_t begin = 0;
  int cls = kRecent;
  for (size_t i = 0; i < ids.size(); ++i) {
    fp = ChainHash(fp, tokens.subspan(i * bs, bs));
    fps.push_back(fp);
    const int c = policy_.ClassForNew(fp);
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
      HintOf(*parent) == hint) {
    // Extending a leaf keeps chains of single children in one node.
    target = parent;
    target->Append(tokens, ids);
  } else {
    target = AddChild(parent, tokens, ids, position);
    policy_.SetPriority(target, hint.priority);  // no entry yet
    if (hint.priority != kDefaultRetentionPriority)
      SetLapse(target, hint.lapse);
  }
  blocks_by_retention_[RetentionClass(hint.priority)] += ids.size();
  policy_.AddBlocks(target, cls, ids.size());
  policy_.AddFingerprints(target, fps);
  target->tree->blocks += ids.size();
  cached_blocks_ += ids.size();
  block_index_->SetNode(ids, target);
  // A leaf extended in place keeps its entry (its key is older than stamp).
  target->stamp = stamp;
  SyncLru(target);
  return target;
}

Node* Tenant::AddChild(Node* parent, absl::Span<const Token> tokens,
                       absl::Span<const BlockId> ids, int64_t position) {
  ++nodes_;
  // The parent stops being evictable and keeps its LRU entry, if any; the
  // child gets one once the caller has stamped it.
  Node* n = prefixd::AddChild(parent, tokens, ids, position);
  policy_.SetPriority(n, kDefaultRetentionPriority);  // no entry yet
  return n;
}

void Tenant::NoteRemoved(Tree* tree, BlockId id, EvictReason reason) {
  if (pending_removals_.empty() || pending_removals_.back().tree != tree ||
      pending_removals_.back().reason != reason) {
    pending_removals_.push_back({tree, tree->ns, reason, {}});
  }
  pending_removals_.back().ids.push_back(id);
  ++counters_.evicted_blocks[static_cast<int>(reason)];
}

size_t Tenant::EvictRun(EvictReason reason, uint64_t limit,
                        std::vector<BlockId>* out) {
  Node* n = policy_.Victim();
  assert(n != nullptr);
  const size_t k = policy_.RunLength(
      *n, static_cast<size_t>(std::min<uint64_t>(limit, n->num_blocks())));
  policy_.RememberTail(*n, k);
  policy_.RemoveBlocks(*n, k);
  const int cls = RetentionClass(PriorityOf(*n));
  blocks_by_retention_[cls] -= k;
  if (reason == EvictReason::kBudget || reason == EvictReason::kLimit ||
      reason == EvictReason::kRequested)
    counters_.evicted_blocks_by_retention[cls] += k;
  Tree* tree = n->tree;
  const absl::Span<const BlockId> ids = n->block_ids().last(k);
  block_index_->Erase(ids);
  cached_blocks_ -= k;
  tree->blocks -= k;
  for (size_t i = k; i-- > 0;) {
    out->push_back(ids[i]);
    NoteRemoved(tree, ids[i], reason);
  }
  if (k < n->num_blocks()) {
    n->DropBack(k);
    return k;
  }
  // The node's last blocks: the node itself goes.
  LruErase(n);
  if (!lapses_.empty()) SetLapse(n, absl::InfiniteFuture());
  Node* parent = n->parent;
  RemoveLeaf(n);
  --nodes_;
  SyncLru(parent);
  if (parent->is_root()) maybe_empty_.push_back(tree->ns);
  return k;
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
  std::vector<LeaseId> ending;
  for (const Node* n : subtree) leases_.EndingAt(n, &ending);
  for (LeaseId id : ending) EndLease(id);

  Tree* tree = node->tree;
  for (Node* n : subtree) {
    LruErase(n);
    policy_.RemoveBlocks(*n, n->num_blocks());
    blocks_by_retention_[RetentionClass(PriorityOf(*n))] -= n->num_blocks();
    if (!lapses_.empty()) SetLapse(n, absl::InfiniteFuture());
    policy_.DropFingerprints(n);
    for (BlockId id : n->block_ids()) {
      removed->push_back(id);
      NoteRemoved(tree, id, reason);
    }
    block_index_->Erase(n->block_ids());
    cached_blocks_ -= n->num_blocks();
    tree->blocks -= n->num_blocks();
    --nodes_;
    --tree->nodes;
  }

  Node* parent = node->parent;
  auto handle =
      parent->children.extract(BlockKey{node->block(0), node->key_hash});
  assert(!handle.empty());
  SyncLru(parent);
  if (parent->is_root()) maybe_empty_.push_back(tree->ns);
}

void Tenant::TakeParked(std::vector<BlockId>* out) {
  out->insert(out->end(), parked_.begin(), parked_.end());
  parked_.clear();
}

void Tenant::Clear(std::vector<BlockId>* removed) {
  const size_t first = removed->size();
  for (auto& [ns, tree] : trees_) {
    ForEachBelow(tree->root, [&](const Node& n, int) {
      removed->insert(removed->end(), n.block_ids().begin(),
                      n.block_ids().end());
      block_index_->Erase(n.block_ids());
    });
  }
  counters_.evicted_blocks[static_cast<int>(EvictReason::kReset)] +=
      cached_blocks_;
  trees_.clear();
  policy_.Clear();
  lapses_.clear();
  lapse_order_.clear();
  blocks_by_retention_[0] = blocks_by_retention_[1] = blocks_by_retention_[2] =
      0;
  leases_.Clear();
  pending_removals_.clear();
  maybe_empty_.clear();
  cached_blocks_ = pinned_blocks_ = nodes_ = 0;
  SyncPinnedOverReserved();
  Event e;
  e.type = EventType::kCleared;
  e.reason = EvictReason::kReset;
  if (detailed_events_)
    e.block_ids.assign(removed->begin() + first, removed->end());
  events_.Append(std::move(e));
}

void Tenant::DropTreeIfEmpty(const std::string& ns) {
  auto it = trees_.find(ns);
  if (it != trees_.end() && it->second->root.children.empty()) trees_.erase(it);
}

// --- Leases -----------------------------------------------------------------

LeaseId Tenant::AddLease(Node* end, absl::Duration ttl, absl::Time now) {
  const LeaseId id = leases_.Add(end, ttl, now);
  PinPath(end, +1);
  return id;
}

bool Tenant::EndLease(LeaseId id) {
  Node* end = leases_.Remove(id);
  if (end == nullptr) return false;
  PinPath(end, -1);
  return true;
}

size_t Tenant::ExpireLeases(absl::Time now) {
  LapseHints(now);
  size_t n = 0;
  while (const LeaseId id = leases_.FirstExpired(now)) {
    EndLease(id);
    ++n;
  }
  counters_.lease_expired += n;
  return n;
}

// --- Events -----------------------------------------------------------------

void Tenant::LogStored(const Tree& tree, std::optional<BlockId> parent,
                       absl::Span<const Token> tokens,
                       absl::Span<const BlockId> ids, int64_t position,
                       int64_t prefix_tokens) {
  Event e;
  e.type = EventType::kBlockStored;
  e.ns = tree.ns;
  e.block_ids.assign(ids.begin(), ids.end());
  e.position = position;
  e.prefix_tokens = prefix_tokens;
  if (detailed_events_) e.tokens.assign(tokens.begin(), tokens.end());
  e.has_parent = parent.has_value();
  e.parent_block_id = parent.value_or(0);
  events_.Append(std::move(e));
}

void Tenant::FlushRemovals() {
  for (PendingRemoval& p : pending_removals_) {
    Event e;
    e.type = EventType::kBlockRemoved;
    e.ns = std::move(p.ns);
    e.block_ids = std::move(p.ids);
    e.reason = p.reason;
    events_.Append(std::move(e));
  }
  pending_removals_.clear();
  for (const std::string& ns : maybe_empty_) DropTreeIfEmpty(ns);
  maybe_empty_.clear();
}

// --- Reading ----------------------------------------------------------------

TenantUsage Tenant::Stats(uint64_t block_bytes) const {
  TenantUsage s = counters_;
  s.reserved_bytes = reserved_blocks_ * block_bytes;
  s.limit_bytes = limit_blocks_ * block_bytes;
  s.cached_blocks = cached_blocks_;
  s.pinned_blocks = pinned_blocks_;
  s.tree_nodes = nodes_;
  s.namespaces = trees_.size();
  s.active_leases = leases_.size();
  for (int c = 0; c < 3; ++c)
    s.cached_blocks_by_retention[c] = blocks_by_retention_[c];
  return s;
}

std::vector<std::string> Tenant::Namespaces() const {
  std::vector<std::string> out;
  for (const auto& [ns, tree] : trees_) out.push_back(ns);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<DumpNode> Tenant::Dump(const Tree& tree) const {
  std::vector<DumpNode> out;
  // Children in token order, so that dumps are stable across runs.
  auto visit = [&](auto&& self, const Node& node, int depth) -> void {
    std::vector<const Node*> kids;
    for (const auto& c : node.children) kids.push_back(c.get());
    std::sort(kids.begin(), kids.end(), [](const Node* a, const Node* b) {
      const auto x = a->tokens(), y = b->tokens();
      return std::lexicographical_compare(x.begin(), x.end(), y.begin(),
                                          y.end());
    });
    for (const Node* c : kids) {
      out.push_back(DumpNode{
          depth, c->position, c->stamp, c->pins,
          std::vector<Token>(c->tokens().begin(), c->tokens().end()),
          std::vector<BlockId>(c->block_ids().begin(), c->block_ids().end())});
      self(self, *c, depth + 1);
    }
  };
  visit(visit, tree.root, 1);
  return out;
}

bool Tenant::CheckInvariants(const BlockIndex& index,
                             std::string* error) const {
  auto fail = [&](const std::string& what) {
    *error = absl::StrCat("tenant '", name_, "': ", what);
    return false;
  };
  std::string lease_error;
  if (!leases_.CheckInvariants(&lease_error)) return fail(lease_error);
  // Pins a node must have: one per lease whose end is in its subtree.
  absl::flat_hash_map<const Node*, int32_t> expected_pins;
  for (const auto& [id, lease] : leases_.all()) {
    for (const Node* n = lease.end; !n->is_root(); n = n->parent)
      ++expected_pins[n];
  }

  uint64_t cached = 0, pinned = 0, nodes = 0, recent = 0;
  uint64_t by_retention[3] = {0, 0, 0};
  size_t lru_members = 0;                 // nodes with an entry
  absl::flat_hash_set<const Node*> live;  // every node of this tenant
  for (const auto& entry : trees_) {
    const std::string& ns = entry.first;
    const Tree* tree = entry.second.get();
    if (tree->ns != ns) return fail("tree keyed under another namespace");
    if (tree->root.children.empty())
      return fail(absl::StrCat("empty tree '", ns, "' kept"));
    if (tree->block_size != block_size_) {
      return fail(absl::StrFormat("tree '%s' has block_size %d, the tenant %d",
                                  ns, tree->block_size, block_size_));
    }
    if (tree->root.tree != tree) return fail("root points at another tree");
    if (tree->root.lru_key != 0)
      return fail("a root has an LRU entry or a class");
    uint64_t tree_blocks = 0, tree_nodes = 0;
    std::string err;
    auto check = [&](auto&& self, const Node& parent)
                     ABSL_SHARED_LOCKS_REQUIRED(mu_) -> bool {
      for (const auto& c : parent.children) {
        const Node& n = *c;
        if (n.parent != &parent) return fail("child's parent pointer is wrong");
        if (n.tree != tree) return fail("node points at another tree");
        if (n.num_blocks() == 0) return fail("empty non-root node");
        if (n.key_hash != MakeBlockKey(n.block(0)).hash)
          return fail("stale child key");
        if (!parent.is_root() && n.stamp > parent.stamp) {
          return fail("a node is more recent than its parent");
        }
        auto it = expected_pins.find(&n);
        const int32_t want = it == expected_pins.end() ? 0 : it->second;
        if (n.pins != want) {
          return fail(absl::StrFormat("node pinned %d times, leases say %d",
                                      n.pins, want));
        }
        // The lazy entry sets (tenant.h): an evictable node has an entry
        // in its class's set; an entry's key is its node's and no newer
        // than its stamp. LRU has one class.
        if (n.evictable() && EntryKey(n) == 0)
          return fail("an evictable node has no LRU entry");
        if (ClassOf(n) != kRecent && !policy_.adaptive())
          return fail("a node has ADAPTIVE's second class under LRU");
        if (ClassOf(n) == kRecent) recent += n.num_blocks();
        if (PriorityOf(n) > kMaxRetentionPriority)
          return fail(absl::StrFormat("a node has priority %d", PriorityOf(n)));
        by_retention[RetentionClass(PriorityOf(n))] += n.num_blocks();
        if (!policy_.CheckFingerprints(n))
          return fail("a block's fingerprint is missing or wrong");
        if (EntryKey(n) != 0) {
          if (EntryKey(n) > n.stamp) {
            return fail(absl::StrFormat(
                "LRU entry at %d is newer than its node's stamp %d",
                EntryKey(n), n.stamp));
          }
          if (!policy_.HasEntry(n))
            return fail("a node's LRU entry is missing from its class's set");
          ++lru_members;
        }
        live.insert(&n);
        for (BlockId id : n.block_ids()) {
          auto owner = index.Find(id);
          if (!owner || owner->tenant != index_ || owner->node != &n) {
            return fail(
                absl::StrFormat("block %d is not indexed at its node", id));
          }
        }
        tree_blocks += n.num_blocks();
        ++tree_nodes;
        if (n.pins > 0) pinned += n.num_blocks();
        if (!self(self, n)) return false;
      }
      return true;
    };
    if (!check(check, tree->root)) return false;
    if (tree_blocks != tree->blocks || tree_nodes != tree->nodes) {
      return fail(absl::StrCat("tree '", ns, "' counts are off"));
    }
    cached += tree_blocks;
    nodes += tree_nodes;
  }
  // Each node with an entry found it above; every entry must name a live
  // node of this tenant under that node's lru_key (never a freed one), so
  // the counts agree and no node has two.
  std::string entry_error;
  policy_.ForEachEntry([&](int cls, uint64_t key, const Node* node) {
    if (!entry_error.empty()) return;
    if (!live.contains(node)) {
      entry_error = "an LRU entry names a node that is not in the trees";
    } else if (EntryKey(*node) == 0 || SetKey(*node) != key ||
               ClassOf(*node) != cls) {
      entry_error =
          absl::StrFormat("entry at %d in set %d, its node says %d in class %d",
                          key, cls, SetKey(*node), ClassOf(*node));
    }
  });
  if (!entry_error.empty()) return fail(entry_error);
  if (lru_members != policy_.num_entries())
    return fail(absl::StrFormat("%d nodes have an LRU entry, the sets hold %d",
                                lru_members, policy_.num_entries()));
  if (policy_.num_fingerprint_nodes() != (policy_.adaptive() ? nodes : 0)) {
    return fail(absl::StrFormat("fingerprints of %d nodes, %d nodes cached",
                                policy_.num_fingerprint_nodes(), nodes));
  }
  if (recent != policy_.recent_blocks()) {
    return fail(absl::StrFormat("%d blocks seen once, the policy counts %d",
                                recent, policy_.recent_blocks()));
  }
  const History& h = policy_.history();
  if (policy_.target() > limit_blocks_ || !h.CheckInvariants()) {
    return fail(absl::StrFormat(
        "ADAPTIVE's target %d (limit %d) or history (%d and %d of %d) is off",
        policy_.target(), limit_blocks_, h.size(0), h.size(1), h.capacity()));
  }
  for (int c = 0; c < 3; ++c) {
    if (by_retention[c] != blocks_by_retention_[c]) {
      return fail(absl::StrFormat(
          "%d blocks in retention class %d, the tenant counts %d",
          by_retention[c], c, blocks_by_retention_[c]));
    }
  }
  if (lapses_.size() != lapse_order_.size())
    return fail("lapse map and lapse order differ in size");
  for (const auto& [time, node] : lapse_order_) {
    auto it = lapses_.find(node);
    if (!live.contains(node) || it == lapses_.end() || it->second != time ||
        PriorityOf(*node) == kDefaultRetentionPriority)
      return fail("a lapse names a dead node, disagrees, or has priority 50");
  }
  if (cached != cached_blocks_) {
    return fail(absl::StrFormat("cached_blocks %d, trees hold %d",
                                cached_blocks_, cached));
  }
  if (pinned != pinned_blocks_) {
    return fail(absl::StrFormat("pinned_blocks %d, nodes say %d",
                                pinned_blocks_, pinned));
  }
  if (nodes != nodes_) return fail("node count is off");
  if (cached_blocks_ > limit_blocks_) {
    return fail(absl::StrFormat("holds %d blocks over its limit of %d",
                                cached_blocks_, limit_blocks_));
  }
  return true;
}

}  // namespace prefixd
