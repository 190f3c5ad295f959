// libFuzzer: serialized request messages for every RPC, sent as raw bytes
// through a real in-process gRPC channel to one Server (created once), so the
// server's own deserialization, authorization, validation and the cache all
// see them.
//
// Input: records, each
//   u8   selector   rpc = selector % 15 (14: advance the clock by len x 100 ms
//                   and expire leases); metadata = selector / 15 % 5
//                   (none, tenant a, tenant b, the tenant header twice, a
//                   tenant name with a space)
//   u8   len
//   len  bytes      the request message (fewer if the input ends)
//
// Checked after every call: the status code is one the API documents (never
// INTERNAL, UNKNOWN, DATA_LOSS, UNAVAILABLE or a deadline),
// CheckInvariants(), responses carry the server's epoch, and block
// conservation from the caller's side: every ID a response hands back
// (evicted, invalidated, reset) was cached exactly once, every ID Match or
// Dump shows is cached, and at the end of the input Reset of every tenant
// returns exactly the IDs the fuzzer believes cached.
//
//   build-fuzz/tests/fuzz/rpc_fuzzer tests/fuzz/corpus/rpc_fuzzer
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/rpc_method.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "prefixd/v1/prefix_cache.grpc.pb.h"
#include "server/config.h"
#include "server/server.h"

namespace prefixd {
namespace {

constexpr int kRpcs = 14;
constexpr int kMaxRecords = 64;

const char* const kMethods[kRpcs] = {
    "GetInfo",     "Handshake", "Match",      "Insert",     "Release",
    "KeepAlive",   "Evict",     "Invalidate", "Reset",      "Stats",
    "WatchEvents", "Dump",      "MatchBatch", "InsertBatch"};

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "rpc_fuzzer: %s\n", what.c_str());
  std::abort();
}

struct Fixture {
  ManualClock clock;
  std::unique_ptr<Server> server;
  std::shared_ptr<grpc::Channel> channel;

  Fixture() {
    // Requests with invalid UTF-8 in string fields are refused; protobuf
    // would also log each one.
    google::protobuf::SetLogHandler(nullptr);
    CommandLine flags;
    flags.block_size = 2;
    flags.kv_budget = absl::StrCat(32 * 2 * 131072, "B");  // 32 blocks
    absl::StatusOr<ServerConfig> config = LoadServerConfig(flags);
    if (!config.ok()) Fail(config.status().ToString());
    config->listen.clear();  // in-process only
    config->cache.clock = &clock;
    config->cache.seed = 1;
    config->max_message_bytes = 4096;
    config->watch_poll_interval = absl::Milliseconds(1);
    config->expire_interval = absl::Hours(1);  // the fuzzer expires leases
    CacheLimits& l = config->cache.limits;
    l.max_tokens_per_request = 256;
    l.max_block_ids_per_request = 64;
    l.max_namespaces_per_tenant = 4;
    l.max_tenants = 4;
    l.max_leases_per_tenant = 16;
    l.max_namespace_bytes = 16;
    l.max_lease_ttl = absl::Minutes(10);
    absl::StatusOr<std::unique_ptr<Server>> s =
        Server::Start(*std::move(config));
    if (!s.ok()) Fail(s.status().ToString());
    server = *std::move(s);
    channel = server->InProcessChannel();
  }
};

Fixture& F() {
  static Fixture* f = new Fixture;  // lives for the process
  return *f;
}

class Session {
 public:
  explicit Session(Fixture& f) : f_(f) {}

  void Record(int selector, const std::string& bytes) {
    const int rpc = selector % (kRpcs + 1);
    if (rpc == kRpcs) {
      f_.clock.Advance(absl::Milliseconds(100) *
                       static_cast<int>(bytes.size()));
      f_.server->cache()->ExpireLeases();
      return;
    }
    const int meta = selector / (kRpcs + 1) % 5;
    if (rpc == 10) return Watch(meta, bytes);
    grpc::ClientContext ctx;
    Prepare(&ctx, meta);
    const std::string method =
        absl::StrCat("/prefixd.v1.PrefixCache/", kMethods[rpc]);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::Status status =
        grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
            f_.channel.get(),
            grpc::internal::RpcMethod(method.c_str(),
                                      grpc::internal::RpcMethod::NORMAL_RPC),
            &ctx, request, &response);
    if (!Parses(rpc, bytes)) {
      // gRPC refuses bytes that are not the request message before any
      // handler runs (UNIMPLEMENTED in 1.51's callback API).
      if (status.ok())
        Fail(absl::StrCat(method, ": accepted unparsable bytes"));
    } else {
      CheckCode(method, status);
      if (status.ok()) Account(rpc, bytes, response);
    }
    if (absl::Status s = f_.server->cache()->CheckInvariants(); !s.ok())
      Fail(absl::StrCat(method, ": ", s.ToString()));
  }

  // Every block this input left cached must come back from a full Reset,
  // once: nothing was lost or duplicated on the way.
  void Finish() {
    std::vector<BlockId> all = f_.server->cache()->Reset(TenantScope::All());
    std::sort(all.begin(), all.end());
    if (std::adjacent_find(all.begin(), all.end()) != all.end())
      Fail("Reset returned an ID twice");
    if (std::vector<BlockId>(cached_.begin(), cached_.end()) != all) {
      Fail(absl::StrCat("Reset returned ", all.size(),
                        " IDs, the fuzzer "
                        "believes ",
                        cached_.size(), " cached"));
    }
  }

 private:
  static void Prepare(grpc::ClientContext* ctx, int meta) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(60));
    switch (meta) {
      case 1:
        ctx->AddMetadata("x-prefixd-tenant", "a");
        break;
      case 2:
        ctx->AddMetadata("x-prefixd-tenant", "b");
        break;
      case 3:
        ctx->AddMetadata("x-prefixd-tenant", "a");
        ctx->AddMetadata("x-prefixd-tenant", "b");
        break;
      case 4:
        ctx->AddMetadata("x-prefixd-tenant", "a b");
        break;
      default:
        break;
    }
  }

  // Whether `bytes` parse as the request message of `rpc`, as the server
  // parses them.
  static bool Parses(int rpc, const std::string& bytes) {
    auto parse = [&bytes](auto message) {
      return message.ParseFromString(bytes);
    };
    switch (rpc) {
      case 0:
        return parse(v1::GetInfoRequest());
      case 1:
        return parse(v1::HandshakeRequest());
      case 2:
        return parse(v1::MatchRequest());
      case 3:
        return parse(v1::InsertRequest());
      case 4:
        return parse(v1::ReleaseRequest());
      case 5:
        return parse(v1::KeepAliveRequest());
      case 6:
        return parse(v1::EvictRequest());
      case 7:
        return parse(v1::InvalidateRequest());
      case 8:
        return parse(v1::ResetRequest());
      case 9:
        return parse(v1::StatsRequest());
      case 11:
        return parse(v1::DumpRequest());
      case 12:
        return parse(v1::MatchBatchRequest());
      case 13:
        return parse(v1::InsertBatchRequest());
      default:
        return parse(v1::WatchEventsRequest());
    }
  }

  static void CheckCode(const std::string& method, const grpc::Status& s) {
    switch (s.error_code()) {
      case grpc::StatusCode::OK:
      case grpc::StatusCode::INVALID_ARGUMENT:
      case grpc::StatusCode::NOT_FOUND:
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
      case grpc::StatusCode::FAILED_PRECONDITION:
      case grpc::StatusCode::PERMISSION_DENIED:
        return;
      default:
        Fail(absl::StrCat(method, ": unexpected status ", s.error_code(), " ",
                          s.error_message()));
    }
  }

  template <typename T>
  static T Parse(const grpc::ByteBuffer& buffer) {
    grpc::Slice all;
    T out;
    if (!buffer.DumpToSingleSlice(&all).ok() ||
        !out.ParseFromArray(all.begin(), static_cast<int>(all.size())))
      Fail(absl::StrCat("cannot parse a ", out.GetTypeName()));
    return out;
  }

  void CheckEpoch(uint64_t epoch) const {
    if (epoch != f_.server->epoch())
      Fail(absl::StrCat("epoch ", epoch, " != ", f_.server->epoch()));
  }

  void Returned(const google::protobuf::RepeatedField<uint64_t>& ids,
                const char* how) {
    for (uint64_t id : ids) {
      if (cached_.erase(id) == 0)
        Fail(absl::StrCat(how, " block ", id, " that was not cached"));
    }
  }

  void MustBeCached(uint64_t id, const char* where) const {
    if (!cached_.contains(id))
      Fail(absl::StrCat(where, " shows block ", id, " that is not cached"));
  }

  // A successful Insert: evicted IDs leave, the request's other IDs that
  // are not redundant are (or stay) cached.
  void Inserted(const v1::InsertRequest& req, const v1::InsertResponse& r) {
    CheckEpoch(r.epoch());
    Returned(r.evicted_block_ids(), "Insert evicted");
    const std::set<uint64_t> redundant(r.redundant_block_ids().begin(),
                                       r.redundant_block_ids().end());
    for (uint64_t id : redundant) {
      if (cached_.contains(id))
        Fail(absl::StrCat("Insert called cached block ", id, " redundant"));
    }
    for (uint64_t id : req.block_ids()) {
      if (!redundant.contains(id)) cached_.insert(id);
    }
  }

  static void CheckItemCode(const char* method, int code,
                            const std::string& message) {
    CheckCode(method,
              grpc::Status(static_cast<grpc::StatusCode>(code), message));
  }

  void Account(int rpc, const std::string& bytes,
               const grpc::ByteBuffer& response) {
    switch (rpc) {
      case 1:
        CheckEpoch(Parse<v1::HandshakeResponse>(response).epoch());
        break;
      case 2: {
        const auto r = Parse<v1::MatchResponse>(response);
        CheckEpoch(r.epoch());
        for (const v1::Segment& s : r.segments())
          for (uint64_t id : s.block_ids()) MustBeCached(id, "Match");
        break;
      }
      case 3: {
        v1::InsertRequest req;
        req.ParseFromString(bytes);  // the server parsed the same bytes
        Inserted(req, Parse<v1::InsertResponse>(response));
        break;
      }
      case 6:
        Returned(Parse<v1::EvictResponse>(response).evicted_block_ids(),
                 "Evict returned");
        break;
      case 7:
        Returned(Parse<v1::InvalidateResponse>(response).removed_block_ids(),
                 "Invalidate returned");
        break;
      case 8: {
        const auto r = Parse<v1::ResetResponse>(response);
        CheckEpoch(r.epoch());
        Returned(r.removed_block_ids(), "Reset returned");
        break;
      }
      case 11: {
        const auto r = Parse<v1::DumpResponse>(response);
        CheckEpoch(r.epoch());
        for (const v1::DumpNode& n : r.nodes())
          for (uint64_t id : n.block_ids()) MustBeCached(id, "Dump");
        break;
      }
      case 12: {
        const auto r = Parse<v1::MatchBatchResponse>(response);
        CheckEpoch(r.epoch());
        for (const v1::MatchBatchItem& item : r.results()) {
          CheckItemCode("MatchBatch", item.code(), item.message());
          for (const v1::Segment& s : item.response().segments())
            for (uint64_t id : s.block_ids()) MustBeCached(id, "MatchBatch");
        }
        break;
      }
      case 13: {
        v1::InsertBatchRequest req;
        req.ParseFromString(bytes);
        const auto r = Parse<v1::InsertBatchResponse>(response);
        CheckEpoch(r.epoch());
        if (r.results_size() != req.requests_size())
          Fail("InsertBatch: one result per request expected");
        for (int i = 0; i < r.results_size(); ++i) {
          const v1::InsertBatchItem& item = r.results(i);
          CheckItemCode("InsertBatch", item.code(), item.message());
          if (item.code() == 0) Inserted(req.requests(i), item.response());
        }
        break;
      }
      default:
        break;
    }
  }

  // A WatchEvents stream: start it, read what is there within a few
  // milliseconds, cancel it.
  void Watch(int meta, const std::string& bytes) {
    v1::WatchEventsRequest req;
    if (!req.ParseFromString(bytes)) return;
    grpc::ClientContext ctx;
    Prepare(&ctx, meta);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(5));
    auto stub = v1::PrefixCache::NewStub(f_.channel);
    auto reader = stub->WatchEvents(&ctx, req);
    v1::WatchEventsResponse resp;
    if (reader->Read(&resp)) CheckEpoch(resp.epoch());
    ctx.TryCancel();
    const grpc::Status s = reader->Finish();
    switch (s.error_code()) {
      case grpc::StatusCode::OK:
      case grpc::StatusCode::CANCELLED:
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return;
      default:
        CheckCode("WatchEvents", s);
    }
  }

  Fixture& f_;
  std::set<uint64_t> cached_;
};

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  prefixd::Session session(prefixd::F());
  size_t pos = 0;
  for (int n = 0; n < prefixd::kMaxRecords && pos + 2 <= size; ++n) {
    const int selector = data[pos];
    const size_t len = std::min<size_t>(data[pos + 1], size - pos - 2);
    session.Record(
        selector,
        std::string(reinterpret_cast<const char*>(data + pos + 2), len));
    pos += 2 + len;
  }
  session.Finish();
  return 0;
}
