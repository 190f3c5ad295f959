// Reading msgpack-cxx's object tree in place (index/events.cc,
// index/extra_keys.cc): type tests and views of strings and bytes, which
// point into the payload rather than copy it.
#ifndef PREFIXD_INDEX_MSGPACK_VIEW_H_
#define PREFIXD_INDEX_MSGPACK_VIEW_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

// Debian's msgpack-cxx is header-only and needs Boost unless told not to.
#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

namespace prefixd {
namespace msgpack_view {

using msgpack::object;
namespace mtype = msgpack::type;

inline absl::string_view Str(const object& o) {
  return absl::string_view(o.via.str.ptr, o.via.str.size);
}

inline absl::string_view Bin(const object& o) {
  return absl::string_view(o.via.bin.ptr, o.via.bin.size);
}

// The bytes of a str or a bin alike; false for anything else.
inline bool Bytes(const object& o, absl::string_view* out) {
  if (o.type == mtype::STR) {
    *out = Str(o);
    return true;
  }
  if (o.type == mtype::BIN) {
    *out = Bin(o);
    return true;
  }
  return false;
}

// nullptr: the field was absent (a map without the key, an array that ends
// before its position); both mean the same as nil.
inline bool IsNull(const object* o) {
  return o == nullptr || o->type == mtype::NIL;
}

inline absl::string_view TypeName(const object& o) {
  switch (o.type) {
    case mtype::NIL:
      return "nil";
    case mtype::BOOLEAN:
      return "bool";
    case mtype::POSITIVE_INTEGER:
    case mtype::NEGATIVE_INTEGER:
      return "int";
    case mtype::FLOAT32:
    case mtype::FLOAT64:
      return "float";
    case mtype::STR:
      return "str";
    case mtype::BIN:
      return "bin";
    case mtype::ARRAY:
      return "array";
    case mtype::MAP:
      return "map";
    case mtype::EXT:
      return "ext";
  }
  return "unknown";
}

// An int as text, whichever sign it was encoded with.
inline std::string IntText(const object& o) {
  return o.type == mtype::NEGATIVE_INTEGER ? absl::StrCat(o.via.i64)
                                           : absl::StrCat(o.via.u64);
}

inline bool IsInt(const object& o) {
  return o.type == mtype::POSITIVE_INTEGER || o.type == mtype::NEGATIVE_INTEGER;
}

// An int that fits int64_t (msgpack ints reach 2^64 - 1).
inline bool ToInt64(const object& o, int64_t* v) {
  if (o.type == mtype::NEGATIVE_INTEGER) {
    *v = o.via.i64;
    return true;
  }
  if (o.type == mtype::POSITIVE_INTEGER &&
      o.via.u64 <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    *v = static_cast<int64_t>(o.via.u64);
    return true;
  }
  return false;
}

// The value of `key` in a map object; nullptr if absent.
inline const object* MapValue(const object& map, absl::string_view key) {
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object_kv& kv = map.via.map.ptr[i];
    if (kv.key.type == mtype::STR && Str(kv.key) == key) return &kv.val;
  }
  return nullptr;
}

}  // namespace msgpack_view
}  // namespace prefixd

#endif  // PREFIXD_INDEX_MSGPACK_VIEW_H_
