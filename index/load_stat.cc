#include "index/load_stat.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <msgpack.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "index/msgpack_view.h"

namespace prefixd {
namespace {

using msgpack::type::object_type;
using msgpack_view::TypeName;

// The payload is a flat array of a few scalars: anything deeper or larger
// is refused while it is unpacked.
constexpr size_t kMaxElements = 64;
constexpr size_t kMaxString = 256;

constexpr absl::string_view kNames[] = {"type", "num_running_reqs",
                                        "num_waiting_reqs", "num_tokens",
                                        "max_total_num_tokens"};

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("LoadStat: ", what));
}

// Element i (1..4), a count: an int >= 0.
absl::StatusOr<int64_t> Count(const msgpack::object& o, size_t i) {
  if (o.type == object_type::NEGATIVE_INTEGER) {
    return Bad(absl::StrCat(kNames[i], " is ", o.via.i64, "; want >= 0"));
  }
  if (o.type != object_type::POSITIVE_INTEGER) {
    return Bad(absl::StrCat(kNames[i], " is a ", TypeName(o), "; want an int"));
  }
  if (o.via.u64 > static_cast<uint64_t>(INT64_MAX)) {
    return Bad(absl::StrCat(kNames[i], " is ", o.via.u64, "; too large"));
  }
  return static_cast<int64_t>(o.via.u64);
}

absl::StatusOr<EngineLoad> FromArray(const msgpack::object& root) {
  if (root.type != object_type::ARRAY) {
    return Bad(
        absl::StrCat("the payload is a ", TypeName(root), "; want an array"));
  }
  const msgpack::object_array& a = root.via.array;
  if (a.size < 5) {
    return Bad(
        absl::StrCat("the array has ", a.size, " elements; want at least 5"));
  }
  const msgpack::object& tag = a.ptr[0];
  if (tag.type != object_type::STR ||
      absl::string_view(tag.via.str.ptr, tag.via.str.size) != "LoadStat") {
    return Bad("the first element is not the str \"LoadStat\"");
  }
  int64_t counts[5] = {0, 0, 0, 0, 0};
  for (size_t i = 1; i < 5; ++i) {
    absl::StatusOr<int64_t> n = Count(a.ptr[i], i);
    if (!n.ok()) return n.status();
    counts[i] = *n;
  }
  if (a.size > 5 && a.ptr[5].type != object_type::NIL &&
      a.ptr[5].type != object_type::POSITIVE_INTEGER) {
    return Bad(absl::StrCat("attn_dp_rank is a ", TypeName(a.ptr[5]),
                            "; want an int >= 0 or nil"));
  }
  EngineLoad load;
  load.running = counts[1];
  load.waiting = counts[2];
  if (counts[4] > 0) {
    load.kv_usage = std::min(
        1.0, static_cast<double>(counts[3]) / static_cast<double>(counts[4]));
  }
  return load;
}

}  // namespace

absl::StatusOr<EngineLoad> DecodeLoadStat(absl::string_view payload) {
  const msgpack::unpack_limit limits(kMaxElements, 0, kMaxString, kMaxString,
                                     kMaxString, 2);
  try {
    size_t end = 0;
    const msgpack::object_handle h = msgpack::unpack(
        payload.data(), payload.size(), end, nullptr, nullptr, limits);
    if (end != payload.size()) {
      return Bad(absl::StrCat(payload.size() - end,
                              " trailing bytes after the array"));
    }
    return FromArray(h.get());
  } catch (const std::exception& e) {
    return Bad(
        absl::StrCat("the payload is not valid msgpack (", e.what(), ")"));
  }
}

}  // namespace prefixd
