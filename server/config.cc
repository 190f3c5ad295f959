#include "server/config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "model/hf_config.h"
#include "model/units.h"
#include "server/auth.h"
#include "server/defaults.h"

namespace prefixd {
namespace {

// Prefixes a field name to an error from a parser that quotes only the
// value. Whatever the parser's code (an unknown preset is NOT_FOUND), a bad
// config value is INVALID_ARGUMENT.
absl::Status InField(absl::string_view field, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", s.message()));
}

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// The first error, "LINE:COL: message"; with `files` (the joined files'
// names and first lines, 0-based, in order) "FILE:LINE:COL: message".
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  FirstErrorCollector() = default;
  explicit FirstErrorCollector(std::vector<std::pair<std::string, int>> files)
      : files_(std::move(files)) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!error_.empty()) return;
    std::string file;
    for (const auto& [name, first] : files_) {
      if (line < first) break;
      file = absl::StrCat(name, ":");
      line_in_file_ = line - first;
    }
    if (files_.empty()) line_in_file_ = line;
    error_ =
        absl::StrCat(file, line_in_file_ + 1, ":", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::vector<std::pair<std::string, int>> files_;
  int line_in_file_ = 0;
  std::string error_;
};

absl::StatusOr<uint64_t> ParseBytesField(absl::string_view field,
                                         const std::string& text) {
  absl::StatusOr<uint64_t> v = ParseBytes(text);
  if (!v.ok()) return InField(field, v.status());
  return v;
}

absl::StatusOr<absl::Duration> ParsePositiveDuration(absl::string_view field,
                                                     const std::string& text) {
  absl::StatusOr<absl::Duration> d = ParseDuration(text);
  if (!d.ok()) return InField(field, d.status());
  if (*d <= absl::ZeroDuration()) {
    return Invalid(field, absl::StrCat("\"", text, "\" must be longer than 0"));
  }
  return d;
}

absl::StatusOr<int> ModelDimension(absl::string_view field, uint32_t value) {
  if (value > (1u << 24)) {
    return Invalid(field, absl::StrCat(value, " is beyond any real model (max ",
                                       1u << 24, ")"));
  }
  return static_cast<int>(value);
}

// The geometry and the RoPE defaults the config's rope {} then overrides.
struct BaseModel {
  ModelGeometry geometry;
  RopeConfig rope;
  std::optional<KvDtype> weights_dtype;  // from a config.json's torch_dtype
  std::vector<std::string> notes;
};

// MLA, sliding-window and state layers by numbers (ValidateGeometry checks
// that they fit together).
absl::Status ResolveLayerKinds(const v1::ModelConfig& m, ModelGeometry* g) {
  for (auto [field, value, dst] :
       {std::tuple<const char*, uint32_t, int*>{
            "model.kv_lora_rank", m.kv_lora_rank(), &g->kv_lora_rank},
        {"model.sliding_window", m.sliding_window(), &g->sliding_window},
        {"model.sliding_layers", m.sliding_layers(), &g->sliding_layers},
        {"model.state_layers", m.state_layers(), &g->state_layers}}) {
    ASSIGN_OR_RETURN(*dst, ModelDimension(field, value));
  }
  if (!m.state_bytes().empty()) {
    ASSIGN_OR_RETURN(g->state_bytes_per_layer,
                     ParseBytesField("model.state_bytes", m.state_bytes()));
  }
  return absl::OkStatus();
}

absl::StatusOr<BaseModel> ResolveBaseModel(const v1::ModelConfig& m) {
  bool numbers = m.layers() != 0 || m.kv_heads() != 0 || m.head_dim() != 0 ||
                 m.kv_lora_rank() != 0 || m.sliding_window() != 0 ||
                 m.sliding_layers() != 0 || m.state_layers() != 0 ||
                 !m.state_bytes().empty();
  int ways = !m.preset().empty() + numbers + !m.hf_config_path().empty();
  if (ways != 1) {
    return Invalid(
        "model",
        absl::StrCat("set exactly one of preset, layers/kv_heads/head_dim "
                     "or hf_config_path; got preset \"",
                     m.preset(), "\", layers ", m.layers(),
                     ", hf_config_path \"", m.hf_config_path(), "\""));
  }
  BaseModel base;
  if (!m.preset().empty()) {
    absl::StatusOr<ModelPreset> preset = FindPreset(m.preset());
    if (!preset.ok()) return InField("model.preset", preset.status());
    base.geometry = preset->geometry;
    base.rope = preset->rope;
    return base;
  }
  if (!m.hf_config_path().empty()) {
    absl::StatusOr<ModelSpecFromHf> hf = ReadHfConfig(m.hf_config_path());
    if (!hf.ok()) return InField("model.hf_config_path", hf.status());
    base.geometry = hf->geometry;
    if (base.geometry.name.empty()) base.geometry.name = m.hf_config_path();
    base.rope = hf->rope;
    base.weights_dtype = hf->torch_dtype;
    base.notes = hf->notes;
    return base;
  }
  base.geometry.name = "custom";
  ASSIGN_OR_RETURN(base.geometry.layers,
                   ModelDimension("model.layers", m.layers()));
  ASSIGN_OR_RETURN(base.geometry.kv_heads,
                   ModelDimension("model.kv_heads", m.kv_heads()));
  ASSIGN_OR_RETURN(base.geometry.head_dim,
                   ModelDimension("model.head_dim", m.head_dim()));
  ASSIGN_OR_RETURN(
      base.geometry.attention_heads,
      ModelDimension("model.attention_heads", m.attention_heads()));
  RETURN_IF_ERROR(ResolveLayerKinds(m, &base.geometry));
  return base;
}

// Fields left at zero or empty keep the preset's (or RopeConfig's) value.
absl::Status ApplyRopeOverrides(const v1::RopeConfig& r, RopeConfig* rope) {
  if (r.theta() != 0) rope->theta = r.theta();
  if (!r.scaling().empty()) {
    absl::StatusOr<RopeScaling> s = ParseRopeScaling(r.scaling());
    if (!s.ok()) return InField("rope.scaling", s.status());
    rope->scaling = *s;
  }
  if (r.factor() != 0) rope->factor = r.factor();
  if (r.low_freq_factor() != 0) rope->low_freq_factor = r.low_freq_factor();
  if (r.high_freq_factor() != 0) rope->high_freq_factor = r.high_freq_factor();
  if (r.original_max_position() != 0) {
    if (r.original_max_position() >
        static_cast<uint32_t>(std::numeric_limits<int>::max())) {
      return Invalid("rope.original_max_position",
                     absl::StrCat(r.original_max_position()));
    }
    rope->original_max_position = static_cast<int>(r.original_max_position());
  }
  if (r.beta_fast() != 0) rope->beta_fast = r.beta_fast();
  if (r.beta_slow() != 0) rope->beta_slow = r.beta_slow();
  if (r.rotary_dim() != 0) {
    ASSIGN_OR_RETURN(rope->rotary_dim,
                     ModelDimension("rope.rotary_dim", r.rotary_dim()));
  }
  if (!r.layout().empty()) {
    absl::StatusOr<RopeLayout> l = ParseRopeLayout(r.layout());
    if (!l.ok()) return InField("rope.layout", l.status());
    rope->layout = *l;
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelSpec> ResolveModel(const v1::Config& c,
                                       std::vector<std::string>* notes) {
  ASSIGN_OR_RETURN(BaseModel base, ResolveBaseModel(c.model()));
  ModelSpec spec;
  spec.geometry = base.geometry;
  spec.rope = base.rope;
  *notes = base.notes;
  if (c.kv_dtype().empty()) {
    // Only a config.json leaves kv_dtype unset (FillDefaults): engines keep
    // KV in the weights' dtype unless told to quantize it.
    spec.kv_dtype = base.weights_dtype.value_or(KvDtype::kFp16);
    notes->push_back(absl::StrCat(
        "kv_dtype not set: using ", KvDtypeName(spec.kv_dtype),
        base.weights_dtype ? " (the config.json's torch_dtype)" : ""));
  } else {
    absl::StatusOr<KvDtype> dtype = ParseKvDtype(c.kv_dtype());
    if (!dtype.ok()) return InField("kv_dtype", dtype.status());
    spec.kv_dtype = *dtype;
  }
  ASSIGN_OR_RETURN(spec.block_size,
                   ModelDimension("block_size", c.block_size()));
  RETURN_IF_ERROR(ApplyRopeOverrides(c.rope(), &spec.rope));
  spec.shift_allow = c.rope().shift() == v1::RopeConfig::ALLOW;
  RETURN_IF_ERROR(ValidateModelSpec(spec));
  return spec;
}

absl::Status ResolveListen(const v1::Config& c, ServerConfig* out) {
  absl::flat_hash_set<std::string> seen;
  bool network_ok = c.auth().mode() != v1::AuthConfig::NONE ||
                    c.auth().insecure_allow_unauthenticated_network();
  for (const std::string& text : c.listen()) {
    absl::StatusOr<ListenAddress> a = ParseListenAddress(text);
    if (!a.ok()) return InField("listen", a.status());
    if (!seen.insert(a->ToGrpcUri()).second) {
      return Invalid("listen", absl::StrCat("\"", text, "\" is given twice"));
    }
    if (!network_ok && !a->IsLoopback()) {
      return Invalid(
          "listen",
          absl::StrCat(
              "\"", text,
              "\" is reachable from the network but auth.mode is NONE: "
              "anyone could read and wipe every tenant's cache. Listen on "
              "loopback or a Unix socket, enable auth, or set "
              "auth.insecure_allow_unauthenticated_network"));
    }
    out->listen.push_back(*std::move(a));
  }
  absl::StatusOr<ListenAddress> metrics =
      ParseListenAddress(c.metrics_listen());
  if (!metrics.ok()) return InField("metrics_listen", metrics.status());
  if (metrics->kind != ListenAddress::Kind::kTcp) {
    return Invalid("metrics_listen", absl::StrCat("\"", c.metrics_listen(),
                                                  "\" must be host:port"));
  }
  out->metrics_listen = c.metrics_listen();
  return absl::OkStatus();
}

absl::StatusOr<CacheLimits> ResolveLimits(const v1::LimitsConfig& l) {
  CacheLimits lim;
  auto set = [](uint64_t v, size_t* field) {
    if (v != 0) *field = static_cast<size_t>(v);
  };
  set(l.max_tokens_per_request(), &lim.max_tokens_per_request);
  set(l.max_block_ids_per_request(), &lim.max_block_ids_per_request);
  set(l.max_namespaces_per_tenant(), &lim.max_namespaces_per_tenant);
  set(l.max_tenants(), &lim.max_tenants);
  set(l.max_leases_per_tenant(), &lim.max_leases_per_tenant);
  set(l.max_namespace_bytes(), &lim.max_namespace_bytes);
  if (!l.max_lease_ttl().empty()) {
    ASSIGN_OR_RETURN(
        lim.max_lease_ttl,
        ParsePositiveDuration("limits.max_lease_ttl", l.max_lease_ttl()));
  }
  return lim;
}

absl::StatusOr<TenantQuota> ResolveQuota(absl::string_view field,
                                         const std::string& reserved,
                                         const std::string& limit,
                                         uint64_t budget) {
  TenantQuota q;
  q.limit_bytes = budget;
  if (!reserved.empty()) {
    ASSIGN_OR_RETURN(
        q.reserved_bytes,
        ParseBytesField(absl::StrCat(field, ".reserved"), reserved));
  }
  if (!limit.empty()) {
    ASSIGN_OR_RETURN(q.limit_bytes,
                     ParseBytesField(absl::StrCat(field, ".limit"), limit));
  }
  return q;
}

// Names, duplicates and reservations against limits and the budget are
// checked by PrefixCache::Create, with the names and numbers in its errors.
absl::Status ResolveTenants(const v1::Config& c, CacheOptions* cache) {
  for (int i = 0; i < c.tenants_size(); ++i) {
    const v1::TenantConfig& t = c.tenants(i);
    ASSIGN_OR_RETURN(
        TenantQuota q,
        ResolveQuota(absl::StrCat("tenants[", i, "] (", t.name(), ")"),
                     t.reserved(), t.limit(), cache->budget_bytes));
    cache->tenants.push_back({t.name(), q});
  }
  // Auth off means every caller names its tenant freely (docs/security.md),
  // so tenants must be creatable on first use.
  cache->dynamic_tenants =
      c.auth().mode() == v1::AuthConfig::NONE || c.dynamic_tenants().enabled();
  ASSIGN_OR_RETURN(
      cache->default_quota,
      ResolveQuota("dynamic_tenants", c.dynamic_tenants().reserved(),
                   c.dynamic_tenants().limit(), cache->budget_bytes));
  return absl::OkStatus();
}

absl::Status ResolveEviction(const v1::EvictionConfig& e, CacheOptions* cache) {
  switch (e.policy()) {
    case v1::LRU:
      cache->eviction_policy = EvictionPolicy::kLru;
      break;
    case v1::ADAPTIVE:
      cache->eviction_policy = EvictionPolicy::kAdaptive;
      break;
    case v1::SHADOW:
      cache->eviction_policy = EvictionPolicy::kShadow;
      break;
    default:  // a number no name stands for (JSON accepts them)
      return Invalid(
          "eviction.policy",
          absl::StrCat(static_cast<int>(e.policy()),
                       " is not a policy; want LRU, ADAPTIVE or SHADOW"));
  }
  cache->eviction_history_blocks = e.history_blocks();
  return absl::OkStatus();
}

absl::Status ResolveCache(const v1::Config& c, ServerConfig* out) {
  CacheOptions& cache = out->cache;
  cache.block_size = out->model.block_size;
  ASSIGN_OR_RETURN(cache.block_bytes, BlockBytes(out->model));
  absl::StatusOr<uint64_t> budget =
      ParseKvBudget(c.kv_budget(), out->bytes_per_token);
  if (!budget.ok()) return InField("kv_budget", budget.status());
  cache.budget_bytes = *budget;
  cache.rope_shift =
      out->model.shift_allow ? RopeShift::kAllow : RopeShift::kDeny;
  ASSIGN_OR_RETURN(cache.limits, ResolveLimits(c.limits()));
  ASSIGN_OR_RETURN(cache.default_lease_ttl,
                   ParsePositiveDuration("lease_ttl", c.lease_ttl()));
  if (c.events_per_tenant() > (1u << 20)) {
    return Invalid("events_per_tenant",
                   absl::StrCat(c.events_per_tenant(), " exceeds ", 1u << 20));
  }
  cache.events_per_tenant = c.events_per_tenant();
  ASSIGN_OR_RETURN(uint64_t ring,
                   ParseBytesField("event_ring_bytes", c.event_ring_bytes()));
  constexpr uint64_t kMinRing = 4096, kMaxRing = uint64_t{1} << 30;
  if (ring < kMinRing || ring > kMaxRing) {
    return Invalid(
        "event_ring_bytes",
        absl::StrCat("\"", c.event_ring_bytes(), "\" (", ring,
                     " bytes) is not in ", kMinRing, "..", kMaxRing));
  }
  cache.event_ring_bytes = ring;
  RETURN_IF_ERROR(ResolveEviction(c.eviction(), &cache));
  return ResolveTenants(c, &cache);
}

absl::Status ResolveServing(const v1::Config& c, ServerConfig* out) {
  ASSIGN_OR_RETURN(uint64_t msg,
                   ParseBytesField("limits.max_message_size",
                                   c.limits().max_message_size()));
  constexpr uint64_t kMinMessage = 4096;
  constexpr uint64_t kMaxMessage = std::numeric_limits<int32_t>::max();
  if (msg < kMinMessage || msg > kMaxMessage) {
    return Invalid(
        "limits.max_message_size",
        absl::StrCat("\"", c.limits().max_message_size(), "\" (", msg,
                     " bytes) is not in ", kMinMessage, "..", kMaxMessage));
  }
  out->max_message_bytes = msg;
  const v1::LimitsConfig& l = c.limits();
  out->watch.max_streams_per_tenant = l.max_watch_streams_per_tenant();
  ASSIGN_OR_RETURN(uint64_t reply, ParseBytesField("limits.watch_reply_bytes",
                                                   l.watch_reply_bytes()));
  if (reply < kMinMessage || reply > msg) {
    return Invalid("limits.watch_reply_bytes",
                   absl::StrCat("\"", l.watch_reply_bytes(), "\" (", reply,
                                " bytes) is not in ", kMinMessage,
                                "..max_message_size (", msg, ")"));
  }
  out->watch.max_reply_bytes = reply;
  ASSIGN_OR_RETURN(out->watch.stall_timeout,
                   ParsePositiveDuration("limits.watch_stall_timeout",
                                         l.watch_stall_timeout()));
  if (l.max_concurrent_streams() > (1u << 20)) {
    return Invalid(
        "limits.max_concurrent_streams",
        absl::StrCat(l.max_concurrent_streams(), " exceeds ", 1u << 20));
  }
  out->max_concurrent_streams = static_cast<int>(l.max_concurrent_streams());
  ASSIGN_OR_RETURN(out->max_connection_idle,
                   ParsePositiveDuration("limits.max_connection_idle",
                                         l.max_connection_idle()));
  ASSIGN_OR_RETURN(uint64_t window,
                   ParseBytesField("limits.max_bytes_before_auth",
                                   l.max_bytes_before_auth()));
  if (window < kMinMessage || window > msg) {
    return Invalid("limits.max_bytes_before_auth",
                   absl::StrCat("\"", l.max_bytes_before_auth(), "\" (", window,
                                " bytes) is not in ", kMinMessage,
                                "..max_message_size (", msg, ")"));
  }
  out->max_bytes_before_auth = static_cast<int>(window);
  absl::StatusOr<absl::Duration> drain = ParseDuration(c.drain_timeout());
  if (!drain.ok()) return InField("drain_timeout", drain.status());
  out->drain_timeout = *drain;
  out->snapshot_path = c.snapshot_path();
  return absl::OkStatus();
}

// A source's registration: labels, and pinned to its rank when it names an
// instance.
absl::Status ReadSourceLabels(const v1::IndexSourceConfig& sc, IndexSource* s) {
  WorkerLabels& l = s->labels;
  l.address = sc.address();
  l.instance_id = sc.instance_id();
  l.tenant = sc.tenant();
  l.model = sc.model();
  l.dp_rank = sc.dp_rank();
  l.lora_name = sc.lora_name();
  l.salt = sc.salt();
  l.swa_window_tokens = sc.swa_window_tokens();
  s->pinned = !sc.instance_id().empty();
  if (absl::EqualsIgnoreCase(sc.type(), "Mooncake")) {
    l.hashes_are_keys = true;
  } else if (!sc.type().empty() && !absl::EqualsIgnoreCase(sc.type(), "vLLM") &&
             !absl::EqualsIgnoreCase(sc.type(), "SGLang")) {
    return Invalid(absl::StrCat("index.sources[", sc.name(), "].type"),
                   absl::StrCat("\"", absl::CEscape(sc.type()),
                                "\" is none of \"vLLM\", \"SGLang\", "
                                "\"Mooncake\""));
  }
  return absl::OkStatus();
}

// index.http_listen: host:port, and on the network only with auth on (as
// `listen`).
absl::Status ResolveIndexHttp(const v1::Config& c, ServerConfig* out) {
  const v1::IndexConfig& ic = c.index();
  out->index_state_dir = ic.state_dir();
  if (ic.http_listen().empty()) return absl::OkStatus();
  absl::StatusOr<ListenAddress> a = ParseListenAddress(ic.http_listen());
  if (!a.ok()) return InField("index.http_listen", a.status());
  if (a->kind != ListenAddress::Kind::kTcp) {
    return Invalid("index.http_listen", absl::StrCat("\"", ic.http_listen(),
                                                     "\" must be host:port"));
  }
  const bool network_ok = c.auth().mode() != v1::AuthConfig::NONE ||
                          c.auth().insecure_allow_unauthenticated_network();
  if (!network_ok && !a->IsLoopback()) {
    return Invalid(
        "index.http_listen",
        absl::StrCat("\"", ic.http_listen(),
                     "\" is reachable from the network but auth.mode is "
                     "NONE: anyone could register publishers. Listen on "
                     "loopback, enable auth, or set "
                     "auth.insecure_allow_unauthenticated_network"));
  }
  out->index_http_listen = ic.http_listen();
  if (ic.http_answer() == "by_instance") {
    out->index_http_answer = AnswerForm::kByInstance;
  } else if (!ic.http_answer().empty() && ic.http_answer() != "by_tenant") {
    return Invalid("index.http_answer",
                   absl::StrCat("\"", absl::CEscape(ic.http_answer()),
                                "\" is neither \"by_tenant\" nor "
                                "\"by_instance\""));
  }
  return absl::OkStatus();
}

// A weight of Pick's cost: finite and >= 0 (and <= `max`, if any).
absl::Status ReadWeight(absl::string_view field, bool has, double value,
                        double max, double* out) {
  if (!has) return absl::OkStatus();
  if (!(value >= 0 && value <= max)) {  // NaN fails too
    return Invalid(field, absl::StrCat(value, " is not between 0 and ", max));
  }
  *out = value;
  return absl::OkStatus();
}

absl::Status ReadPickWeights(const v1::IndexPickConfig& pc, PickerOptions* o) {
  constexpr double kHuge = 1e12;
  RETURN_IF_ERROR(ReadWeight("index.pick.prefill_weight",
                             pc.has_prefill_weight(), pc.prefill_weight(),
                             kHuge, &o->prefill_weight));
  RETURN_IF_ERROR(ReadWeight("index.pick.queued_weight", pc.has_queued_weight(),
                             pc.queued_weight(), kHuge, &o->queued_weight));
  RETURN_IF_ERROR(ReadWeight("index.pick.request_tokens",
                             pc.has_request_tokens(), pc.request_tokens(),
                             kHuge, &o->request_tokens));
  RETURN_IF_ERROR(ReadWeight("index.pick.kv_tokens", pc.has_kv_tokens(),
                             pc.kv_tokens(), kHuge, &o->kv_tokens));
  RETURN_IF_ERROR(ReadWeight("index.pick.churn_weight", pc.has_churn_weight(),
                             pc.churn_weight(), kHuge, &o->churn_weight));
  RETURN_IF_ERROR(ReadWeight("index.pick.affinity_tokens",
                             pc.has_affinity_tokens(), pc.affinity_tokens(),
                             kHuge, &o->affinity_tokens));
  RETURN_IF_ERROR(ReadWeight("index.pick.other_tier_credit",
                             pc.has_other_tier_credit(), pc.other_tier_credit(),
                             1, &o->other_tier_credit));
  RETURN_IF_ERROR(ReadWeight("index.pick.predicted_credit",
                             pc.has_predicted_credit(), pc.predicted_credit(),
                             1, &o->predicted_credit));
  if (pc.has_affinity_blocks()) {
    if (pc.affinity_blocks() > (1u << 20)) {
      return Invalid("index.pick.affinity_blocks",
                     absl::StrCat(pc.affinity_blocks(), " exceeds ", 1u << 20));
    }
    o->affinity_blocks = static_cast<int>(pc.affinity_blocks());
  }
  return absl::OkStatus();
}

absl::Status ReadTierCredits(const v1::IndexPickConfig& pc, PickerOptions* o) {
  // Sorted, so that the options do not depend on the map's order.
  std::vector<std::pair<std::string, double>> credits(pc.tier_credits().begin(),
                                                      pc.tier_credits().end());
  std::sort(credits.begin(), credits.end());
  for (const auto& [medium, credit] : credits) {
    const std::string field = absl::StrCat("index.pick.tier_credits[\"",
                                           absl::CHexEscape(medium), "\"]");
    if (medium.empty() || medium.size() > 64 ||
        medium.find('/') != std::string::npos) {
      return Invalid(field,
                     "a medium is a name of 1 to 64 bytes without '/' (GPU, "
                     "CPU, DISK, ...)");
    }
    double value = 0;
    RETURN_IF_ERROR(ReadWeight(field, true, credit, 1, &value));
    const std::string upper = absl::AsciiStrToUpper(medium);
    auto same =
        std::find_if(o->tier_credits.begin(), o->tier_credits.end(),
                     [&](const TierCredit& t) { return t.medium == upper; });
    if (same != o->tier_credits.end()) {
      same->credit = value;
    } else {
      o->tier_credits.push_back({upper, value});
    }
  }
  return absl::OkStatus();
}

// A worker an engine's load is filed under (`field` names it), named once
// among `seen`.
absl::Status CheckLoadWorker(const std::string& worker,
                             const std::string& field,
                             absl::flat_hash_set<std::string>* seen) {
  if (worker.empty() || worker.size() > 1024) {
    return Invalid(field, absl::StrCat("is ", worker.size(),
                                       " bytes: a worker name of 1 to 1,024 "
                                       "bytes"));
  }
  if (!seen->insert(worker).second) {
    return Invalid(field, absl::StrCat("\"", absl::CHexEscape(worker),
                                       "\" is named by an earlier entry too"));
  }
  return absl::OkStatus();
}

absl::Status ReadEngineMetricsTarget(const v1::EngineMetricsConfig& ec,
                                     const std::string& field,
                                     EngineMetricsTarget* t) {
  const std::string lower = absl::AsciiStrToLower(ec.url());
  const bool http =
      absl::StartsWith(lower, "http://") || absl::StartsWith(lower, "https://");
  const bool clean = std::none_of(ec.url().begin(), ec.url().end(), [](char c) {
    return absl::ascii_iscntrl(c) || c == ' ';
  });
  if (!http || !clean || ec.url().size() > 4096) {
    return Invalid(absl::StrCat(field, ".url"),
                   absl::StrCat("\"", absl::CHexEscape(ec.url().substr(0, 256)),
                                "\" is not an http:// or https:// URL of at "
                                "most 4,096 bytes without spaces"));
  }
  t->worker = ec.worker();
  t->url = ec.url();
  for (const auto& [name, value] : ec.labels()) {
    if (!IsLabelName(name)) {
      return Invalid(
          absl::StrCat(field, ".labels"),
          absl::StrCat("\"", absl::CHexEscape(name.substr(0, 256)),
                       "\" is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"));
    }
    t->labels.push_back({name, value});
  }
  // Sorted, so that the options do not depend on the map's order.
  std::sort(
      t->labels.begin(), t->labels.end(),
      [](const LabelPair& a, const LabelPair& b) { return a.name < b.name; });
  return absl::OkStatus();
}

// SGLang's load sockets (server/engine_load_feed.h).
absl::Status ReadEngineLoadSockets(const v1::IndexPickConfig& pc,
                                   std::vector<EngineLoadSocket>* out) {
  absl::flat_hash_set<std::string> workers;
  for (int i = 0; i < pc.engine_load_sockets_size(); ++i) {
    const v1::EngineLoadSocketConfig& c = pc.engine_load_sockets(i);
    const std::string field =
        absl::StrCat("index.pick.engine_load_sockets[", i, "]");
    RETURN_IF_ERROR(
        CheckLoadWorker(c.worker(), absl::StrCat(field, ".worker"), &workers));
    // tcp:// only: CheckEndpoint also admits ipc:// and inproc://.
    if (!absl::StartsWith(c.endpoint(), "tcp://") ||
        !CheckEndpoint(field, c.endpoint()).ok()) {
      return Invalid(absl::StrCat(field, ".endpoint"),
                     absl::StrCat("\"", absl::CHexEscape(c.endpoint()),
                                  "\" is not tcp://HOST:PORT"));
    }
    out->push_back({c.worker(), c.endpoint()});
  }
  return absl::OkStatus();
}

// The engines' metrics endpoints and load sockets Pick's load reads
// (server/engine_scraper.h, server/engine_load_feed.h).
absl::Status ResolveEngineMetrics(const v1::IndexPickConfig& pc,
                                  EngineScrapeOptions* o,
                                  std::vector<EngineLoadSocket>* sockets) {
  if (pc.engine_metrics().empty() && pc.engine_load_sockets().empty()) {
    return absl::OkStatus();
  }
  if (pc.replay_clock()) {
    return Invalid(pc.engine_metrics().empty()
                       ? "index.pick.engine_load_sockets"
                       : "index.pick.engine_metrics",
                   "is read on the daemon's clock, which "
                   "index.pick.replay_clock replaces with the requests'");
  }
  absl::flat_hash_set<std::string> workers;
  for (int i = 0; i < pc.engine_metrics_size(); ++i) {
    const std::string field =
        absl::StrCat("index.pick.engine_metrics[", i, "]");
    EngineMetricsTarget t;
    RETURN_IF_ERROR(ReadEngineMetricsTarget(pc.engine_metrics(i), field, &t));
    RETURN_IF_ERROR(
        CheckLoadWorker(t.worker, absl::StrCat(field, ".worker"), &workers));
    o->targets.push_back(std::move(t));
  }
  RETURN_IF_ERROR(ReadEngineLoadSockets(pc, sockets));
  if (!pc.engine_metrics_interval().empty()) {
    ASSIGN_OR_RETURN(o->interval,
                     ParsePositiveDuration("index.pick.engine_metrics_interval",
                                           pc.engine_metrics_interval()));
  }
  o->max_age = 3 * o->interval;
  if (!pc.engine_metrics_max_age().empty()) {
    ASSIGN_OR_RETURN(o->max_age,
                     ParsePositiveDuration("index.pick.engine_metrics_max_age",
                                           pc.engine_metrics_max_age()));
  }
  if (o->max_age < o->interval) {
    return Invalid("index.pick.engine_metrics_max_age",
                   absl::StrCat(absl::FormatDuration(o->max_age),
                                " is shorter than engine_metrics_interval (",
                                absl::FormatDuration(o->interval),
                                "): no reading would ever be fresh"));
  }
  o->timeout = o->interval;
  return absl::OkStatus();
}

// Pick's cost model, predicted blocks and window (index/picker.h), and the
// engines' metrics its load reads.
absl::Status ResolveIndexPick(const v1::IndexPickConfig& pc,
                              ServerConfig* out) {
  PickerOptions* o = &out->pick;
  RETURN_IF_ERROR(ReadPickWeights(pc, o));
  RETURN_IF_ERROR(ReadTierCredits(pc, o));
  if (!pc.predicted_ttl().empty()) {
    ASSIGN_OR_RETURN(
        o->predicted_ttl,
        ParsePositiveDuration("index.pick.predicted_ttl", pc.predicted_ttl()));
  }
  if (!pc.load_window().empty()) {
    ASSIGN_OR_RETURN(
        o->load_window,
        ParsePositiveDuration("index.pick.load_window", pc.load_window()));
  }
  if (!pc.churn_window().empty()) {
    ASSIGN_OR_RETURN(
        o->churn_window,
        ParsePositiveDuration("index.pick.churn_window", pc.churn_window()));
  }
  constexpr uint64_t kMaxEntries = uint64_t{1} << 28;
  if (pc.max_predicted() > kMaxEntries) {
    return Invalid("index.pick.max_predicted",
                   absl::StrCat(pc.max_predicted(), " exceeds ", kMaxEntries));
  }
  if (pc.max_predicted() > 0) o->max_predicted = pc.max_predicted();
  if (pc.max_window_picks() > kMaxEntries) {
    return Invalid(
        "index.pick.max_window_picks",
        absl::StrCat(pc.max_window_picks(), " exceeds ", kMaxEntries));
  }
  if (pc.max_window_picks() > 0) o->max_window_picks = pc.max_window_picks();
  o->replay_clock = pc.replay_clock();
  return ResolveEngineMetrics(pc, &out->engine_scrape,
                              &out->engine_load_sockets);
}

// The whole file at `path`; NOT_FOUND with the system's reason ("No such
// file or directory") when it cannot be opened.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The config file at `path`, or NOT_FOUND naming it.
absl::StatusOr<std::string> ReadConfigText(const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (text.ok()) return text;
  return absl::NotFoundError(absl::StrCat("cannot read config file ", path,
                                          ": ", text.status().message()));
}

// The key in the file at `path`, surrounding white space left out.
absl::StatusOr<std::string> ReadApiKey(absl::string_view field,
                                       const std::string& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) {
    return Invalid(field, absl::StrCat("\"", path, "\" cannot be read: ",
                                       text.status().message()));
  }
  std::string key(absl::StripAsciiWhitespace(*text));
  if (key.empty())
    return Invalid(field, absl::StrCat("\"", path, "\" is empty"));
  if (absl::StrContains(key, '\n') || absl::StrContains(key, '\r')) {
    return Invalid(field,
                   absl::StrCat("\"", path, "\" holds more than one line"));
  }
  return key;
}

// A pool's workers are each their own instance at their own address:
// neither may be configured for all of them.
absl::Status CheckPoolLabels(const std::string& field, const SglangWorker& w) {
  for (const auto& [name, value] :
       {std::pair{"instance_id", &w.labels.instance_id},
        std::pair{"address", &w.labels.address}}) {
    if (w.pool && !value->empty()) {
      return Invalid(absl::StrCat(field, ".", name),
                     absl::StrCat("\"", *value,
                                  "\" names one worker; each worker of a "
                                  "server_info_pool is its own, named "
                                  "<name>/<address>:<port>"));
    }
  }
  return absl::OkStatus();
}

// A source with a server_info_url: an SGLang worker followed by URL
// (server/sglang_discovery.h), checked as a source is.
absl::Status ResolveSglangWorker(const v1::IndexSourceConfig& sc,
                                 ServerConfig* out) {
  const std::string field = absl::StrCat("index.sources[", sc.name(), "]");
  if (!sc.endpoint().empty() || !sc.replay_endpoint().empty()) {
    return Invalid(absl::StrCat(field, ".server_info_url"),
                   "is set with endpoint or replay_endpoint; the worker's "
                   "/server_info names its sockets");
  }
  if (!sc.type().empty() && !absl::EqualsIgnoreCase(sc.type(), "SGLang")) {
    return Invalid(absl::StrCat(field, ".type"),
                   absl::StrCat("\"", absl::CEscape(sc.type()),
                                "\" with a server_info_url; only SGLang "
                                "serves /server_info"));
  }
  if (absl::StatusOr<std::string> host = WorkerHost(sc.server_info_url());
      !host.ok()) {
    return Invalid(absl::StrCat(field, ".server_info_url"),
                   host.status().message());
  }
  SglangWorker w;
  w.name = sc.name();
  w.url = sc.server_info_url();
  if (!sc.server_info_api_key_file().empty()) {
    ASSIGN_OR_RETURN(
        w.api_key, ReadApiKey(absl::StrCat(field, ".server_info_api_key_file"),
                              sc.server_info_api_key_file()));
  }
  if (sc.replay_port() > 65535) {
    return Invalid(absl::StrCat(field, ".replay_port"),
                   absl::StrCat(sc.replay_port(), " is not a port (0-65535)"));
  }
  w.replay_port = static_cast<int>(sc.replay_port());
  if (w.name.empty() || absl::StrContains(w.name, '/')) {
    return Invalid(absl::StrCat(field, ".name"),
                   "must be non-empty and contain no '/' (it names the "
                   "worker of rank 0; rank r is <name>/dp<r>)");
  }
  IndexSource labels;
  RETURN_IF_ERROR(ReadSourceLabels(sc, &labels));
  w.labels = labels.labels;
  w.pool = sc.server_info_pool();
  RETURN_IF_ERROR(CheckPoolLabels(field, w));
  if (!sc.resolve_interval().empty()) {
    ASSIGN_OR_RETURN(w.interval, ParsePositiveDuration(
                                     absl::StrCat(field, ".resolve_interval"),
                                     sc.resolve_interval()));
  }
  for (const SglangWorker& other : out->sglang_discovery.workers) {
    if (other.name == w.name) {
      return Invalid(field, "the name is used twice");
    }
  }
  out->sglang_discovery.workers.push_back(std::move(w));
  return absl::OkStatus();
}

// index.sources: engines' event streams, and SGLang workers by URL.
absl::Status ResolveIndexSources(const v1::IndexConfig& ic, ServerConfig* out) {
  IngestOptions& in = out->ingest;
  out->sglang_discovery.block_size = out->index.block_size;
  for (const v1::IndexSourceConfig& sc : ic.sources()) {
    if (!sc.server_info_url().empty()) {
      RETURN_IF_ERROR(ResolveSglangWorker(sc, out));
      continue;
    }
    IndexSource s;
    s.name = sc.name();
    s.endpoint = sc.endpoint();
    s.replay_endpoint = sc.replay_endpoint();
    s.replay_port = static_cast<int>(sc.replay_port());
    RETURN_IF_ERROR(ReadSourceLabels(sc, &s));
    if (!sc.resolve_interval().empty()) {
      ASSIGN_OR_RETURN(
          s.resolve_interval,
          ParsePositiveDuration(
              absl::StrCat("index.sources[", sc.name(), "].resolve_interval"),
              sc.resolve_interval()));
    }
    in.sources.push_back(std::move(s));
  }
  for (const SglangWorker& w : out->sglang_discovery.workers) {
    for (const IndexSource& s : in.sources) {
      if (s.name == w.name) {
        return Invalid(absl::StrCat("index.sources[", w.name, "]"),
                       "the name is used twice");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveIndex(const v1::Config& c, ServerConfig* out) {
  const v1::IndexConfig& ic = c.index();
  out->index_enabled = !ic.sources().empty() || !ic.listen().empty() ||
                       !ic.http_listen().empty();
  RETURN_IF_ERROR(ResolveIndexHttp(c, out));
  if (ic.block_size() > (1u << 16)) {
    return Invalid("index.block_size",
                   absl::StrCat(ic.block_size(), " exceeds ", 1u << 16));
  }
  out->index.block_size = static_cast<int>(ic.block_size());
  out->index.max_entries = ic.max_entries();
  if (ic.hash_profile() == "xxh3") {
    out->index.hash_profile = HashProfile::kRfcXxh3;
  } else if (!ic.hash_profile().empty() && ic.hash_profile() != "conductor") {
    return Invalid("index.hash_profile",
                   absl::StrCat("\"", absl::CEscape(ic.hash_profile()),
                                "\" is neither \"conductor\" nor \"xxh3\""));
  }
  if (ic.hash_seed() != 0 && out->index.hash_profile != HashProfile::kRfcXxh3) {
    return Invalid("index.hash_seed",
                   absl::StrCat(ic.hash_seed(),
                                " is set but only the \"xxh3\" profile is "
                                "seeded (the Conductor's XXH64 uses seed 0)"));
  }
  out->index.hash_seed = ic.hash_seed();
  out->index.key_lookup = !ic.http_listen().empty();  // for /query_by_hash
  RETURN_IF_ERROR(ResolveIndexPick(ic.pick(), out));
  IngestOptions& in = out->ingest;
  in.listen = ic.listen();
  ASSIGN_OR_RETURN(
      in.replay_timeout,
      ParsePositiveDuration("index.replay_timeout", ic.replay_timeout()));
  ASSIGN_OR_RETURN(const uint64_t decode_budget,
                   ParseBytesField("index.decode_budget", ic.decode_budget()));
  if (decode_budget < (uint64_t{1} << 20) ||
      decode_budget > (uint64_t{1} << 50)) {
    return Invalid(
        "index.decode_budget",
        absl::StrCat(decode_budget, " bytes is not between 1 MiB and 1 PiB"));
  }
  in.decode_budget_bytes = static_cast<int64_t>(decode_budget);
  RETURN_IF_ERROR(ResolveIndexSources(ic, out));
  RETURN_IF_ERROR(ValidateIngestOptions(in));
  return absl::OkStatus();
}

absl::Status ResolveEventsPublish(const v1::Config& c, ServerConfig* out) {
  const v1::EventsPublishConfig& ec = c.events_publish();
  out->events_publish_enabled = !ec.endpoint().empty();
  if (!out->events_publish_enabled) {
    if (!ec.replay_endpoint().empty()) {
      return Invalid("events_publish.endpoint",
                     "is empty, but replay_endpoint is set (a replay needs "
                     "the PUB socket)");
    }
    return absl::OkStatus();
  }
  KvPublisherOptions& o = out->events_publish;
  o.endpoint = ec.endpoint();
  o.replay_endpoint = ec.replay_endpoint();
  o.topic = ec.topic();
  o.buffer_batches = ec.buffer_batches();
  RETURN_IF_ERROR(ValidateKvPublisherOptions(o));
  PublishLimits& l = out->events_publish_limits;
  ASSIGN_OR_RETURN(
      l.buffer_bytes,
      ParseBytesField("events_publish.buffer_bytes", ec.buffer_bytes()));
  ASSIGN_OR_RETURN(l.queue_bytes, ParseBytesField("events_publish.queue_bytes",
                                                  ec.queue_bytes()));
  ASSIGN_OR_RETURN(l.stall_timeout,
                   ParsePositiveDuration("events_publish.stall_timeout",
                                         ec.stall_timeout()));
  RETURN_IF_ERROR(ValidatePublishLimits(l));
  // Stores must carry their tokens, and a tenant's reset the IDs it removed.
  out->cache.detailed_events = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Config> ReadConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadConfigText(path));
  v1::Config config;
  if (absl::EndsWith(path, ".json")) {
    auto s = google::protobuf::util::JsonStringToMessage(text, &config);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file ", path, " (JSON): ", s.ToString()));
    }
    return config;
  }
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, ":", errors.error()));
  }
  return config;
}

absl::StatusOr<v1::Config> ReadConfigFiles(
    const std::vector<std::string>& paths) {
  if (paths.size() == 1) return ReadConfigFile(paths[0]);
  std::string joined;
  std::vector<std::pair<std::string, int>> files;
  int lines = 0;
  for (const std::string& path : paths) {
    if (absl::EndsWith(path, ".json")) {
      return absl::InvalidArgumentError(
          absl::StrCat("config file ", path,
                       ": only textproto files can be joined into one config "
                       "(",
                       absl::StrJoin(paths, ", "), ")"));
    }
    ASSIGN_OR_RETURN(std::string t, ReadConfigText(path));
    files.emplace_back(path, lines);
    if (!t.empty() && t.back() != '\n') t += '\n';
    lines += static_cast<int>(std::count(t.begin(), t.end(), '\n'));
    joined += t;
  }
  v1::Config config;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors(std::move(files));
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(joined, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", errors.error()));
  }
  return config;
}

namespace {

// --index_source: NAME=ENDPOINT[,REPLAY], or NAME=http(s)://... (an SGLang
// worker's URL), replacing the config file's sources.
void SetIndexSources(const CommandLine& flags, v1::Config* config) {
  v1::IndexConfig* index = config->mutable_index();
  index->clear_sources();
  for (const std::string& flag : flags.index_sources) {
    // NAME=ENDPOINT[,REPLAY] (ParseCommandLine checked the '=').
    const size_t eq = flag.find('=');
    v1::IndexSourceConfig* s = index->add_sources();
    s->set_name(flag.substr(0, eq));
    const std::string rest = flag.substr(eq + 1);
    if (absl::StartsWith(rest, "http://") ||
        absl::StartsWith(rest, "https://")) {
      s->set_server_info_url(rest);  // an SGLang worker's URL
      continue;
    }
    const size_t comma = rest.find(',');
    s->set_endpoint(rest.substr(0, comma));
    if (comma != std::string::npos)
      s->set_replay_endpoint(rest.substr(comma + 1));
  }
}

}  // namespace

void ApplyCommandLine(const CommandLine& flags, v1::Config* config) {
  if (!flags.listen.empty()) {
    config->clear_listen();
    for (const std::string& a : flags.listen) config->add_listen(a);
  }
  if (flags.metrics_listen) config->set_metrics_listen(*flags.metrics_listen);
  if (flags.model) {
    config->clear_model();
    if (absl::EndsWith(*flags.model, ".json")) {
      config->mutable_model()->set_hf_config_path(*flags.model);
    } else {
      config->mutable_model()->set_preset(*flags.model);
    }
  }
  if (flags.kv_dtype) config->set_kv_dtype(*flags.kv_dtype);
  if (flags.block_size) config->set_block_size(*flags.block_size);
  if (flags.kv_budget) config->set_kv_budget(*flags.kv_budget);
  if (flags.lease_ttl) config->set_lease_ttl(*flags.lease_ttl);
  if (flags.snapshot_path) config->set_snapshot_path(*flags.snapshot_path);
  if (!flags.index_sources.empty()) SetIndexSources(flags, config);
  if (flags.index_listen)
    config->mutable_index()->set_listen(*flags.index_listen);
  if (flags.index_http_listen)
    config->mutable_index()->set_http_listen(*flags.index_http_listen);
  if (flags.index_state_dir)
    config->mutable_index()->set_state_dir(*flags.index_state_dir);
  if (flags.index_http_answer)
    config->mutable_index()->set_http_answer(*flags.index_http_answer);
  if (flags.index_block_size)
    config->mutable_index()->set_block_size(*flags.index_block_size);
  if (flags.index_decode_budget)
    config->mutable_index()->set_decode_budget(*flags.index_decode_budget);
  if (flags.eviction_policy) {
    // ParseCommandLine stored the enum's name.
    v1::EvictionPolicy policy = v1::LRU;
    v1::EvictionPolicy_Parse(*flags.eviction_policy, &policy);
    config->mutable_eviction()->set_policy(policy);
  }
  if (flags.events_publish) {
    // ENDPOINT[,REPLAY_ENDPOINT]
    v1::EventsPublishConfig* p = config->mutable_events_publish();
    const size_t comma = flags.events_publish->find(',');
    p->set_endpoint(flags.events_publish->substr(0, comma));
    p->set_replay_endpoint(comma == std::string::npos
                               ? ""
                               : flags.events_publish->substr(comma + 1));
  }
}

void FillDefaults(v1::Config* c) {
  auto fill = [](std::string* field, const char* value) {
    if (field->empty()) *field = value;
  };
  if (c->listen().empty()) {
    c->add_listen(defaults::kTcpListen);
    c->add_listen(defaults::kUnixListen);
  }
  fill(c->mutable_metrics_listen(), defaults::kMetricsListen);
  const v1::ModelConfig& m = c->model();
  if (m.preset().empty() && m.hf_config_path().empty() && m.layers() == 0 &&
      m.kv_heads() == 0 && m.head_dim() == 0) {
    c->mutable_model()->set_preset(defaults::kModel);
  }
  // With a config.json, ResolveModel takes the weights' dtype instead.
  if (c->model().hf_config_path().empty())
    fill(c->mutable_kv_dtype(), defaults::kKvDtype);
  if (c->block_size() == 0) c->set_block_size(defaults::kBlockSize);
  fill(c->mutable_kv_budget(), defaults::kKvBudget);
  fill(c->mutable_lease_ttl(), defaults::kLeaseTtl);
  fill(c->mutable_drain_timeout(), defaults::kDrainTimeout);
  if (c->events_per_tenant() == 0)
    c->set_events_per_tenant(defaults::kEventsPerTenant);
  fill(c->mutable_event_ring_bytes(), defaults::kEventRingBytes);
  v1::LimitsConfig* lim = c->mutable_limits();
  if (lim->max_watch_streams_per_tenant() == 0)
    lim->set_max_watch_streams_per_tenant(defaults::kMaxWatchStreamsPerTenant);
  fill(lim->mutable_watch_reply_bytes(), defaults::kWatchReplyBytes);
  fill(lim->mutable_watch_stall_timeout(), defaults::kWatchStallTimeout);
  if (lim->max_concurrent_streams() == 0)
    lim->set_max_concurrent_streams(defaults::kMaxConcurrentStreams);
  fill(lim->mutable_max_connection_idle(), defaults::kMaxConnectionIdle);
  fill(lim->mutable_max_bytes_before_auth(), defaults::kMaxBytesBeforeAuth);
  if (c->auth().mode() == v1::AuthConfig::MODE_UNSPECIFIED) {
    c->mutable_auth()->set_mode(v1::AuthConfig::NONE);
  }
  if (c->rope().shift() == v1::RopeConfig::SHIFT_UNSPECIFIED) {
    c->mutable_rope()->set_shift(v1::RopeConfig::DENY);
  }
  fill(c->mutable_limits()->mutable_max_message_size(),
       defaults::kMaxMessageSize);
  v1::IndexConfig* index = c->mutable_index();
  if (index->block_size() == 0)
    index->set_block_size(defaults::kIndexBlockSize);
  if (index->max_entries() == 0)
    index->set_max_entries(defaults::kIndexMaxEntries);
  fill(index->mutable_replay_timeout(), defaults::kIndexReplayTimeout);
  fill(index->mutable_hash_profile(), defaults::kIndexHashProfile);
  fill(index->mutable_http_answer(), defaults::kIndexHttpAnswer);
  fill(index->mutable_decode_budget(), defaults::kIndexDecodeBudget);
  v1::EventsPublishConfig* publish = c->mutable_events_publish();
  if (publish->buffer_batches() == 0) {
    publish->set_buffer_batches(defaults::kEventsPublishBufferBatches);
  }
  fill(publish->mutable_buffer_bytes(), defaults::kEventsPublishBufferBytes);
  fill(publish->mutable_queue_bytes(), defaults::kEventsPublishQueueBytes);
  fill(publish->mutable_stall_timeout(), defaults::kEventsPublishStallTimeout);
}

absl::StatusOr<ServerConfig> ResolveConfig(const v1::Config& config) {
  ServerConfig out;
  out.proto = config;
  RETURN_IF_ERROR(ResolveListen(config, &out));
  ASSIGN_OR_RETURN(out.model, ResolveModel(config, &out.model_notes));
  ASSIGN_OR_RETURN(out.bytes_per_token, BytesPerToken(out.model));
  out.fingerprint = Fingerprint(out.model);
  out.model_description = DescribeModel(out.model);
  RETURN_IF_ERROR(ResolveCache(config, &out));
  RETURN_IF_ERROR(ResolveServing(config, &out));
  RETURN_IF_ERROR(ValidateAuthConfig(config));
  RETURN_IF_ERROR(ResolveIndex(config, &out));
  RETURN_IF_ERROR(ResolveEventsPublish(config, &out));
  return out;
}

absl::StatusOr<ServerConfig> LoadServerConfig(const CommandLine& flags) {
  v1::Config config;
  if (!flags.config_paths.empty()) {
    ASSIGN_OR_RETURN(config, ReadConfigFiles(flags.config_paths));
  }
  ApplyCommandLine(flags, &config);
  FillDefaults(&config);
  return ResolveConfig(config);
}

std::string DescribeModel(const ModelSpec& spec) {
  const ModelGeometry& g = spec.geometry;
  const RopeConfig& r = spec.rope;
  std::string rope = absl::StrFormat("RoPE theta %g", r.theta);
  if (r.scaling != RopeScaling::kNone) {
    absl::StrAppendFormat(&rope, " %s x%g", RopeScalingName(r.scaling),
                          r.factor);
  }
  absl::StrAppend(&rope, " ", RopeLayoutName(r.layout), ", shift ",
                  spec.shift_allow ? "ALLOW" : "DENY");
  std::string layers =
      g.kv_lora_rank > 0
          ? absl::StrFormat("%d layers x MLA (%d + %d)", g.layers,
                            g.kv_lora_rank, g.head_dim)
          : absl::StrFormat("%d layers x %d KV heads x %d head_dim", g.layers,
                            g.kv_heads, g.head_dim);
  if (g.sliding_layers > 0) {
    absl::StrAppendFormat(&layers, " (%d sliding over %d tokens)",
                          g.sliding_layers, g.sliding_window);
  }
  if (g.state_layers > 0) {
    absl::StrAppendFormat(&layers, " + %d state layers", g.state_layers);
  }
  return absl::StrFormat("%s: %s, %s, %s", g.name.empty() ? "custom" : g.name,
                         layers, KvDtypeName(spec.kv_dtype), rope);
}

std::string DescribeEviction(const CacheOptions& o, uint64_t budget_blocks) {
  std::string out(EvictionPolicyName(o.eviction_policy));
  if (o.eviction_policy != EvictionPolicy::kLru) {
    const uint64_t times = o.eviction_policy == EvictionPolicy::kShadow ? 4 : 1;
    const uint64_t history = o.eviction_history_blocks == 0
                                 ? times * budget_blocks
                                 : o.eviction_history_blocks;
    absl::StrAppend(&out, ", history ", FormatCount(history),
                    " blocks per tenant");
  }
  return out;
}

std::vector<std::string> ExposureWarnings(const ServerConfig& c) {
  std::vector<std::string> out;
  const std::string& listen = c.ingest.listen;
  if (c.index_enabled && !listen.empty() && !IsLoopbackEndpoint(listen)) {
    out.push_back(absl::StrCat(
        "index listen ", listen,
        " takes KV events from every host that can reach it, unauthenticated: "
        "any of them can add or clear blocks of any worker name. Keep it on a "
        "private network (docs/index.md, Limits)"));
  }
  return out;
}

std::string ModelAndSizeLines(const ServerConfig& c, uint64_t budget_blocks,
                              absl::string_view indent) {
  const CacheOptions& o = c.cache;
  std::string out;
  const auto line = [&](absl::string_view label, absl::string_view value) {
    absl::StrAppend(&out, indent, absl::StrFormat("%-13s", label), value, "\n");
  };
  line("model", c.model_description);
  for (const std::string& note : c.model_notes) line("note", note);
  line("fingerprint", c.fingerprint);
  line("block size", absl::StrCat(o.block_size, " tokens"));
  line("bytes/token", absl::StrCat(FormatCount(c.bytes_per_token), " (",
                                   FormatBytes(c.bytes_per_token), ")"));
  line("block bytes", absl::StrCat(FormatCount(o.block_bytes), " (",
                                   FormatBytes(o.block_bytes), ")"));
  line("budget",
       absl::StrCat(
           FormatCount(o.budget_bytes), " bytes (", FormatBytes(o.budget_bytes),
           ") = ", FormatCount(budget_blocks), " blocks = ",
           FormatCount(budget_blocks * static_cast<uint64_t>(o.block_size)),
           " tokens"));
  line("eviction", DescribeEviction(o, budget_blocks));
  return out;
}

}  // namespace prefixd
