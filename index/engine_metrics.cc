#include "index/engine_metrics.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"

namespace prefixd {
namespace {

enum Gauge { kRunning = 0, kWaiting = 1, kKvUsage = 2, kOldKvUsage = 3 };

struct Known {
  absl::string_view name;
  Gauge gauge;
};

constexpr Known kKnown[] = {
    {"vllm:num_requests_running", kRunning},
    {"sglang:num_running_reqs", kRunning},
    {"vllm:num_requests_waiting", kWaiting},
    {"sglang:num_queue_reqs", kWaiting},
    {"vllm:kv_cache_usage_perc", kKvUsage},
    {"sglang:token_usage", kKvUsage},
    {"vllm:gpu_cache_usage_perc", kOldKvUsage},
};

// Requests summed, usage the highest, per gauge.
struct Totals {
  double value[4] = {0, 0, 0, 0};
  bool seen[4] = {false, false, false, false};

  void Add(Gauge g, double v) {
    value[g] = g <= kWaiting ? value[g] + v : std::max(value[g], v);
    seen[g] = true;
  }
};

// Whether `c` may be the i-th character of a label name.
bool LabelNameChar(char c, size_t i) {
  return absl::ascii_isalpha(c) || c == '_' ||
         (i > 0 && absl::ascii_isdigit(c));
}

void SkipBlanks(absl::string_view* s) {
  *s = absl::StripLeadingAsciiWhitespace(*s);
}

// A quoted label value after its opening quote, up to and past the
// closing one; \\, \" and \n are the escapes.
absl::Status ReadQuoted(absl::string_view* s, std::string* out) {
  while (!s->empty()) {
    const char c = s->front();
    s->remove_prefix(1);
    if (c == '"') return absl::OkStatus();
    if (c != '\\') {
      out->push_back(c);
      continue;
    }
    if (s->empty()) break;
    const char e = s->front();
    s->remove_prefix(1);
    if (e == 'n') {
      out->push_back('\n');
    } else if (e == '\\' || e == '"') {
      out->push_back(e);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "a label value has the escape \\", absl::CHexEscape({&e, 1}),
          " (only \\\\, \\\" and \\n are escapes)"));
    }
  }
  return absl::InvalidArgumentError("a label value has no closing quote");
}

// {name="value",...} (a trailing comma allowed), the '{' already read.
absl::Status ReadLabels(absl::string_view* s, std::vector<LabelPair>* out) {
  while (true) {
    SkipBlanks(s);
    if (absl::ConsumePrefix(s, "}")) return absl::OkStatus();
    size_t n = 0;
    while (n < s->size() && LabelNameChar((*s)[n], n)) ++n;
    if (n == 0) return absl::InvalidArgumentError("a label name is missing");
    LabelPair pair{std::string(s->substr(0, n)), ""};
    s->remove_prefix(n);
    SkipBlanks(s);
    if (!absl::ConsumePrefix(s, "=")) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", pair.name, " has no '='"));
    }
    SkipBlanks(s);
    if (!absl::ConsumePrefix(s, "\"")) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", pair.name, "'s value is not quoted"));
    }
    RETURN_IF_ERROR(ReadQuoted(s, &pair.value));
    out->push_back(std::move(pair));
    SkipBlanks(s);
    if (absl::ConsumePrefix(s, "}")) return absl::OkStatus();
    if (!absl::ConsumePrefix(s, ",")) {
      return absl::InvalidArgumentError("labels are not separated by ','");
    }
  }
}

// The next blank-separated token of *s.
absl::string_view Token(absl::string_view* s) {
  SkipBlanks(s);
  size_t end = 0;
  while (end < s->size() && !absl::ascii_isspace((*s)[end])) ++end;
  const absl::string_view token = s->substr(0, end);
  s->remove_prefix(end);
  return token;
}

// The rest of a sample line after its name: labels, value, an optional
// timestamp, nothing else.
absl::Status ReadSample(absl::string_view rest, std::vector<LabelPair>* labels,
                        double* value) {
  SkipBlanks(&rest);
  if (absl::ConsumePrefix(&rest, "{"))
    RETURN_IF_ERROR(ReadLabels(&rest, labels));
  const absl::string_view v = Token(&rest);
  if (v.empty()) return absl::InvalidArgumentError("the value is missing");
  if (!absl::SimpleAtod(v, value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the value \"", absl::CHexEscape(v.substr(0, 64)),
                     "\" is not a number"));
  }
  const absl::string_view ts = Token(&rest);
  double unused = 0;
  if (!ts.empty() && !absl::SimpleAtod(ts, &unused)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the timestamp \"", absl::CHexEscape(ts.substr(0, 64)),
                     "\" is not a number"));
  }
  SkipBlanks(&rest);
  if (!rest.empty()) {
    return absl::InvalidArgumentError("more follows the value and timestamp");
  }
  if (!std::isfinite(*value) || *value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the value ", *value, " is not a finite number >= 0"));
  }
  return absl::OkStatus();
}

bool Matches(absl::Span<const LabelPair> labels,
             absl::Span<const LabelPair> match) {
  for (const LabelPair& m : match) {
    const bool found =
        std::any_of(labels.begin(), labels.end(), [&](const LabelPair& l) {
          return l.name == m.name && l.value == m.value;
        });
    if (!found) return false;
  }
  return true;
}

const Known* KnownOf(absl::string_view line) {
  const absl::string_view name = line.substr(0, line.find_first_of("{ \t"));
  for (const Known& k : kKnown) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::string Wanted(absl::Span<const LabelPair> match) {
  std::string out =
      "no series of vllm:num_requests_running, vllm:num_requests_waiting, "
      "sglang:num_running_reqs or sglang:num_queue_reqs";
  if (match.empty()) return out;
  return absl::StrCat(out, " with labels {",
                      absl::StrJoin(match, ",",
                                    [](std::string* o, const LabelPair& p) {
                                      absl::StrAppend(o, p.name, "=\"",
                                                      absl::CHexEscape(p.value),
                                                      "\"");
                                    }),
                      "}");
}

}  // namespace

bool IsLabelName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!LabelNameChar(name[i], i)) return false;
  }
  return true;
}

absl::StatusOr<EngineLoad> ReadEngineMetrics(
    absl::string_view text, absl::Span<const LabelPair> match) {
  Totals totals;
  std::vector<LabelPair> labels;
  size_t line_number = 0;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    absl::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    ++line_number;
    SkipBlanks(&line);
    const Known* known = KnownOf(line);
    if (known == nullptr) continue;  // a comment, or a series not read
    labels.clear();
    double value = 0;
    if (absl::Status s =
            ReadSample(line.substr(known->name.size()), &labels, &value);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_number, " (", absl::CHexEscape(line.substr(0, 160)),
          line.size() > 160 ? "..." : "", "): ", s.message()));
    }
    if (Matches(labels, match)) totals.Add(known->gauge, value);
  }
  if (!totals.seen[kRunning] && !totals.seen[kWaiting]) {
    return absl::NotFoundError(Wanted(match));
  }
  EngineLoad load;
  load.running = static_cast<int64_t>(
      std::llround(std::min(totals.value[kRunning], 1e15)));
  load.waiting = static_cast<int64_t>(
      std::llround(std::min(totals.value[kWaiting], 1e15)));
  const double usage = totals.seen[kKvUsage] ? totals.value[kKvUsage]
                                             : totals.value[kOldKvUsage];
  load.kv_usage = std::min(usage, 1.0);
  return load;
}

}  // namespace prefixd
