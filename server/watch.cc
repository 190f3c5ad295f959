#include "server/watch.h"

#include <atomic>
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
  EventStream(EventWatchers* owner, std::string tenant, uint64_t from_sequence)
      : owner_(owner),
        tenant_(std::move(tenant)),
        next_(from_sequence == 0 ? 1 : from_sequence),
        ignore_first_missed_(from_sequence == 0) {
    if (!owner_->Register(this)) {
      RequestFinish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "prefixd is shutting down"));
      return;
    }
    Poll();
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
      absl::MutexLock lock(&mu_);
      if (writing_ || finish_requested_) return;
      absl::StatusOr<EventBatch> batch =
          owner_->cache_->ReadEvents(tenant_, next_, EventWatchers::kMaxBatch);
      if (batch.ok()) {
        bool missed = batch->missed && !ignore_first_missed_;
        ignore_first_missed_ = false;
        if (batch->events.empty() && !missed) return;
        FillResponse(*batch, missed);
        writing_ = true;
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

  // Ends the call with `status` now, or after the write in flight.
  void RequestFinish(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
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
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && !finish_requested_) {
        finish_requested_ = true;
        finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED,
                                      "write failed: client gone");
      }
      if (finish_requested_) {
        if (finished_) return;
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
    for (const Event& e : batch.events) EventToProto(e, response_.add_events());
    response_.set_missed_events(missed);
    response_.set_next_sequence(batch.next_sequence);
    next_ = batch.next_sequence;
  }

  EventWatchers* const owner_;
  const std::string tenant_;
  std::atomic<int> refs_{1};  // gRPC's, dropped in OnDone
  absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_);
  bool ignore_first_missed_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish() called
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  v1::WatchEventsResponse response_;  // owned by gRPC while writing_
};

EventWatchers::EventWatchers(const PrefixCache* cache, uint64_t epoch,
                             absl::Duration poll_interval)
    : cache_(cache),
      epoch_(epoch),
      poller_(poll_interval, [this] { PollAll(); }) {}

EventWatchers::~EventWatchers() { poller_.Stop(); }

grpc::ServerWriteReactor<v1::WatchEventsResponse>* EventWatchers::Start(
    std::string tenant, uint64_t from_sequence) {
  return new EventStream(this, std::move(tenant), from_sequence);
}

void EventWatchers::Shutdown() {
  std::vector<EventStream*> streams;
  {
    absl::MutexLock lock(&mu_);
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

bool EventWatchers::Register(EventStream* s) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return false;
  streams_.insert(s);
  return true;
}

void EventWatchers::Unregister(EventStream* s) {
  absl::MutexLock lock(&mu_);
  streams_.erase(s);
}

void EventWatchers::PollAll() {
  std::vector<EventStream*> streams;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    streams.reserve(streams_.size());
    for (EventStream* s : streams_) {
      s->Ref();
      streams.push_back(s);
    }
  }
  for (EventStream* s : streams) {
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
