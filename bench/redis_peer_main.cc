// redis_peer: prefixd's Match against the way llm-d indexes prefixes in
// Redis, on the same Mooncake trace, at the same concurrency, in one run
// (docs/performance.md, target 9).
//
// Starts redis-server (no persistence) and prefixd on free ports, caches the
// first --populate_fraction of the trace's requests in both (each hash id is
// one block: Redis gets one chained-hash key per block, prefixd an Insert of
// block_size tokens id*block_size+j per block with block ID id+1), then
// looks up random requests of the whole trace with --concurrency round
// trips in flight, each side unary and on its best path:
//   redis-llmd   llm-d's RedisIndex.Lookup: pipelined HKEYS per block key
//   redis-mget   one MGET of the request's keys
//   redis-pipe   MGETs pipelined --depth lookups per round trip
//   prefixd      one Match per lookup
//   prefixd-batch  MatchBatch of --depth lookups
// prefixd's requests carry their tokens in --token_field (tokens_le32: 4
// bytes each, no varints). Every answer is checked against the expected prefix
// length.
//
//   redis_peer --prefixd=build/server/prefixd
#include <google/protobuf/arena.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/load/common.h"
#include "bench/load/driver.h"
#include "bench/redis_peer.h"
#include "client/client.h"
#include "prefixd/v1/prefix_cache.grpc.pb.h"

ABSL_FLAG(std::string, trace_dir, PREFIXD_SOURCE_DIR "/tests/data/mooncake",
          "directory of the Mooncake traces");
ABSL_FLAG(std::string, trace, "conversation",
          "conversation or synthetic (<name>_trace.jsonl)");
ABSL_FLAG(std::string, prefixd, "", "the prefixd binary to start");
ABSL_FLAG(std::string, prefixd_args, "--kv_budget=1TiB",
          "space-separated extra flags for prefixd");
ABSL_FLAG(std::string, redis_server, "/usr/bin/redis-server",
          "the redis-server binary to start");
ABSL_FLAG(int, concurrency, 16,
          "round trips in flight: Redis connections, prefixd calls");
ABSL_FLAG(int, depth, 32,
          "lookups per round trip on the best paths (pipeline depth, batch)");
ABSL_FLAG(std::string, token_field, "tokens_le32",
          "the MatchRequest field prefixd's lookups carry their tokens in: "
          "tokens_le32 (4 bytes each, the best path) or tokens (varints)");
ABSL_FLAG(int, threads, 1, "client threads on each side");
ABSL_FLAG(int, channels, 1, "gRPC channels (connections) to prefixd");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(5), "measured window");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1), "warm-up before it");
ABSL_FLAG(double, populate_fraction, 0.5,
          "leading fraction of the trace cached before the lookups");
ABSL_FLAG(int, rounds, 1, "repeat all phases; the summary takes medians");
ABSL_FLAG(std::string, json, "", "append every phase as a JSON line here");
ABSL_FLAG(std::string, phases, "llmd,mget,prefixd,pipe,batch",
          "which phases to run (for profiling one side)");

namespace prefixd::bench {
namespace {

struct Trace {
  std::vector<std::vector<uint64_t>> hash_ids;
  std::vector<std::vector<std::string>> keys;  // chained Redis keys
  std::vector<v1::MatchRequest> match;
  std::vector<int> expected;  // blocks cached at the front of each request
  size_t populated = 0;       // requests 0..populated-1 were cached
};

grpc::ByteBuffer Serialize(const google::protobuf::Message& m) {
  const std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// Sends pre-serialized requests (as the Redis side sends pre-formatted
// commands) through a generic stub, and parses and checks every answer.
class PrefixdSlot final : public Slot {
 public:
  PrefixdSlot(const Trace* trace, grpc::GenericStub* stub,
              const std::vector<grpc::ByteBuffer>* requests,
              const std::vector<std::vector<size_t>>* lookups, bool batch,
              int block_size, uint64_t seed)
      : trace_(trace),
        stub_(stub),
        requests_(requests),
        lookups_(lookups),
        batch_(batch),
        block_size_(block_size),
        rng_(seed) {}

  void Issue(grpc::CompletionQueue* cq) override {
    ctx_.emplace();
    ctx_->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    status_ = grpc::Status();
    response_.Clear();
    pick_ = rng_.Below(requests_->size());
    reader_ =
        stub_->PrepareUnaryCall(&*ctx_,
                                batch_ ? "/prefixd.v1.PrefixCache/MatchBatch"
                                       : "/prefixd.v1.PrefixCache/Match",
                                (*requests_)[pick_], cq);
    reader_->StartCall();
    reader_->Finish(&response_, &status_, this);
  }

  int Done(std::string* error) override {
    if (!status_.ok()) {
      *error = absl::StrCat("code ", status_.error_code(), ": ",
                            status_.error_message());
      return -1;
    }
    arena_.Reset();
    const std::vector<size_t>& ls = (*lookups_)[pick_];
    if (!batch_) {
      auto* m =
          google::protobuf::Arena::CreateMessage<v1::MatchResponse>(&arena_);
      if (!Parse(m, error)) return -1;
      return Check(ls[0], *m, error) ? 1 : -1;
    }
    auto* b =
        google::protobuf::Arena::CreateMessage<v1::MatchBatchResponse>(&arena_);
    if (!Parse(b, error)) return -1;
    if (b->results_size() != static_cast<int>(ls.size())) {
      *error = "batch answered the wrong number of items";
      return -1;
    }
    for (size_t i = 0; i < ls.size(); ++i) {
      if (!Check(ls[i], b->results(i).response(), error)) return -1;
    }
    return static_cast<int>(ls.size());
  }

 private:
  template <typename M>
  bool Parse(M* m, std::string* error) {
    grpc::Status s = grpc::SerializationTraits<M>::Deserialize(&response_, m);
    if (!s.ok()) *error = absl::StrCat("bad response: ", s.error_message());
    return s.ok();
  }

  bool Check(size_t l, const v1::MatchResponse& r, std::string* error) const {
    const uint64_t want =
        static_cast<uint64_t>(trace_->expected[l]) * block_size_;
    if (r.matched_tokens() == want) return true;
    *error = absl::StrFormat("lookup %d: %d tokens matched, %d expected", l,
                             r.matched_tokens(), want);
    return false;
  }

  const Trace* trace_;
  grpc::GenericStub* stub_;
  const std::vector<grpc::ByteBuffer>* requests_;
  const std::vector<std::vector<size_t>>* lookups_;  // per request
  const bool batch_;
  const int block_size_;
  Rng rng_;
  size_t pick_ = 0;
  std::optional<grpc::ClientContext> ctx_;
  grpc::Status status_;
  grpc::ByteBuffer response_;
  google::protobuf::Arena arena_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<grpc::ByteBuffer>> reader_;
};

uint64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v(line);
    if (absl::ConsumePrefix(&v, "VmRSS:")) {
      v = absl::StripAsciiWhitespace(v);
      absl::ConsumeSuffix(&v, " kB");
      uint64_t kb = 0;
      if (absl::SimpleAtoi(v, &kb)) return kb * 1024;
    }
  }
  return 0;
}

std::unique_ptr<grpc::ClientContext> SyncContext() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  return ctx;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "redis_peer: %s\n", what.c_str());
  return 1;
}

int Run() {
  if (absl::GetFlag(FLAGS_prefixd).empty()) {
    return Fail("give --prefixd (the daemon binary)");
  }
  const std::string path =
      absl::StrCat(absl::GetFlag(FLAGS_trace_dir), "/",
                   absl::GetFlag(FLAGS_trace), "_trace.jsonl");
  absl::StatusOr<std::vector<std::vector<uint64_t>>> ids = ReadHashIds(path);
  if (!ids.ok()) return Fail(ids.status().ToString());

  // prefixd first: its block size shapes the tokens and Redis's hashes.
  absl::StatusOr<int> port = FreeTcpPort();
  if (!port.ok()) return Fail(port.status().ToString());
  std::vector<std::string> argv = {absl::GetFlag(FLAGS_prefixd),
                                   absl::StrCat("--listen=127.0.0.1:", *port),
                                   "--metrics_listen=127.0.0.1:0"};
  for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_prefixd_args),
                                            ' ', absl::SkipEmpty())) {
    argv.emplace_back(a);
  }
  absl::StatusOr<std::unique_ptr<Subprocess>> prefixd = Subprocess::Start(argv);
  if (!prefixd.ok()) return Fail(prefixd.status().ToString());
  const std::string address = absl::StrCat("127.0.0.1:", *port);
  std::vector<std::unique_ptr<v1::PrefixCache::Stub>> stubs;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_channels)); ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto ch = grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args);
    if (!ch->WaitForConnected(
            absl::ToChronoTime(absl::Now() + absl::Seconds(30)))) {
      return Fail(absl::StrCat("prefixd on ", address, " did not come up"));
    }
    stubs.push_back(v1::PrefixCache::NewStub(ch));
    generic.push_back(std::make_unique<grpc::GenericStub>(ch));
  }
  v1::GetInfoResponse info;
  grpc::Status s =
      stubs[0]->GetInfo(SyncContext().get(), v1::GetInfoRequest(), &info);
  if (!s.ok()) return Fail(s.error_message());
  const int bs = static_cast<int>(info.block_size());

  const std::string token_field = absl::GetFlag(FLAGS_token_field);
  if (token_field != "tokens" && token_field != "tokens_le32") {
    return Fail(absl::StrCat("--token_field is \"", token_field,
                             "\"; use tokens_le32 or tokens"));
  }
  const bool le32 = token_field == "tokens_le32";
  Trace trace;
  trace.hash_ids = *std::move(ids);
  trace.populated = static_cast<size_t>(absl::GetFlag(FLAGS_populate_fraction) *
                                        trace.hash_ids.size());
  std::vector<std::string> key_cache;
  absl::flat_hash_set<uint64_t> cached;
  std::vector<std::string> redis_keys;
  for (size_t r = 0; r < trace.hash_ids.size(); ++r) {
    const std::vector<uint64_t>& h = trace.hash_ids[r];
    trace.keys.push_back(ChainedKeys(h, bs, &key_cache));
    std::vector<uint32_t> tokens;
    for (uint64_t id : h) {
      for (int j = 0; j < bs; ++j) {
        tokens.push_back(static_cast<uint32_t>(id * bs + j));
      }
    }
    v1::MatchRequest m;
    if (le32) {
      m.set_tokens_le32(TokensLe32(tokens));
    } else {
      m.mutable_tokens()->Add(tokens.begin(), tokens.end());
    }
    trace.match.push_back(std::move(m));
    if (r < trace.populated) {
      for (size_t i = 0; i < h.size(); ++i) {
        if (cached.insert(h[i]).second) redis_keys.push_back(trace.keys[r][i]);
      }
    }
  }
  for (const std::vector<uint64_t>& h : trace.hash_ids) {
    int n = 0;
    while (n < static_cast<int>(h.size()) && cached.contains(h[n])) ++n;
    trace.expected.push_back(n);
  }

  // Cache the populated requests in both.
  const uint64_t rss_before = RssBytes((*prefixd)->pid());
  for (size_t r = 0; r < trace.populated; ++r) {
    v1::InsertRequest in;
    *in.mutable_tokens() = trace.match[r].tokens();
    in.set_tokens_le32(trace.match[r].tokens_le32());
    for (uint64_t id : trace.hash_ids[r]) in.add_block_ids(id + 1);
    v1::InsertResponse out;
    s = stubs[0]->Insert(SyncContext().get(), in, &out);
    if (!s.ok()) {
      return Fail(absl::StrCat("prefixd Insert of request ", r, ": ",
                               s.error_message()));
    }
  }
  const uint64_t rss_after = RssBytes((*prefixd)->pid());
  absl::StatusOr<std::unique_ptr<RedisServer>> redis =
      RedisServer::Start(absl::GetFlag(FLAGS_redis_server));
  if (!redis.ok()) return Fail(redis.status().ToString());
  const uint64_t redis_before = (*redis)->UsedMemory().value_or(0);
  if (absl::Status p = (*redis)->Populate(redis_keys); !p.ok()) {
    return Fail(p.ToString());
  }
  const uint64_t redis_after = (*redis)->UsedMemory().value_or(0);
  uint64_t expected_blocks = 0, lookup_blocks = 0;
  for (size_t r = 0; r < trace.expected.size(); ++r) {
    expected_blocks += trace.expected[r];
    lookup_blocks += trace.hash_ids[r].size();
  }
  std::fprintf(stderr,
               "redis_peer: %s: %zu requests, the first %zu cached (%zu "
               "blocks); lookups hit %.1f%% of their blocks\n"
               "redis_peer: memory for them: prefixd RSS +%.1f MiB, Redis "
               "used_memory +%.1f MiB (two keys per block: llm-d's hash and "
               "the MGET string)\n",
               path.c_str(), trace.hash_ids.size(), trace.populated,
               redis_keys.size(), 100.0 * expected_blocks / lookup_blocks,
               (rss_after - rss_before) / 1048576.0,
               (redis_after - redis_before) / 1048576.0);

  const int depth = absl::GetFlag(FLAGS_depth);
  std::vector<grpc::ByteBuffer> unary, batches;
  std::vector<std::vector<size_t>> unary_lookups, batch_lookups;
  for (size_t l = 0; l < trace.match.size(); ++l) {
    unary.push_back(Serialize(trace.match[l]));
    unary_lookups.push_back({l});
  }
  Rng rng(777);
  for (int b = 0; b < 512; ++b) {
    v1::MatchBatchRequest req;
    std::vector<size_t> ls;
    for (int i = 0; i < depth; ++i) {
      ls.push_back(rng.Below(trace.match.size()));
      *req.add_requests() = trace.match[ls.back()];
    }
    batches.push_back(Serialize(req));
    batch_lookups.push_back(std::move(ls));
  }

  DriveOptions o;
  o.concurrency = absl::GetFlag(FLAGS_concurrency);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.duration = absl::GetFlag(FLAGS_duration);
  auto run_prefixd = [&](bool batch, const std::string& name, uint64_t seed) {
    o.seed = seed;
    const double server0 = ProcessCpuSeconds((*prefixd)->pid());
    const double self0 = SelfCpuSeconds();
    DriveResult d = Drive(o, [&](int, int index) {
      return std::make_unique<PrefixdSlot>(
          &trace, generic[index % generic.size()].get(),
          batch ? &batches : &unary, batch ? &batch_lookups : &unary_lookups,
          batch, bs, seed * 1000003 + index);
    });
    PhaseResult r;
    r.target = address;
    r.phase = name;
    r.concurrency = o.concurrency;
    r.seconds = d.seconds;
    r.calls = d.calls;
    r.lookups = d.lookups;
    r.errors = d.errors;
    r.first_error = d.first_error;
    r.latency = Summarize(&d.latency_ns);
    r.all_calls = d.all_calls;
    SetCpuPerCall(server0, ProcessCpuSeconds((*prefixd)->pid()), self0,
                  SelfCpuSeconds(), &r);
    return r;
  };
  auto run_redis = [&](RedisLookup lookup, int d, const std::string& name,
                       uint64_t seed) {
    RedisDriveOptions ro;
    ro.lookup = lookup;
    ro.connections = o.concurrency;
    ro.depth = d;
    ro.threads = o.threads;
    ro.warmup = o.warmup;
    ro.duration = o.duration;
    ro.seed = seed;
    const double server0 = ProcessCpuSeconds((*redis)->pid());
    const double self0 = SelfCpuSeconds();
    PhaseResult r =
        DriveRedis((*redis)->port(), trace.keys, trace.expected, ro);
    SetCpuPerCall(server0, ProcessCpuSeconds((*redis)->pid()), self0,
                  SelfCpuSeconds(), &r);
    r.phase = name;
    return r;
  };

  FILE* json = nullptr;
  if (!absl::GetFlag(FLAGS_json).empty()) {
    json = std::fopen(absl::GetFlag(FLAGS_json).c_str(), "a");
  }
  const int n_rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  std::map<std::string, std::vector<double>> lookups_per_s, ratios, srv, cli;
  std::vector<std::string> order;
  const std::string pipe = absl::StrCat("redis-pipe", depth);
  const std::string batch = absl::StrCat("prefixd-batch", depth);
  int failures = 0;
  const std::vector<std::string> phases =
      absl::StrSplit(absl::GetFlag(FLAGS_phases), ',', absl::SkipEmpty());
  auto run = [&](absl::string_view p) {
    return std::find(phases.begin(), phases.end(), p) != phases.end();
  };
  PrintHeader(stdout);
  for (int round = 0; round < n_rounds; ++round) {
    std::map<std::string, double> got;
    auto record = [&](PhaseResult r) {
      PrintRow(stdout, r);
      if (json != nullptr) std::fprintf(json, "%s\n", ToJson(r).c_str());
      if (r.errors > 0) ++failures;
      if (lookups_per_s[r.phase].empty()) order.push_back(r.phase);
      lookups_per_s[r.phase].push_back(r.lookups_per_s());
      // CPU per lookup: per call over the window's lookups per call.
      const double per_call =
          r.calls > 0 ? static_cast<double>(r.lookups) / r.calls : 1;
      srv[r.phase].push_back(r.server_cpu_us / per_call);
      cli[r.phase].push_back(r.client_cpu_us / per_call);
      got[r.phase] = r.lookups_per_s();
    };
    const uint64_t seed = 100 * round + 1;
    if (run("llmd")) {
      record(run_redis(RedisLookup::kLlmd, 1, "redis-llmd", seed));
    }
    if (run("mget")) {
      record(run_redis(RedisLookup::kMget, 1, "redis-mget", seed + 1));
    }
    if (run("prefixd")) record(run_prefixd(false, "prefixd", seed + 2));
    if (run("pipe")) {
      record(run_redis(RedisLookup::kMget, depth, pipe, seed + 3));
    }
    if (run("batch")) record(run_prefixd(true, batch, seed + 4));
    const double redis_unary = std::max(got["redis-llmd"], got["redis-mget"]);
    const double redis_best = std::max(redis_unary, got[pipe]);
    if (redis_unary > 0) {
      ratios["unary: prefixd / best unary Redis (llm-d or MGET)"].push_back(
          got["prefixd"] / redis_unary);
    }
    if (got["redis-llmd"] > 0) {
      ratios["unary: prefixd / llm-d's pipelined HKEYS"].push_back(
          got["prefixd"] / got["redis-llmd"]);
    }
    if (redis_best > 0) {
      ratios[absl::StrCat("best paths: ", batch, " / best Redis (", pipe, ")")]
          .push_back(got[batch] / redis_best);
    }
  }
  if (json != nullptr) std::fclose(json);
  std::printf(
      "\nmedians over %d round(s): lookups/s, then server and client CPU "
      "microseconds per lookup\n",
      n_rounds);
  for (const std::string& p : order) {
    std::printf("  %-20s %12.0f %8.2f %8.2f\n", p.c_str(),
                Median(lookups_per_s[p]), Median(srv[p]), Median(cli[p]));
  }
  std::printf("ratios (median; each from one round):\n");
  for (auto& [what, v] : ratios) {
    std::string all;
    for (double x : v) absl::StrAppendFormat(&all, " %.3f", x);
    std::printf("  %-55s %.3f  [%s ]\n", what.c_str(), Median(v), all.c_str());
  }
  redis->reset();
  (*prefixd)->Stop();
  return failures > 0 ? 1 : 0;
}

}  // namespace
}  // namespace prefixd::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "prefixd vs llm-d-style Redis prefix lookups (docs/performance.md)");
  absl::ParseCommandLine(argc, argv);
  return prefixd::bench::Run();
}
