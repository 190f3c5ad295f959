// A PrefixIndex RouteRequest read and checked into the index's RouteQuery:
// the prompt's tokens (`tokens` or `tokens_le32`), its namespace, and its
// blocks' extra keys (docs/index.md, "Namespaces and content keys").
//
// Errors are INVALID_ARGUMENT naming the field and the numbers, prefixed
// by the batch item when there is one.
//
// Thread safety: one per call; the query points into the request and into
// this object, so both must outlive its use.
#ifndef PREFIXD_SERVER_ROUTE_REQUEST_H_
#define PREFIXD_SERVER_ROUTE_REQUEST_H_

#include <string>

#include "absl/status/status.h"
#include "core/cache_types.h"
#include "index/events.h"
#include "index/kv_index.h"
#include "prefixd/v1/prefix_index.pb.h"
#include "server/request_util.h"

namespace prefixd {

class RouteRequestReader {
 public:
  // `item`: the request's index in a RouteBatch, -1 outside one.
  absl::Status Read(const v1::RouteRequest& req, int item,
                    const CacheLimits& limits, int block_size);
  const RouteQuery& query() const { return query_; }

 private:
  absl::Status ReadExtraKeys(const v1::RouteRequest& req, int item,
                             const CacheLimits& limits, size_t blocks);
  absl::Status ReadKey(const v1::ExtraKey& key, uint32_t block,
                       absl::string_view where,
                       std::vector<ContentKey>* content);
  absl::Status Agree(absl::string_view field, std::string* value,
                     absl::string_view from_key, absl::string_view where);

  TokenCopies copies_;
  BlockContent content_;
  std::string lora_name_;
  std::string cache_salt_;
  RouteQuery query_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_ROUTE_REQUEST_H_
