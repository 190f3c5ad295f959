// Sizes, counts and durations as operators write them in config files and
// flags ("4GiB", "160GB", "300s", "1000000tokens"), parsed exactly.
//
// Numbers: digits with an optional fraction and exponent ("1.5", "70e9",
// "2.5E3"). The result must be a whole number: "1.5KiB" is 1536 bytes, but
// "0.1KiB" (102.4 bytes) is refused rather than rounded. Negative numbers,
// overflow of 64 bits and unknown units are INVALID_ARGUMENT with a message
// that quotes the offending text.
//
// Thread safety: pure functions.
#ifndef PREFIXD_MODEL_UNITS_H_
#define PREFIXD_MODEL_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace prefixd {

// Bytes. Units (case-insensitive, optional space before the unit):
//   none or B                   bytes
//   kB MB GB TB PB              1000^1 .. 1000^5 (decimal, as disk and GPU
//                               vendors count)
//   KiB MiB GiB TiB PiB         1024^1 .. 1024^5
// "4GiB" = 4294967296, "160GB" = 160000000000, "1.5TiB" = 1649267441664.
absl::StatusOr<uint64_t> ParseBytes(absl::string_view text);

// ParseBytes for values a person types, where a bare number is ambiguous
// ("--weights 140": bytes? gigabytes?): anything but 0 must carry a unit.
// INVALID_ARGUMENT naming `name` and the text, e.g. "--weights 140: a size
// needs a unit, e.g. 140GB (10^9 B) or 140GiB (2^30 B)".
absl::StatusOr<uint64_t> ParseSizeWithUnit(absl::string_view name,
                                           absl::string_view text);

// A human form that parses back to the same value when it can: the largest
// unit (binary or decimal) in which the value is below 1024 and exact with at
// most two decimals ("4 GiB", "160 GB", "320 KiB", "1.5 GiB", "999 B");
// otherwise the largest binary unit, rounded to two decimals ("149.01 GiB").
std::string FormatBytes(uint64_t bytes);

// A plain count ("488281", "70e9", "1.5M"). Suffixes (case-sensitive):
// k = 10^3, M = 10^6, G or B = 10^9 (B as in "70B parameters"), T = 10^12.
absl::StatusOr<uint64_t> ParseCount(absl::string_view text);

// Durations: absl::ParseDuration's syntax ("300s", "5m", "1h", "250ms",
// "1h30m"; units ns us ms s m h). Negative and infinite durations, and
// numbers without a unit other than "0", are refused.
absl::StatusOr<absl::Duration> ParseDuration(absl::string_view text);

// kv_budget: either bytes with a unit (ParseBytes; "4GiB", "65536B") or a
// token count with the suffix "tokens" (also "token" or "tok", optional
// space before it), e.g. "1000000tokens" or "488k tokens", which resolves to
// count x bytes_per_token bytes. A bare number other than 0 is refused: it
// could be either. REQUIRES: bytes_per_token > 0 for a token
// budget.
absl::StatusOr<uint64_t> ParseKvBudget(absl::string_view text,
                                       uint64_t bytes_per_token);

// Integer with thousands separators: 488281 -> "488,281".
std::string FormatCount(uint64_t value);

}  // namespace prefixd

#endif  // PREFIXD_MODEL_UNITS_H_
