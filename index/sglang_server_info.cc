#include "index/sglang_server_info.h"

#include <cstdint>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "index/load_stat.h"

namespace prefixd {
namespace {

using Json = nlohmann::json;

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("server_info: ", what));
}

// kv_events.<key>, an integer in [lo, hi]; `fallback` when absent or null
// and `required` is false.
absl::StatusOr<int64_t> Int(const Json& kv, const char* key, int64_t lo,
                            int64_t hi, bool required, int64_t fallback = 0) {
  const auto it = kv.find(key);
  if (it == kv.end() || it->is_null()) {
    if (!required) return fallback;
    return Malformed(absl::StrCat("kv_events.", key, " is missing"));
  }
  if (!it->is_number_integer()) {
    return Malformed(absl::StrCat("kv_events.", key, " is a ", it->type_name(),
                                  "; want an integer"));
  }
  // An unsigned value past INT64_MAX reads as negative here: out of range
  // either way.
  const int64_t v = it->is_number_unsigned() &&
                            it->get<uint64_t>() > static_cast<uint64_t>(hi)
                        ? hi + 1
                        : it->get<int64_t>();
  if (v < lo || v > hi) {
    return Malformed(absl::StrCat("kv_events.", key, " is ", it->dump(),
                                  "; want ", lo, " to ", hi));
  }
  return v;
}

// kv_events.<key>, a string; "" when absent or null.
absl::StatusOr<std::string> Str(const Json& kv, const char* key) {
  const auto it = kv.find(key);
  if (it == kv.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return Malformed(absl::StrCat("kv_events.", key, " is a ", it->type_name(),
                                  "; want a string"));
  }
  return it->get<std::string>();
}

bool IsWildcard(absl::string_view host) {
  return host.empty() || host == "*" || host == "0.0.0.0" || host == "::" ||
         host == "[::]";
}

// A port range [base, base + n) within 1..65535.
absl::Status CheckRange(const char* key, int64_t base, int64_t n) {
  if (base + n - 1 <= 65535) return absl::OkStatus();
  return Malformed(absl::StrCat("kv_events.", key, " ", base, " + dp_size ", n,
                                " - 1 is past 65535"));
}

absl::StatusOr<SglangEventSockets> Read(const Json& kv,
                                        absl::string_view worker_host) {
  SglangEventSockets s;
  std::string publisher;
  ASSIGN_OR_RETURN(publisher, Str(kv, "publisher"));
  if (publisher != "zmq") {
    return Malformed(absl::StrCat("kv_events.publisher is \"", publisher,
                                  "\"; want \"zmq\""));
  }
  std::string host;
  ASSIGN_OR_RETURN(host, Str(kv, "endpoint_host"));
  s.host = IsWildcard(host) ? std::string(worker_host) : host;
  ASSIGN_OR_RETURN(s.topic, Str(kv, "topic"));
  int64_t v = 0;
  ASSIGN_OR_RETURN(v, Int(kv, "endpoint_port_base", 1, 65535, true));
  s.port_base = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, Int(kv, "block_size", 1, 1 << 20, true));
  s.block_size = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, Int(kv, "dp_size", 1, 65535, false, 1));
  s.dp_size = static_cast<int>(v);
  RETURN_IF_ERROR(CheckRange("endpoint_port_base", s.port_base, s.dp_size));
  ASSIGN_OR_RETURN(v, Int(kv, "load_endpoint_port_base", 1, 65535, false));
  s.load_port_base = static_cast<int>(v);
  if (s.load_port_base == 0) return s;
  RETURN_IF_ERROR(
      CheckRange("load_endpoint_port_base", s.load_port_base, s.dp_size));
  std::string load_topic;
  ASSIGN_OR_RETURN(load_topic, Str(kv, "load_topic"));
  if (!load_topic.empty() && load_topic != kLoadTopic) {
    return Malformed(absl::StrCat("kv_events.load_topic is \"", load_topic,
                                  "\"; want \"", kLoadTopic, "\""));
  }
  return s;
}

// /server_info's top-level `name` (a ServerArgs field) as a positive
// integer; 0 when absent or anything else (top-level members are not ours
// to check).
int64_t TopLevelInt(const Json& info, const char* name) {
  const auto it = info.find(name);
  if (it == info.end() || !it->is_number_integer()) return 0;
  const int64_t v = it->get<int64_t>();
  return v > 0 && v <= (1 << 20) ? v : 0;
}

// Under decode context parallelism SGLang's radix tree pages, and its
// events store blocks, at page_size x dcp_size tokens. Newer workers say
// so in kv_events.block_size; earlier ones gave the page size there, with
// page_size and dcp_size beside kv_events at the top level: their blocks
// are widened here. A block size already equal to the product is left.
void WidenForDcp(const Json& info, SglangEventSockets* s) {
  const int64_t page = TopLevelInt(info, "page_size");
  const int64_t dcp = TopLevelInt(info, "dcp_size");
  if (dcp < 2 || page != s->block_size || page * dcp > (1 << 20)) return;
  s->block_size = static_cast<int>(page * dcp);
}

std::vector<std::string> Endpoints(const std::string& host, int base, int n) {
  std::vector<std::string> out;
  if (base == 0) return out;
  for (int r = 0; r < n; ++r)
    out.push_back(absl::StrCat("tcp://", host, ":", base + r));
  return out;
}

}  // namespace

std::vector<std::string> SglangEventSockets::EventEndpoints() const {
  return Endpoints(host, port_base, dp_size);
}

std::vector<std::string> SglangEventSockets::LoadEndpoints() const {
  return Endpoints(host, load_port_base, dp_size);
}

absl::StatusOr<std::optional<SglangEventSockets>> ParseSglangServerInfo(
    absl::string_view body, absl::string_view worker_host) {
  const Json info = Json::parse(body.begin(), body.end(), nullptr, false);
  if (info.is_discarded()) return Malformed("the body is not JSON");
  if (!info.is_object()) {
    return Malformed(
        absl::StrCat("the body is a ", info.type_name(), "; want an object"));
  }
  const auto kv = info.find("kv_events");
  if (kv == info.end() || kv->is_null()) return std::nullopt;
  if (!kv->is_object()) {
    return Malformed(
        absl::StrCat("kv_events is a ", kv->type_name(), "; want an object"));
  }
  ASSIGN_OR_RETURN(SglangEventSockets s, Read(*kv, worker_host));
  WidenForDcp(info, &s);
  return s;
}

}  // namespace prefixd
