#include "server/watch.h"

#include <grpcpp/server_context.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/grpc_status.h"

namespace prefixd {

// One WatchEvents call. Owned jointly by gRPC (until OnDone) and by whoever
// holds a Ref() to poll or end it, so the poller never touches a stream
// that gRPC has already let go of.
class EventStream final
    : public grpc::ServerWriteReactor<v1::WatchEventsResponse> {
 public:
  EventStream(EventWatchers* owner, grpc::CallbackServerContext* ctx,
              std::string tenant, uint64_t from_sequence,
              StreamAccessCheck still_allowed)
      : owner_(owner),
        ctx_(ctx),
        tenant_(std::move(tenant)),
        still_allowed_(std::move(still_allowed)),
        next_(from_sequence == 0 ? 1 : from_sequence),
        ignore_first_missed_(from_sequence == 0) {
    if (grpc::Status s = owner_->Register(this); !s.ok()) {
      RequestFinish(s);
      return;
    }
    // Once registered, a later EndRevoked sees this stream; a reload that
    // came between the call's authorization and here is caught now.
    if (absl::Status allowed = StillAllowed(); !allowed.ok()) {
      RequestFinish(ToGrpcStatus(allowed));
      return;
    }
    Poll();
  }

  const std::string& tenant() const { return tenant_; }

  // OK while the stream may go on (see EventWatchers::EndRevoked).
  absl::Status StillAllowed() const {
    return still_allowed_ ? still_allowed_() : absl::OkStatus();
  }

  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Sends the next batch if no write is in flight and there is something to
  // say. (A tenant that does not exist yet reads as one without events.)
  void Poll() {
    grpc::Status error;
    {
      MutexLock lock(&mu_);
      if (writing_ || finish_requested_) return;
      absl::StatusOr<EventBatch> batch =
          owner_->cache_->ReadEvents(tenant_, next_, EventWatchers::kMaxBatch);
      if (batch.ok()) {
        bool missed = batch->missed && !ignore_first_missed_;
        ignore_first_missed_ = false;
        if (batch->events.empty() && !missed) return;
        FillResponse(*batch, missed);
        writing_ = true;
        write_started_ = absl::Now();
      } else {
        error = ToGrpcStatus(batch.status());
        finish_requested_ = finished_ = true;
      }
    }
    if (error.ok()) {
      StartWrite(&response_);
    } else {
      Finish(error);
    }
  }

  // A reply the client has not taken for longer than `timeout` (it does not
  // read, so flow control holds the reply here): ends the stream, which
  // frees the reply. The client sees CANCELLED; the status below is what
  // the daemon records.
  void CancelIfStalled(absl::Time now, absl::Duration timeout) {
    std::string stall_message;
    {
      MutexLock lock(&mu_);
      if (!writing_ || finish_requested_ || now - write_started_ <= timeout)
        return;
      finish_requested_ = true;
      stall_message =
          absl::StrCat("WatchEvents stream of tenant '", tenant_,
                       "' stalled: a reply of ", response_.ByteSizeLong(),
                       " bytes was not read within limits.watch_stall_timeout ",
                       absl::FormatDuration(timeout));
      finish_status_ = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat(stall_message, "; reconnect from next_sequence"));
      // Until TryCancel returns the call must not finish (OnWriteDone
      // waits for it), or ctx_ could be gone when it is used.
      cancelling_ = true;
    }
    // One line for the operator: the client only sees CANCELLED.
    std::fprintf(stderr, "prefixd: %s; cancelled\n", stall_message.c_str());
    ctx_->TryCancel();  // the stuck write completes (not ok)
    bool finish_now = false;
    grpc::Status finish;
    {
      MutexLock lock(&mu_);
      cancelling_ = false;
      if (finish_deferred_ && !finished_) {
        finished_ = finish_now = true;
        finish = finish_status_;
      }
    }
    if (finish_now) Finish(finish);
  }

  // Ends the call with `status` now, or after the write in flight.
  void RequestFinish(grpc::Status status) {
    {
      MutexLock lock(&mu_);
      if (finish_requested_) return;
      finish_requested_ = true;
      finish_status_ = status;
      if (writing_) return;  // OnWriteDone finishes
      finished_ = true;
    }
    Finish(status);
  }

  void OnWriteDone(bool ok) override {
    bool finish_now = false;
    grpc::Status finish;
    {
      MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && !finish_requested_) {
        finish_requested_ = true;
        finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED,
                                      "write failed: client gone");
      }
      if (finish_requested_) {
        if (finished_) return;
        if (cancelling_) {  // CancelIfStalled finishes once TryCancel returned
          finish_deferred_ = true;
          return;
        }
        finished_ = true;
        finish_now = true;
        finish = finish_status_;
      }
    }
    if (finish_now) {
      Finish(finish);
      return;
    }
    Poll();  // continue a backlog without waiting for the poller
  }

  void OnCancel() override {
    RequestFinish(
        grpc::Status(grpc::StatusCode::CANCELLED, "WatchEvents cancelled"));
  }

  void OnDone() override {
    owner_->Unregister(this);
    Unref();
  }

 private:
  void FillResponse(const EventBatch& batch, bool missed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    response_.Clear();
    response_.set_epoch(owner_->epoch_);
    // One reply holds events up to max_reply_bytes (at least one event):
    // the most a stream has in flight. The rest goes in the next reply.
    uint64_t next = batch.next_sequence;
    size_t bytes = 0;
    for (const Event& e : batch.events) {
      if (response_.events_size() > 0 &&
          bytes + WireBytes(e) > owner_->limits_.max_reply_bytes) {
        next = e.sequence;
        break;
      }
      bytes += WireBytes(e);
      EventToProto(e, response_.add_events());
    }
    response_.set_missed_events(missed);
    response_.set_next_sequence(next);
    next_ = next;
  }

  // At most what one event takes on the wire (varints of up to 10 bytes).
  static size_t WireBytes(const Event& e) {
    return 64 + e.ns.size() + 10 * e.block_ids.size();
  }

  EventWatchers* const owner_;
  grpc::CallbackServerContext* const ctx_;
  const std::string tenant_;
  const StreamAccessCheck still_allowed_;
  std::atomic<int> refs_{1};  // gRPC's, dropped in OnDone
  Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_);
  bool ignore_first_missed_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time write_started_ ABSL_GUARDED_BY(mu_);
  bool cancelling_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_deferred_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish() called
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  v1::WatchEventsResponse response_;  // owned by gRPC while writing_
};

EventWatchers::EventWatchers(const PrefixCache* cache, uint64_t epoch,
                             absl::Duration poll_interval, WatchLimits limits)
    : cache_(cache),
      epoch_(epoch),
      limits_(limits),
      poller_(poll_interval, [this] { PollAll(); }) {}

EventWatchers::~EventWatchers() { poller_.Stop(); }

grpc::ServerWriteReactor<v1::WatchEventsResponse>* EventWatchers::Start(
    grpc::CallbackServerContext* ctx, std::string tenant,
    uint64_t from_sequence, StreamAccessCheck still_allowed) {
  return new EventStream(this, ctx, std::move(tenant), from_sequence,
                         std::move(still_allowed));
}

size_t EventWatchers::EndRevoked() {
  size_t ended = 0;
  for (EventStream* s : RefAll()) {
    if (absl::Status allowed = s->StillAllowed(); !allowed.ok()) {
      std::fprintf(stderr,
                   "prefixd: WatchEvents stream of tenant '%s' ended: %s\n",
                   s->tenant().c_str(), std::string(allowed.message()).c_str());
      s->RequestFinish(ToGrpcStatus(allowed));
      ++ended;
    }
    s->Unref();
  }
  return ended;
}

std::vector<EventStream*> EventWatchers::RefAll() {
  MutexLock lock(&mu_);
  std::vector<EventStream*> streams;
  if (shut_down_) return streams;
  streams.reserve(streams_.size());
  for (EventStream* s : streams_) {
    s->Ref();
    streams.push_back(s);
  }
  return streams;
}

void EventWatchers::Shutdown() {
  std::vector<EventStream*> streams;
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (EventStream* s : streams_) {
      s->Ref();
      streams.push_back(s);
    }
  }
  poller_.Stop();
  for (EventStream* s : streams) {
    s->RequestFinish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                  "prefixd is shutting down"));
    s->Unref();
  }
}

grpc::Status EventWatchers::Register(EventStream* s) {
  MutexLock lock(&mu_);
  if (shut_down_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "prefixd is shutting down");
  }
  size_t& open = per_tenant_[s->tenant()];
  if (open >= limits_.max_streams_per_tenant) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("tenant '", s->tenant(), "' has ", open,
                                     " WatchEvents streams open, the limit "
                                     "limits.max_watch_streams_per_tenant"));
  }
  ++open;
  streams_.insert(s);
  return grpc::Status::OK;
}

void EventWatchers::Unregister(EventStream* s) {
  MutexLock lock(&mu_);
  if (streams_.erase(s) == 0) return;  // refused by Register
  auto it = per_tenant_.find(s->tenant());
  if (--it->second == 0) per_tenant_.erase(it);
}

void EventWatchers::PollAll() {
  const absl::Time now = absl::Now();
  for (EventStream* s : RefAll()) {
    s->CancelIfStalled(now, limits_.stall_timeout);
    s->Poll();
    s->Unref();
  }
}

void EventToProto(const Event& e, v1::Event* out) {
  out->set_sequence(e.sequence);
  switch (e.type) {
    case EventType::kBlockStored: {
      v1::BlockStored* s = out->mutable_block_stored();
      s->set_namespace_(e.ns);
      s->mutable_block_ids()->Add(e.block_ids.begin(), e.block_ids.end());
      s->set_has_parent(e.has_parent);
      s->set_parent_block_id(e.parent_block_id);
      s->set_position(e.position);
      break;
    }
    case EventType::kBlockRemoved: {
      v1::BlockRemoved* r = out->mutable_block_removed();
      r->set_namespace_(e.ns);
      r->mutable_block_ids()->Add(e.block_ids.begin(), e.block_ids.end());
      r->set_reason(std::string(EvictReasonName(e.reason)));
      break;
    }
    case EventType::kCleared:
      out->mutable_cleared()->set_reason(
          std::string(EvictReasonName(e.reason)));
      break;
  }
}

}  // namespace prefixd
