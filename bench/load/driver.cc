#include "bench/load/driver.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "bench/load/common.h"

namespace prefixd::bench {
namespace {

struct Window {
  int64_t begin_ns;  // end of warm-up
  int64_t end_ns;    // end of the measured window; no new calls after it
};

// What one thread saw in the window.
struct ThreadResult {
  uint64_t calls = 0, lookups = 0, errors = 0, late = 0, all_calls = 0;
  std::string first_error;
  std::vector<int64_t> latency_ns;
  std::vector<SlowCall> slow;

  void Record(Slot* slot, int64_t now, const Window& w) {
    std::string error;
    const int lookups_done = slot->Done(&error);
    ++all_calls;
    if (now < w.begin_ns || now > w.end_ns) return;
    ++calls;
    if (lookups_done < 0) {
      ++errors;
      if (first_error.empty()) first_error = error;
      return;
    }
    lookups += static_cast<uint64_t>(lookups_done);
    latency_ns.push_back(now - slot->start_ns);
    int64_t handler_start, handler_end;
    if (now - slot->start_ns > 1000000 &&
        slot->HandlerTimes(&handler_start, &handler_end)) {
      slow.push_back(
          {{slot->issued_ns - slot->start_ns, handler_start - slot->issued_ns,
            handler_end - handler_start, now - handler_end}});
    }
  }
};

std::chrono::system_clock::time_point WallDeadline(int64_t at_ns) {
  return std::chrono::system_clock::now() +
         std::chrono::nanoseconds(std::max<int64_t>(0, at_ns - NowNs()));
}

void ClosedLoop(std::vector<std::unique_ptr<Slot>>& slots, const Window& w,
                ThreadResult* out) {
  grpc::CompletionQueue cq;
  for (auto& s : slots) {
    s->start_ns = s->issued_ns = NowNs();
    s->Issue(&cq);
  }
  size_t in_flight = slots.size();
  void* tag;
  bool ok;
  while (in_flight > 0 && cq.Next(&tag, &ok)) {
    Slot* slot = static_cast<Slot*>(tag);
    const int64_t now = NowNs();
    out->Record(slot, now, w);
    if (now < w.end_ns) {
      slot->start_ns = slot->issued_ns = now;
      slot->Issue(&cq);
    } else {
      --in_flight;
    }
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

void OpenLoop(std::vector<std::unique_ptr<Slot>>& slots, double rate,
              uint64_t seed, const Window& w, int64_t start_ns,
              ThreadResult* out) {
  grpc::CompletionQueue cq;
  Rng rng(seed);
  const double mean_gap_ns = 1e9 / rate;
  auto gap = [&] {
    return static_cast<int64_t>(-std::log(1.0 - rng.Uniform()) * mean_gap_ns);
  };
  std::vector<Slot*> idle;
  for (auto& s : slots) idle.push_back(s.get());
  std::vector<int64_t> backlog;  // scheduled times still waiting for a slot
  size_t backlog_head = 0;
  int64_t next_ns = start_ns + gap();
  size_t in_flight = 0;
  void* tag;
  bool ok;
  while (true) {
    const int64_t now = NowNs();
    const size_t waiting = backlog.size();  // arrivals found earlier
    while (next_ns <= now && next_ns < w.end_ns) {
      backlog.push_back(next_ns);
      next_ns += gap();
    }
    while (backlog_head < backlog.size() && !idle.empty()) {
      Slot* s = idle.back();
      idle.pop_back();
      const size_t i = backlog_head++;
      const int64_t scheduled = backlog[i];
      // An arrival that waited for a slot counts its latency from its
      // scheduled time (no coordinated omission). One found now, with a slot
      // free, counts from now: the wait was this thread's wake-up, whose
      // timer (gRPC's poller) has millisecond granularity, not the server.
      s->start_ns = i < waiting ? scheduled : now;
      if (now - scheduled > 1000000 && scheduled >= w.begin_ns) ++out->late;
      s->issued_ns = NowNs();
      s->Issue(&cq);
      ++in_flight;
    }
    if (next_ns >= w.end_ns && backlog_head == backlog.size() &&
        in_flight == 0) {
      break;
    }
    const int64_t wake = next_ns < w.end_ns ? next_ns : w.end_ns + 1000000000;
    const auto got = cq.AsyncNext(&tag, &ok, WallDeadline(wake));
    if (got == grpc::CompletionQueue::GOT_EVENT) {
      Slot* slot = static_cast<Slot*>(tag);
      out->Record(slot, NowNs(), w);
      idle.push_back(slot);
      --in_flight;
    } else if (got == grpc::CompletionQueue::SHUTDOWN) {
      break;
    }
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace

DriveResult Drive(const DriveOptions& options, const SlotFactory& make_slot) {
  const int threads =
      std::max(1, std::min(options.threads, options.concurrency));
  std::vector<std::vector<std::unique_ptr<Slot>>> slots(threads);
  for (int i = 0; i < options.concurrency; ++i) {
    slots[i % threads].push_back(make_slot(i % threads, i));
  }
  const int64_t start = NowNs();
  const Window w{
      start + absl::ToInt64Nanoseconds(options.warmup),
      start + absl::ToInt64Nanoseconds(options.warmup + options.duration)};
  std::vector<ThreadResult> results(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      if (options.rate > 0) {
        OpenLoop(slots[t], options.rate / threads, options.seed * 7919 + t, w,
                 start, &results[t]);
      } else {
        ClosedLoop(slots[t], w, &results[t]);
      }
    });
  }
  for (auto& th : workers) th.join();
  DriveResult r;
  r.seconds = absl::ToDoubleSeconds(options.duration);
  for (ThreadResult& t : results) {
    r.calls += t.calls;
    r.lookups += t.lookups;
    r.errors += t.errors;
    r.late += t.late;
    r.all_calls += t.all_calls;
    if (r.first_error.empty()) r.first_error = t.first_error;
    r.latency_ns.insert(r.latency_ns.end(), t.latency_ns.begin(),
                        t.latency_ns.end());
    r.slow.insert(r.slow.end(), t.slow.begin(), t.slow.end());
  }
  return r;
}

}  // namespace prefixd::bench
