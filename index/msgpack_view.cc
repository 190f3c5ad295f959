#include "index/msgpack_view.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace prefixd {
namespace msgpack_view {
namespace {

// Writes what it visits with msgpack-cxx's packer, call for call as
// msgpack::pack writes a msgpack::object that msgpack::unpack made of the
// same bytes.
class PackVisitor : public msgpack::null_visitor {
 public:
  explicit PackVisitor(std::string* out) : buffer_{out}, packer_(buffer_) {}

  bool visit_nil() {
    packer_.pack_nil();
    return true;
  }
  bool visit_boolean(bool v) {
    if (v) {
      packer_.pack_true();
    } else {
      packer_.pack_false();
    }
    return true;
  }
  bool visit_positive_integer(uint64_t v) {
    packer_.pack_uint64(v);
    return true;
  }
  bool visit_negative_integer(int64_t v) {
    // unpack makes a non-negative one a POSITIVE_INTEGER.
    if (v >= 0) {
      packer_.pack_uint64(static_cast<uint64_t>(v));
    } else {
      packer_.pack_int64(v);
    }
    return true;
  }
  bool visit_float32(float v) {
    packer_.pack_float(v);
    return true;
  }
  bool visit_float64(double v) {
    packer_.pack_double(v);
    return true;
  }
  bool visit_str(const char* p, uint32_t size) {
    packer_.pack_str(size);
    packer_.pack_str_body(p, size);
    return true;
  }
  bool visit_bin(const char* p, uint32_t size) {
    packer_.pack_bin(size);
    packer_.pack_bin_body(p, size);
    return true;
  }
  bool visit_ext(const char* p, uint32_t size) {
    packer_.pack_ext(size - 1, static_cast<int8_t>(p[0]));
    packer_.pack_ext_body(p + 1, size - 1);
    return true;
  }
  bool start_array(uint32_t n) {
    packer_.pack_array(n);
    return true;
  }
  bool start_map(uint32_t n) {
    packer_.pack_map(n);
    return true;
  }

 private:
  struct StringBuffer {
    std::string* out;
    void write(const char* p, size_t n) { out->append(p, n); }
  };
  StringBuffer buffer_;
  msgpack::packer<StringBuffer> packer_;
};

// The head of the value parsed (depth 0).
struct TopHead {
  object head;
  void operator()(uint32_t depth, const object& o) {
    if (depth == 0) head = o;
  }
};

// A HeadVisitor that stops before a container's first element: the parse
// ends past the container's header.
class EnterVisitor : public internal::HeadVisitor<TopHead> {
 public:
  using HeadVisitor::HeadVisitor;
  bool start_array_item() { return false; }
  bool start_map_key() { return false; }
};

}  // namespace

void CheckPayload(absl::string_view payload,
                  const msgpack::unpack_limit& limits, size_t* end) {
  internal::LimitsVisitor visitor(limits);
  *end = 0;
  msgpack::parse(payload.data(), payload.size(), *end, visitor);
}

Value Reader::Read(size_t* pos) const {
  Value v;
  v.pos = *pos;
  TopHead top;
  internal::HeadVisitor<TopHead> visitor(limits_, top);
  msgpack::parse(payload_.data(), payload_.size(), *pos, visitor);
  v.head = top.head;
  return v;
}

Value Reader::Enter(size_t* pos) const {
  Value v;
  v.pos = *pos;
  TopHead top;
  EnterVisitor visitor(limits_, top);
  // Stopped by the visitor (false) when the container has elements.
  msgpack::parse(payload_.data(), payload_.size(), *pos, visitor);
  v.head = top.head;
  return v;
}

void Reader::Pack(const Value& v, std::string* out) const {
  size_t pos = v.pos;
  PackVisitor visitor(out);
  msgpack::parse(payload_.data(), payload_.size(), pos, visitor);
}

}  // namespace msgpack_view
}  // namespace prefixd
