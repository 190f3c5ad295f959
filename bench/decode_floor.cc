#include "bench/decode_floor.h"

#include <string>

#include "bench/bench_util.h"
#include "index/events.h"
#include "index/msgpack_view.h"  // msgpack.hpp, configured as index/ has it

namespace prefixd {
namespace bench {

double DecodeFloor::ParseNsPerBlock() const {
  return blocks == 0 ? 0 : parse_seconds * 1e9 / static_cast<double>(blocks);
}

double DecodeFloor::DecodeNsPerBlock() const {
  return blocks == 0 ? 0 : decode_seconds * 1e9 / static_cast<double>(blocks);
}

double DecodeFloor::CeilingBlockOps(const WorkloadTotals& t,
                                    unsigned cores) const {
  const double event_blocks =
      static_cast<double>(t.stored_blocks + t.removed_blocks);
  const double seconds = event_blocks * ParseNsPerBlock() * 1e-9 /
                         static_cast<double>(cores == 0 ? 1 : cores);
  return seconds <= 0 ? 0 : static_cast<double>(t.block_ops()) / seconds;
}

DecodeFloor MeasureDecodeFloor(const FleetWorkload& w, uint64_t every) {
  DecodeFloor f;
  std::string payload;
  KvEventBatch batch;
  for (uint64_t i = 0; i < w.batches().size(); i += every) {
    const BatchSpec& b = w.batches()[i];
    w.EncodePayload(b, /*ts=*/0, &payload);
    const double t0 = ThreadCpuSeconds();
    msgpack::null_visitor nothing;
    const bool parsed = msgpack::parse(payload.data(), payload.size(), nothing);
    const double t1 = ThreadCpuSeconds();
    const bool decoded = DecodeEventBatch(payload, &batch).ok();
    const double t2 = ThreadCpuSeconds();
    f.parse_seconds += t1 - t0;
    f.decode_seconds += t2 - t1;
    f.all_decoded = f.all_decoded && parsed && decoded;
    ++f.batches;
    f.blocks += b.stored_blocks() + b.removed_count;
    f.payload_bytes += payload.size();
  }
  return f;
}

}  // namespace bench
}  // namespace prefixd
