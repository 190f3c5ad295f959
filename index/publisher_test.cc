// The KV event encoder and publisher (index/publisher.h): what it encodes
// decodes back with index/events.h, its sockets speak vLLM's wire (PUB
// frames, ROUTER replay from a bounded buffer), and prefixd's own ingest
// follows it into a FleetIndex.
#include "index/publisher.h"

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <variant>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/events.h"
#include "index/fleet_index.h"
#include "index/ingest.h"
#include "index/stored_for_test.h"
#include "index/zmq_wire.h"

// Debian's msgpack-cxx is header-only and needs Boost unless told not to.
#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using test::Stored;
constexpr int kBs = test::kStoredBlockSize;

KvEventBatch RoundTrip(const KvEventBatch& in) {
  KvEventBatch out;
  const absl::Status s = DecodeEventBatch(EncodeEventBatch(in), &out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(EncodeEventBatchTest, DecodesBackToWhatWasEncoded) {
  KvEventBatch in;
  in.ts = 1712345678.25;
  in.events.push_back(Stored({1, 2, 3}, std::nullopt));
  in.events.push_back(Stored({4}, 3));
  in.events.push_back(
      Stored({~uint64_t{0}, 1ull << 63}, std::nullopt, "adapter", "acme"));
  BlockRemovedEvent removed;
  removed.block_hashes = {2, 3, ~uint64_t{0}};
  in.events.push_back(removed);
  in.events.push_back(AllBlocksClearedEvent{});

  const KvEventBatch out = RoundTrip(in);
  EXPECT_EQ(out.ts, in.ts);
  EXPECT_FALSE(out.data_parallel_rank.has_value());
  EXPECT_EQ(out.unknown_events, 0);
  EXPECT_EQ(out.unknown_fields, 0);
  ASSERT_EQ(out.events.size(), 5);

  const auto& root = std::get<BlockStoredEvent>(out.events[0]);
  EXPECT_THAT(root.block_hashes, ElementsAre(1, 2, 3));
  EXPECT_FALSE(root.parent_block_hash.has_value());
  EXPECT_EQ(root.token_ids, std::get<BlockStoredEvent>(in.events[0]).token_ids);
  EXPECT_EQ(root.block_size, kBs);
  EXPECT_FALSE(root.lora_id.has_value());
  EXPECT_FALSE(root.lora_name.has_value());
  EXPECT_EQ(root.medium, "GPU");
  EXPECT_EQ(root.cache_salt, "");
  EXPECT_EQ(root.chain_blocks, 3);
  EXPECT_EQ(root.group_idx, 0);

  const auto& child = std::get<BlockStoredEvent>(out.events[1]);
  EXPECT_THAT(child.block_hashes, ElementsAre(4));
  EXPECT_EQ(child.parent_block_hash, std::optional<EngineHash>(3));
  EXPECT_THAT(child.token_ids, ElementsAre(41, 42, 43, 44));

  // A namespace (LoRA name) and a salt, hashes with the top bit set.
  const auto& salted = std::get<BlockStoredEvent>(out.events[2]);
  EXPECT_THAT(salted.block_hashes, ElementsAre(~uint64_t{0}, 1ull << 63));
  EXPECT_EQ(salted.lora_name, std::optional<std::string>("adapter"));
  EXPECT_EQ(salted.cache_salt, "acme");
  EXPECT_EQ(salted.chain_blocks, 2);

  const auto& rm = std::get<BlockRemovedEvent>(out.events[3]);
  EXPECT_THAT(rm.block_hashes, ElementsAre(2, 3, ~uint64_t{0}));
  EXPECT_EQ(rm.medium, "GPU");
  EXPECT_TRUE(std::holds_alternative<AllBlocksClearedEvent>(out.events[4]));
}

TEST(EncodeEventBatchTest, SaltEqualToTheLoraNameStaysTheSalt) {
  // vLLM's order (LoRA name, then salt) keeps them apart even when equal.
  KvEventBatch in;
  in.events.push_back(Stored({7}, std::nullopt, "acme", "acme"));
  const KvEventBatch out = RoundTrip(in);
  const auto& e = std::get<BlockStoredEvent>(out.events[0]);
  EXPECT_EQ(e.lora_name, std::optional<std::string>("acme"));
  EXPECT_EQ(e.cache_salt, "acme");
  EXPECT_EQ(e.chain_blocks, 1);
}

TEST(EncodeEventBatchTest, SaltOnlyInTheFirstBlockOfARootStore) {
  KvEventBatch in;
  in.events.push_back(Stored({1, 2}, std::nullopt, std::nullopt, "acme"));
  in.events.push_back(Stored({3}, 2, std::nullopt, "acme"));  // not a root
  in.data_parallel_rank = 3;
  const std::string payload = EncodeEventBatch(in);
  KvEventBatch out;
  ASSERT_TRUE(DecodeEventBatch(payload, &out).ok());
  EXPECT_EQ(out.data_parallel_rank, std::optional<int64_t>(3));
  EXPECT_EQ(std::get<BlockStoredEvent>(out.events[0]).cache_salt, "acme");
  EXPECT_EQ(std::get<BlockStoredEvent>(out.events[1]).cache_salt, "");

  // The raw layout: the map form, extra_keys [["acme"], nil] and nil.
  const msgpack::object_handle h =
      msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& root = h.get();
  ASSERT_EQ(root.type, msgpack::type::MAP);
  const msgpack::object* events = nullptr;
  for (uint32_t i = 0; i < root.via.map.size; ++i) {
    if (root.via.map.ptr[i].key.as<std::string>() == "events")
      events = &root.via.map.ptr[i].val;
  }
  ASSERT_NE(events, nullptr);
  auto extra_keys = [&](int e) {
    const msgpack::object& ev = events->via.array.ptr[e];
    for (uint32_t i = 0; i < ev.via.map.size; ++i) {
      if (ev.via.map.ptr[i].key.as<std::string>() == "extra_keys")
        return ev.via.map.ptr[i].val;
    }
    return msgpack::object();
  };
  const msgpack::object first = extra_keys(0);
  ASSERT_EQ(first.type, msgpack::type::ARRAY);
  ASSERT_EQ(first.via.array.size, 2);
  EXPECT_EQ(first.via.array.ptr[0].as<std::vector<std::string>>(),
            std::vector<std::string>{"acme"});
  EXPECT_EQ(first.via.array.ptr[1].type, msgpack::type::NIL);
  EXPECT_EQ(extra_keys(1).type, msgpack::type::NIL);
}

TEST(EncodeEventBatchTest, EmptyBatch) {
  KvEventBatch in;
  in.ts = 5;
  const KvEventBatch out = RoundTrip(in);
  EXPECT_EQ(out.ts, 5);
  EXPECT_TRUE(out.events.empty());
}

TEST(KvPublisherOptionsTest, RefusesMalformedEndpointsAndBuffers) {
  KvPublisherOptions o;
  o.endpoint = "tcp://*:5557";
  o.replay_endpoint = "tcp://*:5558";
  EXPECT_TRUE(ValidateKvPublisherOptions(o).ok());
  o.endpoint = "127.0.0.1:5557";
  EXPECT_THAT(ValidateKvPublisherOptions(o).message(),
              HasSubstr("endpoint \"127.0.0.1:5557\""));
  o.endpoint = "ipc:///tmp/x";
  o.replay_endpoint = "tcp://host:99999";
  EXPECT_THAT(ValidateKvPublisherOptions(o).message(),
              HasSubstr("replay_endpoint \"tcp://host:99999\""));
  o.replay_endpoint = "";
  o.buffer_batches = 0;
  EXPECT_THAT(ValidateKvPublisherOptions(o).message(),
              HasSubstr("buffer_batches 0"));
}

}  // namespace
}  // namespace prefixd
