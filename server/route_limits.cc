#include "server/route_limits.h"

#include "absl/strings/str_cat.h"

namespace prefixd {

void FilterSize::Add(const v1::RouteRequest& req) {
  names += static_cast<size_t>(req.workers_size());
  for (const std::string& w : req.workers()) bytes += w.size();
}

absl::Status CheckFilterSize(absl::string_view method, const FilterSize& size,
                             const RouteLimits& limits) {
  if (size.names <= limits.max_filter_names &&
      size.bytes <= limits.max_filter_bytes) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      method, ": workers lists ", size.names, " names (", size.bytes,
      " bytes) in all, past the limit of ", limits.max_filter_names,
      " names and ", limits.max_filter_bytes,
      " bytes per call; list fewer workers (none: all of them)"));
}

absl::Status AnswerBudget::Add(uint64_t bytes, int item, int items) {
  bytes_ += bytes;
  if (bytes_ <= max_bytes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      method_, ": the answer is ", bytes_, " bytes",
      item < 0 ? "" : absl::StrCat(" by requests[", item, "] of ", items),
      ", past limits.max_message_size ", max_bytes_,
      " bytes; send fewer requests per call or filter with workers"));
}

}  // namespace prefixd
