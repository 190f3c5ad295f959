// MatchExternalKvPrefix (kv_indexer.v1, docs/index.md "As sgl-router's KV
// indexer") against Route (prefixd.v1.PrefixIndex) over gRPC on loopback
// TCP, one daemon in process, the same index: 16 workers holding 8, 16, ...
// 128 blocks of 2k-token prompts (bench/load/route_index.h). Route asks by
// the prompt's tokens, MatchExternalKvPrefix by the same blocks' engine
// hashes (128 of them); both answers are checked (16 workers, the best
// holding all 128 blocks) before timing. Each kind runs --seconds with
// --threads closed-loop blocking callers, alternately, --rounds times;
// the report is calls/s per kind (best round) and the ratio. Then one
// ConfigureExpectedWorkers of --configure_workers new workers, timed, and
// the same call again; then the first ApplyExternalKvBatch of as many
// other new workers, one after another, as a bridge that never calls
// ConfigureExpectedWorkers starts (timed together), and each one's next
// batch (the same hash again).
//
//   build/bench/kv_indexer_bench [--threads=2] [--seconds=3] [--rounds=3]
//                                [--configure_workers=4096]
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/load/common.h"
#include "bench/load/route_index.h"
#include "kv_indexer/v1/kv_indexer.grpc.pb.h"
#include "prefixd/v1/prefix_index.grpc.pb.h"
#include "server/config.h"
#include "server/flags.h"
#include "server/server.h"

ABSL_FLAG(int, threads, 2, "closed-loop callers per kind");
ABSL_FLAG(double, seconds, 3, "seconds per kind and round");
ABSL_FLAG(int, rounds, 3, "rounds (each kind once per round)");
ABSL_FLAG(int, configure_workers, 4096,
          "workers of the timed ConfigureExpectedWorkers (4,096: the most "
          "one call may list)");

namespace prefixd {
namespace {

constexpr int kWorkers = 16;
constexpr int kPrompts = 64;
constexpr int kPromptTokens = 2048;
constexpr int kBlocks = kPromptTokens / 16;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "kv_indexer_bench: %s\n", what.c_str());
  std::exit(1);
}

std::unique_ptr<Server> StartServer() {
  CommandLine flags;
  flags.listen = std::vector<std::string>{"127.0.0.1:0"};
  absl::StatusOr<ServerConfig> config = LoadServerConfig(flags);
  if (!config.ok()) Fail(config.status().ToString());
  config->index_enabled = true;
  config->index.block_size = 16;
  absl::StatusOr<std::unique_ptr<Server>> server =
      Server::Start(*std::move(config));
  if (!server.ok()) Fail(server.status().ToString());
  KvIndex* index = (*server)->index();
  bench::FillRouteIndex(index, kWorkers, kPrompts, kPromptTokens);
  for (int w = 0; w < kWorkers; ++w) {
    WorkerLabels labels;
    labels.address = absl::StrCat("http://10.0.0.", w, ":30000");
    index->SetLabels(index->AddWorker(absl::StrCat("w", w), "bench"), labels);
  }
  return *std::move(server);
}

struct Requests {
  std::vector<v1::RouteRequest> route;
  std::vector<::kv_indexer::v1::MatchExternalKvPrefixRequest> prefix;
};

Requests MakeRequests() {
  Requests r;
  for (int p = 0; p < kPrompts; ++p) {
    const std::vector<uint32_t> tokens = bench::IndexPrompt(p, kPromptTokens);
    // tokens_le32, Route's fast form (as bench/load's route mixes).
    std::string le32(tokens.size() * 4, '\0');
    for (size_t i = 0; i < tokens.size(); ++i) {
      for (int b = 0; b < 4; ++b)
        le32[i * 4 + b] = static_cast<char>((tokens[i] >> (8 * b)) & 0xff);
    }
    v1::RouteRequest route;
    route.set_tokens_le32(le32);
    r.route.push_back(std::move(route));
    ::kv_indexer::v1::MatchExternalKvPrefixRequest prefix;
    for (int b = 0; b < kBlocks; ++b)
      prefix.add_hashes(static_cast<int64_t>((uint64_t{uint32_t(p)} << 32) +
                                             static_cast<uint64_t>(b) + 1));
    r.prefix.push_back(std::move(prefix));
  }
  return r;
}

// One call of `kind` (0 Route, 1 MatchExternalKvPrefix) for prompt p; its
// answer checked when `check`.
bool Call(int kind, int p, const Requests& r, v1::PrefixIndex::Stub& index,
          ::kv_indexer::v1::KVIndexer::Stub& kvi, bool check) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (kind == 0) {
    v1::RouteResponse resp;
    if (!index.Route(&ctx, r.route[p], &resp).ok()) return false;
    return !check || (resp.workers_size() == kWorkers &&
                      resp.workers(0).matched_blocks() == kBlocks);
  }
  ::kv_indexer::v1::MatchExternalKvPrefixResponse resp;
  if (!kvi.MatchExternalKvPrefix(&ctx, r.prefix[p], &resp).ok()) return false;
  return !check || (resp.matches_size() == kWorkers &&
                    resp.best_prefix_blocks() == kBlocks);
}

double Run(int kind, const Requests& r, const std::string& target) {
  const int threads = absl::GetFlag(FLAGS_threads);
  const absl::Duration length = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::atomic<uint64_t> calls{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> pool;
  const absl::Time end = absl::Now() + length;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      // A channel per caller, as separate router threads would have.
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto channel = grpc::CreateCustomChannel(
          target, grpc::InsecureChannelCredentials(), args);
      auto index = v1::PrefixIndex::NewStub(channel);
      auto kvi = ::kv_indexer::v1::KVIndexer::NewStub(channel);
      uint64_t n = 0;
      for (int p = t; absl::Now() < end; p = (p + 1) % kPrompts, ++n) {
        if (!Call(kind, p, r, *index, *kvi, false)) failed = true;
      }
      calls += n;
    });
  }
  for (std::thread& t : pool) t.join();
  if (failed) Fail("a call failed");
  return static_cast<double>(calls) / absl::ToDoubleSeconds(length);
}

// Milliseconds of one ConfigureExpectedWorkers listing `workers` workers
// the index does not follow (each becomes one of the API's own).
double Configure(::kv_indexer::v1::KVIndexer::Stub& kvi, int workers) {
  ::kv_indexer::v1::ConfigureExpectedWorkersRequest req;
  for (int w = 0; w < workers; ++w) {
    ::kv_indexer::v1::ExpectedWorker* e = req.add_workers();
    e->set_worker_id(absl::StrCat("bridge-", w));
    e->set_worker_address(
        absl::StrCat("http://10.1.", w / 256, ".", w % 256, ":30000"));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(600)));
  ::kv_indexer::v1::ConfigureExpectedWorkersResponse resp;
  const absl::Time start = absl::Now();
  const grpc::Status s = kvi.ConfigureExpectedWorkers(&ctx, req, &resp);
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!s.ok() || resp.total_workers() != static_cast<uint32_t>(workers))
    Fail("ConfigureExpectedWorkers: " + s.error_message());
  return ms;
}

// Milliseconds of one ApplyExternalKvBatch of each of `workers` workers
// (named first-0, first-1, ...), one call after another: their first
// batches when the index does not follow them yet.
double Batches(::kv_indexer::v1::KVIndexer::Stub& kvi, int workers, int seq) {
  const absl::Time start = absl::Now();
  for (int w = 0; w < workers; ++w) {
    ::kv_indexer::v1::ApplyExternalKvBatchRequest req;
    req.set_worker_id(absl::StrCat("first-", w));
    req.set_seq(seq);
    req.set_worker_address(
        absl::StrCat("http://10.2.", w / 256, ".", w % 256, ":30000"));
    ::kv_indexer::v1::ExternalKvAction* a = req.add_actions();
    a->set_type(::kv_indexer::v1::ACTION_REPORT);
    a->set_tier(::kv_indexer::v1::TIER_HBM);
    a->add_hashes(w + 1);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    ::kv_indexer::v1::ApplyExternalKvBatchResponse resp;
    const grpc::Status s = kvi.ApplyExternalKvBatch(&ctx, req, &resp);
    if (!s.ok()) Fail("ApplyExternalKvBatch: " + s.error_message());
  }
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

int Main() {
  std::unique_ptr<Server> server = StartServer();
  const std::string target = server->addresses()[0];
  const Requests r = MakeRequests();
  {
    auto channel =
        grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    auto index = v1::PrefixIndex::NewStub(channel);
    auto kvi = ::kv_indexer::v1::KVIndexer::NewStub(channel);
    for (int p = 0; p < kPrompts; ++p) {
      if (!Call(0, p, r, *index, *kvi, true) ||
          !Call(1, p, r, *index, *kvi, true)) {
        Fail(absl::StrCat("prompt ", p, ": an answer is not the index's"));
      }
    }
  }
  double best[2] = {0, 0};
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (int kind = 0; kind < 2; ++kind) {
      const double rate = Run(kind, r, target);
      std::printf("round %d %-22s %10.0f calls/s\n", round,
                  kind == 0 ? "Route" : "MatchExternalKvPrefix", rate);
      best[kind] = std::max(best[kind], rate);
    }
  }
  std::printf(
      "Route (2k tokens, 16 workers)            %10.0f calls/s\n"
      "MatchExternalKvPrefix (128 hashes)       %10.0f calls/s\n"
      "ratio MatchExternalKvPrefix / Route      %10.2f (target >= 0.8)\n",
      best[0], best[1], best[1] / best[0]);
  const int workers = absl::GetFlag(FLAGS_configure_workers);
  if (workers > 0) {
    auto kvi = ::kv_indexer::v1::KVIndexer::NewStub(
        grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    const double first = Configure(*kvi, workers);
    const double again = Configure(*kvi, workers);
    std::printf(
        "ConfigureExpectedWorkers, %d new workers  %10.1f ms (again: %.1f "
        "ms)\n",
        workers, first, again);
    const double first_batches = Batches(*kvi, workers, 0);
    const double next_batches = Batches(*kvi, workers, 1);
    std::printf(
        "first ApplyExternalKvBatch, %d new workers %9.1f ms (%.1f us each; "
        "their next: %.1f us each)\n",
        workers, first_batches, 1000 * first_batches / workers,
        1000 * next_batches / workers);
  }
  server->Shutdown();
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return prefixd::Main();
}
