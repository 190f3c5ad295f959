#include "index/object_key.h"

#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

// A 32-byte digest's hex whose first 8 bytes are 0x0102030405060708 and
// last 8 bytes 0x1122334455667788.
constexpr char kDigest[] =
    "0102030405060708aaaaaaaaaaaaaaaabbbbbbbbbbbbbbbb1122334455667788";

TEST(ObjectKeyTest, VllmKeysNameTheLow64BitsOfTheirHash) {
  const std::optional<EngineHash> want = 0x1122334455667788u;
  EXPECT_EQ(
      EngineHashOfObjectKey(absl::StrCat(
          "Qwen/Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@", kDigest)),
      want);
  EXPECT_EQ(EngineHashOfObjectKey(
                absl::StrCat("pfx@llama@tp_rank:1@pcp0@dcp0@pp_rank:0@0x",
                             absl::AsciiStrToUpper(kDigest))),
            want);
  // Ascend's: a rank or a layer after the hash.
  EXPECT_EQ(EngineHashOfObjectKey(absl::StrCat("llama@", kDigest, "@3")), want);
  EXPECT_EQ(EngineHashOfObjectKey("m@1122334455667788"), want);
}

TEST(ObjectKeyTest, SglangKeysNameTheFirst64BitsOfTheirHash) {
  const std::optional<EngineHash> want = 0x0102030405060708u;
  EXPECT_EQ(EngineHashOfObjectKey(absl::StrCat(kDigest, "_0_k")), want);
  EXPECT_EQ(
      EngineHashOfObjectKey(absl::StrCat("Qwen-Qwen3-8B_", kDigest, "__k")),
      want);
  EXPECT_EQ(
      EngineHashOfObjectKey(absl::StrCat("tag_model_", kDigest, "_1_2_v")),
      want);
  EXPECT_EQ(EngineHashOfObjectKey(kDigest), want);
  // A signed int64 hash of SGLang's is the same 64 bits.
  EXPECT_EQ(EngineHashOfObjectKey(
                absl::StrCat("ff00000000000000", std::string(48, '0'), "_0_k")),
            std::optional<EngineHash>(0xff00000000000000u));
}

TEST(ObjectKeyTest, KeysOfNeitherFormNameNothing) {
  for (const std::string& key :
       {std::string(), std::string("plain-key"), std::string("m@abc"),
        std::string("m@112233445566778"),    // 15 digits
        std::string("m@1122334455667788a"),  // odd
        absl::StrCat("m@", std::string(16, 'g')),
        absl::StrCat("x", kDigest, "_0_k"),  // not after '_'
        absl::StrCat(kDigest, "0_0_k"),      // 65 digits
        absl::StrCat("model_", std::string(63, 'a'), "_k")}) {
    EXPECT_EQ(EngineHashOfObjectKey(key), std::nullopt) << key;
  }
}

}  // namespace
}  // namespace prefixd
