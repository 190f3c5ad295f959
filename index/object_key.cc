#include "index/object_key.h"

#include <cstdint>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace prefixd {
namespace {

bool AllHex(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// The value of 16 hex digits, big-endian.
std::optional<EngineHash> Hex64(absl::string_view digits) {
  uint64_t v = 0;
  if (!absl::SimpleHexAtoi(digits, &v)) return std::nullopt;
  return v;
}

// vLLM's: the last segment that is a hash (an even count, at least 16, of
// hex digits after an optional 0x); its low 64 bits.
std::optional<EngineHash> VllmKey(absl::string_view key) {
  const std::vector<absl::string_view> parts = absl::StrSplit(key, '@');
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    absl::string_view h = *it;
    if (absl::StartsWith(h, "0x") || absl::StartsWith(h, "0X"))
      h.remove_prefix(2);
    if (h.size() >= 16 && h.size() % 2 == 0 && AllHex(h))
      return Hex64(h.substr(h.size() - 16));
  }
  return std::nullopt;
}

// SGLang's: the first run of exactly 64 hex digits that starts the key or
// follows '_', and ends it or is followed by '_'; its first 64 bits.
std::optional<EngineHash> SglangKey(absl::string_view key) {
  constexpr size_t kDigits = 64;
  for (absl::string_view run : absl::StrSplit(key, '_')) {
    if (run.size() == kDigits && AllHex(run)) return Hex64(run.substr(0, 16));
  }
  return std::nullopt;
}

}  // namespace

std::optional<EngineHash> EngineHashOfObjectKey(absl::string_view key) {
  if (absl::StrContains(key, '@')) return VllmKey(key);
  return SglangKey(key);
}

}  // namespace prefixd
