// libFuzzer: KV event payloads arrive over ZeroMQ from any engine that can
// reach the index's socket (docs/index.md), so no byte string may crash the
// decoder, make it allocate without bound, or let through a batch the index
// would trip over. A batch that decodes must keep the promises of
// index/events.h: a BlockStored either carries block_size tokens per block
// (block_size > 0; a sparse one, more whole blocks) or no tokens at all (a
// store of keys alone, whose block_size is 0 when the publisher sent none), and
// its indexable chain is a prefix of its blocks. And the fleet index takes
// whatever decodes: applied twice (the second time its blocks are held
// already), its invariants hold, a Route of the stores' tokens answers, and
// clearing the worker empties it.
//
// The seed corpus (real vLLM and SGLang payloads, both encodings) is
// written by /usr/bin/python3 tests/fuzz/make_index_seeds.py.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <variant>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "index/events.h"
#include "index/fleet_index.h"

namespace prefixd {
namespace {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "index_events_fuzzer: %s\n", what);
  __builtin_trap();
}

// The block size of the batch's first store with tokens, if a sane one.
int BlockSizeOf(const KvEventBatch& batch) {
  for (const KvEvent& e : batch.events) {
    const auto* s = std::get_if<BlockStoredEvent>(&e);
    if (s != nullptr && !s->token_ids.empty() && s->block_size <= 1024)
      return static_cast<int>(s->block_size);
  }
  return 16;
}

void ApplyToAnIndex(const KvEventBatch& batch) {
  FleetIndex index(IndexOptions{BlockSizeOf(batch), 1 << 20});
  const WorkerId w = index.AddWorker("w", "tcp://w:1");
  for (int64_t seq = 0; seq < 2; ++seq) {
    index.Apply(w, batch, seq, absl::FromUnixSeconds(1700000000));
    Check(index.CheckInvariants().ok(), "the index's invariants broke");
  }
  for (const KvEvent& e : batch.events) {
    const auto* s = std::get_if<BlockStoredEvent>(&e);
    if (s == nullptr) continue;
    RouteQuery q;
    q.tokens = s->token_ids;
    const RouteResult r = index.Route(q);
    Check(r.workers.size() <= 1, "Route answers a worker twice");
  }
  index.ClearWorker(w, ClearReason::kRestart, "");
  const IndexStats st = index.Stats();
  Check(st.entries == 0 && st.blocks == 0 && st.engine_hashes == 0,
        "a cleared worker left blocks in the index");
}

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prefixd;
  // One batch for the process, as the ingest thread keeps one: decoding
  // into a used batch must not leak state from the previous input.
  static KvEventBatch* batch = new KvEventBatch;
  const absl::string_view payload(reinterpret_cast<const char*>(data), size);
  if (!DecodeEventBatch(payload, batch).ok()) return 0;
  for (const KvEvent& e : batch->events) {
    const auto* s = std::get_if<BlockStoredEvent>(&e);
    if (s == nullptr) continue;
    Check(s->block_size >= 0, "BlockStored with a negative block_size");
    if (!s->token_ids.empty()) {
      Check(s->block_size > 0, "BlockStored with tokens and block_size 0");
      const uint64_t want =
          s->block_hashes.size() * static_cast<uint64_t>(s->block_size);
      Check(s->sparse ? s->token_ids.size() > want &&
                            s->token_ids.size() % s->block_size == 0
                      : s->token_ids.size() == want,
            "BlockStored whose token count is not blocks * block_size (a "
            "sparse one's: more whole blocks)");
    }
    Check(s->chain_blocks <= s->block_hashes.size(),
          "BlockStored whose chain is longer than its blocks");
  }
  ApplyToAnIndex(*batch);
  return 0;
}
