// The command line of prefixd, prefixctl and `prefixctl plan`: one flag
// grammar, one help layout and one set of exit codes for the three. Not absl
// flags: those are process globals, one set per binary, while prefixctl
// needs one set per subcommand (each with its own --help), --listen repeats
// (absl replaces, we append), and tests parse argv without globals.
//
// Accepted forms: --name=value, --name value, -name value; for boolean
// flags --name, --name=true|false and --noname. -h is --help. "--" ends the
// flags; what follows, and every argument not starting with -, is
// positional.
//
// In base/ (std and abseil only), which every layer may include: server/
// and client/ both use it and neither may include the other
// (docs/architecture.md).
#ifndef PREFIXD_BASE_FLAG_PARSER_H_
#define PREFIXD_BASE_FLAG_PARSER_H_

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace prefixd {

// Exit codes of prefixd and prefixctl (plan included); docs/client.md.
inline constexpr int kExitOk = 0;
// The work failed: an RPC error (or health not SERVING), no plan possible,
// a config that does not load, a daemon that cannot start or save.
inline constexpr int kExitFailure = 1;
// The command line is wrong: unknown flag, missing or malformed value,
// unexpected argument, flags that exclude each other.
inline constexpr int kExitUsage = 2;

struct FlagSpec {
  std::string name;
  std::string value_name;    // empty: a boolean flag
  std::string help;          // one paragraph; the printer wraps it
  std::string default_text;  // shown in --help when not empty
};

class ParsedFlags {
 public:
  // Parses args (argv without argv[0]) against spec. INVALID_ARGUMENT
  // naming the flag (and the value) for an unknown flag, a missing value or
  // a boolean given something other than true or false.
  static absl::StatusOr<ParsedFlags> Parse(
      const std::vector<FlagSpec>& spec, const std::vector<std::string>& args);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The last value given, or nullptr when the flag is absent.
  const std::string* Find(const std::string& name) const;
  // Every value given, in order: for the flags that repeat.
  std::vector<std::string> All(const std::string& name) const;
  std::string String(const std::string& name,
                     const std::string& fallback = "") const;
  bool Bool(const std::string& name) const;  // absent: false
  // Decimal, or hex with 0x.
  absl::StatusOr<uint64_t> Uint(const std::string& name,
                                uint64_t fallback) const;
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const;
  // "5s", "250ms", "2m"; a bare number is seconds.
  absl::StatusOr<absl::Duration> Duration(const std::string& name,
                                          absl::Duration fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // INVALID_ARGUMENT naming the first positional argument, if any: for the
  // command lines that take none.
  absl::Status NoPositional() const;

 private:
  // Values in the order given; booleans "true" / "false".
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

// One line per flag: "  --name=VALUE   help (default: x)", the help column
// aligned and wrapped to 80 columns; a flag too long for the column has its
// help on the lines below it.
void PrintFlagHelp(const std::vector<FlagSpec>& spec, std::ostream& out);

}  // namespace prefixd

#endif  // PREFIXD_BASE_FLAG_PARSER_H_
