#include "server/pick_request.h"

#include "base/status_macros.h"

namespace prefixd {

absl::Status PickRequestReader::Read(const v1::PickRequest& req, int item,
                                     const CacheLimits& limits,
                                     int block_size) {
  RETURN_IF_ERROR(prompt_.Read(req.prompt(), item, limits, block_size));
  query_.prompt = prompt_.query();
  query_.candidates.assign(req.candidates().begin(), req.candidates().end());
  loads_.clear();
  loads_.reserve(static_cast<size_t>(req.loads_size()));
  for (const v1::WorkerLoad& l : req.loads()) {
    WorkerLoadInput in;
    in.worker = l.worker();
    in.requests_in_flight = l.requests_in_flight();
    in.queued_prefill_tokens = l.queued_prefill_tokens();
    in.kv_usage = l.kv_usage();
    loads_.push_back(in);
  }
  query_.loads = loads_;
  query_.dry_run = req.dry_run();
  query_.replay_time_ms = req.replay_time_ms();
  return absl::OkStatus();
}

}  // namespace prefixd
