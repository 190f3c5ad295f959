// prefixd::Client: the C++ client of the PrefixCache service and of the
// fleet index (PrefixIndex: Route, RouteBatch, ListWorkers; docs/index.md).
//
// A thin, typed layer over the generated stub that an engine links in:
//   - every call carries a deadline (ClientOptions::deadline) and the
//     caller's credentials (bearer token, x-prefixd-tenant);
//   - results are absl::StatusOr, with the gRPC code and message kept as is;
//   - Match and Insert with `pin` return a Lease that releases its pin when
//     destroyed, so a request that dies early does not leak pinned blocks;
//   - the client remembers the first epoch the daemon reports and says when
//     it changes: the daemon lost its cache state and every block ID the
//     engine believes cached there is gone (docs/client.md, "Epochs").
//
//   auto client = prefixd::Client::Connect("unix:///run/prefixd/prefixd.sock");
//   prefixd::PrefixOptions pin;
//   pin.pin = true;
//   auto m = (*client)->Match(tokens, pin);
//   ... use m->response.segments(), then m->lease goes out of scope ...
//
// Thread safety: a Client may be used from many threads at once. A Lease or
// an EventStream belongs to one thread at a time, except Cancel().
#ifndef PREFIXD_CLIENT_CLIENT_H_
#define PREFIXD_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "prefixd/v1/prefix_cache.grpc.pb.h"
#include "prefixd/v1/prefix_index.grpc.pb.h"

namespace grpc {
class Channel;
class ClientContext;
class Status;
}  // namespace grpc

namespace prefixd {

struct ClientOptions {
  // Deadline of every unary call. Streams (WatchEvents, WatchHealth) have
  // their own, infinite by default.
  absl::Duration deadline = absl::Seconds(5);
  // Sent as `authorization: Bearer <token>` when not empty.
  std::string token;
  // Sent as `x-prefixd-tenant` when not empty (engine principals pick the
  // tenant of each call this way; with auth off it defaults to "default").
  std::string tenant;
  // Unary calls wait (up to the deadline) for an unreachable daemon to come
  // back, e.g. across a restart, instead of failing at once with UNAVAILABLE.
  bool wait_for_ready = false;
  // TLS: used when `tls` is set or any file is given. PEM files; the client
  // certificate and key are for mTLS.
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
};

// Options of a Match or an Insert.
struct PrefixOptions {
  std::string ns;  // namespace: LoRA adapter, cache salt, "" by default
  int64_t position_offset = 0;  // absolute position of tokens[0]
  bool pin = false;             // return a Lease on the matched/inserted path
  absl::Duration lease_ttl =
      absl::ZeroDuration();  // zero: the daemon's default
  // Insert only: how long the blocks should stay (docs/api.md,
  // "Retention"), e.g. priority 90 for a system prompt. Unset: new blocks
  // get priority 50 and cached ones keep theirs.
  std::optional<v1::Retention> retention;
};

// Options of a Route (the fleet index): the namespace the engines hashed the
// prompt under, and which workers to answer for.
struct RouteOptions {
  std::string lora_name;  // wins over lora_id when both are set
  int64_t lora_id = 0;    // 0: none
  std::string cache_salt;
  // Only these workers, each listed matched or not (empty: every worker).
  std::vector<std::string> workers;
  // List the workers that hold none of the prompt too (by default an
  // answer lists only those with matched_blocks > 0).
  bool all_workers = false;
  // Per block, its keys beyond the tokens (multimodal inputs, prompt
  // embeddings), as vLLM's typed extra keys (docs/index.md).
  std::vector<v1::BlockExtraKeys> block_extra_keys;
};

// Options of a Pick (the fleet index, docs/index.md "Pick"): the prompt's
// namespace, who may be chosen and their loads as the router sees them.
struct PickOptions {
  RouteOptions prompt;  // its workers and all_workers are not sent
  // The workers to choose among (empty: every engine of the index).
  std::vector<std::string> candidates;
  // Candidates' loads; one without is charged the index's recent picks.
  std::vector<v1::WorkerLoad> loads;
  bool dry_run = false;  // rank and choose, record nothing
  // The decision's time when replaying a trace (the daemon runs with
  // index.pick.replay_clock; docs/index.md), ms; 0 otherwise.
  int64_t replay_time_ms = 0;
};

// grpc.health.v1 serving status, numbered as on the wire.
enum class HealthStatus : int {
  kUnknown = 0,
  kServing = 1,
  kNotServing = 2,
  kServiceUnknown = 3,
};
const char* HealthStatusName(HealthStatus status);

namespace client_internal {
class ClientCore;
}  // namespace client_internal

class Client {
 public:
  // A pin on a cached path. Destroying a valid Lease releases it (best effort,
  // errors ignored: an expired lease is already gone). Movable, not copyable.
  // A Lease keeps the connection it came from alive, so it may outlive its
  // Client.
  class Lease {
   public:
    Lease() = default;
    ~Lease();
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

    uint64_t id() const { return id_; }
    bool valid() const { return id_ != 0; }
    explicit operator bool() const { return valid(); }

    // Ends the lease now. Afterwards the Lease is empty, whatever the result.
    absl::Status Release();
    // Renews the lease by its TTL; returns the time left.
    absl::StatusOr<absl::Duration> KeepAlive();
    // Gives up ownership without releasing (e.g. to hand the id to another
    // process); returns the id. The lease then ends by Release or by its TTL.
    uint64_t Detach();

   private:
    friend class Client;
    Lease(std::shared_ptr<client_internal::ClientCore> core, uint64_t id)
        : core_(std::move(core)), id_(id) {}

    std::shared_ptr<client_internal::ClientCore> core_;
    uint64_t id_ = 0;
  };

  struct MatchResult {
    v1::MatchResponse response;
    Lease lease;  // valid when pinned and something matched

    uint64_t matched_tokens() const { return response.matched_tokens(); }
    // Block IDs of every segment, in order.
    std::vector<uint64_t> block_ids() const;
  };

  struct InsertResult {
    v1::InsertResponse response;
    Lease lease;  // valid when pinned
  };

  // A server stream of event batches. Read blocks for the next batch and
  // returns false when the stream ended; Finish then gives its status.
  class EventStream {
   public:
    virtual ~EventStream() = default;
    virtual bool Read(v1::WatchEventsResponse* batch) = 0;
    virtual absl::Status Finish() = 0;
    // Ends the stream from any thread; a blocked Read returns false.
    virtual void Cancel() = 0;
  };

  // A grpc.health.v1.Health/Watch stream: one status per change.
  class HealthStream {
   public:
    virtual ~HealthStream() = default;
    virtual bool Read(HealthStatus* status) = 0;
    virtual absl::Status Finish() = 0;
    virtual void Cancel() = 0;
  };

  // Creates a channel to `target` ("host:port", "unix:///path", any gRPC
  // target). Does not wait for the connection: the first call does.
  // INVALID_ARGUMENT for an empty target or an unreadable TLS file.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& target, ClientOptions options = {});
  // For tests and embedders that build their own channel.
  static std::unique_ptr<Client> FromChannel(
      std::shared_ptr<grpc::Channel> channel, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  absl::StatusOr<v1::GetInfoResponse> GetInfo();
  // FAILED_PRECONDITION when the daemon serves another model.
  absl::StatusOr<v1::HandshakeResponse> Handshake(
      const std::string& engine_id, const std::string& model_fingerprint);
  absl::StatusOr<MatchResult> Match(absl::Span<const uint32_t> tokens,
                                    const PrefixOptions& options = {});
  // len(tokens) must be len(block_ids) * block_size. Free the response's
  // redundant_block_ids and evicted_block_ids.
  absl::StatusOr<InsertResult> Insert(absl::Span<const uint32_t> tokens,
                                      absl::Span<const uint64_t> block_ids,
                                      const PrefixOptions& options = {});
  // Many Matches (or Inserts) in one round trip, run in order under one
  // acquisition of the tenant's lock (docs/api.md, "Batches"). The call
  // fails as a whole only when it is refused (auth, an empty batch, the
  // batch limits); otherwise there is one item per request, in order, each
  // with its own status and, when OK, the response the single call would
  // give. Leases of pinned items are not wrapped: Release the items'
  // lease_id yourself.
  absl::StatusOr<v1::MatchBatchResponse> MatchBatch(
      const v1::MatchBatchRequest& request);
  absl::StatusOr<v1::InsertBatchResponse> InsertBatch(
      const v1::InsertBatchRequest& request);
  absl::Status Release(uint64_t lease_id);
  // Time left for each lease, in order. NOT_FOUND (renewing none) if any is
  // unknown.
  absl::StatusOr<std::vector<absl::Duration>> KeepAlive(
      absl::Span<const uint64_t> lease_ids);
  // Evicted block IDs (the engine frees them).
  absl::StatusOr<std::vector<uint64_t>> Evict(uint64_t blocks);
  // Every removed block ID, including the descendants of `block_ids`.
  absl::StatusOr<std::vector<uint64_t>> Invalidate(
      absl::Span<const uint64_t> block_ids);
  // tenant "" is the caller's; `all` is every tenant (admin or auth off).
  absl::StatusOr<v1::ResetResponse> Reset(const std::string& tenant = "",
                                          bool all = false);
  absl::StatusOr<v1::StatsResponse> Stats(bool all_tenants = false);
  absl::StatusOr<v1::DumpResponse> Dump(const std::string& ns = "");

  // Event batches from `from_sequence` (0: the oldest kept), until the
  // stream ends or is cancelled. `deadline` bounds the whole stream.
  std::unique_ptr<EventStream> WatchEvents(
      uint64_t from_sequence,
      absl::Duration deadline = absl::InfiniteDuration());
  // Calls on_batch for each batch until it returns false (OK), the stream
  // ends (its status) or fails.
  absl::Status WatchEvents(
      uint64_t from_sequence,
      const std::function<bool(const v1::WatchEventsResponse&)>& on_batch,
      absl::Duration deadline = absl::InfiniteDuration());

  // The fleet index (prefixd.v1.PrefixIndex, docs/index.md), on the same
  // channel and credentials. A daemon that does not run the index answers
  // UNIMPLEMENTED (code and message kept as they are, like any error).
  //
  // How many leading whole blocks of the prompt each worker holds, best
  // first. The tokens travel in tokens_le32.
  absl::StatusOr<v1::RouteResponse> Route(absl::Span<const uint32_t> tokens,
                                          const RouteOptions& options = {});
  // Many Routes in one round trip (build the items with RouteRequestFor).
  // The call fails as a whole only when it is refused; otherwise there is
  // one item per request, in order, each with its own code and, when OK,
  // the response the single call would give.
  absl::StatusOr<v1::RouteBatchResponse> RouteBatch(
      const v1::RouteBatchRequest& request);
  // Every worker the index knows: state, endpoint, blocks, event counters.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers();
  // Which worker should serve the prompt: the candidates ranked by cost,
  // the cheapest chosen and (unless a dry run) predicted to hold it.
  absl::StatusOr<v1::PickResponse> Pick(absl::Span<const uint32_t> tokens,
                                        const PickOptions& options = {});
  // Many Picks in order in one round trip (build the items with
  // PickRequestFor); each item has its own code, as RouteBatch's.
  absl::StatusOr<v1::PickBatchResponse> PickBatch(
      const v1::PickBatchRequest& request);

  // grpc.health.v1.Health/Check; service "" is the whole server.
  absl::StatusOr<HealthStatus> Health(const std::string& service = "");
  std::unique_ptr<HealthStream> WatchHealth(
      const std::string& service = "",
      absl::Duration deadline = absl::InfiniteDuration());

  // Epoch tracking. The first epoch seen in any response is the baseline;
  // a response with another epoch sets epoch_changed() and calls the
  // callback (outside any lock, on the thread of that call) with the
  // previously seen epoch and the new one.
  void OnEpochChange(
      std::function<void(uint64_t old_epoch, uint64_t new_epoch)> callback);
  bool epoch_changed() const;
  uint64_t epoch() const;  // last seen; 0 before any response
  // Makes the last seen epoch the baseline and clears epoch_changed() (the
  // engine has dropped what it believed cached).
  void AcceptEpoch();

  const ClientOptions& options() const;

 private:
  explicit Client(std::shared_ptr<client_internal::ClientCore> core);

  std::shared_ptr<client_internal::ClientCore> core_;
};

// grpc::Status -> absl::Status, keeping code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

// `tokens` as MatchRequest/InsertRequest.tokens_le32 carries them: 4 bytes
// each, little-endian. Client::Match and Client::Insert send them so; code
// that builds requests itself (MatchBatch) can too.
std::string TokensLe32(absl::Span<const uint32_t> tokens);

// The RouteRequest Client::Route sends (tokens in tokens_le32), for
// RouteBatch items.
v1::RouteRequest RouteRequestFor(absl::Span<const uint32_t> tokens,
                                 const RouteOptions& options = {});
// The PickRequest Client::Pick sends, for PickBatch items.
v1::PickRequest PickRequestFor(absl::Span<const uint32_t> tokens,
                               const PickOptions& options = {});

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_CLIENT_H_
