#include "bench/load/common.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace prefixd::bench {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

LatencySummary Summarize(std::vector<int64_t>* ns) {
  LatencySummary s;
  if (ns->empty()) return s;
  std::sort(ns->begin(), ns->end());
  s.count = ns->size();
  auto at = [&](double q) {
    size_t i = static_cast<size_t>(q * static_cast<double>(ns->size()));
    return (*ns)[std::min(i, ns->size() - 1)] / 1e3;
  };
  double sum = 0;
  for (int64_t v : *ns) sum += static_cast<double>(v);
  s.mean_us = sum / static_cast<double>(ns->size()) / 1e3;
  s.p50_us = at(0.50);
  s.p90_us = at(0.90);
  s.p99_us = at(0.99);
  s.p999_us = at(0.999);
  s.max_us = ns->back() / 1e3;
  return s;
}

void PrintHeader(FILE* out) {
  std::fprintf(out,
               "%-30s %-16s %5s %9s %10s %11s %8s %8s %8s %8s %6s %9s "
               "%9s\n",
               "target", "phase", "conc", "rate", "calls/s", "lookups/s",
               "p50us", "p90us", "p99us", "p999us", "errors", "srv_us/c",
               "cli_us/c");
}

void PrintRow(FILE* out, const PhaseResult& r) {
  std::string rate =
      r.offered_rate > 0 ? absl::StrFormat("%.0f", r.offered_rate) : "closed";
  std::fprintf(out,
               "%-30s %-16s %5d %9s %10.0f %11.0f %8.1f %8.1f %8.1f %8.1f "
               "%6llu %9.1f %9.1f\n",
               r.target.c_str(), r.phase.c_str(), r.concurrency, rate.c_str(),
               r.calls_per_s(), r.lookups_per_s(), r.latency.p50_us,
               r.latency.p90_us, r.latency.p99_us, r.latency.p999_us,
               static_cast<unsigned long long>(r.errors), r.server_cpu_us,
               r.client_cpu_us);
  if (!r.first_error.empty()) {
    std::fprintf(out, "  first error: %s\n", r.first_error.c_str());
  }
  if (r.late > 0) {
    std::fprintf(out,
                 "  %llu calls started over 1 ms after their scheduled "
                 "time (those that waited for a slot count from it)\n",
                 static_cast<unsigned long long>(r.late));
  }
  if (!r.slow_calls.empty()) std::fprintf(out, "%s\n", r.slow_calls.c_str());
  std::fflush(out);
}

std::string ToJson(const PhaseResult& r) {
  return absl::StrFormat(
      "{\"target\":\"%s\",\"phase\":\"%s\",\"concurrency\":%d,"
      "\"offered_rate\":%.1f,\"seconds\":%.3f,\"calls\":%d,\"lookups\":%d,"
      "\"errors\":%d,\"calls_per_s\":%.1f,\"lookups_per_s\":%.1f,"
      "\"p50_us\":%.2f,\"p90_us\":%.2f,\"p99_us\":%.2f,\"p999_us\":%.2f,"
      "\"max_us\":%.2f,\"mean_us\":%.2f,\"server_cpu_us_per_call\":%.2f,"
      "\"client_cpu_us_per_call\":%.2f}",
      r.target, r.phase, r.concurrency, r.offered_rate, r.seconds, r.calls,
      r.lookups, r.errors, r.calls_per_s(), r.lookups_per_s(), r.latency.p50_us,
      r.latency.p90_us, r.latency.p99_us, r.latency.p999_us, r.latency.max_us,
      r.latency.mean_us, r.server_cpu_us, r.client_cpu_us);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> ParseWeights(
    absl::string_view spec) {
  std::vector<std::pair<std::string, double>> out;
  for (absl::string_view part :
       absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(part, absl::MaxSplits(':', 1));
    double w = 1;
    if (!kv.second.empty() && (!absl::SimpleAtod(kv.second, &w) || w < 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad weight in \"", part, "\" of \"", spec, "\""));
    }
    out.emplace_back(std::string(absl::StripAsciiWhitespace(kv.first)), w);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("empty mix \"", spec, "\""));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::vector<std::string>& argv) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    // Signals the parent blocks (gRPC servers do) must reach the child.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(pipe_fds[1]);
  return std::unique_ptr<Subprocess>(new Subprocess(pid, pipe_fds[0]));
}

Subprocess::~Subprocess() {
  Stop();
  close(out_);
}

absl::StatusOr<std::string> Subprocess::WaitForLine(absl::string_view prefix,
                                                    absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (true) {
    size_t nl;
    while ((nl = buffer_.find('\n')) != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (absl::StartsWith(line, prefix)) return line;
    }
    const absl::Duration left = end - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no line \"", prefix, "...\" from pid ", pid_));
    }
    pollfd p{out_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <=
        0) {
      continue;
    }
    char buf[4096];
    const ssize_t n = read(out_, buf, sizeof(buf));
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("pid ", pid_, " closed its stdout (exited?)"));
    }
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

int Subprocess::Stop(absl::Duration grace) {
  if (stopped_) return 0;
  stopped_ = true;
  kill(pid_, SIGTERM);
  const absl::Time end = absl::Now() + grace;
  int status = -1;
  while (absl::Now() < end) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) return status;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  return status;
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  // The fields after the command (which may hold spaces): utime and stime
  // are the 12th and 13th.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<absl::string_view> f = absl::StrSplit(
      absl::string_view(stat).substr(close + 2), ' ', absl::SkipEmpty());
  uint64_t utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) ||
      !absl::SimpleAtoi(f[12], &stime)) {
    return -1;
  }
  return static_cast<double>(utime + stime) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

void SetCpuPerCall(double server0, double server1, double self0, double self1,
                   PhaseResult* r) {
  if (r->all_calls == 0) return;
  const double n = static_cast<double>(r->all_calls);
  if (server0 >= 0 && server1 >= 0) {
    r->server_cpu_us = (server1 - server0) * 1e6 / n;
  }
  r->client_cpu_us = (self1 - self0) * 1e6 / n;
}

absl::StatusOr<int> FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("bind: ", std::strerror(errno)));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace prefixd::bench
