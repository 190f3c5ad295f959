#include "server/service.h"

#include <google/protobuf/arena.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/message_allocator.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <forward_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/arena_allocator.h"
#include "server/grpc_status.h"
#include "server/request_util.h"

namespace prefixd {
namespace {

// A WatchEvents call refused before it starts.
class FailedStream final
    : public grpc::ServerWriteReactor<v1::WatchEventsResponse> {
 public:
  explicit FailedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

absl::Duration TtlFromMs(uint64_t ms) {
  // Beyond int64 milliseconds no limit could allow it anyway; the cache
  // reports it against max_lease_ttl.
  if (ms > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InfiniteDuration();
  }
  return absl::Milliseconds(static_cast<int64_t>(ms));
}

uint64_t ToMs(absl::Duration d) {
  return static_cast<uint64_t>(
      std::max<int64_t>(0, absl::ToInt64Milliseconds(d)));
}

template <typename T>
void AddAll(const std::vector<T>& from,
            google::protobuf::RepeatedField<T>* to) {
  to->Add(from.begin(), from.end());
}

void LimitsToProto(const CacheLimits& l, uint64_t max_message_bytes,
                   v1::Limits* out) {
  out->set_max_tokens_per_request(l.max_tokens_per_request);
  out->set_max_block_ids_per_request(l.max_block_ids_per_request);
  out->set_max_namespaces_per_tenant(l.max_namespaces_per_tenant);
  out->set_max_tenants(l.max_tenants);
  out->set_max_leases_per_tenant(l.max_leases_per_tenant);
  out->set_max_namespace_bytes(l.max_namespace_bytes);
  out->set_max_message_bytes(max_message_bytes);
  out->set_max_position(l.max_position);
  out->set_max_lease_ttl_ms(ToMs(l.max_lease_ttl));
}

void TenantStatsToProto(const TenantUsage& t, uint64_t block_bytes,
                        v1::TenantStats* out) {
  out->set_tenant(t.tenant);
  out->set_cached_blocks(t.cached_blocks);
  out->set_cached_bytes(t.cached_blocks * block_bytes);
  out->set_pinned_blocks(t.pinned_blocks);
  out->set_pinned_bytes(t.pinned_blocks * block_bytes);
  out->set_tree_nodes(t.tree_nodes);
  out->set_namespaces(t.namespaces);
  out->set_active_leases(t.active_leases);
  out->set_reserved_bytes(t.reserved_bytes);
  out->set_limit_bytes(t.limit_bytes);
  out->set_match_requests(t.match_requests);
  out->set_match_tokens(t.match_tokens);
  out->set_match_hit_tokens(t.match_hit_tokens);
  out->set_insert_requests(t.insert_requests);
  out->set_inserted_blocks(t.inserted_blocks);
  out->set_redundant_blocks(t.redundant_blocks);
  out->set_lease_expired(t.lease_expired);
  for (int r = 0; r < kNumEvictReasons; ++r) {
    v1::EvictionCount* e = out->add_evictions();
    e->set_reason(std::string(EvictReasonName(static_cast<EvictReason>(r))));
    e->set_blocks(t.evicted_blocks[r]);
    e->set_bytes(t.evicted_blocks[r] * block_bytes);
  }
  for (int r = 0; r < 3; ++r) {
    v1::RetentionCount* c = out->add_retention();
    c->set_retention(kRetentionClassNames[r]);
    c->set_cached_blocks(t.cached_blocks_by_retention[r]);
    c->set_evicted_blocks(t.evicted_blocks_by_retention[r]);
  }
}

absl::StatusOr<MatchQuery> MatchFromProto(const v1::MatchRequest& req, int item,
                                          TokenCopies* copies) {
  MatchQuery m;
  ASSIGN_OR_RETURN(absl::Span<const Token> tokens,
                   RequestTokens(req, item, copies));
  m.ns = req.namespace_();
  m.tokens = tokens;
  m.position_offset = req.position_offset();
  m.pin = req.pin();
  m.lease_ttl = TtlFromMs(req.lease_ttl_ms());
  return m;
}

void MatchResultToProto(const MatchResult& r, uint64_t epoch,
                        v1::MatchResponse* resp) {
  resp->set_epoch(epoch);
  resp->set_matched_tokens(r.matched_tokens);
  for (const Segment& s : r.segments) {
    v1::Segment* out = resp->add_segments();
    AddAll(s.block_ids, out->mutable_block_ids());
    out->set_cached_position(s.cached_position);
    out->set_rope_delta(s.rope_delta);
  }
  resp->set_lease_id(r.lease_id);
  if (r.rope_denied.has_value()) {
    v1::RopeDenied* denied = resp->mutable_rope_denied();
    denied->set_requested_position(r.rope_denied->requested_position);
    denied->set_cached_position(r.rope_denied->cached_position);
  }
}

// "retention.priority", or "retention.ranges[2].priority" for range 2.
std::string RetentionField(int range, absl::string_view name) {
  return range < 0 ? absl::StrCat("retention.", name)
                   : absl::StrCat("retention.ranges[", range, "].", name);
}

// The wire's unsigned numbers in core's types. Core validates the hint
// (priorities up to 100, ranges); only what would not survive the
// conversion is refused here, in the same words.
absl::StatusOr<int> RetentionPriority(uint32_t value, int range, int item) {
  if (value > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(ItemPrefix(item), RetentionField(range, "priority"), " ",
                     value, " is above ", kMaxRetentionPriority));
  }
  return static_cast<int>(value);
}

absl::StatusOr<absl::Duration> RetentionDuration(uint64_t ms, int range,
                                                 int item) {
  constexpr auto kMax =
      static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (ms > kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat(ItemPrefix(item), RetentionField(range, "duration_ms"),
                     " ", ms, " is above ", kMax));
  }
  return absl::Milliseconds(static_cast<int64_t>(ms));
}

absl::StatusOr<Retention> RetentionFromProto(const v1::Retention& r, int item) {
  Retention out;
  if (r.has_priority()) {
    ASSIGN_OR_RETURN(out.priority, RetentionPriority(r.priority(), -1, item));
  }
  ASSIGN_OR_RETURN(out.duration, RetentionDuration(r.duration_ms(), -1, item));
  out.ranges.reserve(r.ranges_size());
  for (int i = 0; i < r.ranges_size(); ++i) {
    const v1::RetentionRange& in = r.ranges(i);
    RetentionRange& range = out.ranges.emplace_back();
    range.token_begin = in.token_begin();
    range.token_end = in.token_end();
    ASSIGN_OR_RETURN(range.priority, RetentionPriority(in.priority(), i, item));
    ASSIGN_OR_RETURN(range.duration,
                     RetentionDuration(in.duration_ms(), i, item));
  }
  return out;
}

absl::StatusOr<InsertRequest> InsertFromProto(const v1::InsertRequest& req,
                                              int item, TokenCopies* copies) {
  InsertRequest in;
  ASSIGN_OR_RETURN(absl::Span<const Token> tokens,
                   RequestTokens(req, item, copies));
  in.ns = req.namespace_();
  in.tokens = tokens;
  in.block_ids =
      absl::MakeConstSpan(req.block_ids().data(), req.block_ids_size());
  in.position_offset = req.position_offset();
  in.pin = req.pin();
  in.lease_ttl = TtlFromMs(req.lease_ttl_ms());
  if (req.has_retention()) {
    ASSIGN_OR_RETURN(in.retention, RetentionFromProto(req.retention(), item));
  }
  return in;
}

void InsertResultToProto(const InsertResult& r, uint64_t epoch,
                         v1::InsertResponse* resp) {
  resp->set_epoch(epoch);
  resp->set_cached_tokens(r.cached_tokens);
  AddAll(r.redundant_block_ids, resp->mutable_redundant_block_ids());
  AddAll(r.evicted_block_ids, resp->mutable_evicted_block_ids());
  resp->set_lease_id(r.lease_id);
}

}  // namespace

struct PrefixCacheService::Allocators {
  ArenaAllocator<v1::MatchRequest, v1::MatchResponse, kUnaryBlock> match;
  ArenaAllocator<v1::InsertRequest, v1::InsertResponse, kUnaryBlock> insert;
  ArenaAllocator<v1::MatchBatchRequest, v1::MatchBatchResponse, kBatchBlock>
      match_batch;
  ArenaAllocator<v1::InsertBatchRequest, v1::InsertBatchResponse, kBatchBlock>
      insert_batch;
};

ServiceInfo ServiceInfo::From(const ServerConfig& config, uint64_t epoch) {
  ServiceInfo info;
  info.epoch = epoch;
  info.fingerprint = config.fingerprint;
  info.fingerprint_text = FingerprintText(config.model);
  info.model_description = config.model_description;
  info.bytes_per_token = config.bytes_per_token;
  info.max_message_bytes = config.max_message_bytes;
  info.version = PREFIXD_VERSION;
  return info;
}

PrefixCacheService::PrefixCacheService(PrefixCache* cache,
                                       const Authorizer* auth,
                                       EventWatchers* watchers,
                                       ServiceInfo info, RpcObserver* observer)
    : cache_(cache),
      auth_(auth),
      watchers_(watchers),
      info_(std::move(info)),
      observer_(observer),
      allocators_(std::make_unique<Allocators>()) {
  SetMessageAllocatorFor_Match(&allocators_->match);
  SetMessageAllocatorFor_Insert(&allocators_->insert);
  SetMessageAllocatorFor_MatchBatch(&allocators_->match_batch);
  SetMessageAllocatorFor_InsertBatch(&allocators_->insert_batch);
}

PrefixCacheService::~PrefixCacheService() = default;

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* PrefixCacheService::Unary(
    absl::string_view method, grpc::CallbackServerContext* ctx, const Req* req,
    Resp* resp, Handler<Req, Resp> handler) {
  const absl::Time start = absl::Now();
  absl::StatusOr<CallContext> call = auth_->Authorize(*ctx);
  absl::Status status =
      call.ok() ? (this->*handler)(*call, *req, resp) : call.status();
  if (observer_ != nullptr)
    observer_->OnRpcDone(method, status.code(), absl::Now() - start);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// --- Handlers ---------------------------------------------------------------

absl::Status PrefixCacheService::DoGetInfo(const CallContext&,
                                           const v1::GetInfoRequest&,
                                           v1::GetInfoResponse* resp) {
  const CacheOptions& o = cache_->options();
  resp->set_epoch(info_.epoch);
  resp->set_block_size(static_cast<uint32_t>(o.block_size));
  resp->set_block_bytes(o.block_bytes);
  resp->set_budget_bytes(o.budget_bytes);
  resp->set_budget_blocks(cache_->budget_blocks());
  resp->set_bytes_per_token(info_.bytes_per_token);
  resp->set_model_fingerprint(info_.fingerprint);
  resp->set_model(info_.model_description);
  resp->set_rope_shift(o.rope_shift == RopeShift::kAllow ? "ALLOW" : "DENY");
  LimitsToProto(o.limits, info_.max_message_bytes, resp->mutable_limits());
  resp->set_version(info_.version);
  resp->set_auth_mode(std::string(auth_->mode()));
  resp->set_default_lease_ttl_ms(ToMs(o.default_lease_ttl));
  resp->set_eviction_policy(std::string(EvictionPolicyName(o.eviction_policy)));
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoHandshake(const CallContext&,
                                             const v1::HandshakeRequest& req,
                                             v1::HandshakeResponse* resp) {
  if (req.model_fingerprint().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_fingerprint is empty; send the engine's model fingerprint (the "
        "daemon's is ",
        info_.fingerprint, ")"));
  }
  if (absl::AsciiStrToLower(req.model_fingerprint()) != info_.fingerprint) {
    std::string detail;
    if (req.model_fingerprint_text().empty()) {
      detail = absl::StrCat("the daemon's settings: ", info_.fingerprint_text);
    } else {
      detail = DescribeDifference(req.model_fingerprint_text(),
                                  info_.fingerprint_text);
      detail = detail.empty()
                   ? "the texts agree: the engine hashed its text wrongly"
                   : absl::StrCat("engine vs daemon: ", detail);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "model fingerprint mismatch: engine \"", req.engine_id(), "\" sent ",
        req.model_fingerprint(), ", the daemon serves ", info_.fingerprint,
        "; ", detail,
        ". Block IDs would not name the same KV for both: configure both with "
        "the same model, kv_dtype, block_size and RoPE settings"));
  }
  resp->set_epoch(info_.epoch);
  resp->set_model_fingerprint(info_.fingerprint);
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoMatch(const CallContext& call,
                                         const v1::MatchRequest& req,
                                         v1::MatchResponse* resp) {
  RETURN_IF_ERROR(RequireTenant(call));
  TokenCopies copies;
  ASSIGN_OR_RETURN(MatchQuery m, MatchFromProto(req, -1, &copies));
  ASSIGN_OR_RETURN(MatchResult r, cache_->Match(call.tenant, m));
  MatchResultToProto(r, info_.epoch, resp);
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoInsert(const CallContext& call,
                                          const v1::InsertRequest& req,
                                          v1::InsertResponse* resp) {
  RETURN_IF_ERROR(RequireTenant(call));
  TokenCopies copies;
  ASSIGN_OR_RETURN(InsertRequest in, InsertFromProto(req, -1, &copies));
  ASSIGN_OR_RETURN(InsertResult r, cache_->Insert(call.tenant, in, call.scope));
  watchers_->Notify();
  InsertResultToProto(r, info_.epoch, resp);
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoRelease(const CallContext& call,
                                           const v1::ReleaseRequest& req,
                                           v1::ReleaseResponse*) {
  RETURN_IF_ERROR(RequireTenant(call));
  return cache_->Release(call.tenant, req.lease_id());
}

absl::Status PrefixCacheService::DoKeepAlive(const CallContext& call,
                                             const v1::KeepAliveRequest& req,
                                             v1::KeepAliveResponse* resp) {
  RETURN_IF_ERROR(RequireTenant(call));
  ASSIGN_OR_RETURN(std::vector<absl::Duration> left,
                   cache_->KeepAlive(
                       call.tenant, absl::MakeConstSpan(req.lease_ids().data(),
                                                        req.lease_ids_size())));
  for (absl::Duration d : left) resp->add_expires_in_ms(ToMs(d));
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoEvict(const CallContext& call,
                                         const v1::EvictRequest& req,
                                         v1::EvictResponse* resp) {
  ASSIGN_OR_RETURN(std::vector<BlockId> evicted,
                   cache_->Evict(call.scope, req.blocks()));
  watchers_->Notify();
  AddAll(evicted, resp->mutable_evicted_block_ids());
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoInvalidate(const CallContext& call,
                                              const v1::InvalidateRequest& req,
                                              v1::InvalidateResponse* resp) {
  ASSIGN_OR_RETURN(std::vector<BlockId> removed,
                   cache_->Invalidate(
                       call.scope, absl::MakeConstSpan(req.block_ids().data(),
                                                       req.block_ids_size())));
  watchers_->Notify();
  AddAll(removed, resp->mutable_removed_block_ids());
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoReset(const CallContext& call,
                                         const v1::ResetRequest& req,
                                         v1::ResetResponse* resp) {
  TenantScope scope = TenantScope::One(call.tenant);
  if (req.all()) {
    if (!req.tenant().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Reset names tenant \"", req.tenant(), "\" and all=true; pick one"));
    }
    if (!call.all_tenants) {
      return absl::PermissionDeniedError(absl::StrCat(
          "principal \"", call.principal, "\" may not reset all tenants"));
    }
    scope = TenantScope::All();
  } else if (!req.tenant().empty()) {
    if (!call.all_tenants && !call.scope.Contains(req.tenant())) {
      return absl::PermissionDeniedError(
          absl::StrCat("principal \"", call.principal,
                       "\" may not reset tenant \"", req.tenant(), "\""));
    }
    scope = TenantScope::One(req.tenant());
  } else {
    RETURN_IF_ERROR(RequireTenant(call));
  }
  AddAll(cache_->Reset(scope), resp->mutable_removed_block_ids());
  watchers_->Notify();
  resp->set_epoch(info_.epoch);
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoStats(const CallContext& call,
                                         const v1::StatsRequest& req,
                                         v1::StatsResponse* resp) {
  if (req.all_tenants() && !call.all_tenants) {
    return absl::PermissionDeniedError(
        absl::StrCat("principal \"", call.principal,
                     "\" may not read the stats of all tenants"));
  }
  if (!req.all_tenants()) {
    RETURN_IF_ERROR(RequireTenant(call));
  }
  CacheStats s = cache_->Stats(
      req.all_tenants() ? TenantScope::All() : TenantScope::One(call.tenant));
  resp->set_epoch(info_.epoch);
  resp->set_block_size(static_cast<uint32_t>(s.block_size));
  resp->set_block_bytes(s.block_bytes);
  resp->set_budget_bytes(s.budget_bytes);
  resp->set_budget_blocks(s.budget_blocks);
  for (const TenantUsage& t : s.tenants) {
    TenantStatsToProto(t, s.block_bytes, resp->add_tenants());
  }
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoDump(const CallContext& call,
                                        const v1::DumpRequest& req,
                                        v1::DumpResponse* resp) {
  RETURN_IF_ERROR(RequireTenant(call));
  ASSIGN_OR_RETURN(std::vector<std::string> namespaces,
                   cache_->Namespaces(call.tenant));
  absl::StatusOr<std::vector<DumpNode>> nodes =
      cache_->Dump(call.tenant, req.namespace_());
  // A namespace without blocks is an empty tree, not an error: the list of
  // namespaces in the response says what exists.
  if (!nodes.ok() && nodes.status().code() != absl::StatusCode::kNotFound) {
    return nodes.status();
  }
  resp->set_epoch(info_.epoch);
  for (const std::string& ns : namespaces) resp->add_namespaces(ns);
  if (!nodes.ok()) return absl::OkStatus();
  for (const DumpNode& n : *nodes) {
    v1::DumpNode* out = resp->add_nodes();
    out->set_depth(static_cast<uint32_t>(n.depth));
    out->set_position(n.position);
    out->set_stamp(n.stamp);
    out->set_pins(static_cast<uint32_t>(n.pins));
    AddAll(n.tokens, out->mutable_tokens());
    AddAll(n.block_ids, out->mutable_block_ids());
  }
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoMatchBatch(const CallContext& call,
                                              const v1::MatchBatchRequest& req,
                                              v1::MatchBatchResponse* resp) {
  RETURN_IF_ERROR(RequireTenant(call));
  RETURN_IF_ERROR(
      CheckBatch("MatchBatch", req.requests(), cache_->options().limits));
  // A malformed item (tokens_le32) fails the whole batch, before any work.
  std::vector<MatchQuery> batch;
  TokenCopies copies;
  batch.reserve(req.requests_size());
  for (int i = 0; i < req.requests_size(); ++i) {
    ASSIGN_OR_RETURN(MatchQuery m, MatchFromProto(req.requests(i), i, &copies));
    batch.push_back(std::move(m));
  }
  std::vector<absl::StatusOr<MatchResult>> results =
      cache_->MatchBatch(call.tenant, batch);
  resp->set_epoch(info_.epoch);
  resp->mutable_results()->Reserve(static_cast<int>(results.size()));
  for (const absl::StatusOr<MatchResult>& r : results) {
    v1::MatchBatchItem* item = resp->add_results();
    if (r.ok()) {
      MatchResultToProto(*r, info_.epoch, item->mutable_response());
    } else {
      SetItemStatus(r.status(), item);
    }
  }
  return absl::OkStatus();
}

absl::Status PrefixCacheService::DoInsertBatch(
    const CallContext& call, const v1::InsertBatchRequest& req,
    v1::InsertBatchResponse* resp) {
  RETURN_IF_ERROR(RequireTenant(call));
  RETURN_IF_ERROR(
      CheckBatch("InsertBatch", req.requests(), cache_->options().limits));
  std::vector<InsertRequest> batch;
  TokenCopies copies;
  batch.reserve(req.requests_size());
  for (int i = 0; i < req.requests_size(); ++i) {
    ASSIGN_OR_RETURN(InsertRequest in,
                     InsertFromProto(req.requests(i), i, &copies));
    batch.push_back(std::move(in));
  }
  std::vector<absl::StatusOr<InsertResult>> results =
      cache_->InsertBatch(call.tenant, batch, call.scope);
  resp->set_epoch(info_.epoch);
  resp->mutable_results()->Reserve(static_cast<int>(results.size()));
  bool changed = false;
  for (const absl::StatusOr<InsertResult>& r : results) {
    v1::InsertBatchItem* item = resp->add_results();
    if (r.ok()) {
      changed = true;
      InsertResultToProto(*r, info_.epoch, item->mutable_response());
    } else {
      SetItemStatus(r.status(), item);
    }
  }
  if (changed) watchers_->Notify();
  return absl::OkStatus();
}

// --- RPC entry points -------------------------------------------------------

grpc::ServerUnaryReactor* PrefixCacheService::GetInfo(
    grpc::CallbackServerContext* ctx, const v1::GetInfoRequest* req,
    v1::GetInfoResponse* resp) {
  return Unary("GetInfo", ctx, req, resp, &PrefixCacheService::DoGetInfo);
}
grpc::ServerUnaryReactor* PrefixCacheService::Handshake(
    grpc::CallbackServerContext* ctx, const v1::HandshakeRequest* req,
    v1::HandshakeResponse* resp) {
  return Unary("Handshake", ctx, req, resp, &PrefixCacheService::DoHandshake);
}
grpc::ServerUnaryReactor* PrefixCacheService::Match(
    grpc::CallbackServerContext* ctx, const v1::MatchRequest* req,
    v1::MatchResponse* resp) {
  return Unary("Match", ctx, req, resp, &PrefixCacheService::DoMatch);
}
grpc::ServerUnaryReactor* PrefixCacheService::Insert(
    grpc::CallbackServerContext* ctx, const v1::InsertRequest* req,
    v1::InsertResponse* resp) {
  return Unary("Insert", ctx, req, resp, &PrefixCacheService::DoInsert);
}
grpc::ServerUnaryReactor* PrefixCacheService::Release(
    grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* req,
    v1::ReleaseResponse* resp) {
  return Unary("Release", ctx, req, resp, &PrefixCacheService::DoRelease);
}
grpc::ServerUnaryReactor* PrefixCacheService::KeepAlive(
    grpc::CallbackServerContext* ctx, const v1::KeepAliveRequest* req,
    v1::KeepAliveResponse* resp) {
  return Unary("KeepAlive", ctx, req, resp, &PrefixCacheService::DoKeepAlive);
}
grpc::ServerUnaryReactor* PrefixCacheService::Evict(
    grpc::CallbackServerContext* ctx, const v1::EvictRequest* req,
    v1::EvictResponse* resp) {
  return Unary("Evict", ctx, req, resp, &PrefixCacheService::DoEvict);
}
grpc::ServerUnaryReactor* PrefixCacheService::Invalidate(
    grpc::CallbackServerContext* ctx, const v1::InvalidateRequest* req,
    v1::InvalidateResponse* resp) {
  return Unary("Invalidate", ctx, req, resp, &PrefixCacheService::DoInvalidate);
}
grpc::ServerUnaryReactor* PrefixCacheService::Reset(
    grpc::CallbackServerContext* ctx, const v1::ResetRequest* req,
    v1::ResetResponse* resp) {
  return Unary("Reset", ctx, req, resp, &PrefixCacheService::DoReset);
}
grpc::ServerUnaryReactor* PrefixCacheService::Stats(
    grpc::CallbackServerContext* ctx, const v1::StatsRequest* req,
    v1::StatsResponse* resp) {
  return Unary("Stats", ctx, req, resp, &PrefixCacheService::DoStats);
}
grpc::ServerUnaryReactor* PrefixCacheService::Dump(
    grpc::CallbackServerContext* ctx, const v1::DumpRequest* req,
    v1::DumpResponse* resp) {
  return Unary("Dump", ctx, req, resp, &PrefixCacheService::DoDump);
}

grpc::ServerUnaryReactor* PrefixCacheService::MatchBatch(
    grpc::CallbackServerContext* ctx, const v1::MatchBatchRequest* req,
    v1::MatchBatchResponse* resp) {
  return Unary("MatchBatch", ctx, req, resp, &PrefixCacheService::DoMatchBatch);
}
grpc::ServerUnaryReactor* PrefixCacheService::InsertBatch(
    grpc::CallbackServerContext* ctx, const v1::InsertBatchRequest* req,
    v1::InsertBatchResponse* resp) {
  return Unary("InsertBatch", ctx, req, resp,
               &PrefixCacheService::DoInsertBatch);
}

grpc::ServerWriteReactor<v1::WatchEventsResponse>*
PrefixCacheService::WatchEvents(grpc::CallbackServerContext* ctx,
                                const v1::WatchEventsRequest* req) {
  const absl::Time start = absl::Now();
  absl::StatusOr<CallContext> call = auth_->Authorize(*ctx);
  if (call.ok() && call->tenant.empty()) call = RequireTenant(*call);
  if (observer_ != nullptr) {
    observer_->OnRpcDone("WatchEvents", call.status().code(),
                         absl::Now() - start);
  }
  if (!call.ok()) return new FailedStream(ToGrpcStatus(call.status()));
  return watchers_->Start(
      ctx, call->tenant, req->from_sequence(),
      [auth = auth_, credentials = CallCredentials::Of(*ctx),
       tenant = call->tenant] {
        return StillAuthorized(*auth, credentials, tenant);
      });
}

}  // namespace prefixd
