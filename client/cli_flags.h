// A small flag parser for prefixctl's subcommands. absl flags are process
// globals, one set per binary; prefixctl needs one set per subcommand, each
// with its own --help.
//
// Accepted forms: --name=value, --name value, -name value, and for boolean
// flags --name, --name=true|false, --noname. "--" ends the flags.
#ifndef PREFIXD_CLIENT_CLI_FLAGS_H_
#define PREFIXD_CLIENT_CLI_FLAGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace prefixd {

struct FlagSpec {
  std::string name;
  std::string value_name;  // empty: a boolean flag
  std::string help;
  std::string default_text;  // shown in --help when not empty
};

class ParsedFlags {
 public:
  // Parses args against spec. Positional arguments are collected in
  // positional(). INVALID_ARGUMENT for an unknown flag or a missing value.
  static absl::StatusOr<ParsedFlags> Parse(
      const std::vector<FlagSpec>& spec, const std::vector<std::string>& args);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string String(const std::string& name,
                     const std::string& fallback = "") const;
  bool Bool(const std::string& name) const;  // absent: false
  absl::StatusOr<uint64_t> Uint(const std::string& name,
                                uint64_t fallback) const;
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const;
  // "5s", "250ms", "2m"; a bare number is seconds.
  absl::StatusOr<absl::Duration> Duration(const std::string& name,
                                          absl::Duration fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;  // booleans: "true" / "false"
  std::vector<std::string> positional_;
};

// "  --name=VALUE   help (default: x)" lines, aligned.
void PrintFlagHelp(const std::vector<FlagSpec>& spec, std::ostream& out);

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_CLI_FLAGS_H_
