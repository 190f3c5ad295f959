#include "model/units.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace prefixd {
namespace {

using uint128 = unsigned __int128;

constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();

// A non-negative decimal mantissa x 10^exponent, with the mantissa's
// trailing zeros folded into the exponent so that it stays small.
struct Decimal {
  uint64_t mantissa = 0;
  int exponent = 0;
};

struct Unit {
  absl::string_view name;
  uint64_t multiplier;
};

constexpr uint64_t kKi = 1024;
constexpr Unit kByteUnits[] = {
    {"", 1},
    {"b", 1},
    {"kb", 1000},
    {"mb", 1000 * 1000},
    {"gb", 1000ULL * 1000 * 1000},
    {"tb", 1000ULL * 1000 * 1000 * 1000},
    {"pb", 1000ULL * 1000 * 1000 * 1000 * 1000},
    {"kib", kKi},
    {"mib", kKi* kKi},
    {"gib", kKi* kKi* kKi},
    {"tib", kKi* kKi* kKi* kKi},
    {"pib", kKi* kKi* kKi* kKi* kKi},
};

constexpr Unit kCountUnits[] = {
    {"", 1},
    {"k", 1000},
    {"M", 1000 * 1000},
    {"G", 1000ULL * 1000 * 1000},
    {"B", 1000ULL * 1000 * 1000},
    {"T", 1000ULL * 1000 * 1000 * 1000},
};

absl::Status Invalid(absl::string_view what, absl::string_view text,
                     absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid ", what, " \"", text, "\": ", why));
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Consumes [digits][.digits][(e|E)[+|-]digits] from the front of `*rest`.
// Returns false (and an explanation in *why) when there is no number or it
// has more significant digits than 64 bits hold.
bool ConsumeDecimal(absl::string_view* rest, Decimal* out, std::string* why) {
  absl::string_view s = *rest;
  size_t i = 0;
  uint64_t mantissa = 0;
  int exponent = 0;
  int digits = 0;
  bool overflow = false;
  auto take_digit = [&](char c, bool fraction) {
    ++digits;
    uint64_t next = 0;
    if (__builtin_mul_overflow(mantissa, 10, &next) ||
        __builtin_add_overflow(next, static_cast<uint64_t>(c - '0'), &next)) {
      // Beyond 19-20 significant digits only zeros can be exact; a later
      // non-zero digit is caught by the whole-number check below.
      if (c != '0') overflow = true;
      if (!fraction) ++exponent;
      return;
    }
    mantissa = next;
    if (fraction) --exponent;
  };
  while (i < s.size() && IsDigit(s[i])) take_digit(s[i++], false);
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && IsDigit(s[i])) take_digit(s[i++], true);
  }
  if (digits == 0) {
    *why = "expected a number";
    return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    bool negative = false;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) negative = s[j++] == '-';
    if (j < s.size() && IsDigit(s[j])) {
      int e = 0;
      while (j < s.size() && IsDigit(s[j])) {
        if (e < 100000) e = e * 10 + (s[j] - '0');
        ++j;
      }
      exponent += negative ? -e : e;
      i = j;
    }
  }
  if (overflow) {
    // A non-zero digit fell off the end of 64 bits: either the number is
    // too large for any unit, or it is too precise for us to be exact.
    *why =
        exponent >= 0 ? "larger than 2^64 - 1" : "too many significant digits";
    return false;
  }
  while (mantissa != 0 && mantissa % 10 == 0) {
    mantissa /= 10;
    ++exponent;
  }
  out->mantissa = mantissa;
  out->exponent = mantissa == 0 ? 0 : exponent;
  rest->remove_prefix(i);
  return true;
}

// mantissa x 10^exponent x multiplier, if it is a whole number < 2^64.
absl::StatusOr<uint64_t> Scale(const Decimal& d, uint64_t multiplier,
                               absl::string_view what, absl::string_view text) {
  uint128 value = static_cast<uint128>(d.mantissa) * multiplier;
  if (value == 0) return 0;
  int exponent = d.exponent;
  for (; exponent > 0; --exponent) {
    value *= 10;
    if (value > kMaxU64) break;
  }
  for (; exponent < 0; ++exponent) {
    if (value % 10 != 0) {
      return Invalid(what, text, "not a whole number");
    }
    value /= 10;
  }
  if (value > kMaxU64) {
    return Invalid(what, text, "larger than 2^64 - 1");
  }
  return static_cast<uint64_t>(value);
}

template <size_t N>
absl::StatusOr<uint64_t> ParseWithUnits(absl::string_view text,
                                        const Unit (&units)[N],
                                        bool case_insensitive,
                                        absl::string_view what,
                                        absl::string_view expected) {
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  if (absl::StartsWith(rest, "-")) {
    return Invalid(what, text, "must not be negative");
  }
  absl::ConsumePrefix(&rest, "+");
  Decimal decimal;
  std::string why;
  if (!ConsumeDecimal(&rest, &decimal, &why)) return Invalid(what, text, why);
  rest = absl::StripLeadingAsciiWhitespace(rest);
  const std::string unit =
      case_insensitive ? absl::AsciiStrToLower(rest) : std::string(rest);
  for (const Unit& u : units) {
    if (u.name == unit) return Scale(decimal, u.multiplier, what, text);
  }
  return Invalid(
      what, text,
      absl::StrCat("unknown unit \"", rest, "\"; expected ", expected));
}

// "x.yz" with trailing zeros dropped, if bytes / unit is exact at two
// decimals; empty otherwise.
std::string ExactIn(uint64_t bytes, uint64_t unit) {
  const uint128 hundredths = static_cast<uint128>(bytes) * 100;
  if (hundredths % unit != 0) return "";
  const uint64_t h = static_cast<uint64_t>(hundredths / unit);
  if (h % 100 == 0) return absl::StrCat(h / 100);
  if (h % 10 == 0) return absl::StrFormat("%d.%d", h / 100, (h / 10) % 10);
  return absl::StrFormat("%d.%02d", h / 100, h % 100);
}

}  // namespace

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  return ParseWithUnits(text, kByteUnits, /*case_insensitive=*/true, "size",
                        "B, kB, MB, GB, TB, PB, KiB, MiB, GiB, TiB or PiB");
}

absl::StatusOr<uint64_t> ParseSizeWithUnit(absl::string_view name,
                                           absl::string_view text) {
  absl::StatusOr<uint64_t> bytes = ParseBytes(text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " ", text, ": ", bytes.status().message()));
  }
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  if (*bytes != 0 && !trimmed.empty() && IsDigit(trimmed.back())) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " ", text, ": a size needs a unit, e.g. ", trimmed,
                     "GB (10^9 B) or ", trimmed, "GiB (2^30 B); write ",
                     trimmed, "B for bytes"));
  }
  return bytes;
}

std::string FormatBytes(uint64_t bytes) {
  struct Named {
    absl::string_view name;
    uint64_t value;
  };
  // Largest first, so the first exact hit is the shortest form.
  static constexpr Named kUnits[] = {
      {"PiB", kKi * kKi * kKi * kKi * kKi},
      {"PB", 1000ULL * 1000 * 1000 * 1000 * 1000},
      {"TiB", kKi * kKi * kKi * kKi},
      {"TB", 1000ULL * 1000 * 1000 * 1000},
      {"GiB", kKi * kKi * kKi},
      {"GB", 1000ULL * 1000 * 1000},
      {"MiB", kKi * kKi},
      {"MB", 1000 * 1000},
      {"KiB", kKi},
      {"kB", 1000},
  };
  if (bytes < kKi) return absl::StrCat(bytes, " B");
  for (const Named& unit : kUnits) {
    // "40647.5 MiB" is exact but harder to read than "39.69 GiB".
    if (bytes < unit.value || bytes / unit.value >= kKi) continue;
    std::string exact = ExactIn(bytes, unit.value);
    if (!exact.empty()) return absl::StrCat(exact, " ", unit.name);
  }
  for (const Named& unit : kUnits) {
    if (bytes >= unit.value && absl::EndsWith(unit.name, "iB")) {
      return absl::StrFormat(
          "%.2f %s",
          static_cast<double>(bytes) / static_cast<double>(unit.value),
          unit.name);
    }
  }
  return absl::StrCat(bytes, " B");
}

absl::StatusOr<uint64_t> ParseCount(absl::string_view text) {
  return ParseWithUnits(text, kCountUnits, /*case_insensitive=*/false, "count",
                        "k, M, G, B or T");
}

absl::StatusOr<absl::Duration> ParseDuration(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  absl::Duration d;
  if (!absl::ParseDuration(std::string(trimmed), &d)) {
    if (!trimmed.empty() && IsDigit(trimmed.back())) {
      return Invalid("duration", text, "needs a unit: ns, us, ms, s, m or h");
    }
    return Invalid("duration", text,
                   "expected a number with a unit, e.g. 300s, 5m, 1h, 250ms");
  }
  if (d < absl::ZeroDuration()) {
    return Invalid("duration", text, "must not be negative");
  }
  if (d == absl::InfiniteDuration()) {
    return Invalid("duration", text, "must be finite");
  }
  return d;
}

absl::StatusOr<uint64_t> ParseKvBudget(absl::string_view text,
                                       uint64_t bytes_per_token) {
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  const std::string lower = absl::AsciiStrToLower(rest);
  size_t suffix = 0;
  for (absl::string_view s : {"tokens", "token", "tok"}) {
    if (absl::EndsWith(lower, s)) {
      suffix = s.size();
      break;
    }
  }
  if (suffix == 0) {
    absl::StatusOr<uint64_t> bytes = ParseBytes(text);
    // "4294967296" could be bytes or tokens: the unit says which.
    if (bytes.ok() && *bytes != 0 && IsDigit(rest.back())) {
      return Invalid(
          "kv_budget", text,
          absl::StrCat("a bare number could be bytes or tokens; "
                       "write ",
                       rest, "B, ", rest, "tokens or a size such as 4GiB"));
    }
    return bytes;
  }
  rest.remove_suffix(suffix);
  absl::StatusOr<uint64_t> tokens = ParseCount(rest);
  if (!tokens.ok()) {
    return Invalid("kv_budget", text,
                   absl::StrCat("expected a token count before \"tokens\": ",
                                tokens.status().message()));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(*tokens, bytes_per_token, &bytes)) {
    return Invalid("kv_budget", text,
                   absl::StrCat(*tokens, " tokens x ", bytes_per_token,
                                " bytes per token is larger than 2^64 - 1"));
  }
  return bytes;
}

std::string FormatCount(uint64_t value) {
  std::string digits = absl::StrCat(value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

}  // namespace prefixd
