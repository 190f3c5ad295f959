// A PrefixIndex PickRequest read into the index's PickQuery: the prompt as
// RouteRequestReader reads it, the candidates and the router's loads. The
// figures themselves are checked by the Picker (index/picker.h), which
// knows the workers.
//
// Thread safety: one per call; the query points into the request and into
// this object, so both must outlive its use.
#ifndef PREFIXD_SERVER_PICK_REQUEST_H_
#define PREFIXD_SERVER_PICK_REQUEST_H_

#include <vector>

#include "absl/status/status.h"
#include "core/cache_types.h"
#include "index/picker.h"
#include "prefixd/v1/prefix_index.pb.h"
#include "server/route_request.h"

namespace prefixd {

class PickRequestReader {
 public:
  // `item`: the request's index in a PickBatch, -1 outside one.
  absl::Status Read(const v1::PickRequest& req, int item,
                    const CacheLimits& limits, int block_size);
  const PickQuery& query() const { return query_; }

 private:
  RouteRequestReader prompt_;
  std::vector<WorkerLoadInput> loads_;
  PickQuery query_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_PICK_REQUEST_H_
