// ListenGate: the fleet index's `listen` socket (a SUB socket that engines
// connect to) with a bound on the connections it keeps at once.
//
// ZeroMQ has no connection limit of its own, and every connection to a SUB
// socket may hold kReceiveQueueMessages messages of up to kMaxKvMessageBytes
// (index/zmq_wire.h) and one more being received. The gate counts the
// socket's TCP connections from its monitor (accepted, disconnected: every
// open connection, admitted or not) and answers the ZAP requests (ZeroMQ's
// RFC 27) that their handshakes make: a connection is admitted only if the
// open ones, itself included, are at most `max_connections`, so no more
// than that many are ever admitted. One that is not gets no answer, so its
// peer cannot send anything; ZeroMQ closes it when `handshake_timeout`
// passes, and the peer's ZeroMQ connects again (a refusal, status 400,
// would end the peer's session for good: libzmq does not reconnect after
// a failed handshake). Until then it counts as open: near the limit, a
// connection may wait a timeout or two for one that left to be counted.
//
// The socket, its ZAP handler and its monitor live in a ZeroMQ context of
// the gate's own, since a context has one ZAP endpoint
// (inproc://zeromq.zap.01) and several indexes may share a process.
//
// Thread safety: the sockets are made on the thread that calls Bind and
// then used by one thread at a time (Ingest's listen runner, which polls
// them with Poll). refused() and open() may be read from any thread.
#ifndef PREFIXD_INDEX_LISTEN_GATE_H_
#define PREFIXD_INDEX_LISTEN_GATE_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <zmq.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace prefixd {

class ListenGate {
 public:
  // The SUB socket bound to `endpoint` (tcp://host:port; port * picks
  // one; IPv6 addresses too with `ipv6`), subscribed to everything,
  // admitting at most `max_connections` connections at once. UNAVAILABLE
  // naming the endpoint if it cannot be bound.
  static absl::StatusOr<std::unique_ptr<ListenGate>> Bind(
      const std::string& endpoint, bool ipv6, size_t max_connections,
      absl::Duration handshake_timeout);
  ListenGate(const ListenGate&) = delete;
  ListenGate& operator=(const ListenGate&) = delete;

  zmq::socket_t& socket() { return sub_; }
  // The bound endpoint, with a wildcard port resolved.
  const std::string& endpoint() const { return endpoint_; }

  // Waits up to `timeout` for messages on the socket, answering the
  // handshakes that wait for the gate meanwhile; true if the socket has
  // messages to receive.
  bool Poll(std::chrono::milliseconds timeout);

  // Handshakes left unanswered so far; connections open now (counted from
  // the monitor's events the last Poll read).
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  size_t open() const { return open_.load(std::memory_order_relaxed); }

 private:
  explicit ListenGate(size_t max_connections);
  // Counts the monitor's waiting events into open_.
  void ReadMonitor();
  // Answers every ZAP request waiting that may be admitted.
  void AnswerHandshakes();

  const size_t max_connections_;
  // Declared first: destroyed last, once its sockets are closed.
  zmq::context_t context_;
  zmq::socket_t zap_;      // ROUTER (answers in any order, or not at all),
                           // bound to the context's ZAP endpoint
  zmq::socket_t monitor_;  // PAIR, connected to sub_'s monitor
  zmq::socket_t sub_;
  std::string endpoint_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<size_t> open_{0};
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_LISTEN_GATE_H_
