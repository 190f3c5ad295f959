#include "base/flag_parser.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace prefixd {
namespace {

constexpr size_t kHelpWidth = 80;
// The widest flag whose help starts on its own line; wider ones put the
// help below, so that one long flag does not squeeze every help text.
constexpr size_t kMaxFlagColumn = 24;

const FlagSpec* FindSpec(const std::vector<FlagSpec>& spec,
                         const std::string& name) {
  for (const FlagSpec& f : spec) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// Levenshtein distance: insertions, deletions and substitutions.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "unknown flag --NAME", and the flag most likely meant: NAME with '-' for
// '_' (vLLM and SGLang spell their flags with dashes: --index-source), else
// the nearest known flag within 2 edits and a third of the name's length.
// (--noNAME for a NAME that takes a value says so.)
absl::Status UnknownFlag(const std::vector<FlagSpec>& spec,
                         const std::string& name) {
  if (absl::StartsWith(name, "no") && FindSpec(spec, name.substr(2))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown flag --", name, ": --no negates a boolean flag; --",
        name.substr(2), " takes a value"));
  }
  const std::string underscored = absl::StrReplaceAll(name, {{"-", "_"}});
  if (underscored != name && FindSpec(spec, underscored) != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown flag --", name,
                     ": flags are spelled with underscores, --", underscored));
  }
  const FlagSpec* nearest = nullptr;
  size_t distance = 3;
  for (const FlagSpec& f : spec) {
    const size_t d = EditDistance(underscored, f.name);
    if (d < distance && d * 3 <= name.size()) {
      nearest = &f;
      distance = d;
    }
  }
  return absl::InvalidArgumentError(nearest == nullptr
                                        ? absl::StrCat("unknown flag --", name)
                                        : absl::StrCat("unknown flag --", name,
                                                       "; did you mean --",
                                                       nearest->name, "?"));
}

// "true" or "false" for a boolean flag given `value` (nullopt: bare --name).
absl::StatusOr<std::string> BoolValue(const std::string& name,
                                      const std::optional<std::string>& value) {
  if (!value || *value == "true") return std::string("true");
  if (*value == "false") return *value;
  return absl::InvalidArgumentError(absl::StrCat(
      "--", name, " takes no value (or true or false), not \"", *value, "\""));
}

// Appends `text` to `out` wrapped to kHelpWidth; `column` is where the
// text starts on the current line and every continuation line.
void AppendWrapped(const std::string& text, size_t column, std::string& out) {
  size_t used = column;
  bool first = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!first && used + 1 + word.size() > kHelpWidth) {
      absl::StrAppend(&out, "\n", std::string(column, ' '));
      used = column;
      first = true;
    }
    if (!first) {
      out += ' ';
      ++used;
    }
    absl::StrAppend(&out, word);
    used += word.size();
    first = false;
  }
  out += '\n';
}

}  // namespace

absl::StatusOr<ParsedFlags> ParsedFlags::Parse(
    const std::vector<FlagSpec>& spec, const std::vector<std::string>& args) {
  ParsedFlags parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      parsed.positional_.insert(parsed.positional_.end(), args.begin() + i + 1,
                                args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      parsed.positional_.push_back(arg);
      continue;
    }
    std::string name = arg == "-h" ? "help" : arg.substr(arg[1] == '-' ? 2 : 1);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const FlagSpec* flag = FindSpec(spec, name);
    if (flag == nullptr && !value && absl::StartsWith(name, "no")) {
      const FlagSpec* negated = FindSpec(spec, name.substr(2));
      if (negated != nullptr && negated->value_name.empty()) {
        parsed.values_[negated->name].push_back("false");
        continue;
      }
    }
    if (flag == nullptr) return UnknownFlag(spec, name);
    if (flag->value_name.empty()) {
      absl::StatusOr<std::string> b = BoolValue(name, value);
      if (!b.ok()) return b.status();
      parsed.values_[name].push_back(*b);
      continue;
    }
    if (!value) {
      if (i + 1 == args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value (--", name, "=",
                         flag->value_name, ")"));
      }
      value = args[++i];
    }
    parsed.values_[name].push_back(*value);
  }
  return parsed;
}

const std::string* ParsedFlags::Find(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second.back();
}

std::vector<std::string> ParsedFlags::All(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>() : it->second;
}

std::string ParsedFlags::String(const std::string& name,
                                const std::string& fallback) const {
  const std::string* value = Find(name);
  return value == nullptr ? fallback : *value;
}

bool ParsedFlags::Bool(const std::string& name) const {
  return String(name) == "true";
}

absl::StatusOr<uint64_t> ParsedFlags::Uint(const std::string& name,
                                           uint64_t fallback) const {
  if (!Has(name)) return fallback;
  const std::string text = String(name);
  uint64_t v = 0;
  const bool hex = absl::StartsWithIgnoreCase(text, "0x");
  if (hex ? !absl::SimpleHexAtoi(text.substr(2), &v)
          : !absl::SimpleAtoi(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, " takes a non-negative integer, not '", text, "'"));
  }
  return v;
}

absl::StatusOr<int64_t> ParsedFlags::Int(const std::string& name,
                                         int64_t fallback) const {
  if (!Has(name)) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(String(name), &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, " takes an integer, not '", String(name), "'"));
  }
  return v;
}

absl::StatusOr<absl::Duration> ParsedFlags::Duration(
    const std::string& name, absl::Duration fallback) const {
  if (!Has(name)) return fallback;
  const std::string text = String(name);
  absl::Duration d;
  double seconds = 0;
  if (absl::ParseDuration(text, &d) && d >= absl::ZeroDuration()) return d;
  if (absl::SimpleAtod(text, &seconds) && seconds >= 0)
    return absl::Seconds(seconds);
  return absl::InvalidArgumentError(absl::StrCat(
      "--", name, " takes a duration such as 5s or 250ms, not '", text, "'"));
}

absl::Status ParsedFlags::NoPositional() const {
  if (positional_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"",
                                                 positional_.front(),
                                                 "\"; flags start with --"));
}

void PrintFlagHelp(const std::vector<FlagSpec>& spec, std::ostream& out) {
  std::vector<std::string> left;
  size_t width = 0;
  for (const FlagSpec& f : spec) {
    left.push_back(absl::StrCat("--", f.name, f.value_name.empty() ? "" : "=",
                                f.value_name));
    if (left.back().size() <= kMaxFlagColumn)
      width = std::max(width, left.back().size());
  }
  const size_t column = 2 + width + 3;
  std::string text;
  for (size_t i = 0; i < spec.size(); ++i) {
    absl::StrAppend(&text, "  ", left[i]);
    if (left[i].size() > width) {
      absl::StrAppend(&text, "\n", std::string(column, ' '));
    } else {
      text.append(width - left[i].size() + 3, ' ');
    }
    std::string help = spec[i].help;
    if (!spec[i].default_text.empty())
      absl::StrAppend(&help, " (default: ", spec[i].default_text, ")");
    AppendWrapped(help, column, text);
  }
  out << text;
}

}  // namespace prefixd
