// prefixd: serves the prefix cache until SIGTERM or SIGINT, then drains and
// exits 0. `prefixd --help` lists the flags.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/flag_parser.h"
#include "base/mutex.h"
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

// SIGHUP: re-reads the configuration (file and flags, as at start-up) and
// takes its principals and TLS files; a config or a TLS file that does not
// load, or that the running daemon cannot take, is refused with one line and
// the old one stays.
void ReloadPrincipals(const prefixd::CommandLine& flags,
                      prefixd::Server& server) {
  absl::StatusOr<prefixd::ServerConfig> config =
      prefixd::LoadServerConfig(flags);
  absl::Status s =
      config.ok() ? server.ReloadPrincipals(config->proto) : config.status();
  std::fprintf(stderr, "prefixd: SIGHUP: %s\n",
               s.ok() ? "principals reloaded (and the TLS files, if any)"
                      : absl::StrCat("configuration refused, the old one "
                                     "stays in force: ",
                                     s.message())
                            .c_str());
}

// Prints the error; returns `code` (base/flag_parser.h's exit codes).
int Fail(absl::string_view what, const absl::Status& status,
         int code = prefixd::kExitFailure) {
  std::fprintf(stderr, "prefixd: %s: %s\n", std::string(what).c_str(),
               std::string(status.message()).c_str());
  return code;
}

// --check_config: 0 and the resolved settings on stdout, or 1 and the
// error on stderr, as start-up with that config would exit.
int CheckConfigAndExit(const prefixd::CommandLine& flags) {
  absl::StatusOr<std::string> report = prefixd::CheckConfig(flags);
  if (!report.ok()) {
    std::fprintf(stderr, "prefixd: %s: %s\n",
                 absl::StrJoin(flags.config_paths, " + ").c_str(),
                 std::string(report.status().message()).c_str());
    return 1;
  }
  std::fputs(report->c_str(), stdout);
  return 0;
}

// Drains `server` and, with `snapshot_path` set, writes the snapshot: the
// end of a clean stop, and of a start that failed after the server began
// serving (its cache, restored or not, is the engine's state by then).
// Returns 1 if the snapshot could not be written, else 0.
int DrainAndSave(prefixd::Server& server, prefixd::Metrics& metrics,
                 const std::string& snapshot_path) {
  server.Shutdown();
  metrics.StopServing();  // no scrape may read the cache once it is gone
  if (snapshot_path.empty()) return 0;
  // Drained: the cache no longer changes, so the file is the final state.
  absl::StatusOr<std::string> saved = prefixd::WriteSnapshot(
      *server.cache(), {server.config().fingerprint, server.epoch()},
      snapshot_path);
  std::fprintf(stderr, "prefixd: %s\n",
               saved.ok() ? saved->c_str()
                          : absl::StrCat("cannot write the snapshot: ",
                                         saved.status().message(),
                                         "; the next start will be empty")
                                .c_str());
  return saved.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Abseil's deadlock detector costs a third of the cache's throughput
  // (base/mutex.h). The tests keep it on.
  prefixd::DisableMutexDeadlockDetection();
  absl::StatusOr<prefixd::CommandLine> flags =
      prefixd::ParseCommandLine(absl::MakeConstSpan(argv + 1, argc - 1));
  if (!flags.ok()) {
    return Fail("bad command line (see --help)", flags.status(),
                prefixd::kExitUsage);
  }
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
  sigset_t waited = stop;  // stop signals and SIGHUP
  sigaddset(&waited, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &waited, nullptr);

  const absl::Duration drain = config->drain_timeout;
  // Sees every RPC from the first; serves /metrics once the server is up.
  prefixd::Metrics metrics(PREFIXD_VERSION);
  prefixd::ServerDeps deps;
  deps.observer = &metrics;
  // A clean snapshot is consumed here, before anything is served; a bad one
  // is moved aside and the daemon starts empty (server/snapshot_file.h).
  const std::string snapshot_path = config->snapshot_path;
  std::unique_ptr<prefixd::SnapshotLock> snapshot_lock;  // held until exit
  if (!snapshot_path.empty()) {
    absl::StatusOr<std::unique_ptr<prefixd::SnapshotLock>> lock =
        prefixd::SnapshotLock::Acquire(snapshot_path);
    if (!lock.ok()) return Fail("cannot start", lock.status());
    snapshot_lock = *std::move(lock);
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
  // The status page and the KV calculator, on the metrics listener.
  auto pages = std::make_unique<prefixd::StatusPage>(
      (*server)->cache(), prefixd::StatusPageInfoOf(**server, PREFIXD_VERSION));
  const absl::Status metrics_up = metrics.Serve(
      (*server)->cache(), (*server)->config().metrics_listen,
      (*server)->index(), (*server)->events_publisher(), pages.get());
  if (!metrics_up.ok()) {
    const int code = Fail("cannot serve metrics", metrics_up);
    // The server may have served calls already: its cache, not the consumed
    // file, is the state to keep, so it is saved as at a clean stop.
    const int saved = DrainAndSave(**server, metrics, snapshot_path);
    if (restored) {
      if (saved == 0) {
        prefixd::DiscardConsumedSnapshot(snapshot_path);
      } else {
        prefixd::ReturnConsumedSnapshot(snapshot_path).IgnoreError();
      }
    }
    return code;
  }
  if (restored) prefixd::DiscardConsumedSnapshot(snapshot_path);
  std::fputs(prefixd::StartupBanner(**server).c_str(), stdout);
  std::fflush(stdout);

  int sig = 0;
  for (sigwait(&waited, &sig); sig == SIGHUP; sigwait(&waited, &sig)) {
    ReloadPrincipals(*flags, **server);
  }
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
  const int exit_code = DrainAndSave(**server, metrics, snapshot_path);
  pages.reset();  // the status page's sampler reads the cache: before it goes
  server->reset();
  std::fputs("prefixd: stopped\n", stderr);
  return exit_code;
}
