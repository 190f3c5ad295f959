// The fleet index that the Route benchmarks ask (docs/performance.md, "Fleet
// index"): `workers` workers "w0", "w1", ..., where worker i holds the first
// ceil((i + 1) * B / workers) blocks of each of `prompts` prompts of B blocks
// (IndexPrompt), all on GPU. With 16 workers and 2k-token prompts (B = 128),
// worker i holds (i + 1) * 8 blocks: a Route of a whole prompt walks 128
// blocks and scores 16 holders, and "w15" holds it all.
//
// Applied in process as decoded event batches (FleetIndex::AddWorker and
// Apply), one root BlockStored per prompt and worker: prefixd_bench_server
// fills its daemon's index this way, index_bench its own.
#ifndef PREFIXD_BENCH_LOAD_ROUTE_INDEX_H_
#define PREFIXD_BENCH_LOAD_ROUTE_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/load/common.h"
#include "index/events.h"
#include "index/kv_index.h"

namespace prefixd::bench {

// Blocks of a `prompt_blocks`-block prompt that worker `worker` of `workers`
// holds.
inline size_t RouteIndexHeld(int worker, int workers, size_t prompt_blocks) {
  const size_t w = static_cast<size_t>(workers);
  return ((static_cast<size_t>(worker) + 1) * prompt_blocks + w - 1) / w;
}

// Fills `index` as above; returns the (block, holder) entries it holds.
inline uint64_t FillRouteIndex(KvIndex* index, int workers, int prompts,
                               int prompt_tokens) {
  const int bs = index->options().block_size;
  const size_t blocks = static_cast<size_t>(prompt_tokens / bs);
  std::vector<std::vector<uint32_t>> tokens;
  for (int p = 0; p < prompts; ++p)
    tokens.push_back(IndexPrompt(p, prompt_tokens));
  for (int w = 0; w < workers; ++w) {
    const WorkerId id = index->AddWorker(absl::StrCat("w", w), "bench");
    KvEventBatch batch;
    batch.ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    const size_t held = RouteIndexHeld(w, workers, blocks);
    for (int p = 0; p < prompts; ++p) {
      BlockStoredEvent ev;
      for (size_t b = 0; b < held; ++b) {
        ev.block_hashes.push_back((static_cast<uint64_t>(p) << 32) + b + 1);
      }
      ev.token_ids.assign(
          tokens[p].begin(),
          tokens[p].begin() + static_cast<ptrdiff_t>(held) * bs);
      ev.block_size = bs;
      ev.chain_blocks = held;
      batch.events.emplace_back(std::move(ev));
    }
    index->Apply(id, batch, 0, absl::Now());
  }
  return index->Stats().entries;
}

}  // namespace prefixd::bench

#endif  // PREFIXD_BENCH_LOAD_ROUTE_INDEX_H_
