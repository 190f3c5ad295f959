#include "index/conductor_answer.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace prefixd {
namespace {

using Json = nlohmann::json;

// *v = the larger of *v (0 when null) and `tokens`.
void Raise(Json* v, uint64_t tokens) {
  *v = std::max(v->is_null() ? uint64_t{0} : v->get<uint64_t>(), tokens);
}

// The run the worker holds in `medium` (any case).
uint64_t Held(const WorkerMatch& m, absl::string_view medium) {
  for (const RouteMedium& c : m.mediums) {
    if (absl::EqualsIgnoreCase(c.medium, medium)) return c.blocks;
  }
  return 0;
}

struct Tiers {
  uint64_t gpu = 0;
  uint64_t cpu = 0;
  uint64_t disk = 0;
};

// The longest CPU and DISK runs of any store among the route's workers.
Tiers SharedTiers(const RouteResult& result) {
  Tiers t;
  for (const WorkerMatch& m : result.workers) {
    if (!m.labels->hashes_are_keys) continue;
    t.cpu = std::max(t.cpu, Held(m, "CPU"));
    t.disk = std::max(t.disk, Held(m, "DISK"));
  }
  return t;
}

// An engine rank's tiers, each including the ones before it. Its own runs
// stop where it can reuse no more (a hybrid model's other groups).
Tiers RankTiers(const WorkerMatch& m, const Tiers& shared) {
  Tiers t;
  t.gpu = std::min(Held(m, "GPU"), m.matched_blocks);
  t.cpu =
      std::max({t.gpu, std::min(Held(m, "CPU"), m.matched_blocks), shared.cpu});
  t.disk = std::max({t.cpu, m.matched_blocks, shared.disk});
  return t;
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
  const Tiers shared = SharedTiers(result);
  Json instances = Json::object();
  for (const WorkerMatch& m : result.workers) {
    if (m.labels->hashes_are_keys) continue;
    const absl::string_view id = m.labels->Instance(m.worker);
    if (!instance.empty() && id != instance) continue;
    Json& e = instances[std::string(id)];
    if (e.is_null()) {
      e = {{"longest_matched", 0},
           {"dp", Json::object()},
           {"rank_matches", Json::object()},
           {"gpu", 0},
           {"cpu", 0},
           {"disk", 0}};
    }
    const Tiers t = RankTiers(m, shared);
    const std::string rank = absl::StrCat(m.labels->dp_rank);
    Raise(&e["dp"][rank], t.gpu * bs);
    Json& r = e["rank_matches"][rank];
    Raise(&r["gpu"], t.gpu * bs);
    Raise(&r["cpu"], t.cpu * bs);
    Raise(&r["disk"], t.disk * bs);
    Raise(&e["gpu"], t.gpu * bs);
    Raise(&e["cpu"], t.cpu * bs);
    Raise(&e["disk"], t.disk * bs);
    Raise(&e["longest_matched"], t.disk * bs);
  }
  return Json{{"instances", std::move(instances)}};
}

}  // namespace prefixd
