#include "client/id_list.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace prefixd {
namespace {

absl::Status ParseValue(absl::string_view item, absl::string_view text,
                        uint64_t max_value, uint64_t* value) {
  if (!absl::SimpleAtoi(text, value) || text.empty() || text[0] == '+') {
    return absl::InvalidArgumentError(
        absl::StrCat("bad list item '", item, "': '", text,
                     "' is not a non-negative integer"));
  }
  if (*value > max_value) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad list item '", item, "': ", *value,
                     " is above the maximum ", max_value));
  }
  return absl::OkStatus();
}

absl::Status AppendItem(absl::string_view item, uint64_t max_value,
                        std::vector<uint64_t>* out) {
  const size_t dash = item.find('-', 1);
  uint64_t first = 0;
  uint64_t last = 0;
  if (dash == absl::string_view::npos) {
    absl::Status s = ParseValue(item, item, max_value, &first);
    if (!s.ok()) return s;
    last = first;
  } else {
    absl::Status s = ParseValue(item, item.substr(0, dash), max_value, &first);
    if (s.ok()) s = ParseValue(item, item.substr(dash + 1), max_value, &last);
    if (!s.ok()) return s;
    if (first > last) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad range '", item, "': ", first, " > ", last));
    }
  }
  if (last - first >= kMaxIdListSize - out->size()) {
    return absl::InvalidArgumentError(absl::StrCat("list too long at '", item,
                                                   "': more than ",
                                                   kMaxIdListSize, " values"));
  }
  for (uint64_t v = first;; ++v) {
    out->push_back(v);
    if (v == last) break;
  }
  return absl::OkStatus();
}

template <typename T>
std::string FormatRuns(absl::Span<const T> ids) {
  if (ids.empty()) return "-";
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i + 1;
    while (j < ids.size() && ids[j - 1] != std::numeric_limits<T>::max() &&
           ids[j] == ids[j - 1] + 1) {
      ++j;
    }
    if (!out.empty()) out += ",";
    if (j - i >= 3) {
      absl::StrAppend(&out, ids[i], "-", ids[j - 1]);
      i = j;
    } else {
      absl::StrAppend(&out, ids[i]);
      ++i;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<uint64_t>> ParseIdList(absl::string_view text,
                                                  uint64_t max_value) {
  std::vector<uint64_t> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = line.substr(0, line.find('#'));
    for (absl::string_view item :
         absl::StrSplit(line, absl::ByAnyChar(", \t\r\f\v"))) {
      if (item.empty()) continue;
      absl::Status s = AppendItem(item, max_value, &out);
      if (!s.ok()) return s;
    }
  }
  return out;
}

absl::StatusOr<std::vector<uint64_t>> ReadIdListFile(const std::string& path,
                                                     uint64_t max_value) {
  std::ifstream in(path);
  if (!in)
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<uint64_t>> ids =
      ParseIdList(text.str(), max_value);
  if (!ids.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", ids.status().message()));
  }
  return ids;
}

absl::StatusOr<std::vector<uint32_t>> ToTokens(
    const std::vector<uint64_t>& ids) {
  std::vector<uint32_t> tokens;
  tokens.reserve(ids.size());
  for (uint64_t id : ids) {
    if (id > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", id, " does not fit in uint32"));
    }
    tokens.push_back(static_cast<uint32_t>(id));
  }
  return tokens;
}

std::string FormatIdList(absl::Span<const uint64_t> ids) {
  return FormatRuns(ids);
}
std::string FormatIdList(absl::Span<const uint32_t> ids) {
  return FormatRuns(ids);
}

}  // namespace prefixd
