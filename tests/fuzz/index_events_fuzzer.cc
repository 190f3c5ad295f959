// libFuzzer: KV event payloads arrive over ZeroMQ from any engine that can
// reach the index's socket (docs/index.md), so no byte string may crash the
// decoder, make it allocate without bound, or let through a batch the index
// would trip over. A batch that decodes must keep the promises of
// index/events.h: a BlockStored either carries block_size tokens per block
// (block_size > 0) or no tokens at all (a store of keys alone, whose
// block_size is 0 when the publisher sent none), and its indexable chain is
// a prefix of its blocks.
//
// The seed corpus (real vLLM and SGLang payloads, both encodings) is
// written by /usr/bin/python3 tests/fuzz/make_index_seeds.py.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <variant>

#include "absl/strings/string_view.h"
#include "index/events.h"

namespace prefixd {
namespace {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "index_events_fuzzer: %s\n", what);
  __builtin_trap();
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
      Check(s->token_ids.size() ==
                s->block_hashes.size() * static_cast<uint64_t>(s->block_size),
            "BlockStored whose token count is not blocks * block_size");
    }
    Check(s->chain_blocks <= s->block_hashes.size(),
          "BlockStored whose chain is longer than its blocks");
    Check(s->cache_salt.empty() || !s->parent_block_hash.has_value(),
          "a cache salt on an event that does not start at the root");
  }
  return 0;
}
