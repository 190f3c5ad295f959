#include "server/kv_indexer_wire.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kv_indexer/v1/kv_indexer_decimal.pb.h"

namespace prefixd {
namespace {

namespace kvi = ::kv_indexer::v1;
namespace dec = ::kv_indexer::v1::decimal;
using Hashes = google::protobuf::RepeatedField<int64_t>;
using Texts = google::protobuf::RepeatedPtrField<std::string>;

// The 64 bits `text` names, if it is the decimal text of a signed or an
// unsigned 64-bit value.
std::optional<int64_t> DecimalHash(absl::string_view text) {
  const bool negative = absl::StartsWith(text, "-");
  const absl::string_view digits = text.substr(negative ? 1 : 0);
  if (digits.empty() || digits.size() > 20 ||
      !std::all_of(digits.begin(), digits.end(),
                   [](char c) { return absl::ascii_isdigit(c); })) {
    return std::nullopt;
  }
  if (negative) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(text, &v)) return std::nullopt;
    return v;
  }
  uint64_t u = 0;
  if (!absl::SimpleAtoi(digits, &u)) return std::nullopt;
  return static_cast<int64_t>(u);
}

bool AnyDecimal(const Texts& texts) {
  return std::any_of(texts.begin(), texts.end(), [](const std::string& t) {
    return DecimalHash(t).has_value();
  });
}

// `texts` as hashes; INVALID_ARGUMENT naming `field` and the first entry
// that is not decimal text.
absl::StatusOr<Hashes> ReadTexts(const Texts& texts, absl::string_view field) {
  Hashes out;
  out.Reserve(texts.size());
  for (int i = 0; i < texts.size(); ++i) {
    const std::optional<int64_t> h = DecimalHash(texts[i]);
    if (!h.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": entry ", i, " (\"",
          absl::CHexEscape(absl::string_view(texts[i]).substr(0, 32)),
          "\") is not the decimal text of a 64-bit hash, as the request's "
          "other hashes are"));
    }
    out.Add(*h);
  }
  return out;
}

absl::Status Undecodable(absl::string_view message, size_t bytes) {
  return absl::InvalidArgumentError(absl::StrCat(
      "the request is not a kv_indexer.v1.", message, " (", bytes,
      " bytes), with its hashes as packed sfixed64 or as decimal text"));
}

bool Parse(absl::string_view raw, google::protobuf::MessageLite* out) {
  return raw.size() <= INT_MAX &&
         out->ParseFromArray(raw.data(), static_cast<int>(raw.size()));
}

// The requests whose hashes are field 1 (MatchExternalKv,
// MatchExternalKvPrefix, GetExternalKvHitCounts).
template <typename Request>
absl::StatusOr<HashForm> DecodeHashList(absl::string_view raw,
                                        absl::string_view message,
                                        Request* out) {
  dec::HashList d;
  if (Parse(raw, &d) && AnyDecimal(d.hashes())) {
    ASSIGN_OR_RETURN(Hashes hashes, ReadTexts(d.hashes(), "hashes"));
    d.clear_hashes();  // the rest of the request is kept as unknown fields
    if (!out->ParseFromString(d.SerializeAsString()))
      return Undecodable(message, raw.size());
    *out->mutable_hashes() = std::move(hashes);
    return HashForm::kDecimal;
  }
  if (!Parse(raw, out)) return Undecodable(message, raw.size());
  return HashForm::kPacked;
}

}  // namespace

absl::StatusOr<HashForm> DecodeApplyRequest(
    absl::string_view raw, kvi::ApplyExternalKvBatchRequest* out) {
  constexpr absl::string_view kMessage = "ApplyExternalKvBatchRequest";
  dec::ApplyRequest d;
  const bool decimal =
      Parse(raw, &d) &&
      std::any_of(d.actions().begin(), d.actions().end(),
                  [](const dec::Action& a) { return AnyDecimal(a.hashes()); });
  if (!decimal) {
    if (!Parse(raw, out)) return Undecodable(kMessage, raw.size());
    return HashForm::kPacked;
  }
  std::vector<Hashes> hashes;
  hashes.reserve(static_cast<size_t>(d.actions_size()));
  for (int i = 0; i < d.actions_size(); ++i) {
    ASSIGN_OR_RETURN(Hashes h,
                     ReadTexts(d.actions(i).hashes(),
                               absl::StrCat("actions[", i, "].hashes")));
    hashes.push_back(std::move(h));
    d.mutable_actions(i)->clear_hashes();
  }
  // The same actions, in the same order, each with its other fields.
  if (!out->ParseFromString(d.SerializeAsString()) ||
      out->actions_size() != d.actions_size()) {
    return Undecodable(kMessage, raw.size());
  }
  for (int i = 0; i < out->actions_size(); ++i)
    *out->mutable_actions(i)->mutable_hashes() =
        std::move(hashes[static_cast<size_t>(i)]);
  return HashForm::kDecimal;
}

absl::StatusOr<HashForm> DecodeMatchRequest(absl::string_view raw,
                                            kvi::MatchExternalKvRequest* out) {
  return DecodeHashList(raw, "MatchExternalKvRequest", out);
}

absl::StatusOr<HashForm> DecodePrefixRequest(
    absl::string_view raw, kvi::MatchExternalKvPrefixRequest* out) {
  return DecodeHashList(raw, "MatchExternalKvPrefixRequest", out);
}

absl::StatusOr<HashForm> DecodeHitCountsRequest(
    absl::string_view raw, kvi::GetExternalKvHitCountsRequest* out) {
  return DecodeHashList(raw, "GetExternalKvHitCountsRequest", out);
}

std::string EncodeMatchResponse(const kvi::MatchExternalKvResponse& resp,
                                HashForm form) {
  if (form == HashForm::kPacked) return resp.SerializeAsString();
  kvi::MatchExternalKvResponse rest = resp;
  for (kvi::ExternalKvNodeMatch& m : *rest.mutable_matches()) {
    for (kvi::TierHashes& t : *m.mutable_hashes_by_tier()) t.clear_hashes();
  }
  dec::MatchResponse d;  // the other fields come along as unknown fields
  d.ParseFromString(rest.SerializeAsString());
  for (int i = 0; i < resp.matches_size() && i < d.matches_size(); ++i) {
    const kvi::ExternalKvNodeMatch& m = resp.matches(i);
    dec::NodeMatch* dm = d.mutable_matches(i);
    for (int j = 0;
         j < m.hashes_by_tier_size() && j < dm->hashes_by_tier_size(); ++j) {
      dec::TierHashes* dt = dm->mutable_hashes_by_tier(j);
      for (int64_t h : m.hashes_by_tier(j).hashes())
        dt->add_hashes(absl::StrCat(h));
    }
  }
  return d.SerializeAsString();
}

std::string EncodeHitCountsResponse(
    const kvi::GetExternalKvHitCountsResponse& resp, HashForm form) {
  if (form == HashForm::kPacked) return resp.SerializeAsString();
  kvi::GetExternalKvHitCountsResponse rest = resp;
  for (kvi::HitCountEntry& e : *rest.mutable_entries()) e.clear_hash();
  dec::HitCountsResponse d;
  d.ParseFromString(rest.SerializeAsString());
  for (int i = 0; i < resp.entries_size() && i < d.entries_size(); ++i)
    d.mutable_entries(i)->set_hash(absl::StrCat(resp.entries(i).hash()));
  return d.SerializeAsString();
}

}  // namespace prefixd
