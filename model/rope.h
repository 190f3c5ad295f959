// The reference re-rotation an engine applies to a cached segment that
// prefixd returns with a non-zero rope_delta (docs/rope.md).
//
// Keys in a KV cache were rotated at the absolute position p they were
// computed at: K_p = R(p) k. Reused at position p + delta they must become
// R(p + delta) k = R(delta) K_p. RoPE rotations compose, R(a)R(b) = R(a+b),
// for the default, linear, llama3 and YaRN frequencies (each dimension pair
// turns at a fixed frequency), so the engine never needs the unrotated k.
// Values are never rotated.
//
// The exact operation, for each cached key vector x of one (layer, KV head,
// token), of length head_dim, in place:
//
//   r     = rotary_dim, or head_dim when rotary_dim is 0 (dims >= r untouched)
//   f[i]  = InvFrequencies(rope, head_dim)[i],  i = 0 .. r/2 - 1
//   angle = delta * f[i]                        (delta may be negative)
//   (a, b) = (i, i + r/2)  for layout neox      (Hugging Face rotate_half)
//          = (2i, 2i + 1)  for layout gptj      (interleaved)
//   x[a] <- x[a] cos(angle) - x[b] sin(angle)
//   x[b] <- x[a] sin(angle) + x[b] cos(angle)   (using the old x[a])
//
// Frequencies, with theta the base and r the rotated width:
//   default  f[i] = theta^(-2i/r)
//   linear   f[i] = theta^(-2i/r) / factor
//   llama3   wavelength w = 2 pi / f[i]; with low_wl = original/low_freq_factor
//            and high_wl = original/high_freq_factor: w < high_wl keeps f[i];
//            w > low_wl uses f[i]/factor; between, s = (original/w -
//            low_freq_factor) / (high_freq_factor - low_freq_factor) and
//            f[i] <- (1 - s) f[i]/factor + s f[i]
//            (Hugging Face's _compute_llama3_parameters).
//   yarn     Hugging Face's _compute_yarn_parameters with truncate = true:
//            d(n) = r ln(original_max_position / (2 pi n)) / (2 ln theta),
//            lo = max(floor(d(beta_fast)), 0), hi = min(ceil(d(beta_slow)),
//            r - 1) (hi += 0.001 if equal), ramp = clamp((i - lo) /
//            (hi - lo), 0, 1), f[i] = theta^(-2i/r) (1 - ramp) +
//            theta^(-2i/r) / factor * ramp: high frequencies extrapolate,
//            low ones interpolate.
//
// YaRN also scales attention by a magnitude factor (mscale,
// YarnAttentionFactor below) that Hugging Face folds into cos and sin. It
// belongs to the original computation of K_p and is already inside the
// cached key; the re-rotation is a pure rotation and must not apply it
// again, or the key would carry it twice.
//
// Porting to a GPU: compute angle = delta * f[i] in fp64 (or reduce it modulo
// 2 pi in fp64) before taking cos/sin in fp32: with f[0] = 1 and a delta of
// 100000, an fp32 angle is only resolved to 0.008 radians. One delta
// covers a whole segment, so cos/sin can be precomputed once per segment and
// shared by every layer, head and token in it. Rotate after dequantizing an
// fp8/int8/int4 cache, then requantize.
//
// Dynamic-NTK and LongRoPE choose frequencies from the sequence length, so a
// cached key cannot be moved by a rotation; the daemon refuses shift ALLOW
// for them. Here InvFrequencies returns an empty vector for them and
// RotateKey sets the key to NaN, so that misuse cannot pass silently.
//
// Thread safety: pure functions.
#ifndef PREFIXD_MODEL_ROPE_H_
#define PREFIXD_MODEL_ROPE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "model/kv_geometry.h"

namespace prefixd {

// The rotary_dim/2 inverse frequencies f[i] described above. Empty for
// dynamic-NTK and LongRoPE, and when the rotated width is not a positive
// even number <= head_dim.
std::vector<double> InvFrequencies(const RopeConfig& rope, int head_dim);

// Rotates one key vector by R(delta). REQUIRES: key.size() == head_dim and
// a composable scaling (RopeIsShiftable); otherwise every element of key is
// set to NaN.
void RotateKey(absl::Span<double> key, int64_t delta, const RopeConfig& rope,
               int head_dim);

// The same with frequencies computed once (InvFrequencies) for many keys.
// The rotated width is 2 * inv_freq.size(). REQUIRES:
// 2 * inv_freq.size() <= key.size(); otherwise key is set to NaN.
void RotateKeyWithFrequencies(absl::Span<double> key, int64_t delta,
                              absl::Span<const double> inv_freq,
                              RopeLayout layout);

// YaRN's attention magnitude factor as Hugging Face computes it without
// mscale overrides: 0.1 ln(factor) + 1 for factor > 1, else 1. Applied once
// when K_p is first computed, never by RotateKey.
double YarnAttentionFactor(const RopeConfig& rope);

}  // namespace prefixd

#endif  // PREFIXD_MODEL_ROPE_H_
