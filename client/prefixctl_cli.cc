#include "client/prefixctl_cli.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "base/flag_parser.h"
#include "client/client.h"
#include "client/id_list.h"
#include "client/output.h"
#include "client/plan.h"

namespace prefixd {
namespace {

constexpr char kDefaultAddr[] = "127.0.0.1:50051";

// ---- interrupts: SIGINT/SIGTERM end a stream, otherwise the process ----

std::atomic<bool> g_streaming{false};
std::atomic<bool> g_interrupted{false};

void OnSignal(int sig) {
  if (!g_streaming.load()) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_interrupted.store(true);
}

// While alive, an interrupt calls `cancel` (from a helper thread: gRPC
// calls are not async-signal-safe) instead of ending the process.
class InterruptibleStream {
 public:
  explicit InterruptibleStream(std::function<void()> cancel)
      : thread_([this, cancel = std::move(cancel)] {
          while (
              !stop_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
            if (g_interrupted.load()) {
              cancel();
              return;
            }
          }
        }) {
    g_streaming.store(true);
  }
  ~InterruptibleStream() {
    g_streaming.store(false);
    stop_.Notify();
    thread_.join();
  }
  bool interrupted() const { return g_interrupted.load(); }

 private:
  absl::Notification stop_;
  std::thread thread_;
};

// ---- commands ----

struct Context {
  const ParsedFlags& flags;
  std::ostream& out;
  std::ostream& err;
  bool json = false;
  std::string addr;
  ClientOptions options;
  std::unique_ptr<Client> client;
};

struct Command {
  std::string name;
  std::string synopsis;
  std::string summary;
  std::vector<FlagSpec> flags;
  int (*run)(Context& ctx);
};

std::vector<FlagSpec> GlobalFlags() {
  return {
      {"addr", "ADDR", "daemon address: host:port or unix:///path",
       kDefaultAddr},
      {"tenant", "NAME",
       "tenant of the call (x-prefixd-tenant); auth off: 'default'", ""},
      {"token", "TOKEN", "bearer token", "$PREFIXD_TOKEN"},
      {"timeout", "DURATION", "deadline of each call, e.g. 5s or 250ms", "5s"},
      {"json", "",
       "print JSON (one object per line) instead of tables: protobuf's JSON "
       "mapping, so 64-bit numbers are strings (\"matched_tokens\":\"32\"; "
       "jq: tonumber)",
       ""},
      {"tls", "", "use TLS with the system's root certificates", ""},
      {"tls_ca", "FILE", "PEM root certificates for TLS (implies --tls)", ""},
      {"tls_cert", "FILE", "PEM client certificate for mTLS", ""},
      {"tls_key", "FILE", "PEM client key for mTLS", ""},
      {"help", "", "show help", ""},
  };
}

int Usage(Context& ctx, const std::string& command,
          const std::string& message) {
  ctx.err << "prefixctl " << command << ": " << message << "\nsee: prefixctl "
          << command << " --help\n";
  return kExitUsage;
}

int RpcError(Context& ctx, const absl::Status& status) {
  ctx.err << "error: " << absl::StatusCodeToString(status.code()) << ": "
          << status.message() << "\n";
  return kExitRpcError;
}

// The fleet index's calls: UNIMPLEMENTED means the daemon runs no index,
// which deserves a way out rather than gRPC's bare code.
int IndexRpcError(Context& ctx, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kUnimplemented)
    return RpcError(ctx, status);
  ctx.err << "error: the daemon at " << ctx.addr
          << " does not serve the fleet index: start it with "
             "--index_source=NAME=ENDPOINT or an index { } config "
             "(docs/index.md)\n";
  return kExitRpcError;
}

// Reads an ID list from --NAME or --NAME_file; nullopt when neither is given.
absl::StatusOr<std::optional<std::vector<uint64_t>>> IdsFlag(
    const ParsedFlags& flags, const std::string& name, uint64_t max_value) {
  const std::string file_flag = name + "_file";
  if (flags.Has(name) && flags.Has(file_flag)) {
    return absl::InvalidArgumentError(
        absl::StrCat("give --", name, " or --", file_flag, ", not both"));
  }
  absl::StatusOr<std::vector<uint64_t>> ids;
  if (flags.Has(name)) {
    ids = ParseIdList(flags.String(name), max_value);
  } else if (flags.Has(file_flag)) {
    ids = ReadIdListFile(flags.String(file_flag), max_value);
  } else {
    return std::nullopt;
  }
  if (!ids.ok()) return ids.status();
  return std::optional<std::vector<uint64_t>>(*std::move(ids));
}

// The tokens of match/insert, required.
absl::StatusOr<std::vector<uint32_t>> TokensFlag(const ParsedFlags& flags) {
  auto ids = IdsFlag(flags, "tokens", std::numeric_limits<uint32_t>::max());
  if (!ids.ok()) return ids.status();
  if (!ids->has_value())
    return absl::InvalidArgumentError("--tokens or --tokens_file is required");
  return ToTokens(**ids);
}

absl::StatusOr<PrefixOptions> PrefixFlags(const ParsedFlags& flags) {
  PrefixOptions options;
  options.ns = flags.String("namespace");
  options.pin = flags.Bool("pin");
  absl::StatusOr<int64_t> position = flags.Int("position", 0);
  if (!position.ok()) return position.status();
  options.position_offset = *position;
  absl::StatusOr<absl::Duration> ttl =
      flags.Duration("lease_ttl", absl::ZeroDuration());
  if (!ttl.ok()) return ttl.status();
  options.lease_ttl = *ttl;
  return options;
}

// --priority and --retention_ms of `insert`: a retention hint when either
// is given. Their bounds are the daemon's to check (docs/api.md).
absl::StatusOr<std::optional<v1::Retention>> RetentionFlags(
    const ParsedFlags& flags) {
  if (!flags.Has("priority") && !flags.Has("retention_ms")) {
    return std::nullopt;
  }
  v1::Retention r;
  if (flags.Has("priority")) {
    absl::StatusOr<uint64_t> p = flags.Uint("priority", 0);
    if (!p.ok()) return p.status();
    if (*p > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--priority=", *p, ": want 0..100"));
    }
    r.set_priority(static_cast<uint32_t>(*p));
  }
  absl::StatusOr<uint64_t> ms = flags.Uint("retention_ms", 0);
  if (!ms.ok()) return ms.status();
  r.set_duration_ms(*ms);
  return std::optional<v1::Retention>(std::move(r));
}

// --lora_name, --lora_id, --cache_salt, --workers of `route`.
absl::StatusOr<RouteOptions> RouteFlags(const ParsedFlags& flags) {
  RouteOptions options;
  options.lora_name = flags.String("lora_name");
  options.cache_salt = flags.String("cache_salt");
  absl::StatusOr<uint64_t> lora_id = flags.Uint("lora_id", 0);
  if (!lora_id.ok()) return lora_id.status();
  if (*lora_id > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lora_id ", flags.String("lora_id"), " is above the maximum ",
        std::numeric_limits<int64_t>::max()));
  }
  options.lora_id = static_cast<int64_t>(*lora_id);
  if (flags.Has("workers")) {
    const std::string list = flags.String("workers");
    for (absl::string_view name : absl::StrSplit(list, ',')) {
      name = absl::StripAsciiWhitespace(name);
      if (name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--workers takes worker names separated by commas; '",
                         list, "' has an empty name"));
      }
      options.workers.emplace_back(name);
    }
  }
  options.all_workers = flags.Bool("all_workers");
  return options;
}

// A comma-separated list of names (--candidates); empty names refused.
absl::StatusOr<std::vector<std::string>> NameList(absl::string_view flag,
                                                  const std::string& list) {
  std::vector<std::string> names;
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    name = absl::StripAsciiWhitespace(name);
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " takes worker names separated by commas; '",
                       list, "' has an empty name"));
    }
    names.emplace_back(name);
  }
  return names;
}

// --loads W=IN_FLIGHT[/QUEUED_TOKENS[/KV_USAGE]],... (the name is what
// comes before the last '='). The figures go to the daemon as given: it
// names a bad one.
absl::StatusOr<std::vector<v1::WorkerLoad>> LoadsFlag(const std::string& list) {
  std::vector<v1::WorkerLoad> loads;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    item = absl::StripAsciiWhitespace(item);
    const size_t eq = item.rfind('=');
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("--loads: '", item, "' ", why,
                       "; want WORKER=IN_FLIGHT[/QUEUED_TOKENS[/KV_USAGE]]"));
    };
    if (eq == absl::string_view::npos || eq == 0) return bad("names no worker");
    std::vector<absl::string_view> parts =
        absl::StrSplit(item.substr(eq + 1), '/');
    if (parts.size() > 3) return bad("has more than three figures");
    v1::WorkerLoad load;
    load.set_worker(std::string(item.substr(0, eq)));
    int64_t n = 0;
    if (!absl::SimpleAtoi(parts[0], &n)) return bad("has no IN_FLIGHT count");
    load.set_requests_in_flight(n);
    if (parts.size() > 1) {
      if (!absl::SimpleAtoi(parts[1], &n)) return bad("has no QUEUED_TOKENS");
      load.set_queued_prefill_tokens(n);
    }
    if (parts.size() > 2) {
      double kv = 0;
      if (!absl::SimpleAtod(parts[2], &kv)) return bad("has no KV_USAGE");
      load.set_kv_usage(kv);
    }
    loads.push_back(std::move(load));
  }
  return loads;
}

absl::StatusOr<PickOptions> PickFlags(const ParsedFlags& flags) {
  PickOptions options;
  absl::StatusOr<RouteOptions> prompt = RouteFlags(flags);
  if (!prompt.ok()) return prompt.status();
  options.prompt = *std::move(prompt);
  if (flags.Has("candidates")) {
    absl::StatusOr<std::vector<std::string>> names =
        NameList("candidates", flags.String("candidates"));
    if (!names.ok()) return names.status();
    options.candidates = *std::move(names);
  }
  if (flags.Has("loads")) {
    absl::StatusOr<std::vector<v1::WorkerLoad>> loads =
        LoadsFlag(flags.String("loads"));
    if (!loads.ok()) return loads.status();
    options.loads = *std::move(loads);
  }
  options.dry_run = flags.Bool("dry_run");
  return options;
}

std::string JsonIds(const std::vector<uint64_t>& ids) {
  std::vector<std::string> quoted;
  for (uint64_t id : ids) quoted.push_back(absl::StrCat("\"", id, "\""));
  return absl::StrCat("[", absl::StrJoin(quoted, ","), "]");
}

int RunHealth(Context& ctx) {
  const std::string service = ctx.flags.String("service");
  auto print = [&](HealthStatus s) {
    if (ctx.json) {
      ctx.out << "{\"status\":\"" << HealthStatusName(s) << "\"}\n";
    } else {
      ctx.out << HealthStatusName(s) << "\n";
    }
    ctx.out.flush();
  };
  if (!ctx.flags.Bool("watch")) {
    absl::StatusOr<HealthStatus> status = ctx.client->Health(service);
    if (!status.ok()) return RpcError(ctx, status.status());
    print(*status);
    return *status == HealthStatus::kServing ? kExitOk : kExitRpcError;
  }
  absl::StatusOr<uint64_t> count = ctx.flags.Uint("count", 0);
  if (!count.ok())
    return Usage(ctx, "health", std::string(count.status().message()));
  std::unique_ptr<Client::HealthStream> stream =
      ctx.client->WatchHealth(service);
  InterruptibleStream guard([&stream] { stream->Cancel(); });
  uint64_t seen = 0;
  HealthStatus status;
  while ((*count == 0 || seen < *count) && stream->Read(&status)) {
    print(status);
    ++seen;
  }
  if (*count != 0 && seen == *count) stream->Cancel();
  absl::Status end = stream->Finish();
  if (guard.interrupted() || (*count != 0 && seen == *count) || end.ok())
    return kExitOk;
  return RpcError(ctx, end);
}

int RunInfo(Context& ctx) {
  absl::StatusOr<v1::GetInfoResponse> info = ctx.client->GetInfo();
  if (!info.ok()) return RpcError(ctx, info.status());
  if (ctx.json) {
    ctx.out << ToJson(*info) << "\n";
  } else {
    PrintInfo(*info, ctx.out);
  }
  return kExitOk;
}

int RunStats(Context& ctx) {
  absl::StatusOr<v1::StatsResponse> stats =
      ctx.client->Stats(ctx.flags.Bool("all"));
  if (!stats.ok()) return RpcError(ctx, stats.status());
  if (ctx.json) {
    ctx.out << ToJson(*stats) << "\n";
  } else {
    PrintStats(*stats, ctx.out);
  }
  return kExitOk;
}

int RunMatch(Context& ctx) {
  absl::StatusOr<std::vector<uint32_t>> tokens = TokensFlag(ctx.flags);
  if (!tokens.ok())
    return Usage(ctx, "match", std::string(tokens.status().message()));
  absl::StatusOr<PrefixOptions> options = PrefixFlags(ctx.flags);
  if (!options.ok())
    return Usage(ctx, "match", std::string(options.status().message()));
  absl::StatusOr<Client::MatchResult> match =
      ctx.client->Match(*tokens, *options);
  if (!match.ok()) return RpcError(ctx, match.status());
  match->lease
      .Detach();  // the lease outlives this process: `prefixctl release`
  if (ctx.json) {
    ctx.out << ToJson(match->response) << "\n";
  } else {
    PrintMatch(match->response, tokens->size(), ctx.out);
  }
  return kExitOk;
}

int RunInsert(Context& ctx) {
  absl::StatusOr<std::vector<uint32_t>> tokens = TokensFlag(ctx.flags);
  if (!tokens.ok())
    return Usage(ctx, "insert", std::string(tokens.status().message()));
  auto blocks =
      IdsFlag(ctx.flags, "block_ids", std::numeric_limits<uint64_t>::max());
  if (!blocks.ok())
    return Usage(ctx, "insert", std::string(blocks.status().message()));
  if (!blocks->has_value())
    return Usage(ctx, "insert", "--block_ids or --block_ids_file is required");
  absl::StatusOr<PrefixOptions> options = PrefixFlags(ctx.flags);
  if (!options.ok())
    return Usage(ctx, "insert", std::string(options.status().message()));
  absl::StatusOr<std::optional<v1::Retention>> retention =
      RetentionFlags(ctx.flags);
  if (!retention.ok())
    return Usage(ctx, "insert", std::string(retention.status().message()));
  options->retention = *std::move(retention);
  absl::StatusOr<Client::InsertResult> insert =
      ctx.client->Insert(*tokens, **blocks, *options);
  if (!insert.ok()) return RpcError(ctx, insert.status());
  insert->lease.Detach();
  if (ctx.json) {
    ctx.out << ToJson(insert->response) << "\n";
  } else {
    PrintInsert(insert->response, tokens->size(), (*blocks)->size(), ctx.out);
  }
  return kExitOk;
}

int RunRelease(Context& ctx) {
  if (!ctx.flags.Has("lease"))
    return Usage(ctx, "release", "--lease is required");
  absl::StatusOr<uint64_t> lease = ctx.flags.Uint("lease", 0);
  if (!lease.ok())
    return Usage(ctx, "release", std::string(lease.status().message()));
  absl::Status status = ctx.client->Release(*lease);
  if (!status.ok()) return RpcError(ctx, status);
  if (ctx.json) {
    ctx.out << "{\"lease_id\":\"" << *lease << "\"}\n";
  } else {
    ctx.out << "released lease " << *lease << "\n";
  }
  return kExitOk;
}

int RunKeepAlive(Context& ctx) {
  absl::StatusOr<std::vector<uint64_t>> leases = ParseIdList(
      ctx.flags.String("lease"), std::numeric_limits<uint64_t>::max());
  if (!leases.ok())
    return Usage(ctx, "keepalive", std::string(leases.status().message()));
  if (leases->empty()) return Usage(ctx, "keepalive", "--lease is required");
  absl::StatusOr<std::vector<absl::Duration>> left =
      ctx.client->KeepAlive(*leases);
  if (!left.ok()) return RpcError(ctx, left.status());
  std::vector<uint64_t> ms;
  for (absl::Duration d : *left) ms.push_back(absl::ToInt64Milliseconds(d));
  if (ctx.json) {
    ctx.out << "{\"lease_ids\":" << JsonIds(*leases)
            << ",\"expires_in_ms\":" << JsonIds(ms) << "}\n";
    return kExitOk;
  }
  Table t({"LEASE", "EXPIRES_IN"});
  for (size_t i = 0; i < leases->size() && i < left->size(); ++i) {
    t.AddRow({absl::StrCat((*leases)[i]), absl::FormatDuration((*left)[i])});
  }
  t.Print(ctx.out);
  return kExitOk;
}

int PrintRemoved(Context& ctx, const char* verb, const char* field,
                 const std::vector<uint64_t>& ids) {
  if (ctx.json) {
    ctx.out << "{\"" << field << "\":" << JsonIds(ids) << "}\n";
  } else {
    ctx.out << verb << " " << ids.size() << " blocks: " << FormatIdList(ids)
            << "\n";
  }
  return kExitOk;
}

int RunEvict(Context& ctx) {
  if (!ctx.flags.Has("blocks"))
    return Usage(ctx, "evict", "--blocks is required");
  absl::StatusOr<uint64_t> blocks = ctx.flags.Uint("blocks", 0);
  if (!blocks.ok())
    return Usage(ctx, "evict", std::string(blocks.status().message()));
  absl::StatusOr<std::vector<uint64_t>> evicted = ctx.client->Evict(*blocks);
  if (!evicted.ok()) return RpcError(ctx, evicted.status());
  return PrintRemoved(ctx, "evicted", "evicted_block_ids", *evicted);
}

int RunInvalidate(Context& ctx) {
  auto ids =
      IdsFlag(ctx.flags, "block_ids", std::numeric_limits<uint64_t>::max());
  if (!ids.ok())
    return Usage(ctx, "invalidate", std::string(ids.status().message()));
  if (!ids->has_value())
    return Usage(ctx, "invalidate",
                 "--block_ids or --block_ids_file is required");
  absl::StatusOr<std::vector<uint64_t>> removed = ctx.client->Invalidate(**ids);
  if (!removed.ok()) return RpcError(ctx, removed.status());
  return PrintRemoved(ctx, "removed", "removed_block_ids", *removed);
}

int RunReset(Context& ctx) {
  absl::StatusOr<v1::ResetResponse> reset =
      ctx.client->Reset(ctx.flags.String("tenant"), ctx.flags.Bool("all"));
  if (!reset.ok()) return RpcError(ctx, reset.status());
  if (ctx.json) {
    ctx.out << ToJson(*reset) << "\n";
    return kExitOk;
  }
  const std::vector<uint64_t> ids(reset->removed_block_ids().begin(),
                                  reset->removed_block_ids().end());
  ctx.out << "removed " << ids.size() << " blocks: " << FormatIdList(ids)
          << "  epoch " << Hex64(reset->epoch()) << "\n";
  return kExitOk;
}

int RunWatch(Context& ctx) {
  absl::StatusOr<uint64_t> from = ctx.flags.Uint("from", 0);
  if (!from.ok())
    return Usage(ctx, "watch", std::string(from.status().message()));
  absl::StatusOr<uint64_t> count = ctx.flags.Uint("count", 0);
  if (!count.ok())
    return Usage(ctx, "watch", std::string(count.status().message()));
  std::unique_ptr<Client::EventStream> stream = ctx.client->WatchEvents(*from);
  InterruptibleStream guard([&stream] { stream->Cancel(); });
  uint64_t seen = 0;
  v1::WatchEventsResponse batch;
  while ((*count == 0 || seen < *count) && stream->Read(&batch)) {
    if (batch.missed_events()) {
      if (ctx.json) {
        ctx.out << "{\"missed_events\":true,\"next_sequence\":\""
                << batch.next_sequence() << "\"}\n";
      } else {
        ctx.out << "! missed events: the daemon's ring dropped them; "
                   "resynchronize (dump)\n";
      }
    }
    for (const v1::Event& e : batch.events()) {
      if (*count != 0 && seen == *count) break;
      if (ctx.json) {
        ctx.out << ToJson(e) << "\n";
      } else {
        PrintEvent(e, ctx.out);
      }
      ++seen;
    }
    ctx.out.flush();
  }
  const bool enough = *count != 0 && seen >= *count;
  if (enough) stream->Cancel();
  absl::Status end = stream->Finish();
  if (enough || guard.interrupted() || end.ok()) return kExitOk;
  return RpcError(ctx, end);
}

int RunDump(Context& ctx) {
  const std::string ns = ctx.flags.String("namespace");
  absl::StatusOr<v1::DumpResponse> dump = ctx.client->Dump(ns);
  if (!dump.ok()) return RpcError(ctx, dump.status());
  if (ctx.json) {
    ctx.out << ToJson(*dump) << "\n";
  } else {
    PrintDump(*dump, ns, ctx.out);
  }
  return kExitOk;
}

int RunRoute(Context& ctx) {
  absl::StatusOr<std::vector<uint32_t>> tokens = TokensFlag(ctx.flags);
  if (!tokens.ok())
    return Usage(ctx, "route", std::string(tokens.status().message()));
  absl::StatusOr<RouteOptions> options = RouteFlags(ctx.flags);
  if (!options.ok())
    return Usage(ctx, "route", std::string(options.status().message()));
  absl::StatusOr<v1::RouteResponse> route =
      ctx.client->Route(*tokens, *options);
  if (!route.ok()) return IndexRpcError(ctx, route.status());
  if (ctx.json) {
    ctx.out << ToJson(*route) << "\n";
  } else {
    PrintRoute(*route, tokens->size(), ctx.out);
  }
  return kExitOk;
}

int RunPick(Context& ctx) {
  absl::StatusOr<std::vector<uint32_t>> tokens = TokensFlag(ctx.flags);
  if (!tokens.ok())
    return Usage(ctx, "pick", std::string(tokens.status().message()));
  absl::StatusOr<PickOptions> options = PickFlags(ctx.flags);
  if (!options.ok())
    return Usage(ctx, "pick", std::string(options.status().message()));
  absl::StatusOr<v1::PickResponse> pick = ctx.client->Pick(*tokens, *options);
  if (!pick.ok()) return IndexRpcError(ctx, pick.status());
  if (ctx.json) {
    ctx.out << ToJson(*pick) << "\n";
  } else {
    PrintPick(*pick, tokens->size(), ctx.out);
  }
  return kExitOk;
}

int RunWorkers(Context& ctx) {
  absl::StatusOr<v1::ListWorkersResponse> workers = ctx.client->ListWorkers();
  if (!workers.ok()) return IndexRpcError(ctx, workers.status());
  if (ctx.json) {
    ctx.out << ToJson(*workers) << "\n";
  } else {
    PrintWorkers(*workers, absl::Now(), ctx.out);
  }
  return kExitOk;
}

const FlagSpec kNamespace = {"namespace", "NS",
                             "namespace (LoRA adapter, cache salt)", "\"\""};
const FlagSpec kTokens = {"tokens", "LIST", "token IDs: 1,2,3 or ranges 1-64",
                          ""};
const FlagSpec kTokensFile = {
    "tokens_file", "FILE", "token IDs from a file (comma/space separated)", ""};
const FlagSpec kPosition = {"position", "N",
                            "absolute position of the first token", "0"};
const FlagSpec kPin = {"pin", "",
                       "pin the path: print a lease to release later", ""};
const FlagSpec kLeaseTtl = {"lease_ttl", "DURATION", "lease TTL, e.g. 30s",
                            "the daemon's"};
const FlagSpec kBlockIds = {"block_ids", "LIST",
                            "block IDs: 100,101 or ranges 100-163", ""};
const FlagSpec kBlockIdsFile = {"block_ids_file", "FILE",
                                "block IDs from a file", ""};
const FlagSpec kPriority = {
    "priority", "N",
    "retention priority 0..100 of the inserted blocks: lower goes first",
    "50 (no hint)"};
const FlagSpec kRetentionMs = {"retention_ms", "MS",
                               "with a hint: lapse to priority 50 after MS ms",
                               "0 (never lapses)"};

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"health",
       "[--service NAME] [--watch [--count N]]",
       "grpc.health.v1 status; exits 1 unless SERVING",
       {{"service", "NAME", "health service name", "\"\" (the server)"},
        {"watch", "", "stream status changes until interrupted", ""},
        {"count", "N", "with --watch: stop after N statuses", "0 (no limit)"}},
       RunHealth},
      {"info",
       "",
       "epoch, model, block size, budget, eviction policy, limits",
       {},
       RunInfo},
      {"stats",
       "[--all]",
       "per tenant: hit rate, cached/pinned blocks and bytes, leases, "
       "evictions",
       {{"all", "", "every tenant (admin, or auth off)", ""}},
       RunStats},
      {"match",
       "--tokens LIST [--pin]",
       "longest cached prefix of the tokens",
       {kTokens, kTokensFile, kNamespace, kPosition, kPin, kLeaseTtl},
       RunMatch},
      {"insert",
       "--tokens LIST --block_ids LIST [--pin] [--priority N [--retention_ms "
       "MS]]",
       "adopt block IDs for whole blocks of tokens",
       {kTokens, kTokensFile, kBlockIds, kBlockIdsFile, kNamespace, kPosition,
        kPin, kLeaseTtl, kPriority, kRetentionMs},
       RunInsert},
      {"release",
       "--lease ID",
       "end a lease",
       {{"lease", "ID", "lease ID (decimal or 0x hex)", ""}},
       RunRelease},
      {"keepalive",
       "--lease ID[,ID...]",
       "renew leases",
       {{"lease", "LIST", "lease IDs", ""}},
       RunKeepAlive},
      {"evict",
       "--blocks N",
       "evict up to N least-recently-used blocks",
       {{"blocks", "N", "how many blocks", ""}},
       RunEvict},
      {"invalidate",
       "--block_ids LIST",
       "remove the nodes of these blocks and their subtrees",
       {kBlockIds, kBlockIdsFile},
       RunInvalidate},
      {"reset",
       "[--all]",
       "drop the tenant's trees (--tenant), or every tenant's",
       {{"all", "", "every tenant (admin, or auth off)", ""}},
       RunReset},
      {"watch",
       "[--from SEQ] [--count N]",
       "stream cache events until interrupted",
       {{"from", "SEQ", "first sequence number", "0 (the oldest kept)"},
        {"count", "N", "stop after N events", "0 (no limit)"}},
       RunWatch},
      {"dump",
       "[--namespace NS]",
       "print one tree of the tenant, node by node",
       {kNamespace},
       RunDump},
      {"route",
       "--tokens LIST [--lora_name X] [--lora_id N] [--cache_salt S] "
       "[--workers A,B] [--all_workers]",
       "fleet index: how many leading blocks of the prompt each worker holds",
       {kTokens,
        kTokensFile,
        {"lora_name", "NAME",
         "LoRA adapter the engines hashed the prompt under (wins over "
         "--lora_id)",
         ""},
        {"lora_id", "N", "LoRA adapter by integer ID", "0 (none)"},
        {"cache_salt", "SALT", "cache salt the engines hashed the prompt with",
         ""},
        {"workers", "A,B",
         "only these workers, comma separated, each listed matched or not",
         "every worker"},
        {"all_workers", "",
         "list every worker, also those holding none of the prompt", ""}},
       RunRoute},
      {"pick",
       "--tokens LIST [--candidates A,B] [--loads W=N/Q/U,...] [--dry_run] "
       "[--lora_name X] [--lora_id N] [--cache_salt S]",
       "fleet index: which worker should serve the prompt, each candidate's "
       "cost",
       {kTokens,
        kTokensFile,
        {"candidates", "A,B", "the workers to choose among, comma separated",
         "every engine of the index"},
        {"loads", "W=N/Q/U,...",
         "candidates' loads as the router sees them: requests in flight N, "
         "queued prefill tokens Q, KV-cache usage U (0..1); Q and U optional",
         "the index's count of its recent picks"},
        {"dry_run", "",
         "rank and choose but record nothing (no predicted blocks, no load)",
         ""},
        {"lora_name", "NAME",
         "LoRA adapter the engines hashed the prompt under (wins over "
         "--lora_id)",
         ""},
        {"lora_id", "N", "LoRA adapter by integer ID", "0 (none)"},
        {"cache_salt", "SALT", "cache salt the engines hashed the prompt with",
         ""}},
       RunPick},
      {"workers",
       "",
       "fleet index: each worker's state, endpoint, blocks per medium, "
       "event counters",
       {},
       RunWorkers},
      {"plan",
       "[flags]",
       "capacity planning from the model geometry (offline; see prefixctl plan "
       "--help)",
       {},
       nullptr},
  };
  return *commands;
}

const Command* FindCommand(const std::string& name) {
  for (const Command& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// What a command's --help says beyond its summary; "" for most.
const char* CommandNotes(const std::string& name) {
  if (name == "route") {
    return R"(The first line: the prompt's whole blocks and the best worker, the one
holding the longest run of blocks from the start of the prompt. Then one row
per worker with a matched block (every worker with --all_workers, the named
ones with --workers), in the daemon's order (most blocks first):
MATCHED_BLOCKS and MATCHED_TOKENS it holds in any medium, MEDIUMS the run it
holds in each medium (GPU=3,CPU=1), the STATE of its event stream, LAST_SEQ
the last event batch applied (- for none) and LAG how far behind its engine
that batch was.
Needs a daemon that runs the fleet index (docs/index.md).
)";
  }
  if (name == "pick") {
    return R"(The first line: the prompt's whole blocks, the decision id (0 for a dry
run) and the chosen worker. Then one row per candidate, cheapest first: COST
in tokens = PREFILL (the prompt's tokens less CREDITED blocks x block_size)
+ LOAD + CHURN + AFFINITY (negative for the prompt's affinity worker); MATCHED the
leading blocks its events report, PREDICTED the further blocks earlier picks
sent it (from the first when its STATE is not LIVE), IN_FLIGHT, QUEUED and
KV the load charged, from --loads ("router"), the engine's own metrics
endpoint with the index's queued tokens ("engine", index.pick.engine_metrics)
or the index's recent picks ("window"), and the STATE of its event stream.
Unless --dry_run, the chosen worker is then predicted to hold the prompt
(docs/index.md, "Pick"). Needs a daemon that runs the fleet index.
)";
  }
  if (name == "workers") {
    return R"(The first line: how many workers, the index's (block, worker) entries out
of its maximum, and its block size. Then one row per worker: the STATE of its
event stream (CONNECTING, LIVE, REPLAYING, ERROR), the ENDPOINT its events
come from, BLOCKS held per medium, EVENTS applied, sequence GAPS seen,
REPLAYS requested, CLEARS (engine restarts, AllBlocksCleared, unfillable
gaps), DROPPED blocks it holds that the index could not take, LAST_SEQ the
last batch applied and LAST_EVENT how long ago; under a worker whose state
has a reason, a state_detail line. Needs a daemon that runs the fleet index
(docs/index.md).
)";
  }
  return "";
}

void PrintCommandHelp(const Command& c, std::ostream& out) {
  out << "usage: prefixctl [global flags] " << c.name << " " << c.synopsis
      << "\n\n"
      << c.summary << "\n";
  if (const std::string notes = CommandNotes(c.name); !notes.empty())
    out << "\n" << notes;
  if (!c.flags.empty()) {
    out << "\nflags:\n";
    PrintFlagHelp(c.flags, out);
  }
  out << "\nglobal flags:\n";
  PrintFlagHelp(GlobalFlags(), out);
}

void PrintHelp(std::ostream& out) {
  out << "prefixctl: command line client of prefixd, the KV prefix-cache "
         "daemon\n\n"
      << "usage: prefixctl [global flags] <command> [flags]\n\n"
      << "commands:\n";
  size_t width = 0;
  for (const Command& c : Commands()) width = std::max(width, c.name.size());
  for (const Command& c : Commands()) {
    out << "  " << c.name << std::string(width - c.name.size() + 3, ' ')
        << c.summary << "\n";
  }
  out << "\nglobal flags:\n";
  PrintFlagHelp(GlobalFlags(), out);
  for (const Command& c : Commands()) {
    if (c.flags.empty()) continue;
    out << "\n" << c.name << " flags:\n";
    PrintFlagHelp(c.flags, out);
  }
  out << "\nplan flags (offline; the global flags other than --json do not "
         "apply):\n"
      << PlanUsage();
  out << "\nLists (--tokens, --block_ids, --lease) take items separated by "
         "commas or spaces;\n"
      << "an item is N or an inclusive range A-B. --workers takes names "
         "separated by commas.\n"
      << "route and workers need a daemon running the fleet index "
         "(docs/index.md).\n"
      << "Exit codes: 0 ok, 1 RPC error, 2 usage error.\n"
      << "Example: prefixctl insert --tokens 1-32 --block_ids 100,101\n";
}

// Index of the subcommand in args (skipping global flags and their values),
// or args.size() when there is none.
size_t FindCommandIndex(const std::vector<std::string>& args) {
  const std::vector<FlagSpec> globals = GlobalFlags();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-') return i;
    if (a.find('=') != std::string::npos) continue;
    const std::string name = a.substr(a[1] == '-' ? 2 : 1);
    for (const FlagSpec& f : globals) {
      if (f.name == name && !f.value_name.empty()) ++i;  // skip its value
    }
  }
  return args.size();
}

int RunPlan(int argc, char** argv, size_t command_index, std::ostream& out,
            std::ostream& err) {
  std::vector<char*> plan_argv = {argv[0]};
  static char json_flag[] = "--json";
  for (size_t i = 1; i <= command_index; ++i) {
    const std::string a = argv[i];
    if (a == "--json" || a == "-json" || a == "--json=true")
      plan_argv.push_back(json_flag);
  }
  for (int i = static_cast<int>(command_index) + 2; i < argc; ++i)
    plan_argv.push_back(argv[i]);
  plan_argv.push_back(nullptr);
  return RunPlanCommand(static_cast<int>(plan_argv.size()) - 1,
                        plan_argv.data(), out, err);
}

// Runs `command` with its parsed flags: the connection options and the
// client first, then the command.
int RunCommand(const Command& command, const ParsedFlags& flags,
               std::ostream& out, std::ostream& err) {
  const std::string& name = command.name;
  Context ctx{flags, out, err, false, "", {}, nullptr};
  if (absl::Status s = flags.NoPositional(); !s.ok())
    return Usage(ctx, name, std::string(s.message()));
  ctx.json = flags.Bool("json");
  ctx.addr = flags.String("addr", kDefaultAddr);
  const char* env_token = std::getenv("PREFIXD_TOKEN");
  ctx.options.token = flags.String("token", env_token ? env_token : "");
  ctx.options.tenant = flags.String("tenant");
  ctx.options.tls = flags.Bool("tls");
  ctx.options.tls_ca_file = flags.String("tls_ca");
  ctx.options.tls_cert_file = flags.String("tls_cert");
  ctx.options.tls_key_file = flags.String("tls_key");
  absl::StatusOr<absl::Duration> timeout =
      flags.Duration("timeout", absl::Seconds(5));
  if (!timeout.ok())
    return Usage(ctx, name, std::string(timeout.status().message()));
  ctx.options.deadline = *timeout;
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(ctx.addr, ctx.options);
  if (!client.ok()) {
    // One line: the message already says what to give instead.
    ctx.err << "prefixctl " << name << ": " << client.status().message()
            << "\n";
    return kExitUsage;
  }
  ctx.client = *std::move(client);
  return command.run(ctx);
}

}  // namespace

void InstallInterruptHandler() {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
}

int RunPrefixctl(int argc, char** argv, std::ostream& out, std::ostream& err) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const size_t index = FindCommandIndex(args);
  if (index < args.size() && args[index] == "plan")
    return RunPlan(argc, argv, index, out, err);

  const Command* command = nullptr;
  if (index < args.size()) {
    if (args[index] == "help") {
      const Command* c =
          index + 1 < args.size() ? FindCommand(args[index + 1]) : nullptr;
      c ? PrintCommandHelp(*c, out) : PrintHelp(out);
      return kExitOk;
    }
    command = FindCommand(args[index]);
    if (command == nullptr) {
      err << "prefixctl: unknown command '" << args[index]
          << "'\nsee: prefixctl --help\n";
      return kExitUsage;
    }
  }
  std::vector<FlagSpec> spec = GlobalFlags();
  if (command != nullptr)
    spec.insert(spec.end(), command->flags.begin(), command->flags.end());
  std::vector<std::string> rest = args;
  if (command != nullptr)
    rest.erase(rest.begin() + static_cast<ptrdiff_t>(index));
  absl::StatusOr<ParsedFlags> flags = ParsedFlags::Parse(spec, rest);
  const std::string name = command ? command->name : "";
  if (!flags.ok()) {
    err << "prefixctl" << (command ? " " + name : "") << ": "
        << flags.status().message() << "\nsee: prefixctl "
        << (command ? name + " " : "") << "--help\n";
    return kExitUsage;
  }
  if (command == nullptr) {
    PrintHelp(flags->Bool("help") ? out : err);
    return flags->Bool("help") ? kExitOk : kExitUsage;
  }
  if (flags->Bool("help")) {
    PrintCommandHelp(*command, out);
    return kExitOk;
  }

  return RunCommand(*command, *flags, out, err);
}

}  // namespace prefixd
