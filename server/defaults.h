// The embedded default: what prefixd serves with no
// config file and no flags. Shared by config loading and by --help, so the
// help text cannot drift from what the daemon does.
#ifndef PREFIXD_SERVER_DEFAULTS_H_
#define PREFIXD_SERVER_DEFAULTS_H_

#include <cstdint>

namespace prefixd::defaults {

inline constexpr char kTcpListen[] = "127.0.0.1:50051";
// /tmp, not /run/prefixd: any user can create a socket there, so the
// embedded default starts without root. Deployments pass their own path.
inline constexpr char kUnixListen[] = "unix:///tmp/prefixd.sock";
inline constexpr char kMetricsListen[] = "127.0.0.1:9464";
inline constexpr char kModel[] = "llama-3-8b";
inline constexpr char kKvDtype[] = "fp16";
inline constexpr uint32_t kBlockSize = 16;
inline constexpr char kKvBudget[] = "4GiB";
inline constexpr char kLeaseTtl[] = "300s";
inline constexpr char kDrainTimeout[] = "10s";
inline constexpr uint32_t kEventsPerTenant = 4096;
// 4096 events of 128 IDs each, or 8 Inserts of 65,536 IDs: a tenant's ring
// is bounded in bytes too (docs/operations.md, "Memory bounds").
inline constexpr char kEventRingBytes[] = "4MiB";
// WatchEvents: at most 8 streams x 1 MiB in flight per tenant; a reply not
// read in 30 s ends its stream.
inline constexpr uint32_t kMaxWatchStreamsPerTenant = 8;
inline constexpr char kWatchReplyBytes[] = "1MiB";
inline constexpr char kWatchStallTimeout[] = "30s";
// Per connection: calls in flight, and how long one without calls lives.
inline constexpr uint32_t kMaxConcurrentStreams = 64;
inline constexpr char kMaxConnectionIdle[] = "5m";
// A new stream's HTTP/2 window: gRPC's own default without BDP probing.
inline constexpr char kMaxBytesBeforeAuth[] = "64KiB";
// Leaves room for a max_tokens_per_request (1 Mi) request: up to 5 bytes a
// token.
inline constexpr char kMaxMessageSize[] = "16MiB";
// The fleet index (docs/index.md): vLLM's default block size.
inline constexpr uint32_t kIndexBlockSize = 16;
inline constexpr uint64_t kIndexMaxEntries = 50000000;
inline constexpr char kIndexReplayTimeout[] = "2s";
inline constexpr char kIndexHashProfile[] = "conductor";
inline constexpr char kIndexHttpAnswer[] = "by_tenant";
inline constexpr char kIndexDecodeBudget[] = "512MiB";
// events_publish: vLLM's default replay buffer (buffer_steps).
inline constexpr uint32_t kEventsPublishBufferBatches = 10000;
// ... and what it keeps and queues per peer in bytes, and how long a peer
// that reads nothing keeps its queue (server/kv_event_sockets.h).
inline constexpr char kEventsPublishBufferBytes[] = "64MiB";
inline constexpr char kEventsPublishQueueBytes[] = "4MiB";
inline constexpr char kEventsPublishStallTimeout[] = "30s";

}  // namespace prefixd::defaults

#endif  // PREFIXD_SERVER_DEFAULTS_H_
