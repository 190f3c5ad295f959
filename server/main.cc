// prefixd: serves the prefix cache until SIGTERM or SIGINT, then drains and
// exits 0. `prefixd --help` lists the flags.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/check_config.h"
#include "server/config.h"
#include "server/flags.h"
#include "server/metrics.h"
#include "server/server.h"
#include "server/snapshot_file.h"
#include "server/status_page.h"

namespace {

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

int Fail(absl::string_view what, const absl::Status& status) {
  std::fprintf(stderr, "prefixd: %s: %s\n", std::string(what).c_str(),
               std::string(status.message()).c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// --check_config: 0 and the resolved settings on stdout, or 1 and the
// error on stderr (not Fail's 2: a config, not the command line, is wrong).
int CheckConfigAndExit(const prefixd::CommandLine& flags) {
  absl::StatusOr<std::string> report = prefixd::CheckConfig(flags);
  if (!report.ok()) {
    std::fprintf(stderr, "prefixd: %s: %s\n", flags.config_path.c_str(),
                 std::string(report.status().message()).c_str());
    return 1;
  }
  std::fputs(report->c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Debian builds abseil without NDEBUG, which leaves absl::Mutex's deadlock
  // detector on: a process-wide lock taken on every Lock() that cost a third
  // of the cache's throughput (docs/performance.md). The tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::StatusOr<prefixd::CommandLine> flags =
      prefixd::ParseCommandLine(absl::MakeConstSpan(argv + 1, argc - 1));
  if (!flags.ok()) return Fail("bad command line (see --help)", flags.status());
  if (flags->help) {
    std::fputs(prefixd::CommandLineHelp().c_str(), stdout);
    return 0;
  }
  if (flags->version) {
    std::printf("prefixd %s\n", PREFIXD_VERSION);
    return 0;
  }
  if (flags->check_config) return CheckConfigAndExit(*flags);
  absl::StatusOr<prefixd::ServerConfig> config =
      prefixd::LoadServerConfig(*flags);
  if (!config.ok()) return Fail("bad configuration", config.status());

  // Blocked before any thread exists (gRPC starts its own), so every thread
  // inherits the mask and the signals wait for sigwait below instead of
  // interrupting whatever thread the kernel picks.
  const sigset_t stop = StopSignals();
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  const absl::Duration drain = config->drain_timeout;
  // Sees every RPC from the first; serves /metrics once the server is up.
  prefixd::Metrics metrics(PREFIXD_VERSION);
  prefixd::ServerDeps deps;
  deps.observer = &metrics;
  // A clean snapshot is consumed here, before anything is served; a bad one
  // is moved aside and the daemon starts empty (server/snapshot_file.h).
  const std::string snapshot_path = config->snapshot_path;
  if (!snapshot_path.empty()) {
    absl::StatusOr<prefixd::RestoredSnapshot> restored =
        prefixd::RestoreSnapshot(snapshot_path, config->fingerprint,
                                 config->cache);
    if (!restored.ok()) return Fail("cannot start", restored.status());
    std::fprintf(stderr, "prefixd: %s\n", restored->summary.c_str());
    deps.cache = std::move(restored->cache);
    deps.epoch = restored->epoch;
  }
  const bool restored = deps.epoch.has_value();
  absl::StatusOr<std::unique_ptr<prefixd::Server>> server =
      prefixd::Server::Start(*std::move(config), std::move(deps));
  if (!server.ok()) {
    // Nothing was served: the snapshot still holds for the next attempt.
    if (restored) prefixd::ReturnConsumedSnapshot(snapshot_path).IgnoreError();
    return Fail("cannot start", server.status());
  }
  if (restored) prefixd::DiscardConsumedSnapshot(snapshot_path);
  // The status page and the KV calculator, on the metrics listener.
  auto pages = std::make_unique<prefixd::StatusPage>(
      (*server)->cache(), prefixd::StatusPageInfoOf(**server, PREFIXD_VERSION));
  const absl::Status metrics_up = metrics.Serve(
      (*server)->cache(), (*server)->config().metrics_listen,
      (*server)->index(), (*server)->events_publisher(), pages.get());
  if (!metrics_up.ok()) return Fail("cannot serve metrics", metrics_up);
  std::fputs(prefixd::StartupBanner(**server).c_str(), stdout);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(
      stderr,
      "prefixd: %s: health NOT_SERVING, draining in-flight calls (up to %s)\n",
      sig == SIGTERM ? "SIGTERM" : "SIGINT",
      absl::FormatDuration(drain).c_str());
  // A second signal means the operator will not wait for the drain.
  std::thread([stop] {
    int again = 0;
    sigwait(&stop, &again);
    std::fputs("prefixd: second signal, exiting without draining\n", stderr);
    _exit(1);
  }).detach();
  (*server)->Shutdown();
  metrics.StopServing();  // no scrape may read the cache once it is gone
  pages.reset();          // nor the status page's sampler
  int exit_code = 0;
  if (!snapshot_path.empty()) {
    // Drained: the cache no longer changes, so the file is the final state.
    absl::StatusOr<std::string> saved = prefixd::WriteSnapshot(
        *(*server)->cache(),
        {(*server)->config().fingerprint, (*server)->epoch()}, snapshot_path);
    std::fprintf(stderr, "prefixd: %s\n",
                 saved.ok() ? saved->c_str()
                            : absl::StrCat("cannot write the snapshot: ",
                                           saved.status().message(),
                                           "; the next start will be empty")
                                  .c_str());
    if (!saved.ok()) exit_code = 1;
  }
  server->reset();
  std::fputs("prefixd: stopped\n", stderr);
  return exit_code;
}
