// libFuzzer: kv_indexer.v1 requests as the wire brings them, through the
// decoders of their two hash forms (server/kv_indexer_wire.h) and the
// readers that check them (server/kv_indexer_request.h) into ExternalKv
// (index/external_kv.h) over one FleetIndex, as the KVIndexer service does.
//
// Input: records, each
//   u8   selector   rpc = selector % 7 (Apply, Replace, Configure, Match,
//                   MatchPrefix, HitCounts, Invalidate)
//   u8   len
//   len  bytes      the request message (fewer if the input ends)
//
// Checked after every call: a refusal is INVALID_ARGUMENT, OUT_OF_RANGE or
// FAILED_PRECONDITION only (and NOT_FOUND for InvalidateWorker); the index's
// invariants hold (FleetIndex::CheckInvariants); a MatchExternalKvPrefix answer
// lists only workers with an address, sorted by blocks descending, none past
// the hashes considered, best_blocks the first's; MatchExternalKv lists only
// hashes asked for, and its answer, encoded in the form asked, reads back
// as the same hashes; a worker just invalidated is not ready.
//
//   build-fuzz/tests/fuzz/kv_indexer_fuzzer tests/fuzz/corpus/kv_indexer_fuzzer
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "core/cache_types.h"
#include "google/protobuf/stubs/logging.h"
#include "index/external_kv.h"
#include "index/fleet_index.h"
#include "kv_indexer/v1/kv_indexer_decimal.pb.h"
#include "server/kv_indexer_request.h"
#include "server/kv_indexer_wire.h"

namespace prefixd {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "kv_indexer_fuzzer: %s\n", what.c_str());
  std::abort();
}

void CheckRefusal(const absl::Status& s) {
  if (s.ok()) return;
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return;
    default:
      Fail("unexpected status " + s.ToString());
  }
}

CacheLimits Limits() {
  CacheLimits l;
  l.max_tokens_per_request = 24;
  l.max_block_ids_per_request = 16;
  return l;
}

void CheckPrefix(const PrefixAnswer& a, size_t hashes) {
  uint32_t last = UINT32_MAX;
  for (const PrefixMatch& m : a.matches) {
    if (m.address.empty()) Fail("a match without an address");
    if (m.blocks == 0 || m.blocks > hashes) Fail("a match past the hashes");
    if (m.blocks > last) Fail("matches not sorted");
    last = m.blocks;
  }
  if (a.best_blocks != (a.matches.empty() ? 0 : a.matches[0].blocks))
    Fail("best_blocks is not the first match's");
}

// The hashes of a Match answer, encoded in `form` and read back, are the
// ones answered.
void CheckMatchAnswer(const std::vector<NodeHoldings>& nodes, HashForm form) {
  namespace pb = ::kv_indexer::v1;
  pb::MatchExternalKvResponse resp;
  std::vector<int64_t> want;
  for (const NodeHoldings& n : nodes) {
    pb::ExternalKvNodeMatch* m = resp.add_matches();
    for (const TierHoldings& t : n.tiers) {
      pb::TierHashes* out = m->add_hashes_by_tier();
      for (EngineHash h : t.hashes) {
        out->add_hashes(static_cast<int64_t>(h));
        want.push_back(static_cast<int64_t>(h));
      }
    }
  }
  const std::string bytes = EncodeMatchResponse(resp, form);
  std::vector<int64_t> got;
  if (form == HashForm::kPacked) {
    pb::MatchExternalKvResponse back;
    if (!back.ParseFromString(bytes)) Fail("a packed answer does not parse");
    for (const auto& m : back.matches())
      for (const auto& t : m.hashes_by_tier())
        got.insert(got.end(), t.hashes().begin(), t.hashes().end());
  } else {
    ::kv_indexer::v1::decimal::MatchResponse back;
    if (!back.ParseFromString(bytes)) Fail("a decimal answer does not parse");
    for (const auto& m : back.matches())
      for (const auto& t : m.hashes_by_tier())
        for (const std::string& h : t.hashes()) got.push_back(std::stoll(h));
  }
  if (got != want) Fail("a Match answer does not read back as its hashes");
}

void Call(int rpc, const std::string& bytes, ExternalKv& kv) {
  const CacheLimits limits = Limits();
  namespace pb = ::kv_indexer::v1;
  switch (rpc) {
    case 0: {
      pb::ApplyExternalKvBatchRequest req;
      const absl::StatusOr<HashForm> form = DecodeApplyRequest(bytes, &req);
      CheckRefusal(form.status());
      if (!form.ok()) return;
      absl::StatusOr<ExternalBatch> b = ReadApplyRequest(req, limits);
      CheckRefusal(b.status());
      if (b.ok()) CheckRefusal(kv.Apply(*b).status());
      return;
    }
    case 1: {
      pb::ReplaceExternalKvSnapshotRequest req;
      if (!req.ParseFromString(bytes)) return;
      absl::StatusOr<ExternalSnapshot> s = ReadSnapshotRequest(req, limits);
      CheckRefusal(s.status());
      if (s.ok()) kv.ReplaceSnapshot(*s);
      return;
    }
    case 2: {
      pb::ConfigureExpectedWorkersRequest req;
      if (!req.ParseFromString(bytes)) return;
      absl::StatusOr<std::vector<ExpectedWorker>> w = ReadExpectedWorkers(req);
      CheckRefusal(w.status());
      if (w.ok()) {
        const ExpectedCounts c = kv.ConfigureExpected(*w);
        if (c.total != w->size() || c.ready > c.total) Fail("bad counts");
      }
      return;
    }
    case 3: {
      pb::MatchExternalKvRequest req;
      const absl::StatusOr<HashForm> form = DecodeMatchRequest(bytes, &req);
      CheckRefusal(form.status());
      if (!form.ok()) return;
      absl::StatusOr<absl::Span<const EngineHash>> h =
          ReadHashList(req.hashes(), limits);
      CheckRefusal(h.status());
      if (!h.ok()) return;
      const std::set<EngineHash> asked(h->begin(), h->end());
      const std::vector<NodeHoldings> nodes =
          kv.Match(*h, req.count_as_hit(), "");
      for (const NodeHoldings& n : nodes) {
        for (const TierHoldings& t : n.tiers) {
          for (EngineHash x : t.hashes) {
            if (asked.count(x) == 0) Fail("Match answered a hash not asked");
          }
        }
      }
      CheckMatchAnswer(nodes, *form);
      return;
    }
    case 4: {
      pb::MatchExternalKvPrefixRequest req;
      const absl::StatusOr<HashForm> form = DecodePrefixRequest(bytes, &req);
      CheckRefusal(form.status());
      if (!form.ok()) return;
      absl::StatusOr<absl::Span<const EngineHash>> h =
          ReadPrefixRequest(req, limits);
      CheckRefusal(h.status());
      if (h.ok()) CheckPrefix(kv.MatchPrefix(*h, {}), h->size());
      return;
    }
    case 6: {
      pb::InvalidateWorkerRequest req;
      if (!req.ParseFromString(bytes)) return;
      absl::StatusOr<absl::string_view> w = ReadInvalidateRequest(req);
      CheckRefusal(w.status());
      if (!w.ok()) return;
      absl::StatusOr<ExpectedCounts> c = kv.Invalidate(*w);
      if (!c.ok() && c.status().code() != absl::StatusCode::kNotFound)
        Fail("Invalidate: " + c.status().ToString());
      // The worker just invalidated counts, and is not ready.
      if (c.ok() && c->ready >= c->total) Fail("bad counts");
      return;
    }
    default: {
      pb::GetExternalKvHitCountsRequest req;
      const absl::StatusOr<HashForm> form = DecodeHitCountsRequest(bytes, &req);
      CheckRefusal(form.status());
      if (!form.ok()) return;
      absl::StatusOr<absl::Span<const EngineHash>> h =
          ReadHashList(req.hashes(), limits);
      CheckRefusal(h.status());
      if (h.ok()) kv.HitCounts(*h);
      return;
    }
  }
}

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prefixd;  // NOLINT
  google::protobuf::SetLogHandler(nullptr);
  FleetIndex index(IndexOptions{});
  ExternalKv::Options options;
  options.max_hit_counts = 8;
  ExternalKv kv(&index, options);
  size_t i = 0;
  while (i + 2 <= size) {
    const int rpc = data[i] % 7;
    const size_t len = std::min<size_t>(data[i + 1], size - i - 2);
    const std::string bytes(reinterpret_cast<const char*>(data + i + 2), len);
    i += 2 + len;
    Call(rpc, bytes, kv);
    const absl::Status inv = index.CheckInvariants();
    if (!inv.ok()) Fail(inv.ToString());
  }
  return 0;
}
