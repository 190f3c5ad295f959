#include "index/keys.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

// Pairs that a key joining the parts with a separator (or with none) would
// confuse: every one of them must get a key of its own.
TEST(NamespaceKeyTest, NoTwoNamespacesShareAKey) {
  struct Ns {
    std::string lora;
    int64_t id;
    std::string salt;
  };
  const std::vector<Ns> all = {
      {"", 0, ""},
      {"", 0, "s"},
      {"a", 0, ""},
      {"a", 0, "s"},
      {"as", 0, ""},
      {"", 0, "as"},
      {"L\x1fx", 0, "y"},
      {"L", 0, "x\x1fy"},
      {"L:", 0, "x"},
      {"L", 0, ":x"},
      {"", 7, ""},
      {"", 7, "1"},
      {"", 71, ""},
      {"i7:", 0, ""},
      {"", 0, "i7:"},
      {"n1:a", 0, ""},
      {"a", 0, "n1:a"},
      {"-", 0, ""},
      {"", 0, "-"},
      {"1:a", 0, ""},
      {std::string("a\0b", 3), 0, ""},
      {"a", 0, std::string("\0b", 2)},
  };
  std::set<std::string> keys;
  for (const Ns& ns : all) {
    EXPECT_TRUE(keys.insert(NamespaceKey(ns.lora, ns.id, ns.salt)).second)
        << "lora \"" << ns.lora << "\" id " << ns.id << " salt \"" << ns.salt
        << "\" shares a key";
  }
}

TEST(NamespaceKeyTest, NameWinsOverId) {
  EXPECT_EQ(NamespaceKey("a", 7, "s"), NamespaceKey("a", 0, "s"));
  EXPECT_NE(NamespaceKey("", 7, "s"), NamespaceKey("", 0, "s"));
}

TEST(BlockKeysTest, EqualBlocksGetEqualKeysAndOthersDiffer) {
  const std::vector<Token> tokens = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 5};
  std::vector<Token> keys(3 * kKeyTokens);
  BlockKeys(tokens, 4, 3, nullptr, keys.data());
  const absl::Span<const Token> k(keys);
  EXPECT_TRUE(SameKey(k.subspan(0, 2), k.subspan(2, 2)));
  EXPECT_FALSE(SameKey(k.subspan(0, 2), k.subspan(4, 2)));
}

}  // namespace
}  // namespace prefixd
