// events_publish (server/events_publish.h): core's events converted to vLLM
// KV events, and a real cache published over ZeroMQ to prefixd's own fleet
// index, which must then answer Route as the cache answers Match.
#include "server/events_publish.h"

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/fleet_index.h"
#include "index/ingest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;

constexpr int kBs = 4;

// Tokens of blocks `ids`: block b is b*10+1 .. b*10+4.
std::vector<Token> Tokens(const std::vector<uint32_t>& blocks) {
  std::vector<Token> out;
  for (uint32_t b : blocks)
    for (uint32_t t = 1; t <= kBs; ++t) out.push_back(b * 10 + t);
  return out;
}

Event StoredCoreEvent(std::string ns, std::vector<BlockId> ids, bool parent,
                      int64_t position, int64_t prefix_tokens) {
  Event e;
  e.type = EventType::kBlockStored;
  e.ns = std::move(ns);
  e.block_ids = ids;
  e.has_parent = parent;
  e.parent_block_id = parent ? 99 : 0;
  e.position = position;
  e.prefix_tokens = prefix_tokens;
  std::vector<uint32_t> blocks(ids.begin(), ids.end());
  e.tokens = Tokens(blocks);
  return e;
}

TEST(AppendKvEventsTest, TenantIsTheSaltAndTheNamespaceTheLoraName) {
  std::vector<KvEvent> out;
  AppendKvEvents(StoredCoreEvent("", {1, 2}, false, 0, 0), "default", kBs,
                 RopeShift::kDeny, &out);
  AppendKvEvents(StoredCoreEvent("lora-a", {3}, true, 8, 8), "acme", kBs,
                 RopeShift::kDeny, &out);
  ASSERT_EQ(out.size(), 2);
  const auto& a = std::get<BlockStoredEvent>(out[0]);
  EXPECT_THAT(a.block_hashes, ElementsAre(1, 2));
  EXPECT_FALSE(a.parent_block_hash.has_value());
  EXPECT_EQ(a.token_ids, Tokens({1, 2}));
  EXPECT_EQ(a.block_size, kBs);
  EXPECT_FALSE(a.lora_name.has_value());
  EXPECT_EQ(a.cache_salt, "");
  EXPECT_EQ(a.medium, "GPU");
  const auto& b = std::get<BlockStoredEvent>(out[1]);
  EXPECT_EQ(b.parent_block_hash, std::optional<EngineHash>(99));
  EXPECT_EQ(b.lora_name, std::optional<std::string>("lora-a"));
  EXPECT_EQ(b.cache_salt, "acme");
}

TEST(AppendKvEventsTest, ShiftedStoresOnlyWithRopeAllow) {
  std::vector<KvEvent> out;
  const Event shifted = StoredCoreEvent("", {1}, false, 100, 0);
  AppendKvEvents(shifted, "default", kBs, RopeShift::kDeny, &out);
  EXPECT_TRUE(out.empty());
  AppendKvEvents(shifted, "default", kBs, RopeShift::kAllow, &out);
  EXPECT_EQ(out.size(), 1);
}

TEST(AppendKvEventsTest, RemovalsAndResetsAreBlockRemoved) {
  std::vector<KvEvent> out;
  Event removed;
  removed.type = EventType::kBlockRemoved;
  removed.block_ids = {4, 5};
  AppendKvEvents(removed, "acme", kBs, RopeShift::kDeny, &out);
  Event cleared;
  cleared.type = EventType::kCleared;
  cleared.block_ids = {6};
  AppendKvEvents(cleared, "acme", kBs, RopeShift::kDeny, &out);
  cleared.block_ids.clear();  // an empty tenant's reset: nothing to say
  AppendKvEvents(cleared, "acme", kBs, RopeShift::kDeny, &out);
  ASSERT_EQ(out.size(), 2);
  EXPECT_THAT(std::get<BlockRemovedEvent>(out[0]).block_hashes,
              ElementsAre(4, 5));
  EXPECT_THAT(std::get<BlockRemovedEvent>(out[1]).block_hashes, ElementsAre(6));
}

TEST(AppendKvEventsTest, StoresWithoutTokensAreNotPublished) {
  Event e = StoredCoreEvent("", {1}, false, 0, 0);
  e.tokens.clear();
  std::vector<KvEvent> out;
  AppendKvEvents(e, "default", kBs, RopeShift::kDeny, &out);
  EXPECT_TRUE(out.empty());
}

TEST(CacheSaltOfTenantTest, DefaultHasNone) {
  EXPECT_EQ(CacheSaltOfTenant("default"), "");
  EXPECT_EQ(CacheSaltOfTenant("acme"), "acme");
}

// A cache, its publisher and an index following it over loopback.
class PublishedCacheTest : public ::testing::Test {
 protected:
  void Start(size_t events_per_tenant = 4096, uint64_t budget_blocks = 64) {
    CacheOptions o;
    o.block_size = kBs;
    o.block_bytes = 1;
    o.budget_bytes = budget_blocks;
    o.events_per_tenant = events_per_tenant;
    o.detailed_events = true;
    o.seed = 1;
    cache_ = *PrefixCache::Create(o);
  }

  void Publish() {
    KvPublisherOptions p;
    p.endpoint = "tcp://127.0.0.1:*";
    p.replay_endpoint = "tcp://127.0.0.1:*";
    p.topic = "kv@sidecar@test";
    auto publisher = EventsPublisher::Start(cache_.get(), p, PublishLimits{},
                                            absl::Milliseconds(2));
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    publisher_ = *std::move(publisher);
    IndexOptions io;
    io.block_size = kBs;
    index_ = std::make_unique<FleetIndex>(io);
    IngestOptions in;
    IndexSource source;
    source.name = "sidecar";
    source.endpoint = publisher_->endpoint();
    source.replay_endpoint = publisher_->replay_endpoint();
    in.sources.push_back(source);
    in.poll_interval = absl::Milliseconds(5);
    auto ingest = Ingest::Start(index_.get(), in);
    ASSERT_TRUE(ingest.ok()) << ingest.status();
    ingest_ = *std::move(ingest);
  }

  void TearDown() override {
    if (ingest_ != nullptr) ingest_->Stop();
    if (publisher_ != nullptr) publisher_->Stop();
  }

  // Waits until everything the cache has logged so far is published and
  // the index has applied every published batch. Not "nothing new for a
  // while": a publisher thread starved for longer than the wait (under
  // sanitizers on a loaded machine) looked idle with events still unread.
  bool Quiesce() {
    const uint64_t logged = cache_->last_event_order();
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      publisher_->Wake();
      absl::SleepFor(absl::Milliseconds(10));
      const EventsPublishStats p = publisher_->stats();
      const IndexStats s = index_->Stats();
      if (p.published_order >= logged && p.wire.batches > 0 &&
          s.workers.size() == 1 &&
          s.workers[0].last_seq == static_cast<int64_t>(p.wire.batches) - 1) {
        return true;
      }
    }
    return false;
  }

  uint64_t Routed(const std::vector<Token>& tokens, absl::string_view tenant,
                  absl::string_view ns = "") {
    RouteQuery q;
    q.tokens = tokens;
    q.lora_name = ns;
    const std::string salt = CacheSaltOfTenant(tenant);
    q.cache_salt = salt;
    const RouteResult r = index_->Route(q);
    return r.workers.empty() ? 0 : r.workers[0].matched_blocks;
  }

  uint64_t Matched(const std::vector<Token>& tokens, absl::string_view tenant,
                   absl::string_view ns = "") {
    MatchQuery m;
    m.ns = std::string(ns);
    m.tokens = tokens;
    return cache_->Match(tenant, m)->matched_tokens / kBs;
  }

  void Insert(absl::string_view tenant, const std::vector<uint32_t>& blocks,
              const std::vector<BlockId>& ids, absl::string_view ns = "",
              int64_t offset = 0) {
    const std::vector<Token> tokens = Tokens(blocks);
    InsertRequest r;
    r.ns = std::string(ns);
    r.tokens = tokens;
    r.block_ids = ids;
    r.position_offset = offset;
    ASSERT_TRUE(cache_->Insert(tenant, r).ok());
  }

  std::unique_ptr<PrefixCache> cache_;
  std::unique_ptr<EventsPublisher> publisher_;
  std::unique_ptr<FleetIndex> index_;
  std::unique_ptr<Ingest> ingest_;
};

TEST_F(PublishedCacheTest, StartPublishesWhatTheCacheAlreadyHolds) {
  Start();
  Insert("default", {1, 2, 3}, {11, 12, 13});
  Insert("acme", {1, 2}, {21, 22}, "lora-a");
  Publish();
  ASSERT_TRUE(Quiesce());
  EXPECT_EQ(Routed(Tokens({1, 2, 3, 4}), "default"), 3);
  EXPECT_EQ(Routed(Tokens({1, 2, 3, 4}), "acme", "lora-a"), 2);
  EXPECT_EQ(Routed(Tokens({1, 2, 3, 4}), "acme"), 0);  // another namespace
  EXPECT_EQ(publisher_->stats().resyncs[static_cast<int>(ResyncReason::kStart)],
            1);
}

TEST_F(PublishedCacheTest, ABlockIdMovingBetweenTenantsEndsInTheRightPlace) {
  Start(4096, /*budget_blocks=*/4);
  // b exists first, so its ring is read before a's in every round.
  Matched(Tokens({99}), "b");
  Publish();
  // a caches 4 blocks; b's Insert of 4 more evicts them all (global
  // budget); b then reuses a's IDs for another prompt. Published out of
  // core's order, a's removal of 1..4 would land after b's store of them.
  for (int round = 0; round < 20; ++round) {
    const uint32_t base = static_cast<uint32_t>(round * 100);
    Insert("a", {base + 1, base + 2}, {1, 2});
    Insert("a", {base + 3, base + 4}, {3, 4});
    Insert("b", {base + 5, base + 6, base + 7, base + 8}, {5, 6, 7, 8});
    Insert("b", {base + 9, base + 10}, {1, 2});
    Insert("a", {base + 11, base + 12}, {9, 10});
    cache_->Reset(TenantScope::All());
  }
  Insert("a", {1, 2}, {1, 2});
  Insert("a", {3, 4}, {3, 4});
  Insert("b", {5, 6, 7, 8}, {5, 6, 7, 8});
  Insert("b", {9, 10}, {1, 2});
  ASSERT_TRUE(Quiesce());
  for (const auto& prompt : std::vector<std::vector<uint32_t>>{
           {1, 2}, {3, 4}, {5, 6, 7, 8}, {9, 10}}) {
    for (absl::string_view tenant : {"a", "b"}) {
      EXPECT_EQ(Routed(Tokens(prompt), tenant), Matched(Tokens(prompt), tenant))
          << tenant << " " << prompt[0];
    }
  }
  EXPECT_EQ(Routed(Tokens({9, 10}), "b"), 2);
  EXPECT_EQ(index_->Stats()
                .workers[0]
                .clears[static_cast<int>(ClearReason::kAllBlocksCleared)],
            1);  // the start only: resets are removals
}

TEST_F(PublishedCacheTest, ResetOfOneTenantRemovesOnlyItsBlocks) {
  Start();
  Publish();
  Insert("acme", {1, 2}, {1, 2});
  Insert("default", {1, 2}, {3, 4});
  ASSERT_TRUE(Quiesce());
  EXPECT_EQ(Routed(Tokens({1, 2}), "acme"), 2);
  cache_->Reset(TenantScope::One("acme"));
  ASSERT_TRUE(Quiesce());
  EXPECT_EQ(Routed(Tokens({1, 2}), "acme"), 0);
  EXPECT_EQ(Routed(Tokens({1, 2}), "default"), 2);
}

TEST_F(PublishedCacheTest, OverflowPublishesTheCacheAgain) {
  Start(/*events_per_tenant=*/4, /*budget_blocks=*/16);
  Publish();
  ASSERT_TRUE(Quiesce());
  std::vector<std::vector<Token>> prompts;
  std::vector<InsertRequest> reqs;
  std::vector<std::vector<BlockId>> ids;
  for (uint32_t i = 0; i < 12; ++i) {
    prompts.push_back(Tokens({i * 2 + 1, i * 2 + 2}));
    ids.push_back({i * 2 + 1, i * 2 + 2});
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    InsertRequest r;
    r.tokens = prompts[i];
    r.block_ids = ids[i];
    reqs.push_back(r);
  }
  // One lock hold: 12 stores and the evictions, into a ring of 4.
  for (const auto& r : cache_->InsertBatch("default", reqs))
    ASSERT_TRUE(r.ok());
  ASSERT_TRUE(Quiesce());
  EXPECT_GE(
      publisher_->stats().resyncs[static_cast<int>(ResyncReason::kOverflow)],
      1);
  uint64_t held = 0;
  for (const auto& p : prompts) {
    EXPECT_EQ(Routed(p, "default"), Matched(p, "default"));
    held += Matched(p, "default");
  }
  EXPECT_EQ(held, 16);  // the budget, all of it published again
}

// An Insert of 6,000 blocks is one stored event of 24,000 tokens; it is
// published as stores of at most kMaxBatchBytes each, chained by their
// parents, and the index holds the whole chain.
TEST_F(PublishedCacheTest, ABigStoreIsPublishedInBatchesTheIndexJoins) {
  Start(4096, /*budget_blocks=*/8192);
  Publish();
  std::vector<uint32_t> blocks;
  std::vector<BlockId> ids;
  for (uint32_t b = 0; b < 6000; ++b) {
    blocks.push_back(b + 1);
    ids.push_back(b + 1);
  }
  Insert("acme", blocks, ids, "lora-a");
  ASSERT_TRUE(Quiesce());
  const EventsPublishStats stats = publisher_->stats();
  EXPECT_GT(stats.wire.batches, 3u);
  EXPECT_LE(stats.wire.bytes, stats.wire.batches * kMaxBatchBytes);
  EXPECT_EQ(Routed(Tokens(blocks), "acme", "lora-a"), 6000u);
  EXPECT_EQ(Matched(Tokens(blocks), "acme", "lora-a"), 6000u);
}

TEST_F(PublishedCacheTest, RopeDenyHidesShiftedBlocksAndWhatHangsBelow) {
  Start();
  Publish();
  Insert("default", {1, 2}, {1, 2}, "", /*offset=*/100);
  Insert("default", {1, 2, 3}, {1, 2, 3});  // 3 below the shifted 1, 2
  Insert("default", {7, 8}, {7, 8});
  ASSERT_TRUE(Quiesce());
  EXPECT_EQ(Matched(Tokens({1, 2, 3}), "default"), 0);
  EXPECT_EQ(Routed(Tokens({1, 2, 3}), "default"), 0);
  EXPECT_EQ(Routed(Tokens({7, 8}), "default"), 2);
}

}  // namespace
}  // namespace prefixd
