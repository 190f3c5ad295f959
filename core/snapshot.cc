// Saving and restoring the whole cache (docs/operations.md).
//
// File layout (all integers little-endian; varints are LEB128):
//
//   "PFXDSNP3"                      magic and format version
//   string  fingerprint             the server's model fingerprint
//   fixed64 epoch                   the epoch the state belongs to
//   varint  block_size
//   varint  recency counter
//   varint  tenants, then per tenant: string name, TenantRecord::Save
//   fixed32 CRC-32 of every byte before it
//
// TenantRecord::Save writes counters (PFXDSNP3 added the evictions by retention
// class), the next event sequence, each tree's nodes
// in pre-order (depth, position, stamp, blocks, tokens, IDs) and each lease
// as (tree, node) indexes with its TTL and the time it had left, then the
// IDs parked for the tenant (EventOutbox::Park), still owed to its engine.
// PFXDSNP2 files (no evictions by retention class) load with those at 0;
// PFXDSNP1 files (no parked IDs) are refused as unreadable.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "core/cache.h"
#include "core/class_priority_stamp.h"
#include "core/snapshot_format.h"
#include "core/tenant.h"

namespace prefixd {
namespace {

constexpr absl::string_view kMagic = "PFXDSNP3";
// The previous format, still read: the same without the evictions by
// retention class.
constexpr absl::string_view kMagicV2 = "PFXDSNP2";
static_assert(kMagic.size() == kMagicV2.size());
constexpr size_t kMaxString = 1 << 16;
constexpr uint64_t kMaxBlocksPerNode = uint64_t{1} << 24;

uint64_t Ms(absl::Duration d) {
  return static_cast<uint64_t>(absl::ToInt64Milliseconds(d));
}

}  // namespace

// --- Tenant -----------------------------------------------------------------

// Writes and reads one tenant's record: everything but the name, which the
// cache writes and reads. Load REQUIRES an empty tenant; on error the tenant
// is left half-built and must be discarded with its cache. Stamps must lie
// in [1, max_stamp] (the snapshot's recency counter).
//
// Thread safety: the tenant's mutex, held by the caller.
class TenantRecord {
 public:
  struct Limits {
    absl::Time now;
    absl::Duration max_ttl;
    uint64_t max_stamp;
    // The record holds the evictions by retention class (PFXDSNP3; a
    // PFXDSNP2 record does not, and they start at 0).
    bool retention_counters;
  };

  static void Save(const Tenant& t, SnapshotWriter* w, absl::Time now)
      ABSL_SHARED_LOCKS_REQUIRED(TenantMutex(&t));
  static absl::Status Load(Tenant* t, SnapshotReader* r, const Limits& limits)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));

 private:
  using Where = absl::flat_hash_map<const Node*, std::pair<uint64_t, uint64_t>>;
  // The nodes of each tree read so far, in file order (leases name them).
  using NodesByTree = std::vector<std::vector<Node*>>;

  static void SaveCounters(const TenantUsage& c, SnapshotWriter* w);
  // The trees by namespace; *where gets each node's (tree, node) index.
  static void SaveTrees(const Tenant& t, SnapshotWriter* w, Where* where)
      ABSL_SHARED_LOCKS_REQUIRED(TenantMutex(&t));
  static void SaveLeases(const Tenant& t, const Where& where, SnapshotWriter* w,
                         absl::Time now)
      ABSL_SHARED_LOCKS_REQUIRED(TenantMutex(&t));

  static absl::Status LoadCounters(SnapshotReader* r, bool retention_counters,
                                   TenantUsage* c);
  static absl::Status LoadEventSequence(Tenant* t, SnapshotReader* r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  static absl::Status LoadTree(Tenant* t, SnapshotReader* r,
                               const Limits& limits, NodesByTree* nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  // One node; path[d] is the node last read at depth d (the root at 0).
  static absl::Status LoadNode(Tenant* t, SnapshotReader* r,
                               const Limits& limits, std::vector<Node*>* path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  static absl::Status LoadLease(Tenant* t, SnapshotReader* r,
                                const Limits& limits, const NodesByTree& nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  static absl::Status LoadParked(Tenant* t, SnapshotReader* r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
};

void TenantRecord::Save(const Tenant& t, SnapshotWriter* w, absl::Time now) {
  SaveCounters(t.counters_, w);
  w->Varint(t.outbox_.ring().next_sequence());
  Where where;
  SaveTrees(t, w, &where);
  SaveLeases(t, where, w, now);
  w->Varint(t.outbox_.parked().size());
  for (BlockId id : t.outbox_.parked()) w->Varint(id);
}

void TenantRecord::SaveCounters(const TenantUsage& c, SnapshotWriter* w) {
  for (uint64_t v :
       {c.match_requests, c.match_tokens, c.match_hit_tokens, c.insert_requests,
        c.inserted_blocks, c.redundant_blocks, c.lease_expired}) {
    w->Varint(v);
  }
  for (uint64_t v : c.evicted_blocks) w->Varint(v);
  for (uint64_t v : c.evicted_blocks_by_retention) w->Varint(v);
}

void TenantRecord::SaveTrees(const Tenant& t, SnapshotWriter* w, Where* where) {
  std::vector<const Tree*> trees;
  for (const auto& entry : t.trees_.all()) trees.push_back(entry.second.get());
  std::sort(trees.begin(), trees.end(),
            [](const Tree* a, const Tree* b) { return a->ns < b->ns; });
  w->Varint(trees.size());
  for (uint64_t ti = 0; ti < trees.size(); ++ti) {
    const Tree* tree = trees[ti];
    w->String(tree->ns);
    w->Varint(tree->nodes);
    uint64_t ni = 0;
    ForEachBelow(tree->root, [&](const Node& n, int depth) {
      (*where)[&n] = {ti, ni++};
      w->Varint(depth);
      w->Varint(n.position);
      w->Varint(n.stamp);
      w->Varint(n.num_blocks());
      for (Token token : n.tokens()) w->Varint(token);
      for (BlockId id : n.block_ids()) w->Varint(id);
    });
  }
}

void TenantRecord::SaveLeases(const Tenant& t, const Where& where,
                              SnapshotWriter* w, absl::Time now) {
  w->Varint(t.leases_.size());
  for (const auto& [id, lease] : t.leases_.table().all()) {
    const auto [ti, ni] = where.at(lease.end);
    w->Fixed64(id);
    w->Varint(ti);
    w->Varint(ni);
    w->Varint(Ms(lease.ttl));
    w->Varint(Ms(std::max(absl::ZeroDuration(), lease.expiry - now)));
  }
}

absl::Status TenantRecord::Load(Tenant* t, SnapshotReader* r,
                                const Limits& limits) {
  RETURN_IF_ERROR(LoadCounters(r, limits.retention_counters, &t->counters_));
  RETURN_IF_ERROR(LoadEventSequence(t, r));
  uint64_t ntrees;
  if (!r->Varint(&ntrees)) return r->Error("tree count");
  NodesByTree nodes;
  for (uint64_t ti = 0; ti < ntrees; ++ti)
    RETURN_IF_ERROR(LoadTree(t, r, limits, &nodes));
  uint64_t nleases;
  if (!r->Varint(&nleases)) return r->Error("lease count");
  for (uint64_t i = 0; i < nleases; ++i)
    RETURN_IF_ERROR(LoadLease(t, r, limits, nodes));
  RETURN_IF_ERROR(LoadParked(t, r));
  if (t->blocks_.cached() > t->blocks_.limit()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "snapshot: tenant '%s' holds %d blocks, over its limit of %d", t->name_,
        t->blocks_.cached(), t->blocks_.limit()));
  }
  return absl::OkStatus();
}

absl::Status TenantRecord::LoadCounters(SnapshotReader* r,
                                        bool retention_counters,
                                        TenantUsage* c) {
  for (uint64_t* v :
       {&c->match_requests, &c->match_tokens, &c->match_hit_tokens,
        &c->insert_requests, &c->inserted_blocks, &c->redundant_blocks,
        &c->lease_expired}) {
    if (!r->Varint(v)) return r->Error("tenant counters");
  }
  for (uint64_t& v : c->evicted_blocks) {
    if (!r->Varint(&v)) return r->Error("tenant counters");
  }
  if (retention_counters) {
    for (uint64_t& v : c->evicted_blocks_by_retention) {
      if (!r->Varint(&v)) return r->Error("tenant counters");
    }
  }
  return absl::OkStatus();
}

absl::Status TenantRecord::LoadEventSequence(Tenant* t, SnapshotReader* r) {
  uint64_t next_sequence;
  if (!r->Varint(&next_sequence) || next_sequence == 0)
    return r->Error("event sequence");
  t->outbox_.ContinueAt(next_sequence);
  return absl::OkStatus();
}

absl::Status TenantRecord::LoadTree(Tenant* t, SnapshotReader* r,
                                    const Limits& limits, NodesByTree* nodes) {
  std::string ns;
  uint64_t count;
  // Save never writes an empty tree (the cache drops them), and one would
  // break that invariant.
  if (!r->String(&ns, kMaxString) || !r->Varint(&count) || count == 0)
    return r->Error("tree header");
  if (t->trees_.Find(ns) != nullptr) {
    return absl::DataLossError(
        absl::StrCat("snapshot: namespace '", ns, "' appears twice"));
  }
  Tree* tree = t->GetOrCreateTree(ns);
  std::vector<Node*> path = {&tree->root};
  std::vector<Node*>& read = nodes->emplace_back();
  for (uint64_t ni = 0; ni < count; ++ni) {
    RETURN_IF_ERROR(LoadNode(t, r, limits, &path));
    read.push_back(path.back());
  }
  return absl::OkStatus();
}

absl::Status TenantRecord::LoadNode(Tenant* t, SnapshotReader* r,
                                    const Limits& limits,
                                    std::vector<Node*>* path) {
  const int bs = t->block_size_;
  uint64_t depth, position, stamp, nblocks;
  if (!r->Varint(&depth) || !r->Varint(&position) || !r->Varint(&stamp) ||
      !r->Varint(&nblocks) || depth == 0 || depth > path->size() ||
      // Save writes stamps the recency counter handed out (from 1 on): 0
      // would read as "no LRU entry" (tenant.h), and a stamp ahead of the
      // counter would be newer than the next touch's.
      stamp == 0 || stamp > limits.max_stamp || nblocks == 0 ||
      nblocks > kMaxBlocksPerNode || position > (uint64_t{1} << 62) ||
      // Each token and ID takes a byte at least: a count the rest of the
      // file cannot hold must not size an allocation.
      nblocks * (bs + 1) > r->remaining()) {
    return r->Error("node header");
  }
  std::vector<Token> tokens(nblocks * bs);
  std::vector<BlockId> ids(nblocks);
  for (Token& token : tokens) {
    uint64_t v;
    if (!r->Varint(&v) || v > UINT32_MAX) return r->Error("token");
    token = static_cast<Token>(v);
  }
  for (BlockId& id : ids) {
    if (!r->Varint(&id)) return r->Error("block id");
  }
  path->resize(depth);
  Node* parent = path->back();
  if (parent->FindChild(absl::MakeConstSpan(tokens).subspan(0, bs)) !=
      nullptr) {
    return absl::DataLossError(
        "snapshot: two children start with the same block");
  }
  if (!parent->is_root() && stamp > parent->stamp) {
    return absl::DataLossError(
        "snapshot: a node is more recent than its parent");
  }
  size_t failed = 0;
  if (!t->block_index_->ClaimAll(ids, t->index_, &failed)) {
    return absl::DataLossError(
        absl::StrFormat("snapshot: block id %d appears twice", ids[failed]));
  }
  path->push_back(t->AddRestoredNode(parent, tokens, ids,
                                     static_cast<int64_t>(position), stamp));
  return absl::OkStatus();
}

absl::Status TenantRecord::LoadLease(Tenant* t, SnapshotReader* r,
                                     const Limits& limits,
                                     const NodesByTree& nodes) {
  uint64_t id, ti, ni, ttl_ms, left_ms;
  if (!r->Fixed64(&id) || !r->Varint(&ti) || !r->Varint(&ni) ||
      !r->Varint(&ttl_ms) || !r->Varint(&left_ms) || id == 0 ||
      t->leases_.table().contains(id) || ti >= nodes.size() ||
      ni >= nodes[ti].size() || ttl_ms == 0 ||
      absl::Milliseconds(ttl_ms) > limits.max_ttl || left_ms > ttl_ms) {
    return r->Error("lease");
  }
  t->leases_.Restore(id, nodes[ti][ni], absl::Milliseconds(ttl_ms),
                     limits.now + absl::Milliseconds(left_ms));
  return absl::OkStatus();
}

absl::Status TenantRecord::LoadParked(Tenant* t, SnapshotReader* r) {
  uint64_t nparked;
  // Each ID takes a byte at least (as for nodes above).
  if (!r->Varint(&nparked) || nparked > r->remaining())
    return r->Error("parked count");
  std::vector<BlockId> parked(nparked);
  for (BlockId& id : parked) {
    if (!r->Varint(&id)) return r->Error("parked block id");
  }
  t->outbox_.RestoreParked(std::move(parked));
  return absl::OkStatus();
}

// --- PrefixCache -------------------------------------------------------------

std::string PrefixCache::SaveSnapshot(const SnapshotMeta& meta) const {
  MutexLock exclusive(&exclusive_mu_);
  ReaderMutexLock tenants(&tenants_mu_);
  TenantsLock all(tenant_order_);
  const absl::Time now = clock_->Now();
  SnapshotWriter w;
  w.Raw(kMagic);
  w.String(meta.fingerprint);
  w.Fixed64(meta.epoch);
  w.Varint(options_.block_size);
  w.Varint(stamp_.load());
  w.Varint(tenant_order_.size());
  for (const Tenant* t : all.tenants()) {
    all.AssertHeld(t);
    w.String(t->name());
    TenantRecord::Save(*t, &w, now);
  }
  w.Fixed32(Crc32(w.bytes()));
  return std::move(w.bytes());
}

uint64_t PrefixCache::MaxSnapshotBytes() const {
  // Each term is what Tenant::Save and SaveSnapshot write at most: a varint
  // takes up to 10 bytes (a token, a uint32, up to 5), a string its varint
  // length and its bytes.
  constexpr uint64_t kVarint = 10;
  const auto add = [](uint64_t a, uint64_t b) {
    uint64_t sum;
    return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
  };
  const auto mul = [](uint64_t a, uint64_t b) {
    uint64_t product;
    return __builtin_mul_overflow(a, b, &product) ? UINT64_MAX : product;
  };
  const CacheLimits& l = options_.limits;
  const uint64_t tenants =
      std::max<uint64_t>(l.max_tenants, options_.tenants.size());
  const uint64_t name = kVarint + l.max_namespace_bytes;
  const uint64_t counters = (7 + kNumEvictReasons + 3 + 1) * kVarint;
  const uint64_t tree = name + kVarint;
  const uint64_t lease = 8 + 4 * kVarint;
  // Per block: a node of its own (depth, position, stamp, count), its
  // tokens and its ID.
  const uint64_t block =
      4 * kVarint + static_cast<uint64_t>(options_.block_size) * 5 + kVarint;
  uint64_t per_tenant = name + counters + 3 * kVarint;  // + tree, lease,
                                                        // parked counts
  per_tenant = add(per_tenant, mul(l.max_namespaces_per_tenant, tree));
  per_tenant = add(per_tenant, mul(l.max_leases_per_tenant, lease));
  per_tenant = add(per_tenant, mul(budget_blocks_, kVarint));  // parked
  const uint64_t header =
      kMagic.size() + kVarint + kMaxString + 8 + 3 * kVarint + 4;
  return add(add(header, mul(tenants, per_tenant)), mul(budget_blocks_, block));
}

absl::StatusOr<SnapshotMeta> PrefixCache::ReadSnapshotMeta(
    absl::string_view bytes) {
  if (bytes.size() < kMagic.size() + 4 ||
      (bytes.substr(0, kMagic.size()) != kMagic &&
       bytes.substr(0, kMagic.size()) != kMagicV2)) {
    return absl::DataLossError(absl::StrFormat(
        "snapshot: not a prefixd snapshot (%d bytes, no '%s' or '%s' header)",
        bytes.size(), kMagic, kMagicV2));
  }
  SnapshotReader crc_reader(bytes.substr(bytes.size() - 4));
  uint32_t want;
  crc_reader.Fixed32(&want);
  const uint32_t got = Crc32(bytes.substr(0, bytes.size() - 4));
  if (got != want) {
    return absl::DataLossError(
        absl::StrFormat("snapshot: checksum %08x does not match the stored "
                        "%08x (%d bytes): truncated or corrupt",
                        got, want, bytes.size()));
  }
  SnapshotReader r(bytes.substr(kMagic.size()));
  SnapshotMeta meta;
  if (!r.String(&meta.fingerprint, kMaxString) || !r.Fixed64(&meta.epoch)) {
    return r.Error("header");
  }
  return meta;
}

absl::StatusOr<SnapshotMeta> PrefixCache::LoadSnapshot(
    absl::string_view bytes) {
  ASSIGN_OR_RETURN(SnapshotMeta meta, ReadSnapshotMeta(bytes));
  MutexLock exclusive(&exclusive_mu_);
  if (resident_blocks_.load() != 0 || !AllTenantsEmpty()) {
    return absl::FailedPreconditionError(
        "snapshot: can only be loaded into an empty cache");
  }
  SnapshotReader r(bytes.substr(0, bytes.size() - 4));
  absl::string_view skip;
  std::string fingerprint;
  uint64_t epoch, block_size, stamp, ntenants;
  r.Raw(kMagic.size(), &skip);
  const bool retention_counters = skip == kMagic;
  if (!r.String(&fingerprint, kMaxString) || !r.Fixed64(&epoch) ||
      !r.Varint(&block_size) || !r.Varint(&stamp) || !r.Varint(&ntenants) ||
      // Node::class_priority_stamp keeps stamps in 56 bits
      // (class_priority_stamp.h).
      stamp > kMaxStamp) {
    return r.Error("header");
  }
  if (block_size != static_cast<uint64_t>(options_.block_size)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("snapshot: block_size %d, this daemon uses %d",
                        block_size, options_.block_size));
  }
  const absl::Time now = clock_->Now();
  uint64_t total = 0;
  absl::flat_hash_set<std::string> names;
  for (uint64_t i = 0; i < ntenants; ++i) {
    std::string name;
    if (!r.String(&name, kMaxString)) return r.Error("tenant name");
    // A second record would load into the same tenant and count its blocks
    // twice.
    if (!names.insert(name).second) {
      return absl::DataLossError(
          absl::StrCat("snapshot: tenant '", name, "' appears twice"));
    }
    ASSIGN_OR_RETURN(Tenant * t, FindOrCreateTenant(name));
    MutexLock lock(&TenantMutex(t));
    RETURN_IF_ERROR(TenantRecord::Load(
        t, &r,
        {now, options_.limits.max_lease_ttl, stamp, retention_counters}));
    total += t->blocks().cached();
  }
  if (!r.done()) return r.Error("trailing data");
  if (total > budget_blocks_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "snapshot: holds %d blocks, over this daemon's budget of %d", total,
        budget_blocks_));
  }
  resident_blocks_.store(static_cast<int64_t>(total));
  stamp_.store(stamp);
  return meta;
}

bool PrefixCache::AllTenantsEmpty() const {
  for (Tenant* t : AllTenants()) {
    MutexLock lock(&TenantMutex(t));
    if (t->blocks().cached() != 0 || t->leases().size() != 0) return false;
  }
  return true;
}

}  // namespace prefixd
