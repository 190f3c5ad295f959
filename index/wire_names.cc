#include "index/wire_names.h"

#include <utf8cpp/utf8.h>
#include <xxhash.h>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace prefixd {
namespace {

// The offset of the first byte that is a control character (C0, DEL), or
// npos. C1 controls are multi-byte in UTF-8 and shown as they are.
size_t FirstControl(absl::string_view value) {
  const auto it = std::find_if(value.begin(), value.end(), [](char c) {
    const unsigned char u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
  return it == value.end() ? absl::string_view::npos
                           : static_cast<size_t>(it - value.begin());
}

}  // namespace

absl::Status CheckWireName(absl::string_view field, absl::string_view value) {
  if (value.size() > kMaxWireNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", value.size(), " bytes, more than ", kMaxWireNameBytes));
  }
  const auto bad = utf8::find_invalid(value.begin(), value.end());
  if (bad != value.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", absl::CHexEscape(value),
                     "\" is not valid UTF-8 (byte ", bad - value.begin(), ")"));
  }
  if (const size_t at = FirstControl(value); at != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", absl::CHexEscape(value),
                     "\" has a control character (byte ", at, ")"));
  }
  return absl::OkStatus();
}

std::string SafeWireName(absl::string_view value) {
  if (CheckWireName("", value).ok()) return std::string(value);
  return absl::StrFormat("%s~%016x", absl::CHexEscape(value.substr(0, 48)),
                         XXH3_64bits(value.data(), value.size()));
}

}  // namespace prefixd
