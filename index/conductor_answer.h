// The two shapes in which Mooncake's Conductors answer /query, built from
// one Route (docs/index.md, "As a Mooncake Conductor"). Both give matched
// prompt tokens (whole blocks).
//
// By tenant (the RFC's, Mooncake's Go Conductor):
//   {<tenant>: {<instance_id>: {"longest_matched", "GPU", "CPU", "DISK",
//                               "DP": {"<rank>": tokens}}}}
// every worker of the route an instance, a store (a Mooncake publisher) too;
// per medium the run it holds there, upper-cased (other mediums as named).
//
// By instance (Mooncake's current C++ Conductor):
//   {"instances": {<instance_id>: {"longest_matched", "gpu", "cpu", "disk",
//                                  "dp": {"<rank>": gpu tokens},
//                                  "rank_matches": {"<rank>": {"gpu",
//                                                   "cpu", "disk"}}}}}
// engines only; a store's blocks extend every engine's tiers, as a store
// any engine of the tenant can read from: per rank, gpu is the rank's own
// GPU run, cpu the longest of that, its own CPU run and any store's CPU
// run, disk the longest of that, its own DISK run, any store's DISK run
// and everything the rank holds; longest_matched is the instance's longest
// disk, and gpu, cpu and disk the longest over its ranks. Mooncake
// continues the GPU run into the CPU tier and that into disk block by
// block; each run here starts at the prompt's first block, so where a
// tier holds only blocks after the run before it, it answers less, never
// more.
//
// Thread safety: functions of their arguments.
#ifndef PREFIXD_INDEX_CONDUCTOR_ANSWER_H_
#define PREFIXD_INDEX_CONDUCTOR_ANSWER_H_

#include <nlohmann/json_fwd.hpp>

#include "absl/strings/string_view.h"
#include "index/kv_index.h"

namespace prefixd {

// Which of the two shapes a /query answers in.
enum class AnswerForm { kByTenant, kByInstance };

nlohmann::json AnswerByTenant(const RouteResult& result, int block_size);

// `instance`: only that engine instance ("" = every one).
nlohmann::json AnswerByInstance(const RouteResult& result, int block_size,
                                absl::string_view instance);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_CONDUCTOR_ANSWER_H_
