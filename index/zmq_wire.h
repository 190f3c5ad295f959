// What the event streams' two ends share on ZeroMQ (docs/index.md, "Wire"):
// the process's one context and the 8-byte big-endian sequence numbers.
#ifndef PREFIXD_INDEX_ZMQ_WIRE_H_
#define PREFIXD_INDEX_ZMQ_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <zmq.hpp>

namespace prefixd {

// One context for the process, never destroyed: zmq_ctx_term blocks until
// every socket is closed, which exit-time destructors cannot promise.
inline zmq::context_t& ZmqContext() {
  static zmq::context_t* ctx = new zmq::context_t(1);
  return *ctx;
}

// The largest ZeroMQ message any of the index's sockets accepts
// (ZMQ_MAXMSGSIZE): a peer that sends more is disconnected by ZeroMQ
// before the message is buffered. vLLM's batches are one engine step's
// events, kilobytes to a few megabytes.
inline constexpr int64_t kMaxKvMessageBytes = int64_t{16} << 20;
// The messages each of the index's receiving sockets queues per peer
// (ZMQ_RCVHWM), so that it holds at most this many times
// kMaxKvMessageBytes for a peer however fast it sends. A full queue stops
// ZeroMQ reading the connection: the peer's own send queue (its SNDHWM;
// vLLM's is 100,000 batches) holds the rest, and nothing is dropped here.
// Engines send a few hundred batches a second at most; the index reads
// tens of thousands.
inline constexpr int kReceiveQueueMessages = 4;
// A sequence number as the wire carries it (-1, the end of a replay, is
// eight 0xff bytes).
inline std::string Be64(int64_t v) {
  std::string out(8, '\0');
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 7; i >= 0; --i) {
    out[static_cast<size_t>(i)] = static_cast<char>(u & 0xff);
    u >>= 8;
  }
  return out;
}

// The sequence number in a frame; nullopt unless it is 8 bytes.
inline std::optional<int64_t> ReadBe64(const zmq::message_t& m) {
  if (m.size() != 8) return std::nullopt;
  const auto* p = static_cast<const unsigned char*>(m.data());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return static_cast<int64_t>(v);
}

}  // namespace prefixd

#endif  // PREFIXD_INDEX_ZMQ_WIRE_H_
