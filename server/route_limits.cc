#include "server/route_limits.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace prefixd {

void FilterSize::Add(const v1::RouteRequest& req) {
  names += static_cast<size_t>(req.workers_size());
  for (const std::string& w : req.workers()) bytes += w.size();
}

void FilterSize::Add(const v1::PickRequest& req) {
  Add(req.prompt());
  what = "workers, candidates and loads";
  names += static_cast<size_t>(req.candidates_size() + req.loads_size());
  for (const std::string& w : req.candidates()) bytes += w.size();
  for (const v1::WorkerLoad& l : req.loads()) bytes += l.worker().size();
}

absl::Status CheckFilterSize(absl::string_view method, const FilterSize& size,
                             const RouteLimits& limits) {
  if (size.names <= limits.max_filter_names &&
      size.bytes <= limits.max_filter_bytes) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      method, ": ", size.what, " list", size.what == "workers" ? "s " : " ",
      size.names, " names (", size.bytes, " bytes) in all, past the limit of ",
      limits.max_filter_names, " names and ", limits.max_filter_bytes,
      " bytes per call; list fewer workers (none: all of them)"));
}

namespace {

// A string field: the std::string protobuf allocates, and its characters
// once they do not fit inside it.
uint64_t StringBytes(const std::string& s) {
  return sizeof(std::string) + (s.size() > 15 ? s.size() + 1 : 0);
}

}  // namespace

uint64_t AnswerBytes(const v1::RouteResponse& answer) {
  uint64_t bytes =
      sizeof(v1::RouteResponse) + StringBytes(answer.best_worker());
  for (const v1::WorkerMatch& w : answer.workers()) {
    bytes += sizeof(void*) + sizeof(v1::WorkerMatch) + StringBytes(w.worker());
    for (const v1::MediumMatch& m : w.mediums()) {
      bytes +=
          sizeof(void*) + sizeof(v1::MediumMatch) + StringBytes(m.medium());
    }
  }
  return bytes;
}

uint64_t AnswerBytes(const v1::RouteBatchItem& item) {
  return sizeof(void*) + sizeof(v1::RouteBatchItem) +
         StringBytes(item.message()) +
         (item.has_response() ? AnswerBytes(item.response()) : 0);
}

uint64_t AnswerBytes(const v1::PickResponse& answer) {
  uint64_t bytes = sizeof(v1::PickResponse) + StringBytes(answer.worker());
  for (const v1::PickCandidate& c : answer.ranked()) {
    bytes +=
        sizeof(void*) + sizeof(v1::PickCandidate) + StringBytes(c.worker());
  }
  return bytes;
}

uint64_t AnswerBytes(const v1::PickBatchItem& item) {
  return sizeof(void*) + sizeof(v1::PickBatchItem) +
         StringBytes(item.message()) +
         (item.has_response() ? AnswerBytes(item.response()) : 0);
}

absl::Status AnswerBudget::Add(uint64_t bytes, int item, int items) {
  bytes_ += bytes;
  if (bytes_ <= max_bytes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      method_, ": the answer takes ", bytes_, " bytes",
      item < 0 ? "" : absl::StrCat(" by requests[", item, "] of ", items),
      ", past limits.max_message_size ", max_bytes_,
      " bytes; send fewer requests per call or filter with workers"));
}

}  // namespace prefixd
