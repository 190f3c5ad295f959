// Reading a msgpack payload in place (index/events.cc, index/extra_keys.cc)
// with msgpack-cxx's parser, value by value, without its object tree.
//
// msgpack::unpack would first build a msgpack::object (24 bytes) for every
// element of the payload, 24 times the size of a payload of one-byte token
// ids, before the decoder made anything of them. Instead a Reader parses
// one value at a position (msgpack::parse and a visitor): Read() steps over
// a whole value and returns its head, Enter() steps into an array or a map
// so that its elements can be read one by one, ReadElements() hands an
// array's elements to a sink (the token ids and block hashes go straight
// into their vectors), Pack() re-encodes a value. The decoder thus holds
// what it makes of the payload and little else.
//
// A value's head is a msgpack::object: a scalar whole (strings and bytes
// point into the payload), an array or a map its type and size only. The
// helpers below (type tests, views of strings and bytes) read heads.
#ifndef PREFIXD_INDEX_MSGPACK_VIEW_H_
#define PREFIXD_INDEX_MSGPACK_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/base/attributes.h"
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

// A value of the payload: where it starts and its head. A field that was
// absent is a Value that is not present(), whose head is nil.
struct Value {
  static constexpr size_t kAbsent = std::numeric_limits<size_t>::max();
  size_t pos = kAbsent;
  object head;

  bool present() const { return pos != kAbsent; }
  // The head, or nullptr when absent (for IsNull and the like).
  const object* get() const { return present() ? &head : nullptr; }
};

// Checks that `payload` holds one msgpack value within `limits`: *end is
// where that value ends (the caller decides about trailing bytes). Throws
// what msgpack::unpack throws for the same payload and limits
// (msgpack::unpack_error and its subclasses: "parse error", "insufficient
// bytes", "array size overflow", ...), without building anything.
void CheckPayload(absl::string_view payload,
                  const msgpack::unpack_limit& limits, size_t* end);

namespace internal {

// The checks msgpack::unpack's visitor (msgpack-cxx's create_object_visitor)
// makes on the way, in the same order and with the same exceptions, and
// nothing else: a container's size, then its depth (at most limit.depth()
// nested containers); a str's, bin's or ext's size (ext: with its type
// byte); bytes that are not msgpack, or too few.
class LimitsVisitor : public msgpack::null_visitor {
 public:
  explicit LimitsVisitor(const msgpack::unpack_limit& limit) : limit_(limit) {}

  bool visit_str(const char* /*p*/, uint32_t size) {
    if (size > limit_.str())
      throw msgpack::str_size_overflow("str size overflow");
    return true;
  }
  bool visit_bin(const char* /*p*/, uint32_t size) {
    if (size > limit_.bin())
      throw msgpack::bin_size_overflow("bin size overflow");
    return true;
  }
  bool visit_ext(const char* /*p*/, uint32_t size) {
    if (size > limit_.ext())
      throw msgpack::ext_size_overflow("ext size overflow");
    return true;
  }
  bool start_array(uint32_t n) {
    if (n > limit_.array()) {
      throw msgpack::array_size_overflow("array size overflow");
    }
    return Open();
  }
  bool end_array() { return Close(); }
  bool start_map(uint32_t n) {
    if (n > limit_.map()) throw msgpack::map_size_overflow("map size overflow");
    return Open();
  }
  bool end_map() { return Close(); }
  void parse_error(size_t /*parsed*/, size_t /*error*/) {
    throw msgpack::parse_error("parse error");
  }
  void insufficient_bytes(size_t /*parsed*/, size_t /*error*/) {
    throw msgpack::insufficient_bytes("insufficient bytes");
  }

 private:
  bool Open() {
    if (open_ + 1 > limit_.depth()) {
      throw msgpack::depth_size_overflow("depth size overflow");
    }
    ++open_;
    return true;
  }
  bool Close() {
    --open_;
    return true;
  }

  const msgpack::unpack_limit& limit_;
  size_t open_ = 0;  // containers started and not ended
};

// Turns the parser's callbacks into heads: on_value(depth, head) for every
// value it meets (depth 0: the one parsed; 1: its elements, or its keys
// and values; and so on).
template <typename OnValue>
class HeadVisitor : public LimitsVisitor {
 public:
  HeadVisitor(const msgpack::unpack_limit& limit, OnValue& on_value)
      : LimitsVisitor(limit), on_value_(on_value) {}

  bool visit_nil() { return Scalar(object()); }
  bool visit_boolean(bool v) {
    object o;
    o.type = mtype::BOOLEAN;
    o.via.boolean = v;
    return Scalar(o);
  }
  // Inlined, as what they call: they run for every token id.
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool visit_positive_integer(uint64_t v) {
    object o;
    o.type = mtype::POSITIVE_INTEGER;
    o.via.u64 = v;
    return Scalar(o);
  }
  // As msgpack::unpack reads them: a non-negative value in a signed
  // encoding is a POSITIVE_INTEGER.
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool visit_negative_integer(int64_t v) {
    if (v >= 0) return visit_positive_integer(static_cast<uint64_t>(v));
    object o;
    o.type = mtype::NEGATIVE_INTEGER;
    o.via.i64 = v;
    return Scalar(o);
  }
  bool visit_float32(float v) { return Float(mtype::FLOAT32, v); }
  bool visit_float64(double v) { return Float(mtype::FLOAT64, v); }
  bool visit_str(const char* p, uint32_t size) {
    LimitsVisitor::visit_str(p, size);
    object o;
    o.type = mtype::STR;
    o.via.str.ptr = p;
    o.via.str.size = size;
    return Scalar(o);
  }
  bool visit_bin(const char* p, uint32_t size) {
    LimitsVisitor::visit_bin(p, size);
    object o;
    o.type = mtype::BIN;
    o.via.bin.ptr = p;
    o.via.bin.size = size;
    return Scalar(o);
  }
  // `p` starts with the ext's type byte, which `size` counts.
  bool visit_ext(const char* p, uint32_t size) {
    LimitsVisitor::visit_ext(p, size);
    object o;
    o.type = mtype::EXT;
    o.via.ext.ptr = p;
    o.via.ext.size = size - 1;
    return Scalar(o);
  }
  bool start_array(uint32_t n) {
    LimitsVisitor::start_array(n);
    object o;
    o.type = mtype::ARRAY;
    o.via.array.size = n;
    o.via.array.ptr = nullptr;
    return Open(o);
  }
  bool end_array() {
    LimitsVisitor::end_array();
    return Close();
  }
  bool start_map(uint32_t n) {
    LimitsVisitor::start_map(n);
    object o;
    o.type = mtype::MAP;
    o.via.map.size = n;
    o.via.map.ptr = nullptr;
    return Open(o);
  }
  bool end_map() {
    LimitsVisitor::end_map();
    return Close();
  }

 private:
  ABSL_ATTRIBUTE_ALWAYS_INLINE bool Scalar(const object& o) {
    on_value_(depth_, o);
    return true;
  }
  bool Float(mtype::object_type type, double v) {
    object o;
    o.type = type;
    o.via.f64 = v;
    return Scalar(o);
  }
  bool Open(const object& o) {
    on_value_(depth_++, o);
    return true;
  }
  bool Close() {
    --depth_;
    return true;
  }

  OnValue& on_value_;
  uint32_t depth_ = 0;
};

}  // namespace internal

// Reads the values of one payload, each call parsing one value, or one
// header, at a position where a value starts. A read that meets bytes that
// are not msgpack, or a value beyond its limits, throws (msgpack::
// unpack_error, as CheckPayload); so does one that runs past the payload.
// Thread safety: const methods only; any number of threads may share one.
class Reader {
 public:
  // `payload` must outlive the Reader and the heads it hands out (their
  // strings point into it). Each read checks what it parses against
  // `limits` and throws as CheckPayload does; a read starting at depth d
  // counts nesting from there, so give it limits.depth() = the payload's
  // depth limit - d.
  Reader(absl::string_view payload, const msgpack::unpack_limit& limits)
      : payload_(payload), limits_(limits) {}

  // The value at *pos; *pos moves past it.
  Value Read(size_t* pos) const;
  // The value at *pos; *pos moves past its header only, onto an array's
  // first element or a map's first key (past a scalar or an empty one).
  Value Enter(size_t* pos) const;

  // The value at *pos, *pos past it. If it is an array, sink.Begin(size),
  // and if that returns true, sink.Element(i, head) for each element in
  // order (a nested array's or map's head has its size only).
  template <typename Sink>
  Value ReadElements(size_t* pos, Sink& sink) const;

  // The value of each of `keys` in the map `map`: the first one under that
  // key (a str), as a lookup in msgpack-cxx's object tree finds it. Those
  // not found, or all if `map` is not a map, stay absent. REQUIRES: every
  // values[i] absent.
  template <size_t N>
  void MapValues(const Value& map, const absl::string_view (&keys)[N],
                 Value (&values)[N]) const;

  // Appends the value's msgpack encoding as msgpack::pack writes it (its
  // shortest), whichever encoding its sender chose.
  void Pack(const Value& v, std::string* out) const;

 private:
  absl::string_view payload_;
  const msgpack::unpack_limit limits_;
};

namespace internal {

// ReadElements' HeadVisitor callback (inlined: it runs for every token id).
template <typename Sink>
struct ToSink {
  Sink& sink;
  Value* v;
  uint32_t next = 0;      // the index of the next element
  bool elements = false;  // an array whose sink takes its elements

  ABSL_ATTRIBUTE_ALWAYS_INLINE void operator()(uint32_t depth,
                                               const object& head) {
    if (depth == 0) {
      v->head = head;
      elements = head.type == mtype::ARRAY && sink.Begin(head.via.array.size);
    } else if (depth == 1 && elements) {
      sink.Element(next++, head);
    }
  }
};

}  // namespace internal

template <typename Sink>
Value Reader::ReadElements(size_t* pos, Sink& sink) const {
  Value v;
  v.pos = *pos;
  internal::ToSink<Sink> to_sink{sink, &v};
  internal::HeadVisitor<internal::ToSink<Sink>> visitor(limits_, to_sink);
  msgpack::parse(payload_.data(), payload_.size(), *pos, visitor);
  return v;
}

template <size_t N>
void Reader::MapValues(const Value& map, const absl::string_view (&keys)[N],
                       Value (&values)[N]) const {
  if (map.head.type != mtype::MAP) return;
  size_t pos = map.pos;
  Enter(&pos);
  for (uint32_t i = 0; i < map.head.via.map.size; ++i) {
    const Value key = Read(&pos);
    size_t k = 0;
    while (k < N && (key.head.type != mtype::STR || Str(key.head) != keys[k] ||
                     values[k].present())) {
      ++k;
    }
    if (k < N) {
      values[k] = Read(&pos);
    } else {
      Read(&pos);
    }
  }
}

}  // namespace msgpack_view
}  // namespace prefixd

#endif  // PREFIXD_INDEX_MSGPACK_VIEW_H_
