// The cross-tenant timing probe (docs/security.md): can tenant B
// tell, from how long its own Match takes, whether tenant A has cached a
// prefix? A benchmark, not a test: it prints numbers, it asserts nothing.
//
// By default it starts an in-process prefixd with TOKEN auth on a loopback
// TCP port (plaintext: TLS would only add noise and hide a difference) and
// two tenant principals. A caches prefix P_A; nobody caches P_N. Then, in a
// random interleaving, it times over gRPC, each --samples times:
//   B: Match(P_A)  vs  B: Match(P_N)   -- the probe: must look alike;
//   A: Match(P_A)  vs  A: Match(P_N)   -- the control: a hit vs a miss,
//                                         which the probe must be able to see.
// and reports, per pair, the medians and the two-sample Kolmogorov-Smirnov
// statistic D with its asymptotic p-value.
//
//   timing_probe [--samples=1000] [--prefix_blocks=64] [--json]
//   timing_probe --target=HOST:PORT --token_a=... --token_b=... [--tls_ca=F]
//                (a running daemon: principals for two tenants)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "google/protobuf/text_format.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/server.h"

ABSL_FLAG(int, samples, 1000, "timed calls per condition (at least 250)");
ABSL_FLAG(int, warmup, 200, "untimed calls per condition first");
ABSL_FLAG(int, prefix_blocks, 64, "length of P_A and P_N in blocks");
ABSL_FLAG(int, block_size, 16, "tokens per block (in-process daemon)");
ABSL_FLAG(uint64_t, seed, 0,
          "seed of the prompts and the interleaving; 0: a random one");
ABSL_FLAG(std::string, target, "",
          "probe a running daemon at HOST:PORT instead of an in-process one");
ABSL_FLAG(std::string, token_a, "", "--target: bearer token of tenant A");
ABSL_FLAG(std::string, token_b, "", "--target: bearer token of tenant B");
ABSL_FLAG(std::string, tls_ca, "", "--target: PEM roots to verify it by TLS");
ABSL_FLAG(bool, json, false, "print one JSON object instead of text");

namespace prefixd {
namespace {

constexpr char kTokenA[] = "timing-probe-token-a";
constexpr char kTokenB[] = "timing-probe-token-b";

struct Ks {
  double d = 0;  // sup |F1 - F2|
  double p = 1;  // asymptotic P(D >= d) under "same distribution"
};

// Q_KS(lambda) = 2 sum_{j>=1} (-1)^{j-1} exp(-2 j^2 lambda^2).
double KolmogorovQ(double lambda) {
  if (lambda < 0.2) return 1.0;
  double sum = 0, sign = 1;
  for (int j = 1; j <= 100; ++j) {
    const double term = sign * std::exp(-2.0 * j * j * lambda * lambda);
    sum += term;
    if (std::fabs(term) < 1e-12) break;
    sign = -sign;
  }
  return std::clamp(2 * sum, 0.0, 1.0);
}

Ks KolmogorovSmirnov(std::vector<double> x, std::vector<double> y) {
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  const double n = static_cast<double>(x.size());
  const double m = static_cast<double>(y.size());
  size_t i = 0, j = 0;
  Ks ks;
  while (i < x.size() && j < y.size()) {
    const double v = std::min(x[i], y[j]);
    while (i < x.size() && x[i] <= v) ++i;
    while (j < y.size() && y[j] <= v) ++j;
    ks.d = std::max(ks.d, std::fabs(i / n - j / m));
  }
  // Numerical Recipes' small-sample correction of the asymptotic law.
  const double ne = std::sqrt(n * m / (n + m));
  ks.p = KolmogorovQ((ne + 0.12 + 0.11 / ne) * ks.d);
  return ks;
}

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

// Random tokens in [2^21, 2^28): every one is a 4-byte varint on the wire, so
// the requests of the conditions have exactly the same size (a prompt of
// smaller numbers would be a shorter message, and faster for that reason
// alone).
std::vector<uint32_t> RandomPrompt(std::mt19937_64& rng, int tokens) {
  std::uniform_int_distribution<uint32_t> token(1u << 21, (1u << 28) - 1);
  std::vector<uint32_t> t(tokens);
  for (uint32_t& v : t) v = token(rng);
  return t;
}

absl::StatusOr<std::unique_ptr<Server>> StartDaemon() {
  std::string text = absl::StrCat(
      "listen: \"127.0.0.1:0\"\n", "kv_budget: \"8GiB\"\n",
      "block_size: ", absl::GetFlag(FLAGS_block_size), "\n",
      "auth { mode: TOKEN } tenants { name: \"a\" } tenants { name: \"b\" }\n");
  for (auto [name, tenant, token] :
       {std::tuple{"app-a", "a", kTokenA}, std::tuple{"app-b", "b", kTokenB}}) {
    absl::StrAppend(&text, "principals { name: \"", name,
                    "\" role: TENANT tenants: \"", tenant,
                    "\" token_sha256: \"", Sha256Hex(token), "\" }\n");
  }
  v1::Config proto;
  if (!google::protobuf::TextFormat::ParseFromString(text, &proto)) {
    return absl::InternalError("bad built-in config");
  }
  FillDefaults(&proto);
  absl::StatusOr<ServerConfig> config = ResolveConfig(proto);
  if (!config.ok()) return config.status();
  return Server::Start(*std::move(config));
}

struct Condition {
  const char* name;
  Client* client;
  const std::vector<uint32_t>* prompt;
  uint64_t want_matched;
  std::vector<double> micros;
};

struct Pair {
  const char* name;
  const Condition* x;
  const Condition* y;
  Ks ks;
};

int Run() {
  const int samples = absl::GetFlag(FLAGS_samples);
  if (samples < 250) {
    std::fprintf(stderr, "--samples must be at least 250\n");
    return 2;
  }
  std::unique_ptr<Server> server;
  std::string target = absl::GetFlag(FLAGS_target);
  ClientOptions a_opts, b_opts;
  a_opts.token = kTokenA;
  b_opts.token = kTokenB;
  if (target.empty()) {
    absl::StatusOr<std::unique_ptr<Server>> s = StartDaemon();
    if (!s.ok()) {
      std::fprintf(stderr, "cannot start prefixd: %s\n",
                   std::string(s.status().message()).c_str());
      return 1;
    }
    server = *std::move(s);
    target = server->addresses()[0];
  } else {
    a_opts.token = absl::GetFlag(FLAGS_token_a);
    b_opts.token = absl::GetFlag(FLAGS_token_b);
    a_opts.tls_ca_file = b_opts.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  }
  absl::StatusOr<std::unique_ptr<Client>> a = Client::Connect(target, a_opts);
  absl::StatusOr<std::unique_ptr<Client>> b = Client::Connect(target, b_opts);
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "cannot connect to %s\n", target.c_str());
    return 1;
  }
  absl::StatusOr<v1::GetInfoResponse> info = (*a)->GetInfo();
  if (!info.ok()) {
    std::fprintf(stderr, "GetInfo: %s\n",
                 std::string(info.status().message()).c_str());
    return 1;
  }
  const int bs = static_cast<int>(info->block_size());
  const int blocks = absl::GetFlag(FLAGS_prefix_blocks);
  // Random prompts, so that a running daemon has not seen them.
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  std::mt19937_64 rng(seed != 0 ? seed : std::random_device()());
  const std::vector<uint32_t> p_a = RandomPrompt(rng, blocks * bs);
  const std::vector<uint32_t> p_n = RandomPrompt(rng, blocks * bs);
  std::vector<uint64_t> ids(blocks);
  for (int i = 0; i < blocks; ++i) ids[i] = (rng() >> 8) + 1;
  absl::StatusOr<Client::InsertResult> ins = (*a)->Insert(p_a, ids);
  if (!ins.ok()) {
    std::fprintf(stderr, "A's Insert: %s\n",
                 std::string(ins.status().message()).c_str());
    return 1;
  }
  // B has a tree of its own, so its lookups are not of an empty tenant.
  std::vector<uint64_t> b_ids(blocks);
  for (int i = 0; i < blocks; ++i) b_ids[i] = (rng() >> 8) + 1;
  (void)(*b)->Insert(RandomPrompt(rng, blocks * bs), b_ids);

  const uint64_t full = static_cast<uint64_t>(blocks) * bs;
  std::vector<Condition> conds = {
      {"B Match(P_A) [A cached it]", b->get(), &p_a, 0, {}},
      {"B Match(P_N) [nobody did]", b->get(), &p_n, 0, {}},
      {"A Match(P_A) [hit]", a->get(), &p_a, full, {}},
      {"A Match(P_N) [miss]", a->get(), &p_n, 0, {}},
  };
  std::vector<int> order;
  for (int c = 0; c < 4; ++c)
    order.insert(order.end(), samples + absl::GetFlag(FLAGS_warmup), c);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> done(4, 0);
  for (int c : order) {
    Condition& cond = conds[c];
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<Client::MatchResult> m = cond.client->Match(*cond.prompt);
    const auto t1 = std::chrono::steady_clock::now();
    if (!m.ok() || m->matched_tokens() != cond.want_matched) {
      std::fprintf(stderr, "%s: unexpected result %s\n", cond.name,
                   m.ok() ? absl::StrCat(m->matched_tokens(), " tokens").c_str()
                          : std::string(m.status().message()).c_str());
      return 1;
    }
    if (done[c]++ >= absl::GetFlag(FLAGS_warmup)) {
      cond.micros.push_back(
          std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  }
  std::vector<Pair> pairs = {
      {"probe: B on A's prefix vs B on an uncached prefix",
       &conds[0],
       &conds[1],
       {}},
      {"control: A hit vs A miss", &conds[2], &conds[3], {}},
  };
  for (Pair& p : pairs) p.ks = KolmogorovSmirnov(p.x->micros, p.y->micros);

  if (absl::GetFlag(FLAGS_json)) {
    std::string out = absl::StrFormat(
        "{\"samples\": %d, \"prefix_tokens\": %d, \"conditions\": [", samples,
        blocks * bs);
    for (size_t i = 0; i < conds.size(); ++i) {
      absl::StrAppendFormat(
          &out,
          "%s{\"name\": \"%s\", \"p10_us\": %.2f, \"median_us\": %.2f, "
          "\"p90_us\": %.2f}",
          i ? ", " : "", conds[i].name, Quantile(conds[i].micros, 0.1),
          Quantile(conds[i].micros, 0.5), Quantile(conds[i].micros, 0.9));
    }
    absl::StrAppend(&out, "], \"pairs\": [");
    for (size_t i = 0; i < pairs.size(); ++i) {
      absl::StrAppendFormat(&out,
                            "%s{\"name\": \"%s\", \"ks_d\": %.4f, "
                            "\"p_value\": %.3g}",
                            i ? ", " : "", pairs[i].name, pairs[i].ks.d,
                            pairs[i].ks.p);
    }
    absl::StrAppend(&out, "]}\n");
    std::fputs(out.c_str(), stdout);
    return 0;
  }
  std::printf(
      "timing probe: %d samples per condition (after %d warm-up), "
      "prefix %d tokens (%d blocks), target %s%s\n",
      samples, absl::GetFlag(FLAGS_warmup), blocks * bs, blocks, target.c_str(),
      server ? " (in-process, TOKEN, loopback)" : "");
  std::printf("  %-30s %9s %9s %9s   (microseconds, client-side)\n", "", "p10",
              "median", "p90");
  for (const Condition& c : conds) {
    std::printf("  %-30s %9.1f %9.1f %9.1f\n", c.name, Quantile(c.micros, 0.1),
                Quantile(c.micros, 0.5), Quantile(c.micros, 0.9));
  }
  for (const Pair& p : pairs) {
    std::printf("  %-52s KS D = %.4f  p = %.3g\n", p.name, p.ks.d, p.ks.p);
  }
  return 0;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "times tenant B's Match on a prefix tenant A cached vs one nobody "
      "cached (docs/security.md)");
  absl::ParseCommandLine(argc, argv);
  return prefixd::Run();
}
