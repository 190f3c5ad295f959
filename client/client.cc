#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "base/mutex.h"
#include "client/connect_error.h"
#include "client/health.h"

namespace prefixd {
namespace client_internal {

// What a Client, its Leases and its streams share: the channel, the stub,
// the options and the epoch seen so far.
class ClientCore {
 public:
  ClientCore(std::shared_ptr<grpc::Channel> channel, ClientOptions options,
             std::string target)
      : channel_(std::move(channel)),
        stub_(v1::PrefixCache::NewStub(channel_)),
        index_stub_(v1::PrefixIndex::NewStub(channel_)),
        options_(std::move(options)),
        target_(std::move(target)) {}

  // A failed call's status; a connection failure as one actionable line
  // (client/connect_error.h). Channels made elsewhere (FromChannel) have no
  // target to name and pass through.
  absl::Status Explain(const absl::Status& status) const {
    return ExplainConnectError(target_, options_, status);
  }

  // A context with the deadline (unless infinite) and the credentials.
  std::unique_ptr<grpc::ClientContext> NewContext(
      absl::Duration deadline) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (deadline != absl::InfiniteDuration()) {
      ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    }
    if (options_.wait_for_ready) ctx->set_wait_for_ready(true);
    if (!options_.token.empty())
      ctx->AddMetadata("authorization", "Bearer " + options_.token);
    if (!options_.tenant.empty())
      ctx->AddMetadata("x-prefixd-tenant", options_.tenant);
    return ctx;
  }

  // Runs one unary call: rpc(context, response) -> grpc::Status.
  template <typename Response, typename Rpc>
  absl::StatusOr<Response> Unary(Rpc rpc) {
    std::unique_ptr<grpc::ClientContext> ctx = NewContext(options_.deadline);
    Response response;
    grpc::Status status = rpc(ctx.get(), &response);
    if (!status.ok()) return Explain(FromGrpcStatus(status));
    return response;
  }

  void ObserveEpoch(uint64_t epoch) {
    if (epoch == 0) return;  // not reported
    std::function<void(uint64_t, uint64_t)> callback;
    uint64_t old = 0;
    {
      MutexLock lock(&mu_);
      if (first_epoch_ == 0) first_epoch_ = epoch;
      if (last_epoch_ != 0 && last_epoch_ != epoch) {
        old = last_epoch_;
        callback = callback_;
      }
      last_epoch_ = epoch;
      if (epoch != first_epoch_) changed_ = true;
    }
    if (old != 0 && callback) callback(old, epoch);
  }

  void SetCallback(std::function<void(uint64_t, uint64_t)> callback) {
    MutexLock lock(&mu_);
    callback_ = std::move(callback);
  }
  bool changed() const {
    MutexLock lock(&mu_);
    return changed_;
  }
  uint64_t epoch() const {
    MutexLock lock(&mu_);
    return last_epoch_;
  }
  void Accept() {
    MutexLock lock(&mu_);
    first_epoch_ = last_epoch_;
    changed_ = false;
  }

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  v1::PrefixCache::Stub* stub() const { return stub_.get(); }
  v1::PrefixIndex::Stub* index_stub() const { return index_stub_.get(); }
  const ClientOptions& options() const { return options_; }

 private:
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::PrefixCache::Stub> stub_;
  const std::unique_ptr<v1::PrefixIndex::Stub> index_stub_;
  const ClientOptions options_;
  const std::string target_;  // "" for FromChannel

  mutable Mutex mu_;
  uint64_t first_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool changed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(uint64_t, uint64_t)> callback_ ABSL_GUARDED_BY(mu_);
};

namespace {

class GrpcEventStream : public Client::EventStream {
 public:
  GrpcEventStream(std::shared_ptr<ClientCore> core, uint64_t from_sequence,
                  absl::Duration deadline)
      : core_(std::move(core)), context_(core_->NewContext(deadline)) {
    v1::WatchEventsRequest request;
    request.set_from_sequence(from_sequence);
    reader_ = core_->stub()->WatchEvents(context_.get(), request);
  }

  ~GrpcEventStream() override {
    if (!finished_) {
      Cancel();
      Finish().IgnoreError();
    }
  }

  bool Read(v1::WatchEventsResponse* batch) override {
    if (finished_ || !reader_->Read(batch)) return false;
    core_->ObserveEpoch(batch->epoch());
    return true;
  }

  absl::Status Finish() override {
    if (!finished_) {
      // Finish may only follow a Read that returned false: drain first.
      v1::WatchEventsResponse ignored;
      while (reader_->Read(&ignored)) {
      }
      final_ = core_->Explain(FromGrpcStatus(reader_->Finish()));
      finished_ = true;
    }
    return final_;
  }

  void Cancel() override { context_->TryCancel(); }

 private:
  std::shared_ptr<ClientCore> core_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReader<v1::WatchEventsResponse>> reader_;
  bool finished_ = false;
  absl::Status final_;
};

// WatchHealth's stream with its final status explained (ClientCore::Explain).
class ExplainedHealthStream : public Client::HealthStream {
 public:
  ExplainedHealthStream(std::shared_ptr<ClientCore> core,
                        std::unique_ptr<Client::HealthStream> stream)
      : core_(std::move(core)), stream_(std::move(stream)) {}
  bool Read(HealthStatus* status) override { return stream_->Read(status); }
  absl::Status Finish() override { return core_->Explain(stream_->Finish()); }
  void Cancel() override { stream_->Cancel(); }

 private:
  std::shared_ptr<ClientCore> core_;
  std::unique_ptr<Client::HealthStream> stream_;
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCredentials(
    const ClientOptions& options) {
  const bool tls = options.tls || !options.tls_ca_file.empty() ||
                   !options.tls_cert_file.empty() ||
                   !options.tls_key_file.empty();
  if (!tls) return grpc::InsecureChannelCredentials();
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS client certificate and key must be given together");
  }
  grpc::SslCredentialsOptions ssl;
  for (auto [path, field] :
       {std::pair{&options.tls_ca_file, &ssl.pem_root_certs},
        std::pair{&options.tls_cert_file, &ssl.pem_cert_chain},
        std::pair{&options.tls_key_file, &ssl.pem_private_key}}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> pem = ReadFile(*path);
    if (!pem.ok()) return pem.status();
    *field = *std::move(pem);
  }
  return grpc::SslCredentials(ssl);
}

template <typename T>
std::vector<T> ToVector(const google::protobuf::RepeatedField<T>& field) {
  return std::vector<T>(field.begin(), field.end());
}

}  // namespace
}  // namespace client_internal

const char* HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kUnknown:
      return "UNKNOWN";
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// ---- Lease ----

Client::Lease::~Lease() {
  if (valid()) Release().IgnoreError();
}

Client::Lease::Lease(Lease&& other) noexcept
    : core_(std::move(other.core_)), id_(std::exchange(other.id_, 0)) {}

Client::Lease& Client::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    if (valid()) Release().IgnoreError();
    core_ = std::move(other.core_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

absl::Status Client::Lease::Release() {
  if (!valid())
    return absl::FailedPreconditionError("Release of an empty Lease");
  v1::ReleaseRequest request;
  request.set_lease_id(std::exchange(id_, 0));
  auto* stub = core_->stub();
  return core_
      ->Unary<v1::ReleaseResponse>(
          [&](grpc::ClientContext* ctx, v1::ReleaseResponse* response) {
            return stub->Release(ctx, request, response);
          })
      .status();
}

absl::StatusOr<absl::Duration> Client::Lease::KeepAlive() {
  if (!valid())
    return absl::FailedPreconditionError("KeepAlive of an empty Lease");
  v1::KeepAliveRequest request;
  request.add_lease_ids(id_);
  auto* stub = core_->stub();
  absl::StatusOr<v1::KeepAliveResponse> response =
      core_->Unary<v1::KeepAliveResponse>(
          [&](grpc::ClientContext* ctx, v1::KeepAliveResponse* r) {
            return stub->KeepAlive(ctx, request, r);
          });
  if (!response.ok()) return response.status();
  if (response->expires_in_ms_size() != 1) {
    return absl::InternalError(absl::StrCat("KeepAlive returned ",
                                            response->expires_in_ms_size(),
                                            " expiries for 1 lease"));
  }
  return absl::Milliseconds(response->expires_in_ms(0));
}

uint64_t Client::Lease::Detach() {
  core_.reset();
  return std::exchange(id_, 0);
}

std::vector<uint64_t> Client::MatchResult::block_ids() const {
  std::vector<uint64_t> ids;
  for (const v1::Segment& s : response.segments()) {
    ids.insert(ids.end(), s.block_ids().begin(), s.block_ids().end());
  }
  return ids;
}

// ---- Client ----

Client::Client(std::shared_ptr<client_internal::ClientCore> core)
    : core_(std::move(core)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& target, ClientOptions options) {
  if (absl::Status s = CheckTarget(target); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      client_internal::MakeCredentials(options);
  if (!creds.ok()) return creds.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // dumps and stats of big trees
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, *creds, args);
  return std::unique_ptr<Client>(
      new Client(std::make_shared<client_internal::ClientCore>(
          std::move(channel), std::move(options), target)));
}

std::unique_ptr<Client> Client::FromChannel(
    std::shared_ptr<grpc::Channel> channel, ClientOptions options) {
  return std::unique_ptr<Client>(
      new Client(std::make_shared<client_internal::ClientCore>(
          std::move(channel), std::move(options), "")));
}

absl::StatusOr<v1::GetInfoResponse> Client::GetInfo() {
  auto r = core_->Unary<v1::GetInfoResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->GetInfo(ctx, v1::GetInfoRequest(), resp);
  });
  if (r.ok()) core_->ObserveEpoch(r->epoch());
  return r;
}

absl::StatusOr<v1::HandshakeResponse> Client::Handshake(
    const std::string& engine_id, const std::string& model_fingerprint) {
  v1::HandshakeRequest request;
  request.set_engine_id(engine_id);
  request.set_model_fingerprint(model_fingerprint);
  auto r = core_->Unary<v1::HandshakeResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->Handshake(ctx, request, resp);
  });
  if (r.ok()) core_->ObserveEpoch(r->epoch());
  return r;
}

absl::StatusOr<Client::MatchResult> Client::Match(
    absl::Span<const uint32_t> tokens, const PrefixOptions& options) {
  v1::MatchRequest request;
  request.set_namespace_(options.ns);
  request.set_tokens_le32(TokensLe32(tokens));
  request.set_position_offset(options.position_offset);
  request.set_pin(options.pin);
  request.set_lease_ttl_ms(absl::ToInt64Milliseconds(options.lease_ttl));
  auto r = core_->Unary<v1::MatchResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->Match(ctx, request, resp);
  });
  if (!r.ok()) return r.status();
  core_->ObserveEpoch(r->epoch());
  MatchResult result;
  if (r->lease_id() != 0) result.lease = Lease(core_, r->lease_id());
  result.response = *std::move(r);
  return result;
}

absl::StatusOr<Client::InsertResult> Client::Insert(
    absl::Span<const uint32_t> tokens, absl::Span<const uint64_t> block_ids,
    const PrefixOptions& options) {
  v1::InsertRequest request;
  request.set_namespace_(options.ns);
  request.set_tokens_le32(TokensLe32(tokens));
  request.mutable_block_ids()->Add(block_ids.begin(), block_ids.end());
  request.set_position_offset(options.position_offset);
  request.set_pin(options.pin);
  request.set_lease_ttl_ms(absl::ToInt64Milliseconds(options.lease_ttl));
  if (options.retention) *request.mutable_retention() = *options.retention;
  auto r = core_->Unary<v1::InsertResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->Insert(ctx, request, resp);
  });
  if (!r.ok()) return r.status();
  core_->ObserveEpoch(r->epoch());
  InsertResult result;
  if (r->lease_id() != 0) result.lease = Lease(core_, r->lease_id());
  result.response = *std::move(r);
  return result;
}

absl::StatusOr<v1::MatchBatchResponse> Client::MatchBatch(
    const v1::MatchBatchRequest& request) {
  auto r = core_->Unary<v1::MatchBatchResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->MatchBatch(ctx, request, resp);
  });
  if (r.ok()) core_->ObserveEpoch(r->epoch());
  return r;
}

absl::StatusOr<v1::InsertBatchResponse> Client::InsertBatch(
    const v1::InsertBatchRequest& request) {
  auto r = core_->Unary<v1::InsertBatchResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->InsertBatch(ctx, request, resp);
  });
  if (r.ok()) core_->ObserveEpoch(r->epoch());
  return r;
}

absl::Status Client::Release(uint64_t lease_id) {
  v1::ReleaseRequest request;
  request.set_lease_id(lease_id);
  return core_
      ->Unary<v1::ReleaseResponse>([&](auto* ctx, auto* resp) {
        return core_->stub()->Release(ctx, request, resp);
      })
      .status();
}

absl::StatusOr<std::vector<absl::Duration>> Client::KeepAlive(
    absl::Span<const uint64_t> lease_ids) {
  v1::KeepAliveRequest request;
  request.mutable_lease_ids()->Add(lease_ids.begin(), lease_ids.end());
  auto r = core_->Unary<v1::KeepAliveResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->KeepAlive(ctx, request, resp);
  });
  if (!r.ok()) return r.status();
  std::vector<absl::Duration> left;
  for (uint64_t ms : r->expires_in_ms()) left.push_back(absl::Milliseconds(ms));
  return left;
}

absl::StatusOr<std::vector<uint64_t>> Client::Evict(uint64_t blocks) {
  v1::EvictRequest request;
  request.set_blocks(blocks);
  auto r = core_->Unary<v1::EvictResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->Evict(ctx, request, resp);
  });
  if (!r.ok()) return r.status();
  return client_internal::ToVector(r->evicted_block_ids());
}

absl::StatusOr<std::vector<uint64_t>> Client::Invalidate(
    absl::Span<const uint64_t> block_ids) {
  v1::InvalidateRequest request;
  request.mutable_block_ids()->Add(block_ids.begin(), block_ids.end());
  auto r = core_->Unary<v1::InvalidateResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->Invalidate(ctx, request, resp);
  });
  if (!r.ok()) return r.status();
  return client_internal::ToVector(r->removed_block_ids());
}

absl::StatusOr<v1::ResetResponse> Client::Reset(const std::string& tenant,
                                                bool all) {
  v1::ResetRequest request;
  request.set_tenant(tenant);
  request.set_all(all);
  auto r = core_->Unary<v1::ResetResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->Reset(ctx, request, resp);
  });
  if (r.ok()) core_->ObserveEpoch(r->epoch());
  return r;
}

absl::StatusOr<v1::StatsResponse> Client::Stats(bool all_tenants) {
  v1::StatsRequest request;
  request.set_all_tenants(all_tenants);
  auto r = core_->Unary<v1::StatsResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->Stats(ctx, request, resp);
  });
  if (r.ok()) core_->ObserveEpoch(r->epoch());
  return r;
}

absl::StatusOr<v1::DumpResponse> Client::Dump(const std::string& ns) {
  v1::DumpRequest request;
  request.set_namespace_(ns);
  auto r = core_->Unary<v1::DumpResponse>([&](auto* ctx, auto* resp) {
    return core_->stub()->Dump(ctx, request, resp);
  });
  if (r.ok()) core_->ObserveEpoch(r->epoch());
  return r;
}

std::unique_ptr<Client::EventStream> Client::WatchEvents(
    uint64_t from_sequence, absl::Duration deadline) {
  return std::make_unique<client_internal::GrpcEventStream>(
      core_, from_sequence, deadline);
}

absl::Status Client::WatchEvents(
    uint64_t from_sequence,
    const std::function<bool(const v1::WatchEventsResponse&)>& on_batch,
    absl::Duration deadline) {
  std::unique_ptr<EventStream> stream = WatchEvents(from_sequence, deadline);
  v1::WatchEventsResponse batch;
  while (stream->Read(&batch)) {
    if (!on_batch(batch)) {
      stream->Cancel();
      stream->Finish().IgnoreError();  // CANCELLED, by us
      return absl::OkStatus();
    }
  }
  return stream->Finish();
}

absl::StatusOr<v1::RouteResponse> Client::Route(
    absl::Span<const uint32_t> tokens, const RouteOptions& options) {
  const v1::RouteRequest request = RouteRequestFor(tokens, options);
  return core_->Unary<v1::RouteResponse>([&](auto* ctx, auto* resp) {
    return core_->index_stub()->Route(ctx, request, resp);
  });
}

absl::StatusOr<v1::RouteBatchResponse> Client::RouteBatch(
    const v1::RouteBatchRequest& request) {
  return core_->Unary<v1::RouteBatchResponse>([&](auto* ctx, auto* resp) {
    return core_->index_stub()->RouteBatch(ctx, request, resp);
  });
}

absl::StatusOr<v1::ListWorkersResponse> Client::ListWorkers() {
  return core_->Unary<v1::ListWorkersResponse>([&](auto* ctx, auto* resp) {
    return core_->index_stub()->ListWorkers(ctx, v1::ListWorkersRequest(),
                                            resp);
  });
}

absl::StatusOr<v1::PickResponse> Client::Pick(absl::Span<const uint32_t> tokens,
                                              const PickOptions& options) {
  const v1::PickRequest request = PickRequestFor(tokens, options);
  return core_->Unary<v1::PickResponse>([&](auto* ctx, auto* resp) {
    return core_->index_stub()->Pick(ctx, request, resp);
  });
}

absl::StatusOr<v1::PickBatchResponse> Client::PickBatch(
    const v1::PickBatchRequest& request) {
  return core_->Unary<v1::PickBatchResponse>([&](auto* ctx, auto* resp) {
    return core_->index_stub()->PickBatch(ctx, request, resp);
  });
}

absl::StatusOr<HealthStatus> Client::Health(const std::string& service) {
  std::unique_ptr<grpc::ClientContext> ctx =
      core_->NewContext(core_->options().deadline);
  absl::StatusOr<HealthStatus> status =
      client_internal::CheckHealth(core_->channel(), ctx.get(), service);
  if (!status.ok()) return core_->Explain(status.status());
  return status;
}

std::unique_ptr<Client::HealthStream> Client::WatchHealth(
    const std::string& service, absl::Duration deadline) {
  return std::make_unique<client_internal::ExplainedHealthStream>(
      core_, client_internal::WatchHealth(
                 core_->channel(), core_->NewContext(deadline), service));
}

void Client::OnEpochChange(std::function<void(uint64_t, uint64_t)> callback) {
  core_->SetCallback(std::move(callback));
}
bool Client::epoch_changed() const { return core_->changed(); }
uint64_t Client::epoch() const { return core_->epoch(); }
void Client::AcceptEpoch() { core_->Accept(); }
const ClientOptions& Client::options() const { return core_->options(); }

std::string TokensLe32(absl::Span<const uint32_t> tokens) {
  std::string out(tokens.size() * sizeof(uint32_t), '\0');
  if constexpr (std::endian::native == std::endian::little) {
    if (!tokens.empty()) std::memcpy(out.data(), tokens.data(), out.size());
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      for (size_t b = 0; b < sizeof(uint32_t); ++b) {
        out[i * sizeof(uint32_t) + b] = static_cast<char>(tokens[i] >> (8 * b));
      }
    }
  }
  return out;
}

v1::RouteRequest RouteRequestFor(absl::Span<const uint32_t> tokens,
                                 const RouteOptions& options) {
  v1::RouteRequest request;
  request.set_tokens_le32(TokensLe32(tokens));
  request.set_lora_name(options.lora_name);
  request.set_lora_id(options.lora_id);
  request.set_cache_salt(options.cache_salt);
  request.mutable_workers()->Add(options.workers.begin(),
                                 options.workers.end());
  request.mutable_block_extra_keys()->Add(options.block_extra_keys.begin(),
                                          options.block_extra_keys.end());
  request.set_all_workers(options.all_workers);
  return request;
}

v1::PickRequest PickRequestFor(absl::Span<const uint32_t> tokens,
                               const PickOptions& options) {
  v1::PickRequest request;
  RouteOptions prompt = options.prompt;
  prompt.workers.clear();
  prompt.all_workers = false;
  *request.mutable_prompt() = RouteRequestFor(tokens, prompt);
  request.mutable_candidates()->Add(options.candidates.begin(),
                                    options.candidates.end());
  request.mutable_loads()->Add(options.loads.begin(), options.loads.end());
  request.set_dry_run(options.dry_run);
  request.set_replay_time_ms(options.replay_time_ms);
  return request;
}

}  // namespace prefixd
