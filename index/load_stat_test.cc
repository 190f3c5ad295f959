#include "index/load_stat.h"

#include <cstdint>
#include <msgpack.hpp>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

// SGLang's LoadStat as msgspec writes it (array_like, tag, every field):
// ["LoadStat", running, waiting, num_tokens, max_total_num_tokens, rank].
std::string Payload(int64_t running, int64_t waiting, int64_t tokens,
                    int64_t capacity, bool rank_nil = false) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(6);
  p.pack(std::string("LoadStat"));
  p.pack(running);
  p.pack(waiting);
  p.pack(tokens);
  p.pack(capacity);
  if (rank_nil) {
    p.pack_nil();
  } else {
    p.pack(1);
  }
  return std::string(buf.data(), buf.size());
}

TEST(LoadStatTest, SglangsLoadStatDecodes) {
  absl::StatusOr<EngineLoad> l = DecodeLoadStat(Payload(3, 5, 2500, 10000));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->running, 3);
  EXPECT_EQ(l->waiting, 5);
  EXPECT_DOUBLE_EQ(l->kv_usage, 0.25);

  // Capacity unknown (0): no usage; more tokens than capacity: full.
  l = DecodeLoadStat(Payload(0, 0, 7, 0, /*rank_nil=*/true));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->kv_usage, 0);
  l = DecodeLoadStat(Payload(1, 0, 12, 10));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->kv_usage, 1);
}

TEST(LoadStatTest, ElementsPastTheRankAreSkipped) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(7);
  p.pack(std::string("LoadStat"));
  for (int v : {2, 1, 10, 100, 0, 9}) p.pack(v);
  absl::StatusOr<EngineLoad> l =
      DecodeLoadStat(std::string(buf.data(), buf.size()));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->running, 2);
  EXPECT_EQ(l->waiting, 1);
}

TEST(LoadStatTest, MalformedPayloadsNameWhatIsWrong) {
  const auto packed = [](auto fill) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> p(buf);
    fill(p);
    return std::string(buf.data(), buf.size());
  };
  const std::pair<std::string, std::string> bad[] = {
      {Payload(-1, 0, 0, 0), "num_running_reqs is -1; want >= 0"},
      {Payload(1, 0, 0, 0) + "x", "1 trailing bytes after the array"},
      {std::string("\xc1", 1), "not valid msgpack"},
      {"", "not valid msgpack"},
      {packed([](auto& p) { p.pack_map(0); }), "the payload is a map"},
      {packed([](auto& p) {
         p.pack_array(3);
         p.pack(std::string("LoadStat"));
         p.pack(1);
         p.pack(2);
       }),
       "the array has 3 elements; want at least 5"},
      {packed([](auto& p) {
         p.pack_array(5);
         p.pack(std::string("KvStat"));
         for (int v : {1, 2, 3, 4}) p.pack(v);
       }),
       "the first element is not the str \"LoadStat\""},
      {packed([](auto& p) {
         p.pack_array(5);
         p.pack(std::string("LoadStat"));
         p.pack(1);
         p.pack(2.5);
         p.pack(3);
         p.pack(4);
       }),
       "num_waiting_reqs is a float; want an int"},
      {packed([](auto& p) {
         p.pack_array(6);
         p.pack(std::string("LoadStat"));
         for (int v : {1, 2, 3, 4}) p.pack(v);
         p.pack(std::string("r0"));
       }),
       "attn_dp_rank is a str"},
  };
  for (const auto& [payload, want] : bad) {
    const absl::StatusOr<EngineLoad> l = DecodeLoadStat(payload);
    ASSERT_FALSE(l.ok()) << want;
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(l.status().message(), HasSubstr(want));
  }
}

}  // namespace
}  // namespace prefixd
