// What one Route or RouteBatch call may cost the daemon (docs/index.md,
// "Route"): the `workers` filters it carries and the bytes of its answer.
// A tenant may ask for a lot in one call (a RouteBatch of 65,536 items
// whose answers each list every worker, a filter of millions of names);
// with these bounds the work and the memory of a call stay proportional to
// limits the operator set, whatever it asks for.
#ifndef PREFIXD_SERVER_ROUTE_LIMITS_H_
#define PREFIXD_SERVER_ROUTE_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "prefixd/v1/prefix_index.pb.h"

namespace prefixd {

struct RouteLimits {
  // The `workers` filters of one call, summed over a batch's items: names
  // and their bytes. Each name costs a comparison per worker of the index.
  size_t max_filter_names = 4096;
  size_t max_filter_bytes = 256 << 10;
  // The answer of one call, in memory as built (AnswerBytes):
  // limits.max_message_size, as for requests.
  uint64_t max_answer_bytes = 16 << 20;
};

// The `workers` filters of a call, as they add up over a batch's items.
struct FilterSize {
  size_t names = 0;
  size_t bytes = 0;
  absl::string_view what = "workers";  // the fields they came in
  void Add(const v1::RouteRequest& req);
  // A Pick's candidates and the names of its loads.
  void Add(const v1::PickRequest& req);
};

// INVALID_ARGUMENT naming the method and the numbers when `size` is past
// the limits.
absl::Status CheckFilterSize(absl::string_view method, const FilterSize& size,
                             const RouteLimits& limits);

// What an answer (or a batch item) costs as built: its protobuf objects
// and their strings, 5 to 10 times its wire size for Route's many small
// WorkerMatch messages (and never less). Counted from the fields, with no
// reflection: cheap next to building them.
uint64_t AnswerBytes(const v1::RouteResponse& answer);
uint64_t AnswerBytes(const v1::RouteBatchItem& item);
uint64_t AnswerBytes(const v1::PickResponse& answer);
uint64_t AnswerBytes(const v1::PickBatchItem& item);

// The bytes of one call's answer as it is built, against max_answer_bytes.
// Thread safety: none; one per call.
class AnswerBudget {
 public:
  AnswerBudget(absl::string_view method, uint64_t max_bytes)
      : method_(method), max_bytes_(max_bytes) {}

  // Counts an answer (item `item` of `items`; -1 for a call's only answer)
  // of `bytes`. RESOURCE_EXHAUSTED naming the item and the numbers once the
  // answer is past the limit: the call must end without it.
  absl::Status Add(uint64_t bytes, int item, int items);

 private:
  const absl::string_view method_;
  const uint64_t max_bytes_;
  uint64_t bytes_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_ROUTE_LIMITS_H_
