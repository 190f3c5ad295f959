// Lists of token and block IDs as people type them: "1,2,3", "1-64",
// "1-16,40,41", or a file of such items separated by commas or whitespace
// ('#' starts a comment that runs to the end of the line).
#ifndef PREFIXD_CLIENT_ID_LIST_H_
#define PREFIXD_CLIENT_ID_LIST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace prefixd {

// Longest list ParseIdList builds (a range like 0-4294967295 is a typo).
inline constexpr size_t kMaxIdListSize = size_t{1} << 24;

// Parses items separated by commas and/or whitespace; an item is N or an
// inclusive range A-B (A <= B). Every value must be <= max_value.
// INVALID_ARGUMENT naming the bad item.
absl::StatusOr<std::vector<uint64_t>> ParseIdList(absl::string_view text,
                                                  uint64_t max_value);
// The same, read from a file.
absl::StatusOr<std::vector<uint64_t>> ReadIdListFile(const std::string& path,
                                                     uint64_t max_value);
// uint32 token IDs.
absl::StatusOr<std::vector<uint32_t>> ToTokens(
    const std::vector<uint64_t>& ids);

// The inverse of ParseIdList: runs of 3 or more consecutive values become
// ranges ("1-32,40,41"); "-" for an empty list.
std::string FormatIdList(absl::Span<const uint64_t> ids);
std::string FormatIdList(absl::Span<const uint32_t> ids);

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_ID_LIST_H_
