// The event thread's floor (index_replay --decode_floor_every): how much
// of decoding a KV-event payload is msgpack-cxx's parse itself.
//
// For every N-th batch of a workload, its payload (vLLM's msgpack, as the
// replay sends it) is parsed twice, each timed in thread CPU:
//   - by msgpack::parse with a visitor that keeps nothing (msgpack-cxx's
//     null_visitor): every element read and dropped, the least any decoder
//     built on the library can do;
//   - by DecodeEventBatch, prefixd's decoder (index/events.h).
// Per stored or removed block (a payload's BlockStored blocks carry their
// token ids, 128 at Dynamo's definition), the first is the floor of the
// event side: with C cores doing nothing else, the corpus's block ops can
// go no faster than
//   block ops / (stored + removed blocks x parse ns per block / C).
#ifndef PREFIXD_BENCH_DECODE_FLOOR_H_
#define PREFIXD_BENCH_DECODE_FLOOR_H_

#include <cstdint>

#include "bench/fleet_workload.h"

namespace prefixd {
namespace bench {

struct DecodeFloor {
  uint64_t batches = 0;  // measured
  uint64_t blocks = 0;   // their stored and removed blocks
  uint64_t payload_bytes = 0;
  double parse_seconds = 0;   // msgpack::parse, null_visitor
  double decode_seconds = 0;  // DecodeEventBatch
  bool all_decoded = true;    // every payload decoded OK

  double ParseNsPerBlock() const;
  double DecodeNsPerBlock() const;
  // The block ops per second that `cores` cores parsing the corpus's
  // stored and removed blocks at ParseNsPerBlock, and doing nothing else,
  // would allow.
  double CeilingBlockOps(const WorkloadTotals& t, unsigned cores) const;
};

// Measures every `every`-th batch of `w` (every >= 1), in batch order.
DecodeFloor MeasureDecodeFloor(const FleetWorkload& w, uint64_t every);

}  // namespace bench
}  // namespace prefixd

#endif  // PREFIXD_BENCH_DECODE_FLOOR_H_
