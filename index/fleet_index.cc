#include "index/fleet_index.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace prefixd {
namespace {

// A holder packs (worker, medium): 24 bits of worker, 8 of medium.
constexpr uint32_t kMaxWorkers = 1u << 24;
constexpr size_t kMaxMediums = 256;
uint32_t PackHolder(WorkerId w, uint8_t medium) { return (w << 8) | medium; }
WorkerId HolderWorker(uint32_t h) { return h >> 8; }
uint8_t HolderMedium(uint32_t h) { return static_cast<uint8_t>(h & 0xff); }

// The index's trees key a block by a 64-bit fingerprint of its tokens, kept
// as two Tokens: core's tree then compares 8 bytes per block instead of
// block_size x 4, and stores 8 (at 16-token blocks, 56 bytes of RSS less
// per block; docs/performance.md). Two different blocks at the same place
// in a tree collide with probability 2^-64 per comparison; the cost of a
// collision is one request routed to a worker that computes its prefill
// (docs/index.md).
constexpr int kKeyTokens = 2;

// keys[2i, 2i+1] = the fingerprint of block i of `tokens`, for `blocks`
// whole blocks of `bs` tokens.
void BlockKeys(absl::Span<const Token> tokens, size_t bs, size_t blocks,
               Token* keys) {
  for (size_t i = 0; i < blocks; ++i) {
    const uint64_t f = absl::HashOf(tokens.subspan(i * bs, bs));
    keys[kKeyTokens * i] = static_cast<Token>(f);
    keys[kKeyTokens * i + 1] = static_cast<Token>(f >> 32);
  }
}

bool SameKey(absl::Span<const Token> a, absl::Span<const Token> b) {
  return a[0] == b[0] && a[1] == b[1];
}

}  // namespace

absl::string_view WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kConnecting:
      return "CONNECTING";
    case WorkerState::kLive:
      return "LIVE";
    case WorkerState::kReplaying:
      return "REPLAYING";
    case WorkerState::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

absl::string_view ClearReasonName(ClearReason reason) {
  static constexpr absl::string_view kNames[kNumClearReasons] = {
      "all_blocks_cleared", "restart", "replay_failed", "undecodable",
      "block_size",         "removed", "reconnect"};
  return kNames[static_cast<int>(reason)];
}

absl::string_view DropReasonName(DropReason reason) {
  static constexpr absl::string_view kNames[kNumDropReasons] = {
      "unknown_parent", "extra_keys", "group", "max_entries", "block_size"};
  return kNames[static_cast<int>(reason)];
}

// One indexed block: where it sits and who holds it. A free slot has no
// node; its generation advances whenever it is freed, so a worker's stale
// reference to it (SlotRef) can never name the block that reuses it.
struct FleetIndex::Slot {
  Node* node = nullptr;
  uint32_t gen = 0;
  absl::InlinedVector<uint32_t, 2> holders;  // PackHolder values
};

struct FleetIndex::Worker {
  WorkerId id = 0;
  std::string name;
  std::string endpoint;
  bool retired = false;
  WorkerState state = WorkerState::kConnecting;
  std::string detail;
  // The engine's block hashes -> the blocks they name, for this worker only.
  absl::flat_hash_map<EngineHash, SlotRef> blocks;
  std::vector<uint64_t> medium_blocks;  // by medium id
  std::array<uint64_t, kNumEventTypes> events_by_type = {};
  uint64_t gaps = 0;
  uint64_t replays_ok = 0;
  uint64_t replays_failed = 0;
  uint64_t dropped_blocks = 0;
  uint64_t unknown_fields = 0;
  std::array<uint64_t, kNumClearReasons> clears = {};
  int64_t last_seq = -1;
  int64_t last_event_unix_ms = 0;
  double last_ts = 0;  // the engine's timestamp of the last batch applied
};

FleetIndex::FleetIndex(IndexOptions options) : options_(options) {
  absl::MutexLock lock(&mu_);
  mediums_.reserve(kMaxMediums);
}
FleetIndex::~FleetIndex() = default;

std::string FleetIndex::NamespaceKey(absl::string_view lora_name,
                                     int64_t lora_id,
                                     absl::string_view cache_salt) {
  std::string key;
  if (!lora_name.empty()) {
    key = absl::StrCat("n:", lora_name);
  } else if (lora_id != 0) {
    key = absl::StrCat("i:", lora_id);
  }
  absl::StrAppend(&key, "\x1f", cache_salt);
  return key;
}

// --- Workers ----------------------------------------------------------------

WorkerId FleetIndex::AddWorker(absl::string_view name,
                               absl::string_view endpoint) {
  absl::MutexLock lock(&mu_);
  auto it = worker_ids_.find(name);
  if (it != worker_ids_.end()) {
    Worker& w = *workers_[it->second];
    if (w.retired) {
      w.retired = false;
      w.state = WorkerState::kConnecting;
      w.last_seq = -1;
    }
    w.endpoint = std::string(endpoint);
    return w.id;
  }
  // Holders pack the worker in 24 bits.
  if (workers_.size() >= kMaxWorkers) std::abort();
  auto w = std::make_unique<Worker>();
  w->id = static_cast<WorkerId>(workers_.size());
  w->name = std::string(name);
  w->endpoint = std::string(endpoint);
  w->medium_blocks.resize(mediums_.size());
  worker_ids_[w->name] = w->id;
  workers_.push_back(std::move(w));
  return workers_.back()->id;
}

void FleetIndex::RetireWorker(WorkerId id) {
  absl::MutexLock lock(&mu_);
  Worker& w = *workers_[id];
  ClearLocked(w, ClearReason::kRemoved);
  w.retired = true;
}

void FleetIndex::SetState(WorkerId id, WorkerState state,
                          absl::string_view detail) {
  absl::MutexLock lock(&mu_);
  Worker& w = *workers_[id];
  w.state = state;
  if (!detail.empty()) w.detail = std::string(detail);
}

void FleetIndex::CountGap(WorkerId id) {
  absl::MutexLock lock(&mu_);
  ++workers_[id]->gaps;
}

void FleetIndex::CountReplay(WorkerId id, bool ok) {
  absl::MutexLock lock(&mu_);
  ++(ok ? workers_[id]->replays_ok : workers_[id]->replays_failed);
}

void FleetIndex::SetLastSeq(WorkerId id, int64_t seq) {
  absl::MutexLock lock(&mu_);
  workers_[id]->last_seq = seq;
}

void FleetIndex::ClearWorker(WorkerId id, ClearReason reason,
                             absl::string_view detail) {
  absl::MutexLock lock(&mu_);
  Worker& w = *workers_[id];
  ClearLocked(w, reason);
  w.state = WorkerState::kConnecting;
  if (!detail.empty()) w.detail = std::string(detail);
}

// --- Slots and holders ------------------------------------------------------

uint32_t FleetIndex::NewSlot(Node* node) {
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

void FleetIndex::FreeSlot(uint32_t id) {
  Slot& s = slots_[id];
  assert(s.holders.empty());
  s.node = nullptr;
  ++s.gen;
  free_slots_.push_back(id);
}

FleetIndex::Slot* FleetIndex::Resolve(SlotRef ref) {
  Slot& s = slots_[ref.slot];
  return s.node != nullptr && s.gen == ref.gen ? &s : nullptr;
}

uint8_t FleetIndex::MediumId(absl::string_view medium) {
  for (size_t i = 0; i < mediums_.size(); ++i) {
    if (mediums_[i] == medium) return static_cast<uint8_t>(i);
  }
  // A stream naming hundreds of tiers is broken; fold the rest into the last.
  if (mediums_.size() == kMaxMediums) return kMaxMediums - 1;
  mediums_.emplace_back(medium);
  for (auto& w : workers_) w->medium_blocks.resize(mediums_.size());
  return static_cast<uint8_t>(mediums_.size() - 1);
}

void FleetIndex::Hold(Worker& w, uint32_t slot, uint8_t medium,
                      EngineHash hash) {
  const uint32_t h = PackHolder(w.id, medium);
  {
    Slot& s = slots_[slot];
    if (std::find(s.holders.begin(), s.holders.end(), h) == s.holders.end()) {
      s.holders.push_back(h);
      ++entries_;
      ++w.medium_blocks[medium];
    }
  }
  const SlotRef ref{slot, slots_[slot].gen};
  auto [it, inserted] = w.blocks.try_emplace(hash, ref);
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
      Unhold(w, old.slot, static_cast<uint8_t>(m));
    if (s->holders.empty()) Prune(s->node);
  }
}

bool FleetIndex::Unhold(Worker& w, uint32_t slot, uint8_t medium) {
  Slot& s = slots_[slot];
  const uint32_t h = PackHolder(w.id, medium);
  auto it = std::find(s.holders.begin(), s.holders.end(), h);
  if (it != s.holders.end()) {
    s.holders.erase(it);
    --entries_;
    --w.medium_blocks[medium];
  }
  return std::none_of(s.holders.begin(), s.holders.end(),
                      [&](uint32_t x) { return HolderWorker(x) == w.id; });
}

// --- Tree edits -------------------------------------------------------------

Tree* FleetIndex::GetOrCreateTree(const std::string& key) {
  auto& tree = trees_[key];
  if (tree == nullptr) tree = std::make_unique<Tree>(key, kKeyTokens);
  return tree.get();
}

//   BlockStored(parent = hash(B), blocks C', X):
//   root ── [A B C D]      becomes      root ── [A B C] ─┬─ [D]
//                                                        └─ [X]
// when C' has C's tokens: C gains the holder, the edge splits after it and
// X hangs below as a new child. A childless edge is extended in place.
void FleetIndex::ApplyStored(Worker& w, const BlockStoredEvent& ev,
                             uint64_t stamp) {
  const size_t n = ev.block_hashes.size();
  if (ev.group_idx != 0) {
    CountDropped(w, DropReason::kGroup, n);
    return;
  }
  const size_t chain = std::min(ev.chain_blocks, n);
  if (chain < n) CountDropped(w, DropReason::kExtraKeys, n - chain);
  if (chain == 0) return;

  // Where the new blocks start: after `used` blocks of `node`.
  Node* node;
  size_t used;
  if (!ev.parent_block_hash.has_value()) {
    node = &GetOrCreateTree(NamespaceKey(ev.lora_name.value_or(""),
                                         ev.lora_id.value_or(0), ev.cache_salt))
                ->root;
    used = 0;
  } else {
    auto it = w.blocks.find(*ev.parent_block_hash);
    Slot* parent = it == w.blocks.end() ? nullptr : Resolve(it->second);
    if (parent == nullptr) {
      CountDropped(w, DropReason::kUnknownParent, chain);
      return;
    }
    node = parent->node;
    auto ids = node->block_ids();
    used =
        static_cast<size_t>(std::find(ids.begin(), ids.end(), it->second.slot) -
                            ids.begin()) +
        1;
  }

  const uint8_t medium = MediumId(ev.medium);
  key_scratch_.resize(chain * kKeyTokens);
  BlockKeys(ev.token_ids, static_cast<size_t>(options_.block_size), chain,
            key_scratch_.data());
  const absl::Span<const Token> keys(key_scratch_);
  for (size_t i = 0; i < chain; ++i) {
    const absl::Span<const Token> block =
        keys.subspan(i * kKeyTokens, kKeyTokens);
    node->stamp = stamp;
    if (used < node->num_blocks()) {
      if (SameKey(node->block(used), block)) {
        Hold(w, static_cast<uint32_t>(node->block_ids()[used]), medium,
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
      Hold(w, static_cast<uint32_t>(node->block_ids()[0]), medium,
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
      Hold(w, static_cast<uint32_t>(ids[k]), medium, ev.block_hashes[i + k]);
    }
    return;
  }
}

void FleetIndex::CountDropped(Worker& w, DropReason reason, size_t blocks) {
  dropped_[static_cast<int>(reason)] += blocks;
  w.dropped_blocks += blocks;
}

void FleetIndex::ApplyRemoved(Worker& w, const BlockRemovedEvent& ev) {
  // Other KV-cache groups reuse hashes: skipped before any lookup.
  if (ev.group_idx != 0) return;
  const uint8_t medium = MediumId(ev.medium);
  for (EngineHash hash : ev.block_hashes) {
    auto it = w.blocks.find(hash);
    if (it == w.blocks.end()) continue;
    const SlotRef ref = it->second;
    Slot* s = Resolve(ref);
    if (s == nullptr) {
      w.blocks.erase(it);
      continue;
    }
    if (Unhold(w, ref.slot, medium)) w.blocks.erase(it);
    if (s->holders.empty()) Prune(s->node);
  }
}

void FleetIndex::Prune(Node* node) {
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

void FleetIndex::ClearLocked(Worker& w, ClearReason reason) {
  ++w.clears[static_cast<int>(reason)];
  std::vector<SlotRef> emptied;
  for (const auto& [hash, ref] : w.blocks) {
    Slot* s = Resolve(ref);
    if (s == nullptr) continue;
    for (size_t m = 0; m < mediums_.size(); ++m)
      Unhold(w, ref.slot, static_cast<uint8_t>(m));
    if (s->holders.empty()) emptied.push_back(ref);
  }
  // A prune frees only blocks without holders, so a later ref that still
  // resolves is still the emptied block.
  for (SlotRef ref : emptied) {
    if (Slot* s = Resolve(ref); s != nullptr) Prune(s->node);
  }
  absl::flat_hash_map<EngineHash, SlotRef>().swap(w.blocks);
  std::fill(w.medium_blocks.begin(), w.medium_blocks.end(), 0);
}

// Past max_entries, the least recently stored or routed leaves lose their
// tail blocks (every holder at once) until 1% of the bound is free again, so
// the scan of the leaves that finds them is paid once per 1% of churn.
void FleetIndex::EnforceMaxEntries() {
  if (entries_ <= options_.max_entries) return;
  const uint64_t target = options_.max_entries - options_.max_entries / 100;
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
        Worker& w = *workers_[HolderWorker(h)];
        --w.medium_blocks[HolderMedium(h)];
        ++w.dropped_blocks;
        --entries_;
      }
      s.holders.clear();
      ++dropped_[static_cast<int>(DropReason::kMaxEntries)];
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
}

// --- Apply ------------------------------------------------------------------

void FleetIndex::Apply(WorkerId id, const KvEventBatch& batch, int64_t seq,
                       absl::Time now) {
  absl::MutexLock lock(&mu_);
  Worker& w = *workers_[id];
  w.last_seq = seq;
  w.last_event_unix_ms = absl::ToUnixMillis(now);
  w.last_ts = batch.ts;
  const double lag = std::max(
      0.0, absl::ToDoubleSeconds(now - absl::FromUnixNanos(static_cast<int64_t>(
                                           batch.ts * 1e9))));
  const size_t bucket =
      std::lower_bound(kLagBuckets.begin(), kLagBuckets.end(), lag) -
      kLagBuckets.begin();
  ++lag_counts_[bucket];
  lag_sum_ += lag;
  w.events_by_type[3] += batch.unknown_events;
  w.unknown_fields += batch.unknown_fields;

  // A wrong block size anywhere in the batch: nothing of it can be trusted
  // to line up with the index's blocks.
  for (const KvEvent& e : batch.events) {
    const auto* st = std::get_if<BlockStoredEvent>(&e);
    if (st == nullptr || st->group_idx != 0 ||
        st->block_size == options_.block_size) {
      continue;
    }
    if (w.state != WorkerState::kError) ClearLocked(w, ClearReason::kBlockSize);
    w.state = WorkerState::kError;
    w.detail = absl::StrFormat(
        "events carry block_size %d but index.block_size is %d: set "
        "--index_block_size to the engine's block size",
        st->block_size, options_.block_size);
    uint64_t blocks = 0;
    for (const KvEvent& x : batch.events) {
      if (const auto* s = std::get_if<BlockStoredEvent>(&x))
        blocks += s->block_hashes.size();
    }
    dropped_[static_cast<int>(DropReason::kBlockSize)] += blocks;
    w.dropped_blocks += blocks;
    return;
  }

  const uint64_t stamp = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  for (const KvEvent& e : batch.events) {
    if (const auto* st = std::get_if<BlockStoredEvent>(&e)) {
      ++w.events_by_type[0];
      ApplyStored(w, *st, stamp);
    } else if (const auto* rm = std::get_if<BlockRemovedEvent>(&e)) {
      ++w.events_by_type[1];
      ApplyRemoved(w, *rm);
    } else {
      ++w.events_by_type[2];
      ClearLocked(w, ClearReason::kAllBlocksCleared);
    }
  }
  w.state = WorkerState::kLive;
  EnforceMaxEntries();
}

// --- Route ------------------------------------------------------------------

RouteResult FleetIndex::Route(const RouteQuery& q) const {
  RouteResult result;
  const size_t bs = static_cast<size_t>(options_.block_size);
  result.prompt_blocks = q.tokens.size() / bs;
  const absl::Time now = absl::Now();
  absl::InlinedVector<Token, 512> keys(result.prompt_blocks * kKeyTokens);
  BlockKeys(q.tokens, bs, result.prompt_blocks, keys.data());

  absl::ReaderMutexLock lock(&mu_);
  const size_t num_workers = workers_.size();
  const size_t num_mediums = std::max<size_t>(mediums_.size(), 1);
  // run[w]: leading blocks held by w in any medium; run[W + w*M + m]: in m.
  absl::InlinedVector<uint32_t, 64> run(num_workers * (1 + num_mediums), 0);
  uint32_t* by_medium = run.data() + num_workers;
  auto tree = trees_.find(NamespaceKey(q.lora_name, q.lora_id, q.cache_salt));
  if (tree != trees_.end()) {
    const WalkPath path = Walk(*tree->second, keys, 0, false);
    const uint64_t stamp = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
    uint32_t b = 0;  // prompt block index
    bool advanced = true;
    for (const WalkStep& step : path) {
      // Other Routes may stamp the same node under the shared lock.
      std::atomic_ref<uint64_t>(step.node->stamp)
          .store(stamp, std::memory_order_relaxed);
      const auto ids = step.node->block_ids();
      // The slots are scattered: ask for all of this step's at once rather
      // than miss the cache once per block.
      for (size_t k = 0; k < step.blocks; ++k) {
        __builtin_prefetch(&slots_[ids[k]]);
      }
      for (size_t k = 0; k < step.blocks && advanced; ++k, ++b) {
        advanced = false;
        for (uint32_t h : slots_[ids[k]].holders) {
          const WorkerId w = HolderWorker(h);
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

  // Sorted as (blocks, worker) pairs, then written out in order: cheaper
  // than sorting the answers themselves.
  struct Scored {
    uint32_t blocks;
    WorkerId id;
    const std::string* name;  // the worker's, for ties
  };
  absl::InlinedVector<Scored, 32> order;
  for (const auto& wp : workers_) {
    const Worker& w = *wp;
    if (w.retired) continue;
    if (!q.workers.empty() && std::find(q.workers.begin(), q.workers.end(),
                                        w.name) == q.workers.end()) {
      continue;
    }
    order.push_back({run[w.id], w.id, &w.name});
  }
  std::sort(order.begin(), order.end(), [](const Scored& a, const Scored& b) {
    if (a.blocks != b.blocks) return a.blocks > b.blocks;
    return *a.name < *b.name;
  });
  result.workers.resize(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const Worker& w = *workers_[order[i].id];
    WorkerMatch& m = result.workers[i];
    m.worker = w.name;
    m.matched_blocks = order[i].blocks;
    for (size_t k = 0; k < mediums_.size(); ++k) {
      const uint32_t held = by_medium[w.id * num_mediums + k];
      if (held > 0) m.mediums.push_back({mediums_[k], held});
    }
    m.state = w.state;
    m.last_seq = w.last_seq;
    if (w.last_seq >= 0) {
      m.lag_ms = std::max<int64_t>(
          0, absl::ToInt64Milliseconds(
                 now -
                 absl::FromUnixNanos(static_cast<int64_t>(w.last_ts * 1e9))));
    }
  }
  uint64_t best = 0;
  if (!result.workers.empty() && result.workers[0].matched_blocks > 0) {
    result.best_worker = result.workers[0].worker;
    best = result.workers[0].matched_blocks;
  }
  route_requests_.fetch_add(1, std::memory_order_relaxed);
  route_prompt_blocks_.fetch_add(result.prompt_blocks,
                                 std::memory_order_relaxed);
  route_matched_blocks_.fetch_add(best, std::memory_order_relaxed);
  return result;
}

// --- Introspection ----------------------------------------------------------

WorkerStatus FleetIndex::StatusLocked(const Worker& w, absl::Time now) const {
  WorkerStatus s;
  s.worker = w.name;
  s.endpoint = w.endpoint;
  s.state = w.state;
  s.state_detail = w.detail;
  for (size_t i = 0; i < mediums_.size(); ++i) {
    if (w.medium_blocks[i] > 0)
      s.mediums.push_back({mediums_[i], w.medium_blocks[i]});
  }
  s.events_by_type = w.events_by_type;
  for (uint64_t n : w.events_by_type) s.events += n;
  s.gaps = w.gaps;
  s.replays_ok = w.replays_ok;
  s.replays_failed = w.replays_failed;
  s.dropped_blocks = w.dropped_blocks;
  s.unknown_fields = w.unknown_fields;
  s.clears = w.clears;
  s.last_seq = w.last_seq;
  s.last_event_unix_ms = w.last_event_unix_ms;
  if (w.last_seq >= 0) {
    s.lag_ms = std::max<int64_t>(
        0,
        absl::ToInt64Milliseconds(
            now - absl::FromUnixNanos(static_cast<int64_t>(w.last_ts * 1e9))));
  }
  return s;
}

IndexStats FleetIndex::Stats() const {
  const absl::Time now = absl::Now();
  IndexStats stats;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& w : workers_) {
    if (!w->retired) stats.workers.push_back(StatusLocked(*w, now));
  }
  std::sort(stats.workers.begin(), stats.workers.end(),
            [](const WorkerStatus& a, const WorkerStatus& b) {
              return a.worker < b.worker;
            });
  stats.entries = entries_;
  stats.max_entries = options_.max_entries;
  for (const auto& [key, tree] : trees_) {
    stats.blocks += tree->blocks;
    stats.nodes += tree->nodes;
  }
  stats.dropped = dropped_;
  stats.lag_counts = lag_counts_;
  stats.lag_sum = lag_sum_;
  stats.route_requests = route_requests_.load(std::memory_order_relaxed);
  stats.route_prompt_blocks =
      route_prompt_blocks_.load(std::memory_order_relaxed);
  stats.route_matched_blocks =
      route_matched_blocks_.load(std::memory_order_relaxed);
  return stats;
}

uint64_t FleetIndex::entries() const {
  absl::ReaderMutexLock lock(&mu_);
  return entries_;
}

bool FleetIndex::CheckInvariants(std::string* error) const {
  absl::ReaderMutexLock lock(&mu_);
  const auto fail = [&](std::string what) {
    *error = std::move(what);
    return false;
  };
  uint64_t entries = 0;
  std::vector<std::vector<uint64_t>> held(
      workers_.size(), std::vector<uint64_t>(mediums_.size()));
  absl::flat_hash_set<uint32_t> live;
  for (const auto& [key, tree] : trees_) {
    if (tree->root.children.empty()) return fail("an empty tree is kept");
    uint64_t blocks = 0;
    bool ok = true;
    // Gathered first, so that slots_ is read where lock analysis sees it.
    std::vector<const Node*> nodes;
    ForEachBelow(tree->root, [&](const Node& n, int) { nodes.push_back(&n); });
    for (const Node* n : nodes) {
      blocks += n->num_blocks();
      for (BlockId id : n->block_ids()) {
        const Slot& s = slots_[id];
        if (s.node != n) ok = false;
        live.insert(static_cast<uint32_t>(id));
        entries += s.holders.size();
        for (uint32_t h : s.holders) ++held[HolderWorker(h)][HolderMedium(h)];
      }
      if (n->children.empty() &&
          slots_[n->block_ids().back()].holders.empty()) {
        ok = false;
      }
    }
    if (!ok) {
      return fail(absl::StrCat("tree ", key,
                               ": a slot names another node, or a leaf ends "
                               "in a block nobody holds"));
    }
    if (blocks != tree->blocks || nodes.size() != tree->nodes) {
      return fail(absl::StrCat("tree ", key, ": counts ", tree->blocks, "/",
                               tree->nodes, " but holds ", blocks, "/",
                               nodes.size()));
    }
  }
  if (entries != entries_) {
    return fail(
        absl::StrCat("entries_ is ", entries_, ", holders sum to ", entries));
  }
  if (live.size() + free_slots_.size() != slots_.size()) {
    return fail(absl::StrCat(live.size(), " live + ", free_slots_.size(),
                             " free slots != ", slots_.size()));
  }
  for (const auto& w : workers_) {
    for (size_t m = 0; m < mediums_.size(); ++m) {
      if (held[w->id][m] != w->medium_blocks[m]) {
        return fail(absl::StrCat("worker ", w->name, " medium ", mediums_[m],
                                 ": counts ", w->medium_blocks[m],
                                 " but holds ", held[w->id][m]));
      }
    }
  }
  return true;
}

}  // namespace prefixd
