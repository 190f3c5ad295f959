// prefixd_bench_server: the prefixd daemon as server/main.cc runs it (same
// flags, same Server, same metrics observer, deadlock detection off), plus
// the bare baseline service of bench/load/bare.proto registered on the same
// gRPC server. The load generator (bench/load/load.cc) starts it, or runs
// against one started by hand:
//
//   prefixd_bench_server --listen=127.0.0.1:50051 --listen=unix:///tmp/b.sock
//
// It prints "listening <address>..." on stdout when it serves and stops on
// SIGTERM or SIGINT.
//
// With --bench_index_workers=N (N > 0) it also serves prefixd.v1.PrefixIndex,
// its fleet index (block size 16, no event sources) filled in process
// before it listens: N workers holding growing shares of
// --bench_index_prompts prompts of --bench_index_prompt_tokens tokens
// (bench/load/route_index.h). The load generator's route mixes pass these.
// The --bench_* flags are this binary's own; the rest are the daemon's.
#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "bench/load/bare.grpc.pb.h"
#include "bench/load/route_index.h"
#include "server/config.h"
#include "server/flags.h"
#include "server/http/metrics.h"
#include "server/http/metrics_listener.h"
#include "server/server.h"

namespace {

// The load generator's NowNs (bench/load/common.cc): steady_clock is
// CLOCK_MONOTONIC, which processes on one machine share.
int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Answers with `reply_bytes` of padding and the handler's start and end
// times, and nothing else.
class BareService final : public prefixd::bench::Bare::CallbackService {
 public:
  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* ctx,
                                 const prefixd::bench::BareRequest* req,
                                 prefixd::bench::BareResponse* resp) override {
    const int64_t start = MonotonicNs();
    resp->set_handler_start_ns(start);
    // The whole response is `reply_bytes` long (to a byte): two stamps of
    // about the same size, then the payload's tag and length.
    const size_t stamps =
        2 * (1 + google::protobuf::io::CodedOutputStream::VarintSize64(
                     static_cast<uint64_t>(start)));
    const size_t overhead = stamps + 3;
    const size_t n = std::min<size_t>(
        req->reply_bytes() > overhead ? req->reply_bytes() - overhead : 0,
        padding_.size());
    resp->set_payload(padding_.data(), n);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    resp->set_handler_end_ns(MonotonicNs());
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const std::string padding_ = std::string(1 << 20, 'x');
};

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "prefixd_bench_server: %s: %s\n", what,
               std::string(status.message()).c_str());
  return 1;
}

// The fleet index to fill (--bench_index_*); workers == 0: none.
struct BenchIndex {
  int workers = 0;
  int prompts = 64;
  int prompt_tokens = 2048;
};

// Takes the --bench_index_* flags out of `args`. False on a bad value.
bool TakeBenchFlags(std::vector<const char*>* args, BenchIndex* out) {
  std::vector<const char*> rest;
  for (const char* a : *args) {
    const absl::string_view arg(a);
    int* field = nullptr;
    absl::string_view value;
    for (auto [name, f] :
         {std::pair{"--bench_index_workers=", &out->workers},
          {"--bench_index_prompts=", &out->prompts},
          {"--bench_index_prompt_tokens=", &out->prompt_tokens}}) {
      if (absl::StartsWith(arg, name)) {
        field = f;
        value = arg.substr(std::string_view(name).size());
      }
    }
    if (field == nullptr) {
      rest.push_back(a);
    } else if (!absl::SimpleAtoi(value, field) || *field < 0) {
      std::fprintf(stderr, "prefixd_bench_server: bad %s\n", a);
      return false;
    }
  }
  *args = std::move(rest);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // As server/main.cc: abseil's deadlock detector off in the daemon.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::vector<const char*> args(argv + 1, argv + argc);
  BenchIndex bench_index;
  if (!TakeBenchFlags(&args, &bench_index)) return 2;
  absl::StatusOr<prefixd::CommandLine> flags =
      prefixd::ParseCommandLine(absl::MakeConstSpan(args));
  if (!flags.ok()) return Fail("bad command line", flags.status());
  if (flags->help) {
    std::fputs(prefixd::CommandLineHelp().c_str(), stdout);
    return 0;
  }
  absl::StatusOr<prefixd::ServerConfig> config =
      prefixd::LoadServerConfig(*flags);
  if (!config.ok()) return Fail("bad configuration", config.status());
  if (bench_index.workers > 0) {
    config->index_enabled = true;
    config->index.block_size = 16;
    config->ingest.sources.clear();
    config->ingest.listen.clear();
  }

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  prefixd::Metrics metrics(PREFIXD_VERSION);
  BareService bare;
  prefixd::ServerDeps deps;
  deps.observer = &metrics;
  deps.extra_services.push_back(&bare);
  absl::StatusOr<std::unique_ptr<prefixd::Server>> server =
      prefixd::Server::Start(*std::move(config), std::move(deps));
  if (!server.ok()) return Fail("cannot start", server.status());
  if (bench_index.workers > 0) {
    const uint64_t entries = prefixd::bench::FillRouteIndex(
        (*server)->index(), bench_index.workers, bench_index.prompts,
        bench_index.prompt_tokens);
    std::fprintf(stderr,
                 "prefixd_bench_server: index: %d workers, %d prompts of %d "
                 "tokens, %llu entries\n",
                 bench_index.workers, bench_index.prompts,
                 bench_index.prompt_tokens,
                 static_cast<unsigned long long>(entries));
  }
  prefixd::HttpSources sources;
  sources.cache = (*server)->cache();
  absl::StatusOr<std::unique_ptr<prefixd::MetricsListener>> http =
      prefixd::MetricsListener::Start((*server)->config().metrics_listen,
                                      &metrics, std::move(sources));
  if (!http.ok()) return Fail("cannot serve metrics", http.status());
  std::printf("listening %s\n",
              absl::StrJoin((*server)->addresses(), " ").c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop, &sig);
  (*server)->Shutdown();
  http->reset();
  server->reset();
  return 0;
}
