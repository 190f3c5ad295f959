// The Mooncake Conductor API against Route (docs/performance.md, "The
// Mooncake Conductor API"): the real daemon in this process (gRPC, the
// HTTP listener, the index), 16 workers holding different prefixes of one
// 2k-token prompt, and one client thread calling, in turn for --seconds
// each:
//
//   route          PrefixIndex/Route over gRPC (one HTTP/2 connection)
//   query          POST /query with the prompt's token_ids (one kept-alive
//                  HTTP/1.1 connection)
//   query_by_hash  POST /query_by_hash with its 128 rolling hashes
//   query_msgpack  POST /query in MessagePack, the token_ids one bin of
//                  little-endian int32 (Mooncake's current Conductor
//                  clients), answered by instance
//
// Prints calls/s of each, /query's against Route's, and each one's server
// CPU per call: the process's CPU time less the client threads', over the
// calls. --clients=N calls from N threads at once. Not a test; one run,
// read as ratios.
//
//   build/bench/conductor_bench --seconds=3 [--clients=4]
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "index/keys.h"
#include "prefixd/v1/prefix_index.grpc.pb.h"
#include "server/config.h"
#include "server/daemon.h"

ABSL_FLAG(double, seconds, 3, "seconds per measured call");
ABSL_FLAG(int, workers, 16, "workers in the index");
ABSL_FLAG(int, prompt_tokens, 2048, "tokens of the prompt (whole blocks)");
ABSL_FLAG(int, clients, 1,
          "client threads calling at once (each its own HTTP connection; "
          "one gRPC channel)");

namespace prefixd {
namespace {

constexpr int kBs = 16;

double CpuSeconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// POSTs over one kept-alive connection, as a router's HTTP client sends
// them (reconnecting if the server closed it).
class HttpClient {
 public:
  explicit HttpClient(int port) : port_(port) {}
  ~HttpClient() {
    if (fd_ >= 0) close(fd_);
  }
  // False on any error or a status other than 200.
  bool Post(const std::string& path, const std::string& content_type,
            const std::string& body) {
    if (fd_ < 0 && !Connect()) return false;
    const std::string request = absl::StrCat(
        "POST ", path,
        " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: ", content_type,
        "\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
    for (size_t done = 0; done < request.size();) {
      const ssize_t n =
          write(fd_, request.data() + done, request.size() - done);
      if (n <= 0) return Reset();
      done += static_cast<size_t>(n);
    }
    std::string answer;
    size_t header_end;
    while ((header_end = answer.find("\r\n\r\n")) == std::string::npos)
      if (!ReadMore(&answer)) return Reset();
    const size_t cl = answer.find("Content-Length: ");
    if (cl == std::string::npos || cl > header_end) return Reset();
    const size_t length = std::stoul(answer.substr(cl + 16));
    while (answer.size() < header_end + 4 + length)
      if (!ReadMore(&answer)) return Reset();
    const bool closes = answer.find("Connection: close") < header_end;
    if (closes) Reset();
    return answer.rfind("HTTP/1.1 200", 0) == 0;
  }

 private:
  bool Connect() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
      return true;
    return Reset();
  }
  bool ReadMore(std::string* out) {
    char buf[65536];
    const ssize_t n = read(fd_, buf, sizeof(buf));
    if (n <= 0) return false;
    out->append(buf, static_cast<size_t>(n));
    return true;
  }
  bool Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    return false;
  }

  const int port_;
  int fd_ = -1;
};

struct Result {
  double calls_per_s = 0;
  double server_cpu_us = 0;  // per call
};

// `clients` threads, each making calls (its own from `make_call`) for
// `seconds`: their calls/s together, and the process's CPU less theirs per
// call.
Result Measure(const std::function<std::function<bool()>()>& make_call,
               int clients, double seconds) {
  std::atomic<int64_t> calls{0};
  std::atomic<bool> failed{false};
  std::vector<double> client_cpu(static_cast<size_t>(clients));
  const double process0 = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::function<bool()> call = make_call();
      for (int i = 0; i < 100; ++i) call();  // warm up
      const double cpu0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
      const absl::Time end = start + absl::Seconds(seconds);
      int64_t n = 0;
      while (absl::Now() < end) {
        if (!call()) failed = true;
        ++n;
      }
      calls += n;
      client_cpu[static_cast<size_t>(c)] =
          CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    });
  }
  for (std::thread& t : threads) t.join();
  if (failed) {
    std::fprintf(stderr, "a call failed\n");
    std::exit(1);
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  double server = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - process0;
  for (double c : client_cpu) server -= c;
  return {static_cast<double>(calls) / wall,
          server / static_cast<double>(calls) * 1e6};
}

// Worker i holds the first (i + 1) * blocks / workers blocks of `prompt`.
void Fill(KvIndex* index, const std::vector<Token>& prompt, int workers) {
  const size_t blocks = prompt.size() / kBs;
  for (int i = 0; i < workers; ++i) {
    const WorkerId w = index->AddWorker(absl::StrCat("w", i), "");
    WorkerLabels labels;
    labels.instance_id = absl::StrCat("inst-", i / 2);
    labels.dp_rank = i % 2;
    labels.model = "m";
    index->SetLabels(w, labels);
    BlockStoredEvent ev;
    const size_t held =
        (static_cast<size_t>(i) + 1) * blocks / static_cast<size_t>(workers);
    for (size_t b = 0; b < held; ++b)
      ev.block_hashes.push_back(static_cast<EngineHash>(b + 1));
    ev.token_ids.assign(prompt.begin(),
                        prompt.begin() + static_cast<long>(held * kBs));
    ev.block_size = kBs;
    ev.chain_blocks = held;
    KvEventBatch batch;
    batch.events.push_back(ev);
    index->Apply(w, batch, 0, absl::Now());
  }
}

int Run() {
  CommandLine flags;
  flags.listen = {"127.0.0.1:0"};
  flags.metrics_listen = "127.0.0.1:0";
  flags.index_http_listen = "127.0.0.1:0";
  flags.index_block_size = kBs;
  flags.kv_budget = "64MiB";
  absl::StatusOr<ServerConfig> config = LoadServerConfig(flags);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(*config);
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s\n", daemon.status().ToString().c_str());
    return 1;
  }
  std::vector<Token> prompt;
  for (int t = 0; t < absl::GetFlag(FLAGS_prompt_tokens); ++t)
    prompt.push_back(static_cast<Token>(1000 + t * 7));
  const int workers = absl::GetFlag(FLAGS_workers);
  Fill((*daemon)->server().index(), prompt, workers);

  auto channel = grpc::CreateChannel((*daemon)->server().addresses()[0],
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::PrefixIndex::NewStub(channel);
  v1::RouteRequest route;
  for (Token t : prompt) route.add_tokens(t);
  std::vector<uint64_t> keys;
  const KeyScheme scheme;
  uint64_t parent = scheme.Root("");
  for (size_t b = 0; b < prompt.size() / kBs; ++b) {
    parent = scheme.Next(parent, b == 0,
                         absl::MakeConstSpan(prompt).subspan(b * kBs, kBs));
    keys.push_back(parent);
  }
  const std::string query = nlohmann::json{
      {"model", "m"},
      {"token_ids", prompt},
      {"block_size", kBs}}.dump();
  const std::string by_hash = nlohmann::json{
      {"model", "m"},
      {"seq_hashes", keys},
      {"block_size", kBs}}.dump();
  std::vector<uint8_t> packed;
  for (Token t : prompt) {
    for (int shift = 0; shift < 32; shift += 8)
      packed.push_back(static_cast<uint8_t>(t >> shift));
  }
  std::string msgpack;
  nlohmann::json::to_msgpack(
      nlohmann::json{{"model", "m"},
                     {"token_ids", nlohmann::json::binary(std::move(packed))},
                     {"block_size", kBs}},
      msgpack);
  const int port = (*daemon)->conductor_port();
  const double seconds = absl::GetFlag(FLAGS_seconds);

  const int clients = absl::GetFlag(FLAGS_clients);
  const Result r = Measure(
      [&]() -> std::function<bool()> {
        return [&] {
          grpc::ClientContext ctx;
          v1::RouteResponse resp;
          return stub->Route(&ctx, route, &resp).ok() &&
                 resp.workers_size() == workers;
        };
      },
      clients, seconds);
  const auto post = [&](std::string path, std::string content_type,
                        const std::string* body) {
    return [=]() -> std::function<bool()> {
      auto http = std::make_shared<HttpClient>(port);
      return [=] { return http->Post(path, content_type, *body); };
    };
  };
  const Result q =
      Measure(post("/query", "application/json", &query), clients, seconds);
  const Result h = Measure(post("/query_by_hash", "application/json", &by_hash),
                           clients, seconds);
  const Result m = Measure(post("/query", "application/msgpack", &msgpack),
                           clients, seconds);
  std::printf(
      "%d workers, a %zu-token prompt (%zu blocks of %d), %d clients\n"
      "  route (gRPC)          %8.0f calls/s  server CPU %6.1f us/call\n"
      "  /query                %8.0f calls/s  server CPU %6.1f us/call\n"
      "  /query_by_hash        %8.0f calls/s  server CPU %6.1f us/call\n"
      "  /query (MessagePack)  %8.0f calls/s  server CPU %6.1f us/call\n"
      "  /query vs Route calls/s: %.2fx\n"
      "  /query_by_hash - /query server CPU: %+.1f us per %zu hashes\n"
      "  /query MessagePack vs JSON server CPU: %.2fx\n",
      workers, prompt.size(), keys.size(), kBs, clients, r.calls_per_s,
      r.server_cpu_us, q.calls_per_s, q.server_cpu_us, h.calls_per_s,
      h.server_cpu_us, m.calls_per_s, m.server_cpu_us,
      q.calls_per_s / r.calls_per_s, h.server_cpu_us - q.server_cpu_us,
      keys.size(), m.server_cpu_us / q.server_cpu_us);
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return prefixd::Run();
}
