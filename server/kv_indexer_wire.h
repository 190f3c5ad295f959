// The two wire forms of kv_indexer.v1's block hashes, read and written for
// the four RPCs that carry them (ApplyExternalKvBatch, MatchExternalKv,
// MatchExternalKvPrefix, GetExternalKvHitCounts; docs/index.md, "As
// sgl-router's KV indexer"):
//
//   kPacked   packed sfixed64, as sgl-router and its bridge send them
//             (proto/kv_indexer/v1/kv_indexer.proto);
//   kDecimal  the decimal text of each hash, as SGLang's standalone
//             sgl-kv-indexer crate's bridge and client send them
//             (proto/kv_indexer/v1/kv_indexer_decimal.proto).
//
// Both forms share the service path, the messages and every other field
// number, so the form is told from the hashes themselves: a request is
// decimal when it parses with the decimal schema and at least one of its
// hashes is decimal text ("-?[0-9]{1,20}", a signed or unsigned 64-bit
// value); then every hash must be (INVALID_ARGUMENT names the first that is
// not). Otherwise it is read as packed. A request without hashes reads the
// same either way. The one ambiguity, a packed chunk of one or two hashes
// whose 8 or 16 bytes are all ASCII digits, has odds of about 1e-11 for
// SGLang's SHA-256-derived hashes and is read as decimal.
//
//   kvi::ApplyExternalKvBatchRequest req;
//   absl::StatusOr<HashForm> form = DecodeApplyRequest(raw, &req);
//   ...
//   std::string out = EncodeMatchResponse(resp, *form);
//
// Thread safety: plain functions.
#ifndef PREFIXD_SERVER_KV_INDEXER_WIRE_H_
#define PREFIXD_SERVER_KV_INDEXER_WIRE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kv_indexer/v1/kv_indexer.pb.h"

namespace prefixd {

enum class HashForm { kPacked, kDecimal };

// Each fills `out` from the request bytes `raw`, in either form, and says
// which; INVALID_ARGUMENT naming the message for bytes that are neither.
absl::StatusOr<HashForm> DecodeApplyRequest(
    absl::string_view raw, ::kv_indexer::v1::ApplyExternalKvBatchRequest* out);
absl::StatusOr<HashForm> DecodeMatchRequest(
    absl::string_view raw, ::kv_indexer::v1::MatchExternalKvRequest* out);
absl::StatusOr<HashForm> DecodePrefixRequest(
    absl::string_view raw, ::kv_indexer::v1::MatchExternalKvPrefixRequest* out);
absl::StatusOr<HashForm> DecodeHitCountsRequest(
    absl::string_view raw,
    ::kv_indexer::v1::GetExternalKvHitCountsRequest* out);

// The answers with hashes, in `form` (kDecimal: each hash as its signed
// decimal text).
std::string EncodeMatchResponse(
    const ::kv_indexer::v1::MatchExternalKvResponse& resp, HashForm form);
std::string EncodeHitCountsResponse(
    const ::kv_indexer::v1::GetExternalKvHitCountsResponse& resp,
    HashForm form);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_KV_INDEXER_WIRE_H_
