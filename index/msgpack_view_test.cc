#include "index/msgpack_view.h"

#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace msgpack_view {
namespace {

// The same values in the shortest encodings (msgpack-cxx's packer) and in
// longer ones a sender may choose: the Reader must not tell them apart.
const std::vector<std::string>& Encodings() {
  static const auto* encodings = new std::vector<std::string>{
      std::string("\x93\x01\xa1x\xc0", 5),  // [1, "x", nil]
      // The same in array16, uint32, str8, and an int8 holding a positive 1.
      std::string("\xdc\x00\x03\xce\x00\x00\x00\x01\xd9\x01x\xc0", 12),
      std::string("\x92\xd0\x01\xd0\xff", 5),  // [int8 1, int8 -1]
      std::string("\x82\xa1k\x91\xc3\x01\xca\x3f\xc0\x00\x00", 11),
      std::string("\xdd\x00\x00\x00\x02\xd4\x05\x07\xc4\x02\x00\x01", 12),
      std::string("\xde\x00\x01\xda\x00\x01k\xdc\x00\x00", 10),
      std::string("\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00", 9),  // 1.5
  };
  return *encodings;
}

TEST(MsgpackReaderTest, PackWritesWhatMsgpackPackWritesOfTheUnpackedValue) {
  for (const std::string& bytes : Encodings()) {
    const msgpack::object_handle h =
        msgpack::unpack(bytes.data(), bytes.size());
    msgpack::sbuffer expected;
    msgpack::pack(expected, h.get());
    const Reader reader(bytes, msgpack::unpack_limit());
    size_t pos = 0;
    const Value v = reader.Read(&pos);
    EXPECT_EQ(pos, bytes.size());
    std::string packed;
    reader.Pack(v, &packed);
    EXPECT_EQ(packed, std::string(expected.data(), expected.size()));
  }
}

TEST(MsgpackReaderTest, HeadsAreTheUnpackedObjectsOfScalarsAndSizesOfOthers) {
  for (const std::string& bytes : Encodings()) {
    const msgpack::object_handle h =
        msgpack::unpack(bytes.data(), bytes.size());
    const object& root = h.get();
    const Reader reader(bytes, msgpack::unpack_limit());
    size_t pos = 0;
    const Value v = reader.Enter(&pos);
    EXPECT_EQ(v.pos, 0u);
    ASSERT_EQ(v.head.type, root.type);
    if (root.type != mtype::ARRAY) continue;
    ASSERT_EQ(v.head.via.array.size, root.via.array.size);
    // The elements one by one after Enter, as unpack made them.
    for (uint32_t i = 0; i < root.via.array.size; ++i) {
      const object& want = root.via.array.ptr[i];
      const Value e = reader.Read(&pos);
      ASSERT_EQ(e.head.type, want.type);
      if (want.type == mtype::POSITIVE_INTEGER) {
        EXPECT_EQ(e.head.via.u64, want.via.u64);
      } else if (want.type == mtype::NEGATIVE_INTEGER) {
        EXPECT_EQ(e.head.via.i64, want.via.i64);
      } else if (want.type == mtype::STR) {
        EXPECT_EQ(Str(e.head), Str(want));
      }
    }
    EXPECT_EQ(pos, bytes.size());
  }
}

struct Collect {
  uint32_t size = 0;
  std::vector<object> elements;
  bool Begin(uint32_t n) {
    size = n;
    return true;
  }
  void Element(uint32_t i, const object& o) {
    EXPECT_EQ(i, elements.size());
    elements.push_back(o);
  }
};

TEST(MsgpackReaderTest, ReadElementsHandsOverEachElementOnce) {
  // [7, [1, 2, 3], {"a": 1}, "s"]
  const std::string bytes("\x94\x07\x93\x01\x02\x03\x81\xa1\x61\x01\xa1s", 12);
  const Reader reader(bytes, msgpack::unpack_limit());
  size_t pos = 0;
  Collect c;
  const Value v = reader.ReadElements(&pos, c);
  EXPECT_EQ(pos, bytes.size());
  EXPECT_EQ(v.head.type, mtype::ARRAY);
  EXPECT_EQ(c.size, 4u);
  ASSERT_EQ(c.elements.size(), 4u);
  EXPECT_EQ(c.elements[0].via.u64, 7u);
  EXPECT_EQ(c.elements[1].type, mtype::ARRAY);
  EXPECT_EQ(c.elements[1].via.array.size, 3u);
  EXPECT_EQ(c.elements[2].type, mtype::MAP);
  EXPECT_EQ(Str(c.elements[3]), "s");

  // A map's keys and values are not elements.
  pos = 6;
  Collect none;
  EXPECT_EQ(reader.ReadElements(&pos, none).head.type, mtype::MAP);
  EXPECT_TRUE(none.elements.empty());
  EXPECT_EQ(pos, 10u);
}

TEST(MsgpackReaderTest, MapValuesFindsTheFirstOfEachKey) {
  // {"b": 1, 2: 3, "a": 4, "b": 5}
  const std::string bytes("\x84\xa1\x62\x01\x02\x03\xa1\x61\x04\xa1\x62\x05",
                          12);
  const Reader reader(bytes, msgpack::unpack_limit());
  size_t pos = 0;
  const Value map = reader.Read(&pos);
  static constexpr absl::string_view kKeys[] = {"a", "b", "c"};
  Value values[3];
  reader.MapValues(map, kKeys, values);
  ASSERT_TRUE(values[0].present());
  EXPECT_EQ(values[0].head.via.u64, 4u);
  ASSERT_TRUE(values[1].present());
  EXPECT_EQ(values[1].head.via.u64, 1u);
  EXPECT_FALSE(values[2].present());
  EXPECT_EQ(values[2].get(), nullptr);
}

// The message of what f() throws, or "".
template <typename F>
std::string Thrown(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(MsgpackReaderTest, CheckPayloadThrowsWhatUnpackThrows) {
  const msgpack::unpack_limit limit(4, 2, 3, 3, 3, 2);
  const std::vector<std::string> payloads = {
      std::string("\x95\x01\x02\x03\x04\x05", 6),      // array of 5
      std::string("\x83\x01\x01\x02\x02\x03\x03", 7),  // map of 3
      std::string("\xa4xxxx", 5),                      // str of 4
      std::string("\xc4\x04xxxx", 6),                  // bin of 4
      std::string("\xd6\x01xxxx", 6),                  // ext of 4 + type
      std::string("\x91\x91\x91\x90", 4),              // 4 deep
      std::string("\x91\x81\x01\x90", 4),              // 3 deep, a map
      std::string("\xc1", 1),
      std::string("\x92\x01", 2),
      std::string(),
      std::string("\x92\x91\x90\xa3xyz", 7),  // 3 deep
      std::string("\x92\x90\xa3xyz", 6),      // 2 deep: fine
  };
  for (const std::string& p : payloads) {
    size_t unpacked_end = 0;
    const std::string want = Thrown([&] {
      msgpack::object_handle h;
      bool referenced;
      msgpack::unpack(h, p.data(), p.size(), unpacked_end, referenced, nullptr,
                      nullptr, limit);
    });
    size_t end = 0;
    EXPECT_EQ(Thrown([&] { CheckPayload(p, limit, &end); }), want)
        << absl::CHexEscape(p);
    if (want.empty()) {
      EXPECT_EQ(end, unpacked_end);
    }
  }
}

TEST(MsgpackReaderTest, ReadsThrowWhatCheckPayloadThrows) {
  const msgpack::unpack_limit limit(4, 2, 3, 3, 3, 2);
  // [[1, 2, 3, 4, 5]], [[[]]], ["xxxx"], [0xc1], [1, (missing)]
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("\x91\x95\x01\x02\x03\x04\x05", 7), "array size overflow"},
      {std::string("\x91\x91\x91\x90", 4), "depth size overflow"},
      {std::string("\x91\xa4xxxx", 6), "str size overflow"},
      {std::string("\x91\xc1", 2), "parse error"},
      {std::string("\x92\x01", 2), "insufficient bytes"},
  };
  for (const auto& [bytes, what] : cases) {
    const Reader reader(bytes, limit);
    size_t pos = 0;
    EXPECT_EQ(Thrown([&] { reader.Read(&pos); }), what) << what;
    Collect c;
    pos = 0;
    EXPECT_EQ(Thrown([&] { reader.ReadElements(&pos, c); }), what) << what;
  }
  // Enter reads the header alone: what follows it is not its business.
  const std::string header("\x92\xc1", 2);
  const Reader reader(header, limit);
  size_t pos = 0;
  EXPECT_EQ(reader.Enter(&pos).head.via.array.size, 2u);
  EXPECT_EQ(pos, 1u);
}

}  // namespace
}  // namespace msgpack_view
}  // namespace prefixd
