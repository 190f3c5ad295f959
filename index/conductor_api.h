// The Mooncake Conductor indexer API over the fleet index (docs/index.md,
// "As a Mooncake Conductor"): JSON or MessagePack requests in, KvIndex and
// ConductorRegistry calls, answers out in the request's encoding. The HTTP
// side (server/http/conductor_listener.h) only routes a path here.
//
//   POST /register       {endpoint, replay_endpoint?, type, modelname,
//                         lora_name?, tenant_id?, instance_id, block_size,
//                         dp_rank, additionalsalt?, hash_profile?,
//                         cache_group?}
//   POST /unregister     {type?, modelname?, lora_name?, tenant_id?,
//                         instance_id, block_size?, dp_rank} (the RFC's
//                         form; Mooncake's current one names the
//                         registration alone)
//   POST /query          {model, lora_name?, token_ids, tenant_id?,
//                         instance_id?, block_size, cache_salt?}
//   POST /query_by_hash  the same with seq_hashes (or block_hash) instead of
//                        token_ids: the prompt's rolling keys
//                        (index/keys.h)
//   GET /services        the registrations, {"count", "services": [...]}
//                        with the field names of the Conductor's
//                        ServiceConfig (always JSON)
//
// A JSON query answers by tenant, {<tenant>: {<instance_id>: {...}}}, as
// the RFC does; a MessagePack one by instance, {"instances":
// {<instance_id>: {...}}}, as Mooncake's current Conductor does, the only
// one that speaks MessagePack (index/conductor_answer.h).
//
// Errors answer {"error": "..."}: 400 for a malformed body, a missing or
// mistyped field, an unknown `type`, a wrong `block_size` or a list over
// the limits (the message names the field and the numbers); 403 for a
// tenant or salt the caller does not own or a caller that may not
// register; 404 for an unknown registration; 409 for a name a configured
// source holds. A refused request changes nothing.
//
// Thread safety: every method may be called concurrently (the index and
// the registry are thread-safe; this class holds no state of its own).
#ifndef PREFIXD_INDEX_CONDUCTOR_API_H_
#define PREFIXD_INDEX_CONDUCTOR_API_H_

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/types.h"
#include "index/conductor_answer.h"
#include "index/conductor_registry.h"
#include "index/flat_json.h"
#include "index/kv_index.h"

namespace prefixd {

// What the caller may do, as the daemon's principals decide it.
struct ConductorCaller {
  std::string principal;      // for messages
  bool may_register = false;  // ENGINE principals (and auth off)
  bool any_tenant = false;    // ENGINE, ADMIN (and auth off): any query
  // A TENANT principal: queries within its tenant, with one of its salts.
  std::string tenant;
  std::vector<std::string> salts;
};

struct ConductorLimits {
  size_t max_tokens = 1 << 20;  // token_ids per query
  size_t max_hashes = 1 << 16;  // seq_hashes per query
};

// A query as read.
struct ConductorQuery {
  std::string model;
  std::string lora_name;
  int64_t lora_id = 0;  // the RFC's deprecated form of lora_name; 0: none
  std::string tenant;   // "" = not named
  std::string instance_id;
  std::string cache_salt;
  std::vector<Token> tokens;
  std::vector<uint64_t> keys;  // by hash
};

struct ConductorAnswer {
  int status = 200;
  std::string body;
  BodyFormat format = BodyFormat::kJson;  // the body's encoding
};

// The request readers (each checks every field; INVALID_ARGUMENT names the
// field and the numbers). `block_size` is the index's.
absl::StatusOr<Registration> ParseRegister(
    absl::string_view body, int block_size,
    BodyFormat format = BodyFormat::kJson);
absl::StatusOr<Registration> RegistrationFromJson(const nlohmann::json& j,
                                                  int block_size);
nlohmann::json RegistrationToJson(const Registration& r, int block_size);
// The name of the registration an /unregister removes.
absl::StatusOr<std::string> ParseUnregister(
    absl::string_view body, int block_size,
    BodyFormat format = BodyFormat::kJson);
absl::StatusOr<ConductorQuery> ParseQuery(
    absl::string_view body, int block_size, bool by_hash,
    const ConductorLimits& limits, BodyFormat format = BodyFormat::kJson);

// The HTTP status of an error, and its {"error": message} answer.
ConductorAnswer ErrorAnswer(const absl::Status& status,
                            BodyFormat format = BodyFormat::kJson);

class ConductorApi {
 public:
  // `registry` may be null (then /register and /unregister answer 409).
  // `json_answer`: how a JSON /query is answered (MessagePack: always by
  // instance).
  ConductorApi(const KvIndex* index, ConductorRegistry* registry,
               ConductorLimits limits,
               AnswerForm json_answer = AnswerForm::kByTenant);

  ConductorAnswer Register(const ConductorCaller& caller,
                           absl::string_view body,
                           BodyFormat format = BodyFormat::kJson) const;
  ConductorAnswer Unregister(const ConductorCaller& caller,
                             absl::string_view body,
                             BodyFormat format = BodyFormat::kJson) const;
  ConductorAnswer Query(const ConductorCaller& caller, absl::string_view body,
                        bool by_hash,
                        BodyFormat format = BodyFormat::kJson) const;
  // The registrations the caller may see: every one for an ENGINE or ADMIN
  // principal, its own tenant's for a TENANT principal; by name.
  ConductorAnswer Services(const ConductorCaller& caller) const;

 private:
  absl::StatusOr<nlohmann::json> DoQuery(const ConductorCaller& caller,
                                         absl::string_view body, bool by_hash,
                                         BodyFormat format) const;

  const KvIndex* const index_;
  ConductorRegistry* const registry_;
  const ConductorLimits limits_;
  const AnswerForm json_answer_;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_CONDUCTOR_API_H_
