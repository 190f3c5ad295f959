#include "server/index_service.h"

#include <grpcpp/server_context.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/grpc_status.h"
#include "server/pick_request.h"
#include "server/request_util.h"
#include "server/route_request.h"
#include "server/unary_call.h"

namespace prefixd {
namespace {

// The index's own tenant rule: see the top of index_service.h.
absl::Status MayRoute(const CallContext& call, absl::string_view salt,
                      int item) {
  if (call.index_all) return absl::OkStatus();
  if (salt.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        ItemPrefix(item), "principal \"", call.principal,
        "\" may Route only with one of its cache_salts; this request has "
        "none"));
  }
  if (std::find(call.cache_salts.begin(), call.cache_salts.end(), salt) ==
      call.cache_salts.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat(ItemPrefix(item), "principal \"", call.principal,
                     "\" may not Route with cache_salt \"", salt,
                     "\": it is not among the principal's cache_salts"));
  }
  return absl::OkStatus();
}

void RouteToProto(const RouteResult& r, int block_size,
                  v1::RouteResponse* out) {
  out->set_best_worker(r.best_worker.data(), r.best_worker.size());
  out->set_prompt_blocks(r.prompt_blocks);
  out->set_block_size(static_cast<uint32_t>(block_size));
  out->mutable_workers()->Reserve(static_cast<int>(r.workers.size()));
  for (const WorkerMatch& m : r.workers) {
    v1::WorkerMatch* w = out->add_workers();
    w->set_worker(m.worker.data(), m.worker.size());
    w->set_matched_blocks(m.matched_blocks);
    w->set_full_attention_blocks(m.full_attention_blocks);
    for (const RouteMedium& c : m.mediums) {
      v1::MediumMatch* mm = w->add_mediums();
      mm->set_medium(c.medium.data(), c.medium.size());
      mm->set_matched_blocks(c.blocks);
    }
    w->set_state(static_cast<v1::WorkerState>(m.state));
    w->set_last_seq(m.last_seq);
    w->set_lag_ms(m.lag_ms);
  }
}

void PickToProto(const PickResult& r, int block_size, v1::PickResponse* out) {
  out->set_worker(r.worker.data(), r.worker.size());
  out->set_decision_id(r.decision_id);
  out->set_prompt_blocks(r.prompt_blocks);
  out->set_block_size(static_cast<uint32_t>(block_size));
  out->mutable_ranked()->Reserve(static_cast<int>(r.ranked.size()));
  for (const PickCandidate& c : r.ranked) {
    v1::PickCandidate* p = out->add_ranked();
    p->set_worker(c.worker.data(), c.worker.size());
    p->set_cost(c.cost);
    p->set_prefill_tokens(c.prefill_tokens);
    p->set_load_term(c.load_term);
    p->set_churn_term(c.churn_term);
    p->set_churn_tokens(c.churn_tokens);
    p->set_affinity_term(c.affinity_term);
    p->set_matched_blocks(c.matched_blocks);
    p->set_predicted_blocks(c.predicted_blocks);
    p->set_credited_blocks(c.credited_blocks);
    p->set_state(static_cast<v1::WorkerState>(c.state));
    p->set_load_from_request(c.load_from_request);
    p->set_load_from_engine(c.load_from_engine);
    p->set_requests_in_flight(c.requests_in_flight);
    p->set_queued_prefill_tokens(
        static_cast<int64_t>(c.queued_prefill_tokens + 0.5));
    p->set_kv_usage(c.kv_usage);
  }
}

// The Picker's own errors name the fields; in a batch, the item too.
absl::Status InItem(const absl::Status& s, int item) {
  if (s.ok() || item < 0) return s;
  return absl::Status(s.code(), absl::StrCat(ItemPrefix(item), s.message()));
}

void WorkersToProto(const IndexStats& stats, int block_size,
                    v1::ListWorkersResponse* resp) {
  resp->set_block_size(static_cast<uint32_t>(block_size));
  resp->set_entries(stats.entries);
  resp->set_max_entries(stats.max_entries);
  for (const WorkerStatus& w : stats.workers) {
    v1::WorkerInfo* out = resp->add_workers();
    out->set_worker(w.worker);
    out->set_endpoint(w.endpoint);
    out->set_state(static_cast<v1::WorkerState>(w.state));
    out->set_state_detail(w.state_detail);
    for (const MediumCount& m : w.mediums) {
      v1::MediumBlocks* mb = out->add_mediums();
      mb->set_medium(m.medium);
      mb->set_blocks(m.blocks);
    }
    out->set_events(w.events);
    out->set_gaps(w.gaps);
    out->set_replays(w.replays_ok + w.replays_failed);
    out->set_dropped_blocks(w.dropped_blocks);
    out->set_last_seq(w.last_seq);
    out->set_last_event_unix_ms(w.last_event_unix_ms);
    uint64_t clears = 0;
    for (uint64_t c : w.clears) clears += c;
    out->set_clears(clears);
    out->set_last_error(w.last_error);
    out->set_event_version(w.event_version);
    v1::WorkerLabels* labels = out->mutable_labels();
    labels->set_instance_id(w.labels.instance_id);
    labels->set_tenant(w.labels.tenant);
    labels->set_model(w.labels.model);
    labels->set_dp_rank(w.labels.dp_rank);
    labels->set_lora_name(w.labels.lora_name);
    labels->set_salt(w.labels.salt);
    labels->set_address(w.labels.address);
    labels->set_hashes_are_keys(w.labels.hashes_are_keys);
    for (const GroupStatus& g : w.groups) {
      v1::KvCacheGroup* group = out->add_groups();
      group->set_group(static_cast<uint32_t>(g.group));
      group->set_kind(std::string(GroupKindName(g.rule.kind)));
      group->set_window_blocks(g.rule.window_blocks);
    }
  }
}

}  // namespace

PrefixIndexService::PrefixIndexService(const KvIndex* index, Picker* picker,
                                       const Authorizer* auth,
                                       CacheLimits limits,
                                       RouteLimits route_limits,
                                       RpcObserver* observer)
    : index_(index),
      picker_(picker),
      auth_(auth),
      limits_(limits),
      route_limits_(route_limits),
      observer_(observer) {
  SetMessageAllocatorFor_Route(&route_messages_);
  SetMessageAllocatorFor_RouteBatch(&route_batch_messages_);
}

absl::Status PrefixIndexService::DoRoute(const CallContext& call,
                                         const v1::RouteRequest& req, int item,
                                         v1::RouteResponse* resp) const {
  RouteRequestReader reader;
  RETURN_IF_ERROR(
      reader.Read(req, item, limits_, index_->options().block_size));
  // The salt the Route runs with: the request's, or its extra keys'.
  RETURN_IF_ERROR(MayRoute(call, reader.query().cache_salt, item));
  RouteToProto(index_->Route(reader.query()), index_->options().block_size,
               resp);
  return absl::OkStatus();
}

absl::Status PrefixIndexService::DoPick(const CallContext& call,
                                        const v1::PickRequest& req, int item,
                                        v1::PickResponse* resp) const {
  PickRequestReader reader;
  RETURN_IF_ERROR(
      reader.Read(req, item, limits_, index_->options().block_size));
  RETURN_IF_ERROR(MayRoute(call, reader.query().prompt.cache_salt, item));
  absl::StatusOr<PickResult> r = picker_->Pick(reader.query(), absl::Now());
  if (!r.ok()) return InItem(r.status(), item);
  PickToProto(*r, index_->options().block_size, resp);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* PrefixIndexService::Route(
    grpc::CallbackServerContext* ctx, const v1::RouteRequest* req,
    v1::RouteResponse* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "Route", [&](const CallContext& call) {
        FilterSize filter;
        filter.Add(*req);
        RETURN_IF_ERROR(CheckFilterSize("Route", filter, route_limits_));
        RETURN_IF_ERROR(DoRoute(call, *req, -1, resp));
        AnswerBudget answer("Route", route_limits_.max_answer_bytes);
        return answer.Add(AnswerBytes(*resp), -1, 1);
      });
}

grpc::ServerUnaryReactor* PrefixIndexService::RouteBatch(
    grpc::CallbackServerContext* ctx, const v1::RouteBatchRequest* req,
    v1::RouteBatchResponse* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "RouteBatch", [&](const CallContext& call) {
        RETURN_IF_ERROR(CheckBatch("RouteBatch", req->requests(), limits_));
        FilterSize filter;
        for (const v1::RouteRequest& r : req->requests()) filter.Add(r);
        RETURN_IF_ERROR(CheckFilterSize("RouteBatch", filter, route_limits_));
        AnswerBudget answer("RouteBatch", route_limits_.max_answer_bytes);
        const int n = req->requests_size();
        resp->mutable_responses()->Reserve(n);
        for (int i = 0; i < n; ++i) {
          v1::RouteBatchItem* item = resp->add_responses();
          absl::Status s =
              DoRoute(call, req->requests(i), i, item->mutable_response());
          if (!s.ok()) {
            item->clear_response();
            SetItemStatus(s, item);
          }
          // Stops building as soon as the answer is too big, not after.
          RETURN_IF_ERROR(answer.Add(AnswerBytes(*item), i, n));
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* PrefixIndexService::Pick(
    grpc::CallbackServerContext* ctx, const v1::PickRequest* req,
    v1::PickResponse* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "Pick", [&](const CallContext& call) {
        FilterSize filter;
        filter.Add(*req);
        RETURN_IF_ERROR(CheckFilterSize("Pick", filter, route_limits_));
        RETURN_IF_ERROR(DoPick(call, *req, -1, resp));
        AnswerBudget answer("Pick", route_limits_.max_answer_bytes);
        return answer.Add(AnswerBytes(*resp), -1, 1);
      });
}

// In order: each item sees the blocks predicted for the ones before it.
grpc::ServerUnaryReactor* PrefixIndexService::PickBatch(
    grpc::CallbackServerContext* ctx, const v1::PickBatchRequest* req,
    v1::PickBatchResponse* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "PickBatch", [&](const CallContext& call) {
        RETURN_IF_ERROR(CheckBatch("PickBatch", req->requests(), limits_));
        FilterSize filter;
        for (const v1::PickRequest& r : req->requests()) filter.Add(r);
        RETURN_IF_ERROR(CheckFilterSize("PickBatch", filter, route_limits_));
        AnswerBudget answer("PickBatch", route_limits_.max_answer_bytes);
        const int n = req->requests_size();
        resp->mutable_responses()->Reserve(n);
        for (int i = 0; i < n; ++i) {
          v1::PickBatchItem* item = resp->add_responses();
          absl::Status s =
              DoPick(call, req->requests(i), i, item->mutable_response());
          if (!s.ok()) {
            item->clear_response();
            SetItemStatus(s, item);
          }
          RETURN_IF_ERROR(answer.Add(AnswerBytes(*item), i, n));
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* PrefixIndexService::ListWorkers(
    grpc::CallbackServerContext* ctx, const v1::ListWorkersRequest*,
    v1::ListWorkersResponse* resp) {
  return UnaryCall(
      ctx, *auth_, observer_, "ListWorkers", [&](const CallContext& call) {
        if (!call.index_all) {
          return absl::PermissionDeniedError(absl::StrCat(
              "principal \"", call.principal,
              "\" may not list the index's workers: ListWorkers needs "
              "an ENGINE or ADMIN principal"));
        }
        WorkersToProto(index_->Stats(), index_->options().block_size, resp);
        return absl::OkStatus();
      });
}

}  // namespace prefixd
