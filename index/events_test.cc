#include "index/events.h"

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/group_rules.h"

// Debian's msgpack-cxx is header-only and needs Boost unless told not to.
#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A msgpack value, packed with msgpack-cxx's packer: enough of the format to
// write what msgspec sends, and what it never would.
struct V {
  enum Kind { kNil, kBool, kInt, kUint, kDouble, kStr, kBin, kArray, kMap };
  Kind kind = kNil;
  bool b = false;
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  std::string s;
  std::vector<V> items;  // an array's elements; a map's keys and values

  V() = default;  // nil
  V(int v) : kind(kInt), i(v) {}
  V(int64_t v) : kind(kInt), i(v) {}
  V(const char* v) : kind(kStr), s(v) {}
};

const V kNil;

V Uint(uint64_t v) {
  V x;
  x.kind = V::kUint;
  x.u = v;
  return x;
}

// msgpack-cxx packs a double with an integral value as an int (msgspec
// never does), so the tests' floats have fractions.
V Float(double v) {
  V x;
  x.kind = V::kDouble;
  x.d = v;
  return x;
}

V Bool(bool v) {
  V x;
  x.kind = V::kBool;
  x.b = v;
  return x;
}

V Bin(std::string bytes) {
  V x;
  x.kind = V::kBin;
  x.s = std::move(bytes);
  return x;
}

V Arr(std::initializer_list<V> items) {
  V x;
  x.kind = V::kArray;
  x.items = items;
  return x;
}

V Map(std::initializer_list<std::pair<V, V>> entries) {
  V x;
  x.kind = V::kMap;
  for (const auto& [k, v] : entries) {
    x.items.push_back(k);
    x.items.push_back(v);
  }
  return x;
}

// [first, first + n) as an array of ints.
V Tokens(int first, int n) {
  V x = Arr({});
  for (int t = first; t < first + n; ++t) x.items.push_back(t);
  return x;
}

void Pack(msgpack::packer<msgpack::sbuffer>& p, const V& v) {
  switch (v.kind) {
    case V::kNil:
      p.pack_nil();
      break;
    case V::kBool:
      v.b ? p.pack_true() : p.pack_false();
      break;
    case V::kInt:
      p.pack_int64(v.i);
      break;
    case V::kUint:
      p.pack_uint64(v.u);
      break;
    case V::kDouble:
      p.pack_double(v.d);
      break;
    case V::kStr:
      p.pack_str(static_cast<uint32_t>(v.s.size()));
      p.pack_str_body(v.s.data(), static_cast<uint32_t>(v.s.size()));
      break;
    case V::kBin:
      p.pack_bin(static_cast<uint32_t>(v.s.size()));
      p.pack_bin_body(v.s.data(), static_cast<uint32_t>(v.s.size()));
      break;
    case V::kArray:
      p.pack_array(static_cast<uint32_t>(v.items.size()));
      for (const V& item : v.items) Pack(p, item);
      break;
    case V::kMap:
      p.pack_map(static_cast<uint32_t>(v.items.size() / 2));
      for (const V& item : v.items) Pack(p, item);
      break;
  }
}

std::string Bytes(const V& v) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> packer(buf);
  Pack(packer, v);
  return std::string(buf.data(), buf.size());
}

absl::Status Decode(const V& v, KvEventBatch* out) {
  return DecodeEventBatch(Bytes(v), out);
}

absl::Status DecodeError(const V& v) {
  KvEventBatch batch;
  return Decode(v, &batch);
}

const BlockStoredEvent* Stored(const KvEventBatch& b, size_t i) {
  return i < b.events.size() ? std::get_if<BlockStoredEvent>(&b.events[i])
                             : nullptr;
}

const BlockRemovedEvent* Removed(const KvEventBatch& b, size_t i) {
  return i < b.events.size() ? std::get_if<BlockRemovedEvent>(&b.events[i])
                             : nullptr;
}

// A BlockStored in the array form with every field vLLM knows today.
V StoredArray(V hashes, V parent, V tokens, V block_size, V lora_id = kNil,
              V medium = kNil, V lora_name = kNil, V extra_keys = kNil,
              V group_idx = kNil) {
  return Arr({"BlockStored", hashes, parent, tokens, block_size, lora_id,
              medium, lora_name, extra_keys, group_idx, "full_attention",
              kNil});
}

// A root BlockStored of n blocks of 2 tokens, in the map form, with the
// given LoRA name and extra_keys.
V StoredWithKeys(int n, V lora_name, V extra_keys, V parent = kNil) {
  V hashes = Arr({});
  for (int i = 0; i < n; ++i) hashes.items.push_back(100 + i);
  return Map({{"type", "BlockStored"},
              {"block_hashes", hashes},
              {"parent_block_hash", parent},
              {"token_ids", Tokens(0, 2 * n)},
              {"block_size", 2},
              {"lora_id", kNil},
              {"medium", "GPU"},
              {"lora_name", lora_name},
              {"extra_keys", extra_keys}});
}

V ArrayBatch(std::initializer_list<V> events) {
  return Arr({Float(1.5), Arr(events)});
}

TEST(DecodeEventBatchTest, ArrayBatchOfArrayEventsDecodesEveryField) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(Arr({Float(1700000000.25),
                  Arr({StoredArray(Arr({11, 12}), 10, Tokens(0, 8), 4, 7, "gpu",
                                   "adapter", Arr({Arr({"adapter"}), kNil}), 1),
                       Arr({"BlockRemoved", Arr({11}), "CPU", 1}),
                       Arr({"AllBlocksCleared"})}),
                  3}),
             &b)
          .ok());
  EXPECT_EQ(b.ts, 1700000000.25);
  EXPECT_EQ(b.data_parallel_rank, 3);
  ASSERT_EQ(b.events.size(), 3u);
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->block_hashes, ElementsAre(11u, 12u));
  EXPECT_EQ(s->parent_block_hash, 10u);
  EXPECT_THAT(s->token_ids, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(s->block_size, 4);
  EXPECT_EQ(s->lora_id, 7);
  EXPECT_EQ(s->medium, "GPU");
  EXPECT_EQ(s->lora_name, "adapter");
  EXPECT_EQ(s->cache_salt, "");
  EXPECT_EQ(s->chain_blocks, 2u);
  EXPECT_EQ(s->group_idx, 1);
  const BlockRemovedEvent* r = Removed(b, 1);
  ASSERT_NE(r, nullptr);
  EXPECT_THAT(r->block_hashes, ElementsAre(11u));
  EXPECT_EQ(r->medium, "CPU");
  EXPECT_EQ(r->group_idx, 1);
  EXPECT_TRUE(std::holds_alternative<AllBlocksClearedEvent>(b.events[2]));
  EXPECT_EQ(b.unknown_events, 0u);
  EXPECT_EQ(b.unknown_fields, 0u);
}

TEST(DecodeEventBatchTest, MapBatchOfMapEventsDecodesEveryField) {
  KvEventBatch b;
  const V payload = Map(
      {{"ts", Float(2.5)},
       {"events", Arr({Map({{"block_size", 2},  // keys in any order
                            {"token_ids", Tokens(5, 4)},
                            {"type", "BlockStored"},
                            {"block_hashes", Arr({-3, 4})},
                            {"parent_block_hash", kNil},
                            {"lora_id", kNil},
                            {"medium", kNil},
                            {"lora_name", kNil},
                            {"extra_keys", Arr({Arr({"tenant-salt"}), kNil})},
                            {"group_idx", 2},
                            {"kv_cache_spec_kind", "sliding_window"},
                            {"kv_cache_spec_sliding_window", 128}}),
                       Map({{"type", "BlockRemoved"},
                            {"block_hashes", Arr({4})},
                            {"medium", "cpu_offload"}}),
                       Map({{"type", "AllBlocksCleared"}})})},
       {"data_parallel_rank", 2}});
  ASSERT_TRUE(Decode(payload, &b).ok());
  EXPECT_EQ(b.ts, 2.5);
  EXPECT_EQ(b.data_parallel_rank, 2);
  ASSERT_EQ(b.events.size(), 3u);
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->block_hashes, ElementsAre(static_cast<uint64_t>(-3), 4u));
  EXPECT_FALSE(s->parent_block_hash.has_value());
  EXPECT_THAT(s->token_ids, ElementsAre(5, 6, 7, 8));
  EXPECT_EQ(s->block_size, 2);
  EXPECT_FALSE(s->lora_id.has_value());
  EXPECT_EQ(s->medium, "GPU");
  EXPECT_FALSE(s->lora_name.has_value());
  EXPECT_EQ(s->cache_salt, "tenant-salt");
  EXPECT_EQ(s->chain_blocks, 2u);
  EXPECT_EQ(s->group_idx, 2);
  const BlockRemovedEvent* r = Removed(b, 1);
  ASSERT_NE(r, nullptr);
  EXPECT_THAT(r->block_hashes, ElementsAre(4u));
  EXPECT_EQ(r->medium, "CPU_OFFLOAD");
  EXPECT_EQ(r->group_idx, 0);
  EXPECT_TRUE(std::holds_alternative<AllBlocksClearedEvent>(b.events[2]));
  // kv_cache_spec_* are known fields, merely unused.
  EXPECT_EQ(b.unknown_fields, 0u);
  EXPECT_EQ(b.unknown_events, 0u);
}

TEST(DecodeEventBatchTest, ArrayEventsInAMapBatchAndMapEventsInAnArrayBatch) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(Map({{"ts", 9}, {"events", Arr({Arr({"AllBlocksCleared"})})}}), &b)
          .ok());
  EXPECT_EQ(b.ts, 9.0);  // an int ts is a number too
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<AllBlocksClearedEvent>(b.events[0]));

  ASSERT_TRUE(Decode(ArrayBatch({Map({{"type", "BlockRemoved"},
                                      {"block_hashes", Arr({1, 2})},
                                      {"medium", "GPU"}})}),
                     &b)
                  .ok());
  const BlockRemovedEvent* r = Removed(b, 0);
  ASSERT_NE(r, nullptr);
  EXPECT_THAT(r->block_hashes, ElementsAre(1u, 2u));
}

TEST(DecodeEventBatchTest, DataParallelRankIsOptional) {
  KvEventBatch b;
  b.data_parallel_rank = 5;  // must not survive from an earlier batch
  ASSERT_TRUE(Decode(Map({{"ts", Float(0.5)}, {"events", Arr({})}}), &b).ok());
  EXPECT_FALSE(b.data_parallel_rank.has_value());
  EXPECT_TRUE(b.events.empty());

  ASSERT_TRUE(Decode(Arr({Float(0.5), Arr({}), kNil}), &b).ok());
  EXPECT_FALSE(b.data_parallel_rank.has_value());

  ASSERT_TRUE(Decode(Arr({Float(0.5), Arr({})}), &b).ok());
  EXPECT_FALSE(b.data_parallel_rank.has_value());

  ASSERT_TRUE(Decode(Arr({Float(0.5), Arr({}), 0}), &b).ok());
  EXPECT_EQ(b.data_parallel_rank, 0);

  ASSERT_TRUE(Decode(Map({{"data_parallel_rank", kNil},
                          {"ts", Float(0.5)},
                          {"events", Arr({})}}),
                     &b)
                  .ok());
  EXPECT_FALSE(b.data_parallel_rank.has_value());
}

TEST(DecodeEventBatchTest, IntHashesKeepTheir64BitTwosComplement) {
  KvEventBatch b;
  const uint64_t big = (uint64_t{1} << 63) + 5;
  ASSERT_TRUE(Decode(ArrayBatch({StoredArray(
                         Arr({0, -1, Uint(big), int64_t{-(int64_t{1} << 62)},
                              Uint(UINT64_MAX)}),
                         int64_t{-42}, Tokens(0, 5), 1)}),
                     &b)
                  .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->block_hashes,
              ElementsAre(0u, UINT64_MAX, big, uint64_t{3} << 62, UINT64_MAX));
  EXPECT_EQ(s->parent_block_hash, static_cast<uint64_t>(int64_t{-42}));
}

TEST(DecodeEventBatchTest, BytesHashesAreFoldedTheSameAsStrOrBin) {
  KvEventBatch b;
  const std::string h1(32, '\x01');
  const std::string h2 = std::string("\x00\xff", 2) + std::string(30, 'z');
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredArray(Arr({Bin(h1), Bin(h2), h1.c_str()}),
                                     Bin(h2), Tokens(0, 6), 2),
                         Arr({"BlockRemoved", Arr({Bin(h2)}), kNil})}),
             &b)
          .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->block_hashes, ElementsAre(FoldHashBytes(h1), FoldHashBytes(h2),
                                           FoldHashBytes(h1)));
  EXPECT_NE(FoldHashBytes(h1), FoldHashBytes(h2));
  EXPECT_EQ(s->parent_block_hash, FoldHashBytes(h2));
  const BlockRemovedEvent* r = Removed(b, 1);
  ASSERT_NE(r, nullptr);
  EXPECT_THAT(r->block_hashes, ElementsAre(FoldHashBytes(h2)));
}

TEST(DecodeEventBatchTest, OlderVllmOmitsTrailingBlockStoredFields) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(
          ArrayBatch({
              // Up to lora_id (5 fields after the tag).
              Arr({"BlockStored", Arr({1, 2}), kNil, Tokens(0, 4), 2, 3}),
              // Up to medium (6 fields).
              Arr({"BlockStored", Arr({3}), 2, Tokens(4, 2), 2, kNil, "cpu"}),
              // Even lora_id left out.
              Arr({"BlockStored", Arr({4}), 3, Tokens(6, 2), 2}),
          }),
          &b)
          .ok());
  ASSERT_EQ(b.events.size(), 3u);
  const BlockStoredEvent* a = Stored(b, 0);
  ASSERT_NE(a, nullptr);
  EXPECT_THAT(a->block_hashes, ElementsAre(1u, 2u));
  EXPECT_FALSE(a->parent_block_hash.has_value());
  EXPECT_EQ(a->lora_id, 3);
  EXPECT_EQ(a->medium, "GPU");
  EXPECT_FALSE(a->lora_name.has_value());
  EXPECT_EQ(a->chain_blocks, 2u);
  EXPECT_EQ(a->group_idx, 0);
  const BlockStoredEvent* c = Stored(b, 1);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->parent_block_hash, 2u);
  EXPECT_FALSE(c->lora_id.has_value());
  EXPECT_EQ(c->medium, "CPU");
  EXPECT_EQ(c->chain_blocks, 1u);
  const BlockStoredEvent* d = Stored(b, 2);
  ASSERT_NE(d, nullptr);
  EXPECT_FALSE(d->lora_id.has_value());
  EXPECT_THAT(d->token_ids, ElementsAre(6, 7));
  EXPECT_EQ(b.unknown_fields, 0u);
}

TEST(DecodeEventBatchTest, OlderVllmBlockRemovedWithoutGroupIdx) {
  KvEventBatch b;
  ASSERT_TRUE(Decode(ArrayBatch({Arr({"BlockRemoved", Arr({5}), "cpu"}),
                                 Arr({"BlockRemoved", Arr({6})})}),
                     &b)
                  .ok());
  const BlockRemovedEvent* r = Removed(b, 0);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->medium, "CPU");
  EXPECT_EQ(r->group_idx, 0);
  const BlockRemovedEvent* r2 = Removed(b, 1);
  ASSERT_NE(r2, nullptr);
  EXPECT_EQ(r2->medium, "GPU");
}

TEST(DecodeEventBatchTest, UnknownArrayTailsAndMapKeysAreSkippedAndCounted) {
  KvEventBatch b;
  V stored = StoredArray(Arr({1}), kNil, Tokens(0, 2), 2);
  // locality, ownership, session_id, event_version: known.
  for (V v : {V("LOCAL"), kNil, V("session-1"), V(1)})
    stored.items.push_back(v);
  stored.items.push_back("future");  // position 16
  stored.items.push_back(Arr({1, 2}));
  const V payload =
      Map({{"ts", Float(0.5)},
           {"events", Arr({stored,
                           Arr({"BlockRemoved", Arr({1}), "GPU", 0, kNil, kNil,
                                kNil, Map({{"x", 1}})}),
                           Arr({"AllBlocksCleared", 1}),
                           Map({{"type", "BlockRemoved"},
                                {"block_hashes", Arr({1})},
                                {"medium", "GPU"},
                                {"eviction_reason", "lru"},
                                {7, 8}})})},
           {"producer", "vllm-0.20"}});
  ASSERT_TRUE(Decode(payload, &b).ok());
  EXPECT_EQ(b.events.size(), 4u);
  // 2 (stored) + 1 (removed) + 1 (cleared) + 2 (map event) + 1 (batch).
  EXPECT_EQ(b.unknown_fields, 7u);
  EXPECT_EQ(b.unknown_events, 0u);
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->block_hashes, ElementsAre(1u));

  ASSERT_TRUE(Decode(Arr({Float(0.5), Arr({}), 0, "extra"}), &b).ok());
  EXPECT_EQ(b.unknown_fields, 1u);  // reset per batch, then the 4th element
}

TEST(DecodeEventBatchTest, UnknownEventTypeIsSkippedAndTheNextEventDecodes) {
  KvEventBatch b;
  ASSERT_TRUE(Decode(ArrayBatch({Arr({"BlockMoved", Arr({1}), 17, "x"}),
                                 Arr({"BlockRemoved", Arr({9}), kNil}),
                                 Map({{"type", "CacheResized"}, {"blocks", 9}}),
                                 Arr({"AllBlocksCleared"})}),
                     &b)
                  .ok());
  EXPECT_EQ(b.unknown_events, 2u);
  EXPECT_EQ(b.unknown_fields, 0u);  // an unknown event's fields are not counted
  ASSERT_EQ(b.events.size(), 2u);
  const BlockRemovedEvent* r = Removed(b, 0);
  ASSERT_NE(r, nullptr);
  EXPECT_THAT(r->block_hashes, ElementsAre(9u));
  EXPECT_TRUE(std::holds_alternative<AllBlocksClearedEvent>(b.events[1]));
}

TEST(DecodeEventBatchTest, ExtraKeysSetTheLoraNameAside) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredWithKeys(
                 3, "adapter",
                 Arr({Arr({"adapter"}), Arr({"adapter"}), Arr({"adapter"})}),
                 55)}),
             &b)
          .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->lora_name, "adapter");
  EXPECT_EQ(s->cache_salt, "");
  EXPECT_EQ(s->chain_blocks, 3u);
}

// The msgpack encoding of a str, as a legacy content key holds it.
std::string PackedStr(const std::string& s) { return Bytes(V(s.c_str())); }

ContentKey Key(ContentKey::Kind kind, std::string id, int64_t offset = 0) {
  ContentKey k;
  k.kind = kind;
  k.id = std::move(id);
  k.offset = offset;
  return k;
}

std::vector<ContentKey> ContentOf(const BlockStoredEvent& s, size_t block) {
  const absl::Span<const ContentKey> keys = s.content.Of(block);
  return std::vector<ContentKey>(keys.begin(), keys.end());
}

TEST(DecodeEventBatchTest, ExtraKeysSetOnlyOneCopyOfTheLoraNameAside) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredWithKeys(
                 2, "adapter",
                 Arr({Arr({"adapter"}), Arr({"adapter", "adapter"})}))}),
             &b)
          .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->chain_blocks, 2u);
  // The second copy is content the block's hash covered.
  EXPECT_TRUE(ContentOf(*s, 0).empty());
  EXPECT_THAT(ContentOf(*s, 1), ElementsAre(Key(ContentKey::Kind::kLegacy,
                                                PackedStr("adapter"))));
}

TEST(DecodeEventBatchTest, SaltComesFromTheFirstBlockOfARootEvent) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredWithKeys(
                 3, "adapter",
                 Arr({Arr({"adapter", "salt-1"}), Arr({"adapter"}), kNil}))}),
             &b)
          .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->cache_salt, "salt-1");
  EXPECT_EQ(s->chain_blocks, 3u);
}

TEST(DecodeEventBatchTest, AnOlderEnginesMultimodalHashIsALegacyKey) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredWithKeys(
                 4, kNil,
                 Arr({Arr({"salt"}), Arr({}), Arr({"mm-hash-0f3a"}), kNil}))}),
             &b)
          .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->cache_salt, "salt");
  EXPECT_EQ(s->chain_blocks, 4u);
  EXPECT_TRUE(ContentOf(*s, 0).empty());
  EXPECT_TRUE(ContentOf(*s, 1).empty());
  EXPECT_THAT(ContentOf(*s, 2), ElementsAre(Key(ContentKey::Kind::kLegacy,
                                                PackedStr("mm-hash-0f3a"))));
  EXPECT_TRUE(ContentOf(*s, 3).empty());
}

TEST(DecodeEventBatchTest, EmbeddingsAndMultimodalTuplesAreContentKeys) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(
          ArrayBatch(
              {StoredWithKeys(3, kNil,
                              Arr({kNil, Arr({Bin("embeds-digest")}), kNil})),
               StoredWithKeys(
                   2, kNil,
                   Arr({Arr({Arr({"mm-b", 5}), Arr({"mm-a", -3})}), kNil}))}),
          &b)
          .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->chain_blocks, 3u);
  EXPECT_THAT(ContentOf(*s, 1), ElementsAre(Key(ContentKey::Kind::kPromptEmbeds,
                                                "embeds-digest")));
  const BlockStoredEvent* t = Stored(b, 1);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->chain_blocks, 2u);
  EXPECT_EQ(t->cache_salt, "");  // a tuple in block 0 is no salt
  // Sorted: by kind, then offset.
  EXPECT_THAT(ContentOf(*t, 0),
              ElementsAre(Key(ContentKey::Kind::kMultiModal, "mm-a", -3),
                          Key(ContentKey::Kind::kMultiModal, "mm-b", 5)));
  EXPECT_TRUE(ContentOf(*t, 1).empty());
}

// vLLM's order: the LoRA name, the multimodal hashes (older engines: plain
// strings), the salt.
TEST(DecodeEventBatchTest, TheLastStringOfARootEventsFirstBlockIsTheSalt) {
  KvEventBatch b;
  ASSERT_TRUE(Decode(ArrayBatch({StoredWithKeys(
                         2, "adapter",
                         Arr({Arr({"adapter", "mm-hash", "salt"}), kNil}))}),
                     &b)
                  .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->chain_blocks, 2u);
  EXPECT_EQ(s->cache_salt, "salt");
  EXPECT_THAT(ContentOf(*s, 0), ElementsAre(Key(ContentKey::Kind::kLegacy,
                                                PackedStr("mm-hash"))));
}

TEST(DecodeEventBatchTest, AStringInANonRootEventIsNoSalt) {
  KvEventBatch b;
  ASSERT_TRUE(Decode(ArrayBatch({StoredWithKeys(
                         2, kNil, Arr({Arr({"salt"}), kNil}), /*parent=*/77)}),
                     &b)
                  .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->parent_block_hash, 77u);
  EXPECT_EQ(s->chain_blocks, 2u);
  EXPECT_EQ(s->cache_salt, "");
  EXPECT_THAT(ContentOf(*s, 0),
              ElementsAre(Key(ContentKey::Kind::kLegacy, PackedStr("salt"))));
}

// The newest vLLM types its extra keys; an older one sends raw tuples. The
// same request must give the same namespace and the same content keys.
TEST(DecodeEventBatchTest, TypedAndRawExtraKeysGiveTheSameNamespaceAndKeys) {
  const V raw =
      Arr({Arr({"adapter", Arr({"img-1", 3}), "salt-7", Bin("emb-0")}),
           Arr({"adapter", Arr({"img-1", -13}), "old-mm"}), kNil});
  const V typed =
      Arr({Arr({Map({{"type", "lora"}, {"name", "adapter"}}),
                Map({{"type", "mm"},
                     {"modality", "image"},
                     {"hash", "img-1"},
                     {"block_offset", 3}}),
                Map({{"type", "cache_salt"}, {"salt", "salt-7"}}),
                Map({{"type", "prompt_embeds"}, {"hash", Bin("emb-0")}})}),
           // Another order within a block changes nothing.
           Arr({Map({{"type", "legacy"}, {"value", "old-mm"}}),
                Map({{"type", "mm"}, {"hash", "img-1"}, {"block_offset", -13}}),
                Map({{"type", "lora"}, {"name", "adapter"}})}),
           Arr({})});
  KvEventBatch from_raw, from_typed;
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredWithKeys(3, "adapter", raw)}), &from_raw).ok());
  // The typed form may leave lora_name null: its LoRA key names it.
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredWithKeys(3, kNil, typed)}), &from_typed).ok());
  const BlockStoredEvent* r = Stored(from_raw, 0);
  const BlockStoredEvent* t = Stored(from_typed, 0);
  ASSERT_NE(r, nullptr);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(r->lora_name, "adapter");
  EXPECT_EQ(t->lora_name, "adapter");
  EXPECT_EQ(r->cache_salt, "salt-7");
  EXPECT_EQ(t->cache_salt, "salt-7");
  EXPECT_EQ(r->chain_blocks, 3u);
  EXPECT_EQ(t->chain_blocks, 3u);
  for (size_t block = 0; block < 3; ++block) {
    EXPECT_EQ(ContentOf(*r, block), ContentOf(*t, block)) << "block " << block;
  }
  EXPECT_THAT(ContentOf(*t, 0),
              ElementsAre(Key(ContentKey::Kind::kMultiModal, "img-1", 3),
                          Key(ContentKey::Kind::kPromptEmbeds, "emb-0")));
  EXPECT_THAT(ContentOf(*t, 1),
              ElementsAre(Key(ContentKey::Kind::kMultiModal, "img-1", -13),
                          Key(ContentKey::Kind::kLegacy, PackedStr("old-mm"))));
}

// What the decoder cannot vouch for ends the chain before that block.
TEST(DecodeEventBatchTest, TypedKeysItCannotReadEndTheChain) {
  const std::vector<std::pair<const char*, V>> cases = {
      {"unknown type", Map({{"type", "audio_codes"}, {"hash", "x"}})},
      {"no type", Map({{"hash", "x"}})},
      {"another LoRA", Map({{"type", "lora"}, {"name", "other"}})},
      {"salt outside block 0", Map({{"type", "cache_salt"}, {"salt", "s"}})},
      {"mm without offset", Map({{"type", "mm"}, {"hash", "x"}})},
      {"mm hash an int",
       Map({{"type", "mm"}, {"hash", 7}, {"block_offset", 0}})},
      {"embeds without hash", Map({{"type", "prompt_embeds"}})},
      {"legacy without value", Map({{"type", "legacy"}})},
  };
  for (const auto& [what, key] : cases) {
    KvEventBatch b;
    ASSERT_TRUE(
        Decode(ArrayBatch({StoredWithKeys(
                   3, "adapter",
                   Arr({Arr({"adapter"}), Arr({"adapter", key}), kNil}))}),
               &b)
            .ok())
        << what;
    ASSERT_NE(Stored(b, 0), nullptr) << what;
    EXPECT_EQ(Stored(b, 0)->chain_blocks, 1u) << what;
  }
  // A second typed salt in block 0, or one in a non-root event: block 0.
  KvEventBatch b;
  const V salt = Map({{"type", "cache_salt"}, {"salt", "s"}});
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredWithKeys(2, kNil, Arr({Arr({salt, salt})})),
                         StoredWithKeys(2, kNil, Arr({Arr({salt})}), 77)}),
             &b)
          .ok());
  EXPECT_EQ(Stored(b, 0)->chain_blocks, 0u);
  EXPECT_EQ(Stored(b, 1)->chain_blocks, 0u);
}

// A block's entry of more than 32 items (a few multimodal inputs, the
// LoRA, the salt and embeddings are all a block has) ends the chain: each
// item would cost the decoder about 50 times its bytes.
TEST(DecodeEventBatchTest, AnEntryOfMoreThan32ItemsEndsTheChain) {
  for (const size_t items : {size_t{32}, size_t{33}}) {
    V entry = Arr({});
    for (size_t i = 0; i < items; ++i) entry.items.push_back(Arr({}));
    KvEventBatch b;
    ASSERT_TRUE(
        Decode(ArrayBatch({StoredWithKeys(3, kNil, Arr({kNil, entry}))}), &b)
            .ok());
    ASSERT_NE(Stored(b, 0), nullptr);
    EXPECT_EQ(Stored(b, 0)->chain_blocks, items == 32 ? 3u : 1u) << items;
    EXPECT_EQ(Stored(b, 0)->content.keys.size(), items == 32 ? 32u : 0u);
  }
}

TEST(DecodeEventBatchTest, NewestFieldsAreReadInBothForms) {
  KvEventBatch b;
  V stored =
      StoredArray(Arr({1}), kNil, Tokens(0, 2), 2, kNil, "cpu", kNil, kNil, 2);
  stored.items[10] = "Sliding_Window";
  stored.items[11] = 4096;
  for (V v : {V("remote"), V("lmcache"), V("sess-9"), V(1)})
    stored.items.push_back(v);
  ASSERT_TRUE(Decode(ArrayBatch({stored, Map({{"type", "BlockRemoved"},
                                              {"block_hashes", Arr({1})},
                                              {"medium", "cpu"},
                                              {"group_idx", 2},
                                              {"locality", "LOCAL"},
                                              {"ownership", "lmcache"},
                                              {"event_version", 1}})}),
                     &b)
                  .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->group_idx, 2);
  EXPECT_EQ(s->kv_cache_spec_kind, "sliding_window");
  EXPECT_EQ(s->kv_cache_spec_sliding_window, 4096);
  EXPECT_EQ(s->locality, "REMOTE");
  EXPECT_EQ(s->ownership, "lmcache");
  EXPECT_EQ(s->event_version, 1);
  EXPECT_EQ(b.unknown_fields, 0u);
  const BlockRemovedEvent* r = Removed(b, 1);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->locality, "LOCAL");
  EXPECT_EQ(r->ownership, "lmcache");
  EXPECT_EQ(r->event_version, 1);

  // Wrong types are errors naming the field.
  stored.items[12] = 5;
  const absl::Status st = DecodeError(ArrayBatch({stored}));
  EXPECT_THAT(st.message(), HasSubstr("locality is a int"));
  stored.items[12] = kNil;
  stored.items[11] = -1;
  EXPECT_THAT(DecodeError(ArrayBatch({stored})).message(),
              HasSubstr("kv_cache_spec_sliding_window -1 is negative"));
}

// vLLM's removal of one copy of a block whose hash other copies share:
// remaining_copy_counts (map events) gives each hash's copies left.
TEST(DecodeEventBatchTest, AHashWithACopyLeftIsNotRemoved) {
  const auto removed = [](V counts) {
    return Map({{"type", "BlockRemoved"},
                {"block_hashes", Arr({11, 12, 13, 14})},
                {"medium", "GPU"},
                {"group_idx", kNil},
                {"remaining_copy_counts", counts}});
  };
  KvEventBatch b;
  ASSERT_TRUE(Decode(ArrayBatch({removed(Arr({1, 0, 2, 0})),
                                 removed(Arr({3, 1, 1, 1})), removed(kNil)}),
                     &b)
                  .ok());
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_THAT(Removed(b, 0)->block_hashes, ElementsAre(12u, 14u));
  EXPECT_THAT(Removed(b, 1)->block_hashes, ElementsAre());
  EXPECT_THAT(Removed(b, 2)->block_hashes, ElementsAre(11u, 12u, 13u, 14u));
  EXPECT_EQ(b.unknown_fields, 0u);

  // In the array form it has no position: an element past the known ones.
  ASSERT_TRUE(Decode(ArrayBatch({Arr({"BlockRemoved", Arr({11}), "GPU", kNil,
                                      kNil, kNil, kNil, Arr({1})})}),
                     &b)
                  .ok());
  EXPECT_THAT(Removed(b, 0)->block_hashes, ElementsAre(11u));
  EXPECT_EQ(b.unknown_fields, 1u);

  // Counts that do not name each hash's copies are errors naming them.
  EXPECT_THAT(DecodeError(ArrayBatch({removed(Arr({0, 0, 1}))})).message(),
              HasSubstr("event 0 (BlockRemoved): remaining_copy_counts has 3 "
                        "counts for 4 block_hashes, want one per hash"));
  EXPECT_THAT(DecodeError(ArrayBatch({removed(Arr({0, -1, 0, 0}))})).message(),
              HasSubstr("remaining_copy_counts[1] -1 is negative"));
  EXPECT_THAT(DecodeError(ArrayBatch({removed(Arr({0, 0, "1", 0}))})).message(),
              HasSubstr("remaining_copy_counts[2] is a str, want an int >= 0"));
  EXPECT_THAT(
      DecodeError(ArrayBatch({removed(5)})).message(),
      HasSubstr("remaining_copy_counts is a int, want an array or nil"));
}

// vLLM's OffloadingConnector announces what it copied to the CPU as
// placeholders: the offloaded block's hash, token_ids [], no parent, and
// block_size 0 (older vLLM: the offloaded block's size).
TEST(DecodeEventBatchTest, OffloadingPlaceholdersDecode) {
  const V newer = Map({{"type", "BlockStored"},
                       {"block_hashes", Arr({Bin(std::string(32, 'a'))})},
                       {"parent_block_hash", kNil},
                       {"token_ids", Arr({})},
                       {"block_size", 0},
                       {"lora_id", kNil},
                       {"medium", "CPU"},
                       {"lora_name", kNil},
                       {"group_idx", 1},
                       {"locality", "LOCAL"}});
  const V older = StoredArray(Arr({21}), kNil, Arr({}), 256, kNil, "CPU");
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(ArrayBatch(
                 {newer, older, StoredArray(Arr({22}), kNil, Tokens(0, 2), 2)}),
             &b)
          .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->placeholder);
  EXPECT_THAT(s->block_hashes,
              ElementsAre(FoldHashBytes(std::string(32, 'a'))));
  EXPECT_TRUE(s->token_ids.empty());
  EXPECT_EQ(s->block_size, 0);
  EXPECT_EQ(s->medium, "CPU");
  EXPECT_EQ(s->group_idx, 1);
  EXPECT_FALSE(s->parent_block_hash.has_value());
  s = Stored(b, 1);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->placeholder);
  EXPECT_EQ(s->block_size, 256);
  // A slot reused for a store with tokens is no placeholder.
  s = Stored(b, 2);
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->placeholder);
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredArray(Arr({22}), kNil, Tokens(0, 2), 2)}), &b)
          .ok());
  EXPECT_FALSE(Stored(b, 0)->placeholder);
  // token_ids nil stays a store of keys alone (RFC #1527), not a placeholder.
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredArray(Arr({22}), kNil, kNil, kNil)}), &b).ok());
  EXPECT_FALSE(Stored(b, 0)->placeholder);
}

// SGLang's radix cache under EAGLE publishes each page's positions as pairs
// [token, next token] (its bigram keys): block_size pairs per block, the
// pairs overlapping by a token.
// Payloads msgspec encodes from SGLang's own KVEventBatch schema (the
// newest: tagged maps in an array batch, None fields left out), the bytes
// SGLang's KV indexer bridge checks its decoder against.
TEST(DecodeEventBatchTest, SglangsMsgspecPayloadsDecode) {
  const auto bytes = [](absl::string_view hex) {
    return absl::HexStringToBytes(hex);
  };
  KvEventBatch b;
  // EAGLE's bigram page: [1.5, [{BlockStored, [111], nil, [[10, 20],
  // [20, 30]], 2, nil, "GPU"}], 3].
  ASSERT_TRUE(
      DecodeEventBatch(
          bytes("93cb3ff80000000000009187a474797065ab426c6f636b53746f726564ac62"
                "6c6f636b5f686173686573916fb1706172656e745f626c6f636b5f68617368"
                "c0a9746f6b656e5f69647392920a1492141eaa626c6f636b5f73697a6502a7"
                "6c6f72615f6964c0a66d656469756da347505503"),
          &b)
          .ok());
  EXPECT_EQ(b.ts, 1.5);
  EXPECT_EQ(b.data_parallel_rank, 3);
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_TRUE(Stored(b, 0)->bigram);
  EXPECT_EQ(Stored(b, 0)->block_hashes, std::vector<EngineHash>({111}));
  EXPECT_EQ(Stored(b, 0)->token_ids, std::vector<Token>({10, 20}));
  EXPECT_EQ(b.unknown_fields, 0u);
  // medium None, so left out of both events, and a nil rank: [0.0,
  // [{BlockStored, [1], nil, [5, 6], 2, nil}, {BlockRemoved, [2]}], nil].
  ASSERT_TRUE(
      DecodeEventBatch(
          bytes("93cb00000000000000009286a474797065ab426c6f636b53746f726564ac62"
                "6c6f636b5f6861736865739101b1706172656e745f626c6f636b5f68617368"
                "c0a9746f6b656e5f696473920506aa626c6f636b5f73697a6502a76c6f7261"
                "5f6964c082a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68"
                "61736865739102c0"),
          &b)
          .ok());
  ASSERT_EQ(b.events.size(), 2u);
  EXPECT_EQ(Stored(b, 0)->medium, "GPU");
  EXPECT_EQ(Stored(b, 0)->token_ids, std::vector<Token>({5, 6}));
  const auto& removed = std::get<BlockRemovedEvent>(b.events[1]);
  EXPECT_EQ(removed.medium, "GPU");
  EXPECT_EQ(removed.block_hashes, std::vector<EngineHash>({2}));
}

TEST(DecodeEventBatchTest, EaglesBigramPagesDecode) {
  const V pairs =
      Arr({Arr({10, 11}), Arr({11, 12}), Arr({12, 13}), Arr({13, 14})});
  KvEventBatch b;
  ASSERT_TRUE(Decode(ArrayBatch({StoredArray(Arr({1, 2}), kNil, pairs, 2, kNil,
                                             "GPU")}),
                     &b)
                  .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->bigram);
  EXPECT_THAT(s->token_ids, ElementsAre(10, 11, 12, 13));
  // Each block's content ends with the token after it.
  ASSERT_EQ(s->content.Of(0).size(), 1u);
  EXPECT_EQ(s->content.Of(0)[0].kind, ContentKey::Kind::kNextToken);
  EXPECT_EQ(s->content.Of(0)[0].offset, 12);
  ASSERT_EQ(s->content.Of(1).size(), 1u);
  EXPECT_EQ(s->content.Of(1)[0].offset, 14);
  // A slot reused for plain tokens is no bigram store.
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredArray(Arr({3}), kNil, Tokens(0, 2), 2)}), &b)
          .ok());
  EXPECT_FALSE(Stored(b, 0)->bigram);
  EXPECT_TRUE(Stored(b, 0)->content.empty());

  const std::pair<V, std::string> bad[] = {
      {Arr({Arr({10, 11}), Arr({12, 13})}),
       "token_ids[1] starts with 12 but token_ids[0] ends with 11"},
      {Arr({Arr({10, 11}), 11}), "token_ids[1] is a int"},
      {Arr({Arr({10, 11}), Arr({11, 12, 13})}),
       "token_ids[1] is an array of 3"},
      {Arr({Arr({10, 11}), Arr({11, -1})}),
       "token_ids[1][1] is not a token id"},
  };
  for (const auto& [tokens, want] : bad) {
    const absl::Status st =
        Decode(ArrayBatch({StoredArray(Arr({1}), kNil, tokens, 2)}), &b);
    EXPECT_THAT(st.message(), HasSubstr(want)) << st;
  }
}

// SGLang's cache salt in the two layouts it shipped: its metadata map
// {"cache_salt": S} right after medium (the lora_name slot), and later
// extra_keys [["dynamo-cache-salt:S"]] with the map past ownership (the
// session_id slot); in every store of a salted request, root or not.
TEST(DecodeEventBatchTest, SglangsCacheSaltDecodes) {
  const V meta = Map({{"cache_salt", "tenant-a"}});
  const auto newer = [&](V extra_keys, V metadata) {
    return Arr({"BlockStored", Arr({2, 3}), 1, Tokens(2, 4), 2, kNil, "GPU",
                kNil, extra_keys, kNil, kNil, kNil, kNil, kNil, metadata});
  };
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(
          ArrayBatch({Arr({"BlockStored", Arr({1}), kNil, Tokens(0, 2), 2, kNil,
                           "GPU", meta}),
                      newer(Arr({Arr({"dynamo-cache-salt:tenant-a"})}), meta)}),
          &b)
          .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->cache_salt, "tenant-a");
  EXPECT_FALSE(s->lora_name.has_value());
  s = Stored(b, 1);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->cache_salt, "tenant-a");  // a child's too
  EXPECT_EQ(s->chain_blocks, 2u);
  EXPECT_TRUE(s->content.empty());
  // The prefixed salt alone; in a later block it ends the chain there.
  ASSERT_TRUE(Decode(ArrayBatch({newer(
                         Arr({kNil, Arr({"dynamo-cache-salt:x"})}), kNil)}),
                     &b)
                  .ok());
  EXPECT_EQ(Stored(b, 0)->chain_blocks, 1u);
  EXPECT_EQ(Stored(b, 0)->cache_salt, "");

  const std::pair<V, std::string> bad[] = {
      {newer(Arr({Arr({"dynamo-cache-salt:tenant-b"})}), meta),
       "metadata's cache_salt \"tenant-a\" is not extra_keys' \"tenant-b\""},
      {newer(kNil, Map({{"cache_salt", 7}})),
       "session_id is SGLang's metadata, whose cache_salt is a int"},
  };
  for (const auto& [event, want] : bad) {
    const absl::Status st = Decode(ArrayBatch({event}), &b);
    EXPECT_THAT(st.message(), HasSubstr(want)) << st;
  }
}

// SGLang's newest layout: a positional batch of tagged maps, the salt and
// the session as named fields of any store.
TEST(DecodeEventBatchTest, SglangsNamedCacheSaltDecodes) {
  const auto stored = [](V parent,
                         std::initializer_list<std::pair<V, V>> more) {
    V m = Map({{"type", "BlockStored"},
               {"block_hashes", Arr({7})},
               {"parent_block_hash", parent},
               {"token_ids", Tokens(0, 2)},
               {"block_size", 2},
               {"lora_id", kNil},
               {"medium", "GPU"}});
    for (const auto& [k, v] : more) {
      m.items.push_back(k);
      m.items.push_back(v);
    }
    return m;
  };
  KvEventBatch b;
  // [ts, events, attn_dp_rank]
  ASSERT_TRUE(Decode(Arr({Float(1.5),
                          Arr({stored(kNil, {}),
                               stored(kNil, {{"cache_salt", "tenant-a"}}),
                               stored(6, {{"cache_salt", "tenant-a"},
                                          {"session_id", "session-a"},
                                          {"lora_name", "sql"}}),
                               stored(kNil, {{"session_id", "session-a"}}),
                               Map({{"type", "BlockRemoved"},
                                    {"block_hashes", Arr({7})},
                                    {"medium", "GPU"}})}),
                          0}),
                     &b)
                  .ok());
  ASSERT_EQ(b.events.size(), 5u);
  EXPECT_EQ(b.unknown_fields, 0u);
  EXPECT_EQ(Stored(b, 0)->cache_salt, "");
  EXPECT_EQ(Stored(b, 1)->cache_salt, "tenant-a");
  EXPECT_EQ(Stored(b, 2)->cache_salt, "tenant-a");  // a child's too
  EXPECT_EQ(Stored(b, 2)->lora_name, "sql");
  EXPECT_EQ(Stored(b, 3)->cache_salt, "");

  const std::pair<V, std::string> bad[] = {
      {stored(kNil, {{"cache_salt", 7}}), "cache_salt is a int"},
      {stored(kNil,
              {{"cache_salt", "tenant-a"},
               {"extra_keys", Arr({Arr({"dynamo-cache-salt:tenant-b"})})}}),
       "cache_salt \"tenant-a\" is not extra_keys' \"tenant-b\""},
  };
  for (const auto& [event, want] : bad) {
    const absl::Status st = Decode(ArrayBatch({event}), &b);
    EXPECT_THAT(st.message(), HasSubstr(want)) << st;
  }
}

// SGLang's --enable-kv-events-component-types, as its own KV indexer
// bridge reads it: a list of component names after medium in the array
// form, the field component_types in the map form; nil (or no field) is a
// store of the whole block, and names SGLang does not have are left out.
TEST(DecodeEventBatchTest, SglangsComponentTypesDecode) {
  const auto array_stored = [](V components) {
    return Arr({"BlockStored", Arr({7}), kNil, Tokens(0, 2), 2, kNil, "GPU",
                components});
  };
  const auto map_stored = [](V components) {
    return Map({{"type", "BlockStored"},
                {"block_hashes", Arr({7})},
                {"parent_block_hash", kNil},
                {"token_ids", Tokens(0, 2)},
                {"block_size", 2},
                {"lora_id", kNil},
                {"medium", "GPU"},
                {"component_types", components}});
  };
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(Arr({Float(1.5),
                  Arr({array_stored(Arr({"full", "swa"})), array_stored(kNil),
                       array_stored(Arr({"mamba"})),
                       map_stored(Arr({"full", "mamba"})), map_stored(kNil),
                       map_stored(Arr({})), map_stored(Arr({"full", "mla"}))}),
                  0}),
             &b)
          .ok());
  ASSERT_EQ(b.events.size(), 7u);
  EXPECT_EQ(b.unknown_fields, 0u);
  EXPECT_EQ(Stored(b, 0)->components, kComponentFull | kComponentSwa);
  EXPECT_FALSE(Stored(b, 0)->lora_name.has_value());
  EXPECT_EQ(Stored(b, 1)->components, 0u);
  EXPECT_EQ(Stored(b, 2)->components, kComponentMamba);
  EXPECT_EQ(Stored(b, 3)->components, kComponentFull | kComponentMamba);
  EXPECT_EQ(Stored(b, 4)->components, 0u);
  EXPECT_EQ(Stored(b, 5)->components, 0u);
  EXPECT_EQ(Stored(b, 6)->components, kComponentFull);

  const std::pair<V, std::string> bad[] = {
      {array_stored(Arr({"full", 3})), "component_types[1] is a int"},
      {map_stored("full"), "component_types is a str, want an array or nil"},
      {map_stored(Arr({Arr({"full"})})), "component_types[0] is a array"},
  };
  for (const auto& [event, want] : bad) {
    const absl::Status st = Decode(ArrayBatch({event}), &b);
    EXPECT_THAT(st.message(), HasSubstr(want)) << st;
  }
}

// SGLang's earlier component-typed events: one component's name where
// vLLM has medium, then component_id, snapshot_version and medium.
TEST(DecodeEventBatchTest, SglangsOneComponentLayoutDecodes) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(ArrayBatch({Arr({"BlockStored", Arr({7}), kNil, Tokens(0, 2), 2,
                              kNil, "swa", kNil, 0, "CPU_PINNED"}),
                         Arr({"BlockStored", Arr({8}), 7, Tokens(2, 2), 2, kNil,
                              "full"}),
                         Arr({"BlockRemoved", Arr({7}), "mamba", 3, 0, "GPU"}),
                         Arr({"BlockRemoved", Arr({8}), "GPU", 1})}),
             &b)
          .ok());
  ASSERT_EQ(b.events.size(), 4u);
  EXPECT_EQ(b.unknown_fields, 0u);
  EXPECT_EQ(Stored(b, 0)->components, kComponentSwa);
  EXPECT_TRUE(Stored(b, 0)->one_component);
  EXPECT_EQ(Stored(b, 0)->medium, "CPU_PINNED");
  EXPECT_FALSE(Stored(b, 0)->lora_name.has_value());
  EXPECT_EQ(Stored(b, 0)->group_idx, 0);
  EXPECT_EQ(Stored(b, 1)->components, kComponentFull);
  EXPECT_EQ(Stored(b, 1)->medium, "GPU");  // trailing defaults left out
  const auto& removed = std::get<BlockRemovedEvent>(b.events[2]);
  EXPECT_EQ(removed.components, kComponentMamba);
  EXPECT_EQ(removed.medium, "GPU");
  EXPECT_EQ(removed.group_idx, 0);
  const auto& plain = std::get<BlockRemovedEvent>(b.events[3]);
  EXPECT_EQ(plain.components, 0u);
  EXPECT_EQ(plain.group_idx, 1);

  // The same fields by name, in the map form.
  ASSERT_TRUE(Decode(ArrayBatch({Map({{"type", "BlockStored"},
                                      {"block_hashes", Arr({7})},
                                      {"parent_block_hash", kNil},
                                      {"token_ids", Tokens(0, 2)},
                                      {"block_size", 2},
                                      {"lora_id", kNil},
                                      {"component_type", "mamba"},
                                      {"component_id", 2},
                                      {"snapshot_version", 1},
                                      {"medium", "GPU"}}),
                                 Map({{"type", "BlockRemoved"},
                                      {"block_hashes", Arr({7})},
                                      {"component_type", "swa"},
                                      {"medium", "GPU"}})}),
                     &b)
                  .ok());
  EXPECT_EQ(b.unknown_fields, 0u);
  EXPECT_EQ(Stored(b, 0)->components, kComponentMamba);
  EXPECT_TRUE(Stored(b, 0)->one_component);
  EXPECT_EQ(std::get<BlockRemovedEvent>(b.events[1]).components, kComponentSwa);

  const std::pair<V, std::string> bad[] = {
      {Arr({"BlockStored", Arr({7}), kNil, Tokens(0, 2), 2, kNil, "full", "x"}),
       "component_id is a str"},
      {Arr({"BlockRemoved", Arr({7}), "swa", kNil, -1}),
       "snapshot_version is a int"},
  };
  for (const auto& [event, want] : bad) {
    const absl::Status st = Decode(ArrayBatch({event}), &b);
    EXPECT_THAT(st.message(), HasSubstr(want)) << st;
  }
}

TEST(DecodeEventBatchTest, ExtraKeysOfAnotherLengthThanTheBlocksAreNoError) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredWithKeys(3, kNil, Arr({Arr({"salt"})})),
                         StoredWithKeys(
                             1, kNil, Arr({kNil, Arr({"mm"}), Arr({1, 2})}))}),
             &b)
          .ok());
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->cache_salt, "salt");
  EXPECT_EQ(s->chain_blocks, 3u);  // missing entries are plain
  const BlockStoredEvent* t = Stored(b, 1);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->chain_blocks, 1u);  // entries past the blocks describe nothing
}

// TensorRT-LLM's stores: a token given as text, or multimodal keys on a
// block, end the indexed chain before that block; neither is an error, and
// mm_keys is a known field. A sparse store with a text token is refused.
TEST(DecodeEventBatchTest, TensorRtLlmsOpaqueBlocksEndTheChain) {
  V text = StoredWithKeys(3, kNil, kNil);
  text.items[7] = Arr({0, 1, "img:9", 3, 4, 5});  // token_ids: block 1
  V mm = StoredWithKeys(3, kNil, Arr({Arr({"salt"})}));
  mm.items.push_back("mm_keys");
  mm.items.push_back(Arr(
      {Arr({}), kNil,
       Arr({Map(
           {{"type", "mm_key"}, {"hash", "ab12"}, {"start_offset", 0}})})}));
  KvEventBatch b;
  ASSERT_TRUE(Decode(ArrayBatch({text, mm}), &b).ok());
  ASSERT_NE(Stored(b, 0), nullptr);
  EXPECT_EQ(Stored(b, 0)->chain_blocks, 1u);
  ASSERT_NE(Stored(b, 1), nullptr);
  EXPECT_EQ(Stored(b, 1)->chain_blocks, 2u);
  EXPECT_EQ(Stored(b, 1)->cache_salt, "salt");
  EXPECT_EQ(b.unknown_fields, 0u);

  V bad = StoredWithKeys(1, kNil, kNil);
  bad.items.push_back("mm_keys");
  bad.items.push_back(7);
  EXPECT_THAT(DecodeError(ArrayBatch({bad})).message(), HasSubstr("mm_keys"));
  V sparse = StoredWithKeys(1, kNil, kNil);
  sparse.items[7] = Arr({0, 1, "x", 3});  // 2 blocks of tokens, 1 hash
  EXPECT_THAT(DecodeError(ArrayBatch({sparse})).message(),
              HasSubstr("token_ids[2] is a"));
}

TEST(DecodeEventBatchTest, GroupIdxIsReadAndNilMeansZero) {
  KvEventBatch b;
  ASSERT_TRUE(Decode(ArrayBatch({StoredArray(Arr({1}), kNil, Tokens(0, 2), 2,
                                             kNil, "GPU", kNil, kNil, 4),
                                 StoredArray(Arr({2}), kNil, Tokens(0, 2), 2,
                                             kNil, "GPU", kNil, kNil, kNil),
                                 Map({{"type", "BlockRemoved"},
                                      {"block_hashes", Arr({1})},
                                      {"medium", "GPU"},
                                      {"group_idx", 4}})}),
                     &b)
                  .ok());
  ASSERT_NE(Stored(b, 0), nullptr);
  EXPECT_EQ(Stored(b, 0)->group_idx, 4);
  ASSERT_NE(Stored(b, 1), nullptr);
  EXPECT_EQ(Stored(b, 1)->group_idx, 0);
  ASSERT_NE(Removed(b, 2), nullptr);
  EXPECT_EQ(Removed(b, 2)->group_idx, 4);
}

TEST(DecodeEventBatchTest, ReusedBatchKeepsNothingFromTheLastOne) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredWithKeys(2, "adapter",
                                        Arr({Arr({"adapter", "salt"}), kNil})),
                         Arr({"BlockRemoved", Arr({1, 2, 3}), "cpu", 5}),
                         Arr({"AllBlocksCleared"})}),
             &b)
          .ok());
  ASSERT_NE(Stored(b, 0), nullptr);
  ASSERT_EQ(Stored(b, 0)->cache_salt, "salt");
  // Slot 0 is a BlockStored again, slot 1 changes type, slot 2 goes away.
  ASSERT_TRUE(Decode(ArrayBatch({StoredArray(Arr({9}), 8, Tokens(3, 1), 1),
                                 Arr({"AllBlocksCleared"})}),
                     &b)
                  .ok());
  ASSERT_EQ(b.events.size(), 2u);
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->block_hashes, ElementsAre(9u));
  EXPECT_EQ(s->parent_block_hash, 8u);
  EXPECT_THAT(s->token_ids, ElementsAre(3));
  EXPECT_EQ(s->block_size, 1);
  EXPECT_EQ(s->medium, "GPU");
  EXPECT_FALSE(s->lora_name.has_value());
  EXPECT_EQ(s->cache_salt, "");
  EXPECT_EQ(s->chain_blocks, 1u);
  EXPECT_TRUE(std::holds_alternative<AllBlocksClearedEvent>(b.events[1]));
}

// Errors.

TEST(DecodeEventBatchTest, GarbageBytesAreAnError) {
  KvEventBatch b;
  // 0xc1 is the one byte msgpack never uses.
  const absl::Status s = DecodeEventBatch("\xc1\x01\x02", &b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not valid msgpack"));
  EXPECT_EQ(DecodeEventBatch("", &b).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DecodeEventBatchTest, TruncatedPayloadIsAnError) {
  const std::string full = Bytes(ArrayBatch({StoredArray(
      Arr({1, 2}), kNil, Tokens(0, 4), 2, kNil, "GPU", "adapter")}));
  KvEventBatch b;
  ASSERT_TRUE(DecodeEventBatch(full, &b).ok());
  for (size_t cut = 0; cut < full.size(); ++cut) {
    const absl::Status s =
        DecodeEventBatch(absl::string_view(full).substr(0, cut), &b);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "cut " << cut;
  }
}

TEST(DecodeEventBatchTest, TrailingBytesAreAnError) {
  KvEventBatch b;
  const absl::Status s =
      DecodeEventBatch(Bytes(ArrayBatch({})) + std::string("\x90\x90", 2), &b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("2 trailing bytes"));
}

TEST(DecodeEventBatchTest, TokenCountMismatchNamesBothNumbers) {
  const absl::Status s = DecodeError(
      ArrayBatch({Arr({"AllBlocksCleared"}),
                  StoredArray(Arr({1, 2}), kNil, Tokens(0, 30), 16)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("event 1"));
  EXPECT_THAT(s.message(), HasSubstr("token_ids has 30 tokens"));
  EXPECT_THAT(s.message(), HasSubstr("= 32"));
}

// vLLM leaves a group's null blocks out of block_hashes but not out of
// token_ids: more whole blocks of tokens than hashes is a sparse store.
TEST(DecodeEventBatchTest, MoreWholeBlocksOfTokensThanHashesIsASparseStore) {
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredArray(Arr({7}), kNil, Tokens(0, 48), 16)}), &b)
          .ok());
  ASSERT_NE(Stored(b, 0), nullptr);
  EXPECT_TRUE(Stored(b, 0)->sparse);
  EXPECT_EQ(Stored(b, 0)->token_ids.size(), 48u);
  // Every new block null: no hash at all.
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredArray(Arr({}), kNil, Tokens(0, 16), 16)}), &b)
          .ok());
  EXPECT_TRUE(Stored(b, 0)->sparse);
  ASSERT_TRUE(
      Decode(ArrayBatch({StoredArray(Arr({7}), kNil, Tokens(0, 16), 16)}), &b)
          .ok());
  EXPECT_FALSE(Stored(b, 0)->sparse);
  // Fewer tokens than the hashes' blocks, or a part of a block, is not.
  absl::Status s = DecodeError(
      ArrayBatch({StoredArray(Arr({1, 2}), kNil, Tokens(0, 16), 16)}));
  EXPECT_THAT(s.message(), HasSubstr("token_ids has 16 tokens"));
  s = DecodeError(ArrayBatch({StoredArray(Arr({1}), kNil, Tokens(0, 40), 16)}));
  EXPECT_THAT(s.message(), HasSubstr("token_ids has 40 tokens"));
}

TEST(DecodeEventBatchTest, HugeBlockSizeDoesNotWrapTheTokenCount) {
  // 4 * (2^62 + 1) wraps to 4 in 64 bits, which 4 token ids would match.
  const absl::Status s = DecodeError(ArrayBatch({StoredArray(
      Arr({1, 2, 3, 4}), kNil, Tokens(0, 4), (int64_t{1} << 62) + 1)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("token_ids has 4 tokens"));
}

TEST(DecodeEventBatchTest, TokenIdOutOfRangeIsAnErrorNamingTheValue) {
  absl::Status s = DecodeError(
      ArrayBatch({Arr({"AllBlocksCleared"}),
                  StoredArray(Arr({1}), kNil, Arr({1, int64_t{1} << 32}), 2)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("event 1"));
  EXPECT_THAT(s.message(), HasSubstr("token_ids[1] = 4294967296"));

  s = DecodeError(ArrayBatch({StoredArray(Arr({1}), kNil, Arr({-7, 1}), 2)}));
  EXPECT_THAT(s.message(), HasSubstr("token_ids[0] = -7"));

  s = DecodeError(
      ArrayBatch({StoredArray(Arr({1}), kNil, Arr({1, Float(2.5)}), 2)}));
  EXPECT_THAT(s.message(), HasSubstr("token_ids[1] is a float"));

  // The largest token id is fine.
  KvEventBatch b;
  ASSERT_TRUE(Decode(ArrayBatch({StoredArray(Arr({1}), kNil,
                                             Arr({Uint(UINT32_MAX)}), 1)}),
                     &b)
                  .ok());
  ASSERT_NE(Stored(b, 0), nullptr);
  EXPECT_THAT(Stored(b, 0)->token_ids, ElementsAre(UINT32_MAX));
}

TEST(DecodeEventBatchTest, EventsThatAreNotAnArrayAreAnError) {
  absl::Status s = DecodeError(Arr({Float(0.5), "events"}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("events is a str"));
  s = DecodeError(Map({{"ts", Float(0.5)}, {"events", Map({})}}));
  EXPECT_THAT(s.message(), HasSubstr("events is a map"));
  s = DecodeError(Map({{"ts", Float(0.5)}}));
  EXPECT_THAT(s.message(), HasSubstr("events is missing"));
  s = DecodeError(Arr({Float(0.5)}));
  EXPECT_THAT(s.message(), HasSubstr("events is missing"));
}

TEST(DecodeEventBatchTest, BatchThatIsNeitherArrayNorMapIsAnError) {
  absl::Status s = DecodeError(V(42));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the payload is a int"));
  s = DecodeError(Bin("abc"));
  EXPECT_THAT(s.message(), HasSubstr("the payload is a bin"));
}

TEST(DecodeEventBatchTest, TsThatIsNotANumberIsAnError) {
  absl::Status s = DecodeError(Arr({"now", Arr({})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ts is a str"));
  s = DecodeError(Arr({kNil, Arr({})}));
  EXPECT_THAT(s.message(), HasSubstr("ts is a nil"));
  s = DecodeError(Map({{"events", Arr({})}}));
  EXPECT_THAT(s.message(), HasSubstr("ts is missing"));
}

TEST(DecodeEventBatchTest, NamesThatCouldBreakAnswersAreErrorsNamingThem) {
  const std::string long_name(300, 'a');
  struct Case {
    const char* field;
    V value;
    const char* why;
  };
  const Case cases[] = {
      {"medium", V("\xff"), "medium \"\\xff\" is not valid UTF-8 (byte 0)"},
      {"lora_name", V("L\x1fx"), "lora_name \"L\\x1fx\" has a control"},
      {"medium", V(long_name.c_str()), "medium is 300 bytes, more than 256"},
      {"ownership", V("lm\xc3"), "ownership \"lm\\xc3\" is not valid UTF-8"},
      {"additional_salt", V(long_name.c_str()),
       "additional_salt is 300 bytes, more than 256"},
      {"extra_keys", Arr({Arr({"\xfe"})}), "cache_salt \"\\xfe\" is not"},
  };
  for (const Case& c : cases) {
    const absl::Status s =
        DecodeError(Arr({Float(0.5), Arr({Map({{"type", "BlockStored"},
                                               {"block_hashes", Arr({1})},
                                               {"token_ids", Tokens(1, 2)},
                                               {"block_size", 2},
                                               {c.field, c.value}})})}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(s.message(), HasSubstr(c.why));
  }
  // The same names, well formed, decode.
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(Arr({Float(0.5), Arr({Map({{"type", "BlockStored"},
                                        {"block_hashes", Arr({1})},
                                        {"token_ids", Tokens(1, 2)},
                                        {"block_size", 2},
                                        {"medium", "cpu_émigré"},
                                        {"lora_name", "sql-adapter"}})})}),
             &b)
          .ok());
  EXPECT_EQ(Stored(b, 0)->medium, "CPU_éMIGRé");
}

TEST(DecodeEventBatchTest, DataParallelRankIsBounded) {
  for (int64_t rank : {int64_t{-1}, kMaxDataParallelRanks, int64_t{20000}}) {
    const absl::Status s = DecodeError(Arr({Float(0.5), Arr({}), V(rank)}));
    EXPECT_THAT(s.message(),
                HasSubstr(absl::StrCat("data_parallel_rank ", rank,
                                       " is not within [0, 1024)")));
  }
  KvEventBatch b;
  ASSERT_TRUE(Decode(Arr({Float(0.5), Arr({}), V(int64_t{1023})}), &b).ok());
  EXPECT_EQ(b.data_parallel_rank, 1023);
}

TEST(DecodeEventBatchTest, TsOutsideTheCenturyIsAnErrorNamingIt) {
  for (double ts : {std::numeric_limits<double>::infinity(),
                    std::numeric_limits<double>::quiet_NaN(), 1e300, -1.0}) {
    const absl::Status s = DecodeError(Arr({Float(ts), Arr({})}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << ts;
    EXPECT_THAT(s.message(), HasSubstr("is not within [0, 4102444800)")) << ts;
  }
  KvEventBatch batch;
  ASSERT_TRUE(
      DecodeEventBatch(Bytes(Arr({Float(1.7e9 + 0.5), Arr({})})), &batch).ok());
  EXPECT_EQ(batch.ts, 1.7e9 + 0.5);
  // An integer past 2100 in seconds is milliseconds (Mooncake's), up to
  // 2100 in milliseconds.
  ASSERT_TRUE(
      DecodeEventBatch(Bytes(Arr({Uint(1700000000123), Arr({})})), &batch)
          .ok());
  EXPECT_EQ(batch.ts, 1700000000.123);
  EXPECT_THAT(DecodeError(Arr({Uint(4102444800000), Arr({})})).message(),
              HasSubstr("is not within [0, 4102444800)"));
}

TEST(DecodeEventBatchTest, MalformedEventsAreErrorsNamingTheEvent) {
  struct Case {
    V event;
    std::string message;
  };
  const Case cases[] = {
      {7, "event 1: an event is a int"},
      {Arr({}), "event 1: an array event must start with its type name"},
      {Arr({3, Arr({})}), "event 1: an array event must start"},
      {Map({{"block_hashes", Arr({})}}), "event 1: a map event must have"},
      {Map({{"type", 1}}), "event 1: a map event must have"},
      {Arr({"BlockRemoved"}),
       "event 1 (BlockRemoved): block_hashes is missing"},
      {Arr({"BlockRemoved", 5}), "block_hashes is a int, want an array"},
      {Arr({"BlockRemoved", Arr({Float(0.5)})}), "block_hashes[0] is a float"},
      {Arr({"BlockRemoved", Arr({1}), 5}), "medium is a int"},
      {Arr({"BlockRemoved", Arr({1}), "GPU", "0"}), "group_idx is a str"},
      {Arr({"BlockStored", Arr({1}), kNil, Tokens(0, 2)}),
       "block_size is missing"},
      {StoredArray(Arr({1}), kNil, Tokens(0, 2), 0),
       "block_size 0 is not positive"},
      {StoredArray(Arr({1}), kNil, Tokens(0, 2), -4),
       "block_size -4 is not positive"},
      {StoredArray(Arr({1}), kNil, Tokens(0, 2), Uint(UINT64_MAX)),
       "block_size 18446744073709551615 is not positive"},
      {StoredArray(Arr({1}), kNil, Arr({}), -4),
       "block_size -4 is not an int >= 0 (token_ids is empty"},
      {StoredArray(Arr({1}), kNil, Arr({}), "16"), "block_size is a str"},
      {StoredArray(Arr({1}), kNil, "ab", 2), "token_ids is a str"},
      {StoredArray(Arr({1}), Float(0.5), Tokens(0, 2), 2),
       "parent_block_hash is a float"},
      {StoredArray(Arr({1}), kNil, Tokens(0, 2), 2, "x"), "lora_id is a str"},
      {StoredArray(Arr({1}), kNil, Tokens(0, 2), 2, kNil, "GPU", 3),
       "lora_name is a int"},
      {StoredArray(Arr({1}), kNil, Tokens(0, 2), 2, kNil, "GPU", kNil, "k"),
       "extra_keys is a str"},
  };
  for (const Case& c : cases) {
    const absl::Status s =
        DecodeError(ArrayBatch({Arr({"AllBlocksCleared"}), c.event}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
}

// Mooncake's store master publishes RFC #1527 events: maps with
// event_type and seq_hashes, and no tokens (or, with its legacy
// compatibility on, vLLM's type and block_hashes beside them).
TEST(DecodeEventBatchTest, Rfc1527EventsDecode) {
  const V stored = Map({{"event_id", 42},
                        {"timestamp", Uint(1739145600000)},
                        {"event_type", "stored"},
                        {"model_name", "llama"},
                        {"block_size", 16},
                        {"additional_salt", "w8a8"},
                        {"lora_name", kNil},
                        {"tenant_id", "default"},
                        {"backend_id", "daemon-0"},
                        {"medium", "cpu"},
                        {"dp_rank", 0},
                        {"seq_hashes", Arr({Uint(1234567890), Uint(98765)})},
                        {"base_block_idx", kNil},
                        {"parent_hash", kNil},
                        {"token_ids", kNil}});
  const V compat = Map({{"event_type", "removed"},
                        {"type", "BlockRemoved"},
                        {"seq_hashes", Arr({Uint(98765)})},
                        {"block_hashes", Arr({Uint(98765)})},
                        {"base_block_idx", 1},
                        {"medium", "disk"}});
  KvEventBatch b;
  ASSERT_TRUE(
      Decode(
          Arr({Float(1.5),
               Arr({stored, compat,
                    Map({{"event_type", "cleared"}, {"tenant_id", "acme"}})}),
               0}),
          &b)
          .ok());
  EXPECT_EQ(b.unknown_fields, 0u);
  ASSERT_EQ(b.events.size(), 3u);
  const BlockStoredEvent* s = Stored(b, 0);
  ASSERT_NE(s, nullptr);
  EXPECT_THAT(s->block_hashes, ElementsAre(1234567890u, 98765u));
  EXPECT_TRUE(s->token_ids.empty());  // placed by its keys
  EXPECT_FALSE(s->parent_block_hash.has_value());
  EXPECT_EQ(s->cache_salt, "w8a8");
  EXPECT_EQ(s->medium, "CPU");
  EXPECT_EQ(s->block_size, 16);
  EXPECT_EQ(s->tenant, "default");
  const BlockRemovedEvent* r = Removed(b, 1);
  ASSERT_NE(r, nullptr);
  EXPECT_THAT(r->block_hashes, ElementsAre(98765u));
  EXPECT_EQ(r->medium, "DISK");
  EXPECT_EQ(r->tenant, "");  // not said
  const auto* cleared = std::get_if<AllBlocksClearedEvent>(&b.events[2]);
  ASSERT_NE(cleared, nullptr);
  EXPECT_EQ(cleared->tenant, "acme");  // that tenant's objects only
  // A tenant that is not a str is an error naming the field.
  KvEventBatch bad;
  const absl::Status wrong = DecodeEventBatch(
      Bytes(
          Arr({1, Arr({Map({{"event_type", "cleared"}, {"tenant_id", 3}})})})),
      &bad);
  EXPECT_THAT(wrong.message(), HasSubstr("tenant_id"));
}

// Its current store master names each object by its key, seq_hashes
// empty: the key's engine hash (index/object_key.h) is the event's block.
TEST(DecodeEventBatchTest, MooncakeObjectKeysNameTheirEngineHash) {
  const std::string digest =
      "0102030405060708aaaaaaaaaaaaaaaabbbbbbbbbbbbbbbb1122334455667788";
  const auto object = [](const char* type, const std::string& key) {
    const bool stored = absl::string_view(type) == "stored";
    V m = Map({{"event_id", 7},
               {"timestamp", Uint(1739145600000)},
               {"event_type", type},
               {"type", stored ? "BlockStored" : "BlockRemoved"},
               {"model_name", kNil},
               {"block_size", kNil},
               {"additional_salt", kNil},
               {"lora_name", kNil},
               {"tenant_id", "default"},
               {"backend_id", "store-0"},
               {"medium", "cpu"},
               {"dp_rank", 0},
               {"group_id", kNil},
               {"object_key", key.c_str()},
               {"seq_hashes", Arr({})},
               {"block_hashes", Arr({})},
               {"base_block_idx", kNil}});
    if (stored) {  // a removal has no parent or tokens
      for (const char* name : {"parent_hash", "token_ids"}) {
        m.items.push_back(name);
        m.items.push_back(kNil);
      }
    }
    return m;
  };
  const std::string vllm =
      "llama@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + digest;
  KvEventBatch b;
  const absl::Status decoded = Decode(
      Arr({Uint(1739145600000),
           Arr({object("stored", vllm), object("stored", digest + "_0_k"),
                object("removed", vllm), object("stored", "no-hash-here")}),
           0}),
      &b);
  ASSERT_TRUE(decoded.ok()) << decoded;
  EXPECT_EQ(b.unknown_fields, 0u);
  EXPECT_EQ(b.ts, 1739145600.0);  // integer milliseconds
  ASSERT_EQ(b.events.size(), 4u);
  ASSERT_NE(Stored(b, 0), nullptr);
  EXPECT_THAT(Stored(b, 0)->block_hashes, ElementsAre(0x1122334455667788u));
  EXPECT_TRUE(Stored(b, 0)->from_object_key);
  EXPECT_EQ(Stored(b, 0)->medium, "CPU");
  EXPECT_THAT(Stored(b, 1)->block_hashes, ElementsAre(0x0102030405060708u));
  ASSERT_NE(Removed(b, 2), nullptr);
  EXPECT_THAT(Removed(b, 2)->block_hashes, ElementsAre(0x1122334455667788u));
  // A key of neither form names nothing.
  EXPECT_TRUE(Stored(b, 3)->block_hashes.empty());
  EXPECT_FALSE(Stored(b, 3)->from_object_key);
  // Not a str: an error naming the field.
  KvEventBatch bad;
  const absl::Status s =
      DecodeEventBatch(Bytes(Arr({1, Arr({Map({{"event_type", "stored"},
                                               {"seq_hashes", Arr({})},
                                               {"object_key", 5}})})})),
                       &bad);
  EXPECT_THAT(s.message(), HasSubstr("object_key"));
}

TEST(DecodeEventBatchTest, DeclaredSizesBeyondThePayloadAreRefusedCheaply) {
  KvEventBatch b;
  // An array32 header claiming 2^32 - 1 elements, and one claiming 2^24.
  EXPECT_EQ(DecodeEventBatch(std::string("\xdd\xff\xff\xff\xff", 5), &b).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeEventBatch(std::string("\x92\xcb\0\0\0\0\0\0\0\0"
                                         "\xdd\x01\0\0\0",
                                         15),
                             &b)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A map16 claiming 65535 entries, a str32 claiming 4 GiB.
  EXPECT_EQ(DecodeEventBatch(std::string("\xde\xff\xff", 3), &b).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeEventBatch(std::string("\xdb\xff\xff\xff\xff", 5), &b).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DecodeEventBatchTest, DeepNestingIsRefused) {
  // extra_keys items may nest, but not without bound.
  V deep = Arr({});
  for (int i = 0; i < 100; ++i) deep = Arr({deep});
  const absl::Status s =
      DecodeError(ArrayBatch({StoredArray(Arr({1}), kNil, Tokens(0, 2), 2, kNil,
                                          "GPU", kNil, Arr({Arr({deep})}))}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("depth"));

  // Nesting as deep as real extra_keys go is fine.
  V shallow = Arr({"mm", 0});
  for (int i = 0; i < 10; ++i) shallow = Arr({shallow});
  KvEventBatch b;
  ASSERT_TRUE(Decode(ArrayBatch({StoredArray(Arr({1, 2}), kNil, Tokens(0, 4), 2,
                                             kNil, "GPU", kNil,
                                             Arr({kNil, Arr({shallow})}))}),
                     &b)
                  .ok());
  ASSERT_NE(Stored(b, 0), nullptr);
  EXPECT_EQ(Stored(b, 0)->chain_blocks, 2u);  // a legacy key of block 1
  EXPECT_EQ(Stored(b, 0)->content.Of(1).size(), 1u);
}

TEST(DecodeEventBatchTest, NestingUpToTheLimitDecodes) {
  // The batch, its events, the event, extra_keys and the block's entry are
  // 5 nested arrays; an item of 27 more reaches the limit of 32.
  const auto batch = [](int item_depth) {
    V item = Arr({});
    for (int i = 1; i < item_depth; ++i) item = Arr({item});
    return ArrayBatch({StoredArray(Arr({1}), kNil, Tokens(0, 2), 2, kNil, "GPU",
                                   kNil, Arr({Arr({item})}))});
  };
  KvEventBatch b;
  ASSERT_TRUE(Decode(batch(27), &b).ok());
  ASSERT_NE(Stored(b, 0), nullptr);
  EXPECT_EQ(Stored(b, 0)->chain_blocks, 1u);
  EXPECT_EQ(Stored(b, 0)->content.Of(0).size(), 1u);  // a legacy key

  const absl::Status s = DecodeError(batch(28));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("depth"));
}

TEST(DecodeEventBatchTest, BoolsAreNotInts) {
  const absl::Status s = DecodeError(
      ArrayBatch({StoredArray(Arr({1}), kNil, Tokens(0, 2), Bool(true))}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("block_size is a bool"));
}

// A batch of `n` copies of `event`, and its payload's size.
V Repeated(const V& event, int n) {
  V events = Arr({});
  events.items.assign(static_cast<size_t>(n), event);
  return Arr({Float(1.5), events});
}

TEST(DecodeEventBatchTest, ABatchDenserThanItsAllowanceIsRefusedNamingIt) {
  // Each of these decodes to more than 24 bytes per payload byte: a 376-byte
  // event from a 9-byte ["cleared"] or an 11-byte ["removed", [1]], a
  // 48-byte ContentKey from a one-byte extra_keys item.
  V dense_keys = Arr({});
  V block = Arr({});
  for (int k = 0; k < 32; ++k) block.items.push_back(Arr({}));
  V hashes = Arr({});
  for (int i = 0; i < 5000; ++i) {
    hashes.items.push_back(1);
    dense_keys.items.push_back(block);
  }
  const V keys_batch = ArrayBatch({StoredArray(hashes, kNil, Tokens(0, 5000), 1,
                                               kNil, "GPU", kNil, dense_keys)});
  for (const V& batch :
       {Repeated(Arr({"cleared"}), 20000),
        Repeated(Arr({"removed", Arr({1})}), 20000), keys_batch}) {
    const std::string payload = Bytes(batch);
    KvEventBatch b;
    const absl::Status s = DecodeEventBatch(payload, &b);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("refused as too dense"));
    EXPECT_THAT(s.message(),
                HasSubstr(absl::StrCat("per byte of its ", payload.size(),
                                       "-byte payload")));
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(
                                 "more than ", 24 * payload.size(), " bytes")));
  }
}

TEST(DecodeEventBatchTest, BatchesAsDenseAsEnginesSendThemDecode) {
  // vLLM's block pool sends one BlockRemoved per evicted block (25 bytes
  // with a 64-bit hash: 16 bytes decoded per byte); a run of
  // AllBlocksCleared (18 bytes: 21); SGLang-like stores of one one-token
  // block each.
  const V removed = Repeated(
      Arr({"BlockRemoved", Arr({Uint(0x9e3779b97f4a7c15)}), kNil}), 20000);
  const V cleared = Repeated(Arr({"AllBlocksCleared"}), 20000);
  const V stored = Repeated(
      StoredArray(Arr({Uint(0x9e3779b97f4a7c15)}), Uint(0x7f4a7c159e3779b9),
                  Arr({151000}), 1, kNil, "GPU"),
      20000);
  for (const V& batch : {removed, cleared, stored}) {
    KvEventBatch b;
    const absl::Status s = Decode(batch, &b);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(b.events.size(), 20000u);
  }
}

TEST(DecodeEventBatchTest, ASmallBatchMayBeDense) {
  // Below 64 KiB of decoded batch, density does not matter.
  KvEventBatch b;
  ASSERT_TRUE(Decode(Repeated(Arr({"cleared"}), 100), &b).ok());
  EXPECT_EQ(b.events.size(), 100u);
}

}  // namespace
}  // namespace prefixd
