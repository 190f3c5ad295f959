#include "client/cli_flags.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace prefixd {
namespace {

const FlagSpec* Find(const std::vector<FlagSpec>& spec,
                     const std::string& name) {
  for (const FlagSpec& f : spec) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

absl::Status Unknown(const std::string& arg) {
  return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
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
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    std::optional<std::string> value;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body.resize(eq);
    }
    const FlagSpec* flag = Find(spec, body);
    if (flag == nullptr && !value && absl::StartsWith(body, "no")) {
      const FlagSpec* negated = Find(spec, body.substr(2));
      if (negated != nullptr && negated->value_name.empty()) {
        parsed.values_[negated->name] = "false";
        continue;
      }
    }
    if (flag == nullptr) return Unknown(arg);
    if (flag->value_name.empty()) {
      bool b = true;
      if (value && !absl::SimpleAtob(*value, &b)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", body, " takes true or false, not '", *value, "'"));
      }
      parsed.values_[body] = b ? "true" : "false";
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", body, " needs a value (--", body, "=",
                         flag->value_name, ")"));
      }
      value = args[++i];
    }
    parsed.values_[body] = *value;
  }
  return parsed;
}

std::string ParsedFlags::String(const std::string& name,
                                const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
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

void PrintFlagHelp(const std::vector<FlagSpec>& spec, std::ostream& out) {
  std::vector<std::string> left;
  size_t width = 0;
  for (const FlagSpec& f : spec) {
    left.push_back(absl::StrCat("--", f.name, f.value_name.empty() ? "" : "=",
                                f.value_name));
    width = std::max(width, left.back().size());
  }
  for (size_t i = 0; i < spec.size(); ++i) {
    out << "  " << left[i] << std::string(width - left[i].size() + 3, ' ')
        << spec[i].help;
    if (!spec[i].default_text.empty())
      out << " (default: " << spec[i].default_text << ")";
    out << "\n";
  }
}

}  // namespace prefixd
