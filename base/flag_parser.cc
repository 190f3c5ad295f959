#include "base/flag_parser.h"

#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
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
