// prefixd: serves the prefix cache until SIGTERM or SIGINT, then drains and
// exits 0. `prefixd --help` lists the flags. Everything between start and
// stop is server/daemon.h's.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/flag_parser.h"
#include "base/mutex.h"
#include "server/check_config.h"
#include "server/config.h"
#include "server/daemon.h"
#include "server/flags.h"
#include "server/stop_signals.h"

namespace {

// Prints "prefixd: [what: ]message"; returns `code` (base/flag_parser.h's
// exit codes).
int Fail(const std::string& what, const absl::Status& status,
         int code = prefixd::kExitFailure) {
  std::fprintf(stderr, "prefixd: %s%s\n",
               what.empty() ? "" : (what + ": ").c_str(),
               std::string(status.message()).c_str());
  return code;
}

// --help, --version and --check_config answer and exit; nullopt otherwise.
// --check_config: 0 and the resolved settings on stdout, or 1 and the
// error on stderr, as start-up with that config would exit.
std::optional<int> AnswerAndExit(const prefixd::CommandLine& flags) {
  if (flags.help) {
    std::fputs(prefixd::CommandLineHelp().c_str(), stdout);
    return 0;
  }
  if (flags.version) {
    std::printf("prefixd %s\n", PREFIXD_VERSION);
    return 0;
  }
  if (!flags.check_config) return std::nullopt;
  absl::StatusOr<std::string> report = prefixd::CheckConfig(flags);
  if (!report.ok()) {
    return Fail(absl::StrJoin(flags.config_paths, " + "), report.status());
  }
  std::fputs(report->c_str(), stdout);
  return 0;
}

// SIGHUP: re-reads the configuration (file and flags, as at start-up) and
// takes its principals and TLS files; a config or a TLS file that does not
// load, or that the running daemon cannot take, is refused with one line and
// the old one stays.
void Reload(const prefixd::CommandLine& flags, prefixd::Daemon& daemon) {
  absl::StatusOr<prefixd::ServerConfig> config =
      prefixd::LoadServerConfig(flags);
  const absl::Status s = config.ok() ? daemon.Reload(*config) : config.status();
  if (s.ok()) {
    std::fputs(
        "prefixd: SIGHUP: principals reloaded (and the TLS files, if any)\n",
        stderr);
  } else {
    Fail("SIGHUP: configuration refused, the old one stays in force", s);
  }
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
  if (std::optional<int> code = AnswerAndExit(*flags)) return *code;
  absl::StatusOr<prefixd::ServerConfig> config =
      prefixd::LoadServerConfig(*flags);
  if (!config.ok()) return Fail("bad configuration", config.status());

  prefixd::StopSignals signals;  // before any thread exists
  const absl::Duration drain = config->drain_timeout;
  absl::StatusOr<std::unique_ptr<prefixd::Daemon>> daemon =
      prefixd::Daemon::Start(*std::move(config));
  if (!daemon.ok()) return Fail("", daemon.status());
  std::fputs((*daemon)->Banner().c_str(), stdout);
  std::fflush(stdout);

  int sig = signals.Wait();
  for (; sig == SIGHUP; sig = signals.Wait()) Reload(*flags, **daemon);
  std::fprintf(
      stderr,
      "prefixd: %s: health NOT_SERVING, draining in-flight calls (up to %s)\n",
      prefixd::SignalName(sig), absl::FormatDuration(drain).c_str());
  signals.ExitOnSecond();
  const absl::Status saved = (*daemon)->Shutdown();
  daemon->reset();
  std::fputs("prefixd: stopped\n", stderr);
  return saved.ok() ? prefixd::kExitOk : prefixd::kExitFailure;
}
