#include "server/kv_batcher.h"

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/fleet_index.h"
#include "index/publisher.h"

namespace prefixd {
namespace {

using ::testing::ElementsAreArray;

std::string Encoded(const std::vector<KvEvent>& events) {
  KvEventBatch batch;
  batch.ts = 1.7e9;
  batch.data_parallel_rank = int64_t{1} << 40;
  batch.events = events;
  return EncodeEventBatch(batch);
}

BlockStoredEvent Store(size_t blocks, int64_t block_size, uint64_t first_hash,
                       std::optional<std::string> lora, std::string salt) {
  BlockStoredEvent s;
  for (size_t i = 0; i < blocks; ++i) {
    s.block_hashes.push_back(first_hash + i);
    for (int64_t t = 0; t < block_size; ++t) {
      s.token_ids.push_back(
          static_cast<Token>(0xffff0000u + i * block_size + t));
    }
  }
  s.block_size = block_size;
  s.lora_name = std::move(lora);
  s.cache_salt = std::move(salt);
  s.chain_blocks = blocks;
  return s;
}

// The bound holds for every kind of event and every field's widest form.
TEST(KvBatcherTest, EncodedBytesBoundIsAnUpperBound) {
  std::mt19937_64 rng(7);
  std::vector<KvEvent> all;
  for (int i = 0; i < 200; ++i) {
    const size_t blocks = rng() % 40;
    KvEvent e;
    switch (rng() % 3) {
      case 0: {
        BlockStoredEvent s = Store(
            blocks, 1 + rng() % 32, ~uint64_t{0} - 100,
            rng() % 2
                ? std::optional<std::string>(std::string(rng() % 300, 'L'))
                : std::nullopt,
            rng() % 2 ? std::string(rng() % 300, 'S') : "");
        if (rng() % 2) s.parent_block_hash = ~uint64_t{0};
        if (rng() % 2) s.lora_id = INT64_MIN;
        s.medium = std::string(rng() % 20, 'M');
        e = s;
        break;
      }
      case 1: {
        BlockRemovedEvent r;
        for (size_t b = 0; b < blocks; ++b) r.block_hashes.push_back(~b);
        r.medium = std::string(rng() % 20, 'M');
        e = r;
        break;
      }
      default:
        e = AllBlocksClearedEvent{};
    }
    EXPECT_LE(Encoded({e}).size(), kBatchOverheadBytes + EncodedBytesBound(e))
        << "event " << i << " of kind " << e.index();
    all.push_back(e);
  }
  size_t sum = kBatchOverheadBytes;
  for (const KvEvent& e : all) sum += EncodedBytesBound(e);
  EXPECT_LE(Encoded(all).size(), sum);
}

// A chain of 20,000 blocks (1.6 MB of payload) leaves in batches of at
// most kMaxBatchBytes, each store the child of the previous one's last
// block; an index applying the pieces ends as with the whole store.
TEST(KvBatcherTest, ABigStoreIsSplitIntoChainedPieces) {
  const BlockStoredEvent whole = Store(20000, 16, 1000, "lora-x", "acme");
  std::vector<std::vector<KvEvent>> batches;
  KvBatcher batcher(
      [&](std::vector<KvEvent> events) { batches.push_back(events); });
  batcher.Add(whole);
  batcher.Flush();
  ASSERT_GT(batches.size(), 20u);
  std::vector<EngineHash> hashes;
  std::vector<Token> tokens;
  for (size_t i = 0; i < batches.size(); ++i) {
    EXPECT_LE(Encoded(batches[i]).size(), kMaxBatchBytes) << "batch " << i;
    ASSERT_EQ(batches[i].size(), 1u);
    const auto& piece = std::get<BlockStoredEvent>(batches[i][0]);
    if (i == 0) {
      EXPECT_FALSE(piece.parent_block_hash.has_value());
      EXPECT_EQ(piece.cache_salt, "acme");
    } else {
      EXPECT_EQ(piece.parent_block_hash, std::optional(hashes.back()));
      EXPECT_EQ(piece.cache_salt, "");
    }
    EXPECT_EQ(piece.lora_name, std::optional<std::string>("lora-x"));
    EXPECT_EQ(piece.token_ids.size(), piece.block_hashes.size() * 16);
    hashes.insert(hashes.end(), piece.block_hashes.begin(),
                  piece.block_hashes.end());
    tokens.insert(tokens.end(), piece.token_ids.begin(), piece.token_ids.end());
  }
  EXPECT_THAT(hashes, ElementsAreArray(whole.block_hashes));
  EXPECT_THAT(tokens, ElementsAreArray(whole.token_ids));

  IndexOptions o;
  o.block_size = 16;
  FleetIndex one(o), pieces(o);
  KvEventBatch b;
  b.events = {whole};
  one.Apply(one.AddWorker("w", ""), b, 0, absl::Now());
  const WorkerId w = pieces.AddWorker("w", "");
  for (size_t i = 0; i < batches.size(); ++i) {
    b.events = batches[i];
    pieces.Apply(w, b, static_cast<int64_t>(i), absl::Now());
  }
  RouteQuery q;
  q.tokens = whole.token_ids;
  q.lora_name = "lora-x";
  q.cache_salt = "acme";
  EXPECT_EQ(pieces.Route(q).workers[0].matched_blocks, 20000u);
  EXPECT_EQ(one.Route(q).workers[0].matched_blocks, 20000u);
}

TEST(KvBatcherTest, ABigRemovalIsSplit) {
  BlockRemovedEvent whole;
  for (uint64_t i = 0; i < 50000; ++i) whole.block_hashes.push_back(~i);
  std::vector<EngineHash> hashes;
  size_t batches = 0;
  KvBatcher batcher([&](std::vector<KvEvent> events) {
    ++batches;
    EXPECT_LE(Encoded(events).size(), kMaxBatchBytes);
    for (const KvEvent& e : events) {
      const auto& r = std::get<BlockRemovedEvent>(e);
      hashes.insert(hashes.end(), r.block_hashes.begin(), r.block_hashes.end());
    }
  });
  batcher.Add(whole);
  batcher.Flush();
  EXPECT_GT(batches, 5u);
  EXPECT_THAT(hashes, ElementsAreArray(whole.block_hashes));
}

// Small events share batches, up to kMaxBatchEvents each, in order.
TEST(KvBatcherTest, SmallEventsShareBatchesInOrder) {
  std::vector<size_t> sizes;
  std::vector<EngineHash> order;
  KvBatcher batcher([&](std::vector<KvEvent> events) {
    sizes.push_back(events.size());
    for (const KvEvent& e : events)
      order.push_back(std::get<BlockRemovedEvent>(e).block_hashes[0]);
  });
  for (uint64_t i = 0; i < 600; ++i) {
    BlockRemovedEvent r;
    r.block_hashes = {i};
    batcher.Add(r);
  }
  batcher.Flush();
  EXPECT_THAT(sizes, ElementsAreArray({256u, 256u, 88u}));
  ASSERT_EQ(order.size(), 600u);
  for (uint64_t i = 0; i < 600; ++i) EXPECT_EQ(order[i], i);
  batcher.Add(AllBlocksClearedEvent{});
  batcher.Clear();
  batcher.Flush();
  EXPECT_EQ(sizes.size(), 3u);  // cleared: nothing more
}

}  // namespace
}  // namespace prefixd
