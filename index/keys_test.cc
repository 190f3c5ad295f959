#include "index/keys.h"

#include <xxhash.h>

#include <cstring>
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

// The Conductor profile, pinned: XXH64 with seed 0 of the salt, then of
// each block's parent key (8 bytes, little-endian) and its tokens (4 bytes
// each, little-endian). The literals were computed with libxxhash; the
// recipe is recomputed here with libxxhash directly.
TEST(KeySchemeTest, ConductorProfileIsXxh64OfParentAndTokens) {
  const KeyScheme scheme(HashProfile::kConductorXxh64, 0);
  EXPECT_EQ(scheme.Root(""), 17241709254077376921u);
  EXPECT_EQ(scheme.Root(""), XXH64("", 0, 0));
  const uint64_t root = scheme.Root("w8a8");
  EXPECT_EQ(root, 8719435045066186881u);
  const std::vector<Token> b0 = {101, 15, 100, 55}, b1 = {89, 7, 3, 1};
  const uint64_t k0 = scheme.Next(root, true, b0);
  const uint64_t k1 = scheme.Next(k0, false, b1);
  EXPECT_EQ(k0, 12704402182264019542u);
  EXPECT_EQ(k1, 917651936057505591u);
  unsigned char buf[24];
  std::memcpy(buf, &k0, 8);
  std::memcpy(buf + 8, b1.data(), 16);
  EXPECT_EQ(k1, XXH64(buf, sizeof(buf), 0));
  // Chain gives the same keys.
  std::vector<Token> tokens = b0;
  tokens.insert(tokens.end(), b1.begin(), b1.end());
  std::vector<uint64_t> keys(2);
  scheme.Chain(root, true, tokens, 4, 2, nullptr, keys.data());
  EXPECT_EQ(keys, (std::vector<uint64_t>{k0, k1}));
  // So does ChainFrom, from the second block after the first's key.
  uint64_t second = 0;
  scheme.ChainFrom(k0, false, tokens, 4, 1, 2, nullptr, &second);
  EXPECT_EQ(second, k1);
}

// The RFC profile, pinned: XXH3 of each block's tokens (the local hash);
// the first key is the first local hash, each next one XXH3 of the parent
// key and the local hash (8 bytes each, little-endian), all with seed S.
TEST(KeySchemeTest, RfcProfileIsXxh3OfParentAndLocalHash) {
  const KeyScheme scheme(HashProfile::kRfcXxh3, 0);
  const std::vector<Token> b0 = {101, 15, 100, 55}, b1 = {89, 7, 3, 1};
  const uint64_t k0 = scheme.Next(scheme.Root("ignored"), true, b0);
  const uint64_t k1 = scheme.Next(k0, false, b1);
  EXPECT_EQ(k0, 2305876164270504736u);
  EXPECT_EQ(k1, 15313797277086565751u);
  const uint64_t pair[2] = {k0, XXH3_64bits_withSeed(b1.data(), 16, 0)};
  EXPECT_EQ(k1, XXH3_64bits_withSeed(pair, sizeof(pair), 0));
  const KeyScheme seeded(HashProfile::kRfcXxh3, 42);
  EXPECT_EQ(seeded.Next(0, true, b0), 2221781740239367851u);
}

TEST(KeySchemeTest, ContentKeysMakeAnotherKey) {
  const KeyScheme scheme;
  const std::vector<Token> b = {1, 2, 3, 4};
  ContentKey image;
  image.kind = ContentKey::Kind::kMultiModal;
  image.id = "img";
  image.offset = 2;
  const uint64_t plain = scheme.Next(7, false, b);
  const std::vector<ContentKey> one = {image};
  const uint64_t with = scheme.Next(7, false, b, one);
  EXPECT_NE(plain, with);
  EXPECT_EQ(with, scheme.Next(7, false, b, one));
  std::vector<ContentKey> moved = one;
  moved[0].offset = 3;
  EXPECT_NE(with, scheme.Next(7, false, b, moved));
  // The same tokens after another parent are another prefix.
  EXPECT_NE(plain, scheme.Next(8, false, b));
}

// A fingerprint is XXH3 of the block's own tokens with the profile's seed
// (the RFC profile's local hash): no parent, and content keys change it.
TEST(KeySchemeTest, FingerprintIsXxh3OfTheBlockAlone) {
  const std::vector<Token> b0 = {101, 15, 100, 55}, b1 = {89, 7, 3, 1};
  const KeyScheme conductor;
  EXPECT_EQ(conductor.Fingerprint(b1), XXH3_64bits_withSeed(b1.data(), 16, 0));
  const KeyScheme seeded(HashProfile::kRfcXxh3, 42);
  EXPECT_EQ(seeded.Fingerprint(b1), XXH3_64bits_withSeed(b1.data(), 16, 42));
  std::vector<Token> tokens = b0;
  tokens.insert(tokens.end(), b1.begin(), b1.end());
  std::vector<Token> out(2 * kKeyTokens);
  conductor.Fingerprints(tokens, 4, 2, nullptr, out.data());
  EXPECT_EQ(LoadKey(absl::MakeConstSpan(out).subspan(0, 2)),
            conductor.Fingerprint(b0));
  EXPECT_EQ(LoadKey(absl::MakeConstSpan(out).subspan(2, 2)),
            conductor.Fingerprint(b1));
  ContentKey image;
  image.kind = ContentKey::Kind::kMultiModal;
  image.id = "img";
  const std::vector<ContentKey> one = {image};
  EXPECT_NE(conductor.Fingerprint(b1, one), conductor.Fingerprint(b1));
}

}  // namespace
}  // namespace prefixd
