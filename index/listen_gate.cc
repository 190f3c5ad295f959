#include "index/listen_gate.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>
#include <zmq_addon.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "index/zmq_wire.h"

namespace prefixd {
namespace {

constexpr char kMonitorEndpoint[] = "inproc://prefixd-listen-monitor";
// Any domain: ZeroMQ asks the ZAP handler about NULL-mechanism handshakes
// only on a socket that names one.
constexpr char kZapDomain[] = "prefixd-listen";

}  // namespace

ListenGate::ListenGate(size_t max_connections)
    : max_connections_(max_connections),
      context_(1),
      zap_(context_, zmq::socket_type::router),
      monitor_(context_, zmq::socket_type::pair),
      sub_(context_, zmq::socket_type::sub) {}

absl::StatusOr<std::unique_ptr<ListenGate>> ListenGate::Bind(
    const std::string& endpoint, bool ipv6, size_t max_connections,
    absl::Duration handshake_timeout) {
  std::unique_ptr<ListenGate> gate(new ListenGate(max_connections));
  zmq::socket_t& sub = gate->sub_;
  try {
    for (zmq::socket_t* s : {&gate->zap_, &gate->monitor_, &sub}) {
      s->set(zmq::sockopt::linger, 0);
    }
    gate->zap_.bind("inproc://zeromq.zap.01");
    // The monitor is connected before the socket is bound: no event is
    // sent before anyone reads them.
    if (zmq_socket_monitor(sub.handle(), kMonitorEndpoint,
                           ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
      throw zmq::error_t();
    }
    // Unbounded: a monitor event dropped at a full queue would leave the
    // count wrong for good (ZeroMQ drops them rather than wait).
    gate->monitor_.set(zmq::sockopt::rcvhwm, 0);
    gate->monitor_.connect(kMonitorEndpoint);
    if (ipv6) sub.set(zmq::sockopt::ipv6, 1);
    sub.set(zmq::sockopt::rcvhwm, kReceiveQueueMessages);
    sub.set(zmq::sockopt::maxmsgsize, kMaxKvMessageBytes);
    sub.set(zmq::sockopt::zap_domain, kZapDomain);
    sub.set(zmq::sockopt::handshake_ivl,
            static_cast<int>(std::max<int64_t>(
                1, absl::ToInt64Milliseconds(handshake_timeout))));
    sub.set(zmq::sockopt::subscribe, "");
    sub.bind(endpoint);
    gate->endpoint_ = sub.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat(
        "could not bind the index listen endpoint ", endpoint, ": ", e.what()));
  }
  return gate;
}

bool ListenGate::Poll(std::chrono::milliseconds timeout) {
  std::array<zmq::pollitem_t, 3> items = {{
      {sub_.handle(), 0, ZMQ_POLLIN, 0},
      {zap_.handle(), 0, ZMQ_POLLIN, 0},
      {monitor_.handle(), 0, ZMQ_POLLIN, 0},
  }};
  zmq::poll(items.data(), items.size(), timeout);
  if ((items[1].revents | items[2].revents) & ZMQ_POLLIN) AnswerHandshakes();
  return (items[0].revents & ZMQ_POLLIN) != 0;
}

void ListenGate::ReadMonitor() {
  std::vector<zmq::message_t> parts;
  while (zmq::recv_multipart(monitor_, std::back_inserter(parts),
                             zmq::recv_flags::dontwait)) {
    // [event (uint16) and value (uint32), little-endian; endpoint]
    uint16_t event = 0;
    if (!parts.empty() && parts[0].size() >= sizeof(event)) {
      std::memcpy(&event, parts[0].data(), sizeof(event));
    }
    size_t open = open_.load(std::memory_order_relaxed);
    if (event == ZMQ_EVENT_ACCEPTED) ++open;
    if (event == ZMQ_EVENT_DISCONNECTED && open > 0) --open;
    open_.store(open, std::memory_order_relaxed);
    parts.clear();
  }
}

void ListenGate::AnswerHandshakes() {
  ReadMonitor();
  std::vector<zmq::message_t> request;
  while (zmq::recv_multipart(zap_, std::back_inserter(request),
                             zmq::recv_flags::dontwait)) {
    // [peer, "", version, request id, domain, address, routing id,
    // mechanism]. The connection asking was accepted before it could ask:
    // its event is in the monitor's queue by now.
    ReadMonitor();
    if (request.size() < 4 ||
        open_.load(std::memory_order_relaxed) > max_connections_) {
      refused_.fetch_add(1, std::memory_order_relaxed);  // left to time out
    } else {
      std::array<zmq::const_buffer, 8> reply = {
          zmq::buffer(request[0].data(), request[0].size()),
          zmq::const_buffer(),
          zmq::str_buffer("1.0"),
          zmq::buffer(request[3].data(), request[3].size()),
          zmq::str_buffer("200"),
          zmq::str_buffer("OK"),
          zmq::const_buffer(),  // user id
          zmq::const_buffer(),  // metadata
      };
      (void)zmq::send_multipart(zap_, reply);
    }
    request.clear();
  }
}

}  // namespace prefixd
