#include "server/flags.h"

#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/flag_parser.h"
#include "base/status_macros.h"
#include "core/cache.h"
#include "model/kv_geometry.h"
#include "server/defaults.h"

namespace prefixd {
namespace {

const std::vector<FlagSpec>& Flags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"config", "FILE",
       "Config file: textproto, or JSON when the name ends in .json "
       "(schema: proto/prefixd/v1/config.proto). Flags override it. Repeat "
       "to join textproto files into one config, in order (a ConfigMap's "
       "config, then a Secret's principals).",
       "none"},
      {"listen", "ADDR",
       "Address to serve the gRPC API on: host:port or unix:///path. Repeat "
       "for several; any --listen replaces the config file's list. Port 0 "
       "picks a free port.",
       absl::StrCat(defaults::kTcpListen, " and ", defaults::kUnixListen)},
      {"metrics_listen", "HOST:PORT",
       "Address of the Prometheus /metrics endpoint.",
       defaults::kMetricsListen},
      {"model", "NAME|FILE",
       absl::StrCat("KV geometry and RoPE settings: a preset (",
                    absl::StrJoin(PresetNames(), ", "),
                    ") or a Hugging Face config.json path."),
       defaults::kModel},
      {"kv_dtype", "DTYPE",
       "How the engine stores K and V: fp32, fp16, bf16, fp8, int8, int4 or "
       "nvfp4.",
       defaults::kKvDtype},
      {"block_size", "TOKENS",
       "Tokens per KV block; must equal the engine's block (page) size.",
       absl::StrCat(defaults::kBlockSize)},
      {"kv_budget", "SIZE",
       "KV memory the cache may account for: bytes with units (4GiB, 160GB) "
       "or a token count (1000000tokens).",
       defaults::kKvBudget},
      {"lease_ttl", "DURATION",
       "Default lifetime of a lease that is not renewed (300s, 5m).",
       defaults::kLeaseTtl},
      {"snapshot_path", "FILE",
       "Where to write the cache state on shutdown and read it on start-up.",
       "none, no snapshot"},
      {"index_source", "NAME=ENDPOINT[,REPLAY]",
       "Fleet index: subscribe to an engine's KV events (vLLM/SGLang "
       "--kv-events-config), e.g. vllm-0=tcp://10.0.0.7:5557,"
       "tcp://10.0.0.7:5558 (the PUB endpoint, then the replay endpoint). "
       "A host name resolving to several addresses gives one worker per "
       "address. NAME=http://HOST:PORT follows an SGLang worker by its URL "
       "instead: its /server_info names every DP rank's sockets. "
       "Repeat for several engines; any --index_source replaces "
       "the config file's sources. See docs/index.md.",
       "none"},
      {"index_listen", "ENDPOINT",
       "Fleet index: bind a SUB socket (tcp://0.0.0.0:5557) that engines "
       "connect to; each names itself by its topic kv@<worker>@<model>.",
       "none"},
      {"index_http_listen", "HOST:PORT",
       "Fleet index: serve the Mooncake Conductor indexer API (HTTP, JSON "
       "or MessagePack: /register, /unregister, /query, /query_by_hash, "
       "/services) "
       "here, with the daemon's principals, e.g. 127.0.0.1:9470; over HTTPS "
       "with the gRPC listeners' certificate when auth.tls_cert_path is "
       "set. See docs/index.md, \"As a Mooncake Conductor\".",
       "off"},
      {"index_http_answer", "FORM",
       "Fleet index: how --index_http_listen's /query answers a JSON "
       "request: by_tenant (the RFC's {tenant: {instance: ...}}) or "
       "by_instance (Mooncake's current Conductor's {\"instances\": ...}). "
       "MessagePack requests are always answered by instance.",
       "by_tenant"},
      {"index_state_dir", "DIR",
       "Fleet index: keep the publishers registered through "
       "--index_http_listen in this directory, so they survive a restart.",
       "none, registrations end with the daemon"},
      {"index_block_size", "TOKENS",
       "Fleet index: the engines' block size (events of another size put "
       "the worker in ERROR).",
       "16"},
      {"index_decode_budget", "SIZE",
       "Fleet index: memory that decoding KV events may hold at once, over "
       "all sources (each decode reserves 24 times its payload, the most "
       "the decoder lets a batch hold; one larger than the budget decodes "
       "alone). Overrides index { "
       "decode_budget } of the config file.",
       defaults::kIndexDecodeBudget},
      {"events_publish", "ENDPOINT[,REPLAY]",
       "Publish this daemon's own cache changes as vLLM KV events, for a "
       "prefixd index, llm-d or Dynamo: the PUB endpoint (tcp://*:5557 "
       "binds; without a wildcard it connects), then the replay (ROUTER) "
       "endpoint it binds, e.g. tcp://*:5557,tcp://*:5558. Topic and buffer "
       "size: events_publish { } in the config file. See docs/index.md.",
       "none"},
      {"eviction_policy", "lru|adaptive|shadow",
       "Which unpinned blocks go first when the budget is full: lru (least "
       "recently used), adaptive (recency and frequency, for small caches "
       "and heavy churn) or shadow (reused blocks over one-off ones, unless "
       "a sampled LRU shadow would hit more; for caches much smaller than "
       "a multi-turn working set). Overrides eviction { policy } of the "
       "config file. See docs/operations.md.",
       "lru"},
      {"check_config", "FILE",
       "Validate the config file FILE (with the other flags over it) as "
       "start-up would, without serving: print the resolved settings and "
       "exit 0, or the error (naming the field and its value) and exit 1. "
       "Listeners are not bound, the snapshot is not read. Repeat for files "
       "joined into one config, as with --config.",
       ""},
      {"help", "", "Print this help and exit.", ""},
      {"version", "", "Print the version and exit.", ""},
  };
  return *flags;
}

void SetString(const ParsedFlags& flags, const std::string& name,
               std::optional<std::string>* field) {
  if (const std::string* v = flags.Find(name)) *field = *v;
}

absl::Status SetPositive(const ParsedFlags& flags, const std::string& name,
                         std::optional<uint32_t>* field) {
  const std::string* v = flags.Find(name);
  if (v == nullptr) return absl::OkStatus();
  uint32_t n = 0;
  if (!absl::SimpleAtoi(*v, &n) || n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "=", *v, ": want a positive integer"));
  }
  *field = n;
  return absl::OkStatus();
}

// The shapes of the fleet index's endpoint flags; the endpoints themselves
// are checked with the config.
absl::Status CheckEndpointShapes(const CommandLine& cl) {
  for (const std::string& v : cl.index_sources) {
    const size_t eq = v.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == v.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--index_source=", v, ": want NAME=ENDPOINT[,REPLAY_ENDPOINT]"));
    }
  }
  const std::optional<std::string>& p = cl.events_publish;
  if (p && (p->empty() || p->front() == ',' || p->back() == ',')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--events_publish=", *p, ": want ENDPOINT[,REPLAY_ENDPOINT]"));
  }
  return absl::OkStatus();
}

// --check_config=FILE names the config files themselves; --config naming
// others would leave it unclear which are checked.
absl::Status SetConfigPaths(const ParsedFlags& flags, CommandLine* cl) {
  const std::vector<std::string> config = flags.All("config");
  const std::vector<std::string> check = flags.All("check_config");
  if (check.empty()) {
    cl->config_paths = config;
    return absl::OkStatus();
  }
  if (!config.empty() && config != check) {
    return absl::InvalidArgumentError(
        absl::StrCat("--check_config=", absl::StrJoin(check, ","),
                     " with --config=", absl::StrJoin(config, ","),
                     ": name the files once, with --check_config"));
  }
  cl->config_paths = check;
  cl->check_config = true;
  return absl::OkStatus();
}

// Stores the policy by its config name (LRU, ADAPTIVE, SHADOW), whatever the
// case given.
absl::Status SetEvictionPolicy(const ParsedFlags& flags, CommandLine* cl) {
  const std::string* v = flags.Find("eviction_policy");
  if (v == nullptr) return absl::OkStatus();
  EvictionPolicy p;
  if (!ParseEvictionPolicy(*v, &p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--eviction_policy=", *v, ": want lru, adaptive or shadow"));
  }
  cl->eviction_policy = std::string(EvictionPolicyName(p));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(
    absl::Span<const char* const> args) {
  const std::vector<std::string> argv(args.begin(), args.end());
  ASSIGN_OR_RETURN(const ParsedFlags flags, ParsedFlags::Parse(Flags(), argv));
  RETURN_IF_ERROR(flags.NoPositional());
  CommandLine cl;
  RETURN_IF_ERROR(SetConfigPaths(flags, &cl));
  cl.listen = flags.All("listen");
  SetString(flags, "metrics_listen", &cl.metrics_listen);
  SetString(flags, "model", &cl.model);
  SetString(flags, "kv_dtype", &cl.kv_dtype);
  SetString(flags, "kv_budget", &cl.kv_budget);
  SetString(flags, "lease_ttl", &cl.lease_ttl);
  SetString(flags, "snapshot_path", &cl.snapshot_path);
  cl.index_sources = flags.All("index_source");
  SetString(flags, "index_listen", &cl.index_listen);
  SetString(flags, "index_http_listen", &cl.index_http_listen);
  SetString(flags, "index_state_dir", &cl.index_state_dir);
  SetString(flags, "index_http_answer", &cl.index_http_answer);
  SetString(flags, "index_decode_budget", &cl.index_decode_budget);
  SetString(flags, "events_publish", &cl.events_publish);
  for (const auto& [name, field] :
       {std::pair{"block_size", &cl.block_size},
        std::pair{"index_block_size", &cl.index_block_size}}) {
    RETURN_IF_ERROR(SetPositive(flags, name, field));
  }
  RETURN_IF_ERROR(SetEvictionPolicy(flags, &cl));
  RETURN_IF_ERROR(CheckEndpointShapes(cl));
  cl.help = flags.Bool("help");
  cl.version = flags.Bool("version");
  return cl;
}

std::string CommandLineHelp() {
  std::ostringstream out;
  out << "prefixd: a prefix-cache daemon beside an LLM inference engine.\n"
         "\n"
         "Usage: prefixd [--config=FILE] [flags]\n"
         "\n"
         "With no config file and no flags it serves the embedded default: "
         "the\n"
         "defaults below, auth off (loopback and Unix socket only). Sizes "
         "take\n"
         "units (4GiB, 160GB); durations too (300s, 5m). Stop with SIGTERM "
         "or\n"
         "SIGINT: it drains in-flight calls and exits 0.\n"
         "\n"
         "Flags:\n";
  PrintFlagHelp(Flags(), out);
  out << "\nExit codes: 0 ok, 1 the daemon failed or the configuration does "
         "not load,\n2 usage error (the command line).\n";
  return out.str();
}

}  // namespace prefixd
