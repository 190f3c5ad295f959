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
//   {"instances": {<instance_id>: {"longest_matched", "npu", "cpu_local",
//                                  "cpu_share", "disk",
//                                  "dp": {"<rank>": npu tokens},
//                                  "rank_matches": {"<rank>": {"npu",
//                                                   "cpu_local", "cpu_share",
//                                                   "disk"}}}}}
// engines only, each rank's runs as the query's Route counted them
// (RouteQuery::tier_runs, index/tier_scorer.h): cumulative tiers, a store's
// blocks extending every engine's cpu_share and disk runs. An instance's
// tiers and longest_matched (its disk) are the longest over
// its ranks. Needs a Route asked for tier runs.
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
