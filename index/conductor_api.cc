#include "index/conductor_api.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "index/conductor_answer.h"
#include "index/flat_json.h"

namespace prefixd {
namespace {

using Json = nlohmann::json;

// JSON text of `j`; bytes that are not UTF-8 (an error message quoting what
// a client sent, a name from the config) become U+FFFD instead of throwing.
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// `j` in `format`.
std::string Encode(const Json& j, BodyFormat format) {
  if (format == BodyFormat::kJson) return Dump(j);
  std::string out;
  Json::to_msgpack(j, out);
  return out;
}

// The most data-parallel ranks a registration may name (a bound on worker
// names, not on any engine known).
constexpr int64_t kMaxDpRank = 1 << 16;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckBlockSize(const FlatJson& j, int block_size) {
  ASSIGN_OR_RETURN(const int64_t bs,
                   j.Int("block_size", 1, std::numeric_limits<int>::max()));
  if (bs != block_size) {
    return Invalid("block_size",
                   absl::StrCat(bs, " differs from the index's block size ",
                                block_size, " (index.block_size)"));
  }
  return absl::OkStatus();
}

// "vLLM", "SGLang" or "Mooncake", in any case, as the canonical spelling.
absl::StatusOr<std::string> PublisherType(const FlatJson& j) {
  ASSIGN_OR_RETURN(std::string type, j.String("type", true));
  for (const char* known : {"vLLM", "SGLang", "Mooncake"}) {
    if (absl::EqualsIgnoreCase(type, known)) return std::string(known);
  }
  return Invalid("type", absl::StrCat("\"", type,
                                      "\" is none of \"vLLM\", \"SGLang\", "
                                      "\"Mooncake\""));
}

absl::StatusOr<std::string> Tenant(const FlatJson& j) {
  ASSIGN_OR_RETURN(std::string tenant, j.String("tenant_id", false));
  if (absl::StrContains(tenant, '|')) {
    return Invalid("tenant_id", "must not contain '|' (it names the worker)");
  }
  return tenant;
}

absl::StatusOr<std::string> InstanceId(const FlatJson& j, bool required) {
  ASSIGN_OR_RETURN(std::string id, j.String("instance_id", required));
  if (required && id.empty()) return Invalid("instance_id", "is empty");
  if (absl::StrContains(id, '|') || absl::StrContains(id, '/')) {
    return Invalid("instance_id",
                   "must not contain '|' or '/' (it names the worker)");
  }
  return id;
}

// The worker's name: its tenant_id, instance_id and dp_rank.
absl::Status ReadName(const FlatJson& j, Registration* r) {
  ASSIGN_OR_RETURN(r->tenant, Tenant(j));
  if (r->tenant.empty()) r->tenant = "default";
  ASSIGN_OR_RETURN(r->instance_id, InstanceId(j, true));
  ASSIGN_OR_RETURN(r->dp_rank, j.Int("dp_rank", 0, kMaxDpRank));
  return absl::OkStatus();
}

// Mooncake's current Conductor's /register fields, which prefixd does not
// need: `hash_profile` names how that Conductor hashes a query's tokens
// (prefixd reads the tokens its engines store), `cache_group` the one
// KV-cache group it follows (prefixd follows every group, by its rules).
absl::Status ReadCurrentFields(const FlatJson& j) {
  RETURN_IF_ERROR(j.OptionalObject("hash_profile"));
  ASSIGN_OR_RETURN(const std::optional<int64_t> group,
                   j.OptionalInt("cache_group", 0, INT32_MAX));
  if (group.value_or(0) != 0) {
    return Invalid("cache_group",
                   absl::StrCat(*group,
                                " is not served: only 0 (prefixd follows "
                                "every KV-cache group of the stream)"));
  }
  return absl::OkStatus();
}

// What /register names: the worker, its publisher and model.
absl::Status ReadKey(const FlatJson& j, int block_size, Registration* r) {
  ASSIGN_OR_RETURN(r->type, PublisherType(j));
  ASSIGN_OR_RETURN(r->model, j.String("modelname", true));
  ASSIGN_OR_RETURN(r->lora_name, j.String("lora_name", false));
  RETURN_IF_ERROR(ReadName(j, r));
  return CheckBlockSize(j, block_size);
}

absl::Status ReadPrompt(const FlatJson& j, bool by_hash,
                        const ConductorLimits& limits, ConductorQuery* q) {
  if (!by_hash) {
    return j.List("token_ids", limits.max_tokens,
                  std::numeric_limits<Token>::max(), &q->tokens);
  }
  const bool seq = j.Has("seq_hashes");
  if (seq && j.Has("block_hash")) {
    return Invalid("seq_hashes", "and block_hash are both given; send one");
  }
  if (!seq && !j.Has("block_hash")) {
    return Invalid("seq_hashes", "is required (or block_hash)");
  }
  return j.List(seq ? "seq_hashes" : "block_hash", limits.max_hashes,
                std::numeric_limits<uint64_t>::max(), &q->keys);
}

absl::Status MayQuery(const ConductorCaller& caller, ConductorQuery* q) {
  if (caller.any_tenant) return absl::OkStatus();
  if (q->tenant.empty()) q->tenant = caller.tenant;
  if (q->tenant != caller.tenant) {
    return absl::PermissionDeniedError(absl::StrCat(
        "tenant_id: principal \"", caller.principal, "\" acts for tenant \"",
        caller.tenant, "\", not \"", q->tenant, "\""));
  }
  if (std::find(caller.salts.begin(), caller.salts.end(), q->cache_salt) ==
      caller.salts.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cache_salt: principal \"", caller.principal,
                     "\" may query only with "
                     "one of its cache_salts; \"",
                     q->cache_salt, "\" is not among them"));
  }
  return absl::OkStatus();
}

absl::Status MayRegister(const ConductorCaller& caller) {
  if (caller.may_register) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("principal \"", caller.principal,
                   "\" may not register or unregister publishers: that needs "
                   "an ENGINE principal"));
}

// A registration as both generations of the Conductor list their
// ServiceConfigs on GET /services (its Go struct's field names).
Json ServiceConfigOf(const Registration& r, int block_size) {
  return {{"Endpoint", r.endpoint},
          {"ReplayEndpoint", r.replay_endpoint},
          {"Type", r.type},
          {"ModelName", r.model},
          {"LoraName", r.lora_name},
          {"TenantID", r.tenant},
          {"InstanceID", r.instance_id},
          {"BlockSize", block_size},
          {"DPRank", r.dp_rank},
          {"AdditionalSalt", r.salt}};
}

}  // namespace

absl::StatusOr<Registration> RegistrationFromJson(const Json& j,
                                                  int block_size) {
  return ParseRegister(Dump(j), block_size);
}

Json RegistrationToJson(const Registration& r, int block_size) {
  Json j = {{"endpoint", r.endpoint},       {"type", r.type},
            {"modelname", r.model},         {"tenant_id", r.tenant},
            {"instance_id", r.instance_id}, {"block_size", block_size},
            {"dp_rank", r.dp_rank}};
  if (!r.replay_endpoint.empty()) j["replay_endpoint"] = r.replay_endpoint;
  if (!r.lora_name.empty()) j["lora_name"] = r.lora_name;
  if (!r.salt.empty()) j["additionalsalt"] = r.salt;
  return j;
}

absl::StatusOr<Registration> ParseRegister(absl::string_view body,
                                           int block_size, BodyFormat format) {
  ASSIGN_OR_RETURN(const FlatJson j, FlatJson::Parse(body, format));
  Registration r;
  RETURN_IF_ERROR(ReadKey(j, block_size, &r));
  ASSIGN_OR_RETURN(r.endpoint, j.String("endpoint", true));
  ASSIGN_OR_RETURN(r.replay_endpoint, j.String("replay_endpoint", false));
  ASSIGN_OR_RETURN(r.salt, j.String("additionalsalt", false));
  RETURN_IF_ERROR(ReadCurrentFields(j));
  // The endpoints as a source checks them.
  if (absl::Status s = ValidateIndexSource(r.Source()); !s.ok())
    return Invalid("endpoint", s.message());
  return r;
}

// The RFC's /unregister restates the registration; Mooncake's current
// Conductor takes its name alone (instance_id, dp_rank, tenant_id?). The
// name is required, the rest checked when given.
absl::StatusOr<std::string> ParseUnregister(absl::string_view body,
                                            int block_size, BodyFormat format) {
  ASSIGN_OR_RETURN(const FlatJson j, FlatJson::Parse(body, format));
  Registration r;
  if (j.Has("type")) RETURN_IF_ERROR(PublisherType(j).status());
  if (j.Has("modelname")) RETURN_IF_ERROR(j.String("modelname", true).status());
  RETURN_IF_ERROR(j.String("lora_name", false).status());
  RETURN_IF_ERROR(ReadName(j, &r));
  if (j.Has("block_size")) RETURN_IF_ERROR(CheckBlockSize(j, block_size));
  return r.Name();
}

absl::StatusOr<ConductorQuery> ParseQuery(absl::string_view body,
                                          int block_size, bool by_hash,
                                          const ConductorLimits& limits,
                                          BodyFormat format) {
  ASSIGN_OR_RETURN(const FlatJson j, FlatJson::Parse(body, format));
  ConductorQuery q;
  ASSIGN_OR_RETURN(q.model, j.String("model", true));
  ASSIGN_OR_RETURN(q.lora_name, j.String("lora_name", false));
  // The RFC keeps lora_id for compatibility, never beside lora_name: a LoRA
  // the events name by ID only (vLLM's lora_id) is its namespace.
  ASSIGN_OR_RETURN(const std::optional<int64_t> lora_id,
                   j.OptionalInt("lora_id", 1, INT32_MAX));
  if (lora_id.has_value() && !q.lora_name.empty()) {
    return Invalid(
        "lora_id",
        absl::StrCat(*lora_id, " is given beside lora_name \"",
                     absl::CHexEscape(q.lora_name), "\": name the LoRA once"));
  }
  q.lora_id = lora_id.value_or(0);
  ASSIGN_OR_RETURN(q.tenant, Tenant(j));
  ASSIGN_OR_RETURN(q.instance_id, InstanceId(j, false));
  ASSIGN_OR_RETURN(q.cache_salt, j.String("cache_salt", false));
  RETURN_IF_ERROR(CheckBlockSize(j, block_size));
  RETURN_IF_ERROR(ReadPrompt(j, by_hash, limits, &q));
  return q;
}

ConductorAnswer ErrorAnswer(const absl::Status& status, BodyFormat format) {
  int code = 500;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      code = 400;
      break;
    case absl::StatusCode::kUnauthenticated:
      code = 401;
      break;
    case absl::StatusCode::kPermissionDenied:
      code = 403;
      break;
    case absl::StatusCode::kNotFound:
      code = 404;
      break;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
      code = 409;
      break;
    default:
      break;
  }
  return {code, Encode(Json{{"error", std::string(status.message())}}, format),
          format};
}

ConductorApi::ConductorApi(const KvIndex* index, ConductorRegistry* registry,
                           ConductorLimits limits, AnswerForm json_answer)
    : index_(index),
      registry_(registry),
      limits_(limits),
      json_answer_(json_answer) {}

ConductorAnswer ConductorApi::Register(const ConductorCaller& caller,
                                       absl::string_view body,
                                       BodyFormat format) const {
  absl::Status s = MayRegister(caller);
  absl::StatusOr<Registration> r =
      s.ok() ? ParseRegister(body, index_->options().block_size, format) : s;
  if (r.ok() && registry_ == nullptr) {
    r = absl::FailedPreconditionError("registrations are not served here");
  }
  if (r.ok()) {
    if (absl::Status added = registry_->Add(*r); !added.ok()) r = added;
  }
  if (!r.ok()) return ErrorAnswer(r.status(), format);
  return {200,
          Encode(Json{{"status", "registered successfully"},
                      {"instance_id", r->instance_id}},
                 format),
          format};
}

ConductorAnswer ConductorApi::Unregister(const ConductorCaller& caller,
                                         absl::string_view body,
                                         BodyFormat format) const {
  absl::Status s = MayRegister(caller);
  absl::StatusOr<std::string> name =
      s.ok() ? ParseUnregister(body, index_->options().block_size, format) : s;
  if (name.ok() && registry_ == nullptr) {
    name = absl::FailedPreconditionError("registrations are not served here");
  }
  if (name.ok()) {
    if (absl::Status removed = registry_->Remove(*name); !removed.ok())
      name = removed;
  }
  if (!name.ok()) return ErrorAnswer(name.status(), format);
  return {200,
          Encode(Json{{"status", "unregistered successfully"},
                      {"removed_instances", Json::array({*name})}},
                 format),
          format};
}

absl::StatusOr<Json> ConductorApi::DoQuery(const ConductorCaller& caller,
                                           absl::string_view body, bool by_hash,
                                           BodyFormat format) const {
  const int bs = index_->options().block_size;
  ASSIGN_OR_RETURN(ConductorQuery q,
                   ParseQuery(body, bs, by_hash, limits_, format));
  RETURN_IF_ERROR(MayQuery(caller, &q));
  RouteQuery route;
  route.tokens = q.tokens;
  route.keys = q.keys;
  route.lora_name = q.lora_name;
  route.lora_id = q.lora_id;
  route.cache_salt = q.cache_salt;
  // Both views: a ternary of a literal and a std::string would make a
  // temporary string, and the filter would view it after it is gone.
  route.filter.tenant = q.tenant.empty() ? absl::string_view("default")
                                         : absl::string_view(q.tenant);
  route.filter.model = q.model;
  // The Conductor's answer lists every instance the filter lets through,
  // matched or not (docs/index.md).
  route.filter.all_workers = true;
  if (format == BodyFormat::kJson && json_answer_ == AnswerForm::kByTenant) {
    route.filter.instance = q.instance_id;
    return AnswerByTenant(index_->Route(route), bs);
  }
  // By instance, the stores extend every engine: filtered after the route.
  route.tier_runs = true;
  return AnswerByInstance(index_->Route(route), bs, q.instance_id);
}

ConductorAnswer ConductorApi::Query(const ConductorCaller& caller,
                                    absl::string_view body, bool by_hash,
                                    BodyFormat format) const {
  absl::StatusOr<Json> answer = DoQuery(caller, body, by_hash, format);
  if (!answer.ok()) return ErrorAnswer(answer.status(), format);
  return {200, Encode(*answer, format), format};
}

ConductorAnswer ConductorApi::Services(const ConductorCaller& caller) const {
  Json list = Json::array();
  if (registry_ != nullptr) {
    for (const Registration& r : registry_->List()) {
      if (caller.any_tenant || r.tenant == caller.tenant)
        list.push_back(ServiceConfigOf(r, index_->options().block_size));
    }
  }
  const size_t count = list.size();
  return {200, Dump(Json{{"count", count}, {"services", std::move(list)}}),
          BodyFormat::kJson};
}

}  // namespace prefixd
