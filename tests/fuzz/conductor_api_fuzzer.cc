// libFuzzer: the Mooncake Conductor API's request bodies (docs/index.md, "As
// a Mooncake Conductor") come from any router that can reach
// index.http_listen, so no byte string may crash its JSON readers
// (index/conductor_api.h) or get an answer the API does not promise. The
// first byte picks the endpoint (its low two bits) and the body's encoding
// (bit 2: MessagePack, as Mooncake's current Conductor clients send), the
// rest is the body. Checked for every input:
//   - /register and /unregister bodies: a registration read back from its
//     own JSON form is the same registration, and its name is
//     "<instance_id>|<tenant>|<dp_rank>" without another '|';
//   - /query and /query_by_hash over a small index: the status is 200 or
//     400 (403 for the tenant caller when it names another tenant or salt),
//     the body is an object in the request's encoding, an error's is
//     {"error": <string>}, and a 200's matched tokens are whole blocks of at
//     most the prompt; by instance (MessagePack), each instance's tiers
//     include the ones before them and longest_matched is its disk tier.
//
//   build-fuzz/tests/fuzz/conductor_api_fuzzer
//   tests/fuzz/corpus/conductor_api_fuzzer
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "index/conductor_api.h"
#include "index/fleet_index.h"

namespace prefixd {
namespace {

constexpr int kBs = 4;

void Check(bool ok, const char* what, absl::string_view detail = "") {
  if (ok) return;
  std::fprintf(stderr, "conductor_api_fuzzer: %s %.*s\n", what,
               static_cast<int>(detail.size()), detail.data());
  __builtin_trap();
}

// Worker `name` holding tokens 1..(blocks x kBs) in `medium`.
void Hold(FleetIndex* index, const char* name, const char* instance, int rank,
          int blocks, const char* medium, bool store) {
  const WorkerId w = index->AddWorker(name, "");
  WorkerLabels labels;
  labels.instance_id = instance;
  labels.dp_rank = rank;
  labels.hashes_are_keys = store;
  index->SetLabels(w, labels);
  BlockStoredEvent ev;
  for (int b = 0; b < blocks; ++b) {
    ev.block_hashes.push_back(static_cast<EngineHash>(b + 1));
    for (int t = 1; t <= kBs; ++t)
      ev.token_ids.push_back(static_cast<Token>(b * kBs + t));
  }
  ev.block_size = kBs;
  ev.medium = medium;
  ev.chain_blocks = ev.block_hashes.size();
  KvEventBatch batch;
  batch.events.push_back(ev);
  index->Apply(w, batch, 0, absl::Now());
}

// Two workers of instance "a" (ranks 0 and 1) holding tokens 1..16 and
// 1..8 on GPU, and a store holding 1..12 in its CPU pool.
FleetIndex* NewIndex() {
  auto* index = new FleetIndex(IndexOptions{
      .block_size = kBs, .max_entries = 100000, .key_lookup = true});
  Hold(index, "a0", "a", 0, 4, "GPU", false);
  Hold(index, "a1", "a", 1, 2, "GPU", false);
  Hold(index, "s", "s", 0, 3, "cpu", true);
  return index;
}

void CheckRegistration(absl::string_view body, bool unregister,
                       BodyFormat format) {
  if (unregister) {
    absl::StatusOr<std::string> name = ParseUnregister(body, kBs, format);
    if (name.ok()) {
      Check(std::count(name->begin(), name->end(), '|') == 2,
            "a name with another '|'", *name);
    }
    return;
  }
  absl::StatusOr<Registration> r = ParseRegister(body, kBs, format);
  if (!r.ok()) return;
  const std::string name = r->Name();
  Check(std::count(name.begin(), name.end(), '|') == 2,
        "a name with another '|'", name);
  absl::StatusOr<Registration> back =
      RegistrationFromJson(RegistrationToJson(*r, kBs), kBs);
  Check(back.ok() && *back == *r, "a registration that does not round-trip");
}

void CheckTokens(const nlohmann::json& v, const std::string& body) {
  Check(v.is_number_unsigned(), "a count that is not a number", body);
  Check(v.get<uint64_t>() % kBs == 0 && v.get<uint64_t>() <= 16,
        "a partial or long match", body);
}

// {"instances": {id: {...}}}: tiers that include the ones before them.
void CheckByInstance(const nlohmann::json& j, const std::string& body) {
  Check(j.size() == 1 && j.contains("instances"), "no instances", body);
  for (const auto& [instance, e] : j["instances"].items()) {
    for (const char* tier :
         {"npu", "cpu_local", "cpu_share", "disk", "longest_matched"})
      CheckTokens(e[tier], body);
    Check(e["npu"] <= e["cpu_local"] && e["cpu_local"] <= e["cpu_share"] &&
              e["cpu_share"] <= e["disk"] && e["disk"] == e["longest_matched"],
          "tiers that do not include the ones before them", body);
  }
}

void CheckAnswer(const ConductorAnswer& a, BodyFormat format,
                 bool tenant_caller) {
  Check(
      a.status == 200 || a.status == 400 || (tenant_caller && a.status == 403),
      "an unexpected status", a.body);
  Check(a.format == format, "an answer in another encoding", a.body);
  const nlohmann::json j =
      format == BodyFormat::kJson
          ? nlohmann::json::parse(a.body, nullptr, false)
          : nlohmann::json::from_msgpack(a.body, true, false);
  Check(j.is_object(), "an answer that is not an object", a.body);
  if (a.status != 200) {
    Check(j.size() == 1 && j.contains("error") && j["error"].is_string(),
          "an error without {\"error\": string}", a.body);
    return;
  }
  if (format == BodyFormat::kMsgpack) return CheckByInstance(j, a.body);
  for (const auto& [tenant, instances] : j.items()) {
    for (const auto& [instance, e] : instances.items())
      CheckTokens(e["longest_matched"], a.body);
  }
}

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prefixd;
  static FleetIndex* index = NewIndex();
  static ConductorApi* api =
      new ConductorApi(index, nullptr, ConductorLimits{64, 16});
  if (size == 0) return 0;
  const absl::string_view body(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  ConductorCaller engine;
  engine.any_tenant = true;
  ConductorCaller tenant;
  tenant.tenant = "acme";
  tenant.salts = {"s"};
  const BodyFormat format =
      (data[0] & 4) != 0 ? BodyFormat::kMsgpack : BodyFormat::kJson;
  switch (data[0] % 4) {
    case 0:
      CheckRegistration(body, false, format);
      break;
    case 1:
      CheckRegistration(body, true, format);
      break;
    default: {
      const bool by_hash = data[0] % 4 == 3;
      CheckAnswer(api->Query(engine, body, by_hash, format), format, false);
      CheckAnswer(api->Query(tenant, body, by_hash, format), format, true);
    }
  }
  return 0;
}
