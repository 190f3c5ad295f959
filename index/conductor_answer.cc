#include "index/conductor_answer.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace prefixd {
namespace {

using Json = nlohmann::json;

// *v = the larger of *v (0 when null) and `tokens`.
void Raise(Json* v, uint64_t tokens) {
  *v = std::max(v->is_null() ? uint64_t{0} : v->get<uint64_t>(), tokens);
}

}  // namespace

Json AnswerByTenant(const RouteResult& result, int block_size) {
  Json out = Json::object();
  const uint64_t bs = static_cast<uint64_t>(block_size);
  for (const WorkerMatch& m : result.workers) {
    Json& e = out[std::string(m.labels->Tenant())]
                 [std::string(m.labels->Instance(m.worker))];
    if (e.is_null()) {
      e = {{"longest_matched", 0},
           {"GPU", 0},
           {"CPU", 0},
           {"DISK", 0},
           {"DP", Json::object()}};
    }
    const uint64_t tokens = m.matched_blocks * bs;
    Raise(&e["longest_matched"], tokens);
    for (const RouteMedium& c : m.mediums) {
      Raise(&e[absl::AsciiStrToUpper(c.medium)], c.blocks * bs);
    }
    Raise(&e["DP"][absl::StrCat(m.labels->dp_rank)], tokens);
  }
  return out;
}

Json AnswerByInstance(const RouteResult& result, int block_size,
                      absl::string_view instance) {
  const uint64_t bs = static_cast<uint64_t>(block_size);
  Json instances = Json::object();
  for (const WorkerMatch& m : result.workers) {
    if (m.labels->IsStore()) continue;
    const absl::string_view id = m.labels->Instance(m.worker);
    if (!instance.empty() && id != instance) continue;
    Json& e = instances[std::string(id)];
    if (e.is_null()) {
      e = {{"longest_matched", 0},
           {"dp", Json::object()},
           {"rank_matches", Json::object()}};
    }
    const TierRuns& t = m.tiers;
    const std::string rank = absl::StrCat(m.labels->dp_rank);
    Raise(&e["dp"][rank], t.npu * bs);
    const std::pair<const char*, uint32_t> tiers[] = {
        {"npu", t.npu},
        {"cpu_local", t.cpu_local},
        {"cpu_share", t.cpu_share},
        {"disk", t.disk}};
    Json& r = e["rank_matches"][rank];
    for (const auto& [name, blocks] : tiers) {
      Raise(&r[name], blocks * bs);
      Raise(&e[name], blocks * bs);
    }
    Raise(&e["longest_matched"], t.disk * bs);
  }
  return Json{{"instances", std::move(instances)}};
}

}  // namespace prefixd
