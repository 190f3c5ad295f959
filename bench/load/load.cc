// load: the gRPC load generator (docs/performance.md).
//
// Caches --prompts prompts of --prompt_tokens tokens per tenant, then, for
// every target, runs timed phases with --concurrency calls in flight:
//   bare   the baseline: a unary RPC that does nothing, served by the same
//          server (prefixd_bench_server) with the payload of a Match of one
//          of those prompts (same tokens in, response padded to the Match
//          response's size);
//   <mix>  each ';'-separated --mix, e.g. "match" or
//          "match:8,insert:1,batch:1": weights of Match (a cached prompt),
//          Insert (half of a cached prompt confirmed, half new blocks),
//          MatchBatch (--batch_size cached prompts), and the fleet index's
//          Route (one prompt the index holds, in tokens_le32) and
//          RouteBatch (--batch_size of them): mixes "route" and
//          "routebatch" (docs/performance.md, "Fleet index"), and Pick
//          of the same prompts with every worker a candidate ("pick",
//          recorded: each adds predicted blocks and a window pick);
//   <mix>@f an open loop (Poisson arrivals) at f times that mix's measured
//          calls/s, for each f of --rate_fractions: latency at a set load.
// It reports calls/s, lookups/s and latency percentiles per phase, and with
// --rounds > 1 the medians and the ratios (mix / bare, target / first
// target, batch / first mix) per round.
//
// When a mix routes, the prompts are --prompts prompts of --prompt_tokens
// tokens that the server's fleet index holds (bench/load/route_index.h: a
// started --server gets --bench_index_* flags to fill it; a --target must
// have been started with them), and the bare phase mirrors a Route instead
// of a Match: the same tokens_le32 in, a reply padded to the Route
// response's size.
//
//   load --server=build/bench/prefixd_bench_server --prompt_tokens=2048
//   load --target=127.0.0.1:50051,unix:///tmp/prefixd.sock --mix='match;batch'
//   load --server=build/bench/prefixd_bench_server --transports=tcp --mix=route
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/load/bare.grpc.pb.h"
#include "bench/load/common.h"
#include "bench/load/driver.h"
#include "prefixd/v1/prefix_cache.grpc.pb.h"
#include "prefixd/v1/prefix_index.grpc.pb.h"

ABSL_FLAG(std::string, target, "",
          "comma-separated gRPC targets (host:port, unix:///path), each "
          "serving PrefixCache and the bare service; empty: start --server");
ABSL_FLAG(std::string, server, "",
          "prefixd_bench_server to start on a free TCP port and a Unix "
          "socket when --target is empty");
ABSL_FLAG(std::string, server_args, "--kv_budget=1TiB",
          "space-separated extra flags for --server");
ABSL_FLAG(int, concurrency, 16, "calls in flight (closed loop)");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(5), "measured window");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1), "warm-up before it");
ABSL_FLAG(std::string, mix, "match",
          "';'-separated mixes, one phase each: weights of match, insert, "
          "batch (MatchBatch) and bare, e.g. 'match;match:8,insert:1,batch:1'");
ABSL_FLAG(int, prompt_tokens, 2048, "tokens per prompt");
ABSL_FLAG(int, batch_size, 32, "Matches per MatchBatch");
ABSL_FLAG(int, tenants, 1, "tenants (x-prefixd-tenant bench-N), calls spread");
ABSL_FLAG(int, prompts, 64, "distinct cached prompts per tenant");
ABSL_FLAG(int, threads, 1, "client threads (one CompletionQueue each)");
ABSL_FLAG(int, channels, 1, "gRPC channels (connections) per target");
ABSL_FLAG(bool, baseline, true, "run the bare phase before the mixes");
ABSL_FLAG(std::string, rate_fractions, "",
          "comma-separated fractions of each mix's closed-loop calls/s to "
          "run open-loop phases at, e.g. 0.5");
ABSL_FLAG(int, rounds, 1, "repeat all phases; the summary takes medians");
ABSL_FLAG(std::string, json, "", "append every phase as a JSON line here");
ABSL_FLAG(absl::Duration, deadline, absl::Seconds(10), "per-call deadline");
ABSL_FLAG(int, index_workers, 16,
          "route mixes: workers of the server's fleet index (--server is "
          "started with --bench_index_workers=this)");
ABSL_FLAG(std::string, transports, "tcp,unix",
          "which listeners of the started --server to drive: tcp, unix or "
          "both, in this order");
ABSL_FLAG(int, server_pid, 0,
          "pid of the --target server, to report its CPU per call (set "
          "when load starts --server)");

namespace prefixd::bench {
namespace {

enum Kind {
  kBare,
  kMatch,
  kInsert,
  kBatch,
  kRoute,
  kRouteBatch,
  kPick,
  kNumKinds
};
constexpr const char* kKindNames[kNumKinds] = {
    "bare", "match", "insert", "batch", "route", "routebatch", "pick"};

struct Mix {
  std::string name;
  double cumulative[kNumKinds] = {};  // cumulative weights, last = total
  bool routes = false;                // has route or routebatch
};

absl::StatusOr<Mix> ParseMix(absl::string_view spec) {
  absl::StatusOr<std::vector<std::pair<std::string, double>>> weights =
      ParseWeights(spec);
  if (!weights.ok()) return weights.status();
  Mix mix;
  mix.name = std::string(spec);
  double w[kNumKinds] = {};
  for (const auto& [name, weight] : *weights) {
    int k = 0;
    while (k < kNumKinds && name != kKindNames[k]) ++k;
    if (k == kNumKinds) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown operation \"", name, "\" in mix \"", spec,
                       "\"; use match, insert, batch, route, routebatch, "
                       "pick or bare"));
    }
    w[k] += weight;
  }
  double sum = 0;
  for (int k = 0; k < kNumKinds; ++k) mix.cumulative[k] = sum += w[k];
  if (sum <= 0) return absl::InvalidArgumentError("mix weighs nothing");
  mix.routes = w[kRoute] > 0 || w[kRouteBatch] > 0 || w[kPick] > 0;
  return mix;
}

// The prompts of one tenant and the requests built from them up front.
struct TenantData {
  std::string name;
  std::vector<std::vector<uint32_t>> tokens;
  std::vector<std::vector<uint64_t>> ids;
  std::vector<v1::MatchRequest> match;
  std::vector<v1::MatchBatchRequest> batches;
  std::vector<bench::BareRequest> bare;
};

// One target: its channels and stubs.
struct Target {
  std::string address;
  std::vector<std::unique_ptr<v1::PrefixCache::Stub>> stubs;
  std::vector<std::unique_ptr<bench::Bare::Stub>> bare_stubs;
  std::vector<std::unique_ptr<v1::PrefixIndex::Stub>> index_stubs;
};

// The fleet index's prompts (IndexPrompt) and the requests built from them.
struct RouteData {
  std::vector<v1::RouteRequest> route;
  std::vector<v1::RouteBatchRequest> batches;
  std::vector<v1::PickRequest>
      pick;  // the same prompts, every worker a candidate
  std::vector<bench::BareRequest> bare;  // the bare phase's, beside Route
  uint64_t prompt_blocks = 0;            // each Route must report these
};

struct Workload {
  std::vector<TenantData> tenants;
  bool routes = false;  // a mix routes: bare mirrors Route, not Match
  RouteData index;
  int index_workers = 16;  // each Route must report these
  int block_size = 16;
  int batch_size = 32;
  absl::Duration deadline;
  std::atomic<uint64_t> next_id{uint64_t{1} << 40};
};

class LoadSlot final : public Slot {
 public:
  LoadSlot(Workload* w, Target* target, const Mix* mix, int index,
           uint64_t seed)
      : w_(w),
        stub_(target->stubs[index % target->stubs.size()].get()),
        bare_stub_(target->bare_stubs[index % target->bare_stubs.size()].get()),
        index_stub_(
            target->index_stubs[index % target->index_stubs.size()].get()),
        mix_(mix),
        rng_(seed),
        arena_block_(std::make_unique<char[]>(kArenaBlock)),
        arena_(ArenaOn(arena_block_.get())) {}

  void Issue(grpc::CompletionQueue* cq) override {
    const double x = rng_.Uniform() * mix_->cumulative[kNumKinds - 1];
    kind_ = kBare;
    while (kind_ < kNumKinds - 1 && x >= mix_->cumulative[kind_]) {
      kind_ = static_cast<Kind>(kind_ + 1);
    }
    const TenantData& t = w_->tenants[rng_.Below(w_->tenants.size())];
    const size_t p = rng_.Below(t.tokens.size());
    ctx_.emplace();
    ctx_->set_deadline(absl::ToChronoTime(absl::Now() + w_->deadline));
    if (t.name != "default") ctx_->AddMetadata("x-prefixd-tenant", t.name);
    status_ = grpc::Status();
    switch (kind_) {
      case kBare:
        bare_resp_.Clear();
        bare_reader_ = bare_stub_->PrepareAsyncCall(
            &*ctx_,
            w_->routes ? w_->index.bare[rng_.Below(w_->index.bare.size())]
                       : t.bare[p],
            cq);
        bare_reader_->StartCall();
        bare_reader_->Finish(&bare_resp_, &status_, this);
        break;
      case kMatch:
        match_resp_.Clear();
        match_reader_ = stub_->PrepareAsyncMatch(&*ctx_, t.match[p], cq);
        match_reader_->StartCall();
        match_reader_->Finish(&match_resp_, &status_, this);
        break;
      case kInsert:
        BuildInsert(t, p);
        insert_resp_.Clear();
        insert_reader_ = stub_->PrepareAsyncInsert(&*ctx_, insert_req_, cq);
        insert_reader_->StartCall();
        insert_reader_->Finish(&insert_resp_, &status_, this);
        break;
      case kBatch:
        batch_resp_.Clear();
        batch_reader_ = stub_->PrepareAsyncMatchBatch(
            &*ctx_, t.batches[rng_.Below(t.batches.size())], cq);
        batch_reader_->StartCall();
        batch_reader_->Finish(&batch_resp_, &status_, this);
        break;
      case kRoute:
        arena_.Reset();
        route_resp_ =
            google::protobuf::Arena::CreateMessage<v1::RouteResponse>(&arena_);
        route_reader_ = index_stub_->PrepareAsyncRoute(
            &*ctx_, w_->index.route[rng_.Below(w_->index.route.size())], cq);
        route_reader_->StartCall();
        route_reader_->Finish(route_resp_, &status_, this);
        break;
      case kRouteBatch:
        arena_.Reset();
        route_batch_resp_ =
            google::protobuf::Arena::CreateMessage<v1::RouteBatchResponse>(
                &arena_);
        route_batch_reader_ = index_stub_->PrepareAsyncRouteBatch(
            &*ctx_, w_->index.batches[rng_.Below(w_->index.batches.size())],
            cq);
        route_batch_reader_->StartCall();
        route_batch_reader_->Finish(route_batch_resp_, &status_, this);
        break;
      case kPick:
        arena_.Reset();
        pick_resp_ =
            google::protobuf::Arena::CreateMessage<v1::PickResponse>(&arena_);
        pick_reader_ = index_stub_->PrepareAsyncPick(
            &*ctx_, w_->index.pick[rng_.Below(w_->index.pick.size())], cq);
        pick_reader_->StartCall();
        pick_reader_->Finish(pick_resp_, &status_, this);
        break;
      case kNumKinds:
        break;
    }
  }

  bool HandlerTimes(int64_t* start_ns, int64_t* end_ns) const override {
    if (kind_ != kBare || !status_.ok()) return false;
    *start_ns = bare_resp_.handler_start_ns();
    *end_ns = bare_resp_.handler_end_ns();
    return true;
  }

  int Done(std::string* error) override {
    if (!status_.ok()) {
      *error = absl::StrCat(kKindNames[kind_], ": code ", status_.error_code(),
                            ": ", status_.error_message());
      return -1;
    }
    switch (kind_) {
      case kBatch:
        for (const v1::MatchBatchItem& item : batch_resp_.results()) {
          if (item.code() != 0) {
            *error = absl::StrCat("batch item: code ", item.code(), ": ",
                                  item.message());
            return -1;
          }
        }
        return batch_resp_.results_size();
      case kRoute:
        return CheckRoute(*route_resp_, error) ? 1 : -1;
      case kRouteBatch:
        for (const v1::RouteBatchItem& item : route_batch_resp_->responses()) {
          if (item.code() != 0) {
            *error = absl::StrCat("routebatch item: code ", item.code(), ": ",
                                  item.message());
            return -1;
          }
          if (!CheckRoute(item.response(), error)) return -1;
        }
        return route_batch_resp_->responses_size();
      case kPick:
        if (pick_resp_->ranked_size() == w_->index_workers &&
            pick_resp_->prompt_blocks() == w_->index.prompt_blocks &&
            !pick_resp_->worker().empty()) {
          return 1;
        }
        *error = absl::StrCat(
            "pick: ", pick_resp_->ranked_size(), " candidates ranked and ",
            pick_resp_->prompt_blocks(), " prompt blocks, want ",
            w_->index_workers, " and ", w_->index.prompt_blocks);
        return -1;
      case kInsert:
        return 0;  // not a lookup
      default:
        return 1;
    }
  }

 private:
  // Half of cached prompt p (its own IDs: confirmed), then new blocks.
  void BuildInsert(const TenantData& t, size_t p) {
    const size_t bs = static_cast<size_t>(w_->block_size);
    const size_t blocks = t.ids[p].size();
    const size_t keep = blocks / 2;
    insert_req_.Clear();
    auto* tokens = insert_req_.mutable_tokens();
    tokens->Reserve(static_cast<int>(blocks * bs));
    tokens->Add(t.tokens[p].begin(), t.tokens[p].begin() + keep * bs);
    for (size_t i = keep * bs; i < blocks * bs; ++i) {
      tokens->Add(static_cast<uint32_t>(rng_.Below(128256)));
    }
    auto* ids = insert_req_.mutable_block_ids();
    ids->Add(t.ids[p].begin(), t.ids[p].begin() + keep);
    const uint64_t first = w_->next_id.fetch_add(blocks - keep);
    for (size_t i = 0; i < blocks - keep; ++i) ids->Add(first + i);
  }

  // Every worker is scored and the whole prompt was walked.
  bool CheckRoute(const v1::RouteResponse& r, std::string* error) const {
    if (r.workers_size() == w_->index_workers &&
        r.prompt_blocks() == w_->index.prompt_blocks) {
      return true;
    }
    *error = absl::StrCat("route: ", r.workers_size(), " workers and ",
                          r.prompt_blocks(), " prompt blocks, want ",
                          w_->index_workers, " and ", w_->index.prompt_blocks);
    return false;
  }

  Workload* const w_;
  v1::PrefixCache::Stub* const stub_;
  bench::Bare::Stub* const bare_stub_;
  v1::PrefixIndex::Stub* const index_stub_;
  const Mix* const mix_;
  Rng rng_;
  Kind kind_ = kMatch;
  std::optional<grpc::ClientContext> ctx_;
  grpc::Status status_;
  v1::MatchResponse match_resp_;
  v1::InsertRequest insert_req_;
  v1::InsertResponse insert_resp_;
  v1::MatchBatchResponse batch_resp_;
  bench::BareResponse bare_resp_;
  // Route replies list every worker per prompt (16 x 32 messages in a
  // RouteBatch of T10b): they are parsed on an arena that each call resets,
  // as a router would, rather than one malloc per message. Its first block
  // holds a whole RouteBatch reply, so the arena mallocs nothing per call.
  static constexpr size_t kArenaBlock = 512 << 10;
  static google::protobuf::ArenaOptions ArenaOn(char* block) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = kArenaBlock;
    return options;
  }
  std::unique_ptr<char[]> arena_block_;
  google::protobuf::Arena arena_;
  v1::RouteResponse* route_resp_ = nullptr;
  v1::RouteBatchResponse* route_batch_resp_ = nullptr;
  v1::PickResponse* pick_resp_ = nullptr;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::PickResponse>>
      pick_reader_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::MatchResponse>>
      match_reader_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::InsertResponse>>
      insert_reader_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::MatchBatchResponse>>
      batch_reader_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<bench::BareResponse>>
      bare_reader_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::RouteResponse>>
      route_reader_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::RouteBatchResponse>>
      route_batch_reader_;
};

absl::StatusOr<Target> Connect(const std::string& address, int channels) {
  Target t;
  t.address = address;
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    // A connection of its own rather than one shared from gRPC's pool.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::Channel> ch = grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args);
    if (!ch->WaitForConnected(
            absl::ToChronoTime(absl::Now() + absl::Seconds(10)))) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", address));
    }
    t.stubs.push_back(v1::PrefixCache::NewStub(ch));
    t.bare_stubs.push_back(bench::Bare::NewStub(ch));
    t.index_stubs.push_back(v1::PrefixIndex::NewStub(ch));
  }
  return t;
}

std::unique_ptr<grpc::ClientContext> SyncContext(const std::string& tenant) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (tenant != "default") ctx->AddMetadata("x-prefixd-tenant", tenant);
  return ctx;
}

// Builds the prompts and requests, caches the prompts through `target`,
// and sizes the bare reply to a Match response. Returns its byte size.
absl::StatusOr<size_t> Prepare(Target& target, Workload* w, bool build) {
  v1::GetInfoResponse info;
  grpc::Status s = target.stubs[0]->GetInfo(SyncContext("default").get(),
                                            v1::GetInfoRequest(), &info);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("GetInfo on ", target.address, ": ", s.error_message()));
  }
  w->block_size = static_cast<int>(info.block_size());
  const int bs = w->block_size;
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int blocks = std::max(1, prompt_tokens / bs);
  const int n_tenants = absl::GetFlag(FLAGS_tenants);
  const int n_prompts = absl::GetFlag(FLAGS_prompts);
  const uint64_t need = uint64_t(n_tenants) * n_prompts * blocks;
  if (info.budget_blocks() < need * 2) {
    std::fprintf(stderr,
                 "load: warning: budget of %llu blocks is under twice the %llu "
                 "cached ones; inserts will evict prompts and Matches miss\n",
                 static_cast<unsigned long long>(info.budget_blocks()),
                 static_cast<unsigned long long>(need));
  }
  if (build) {
    Rng rng(12345);
    uint64_t id = 1;
    w->tenants.resize(n_tenants);
    for (int ti = 0; ti < n_tenants; ++ti) {
      TenantData& t = w->tenants[ti];
      t.name = n_tenants == 1 ? "default" : absl::StrCat("bench-", ti);
      for (int p = 0; p < n_prompts; ++p) {
        std::vector<uint32_t> tokens(blocks * bs);
        for (uint32_t& tok : tokens)
          tok = static_cast<uint32_t>(rng.Below(128256));
        std::vector<uint64_t> ids(blocks);
        for (uint64_t& i : ids) i = id++;
        v1::MatchRequest m;
        m.mutable_tokens()->Add(tokens.begin(), tokens.end());
        t.match.push_back(m);
        bench::BareRequest b;
        b.mutable_tokens()->Add(tokens.begin(), tokens.end());
        t.bare.push_back(b);
        t.tokens.push_back(std::move(tokens));
        t.ids.push_back(std::move(ids));
      }
      for (int b = 0; b < 64; ++b) {
        v1::MatchBatchRequest batch;
        for (int i = 0; i < w->batch_size; ++i) {
          *batch.add_requests() = t.match[rng.Below(t.match.size())];
        }
        t.batches.push_back(std::move(batch));
      }
    }
  }
  for (const TenantData& t : w->tenants) {
    for (size_t p = 0; p < t.tokens.size(); ++p) {
      v1::InsertRequest in;
      in.mutable_tokens()->Add(t.tokens[p].begin(), t.tokens[p].end());
      in.mutable_block_ids()->Add(t.ids[p].begin(), t.ids[p].end());
      v1::InsertResponse out;
      s = target.stubs[0]->Insert(SyncContext(t.name).get(), in, &out);
      if (!s.ok()) {
        return absl::InternalError(absl::StrCat(
            "caching prompt ", p, " of ", t.name, ": ", s.error_message()));
      }
    }
  }
  v1::MatchResponse probe;
  s = target.stubs[0]->Match(SyncContext(w->tenants[0].name).get(),
                             w->tenants[0].match[0], &probe);
  if (!s.ok()) return absl::InternalError(s.error_message());
  if (probe.matched_tokens() != static_cast<uint64_t>(blocks * bs)) {
    return absl::InternalError(absl::StrCat("a cached prompt matched ",
                                            probe.matched_tokens(), " of ",
                                            blocks * bs, " tokens"));
  }
  const size_t reply = probe.ByteSizeLong();
  for (TenantData& t : w->tenants) {
    for (bench::BareRequest& b : t.bare) {
      b.set_reply_bytes(static_cast<uint32_t>(reply));
    }
  }
  return reply;
}

// Builds the Route requests (route mixes) and checks through `target` that
// the server's fleet index holds their prompts; sizes the bare phase to
// mirror a Route. Returns the Route response's byte size.
absl::StatusOr<size_t> PrepareRoute(Target& target, Workload* w, bool build) {
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int n_prompts = absl::GetFlag(FLAGS_prompts);
  RouteData& d = w->index;
  if (build) {
    for (int p = 0; p < n_prompts; ++p) {
      const std::vector<uint32_t> tokens = IndexPrompt(p, prompt_tokens);
      std::string le32(tokens.size() * 4, '\0');
      for (size_t i = 0; i < tokens.size(); ++i) {
        for (int b = 0; b < 4; ++b) {
          le32[i * 4 + b] = static_cast<char>((tokens[i] >> (8 * b)) & 0xff);
        }
      }
      v1::RouteRequest r;
      r.set_tokens_le32(le32);
      v1::PickRequest pick;
      *pick.mutable_prompt() = r;
      d.pick.push_back(std::move(pick));
      d.route.push_back(std::move(r));
      bench::BareRequest b;
      b.set_tokens_le32(le32);
      d.bare.push_back(std::move(b));
    }
    Rng rng(54321);
    for (int b = 0; b < 64; ++b) {
      v1::RouteBatchRequest batch;
      for (int i = 0; i < w->batch_size; ++i) {
        *batch.add_requests() = d.route[rng.Below(d.route.size())];
      }
      d.batches.push_back(std::move(batch));
    }
  }
  const std::string fix = absl::StrFormat(
      "; start prefixd_bench_server with --bench_index_workers=%d "
      "--bench_index_prompts=%d --bench_index_prompt_tokens=%d",
      w->index_workers, n_prompts, prompt_tokens);
  v1::RouteResponse probe;
  const grpc::Status s = target.index_stubs[0]->Route(
      SyncContext("default").get(), d.route[0], &probe);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("Route on ", target.address,
                                               ": ", s.error_message(), fix));
  }
  const uint64_t blocks =
      probe.block_size() > 0 ? prompt_tokens / probe.block_size() : 0;
  // The last worker holds every block (route_index.h).
  const std::string last = absl::StrCat("w", w->index_workers - 1);
  uint64_t last_holds = 0;
  for (const v1::WorkerMatch& m : probe.workers()) {
    if (m.worker() == last) last_holds = m.matched_blocks();
  }
  if (probe.workers_size() != w->index_workers || blocks == 0 ||
      probe.prompt_blocks() != blocks || last_holds != blocks) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the fleet index of ", target.address, " answered ",
        probe.workers_size(), " workers, ", last, " holding ", last_holds,
        " of ", probe.prompt_blocks(), " blocks; want ", w->index_workers,
        " workers, ", last, " holding all ", blocks, fix));
  }
  d.prompt_blocks = blocks;
  const size_t reply = probe.ByteSizeLong();
  for (bench::BareRequest& b : d.bare) {
    b.set_reply_bytes(static_cast<uint32_t>(reply));
  }
  return reply;
}

// Where the slow calls' time went, for PrintRow: the median and maximum of
// each part, and how often each part was the largest.
std::string DescribeSlowCalls(const std::vector<SlowCall>& slow) {
  if (slow.empty()) return "";
  constexpr int kParts = SlowCall::kParts;
  const char* const names[kParts] = {"driver late", "to the handler",
                                     "in the handler", "back to the driver"};
  std::vector<int64_t> parts[kParts];
  size_t largest[kParts] = {};
  for (const SlowCall& c : slow) {
    const int64_t* p = c.part_ns;
    ++largest[std::max_element(p, p + kParts) - p];
    for (int i = 0; i < kParts; ++i) parts[i].push_back(p[i]);
  }
  std::string out = absl::StrFormat(
      "  %zu calls over 1 ms reported their handler's times; ms, median / "
      "max / largest part in how many:",
      slow.size());
  for (int i = 0; i < kParts; ++i) {
    std::vector<int64_t>& v = parts[i];
    std::sort(v.begin(), v.end());
    absl::StrAppendFormat(&out, "%s %s %.2f / %.2f / %zu", i == 0 ? "" : ";",
                          names[i], v[v.size() / 2] / 1e6, v.back() / 1e6,
                          largest[i]);
  }
  return out;
}

PhaseResult RunPhase(Workload* w, Target* target, const Mix& mix,
                     const std::string& name, double rate, uint64_t seed,
                     pid_t server_pid) {
  DriveOptions o;
  o.concurrency = absl::GetFlag(FLAGS_concurrency);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.duration = absl::GetFlag(FLAGS_duration);
  o.rate = rate;
  o.seed = seed;
  if (rate > 0) o.concurrency = std::max(o.concurrency, 256);
  const double server0 = ProcessCpuSeconds(server_pid);
  const double self0 = SelfCpuSeconds();
  DriveResult d = Drive(o, [&](int, int index) {
    return std::make_unique<LoadSlot>(w, target, &mix, index,
                                      seed * 1000003 + index);
  });
  PhaseResult r;
  r.target = target->address;
  r.phase = name;
  r.concurrency = absl::GetFlag(FLAGS_concurrency);
  r.offered_rate = rate;
  r.seconds = d.seconds;
  r.calls = d.calls;
  r.lookups = d.lookups;
  r.errors = d.errors;
  r.late = d.late;
  r.first_error = d.first_error;
  r.latency = Summarize(&d.latency_ns);
  r.slow_calls = DescribeSlowCalls(d.slow);
  r.all_calls = d.all_calls;
  SetCpuPerCall(server0, ProcessCpuSeconds(server_pid), self0, SelfCpuSeconds(),
                &r);
  return r;
}

// Server + client CPU per call (or per lookup) of a phase, in µs; 0 when
// not measured.
double CpuPerLookup(const PhaseResult& r, bool per_lookup) {
  if (r.server_cpu_us <= 0 || r.client_cpu_us <= 0 || r.lookups == 0) return 0;
  const double per_call = r.server_cpu_us + r.client_cpu_us;
  if (!per_lookup) return per_call;
  return per_call * static_cast<double>(r.calls) /
         static_cast<double>(r.lookups);
}

// Medians over rounds, and ratios taken within each round.
void PrintSummary(const std::vector<std::vector<PhaseResult>>& rounds) {
  std::map<std::pair<std::string, std::string>, std::vector<PhaseResult>> by;
  std::vector<std::pair<std::string, std::string>> order;
  for (const auto& round : rounds) {
    for (const PhaseResult& r : round) {
      auto key = std::make_pair(r.target, r.phase);
      if (by[key].empty()) order.push_back(key);
      by[key].push_back(r);
    }
  }
  std::printf("\nmedians over %zu round(s):\n", rounds.size());
  PrintHeader(stdout);
  for (const auto& key : order) {
    std::vector<double> calls, lookups, p50, p90, p99, p999, srv, cli;
    PhaseResult m = by[key].front();
    for (const PhaseResult& r : by[key]) {
      calls.push_back(r.calls_per_s());
      lookups.push_back(r.lookups_per_s());
      p50.push_back(r.latency.p50_us);
      p90.push_back(r.latency.p90_us);
      p99.push_back(r.latency.p99_us);
      p999.push_back(r.latency.p999_us);
      srv.push_back(r.server_cpu_us);
      cli.push_back(r.client_cpu_us);
    }
    m.seconds = 1;
    m.calls = static_cast<uint64_t>(Median(calls));
    m.lookups = static_cast<uint64_t>(Median(lookups));
    m.latency.p50_us = Median(p50);
    m.latency.p90_us = Median(p90);
    m.latency.p99_us = Median(p99);
    m.latency.p999_us = Median(p999);
    m.server_cpu_us = Median(srv);
    m.client_cpu_us = Median(cli);
    m.first_error.clear();
    m.late = 0;
    m.slow_calls.clear();
    PrintRow(stdout, m);
  }
  // Ratios within a round: phase vs bare and vs the first mix (same
  // target), and each target vs the first target (same phase).
  std::map<std::string, std::vector<double>> ratios;
  std::vector<std::string> ratio_order;
  auto add = [&](const std::string& what, double v) {
    if (ratios[what].empty()) ratio_order.push_back(what);
    ratios[what].push_back(v);
  };
  for (const auto& round : rounds) {
    std::map<std::pair<std::string, std::string>, const PhaseResult*> in;
    std::string first_target, first_mix;
    for (const PhaseResult& r : round) {
      in[{r.target, r.phase}] = &r;
      if (first_target.empty()) first_target = r.target;
      if (first_mix.empty() && r.phase != "bare" && r.offered_rate == 0) {
        first_mix = r.phase;
      }
    }
    for (const PhaseResult& r : round) {
      if (r.offered_rate > 0 || r.phase == "bare") continue;
      auto bare = in.find({r.target, "bare"});
      if (bare != in.end() && bare->second->calls_per_s() > 0) {
        add(absl::StrFormat("%s: %s calls/s / bare calls/s", r.target, r.phase),
            r.calls_per_s() / bare->second->calls_per_s());
      }
      auto unary = in.find({r.target, first_mix});
      if (r.phase != first_mix && unary != in.end() &&
          unary->second->lookups_per_s() > 0) {
        add(absl::StrFormat("%s: %s lookups/s / %s lookups/s", r.target,
                            r.phase, first_mix),
            r.lookups_per_s() / unary->second->lookups_per_s());
      }
      // The same ratios per CPU second of both processes (server + client
      // CPU per call or lookup): what the rates come to when the two share
      // the machine's cores and nothing else runs, steadier than the rates
      // on a busy machine.
      if (bare != in.end() && CpuPerLookup(*bare->second, false) > 0 &&
          CpuPerLookup(r, false) > 0) {
        add(absl::StrFormat("%s: %s calls / bare calls, per CPU second",
                            r.target, r.phase),
            CpuPerLookup(*bare->second, false) / CpuPerLookup(r, false));
      }
      if (r.phase != first_mix && unary != in.end() &&
          CpuPerLookup(*unary->second, true) > 0 && CpuPerLookup(r, true) > 0) {
        add(absl::StrFormat("%s: %s lookups / %s lookups, per CPU second",
                            r.target, r.phase, first_mix),
            CpuPerLookup(*unary->second, true) / CpuPerLookup(r, true));
      }
    }
    for (const PhaseResult& r : round) {
      if (r.target == first_target || r.offered_rate > 0) continue;
      auto base = in.find({first_target, r.phase});
      if (base != in.end() && base->second->calls_per_s() > 0) {
        add(absl::StrFormat("%s: %s calls/s / %s's", r.phase, r.target,
                            first_target),
            r.calls_per_s() / base->second->calls_per_s());
      }
    }
  }
  std::printf("\nratios (median over rounds; each from one round):\n");
  for (const std::string& what : ratio_order) {
    std::string all;
    for (double v : ratios[what]) absl::StrAppendFormat(&all, " %.3f", v);
    std::printf("  %-70s %.3f  [%s ]\n", what.c_str(), Median(ratios[what]),
                all.c_str());
  }
}

int Run() {
  std::vector<Mix> mixes;
  bool routes = false;
  for (absl::string_view spec :
       absl::StrSplit(absl::GetFlag(FLAGS_mix), ';', absl::SkipWhitespace())) {
    absl::StatusOr<Mix> mix = ParseMix(spec);
    if (!mix.ok()) {
      std::fprintf(stderr, "load: %s\n", mix.status().ToString().c_str());
      return 2;
    }
    routes = routes || mix->routes;
    mixes.push_back(*mix);
  }
  std::vector<std::string> transports =
      absl::StrSplit(absl::GetFlag(FLAGS_transports), ',', absl::SkipEmpty());
  for (const std::string& t : transports) {
    if (t != "tcp" && t != "unix") {
      std::fprintf(stderr, "load: bad --transports (tcp, unix)\n");
      return 2;
    }
  }
  std::unique_ptr<Subprocess> server;
  pid_t server_pid = absl::GetFlag(FLAGS_server_pid);
  std::string target_list = absl::GetFlag(FLAGS_target);
  std::string socket_path;
  if (target_list.empty()) {
    if (absl::GetFlag(FLAGS_server).empty()) {
      std::fprintf(stderr, "load: give --target or --server\n");
      return 2;
    }
    absl::StatusOr<int> port = FreeTcpPort();
    if (!port.ok()) return 1;
    socket_path = absl::StrCat("/tmp/pfx-load-", getpid(), ".sock");
    std::vector<std::string> argv = {
        absl::GetFlag(FLAGS_server), absl::StrCat("--listen=127.0.0.1:", *port),
        absl::StrCat("--listen=unix://", socket_path),
        "--metrics_listen=127.0.0.1:0"};
    for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_server_args),
                                              ' ', absl::SkipEmpty())) {
      argv.emplace_back(a);
    }
    if (routes) {
      argv.push_back(absl::StrCat("--bench_index_workers=",
                                  absl::GetFlag(FLAGS_index_workers)));
      argv.push_back(
          absl::StrCat("--bench_index_prompts=", absl::GetFlag(FLAGS_prompts)));
      argv.push_back(absl::StrCat("--bench_index_prompt_tokens=",
                                  absl::GetFlag(FLAGS_prompt_tokens)));
    }
    absl::StatusOr<std::unique_ptr<Subprocess>> started =
        Subprocess::Start(argv);
    if (!started.ok()) {
      std::fprintf(stderr, "load: %s\n", started.status().ToString().c_str());
      return 1;
    }
    server = *std::move(started);
    absl::StatusOr<std::string> line =
        server->WaitForLine("listening ", absl::Seconds(30));
    if (!line.ok()) {
      std::fprintf(stderr, "load: server: %s\n",
                   line.status().ToString().c_str());
      return 1;
    }
    std::vector<std::string> addresses;
    for (const std::string& t : transports) {
      addresses.push_back(t == "tcp" ? absl::StrCat("127.0.0.1:", *port)
                                     : absl::StrCat("unix://", socket_path));
    }
    target_list = absl::StrJoin(addresses, ",");
    std::fprintf(stderr, "load: started %s (pid %d)\n", line->c_str(),
                 server->pid());
    server_pid = server->pid();
  }

  std::vector<double> fractions;
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_rate_fractions),
                                            ',', absl::SkipWhitespace())) {
    double v;
    if (!absl::SimpleAtod(f, &v) || v <= 0) {
      std::fprintf(stderr, "load: bad --rate_fractions\n");
      return 2;
    }
    fractions.push_back(v);
  }
  const Mix bare = *ParseMix("bare");

  Workload w;
  w.batch_size = absl::GetFlag(FLAGS_batch_size);
  w.deadline = absl::GetFlag(FLAGS_deadline);
  w.routes = routes;
  w.index_workers = absl::GetFlag(FLAGS_index_workers);
  std::vector<std::unique_ptr<Target>> targets;
  for (absl::string_view a :
       absl::StrSplit(target_list, ',', absl::SkipWhitespace())) {
    absl::StatusOr<Target> t =
        Connect(std::string(a), absl::GetFlag(FLAGS_channels));
    if (!t.ok()) {
      std::fprintf(stderr, "load: %s\n", t.status().ToString().c_str());
      return 1;
    }
    targets.push_back(std::make_unique<Target>(*std::move(t)));
    absl::StatusOr<size_t> reply =
        Prepare(*targets.back(), &w, targets.size() == 1);
    if (!reply.ok()) {
      std::fprintf(stderr, "load: %s\n", reply.status().ToString().c_str());
      return 1;
    }
    std::fprintf(stderr,
                 "load: %s: %d tenant(s) x %d prompts of %d tokens cached; a "
                 "Match request is %zu bytes, its response %zu\n",
                 std::string(a).c_str(), absl::GetFlag(FLAGS_tenants),
                 absl::GetFlag(FLAGS_prompts),
                 static_cast<int>(w.tenants[0].tokens[0].size()),
                 w.tenants[0].match[0].ByteSizeLong(), *reply);
    if (routes) {
      absl::StatusOr<size_t> route =
          PrepareRoute(*targets.back(), &w, targets.size() == 1);
      if (!route.ok()) {
        std::fprintf(stderr, "load: %s\n", route.status().ToString().c_str());
        return 1;
      }
      std::fprintf(stderr,
                   "load: %s: the fleet index holds %d prompts of %d tokens "
                   "for %d workers; a Route request is %zu bytes, its "
                   "response %zu (the bare phase mirrors Route)\n",
                   std::string(a).c_str(), absl::GetFlag(FLAGS_prompts),
                   absl::GetFlag(FLAGS_prompt_tokens), w.index_workers,
                   w.index.route[0].ByteSizeLong(), *route);
    }
  }

  FILE* json = nullptr;
  if (!absl::GetFlag(FLAGS_json).empty()) {
    json = std::fopen(absl::GetFlag(FLAGS_json).c_str(), "a");
  }
  const int n_rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  std::vector<std::vector<PhaseResult>> rounds(n_rounds);
  uint64_t seed = 1;
  int failures = 0;
  PrintHeader(stdout);
  auto record = [&](std::vector<PhaseResult>* round, PhaseResult r) {
    PrintRow(stdout, r);
    if (json != nullptr) std::fprintf(json, "%s\n", ToJson(r).c_str());
    if (r.errors > 0) ++failures;
    round->push_back(std::move(r));
  };
  for (int round = 0; round < n_rounds; ++round) {
    for (auto& target : targets) {
      if (absl::GetFlag(FLAGS_baseline)) {
        record(&rounds[round],
               RunPhase(&w, target.get(), bare, "bare", 0, seed++, server_pid));
      }
      for (const Mix& mix : mixes) {
        PhaseResult closed =
            RunPhase(&w, target.get(), mix, mix.name, 0, seed++, server_pid);
        const double peak = closed.calls_per_s();
        record(&rounds[round], std::move(closed));
        for (double f : fractions) {
          record(&rounds[round], RunPhase(&w, target.get(), mix,
                                          absl::StrFormat("%s@%g", mix.name, f),
                                          f * peak, seed++, server_pid));
        }
      }
    }
  }
  if (json != nullptr) std::fclose(json);
  PrintSummary(rounds);
  if (server != nullptr) server->Stop();
  if (!socket_path.empty()) unlink(socket_path.c_str());
  return failures > 0 ? 1 : 0;
}

}  // namespace
}  // namespace prefixd::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gRPC load generator for prefixd (docs/performance.md)");
  absl::ParseCommandLine(argc, argv);
  return prefixd::bench::Run();
}
