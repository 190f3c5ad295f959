#include "bench/trace.h"

#include <algorithm>
#include <fstream>
#include <limits>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

ABSL_FLAG(std::string, trace_dir, PREFIXD_SOURCE_DIR "/tests/data/mooncake",
          "directory of <name>_trace.jsonl files (default: the repository's "
          "tests/data/mooncake)");
ABSL_FLAG(std::vector<std::string>, traces,
          std::vector<std::string>({"conversation", "synthetic"}),
          "traces to replay: names (file <trace_dir>/<name>_trace.jsonl) or "
          "paths ending in .jsonl");

namespace prefixd {
namespace bench {
namespace {

// The value after "key": in a JSON object line; npos if absent.
size_t ValueStart(absl::string_view line, absl::string_view key) {
  const std::string quoted = absl::StrCat("\"", key, "\"");
  size_t at = line.find(quoted);
  if (at == absl::string_view::npos) return at;
  at = line.find(':', at + quoted.size());
  if (at == absl::string_view::npos) return at;
  return line.find_first_not_of(" \t", at + 1);
}

bool ParseUint(absl::string_view line, size_t* at, uint64_t* out) {
  size_t i = *at;
  uint64_t v = 0;
  for (; i < line.size() && line[i] >= '0' && line[i] <= '9'; ++i) {
    if (v > (std::numeric_limits<uint64_t>::max() - 9) / 10) return false;
    v = v * 10 + static_cast<uint64_t>(line[i] - '0');
  }
  if (i == *at) return false;
  *at = i;
  *out = v;
  return true;
}

// An optional non-negative number: false only when the key is there with
// something else after it. A fraction after the digits is ignored.
bool ParseOptionalUint(absl::string_view line, absl::string_view key,
                       uint64_t* out) {
  size_t at = ValueStart(line, key);
  return at == absl::string_view::npos || ParseUint(line, &at, out);
}

bool ParseLine(absl::string_view line, Trace* trace, std::string* error) {
  Request r;
  r.first = trace->ids.size();
  size_t at = ValueStart(line, "input_length");
  if (at == absl::string_view::npos || !ParseUint(line, &at, &r.input_length)) {
    *error = "no \"input_length\" number";
    return false;
  }
  if (!ParseOptionalUint(line, "output_length", &r.output_length)) {
    *error = "\"output_length\" is not a non-negative number";
    return false;
  }
  if (!ParseOptionalUint(line, "timestamp", &r.timestamp_ms)) {
    *error = "\"timestamp\" is not a non-negative number";
    return false;
  }
  at = ValueStart(line, "hash_ids");
  if (at == absl::string_view::npos || line[at] != '[') {
    *error = "no \"hash_ids\" array";
    return false;
  }
  ++at;
  while (true) {
    at = line.find_first_not_of(" \t", at);
    if (at == absl::string_view::npos) break;
    if (line[at] == ']') {
      r.blocks = trace->ids.size() - r.first;
      trace->input_tokens += r.input_length;
      trace->requests.push_back(r);
      return true;
    }
    if (line[at] == ',') {
      ++at;
      continue;
    }
    uint64_t id;
    if (!ParseUint(line, &at, &id)) break;
    trace->ids.push_back(id);
    trace->max_id = std::max(trace->max_id, id);
  }
  *error = "unterminated or malformed \"hash_ids\"";
  return false;
}

}  // namespace

absl::StatusOr<Trace> LoadTrace(const std::string& name_or_path,
                                const std::string& dir) {
  const bool is_path = absl::EndsWith(name_or_path, ".jsonl");
  const std::string path =
      is_path ? name_or_path
              : absl::StrCat(dir, "/", name_or_path, "_trace.jsonl");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  Trace t;
  t.name = name_or_path;
  std::string line, error;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!ParseLine(line, &t, &error))
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", n, ": ", error));
  }
  if (t.requests.empty())
    return absl::InvalidArgumentError(absl::StrCat(path, " has no requests"));
  return t;
}

absl::StatusOr<uint64_t> ParseCapacity(const std::string& s) {
  if (s == "infinite" || s == "inf") return kInfinite;
  uint64_t v;
  if (!absl::SimpleAtoi(s, &v) || v == 0 || v >= kInfinite)
    return absl::InvalidArgumentError(absl::StrCat(
        "bad capacity '", s, "': a number of blocks > 0, or 'infinite'"));
  return v;
}

void ListBenchFlagsInHelp() {
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = [](absl::string_view file) {
    return absl::StrContains(file, "bench/");
  };
  config.contains_help_flags = config.contains_helpshort_flags;
  absl::SetFlagsUsageConfig(config);
}

std::string CapacityName(uint64_t capacity) {
  return capacity == kInfinite ? "infinite" : absl::StrCat(capacity);
}

}  // namespace bench
}  // namespace prefixd
