#include "model/rope.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "model/kv_geometry.h"

namespace prefixd {
namespace {

constexpr double kTol = 1e-8;

// The test vectors of docs/rope.md: fp64, d = 8, base 1e4, x = 1..8.
const std::vector<double> kX = {1, 2, 3, 4, 5, 6, 7, 8};

RopeConfig Rope(RopeLayout layout, int rotary_dim = 0) {
  RopeConfig rope;
  rope.theta = 1e4;
  rope.layout = layout;
  rope.rotary_dim = rotary_dim;
  return rope;
}

std::vector<double> Rotated(std::vector<double> x, int64_t delta,
                            const RopeConfig& rope) {
  RotateKey(absl::MakeSpan(x), delta, rope, static_cast<int>(x.size()));
  return x;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want,
                double tol = kTol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
  }
}

double MaxError(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i)
    err = std::max(err, std::fabs(a[i] - b[i]));
  return err;
}

TEST(RopeTest, NeoxVector) {
  ExpectNear(Rotated(kX, 5, Rope(RopeLayout::kNeox)),
             {5.078283559, -1.121388108, 2.646396596, 3.959950167, 0.459386653,
              6.224346449, 7.141189331, 8.019899917});
}

TEST(RopeTest, NeoxRotationsCompose) {
  const std::vector<double> r12 = {3.526718549, -4.867519007, 2.140440457,
                                   3.903714307, 3.682696876,  4.038224699,
                                   7.308797073, 8.047422855};
  const RopeConfig rope = Rope(RopeLayout::kNeox);
  ExpectNear(Rotated(Rotated(kX, 5, rope), 7, rope), r12);
  ExpectNear(Rotated(kX, 12, rope), r12);
}

TEST(RopeTest, GptjVector) {
  ExpectNear(Rotated(kX, 12, Rope(RopeLayout::kGptj)),
             {1.916999795, 1.151134999, -2.641083080, 4.245548276, 4.245769936,
              6.555412852, 6.903498310, 8.083421991});
}

TEST(RopeTest, PartialRotaryLeavesTheTailAlone) {
  ExpectNear(Rotated(kX, 12, Rope(RopeLayout::kNeox, 4)),
             {2.453572713, 1.506768443, 1.994988958, 4.210658958, 5, 6, 7, 8});
}

TEST(RopeTest, NegativeDeltaUndoes) {
  for (RopeLayout layout : {RopeLayout::kNeox, RopeLayout::kGptj}) {
    for (int rotary : {0, 4}) {
      const RopeConfig rope = Rope(layout, rotary);
      ExpectNear(Rotated(Rotated(kX, 12, rope), -12, rope), kX, 1e-12);
    }
  }
}

TEST(RopeTest, WrongLayoutShowsALargeError) {
  const std::vector<double> neox = Rotated(kX, 12, Rope(RopeLayout::kNeox));
  const std::vector<double> gptj = Rotated(kX, 12, Rope(RopeLayout::kGptj));
  EXPECT_GT(MaxError(neox, gptj), 1.0);
  // Rotating cached neox keys with the gptj pairing does not reach R(17)x.
  const std::vector<double> want = Rotated(kX, 17, Rope(RopeLayout::kNeox));
  const std::vector<double> wrong = Rotated(
      Rotated(kX, 12, Rope(RopeLayout::kNeox)), 5, Rope(RopeLayout::kGptj));
  EXPECT_GT(MaxError(wrong, want), 1.0);
}

TEST(RopeTest, Llama3Frequencies) {
  RopeConfig rope;
  rope.theta = 5e5;
  rope.scaling = RopeScaling::kLlama3;
  rope.factor = 8;
  rope.low_freq_factor = 1;
  rope.high_freq_factor = 4;
  rope.original_max_position = 8192;
  const std::vector<double> f = InvFrequencies(rope, 128);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_NEAR(f[29], 2.166570764e-3, 1e-12);
  EXPECT_NEAR(f[30], 1.371893568e-3, 1e-12);
  EXPECT_NEAR(f[40], 3.428102196e-5, 1e-14);
  EXPECT_NEAR(f[63], 3.068925989e-7, 1e-16);
  // High frequencies are untouched, low ones divided by the factor.
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_DOUBLE_EQ(f[63], std::pow(5e5, -126.0 / 128) / 8);
}

TEST(RopeTest, DefaultAndLinearFrequencies) {
  RopeConfig rope = Rope(RopeLayout::kNeox);
  std::vector<double> f = InvFrequencies(rope, 8);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_NEAR(f[1], 0.1, 1e-15);
  EXPECT_NEAR(f[2], 0.01, 1e-15);
  EXPECT_NEAR(f[3], 0.001, 1e-15);
  rope.scaling = RopeScaling::kLinear;
  rope.factor = 4;
  f = InvFrequencies(rope, 8);
  EXPECT_DOUBLE_EQ(f[0], 0.25);
  EXPECT_NEAR(f[3], 0.00025, 1e-15);
  // Linear scaling is a slower rotation: R_linear(4 d) = R_default(d).
  ExpectNear(Rotated(kX, 48, rope), Rotated(kX, 12, Rope(RopeLayout::kNeox)),
             1e-12);
}

TEST(RopeTest, YarnFrequencies) {
  // Qwen2.5-style YaRN: head_dim 128, theta 1e6, factor 4 over 32768.
  // Correction range [23, 40]: below it unscaled, above it / factor,
  // between a linear blend. Values from Hugging Face's formula in fp64.
  RopeConfig rope;
  rope.theta = 1e6;
  rope.scaling = RopeScaling::kYarn;
  rope.factor = 4;
  rope.original_max_position = 32768;
  const std::vector<double> f = InvFrequencies(rope, 128);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_NEAR(f[10], 0.11547819846894582, 1e-15);
  EXPECT_NEAR(f[20], 0.01333521432163324, 1e-16);
  EXPECT_NEAR(f[30], 0.0010643609812470017, 1e-17);
  EXPECT_NEAR(f[40], 4.445698525097307e-05, 1e-19);
  EXPECT_NEAR(f[63], 3.102344401879299e-07, 1e-21);
  EXPECT_NEAR(YarnAttentionFactor(rope), 1.138629436111989, 1e-15);
  // Rotations compose under YaRN too, and the magnitude is untouched.
  std::vector<double> x(128);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * i) + 0.1;
  std::vector<double> two_steps = x;
  RotateKey(absl::MakeSpan(two_steps), 700, rope, 128);
  RotateKey(absl::MakeSpan(two_steps), -200, rope, 128);
  std::vector<double> one_step = x;
  RotateKey(absl::MakeSpan(one_step), 500, rope, 128);
  ExpectNear(two_steps, one_step, 1e-9);
  double norm_x = 0, norm_r = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    norm_x += x[i] * x[i];
    norm_r += one_step[i] * one_step[i];
  }
  EXPECT_NEAR(norm_x, norm_r, 1e-9);
}

TEST(RopeTest, ReRotatingCachedKeysMatchesComputingAtTheNewPosition) {
  // What an engine does with a segment whose rope_delta is 100: keys
  // K_p = R(p) k were cached at p = 0..31; reused at p + 100.
  RopeConfig rope;
  rope.theta = 5e5;
  rope.scaling = RopeScaling::kLlama3;
  rope.factor = 8;
  rope.original_max_position = 8192;
  constexpr int kHeadDim = 64;
  const std::vector<double> f = InvFrequencies(rope, kHeadDim);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  for (int64_t p = 0; p < 32; ++p) {
    std::vector<double> k(kHeadDim);
    for (double& v : k) v = normal(rng);
    std::vector<double> cached = k;
    RotateKeyWithFrequencies(absl::MakeSpan(cached), p, f, rope.layout);
    RotateKeyWithFrequencies(absl::MakeSpan(cached), 100, f, rope.layout);
    std::vector<double> fresh = k;
    RotateKey(absl::MakeSpan(fresh), p + 100, rope, kHeadDim);
    ExpectNear(cached, fresh, 1e-9);
  }
}

TEST(RopeTest, NonComposableScalingsPoisonTheKey) {
  for (RopeScaling scaling :
       {RopeScaling::kDynamicNtk, RopeScaling::kLongRope}) {
    RopeConfig rope = Rope(RopeLayout::kNeox);
    rope.scaling = scaling;
    rope.factor = 2;
    EXPECT_TRUE(InvFrequencies(rope, 8).empty());
    std::vector<double> x = kX;
    RotateKey(absl::MakeSpan(x), 3, rope, 8);
    for (double v : x) EXPECT_TRUE(std::isnan(v));
  }
  // A key of the wrong length is misuse too.
  std::vector<double> x = kX;
  RotateKey(absl::MakeSpan(x), 3, Rope(RopeLayout::kNeox), 16);
  EXPECT_TRUE(std::isnan(x[0]));
  // Delta 0 is the identity.
  ExpectNear(Rotated(kX, 0, Rope(RopeLayout::kGptj)), kX, 0);
}

}  // namespace
}  // namespace prefixd
