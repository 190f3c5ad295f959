#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/types/span.h"
#include "model/kv_geometry.h"

namespace prefixd {
namespace {

constexpr double kPi = 3.14159265358979323846;

void Poison(absl::Span<double> key) {
  std::fill(key.begin(), key.end(), std::numeric_limits<double>::quiet_NaN());
}

std::vector<double> BaseFrequencies(double theta, int dim) {
  std::vector<double> f(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    f[i] = std::pow(theta, -2.0 * i / dim);
  }
  return f;
}

void ApplyLlama3(const RopeConfig& rope, std::vector<double>& f) {
  const double original = rope.original_max_position;
  const double low_wavelen = original / rope.low_freq_factor;
  const double high_wavelen = original / rope.high_freq_factor;
  for (double& freq : f) {
    const double wavelen = 2 * kPi / freq;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      freq /= rope.factor;
      continue;
    }
    const double smooth = (original / wavelen - rope.low_freq_factor) /
                          (rope.high_freq_factor - rope.low_freq_factor);
    freq = (1 - smooth) * freq / rope.factor + smooth * freq;
  }
}

// The dimension index whose frequency makes num_rotations turns over the
// original context (YaRN paper, eq. for d(r)).
double YarnCorrectionDim(double num_rotations, int dim, double theta,
                         double original) {
  return dim * std::log(original / (num_rotations * 2 * kPi)) /
         (2 * std::log(theta));
}

void ApplyYarn(const RopeConfig& rope, int dim, std::vector<double>& f) {
  const double original = rope.original_max_position;
  double low =
      std::floor(YarnCorrectionDim(rope.beta_fast, dim, rope.theta, original));
  double high =
      std::ceil(YarnCorrectionDim(rope.beta_slow, dim, rope.theta, original));
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // as Hugging Face, to avoid 0/0
  for (size_t i = 0; i < f.size(); ++i) {
    const double ramp =
        std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1 - ramp;  // weight of the unscaled freq
    const double interpolated = f[i] / rope.factor;
    f[i] = interpolated * (1 - extrapolation) + f[i] * extrapolation;
  }
}

}  // namespace

std::vector<double> InvFrequencies(const RopeConfig& rope, int head_dim) {
  const int dim = EffectiveRotaryDim(rope, head_dim);
  if (dim <= 0 || dim % 2 != 0 || dim > head_dim ||
      !RopeIsShiftable(rope.scaling)) {
    return {};
  }
  std::vector<double> f = BaseFrequencies(rope.theta, dim);
  switch (rope.scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear:
      for (double& freq : f) freq /= rope.factor;
      break;
    case RopeScaling::kLlama3:
      ApplyLlama3(rope, f);
      break;
    case RopeScaling::kYarn:
      ApplyYarn(rope, dim, f);
      break;
    case RopeScaling::kDynamicNtk:
    case RopeScaling::kLongRope:
      return {};
  }
  return f;
}

void RotateKeyWithFrequencies(absl::Span<double> key, int64_t delta,
                              absl::Span<const double> inv_freq,
                              RopeLayout layout) {
  const size_t half = inv_freq.size();
  if (2 * half > key.size()) {
    Poison(key);
    return;
  }
  for (size_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(delta) * inv_freq[i];
    const double c = std::cos(angle);
    const double s = std::sin(angle);
    const size_t a = layout == RopeLayout::kNeox ? i : 2 * i;
    const size_t b = layout == RopeLayout::kNeox ? i + half : 2 * i + 1;
    const double xa = key[a];
    const double xb = key[b];
    key[a] = xa * c - xb * s;
    key[b] = xa * s + xb * c;
  }
}

void RotateKey(absl::Span<double> key, int64_t delta, const RopeConfig& rope,
               int head_dim) {
  const std::vector<double> f = InvFrequencies(rope, head_dim);
  if (f.empty() || key.size() != static_cast<size_t>(head_dim)) {
    Poison(key);
    return;
  }
  RotateKeyWithFrequencies(key, delta, f, rope.layout);
}

double YarnAttentionFactor(const RopeConfig& rope) {
  if (rope.factor <= 1) return 1.0;
  return 0.1 * std::log(rope.factor) + 1.0;
}

}  // namespace prefixd
