#include "server/kv_indexer_wire.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kv_indexer/v1/kv_indexer.pb.h"
#include "kv_indexer/v1/kv_indexer_decimal.pb.h"

namespace prefixd {
namespace {

namespace kvi = ::kv_indexer::v1;
namespace dec = ::kv_indexer::v1::decimal;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// SGLang page hashes (kB is also 17551435517498269834 as unsigned text).
constexpr int64_t kA = 978178666101069530;
constexpr int64_t kB = -895308556211281782;

// An ApplyExternalKvBatchRequest as the standalone sgl-kv-indexer's bridge
// sends it: the typed fields, then each action's hashes as decimal text
// (field 3 of the action, length-delimited per hash).
std::string DecimalApply(const kvi::ApplyExternalKvBatchRequest& typed,
                         const std::vector<std::vector<std::string>>& texts) {
  kvi::ApplyExternalKvBatchRequest rest = typed;
  for (kvi::ExternalKvAction& a : *rest.mutable_actions()) a.clear_hashes();
  dec::ApplyRequest d;
  EXPECT_TRUE(d.ParseFromString(rest.SerializeAsString()));
  for (size_t i = 0; i < texts.size(); ++i)
    for (const std::string& t : texts[i])
      d.mutable_actions(static_cast<int>(i))->add_hashes(t);
  return d.SerializeAsString();
}

kvi::ApplyExternalKvBatchRequest TwoActions() {
  kvi::ApplyExternalKvBatchRequest r;
  r.set_worker_id("w0");
  r.set_seq(7);
  r.set_worker_address("http://w0:30000");
  r.set_enforce_sequence(true);
  r.mutable_cache_spec()->set_components(3);
  r.mutable_cache_spec()->set_swa_window_tokens(64);
  kvi::ExternalKvAction* report = r.add_actions();
  report->set_type(kvi::ACTION_REPORT);
  report->set_tier(kvi::TIER_HBM);
  report->add_component_masks(1);
  report->add_component_masks(3);
  kvi::ExternalKvAction* clear = r.add_actions();
  clear->set_type(kvi::ACTION_CLEAR_ALL_AT_TIER);
  clear->set_tier(kvi::TIER_DRAM);
  return r;
}

// Decimal text (signed, or the unsigned text of the same 64 bits) reads as
// the hashes, and every other field of the request comes through.
TEST(KvIndexerWireTest, DecimalApplyKeepsEveryOtherField) {
  const kvi::ApplyExternalKvBatchRequest typed = TwoActions();
  const std::string raw =
      DecimalApply(typed, {{"978178666101069530", "17551435517498269834"}, {}});
  kvi::ApplyExternalKvBatchRequest got;
  absl::StatusOr<HashForm> form = DecodeApplyRequest(raw, &got);
  ASSERT_TRUE(form.ok()) << form.status();
  EXPECT_EQ(*form, HashForm::kDecimal);
  kvi::ApplyExternalKvBatchRequest want = typed;
  want.mutable_actions(0)->add_hashes(kA);
  want.mutable_actions(0)->add_hashes(kB);
  EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString())
      << got.DebugString();
}

// sgl-router's packed sfixed64 requests read as they always did.
TEST(KvIndexerWireTest, PackedRequestsReadAsBefore) {
  kvi::ApplyExternalKvBatchRequest typed = TwoActions();
  typed.mutable_actions(0)->add_hashes(kA);
  typed.mutable_actions(0)->add_hashes(kB);
  kvi::ApplyExternalKvBatchRequest got;
  absl::StatusOr<HashForm> form =
      DecodeApplyRequest(typed.SerializeAsString(), &got);
  ASSERT_TRUE(form.ok()) << form.status();
  EXPECT_EQ(*form, HashForm::kPacked);
  EXPECT_EQ(got.SerializeAsString(), typed.SerializeAsString());

  kvi::MatchExternalKvPrefixRequest prefix;
  prefix.add_hashes(kB);
  prefix.add_hashes(0);
  prefix.set_max_blocks(2);
  kvi::MatchExternalKvPrefixRequest read;
  form = DecodePrefixRequest(prefix.SerializeAsString(), &read);
  ASSERT_TRUE(form.ok());
  EXPECT_EQ(*form, HashForm::kPacked);
  EXPECT_THAT(read.hashes(), ElementsAre(kB, 0));
  EXPECT_EQ(read.max_blocks(), 2u);
}

TEST(KvIndexerWireTest, DecimalHashListsKeepTheirOtherFields) {
  dec::HashList d;
  d.add_hashes("-895308556211281782");
  d.add_hashes("0");
  d.add_hashes("-9223372036854775808");
  kvi::MatchExternalKvPrefixRequest extra;
  extra.set_max_blocks(2);
  const std::string raw = d.SerializeAsString() + extra.SerializeAsString();
  kvi::MatchExternalKvPrefixRequest prefix;
  absl::StatusOr<HashForm> form = DecodePrefixRequest(raw, &prefix);
  ASSERT_TRUE(form.ok()) << form.status();
  EXPECT_EQ(*form, HashForm::kDecimal);
  EXPECT_THAT(prefix.hashes(), ElementsAre(kB, 0, INT64_MIN));
  EXPECT_EQ(prefix.max_blocks(), 2u);

  kvi::MatchExternalKvRequest match;
  kvi::MatchExternalKvRequest flag;
  flag.set_count_as_hit(true);
  form = DecodeMatchRequest(d.SerializeAsString() + flag.SerializeAsString(),
                            &match);
  ASSERT_TRUE(form.ok());
  EXPECT_TRUE(match.count_as_hit());
  EXPECT_EQ(match.hashes_size(), 3);
  kvi::GetExternalKvHitCountsRequest counts;
  form = DecodeHitCountsRequest(d.SerializeAsString(), &counts);
  ASSERT_TRUE(form.ok());
  EXPECT_EQ(*form, HashForm::kDecimal);
  EXPECT_THAT(counts.hashes(), ElementsAre(kB, 0, INT64_MIN));
}

// A decimal request with one hash that is not decimal text is refused,
// naming the entry; bytes of neither form are refused, naming the message.
TEST(KvIndexerWireTest, BadHashesAreNamed) {
  kvi::ApplyExternalKvBatchRequest got;
  absl::StatusOr<HashForm> form = DecodeApplyRequest(
      DecimalApply(TwoActions(), {{"12", "0x1f"}, {}}), &got);
  EXPECT_EQ(form.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(form.status().message(),
              HasSubstr("actions[0].hashes: entry 1 (\"0x1f\") is not the "
                        "decimal text of a 64-bit hash"));
  for (const char* bad :
       {"18446744073709551616", "-9223372036854775809", "", "+5", "1 ", "-"}) {
    dec::HashList d;
    d.add_hashes("5");
    d.add_hashes(bad);
    kvi::MatchExternalKvPrefixRequest prefix;
    form = DecodePrefixRequest(d.SerializeAsString(), &prefix);
    EXPECT_EQ(form.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(form.status().message(), HasSubstr("hashes: entry 1")) << bad;
  }
  kvi::MatchExternalKvPrefixRequest prefix;
  form = DecodePrefixRequest(std::string("\x0a\x05\xff\xfe", 4), &prefix);
  EXPECT_EQ(form.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(form.status().message(),
              HasSubstr("not a kv_indexer.v1.MatchExternalKvPrefixRequest (4 "
                        "bytes)"));
}

// Answers to a decimal request give each hash as its signed decimal text,
// every other field as it is; answers to a packed one are unchanged.
TEST(KvIndexerWireTest, AnswersAreInTheFormAsked) {
  kvi::MatchExternalKvResponse match;
  kvi::ExternalKvNodeMatch* m = match.add_matches();
  m->set_worker_id("w0");
  m->set_address("http://w0:30000");
  kvi::TierHashes* t = m->add_hashes_by_tier();
  t->set_tier(kvi::TIER_HBM);
  t->add_hashes(kA);
  t->add_hashes(kB);
  t->add_component_masks(1);
  t->add_component_masks(3);
  EXPECT_EQ(EncodeMatchResponse(match, HashForm::kPacked),
            match.SerializeAsString());
  const std::string text = EncodeMatchResponse(match, HashForm::kDecimal);
  dec::MatchResponse d;
  ASSERT_TRUE(d.ParseFromString(text));
  EXPECT_THAT(d.matches(0).hashes_by_tier(0).hashes(),
              ElementsAre("978178666101069530", "-895308556211281782"));
  // Without its hashes, the answer is the typed one without them.
  d.mutable_matches(0)->mutable_hashes_by_tier(0)->clear_hashes();
  kvi::MatchExternalKvResponse rest;
  ASSERT_TRUE(rest.ParseFromString(d.SerializeAsString()));
  match.mutable_matches(0)->mutable_hashes_by_tier(0)->clear_hashes();
  EXPECT_EQ(rest.SerializeAsString(), match.SerializeAsString())
      << rest.DebugString();

  kvi::GetExternalKvHitCountsResponse counts;
  counts.add_entries()->set_hash(kB);
  counts.mutable_entries(0)->set_hit_count_total(4);
  counts.add_entries()->set_hash(0);
  EXPECT_EQ(EncodeHitCountsResponse(counts, HashForm::kPacked),
            counts.SerializeAsString());
  dec::HitCountsResponse dc;
  ASSERT_TRUE(
      dc.ParseFromString(EncodeHitCountsResponse(counts, HashForm::kDecimal)));
  ASSERT_EQ(dc.entries_size(), 2);
  EXPECT_EQ(dc.entries(0).hash(), "-895308556211281782");
  EXPECT_EQ(dc.entries(1).hash(), "0");
  kvi::GetExternalKvHitCountsResponse hits;
  ASSERT_TRUE(hits.ParseFromString(
      EncodeHitCountsResponse(counts, HashForm::kDecimal)));
  EXPECT_EQ(hits.entries(0).hit_count_total(), 4u);
}

}  // namespace
}  // namespace prefixd
