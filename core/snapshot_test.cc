#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cache.h"
#include "core/snapshot_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class SnapshotTest : public ::testing::Test {
 protected:
  std::unique_ptr<PrefixCache> Make(uint64_t budget = 100, int block_size = 2) {
    CacheOptions o;
    o.block_size = block_size;
    o.block_bytes = 1;
    o.budget_bytes = budget;
    o.clock = &clock_;
    o.rope_shift = RopeShift::kAllow;
    o.default_lease_ttl = absl::Seconds(30);
    return std::move(PrefixCache::Create(o)).value();
  }

  // A hand-built file up to its first tree's node count: block_size 2, the
  // recency counter `counter`, one tenant "x" with zero counters, one tree
  // in namespace "". Tests append nodes, leases, parked IDs and the CRC.
  // `v2`: the previous format, PFXDSNP2, without the evictions by
  // retention class.
  static SnapshotWriter OneTreeHeader(uint64_t counter = 1, bool v2 = false) {
    SnapshotWriter w;
    w.Raw(v2 ? "PFXDSNP2" : "PFXDSNP3");
    w.String("fp");
    w.Fixed64(1);       // epoch
    w.Varint(2);        // block_size
    w.Varint(counter);  // recency counter
    w.Varint(1);        // tenants
    w.String("x");
    for (int i = 0; i < 7 + kNumEvictReasons; ++i) w.Varint(0);  // counters
    if (!v2) {
      for (int i = 0; i < 3; ++i) w.Varint(0);  // evictions by retention
    }
    w.Varint(1);   // next event sequence
    w.Varint(1);   // trees
    w.String("");  // namespace
    return w;
  }

  // Ends a OneTreeHeader file with one node (block 5 5, ID 99), no leases,
  // nothing parked, and the CRC.
  static void OneNodeAndCrc(SnapshotWriter* w) {
    w->Varint(1);  // nodes
    w->Varint(1);  // depth
    w->Varint(0);  // position
    w->Varint(1);  // stamp
    w->Varint(1);  // blocks
    w->Varint(5);  // tokens
    w->Varint(5);
    w->Varint(99);  // block id
    w->Varint(0);   // leases
    w->Varint(0);   // parked
    w->Fixed32(Crc32(w->bytes()));
  }

  static InsertResult Insert(PrefixCache& c, absl::string_view tenant,
                             std::vector<Token> tokens,
                             std::vector<BlockId> ids, int64_t offset = 0,
                             bool pin = false) {
    InsertRequest req;
    req.tokens = tokens;
    req.block_ids = ids;
    req.position_offset = offset;
    req.pin = pin;
    return std::move(c.Insert(tenant, req)).value();
  }

  // Inserts with a retention hint of `priority` that never lapses.
  static void InsertWithPriority(PrefixCache& c, absl::string_view tenant,
                                 std::vector<Token> tokens,
                                 std::vector<BlockId> ids, int priority) {
    InsertRequest req;
    req.tokens = tokens;
    req.block_ids = ids;
    req.retention = Retention{priority, absl::ZeroDuration(), {}};
    ASSERT_TRUE(c.Insert(tenant, req).ok());
  }

  static std::string Dump(PrefixCache& c) {
    std::string out;
    for (const TenantUsage& t : c.Stats(TenantScope::All()).tenants) {
      absl::StrAppend(&out, t.tenant, ": cached ", t.cached_blocks, " pinned ",
                      t.pinned_blocks, " leases ", t.active_leases, " matches ",
                      t.match_requests, "\n");
      const std::vector<std::string> namespaces =
          c.Namespaces(t.tenant).value_or(std::vector<std::string>{});
      for (const std::string& ns : namespaces) {
        const std::vector<DumpNode> nodes =
            c.Dump(t.tenant, ns).value_or(std::vector<DumpNode>{});
        for (const DumpNode& n : nodes) {
          absl::StrAppend(&out, "  ", ns, " d", n.depth, " @", n.position, " s",
                          n.stamp, " p", n.pins, " ids");
          for (BlockId id : n.block_ids) absl::StrAppend(&out, " ", id);
          absl::StrAppend(&out, "\n");
        }
      }
    }
    return out;
  }

  ManualClock clock_;
};

TEST_F(SnapshotTest, RoundTripRestoresTreesLeasesAndCounters) {
  auto a = Make();
  Insert(*a, "x", {1, 1, 2, 2, 3, 3}, {10, 20, 30});
  Insert(*a, "x", {1, 1, 2, 2, 4, 4}, {10, 20, 40}, 0, /*pin=*/true);
  Insert(*a, "y", {7, 7}, {70}, 100);
  MatchQuery m;
  std::vector<Token> t = {1, 1, 2, 2, 3, 3};
  m.tokens = t;
  LeaseId lease = a->Match("x", m).value().lease_id;
  EXPECT_EQ(lease, 0);
  m.pin = true;
  lease = a->Match("x", m).value().lease_id;
  clock_.Advance(absl::Seconds(10));
  const std::string bytes = a->SaveSnapshot({"fp", 77});

  auto b = Make();
  auto meta = b->LoadSnapshot(bytes);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->fingerprint, "fp");
  EXPECT_EQ(meta->epoch, 77);
  EXPECT_TRUE(b->CheckInvariants().ok()) << b->CheckInvariants();
  EXPECT_EQ(Dump(*b), Dump(*a));
  // The lease carries its remaining 20 s, and renews by its full TTL.
  clock_.Advance(absl::Seconds(19));
  EXPECT_THAT(b->KeepAlive("x", {lease}).value(),
              ElementsAre(absl::Seconds(30)));
  // Recency order survives: the oldest leaf goes first in both.
  EXPECT_EQ(a->Evict(TenantScope::All(), 1).value(),
            b->Evict(TenantScope::All(), 1).value());
  // Events continue their numbering.
  EXPECT_EQ(b->ReadEvents("x", 1, 10).value().next_sequence,
            a->ReadEvents("x", 1, 10).value().next_sequence);
  EXPECT_TRUE(b->ReadEvents("x", 1, 10).value().missed);
}

TEST_F(SnapshotTest, CorruptionIsDetectedAnywhere) {
  auto a = Make();
  Insert(*a, "x", {1, 1, 2, 2}, {1, 2}, 0, true);
  const std::string bytes = a->SaveSnapshot({"fp", 1});
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x20;
    auto b = Make();
    EXPECT_EQ(b->LoadSnapshot(bad).status().code(), absl::StatusCode::kDataLoss)
        << "byte " << i;
  }
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto b = Make();
    auto r = b->LoadSnapshot(bytes.substr(0, n));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss)
        << "truncated to " << n;
  }
  EXPECT_THAT(Make()->LoadSnapshot("garbage").status().message(),
              HasSubstr("not a prefixd"));
}

TEST_F(SnapshotTest, ASnapshotThatDoesNotFitIsRefused) {
  auto a = Make(100);
  Insert(*a, "x", {1, 1, 2, 2, 3, 3}, {1, 2, 3});
  const std::string bytes = a->SaveSnapshot({"fp", 1});
  auto r = Make(2)->LoadSnapshot(bytes);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("limit of 2"));
  r = Make(100, 4)->LoadSnapshot(bytes);
  EXPECT_THAT(r.status().message(),
              HasSubstr("block_size 2, this daemon uses 4"));
  auto full = Make();
  Insert(*full, "x", {9, 9}, {9});
  EXPECT_EQ(full->LoadSnapshot(bytes).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Regression (snapshot_fuzzer): a well-formed file whose tenant has a tree
// without nodes loaded, and left an empty tree that broke an invariant.
TEST_F(SnapshotTest, ATreeWithoutNodesIsRefused) {
  SnapshotWriter w = OneTreeHeader();
  w.Varint(0);  // nodes
  w.Varint(0);  // leases
  w.Fixed32(Crc32(w.bytes()));
  auto b = Make();
  const absl::Status s = b->LoadSnapshot(w.bytes()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tree header"));
  // The same file with one node loads: the test builds the format right.
  SnapshotWriter ok;
  std::string body = w.bytes().substr(0, w.bytes().size() - 6);  // 0 0 + CRC
  ok.Raw(body);
  OneNodeAndCrc(&ok);
  auto c = Make();
  ASSERT_TRUE(c->LoadSnapshot(ok.bytes()).ok());
  EXPECT_TRUE(c->CheckInvariants().ok());
}

// Regression (snapshot_fuzzer): a node claiming 2^24 blocks in a file of a
// few bytes made the loader allocate for all of them before reading any.
TEST_F(SnapshotTest, ABlockCountTheFileCannotHoldIsRefusedBeforeAllocating) {
  SnapshotWriter w = OneTreeHeader();
  w.Varint(1);        // nodes
  w.Varint(1);        // depth
  w.Varint(0);        // position
  w.Varint(1);        // stamp
  w.Varint(1 << 24);  // blocks: 2^25 tokens, 128 MiB
  w.Fixed32(Crc32(w.bytes()));
  const absl::Status s = Make()->LoadSnapshot(w.bytes()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("node header"));
}

// Stamps come from the recency counter, which starts at 1: a node stamped 0
// would have no place in the LRU set (0 means "no entry", tenant.h), and one
// stamped ahead of the counter would be newer than the next touch.
TEST_F(SnapshotTest, AStampOutsideTheRecencyCounterIsRefused) {
  auto file = [](uint64_t counter, uint64_t stamp) {
    SnapshotWriter w = OneTreeHeader(counter);
    w.Varint(1);      // nodes
    w.Varint(1);      // depth
    w.Varint(0);      // position
    w.Varint(stamp);  // stamp
    w.Varint(1);      // blocks
    w.Varint(5);      // tokens
    w.Varint(5);
    w.Varint(99);  // block id
    w.Varint(0);   // leases
    w.Varint(0);   // parked
    w.Fixed32(Crc32(w.bytes()));
    return w.bytes();
  };
  for (auto [counter, stamp] :
       {std::pair<uint64_t, uint64_t>{0, 0}, {5, 0}, {5, 6}, {0, 1}}) {
    const absl::Status s = Make()->LoadSnapshot(file(counter, stamp)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss)
        << "counter " << counter << ", stamp " << stamp;
    EXPECT_THAT(s.message(), HasSubstr("node header"));
  }
  for (uint64_t stamp : {1, 5}) {
    auto c = Make();
    ASSERT_TRUE(c->LoadSnapshot(file(5, stamp)).ok()) << "stamp " << stamp;
    EXPECT_TRUE(c->CheckInvariants().ok());
  }
}

// Node::class_priority_stamp keeps stamps in 56 bits: a counter past them
// would hand out stamps that run into the priority bits.
TEST_F(SnapshotTest, ARecencyCounterPast56BitsIsRefused) {
  auto file = [](uint64_t counter) {
    SnapshotWriter w = OneTreeHeader(counter);
    for (uint64_t v : {1, 1, 0, 1, 1, 5, 5, 99, 0, 0}) w.Varint(v);
    w.Fixed32(Crc32(w.bytes()));  // one node (stamp 1) and nothing else
    return w.bytes();
  };
  const absl::Status s = Make()->LoadSnapshot(file(uint64_t{1} << 56)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("header"));
  EXPECT_TRUE(Make()->LoadSnapshot(file((uint64_t{1} << 56) - 1)).ok());
}

// Snapshots keep no retention hints (docs/operations.md): restored blocks
// are ordinary, and counted so.
TEST_F(SnapshotTest, RestoredBlocksHaveTheDefaultRetention) {
  auto a = Make();
  InsertWithPriority(*a, "x", {1, 1, 2, 2}, {10, 20}, 90);
  EXPECT_EQ(
      a->Stats(TenantScope::All()).tenants[0].cached_blocks_by_retention[2],
      2u);
  auto b = Make();
  ASSERT_TRUE(b->LoadSnapshot(a->SaveSnapshot({"fp", 1})).ok());
  EXPECT_TRUE(b->CheckInvariants().ok()) << b->CheckInvariants();
  const TenantUsage u = b->Stats(TenantScope::All()).tenants[0];
  EXPECT_EQ(u.cached_blocks_by_retention[1], 2u);
  EXPECT_EQ(u.cached_blocks_by_retention[2], 0u);
}

// The evictions by retention class carry over like the other counters
// (the blocks' own hints do not, above).
TEST_F(SnapshotTest, EvictionsByRetentionClassSurviveASnapshot) {
  auto a = Make(/*budget=*/4);
  InsertWithPriority(*a, "x", {1, 1, 2, 2}, {10, 20}, 20);
  Insert(*a, "x", {3, 3, 4, 4, 5, 5, 6, 6}, {30, 40, 50, 60});  // evicts 2
  const TenantUsage before = a->Stats(TenantScope::All()).tenants[0];
  ASSERT_EQ(before.evicted_blocks_by_retention[0], 2u);
  auto b = Make(/*budget=*/4);
  ASSERT_TRUE(b->LoadSnapshot(a->SaveSnapshot({"fp", 1})).ok());
  const TenantUsage after = b->Stats(TenantScope::All()).tenants[0];
  EXPECT_THAT(after.evicted_blocks_by_retention, ElementsAre(2u, 0u, 0u));
}

// A file of the previous format (PFXDSNP2) still loads, with the
// evictions by retention class at 0.
TEST_F(SnapshotTest, APreviousFormatFileLoads) {
  SnapshotWriter w = OneTreeHeader(/*counter=*/1, /*v2=*/true);
  OneNodeAndCrc(&w);
  auto c = Make();
  ASSERT_TRUE(c->LoadSnapshot(w.bytes()).ok());
  EXPECT_TRUE(c->CheckInvariants().ok());
  const TenantUsage u = c->Stats(TenantScope::All()).tenants[0];
  EXPECT_EQ(u.cached_blocks, 1u);
  EXPECT_THAT(u.evicted_blocks_by_retention, ElementsAre(0u, 0u, 0u));
}

// Regression (snapshot_fuzzer): a tenant recorded twice loaded both records
// into one tenant and counted its blocks twice against the budget.
TEST_F(SnapshotTest, ATenantRecordedTwiceIsRefused) {
  auto a = Make();
  Insert(*a, "x", {1, 1, 2, 2}, {1, 2});
  const std::string good = a->SaveSnapshot({"fp", 1});
  // Header, then "1 tenant" (one byte), then the tenant record, then CRC.
  const size_t header = std::string("PFXDSNP3").size() + 1 + 2 + 8 + 1 + 1;
  ASSERT_EQ(good[header], 1);  // tenant count
  const std::string record =
      good.substr(header + 1, good.size() - 4 - header - 1);
  SnapshotWriter w;
  w.Raw(good.substr(0, header));
  w.Varint(2);
  w.Raw(record);
  w.Raw(record);
  w.Fixed32(Crc32(w.bytes()));
  const absl::Status s = Make()->LoadSnapshot(w.bytes()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tenant 'x' appears twice"));
}

// IDs parked for a tenant (another tenant's Insert evicted them) are still
// owed to its engine: a restart must deliver them, once.
TEST_F(SnapshotTest, ParkedEvictionsSurviveASnapshot) {
  CacheOptions o;
  o.block_size = 2;
  o.block_bytes = 1;
  o.budget_bytes = 2;
  o.clock = &clock_;
  auto a = std::move(PrefixCache::Create(o)).value();
  Insert(*a, "x", {1, 1, 2, 2}, {1, 2});
  InsertRequest req;
  std::vector<Token> tokens = {3, 3};
  std::vector<BlockId> ids = {3};
  req.tokens = tokens;
  req.block_ids = ids;
  auto by_y = a->Insert("y", req, TenantScope::One("y"));
  ASSERT_TRUE(by_y.ok());
  EXPECT_TRUE(by_y->evicted_block_ids.empty());  // block 2 is x's
  auto b = std::move(PrefixCache::Create(o)).value();
  ASSERT_TRUE(b->LoadSnapshot(a->SaveSnapshot({"fp", 1})).ok());
  EXPECT_THAT(b->Evict(TenantScope::One("x"), 1).value(),
              ElementsAre(1, 2));  // its own LRU block, then the parked one
  EXPECT_THAT(b->Reset(TenantScope::One("x")), IsEmpty());
}

// A cache at every limit its options name (tenants and namespaces with the
// longest names, the leases, the budget in one-block nodes, the widest
// tokens and IDs, parked IDs) writes no more than MaxSnapshotBytes.
TEST_F(SnapshotTest, MaxSnapshotBytesBoundsAFullCache) {
  CacheOptions o;
  o.block_size = 2;
  o.block_bytes = 1;
  o.budget_bytes = 8;
  o.clock = &clock_;
  o.limits.max_tenants = 2;
  o.limits.max_namespaces_per_tenant = 2;
  o.limits.max_leases_per_tenant = 2;
  o.limits.max_namespace_bytes = 6;
  auto c = std::move(PrefixCache::Create(o)).value();
  const Token wide = 0xffffffffu;
  BlockId id = ~BlockId{0};
  for (const char* tenant : {"other!", "tenant"}) {
    for (const char* ns : {"space1", "space2"}) {
      for (Token first : {wide, wide - 1}) {
        InsertRequest req;
        req.ns = ns;
        std::vector<Token> tokens = {first, wide};
        std::vector<BlockId> ids = {id--};
        req.tokens = tokens;
        req.block_ids = ids;
        req.pin = first == wide && std::string(ns) == "space1";
        ASSERT_TRUE(c->Insert(tenant, req).ok());
      }
    }
  }
  // A ninth block, inserted by one tenant's principal, evicts the other's
  // least recently used block and parks its ID.
  InsertRequest req;
  req.ns = "space2";
  std::vector<Token> tokens = {1, 1};
  std::vector<BlockId> ids = {id--};
  req.tokens = tokens;
  req.block_ids = ids;
  auto ninth = c->Insert("tenant", req, TenantScope::One("tenant"));
  ASSERT_TRUE(ninth.ok()) << ninth.status();
  ASSERT_TRUE(ninth->evicted_block_ids.empty());  // parked for "other!"
  const CacheStats stats = c->Stats(TenantScope::All());
  ASSERT_EQ(stats.resident_blocks, 8u);
  // The longest fingerprint a reader takes.
  const std::string bytes =
      c->SaveSnapshot({std::string(1 << 16, 'f'), ~uint64_t{0}});
  EXPECT_LE(bytes.size(), c->MaxSnapshotBytes());
  // Finite at the defaults: a reader can use it as a bound.
  auto defaults = std::move(PrefixCache::Create(CacheOptions{})).value();
  EXPECT_LT(defaults->MaxSnapshotBytes(), uint64_t{1} << 30);
}

TEST_F(SnapshotTest, HeaderIsReadableAlone) {
  auto a = Make();
  auto meta = PrefixCache::ReadSnapshotMeta(a->SaveSnapshot({"abc", 5}));
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->fingerprint, "abc");
  EXPECT_EQ(meta->epoch, 5);
}

}  // namespace
}  // namespace prefixd
