// prefixd's command line: its flags in base/flag_parser.h's grammar (that
// parser is shared with prefixctl), turned into the overrides of the config
// file.
#ifndef PREFIXD_SERVER_FLAGS_H_
#define PREFIXD_SERVER_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace prefixd {

// Each set field overrides the config file; unset ones leave it alone.
struct CommandLine {
  // --config, repeatable: the files' texts are joined into one config
  // (textproto only), as a pod's init container joins a ConfigMap's config
  // and a Secret's principals.
  std::vector<std::string> config_paths;
  std::vector<std::string>
      listen;  // --listen, repeatable; replaces the file's list
  std::optional<std::string> metrics_listen;
  std::optional<std::string> model;  // preset name, or a path to a config.json
  std::optional<std::string> kv_dtype;
  std::optional<uint32_t> block_size;
  std::optional<std::string> kv_budget;
  std::optional<std::string> lease_ttl;
  std::optional<std::string> snapshot_path;
  // The fleet index (docs/index.md). --index_source=NAME=ENDPOINT[,REPLAY]
  // repeats and replaces the file's sources.
  std::vector<std::string> index_sources;
  std::optional<std::string> index_listen;
  std::optional<std::string> index_http_listen;  // the Conductor API
  std::optional<std::string> index_state_dir;
  std::optional<std::string> index_http_answer;  // by_tenant | by_instance
  std::optional<uint32_t> index_block_size;
  std::optional<std::string> index_decode_budget;  // bytes with units
  // --events_publish=ENDPOINT[,REPLAY_ENDPOINT] (docs/index.md, "The sidecar
  // publishes too"); replaces the file's endpoints.
  std::optional<std::string> events_publish;
  // --eviction_policy=lru|adaptive|shadow, checked and stored as
  // config.proto's EvictionPolicy name ("LRU", "ADAPTIVE", "SHADOW").
  std::optional<std::string> eviction_policy;
  // --check_config=FILE (repeatable, as --config): validate FILE (and the
  // other flags over it), print the resolved settings and exit 0, or the
  // error and exit 1; config_paths are the FILEs then.
  bool check_config = false;
  bool help = false;
  bool version = false;
};

// `args` excludes argv[0]. INVALID_ARGUMENT naming the flag (and the value)
// for unknown flags, missing values, positional arguments, a --block_size
// that is not a positive integer, an unknown --eviction_policy, --config
// naming other files than --check_config; main() exits kExitUsage (2) on it.
absl::StatusOr<CommandLine> ParseCommandLine(
    absl::Span<const char* const> args);

// Usage text: every flag with its default and meaning.
std::string CommandLineHelp();

}  // namespace prefixd

#endif  // PREFIXD_SERVER_FLAGS_H_
