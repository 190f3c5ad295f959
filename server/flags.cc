#include "server/flags.h"

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/cache.h"
#include "model/kv_geometry.h"
#include "server/defaults.h"

namespace prefixd {
namespace {

struct FlagSpec {
  const char* name;
  const char* value_name;  // nullptr: a switch without a value
  std::string default_text;
  std::string help;
  std::function<absl::Status(absl::string_view value, CommandLine* cl)> set;
};

absl::Status SetString(std::optional<std::string>* field,
                       absl::string_view value) {
  *field = std::string(value);
  return absl::OkStatus();
}

const std::vector<FlagSpec>& Flags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"config", "FILE", "none",
       "Config file: textproto, or JSON when the name ends in .json "
       "(schema: proto/prefixd/v1/config.proto). Flags override it.",
       [](absl::string_view v, CommandLine* cl) {
         if (cl->check_config && cl->config_path != v) {
           return absl::InvalidArgumentError(absl::StrCat(
               "--config=", v, " with --check_config=", cl->config_path,
               ": name the file once, with --check_config"));
         }
         cl->config_path = std::string(v);
         return absl::OkStatus();
       }},
      {"listen", "ADDR",
       absl::StrCat(defaults::kTcpListen, " and ", defaults::kUnixListen),
       "Address to serve the gRPC API on: host:port or unix:///path. Repeat "
       "for several; "
       "any --listen replaces the config file's list. Port 0 picks a free "
       "port.",
       [](absl::string_view v, CommandLine* cl) {
         cl->listen.emplace_back(v);
         return absl::OkStatus();
       }},
      {"metrics_listen", "HOST:PORT", defaults::kMetricsListen,
       "Address of the Prometheus /metrics endpoint.",
       [](absl::string_view v, CommandLine* cl) {
         return SetString(&cl->metrics_listen, v);
       }},
      {"model", "NAME|FILE", defaults::kModel,
       absl::StrCat("KV geometry and RoPE settings: a preset (",
                    absl::StrJoin(PresetNames(), ", "),
                    ") or a Hugging Face config.json path."),
       [](absl::string_view v, CommandLine* cl) {
         return SetString(&cl->model, v);
       }},
      {"kv_dtype", "DTYPE", defaults::kKvDtype,
       "How the engine stores K and V: fp32, fp16, bf16, fp8, int8, int4 or "
       "nvfp4.",
       [](absl::string_view v, CommandLine* cl) {
         return SetString(&cl->kv_dtype, v);
       }},
      {"block_size", "TOKENS", absl::StrCat(defaults::kBlockSize),
       "Tokens per KV block; must equal the engine's block (page) size.",
       [](absl::string_view v, CommandLine* cl) {
         uint32_t n = 0;
         if (!absl::SimpleAtoi(v, &n) || n == 0) {
           return absl::InvalidArgumentError(
               absl::StrCat("--block_size=", v, ": want a positive integer"));
         }
         cl->block_size = n;
         return absl::OkStatus();
       }},
      {"kv_budget", "SIZE", defaults::kKvBudget,
       "KV memory the cache may account for: bytes with units (4GiB, 160GB) or "
       "a token "
       "count (1000000tokens).",
       [](absl::string_view v, CommandLine* cl) {
         return SetString(&cl->kv_budget, v);
       }},
      {"lease_ttl", "DURATION", defaults::kLeaseTtl,
       "Default lifetime of a lease that is not renewed (300s, 5m).",
       [](absl::string_view v, CommandLine* cl) {
         return SetString(&cl->lease_ttl, v);
       }},
      {"snapshot_path", "FILE", "none (no snapshot)",
       "Where to write the cache state on shutdown and read it on start-up.",
       [](absl::string_view v, CommandLine* cl) {
         return SetString(&cl->snapshot_path, v);
       }},
      {"index_source", "NAME=ENDPOINT[,REPLAY]", "none",
       "Fleet index: subscribe to an engine's KV events (vLLM/SGLang "
       "--kv-events-config), e.g. vllm-0=tcp://10.0.0.7:5557,"
       "tcp://10.0.0.7:5558 (the PUB endpoint, then the replay endpoint). "
       "A host name resolving to several addresses gives one worker per "
       "address. Repeat for several engines; any --index_source replaces "
       "the config file's sources. See docs/index.md.",
       [](absl::string_view v, CommandLine* cl) {
         const size_t eq = v.find('=');
         if (eq == 0 || eq == absl::string_view::npos || eq + 1 == v.size()) {
           return absl::InvalidArgumentError(absl::StrCat(
               "--index_source=", v, ": want NAME=ENDPOINT[,REPLAY_ENDPOINT]"));
         }
         cl->index_sources.emplace_back(v);
         return absl::OkStatus();
       }},
      {"index_listen", "ENDPOINT", "none",
       "Fleet index: bind a SUB socket (tcp://0.0.0.0:5557) that engines "
       "connect to; each names itself by its topic kv@<worker>@<model>.",
       [](absl::string_view v, CommandLine* cl) {
         return SetString(&cl->index_listen, v);
       }},
      {"index_block_size", "TOKENS", "16",
       "Fleet index: the engines' block size (events of another size put "
       "the worker in ERROR).",
       [](absl::string_view v, CommandLine* cl) {
         uint32_t n = 0;
         if (!absl::SimpleAtoi(v, &n) || n == 0) {
           return absl::InvalidArgumentError(absl::StrCat(
               "--index_block_size=", v, ": want a positive integer"));
         }
         cl->index_block_size = n;
         return absl::OkStatus();
       }},
      {"events_publish", "ENDPOINT[,REPLAY]", "none",
       "Publish this daemon's own cache changes as vLLM KV events, for a "
       "prefixd index, llm-d or Dynamo: the PUB endpoint (tcp://*:5557 "
       "binds; without a wildcard it connects), then the replay (ROUTER) "
       "endpoint it binds, e.g. tcp://*:5557,tcp://*:5558. Topic and buffer "
       "size: events_publish { } in the config file. See docs/index.md.",
       [](absl::string_view v, CommandLine* cl) {
         if (v.empty() || v.front() == ',' || v.back() == ',') {
           return absl::InvalidArgumentError(absl::StrCat(
               "--events_publish=", v, ": want ENDPOINT[,REPLAY_ENDPOINT]"));
         }
         return SetString(&cl->events_publish, v);
       }},
      {"eviction_policy", "lru|adaptive", "lru",
       "Which unpinned blocks go first when the budget is full: lru (least "
       "recently used) or adaptive (recency and frequency, for small caches "
       "and heavy churn). Overrides eviction { policy } of the config file. "
       "See docs/operations.md.",
       [](absl::string_view v, CommandLine* cl) {
         EvictionPolicy p;
         if (!ParseEvictionPolicy(v, &p)) {
           return absl::InvalidArgumentError(
               absl::StrCat("--eviction_policy=", v, ": want lru or adaptive"));
         }
         return SetString(&cl->eviction_policy, EvictionPolicyName(p));
       }},
      {"check_config", "FILE", "",
       "Validate the config file FILE (with the other flags over it) as "
       "start-up would, without serving: print the resolved settings and "
       "exit 0, or the error (naming the field and its value) and exit 1. "
       "Listeners are not bound, the snapshot is not read.",
       [](absl::string_view v, CommandLine* cl) {
         if (!cl->config_path.empty() && cl->config_path != v) {
           return absl::InvalidArgumentError(absl::StrCat(
               "--check_config=", v, " with --config=", cl->config_path,
               ": name the file once, with --check_config"));
         }
         cl->config_path = std::string(v);
         cl->check_config = true;
         return absl::OkStatus();
       }},
      {"help", nullptr, "", "Print this help and exit.",
       [](absl::string_view, CommandLine* cl) {
         cl->help = true;
         return absl::OkStatus();
       }},
      {"version", nullptr, "", "Print the version and exit.",
       [](absl::string_view, CommandLine* cl) {
         cl->version = true;
         return absl::OkStatus();
       }},
  };
  return *flags;
}

const FlagSpec* FindFlag(absl::string_view name) {
  for (const FlagSpec& f : Flags()) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// Word-wraps `text` to 78 columns, each line indented by `indent` spaces.
std::string Wrap(absl::string_view text, size_t indent) {
  constexpr size_t kWidth = 78;
  std::string out, line(indent, ' ');
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line.size() > indent && line.size() + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, line, "\n");
      line.assign(indent, ' ');
    }
    if (line.size() > indent) line += ' ';
    absl::StrAppend(&line, word);
  }
  return absl::StrCat(out, line, "\n");
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(
    absl::Span<const char* const> args) {
  CommandLine cl;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "-h") arg = "--help";
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected argument \"", args[i], "\"; flags start with --"));
    }
    absl::string_view name = arg.substr(0, arg.find('='));
    const FlagSpec* flag = FindFlag(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag --", name, " (prefixd --help lists them)"));
    }
    std::optional<absl::string_view> value;
    if (name.size() < arg.size()) value = arg.substr(name.size() + 1);
    if (flag->value_name == nullptr && value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " takes no value"));
    }
    if (flag->value_name != nullptr && !value.has_value()) {
      if (i + 1 == args.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", name, " needs a value: --", name, "=", flag->value_name));
      }
      value = args[++i];
    }
    if (absl::Status s = flag->set(value.value_or(""), &cl); !s.ok()) return s;
  }
  return cl;
}

std::string CommandLineHelp() {
  std::string out =
      "prefixd: a prefix-cache daemon beside an LLM inference engine.\n"
      "\n"
      "Usage: prefixd [--config=FILE] [flags]\n"
      "\n"
      "With no config file and no flags it serves the embedded default: the\n"
      "defaults below, auth off (loopback and Unix socket only). Sizes take\n"
      "units (4GiB, 160GB); durations too (300s, 5m). Stop with SIGTERM or\n"
      "SIGINT: it drains in-flight calls and exits 0.\n"
      "\n"
      "Flags:\n";
  for (const FlagSpec& f : Flags()) {
    std::string head = absl::StrCat("  --", f.name);
    if (f.value_name != nullptr) absl::StrAppend(&head, "=", f.value_name);
    absl::StrAppend(&out, head, "\n", Wrap(f.help, 6));
    if (!f.default_text.empty())
      absl::StrAppend(&out, Wrap("default: " + f.default_text, 6));
  }
  return out;
}

}  // namespace prefixd
