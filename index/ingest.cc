#include "index/ingest.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "index/events.h"
#include "index/listen_gate.h"
#include "index/pool_resolver.h"
#include "index/sequence.h"
#include "index/wire_names.h"
#include "index/zmq_dial.h"
#include "index/zmq_wire.h"

namespace prefixd {
namespace {

struct HostPort {
  std::string host;
  std::string port;
};

// "tcp://HOST:PORT" -> HOST, PORT ([v6] brackets removed); nullopt if not.
std::optional<HostPort> SplitTcp(absl::string_view endpoint) {
  if (!absl::ConsumePrefix(&endpoint, "tcp://")) return std::nullopt;
  const size_t colon = endpoint.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return std::nullopt;
  absl::string_view host = endpoint.substr(0, colon);
  absl::string_view port = endpoint.substr(colon + 1);
  int p;
  if (port != "*" && (!absl::SimpleAtoi(port, &p) || p < 0 || p > 65535))
    return std::nullopt;
  if (absl::ConsumePrefix(&host, "[")) {
    if (!absl::ConsumeSuffix(&host, "]")) return std::nullopt;
  }
  return HostPort{std::string(host), std::string(port)};
}

// A decoded batch's vectors are kept for the next only after a payload of
// at most this size: what a runner keeps between batches, up to about 48
// times it (index/decode_budget.h; the budget bounds what runners decode
// at once, not what each keeps). Engines' batches are mostly smaller.
constexpr size_t kKeepDecodeCapacityBytes = size_t{64} << 10;

// The worker an engine names by its topic: `kv@<worker>@<model>` (llm-d's
// convention); any other topic names the worker as it is. SGLang with a
// snapshot endpoint appends, after a NUL, its publisher's epoch (and on a
// snapshot's barrier batch the snapshot's id): not part of the name.
std::string WorkerFromTopic(absl::string_view topic) {
  topic = topic.substr(0, topic.find('\0'));
  std::vector<absl::string_view> parts = absl::StrSplit(topic, '@');
  if (parts.size() >= 3 && parts[0] == "kv" && !parts[1].empty())
    return std::string(parts[1]);
  return topic.empty() ? "listen" : std::string(topic);
}

class StreamMonitor : public zmq::monitor_t {
 public:
  void on_event_connected(const zmq_event_t&, const char*) override {
    connected = true;
  }
  void on_event_disconnected(const zmq_event_t&, const char*) override {
    disconnected = true;
  }
  bool connected = false;
  bool disconnected = false;
};

using ReplayFrames = std::vector<std::pair<int64_t, std::string>>;

// How long a new connection waits for its first batch before it replays
// the engine's buffer anyway: long enough for a subscription to reach the
// engine, so that a busy engine's replay starts where the live stream does
// instead of racing it (a small replay buffer could roll over meanwhile).
constexpr absl::Duration kCatchUpGrace = absl::Milliseconds(250);

// One frame of a replay's answer, as a DEALER receives it. Publishers answer
// in one of two forms (docs/index.md, "Wire"), told apart by the number of
// parts:
//
//   SGLang, vLLM up to 0.25     ["", seq, payload]          end ["", -1, ""]
//   vLLM 0.26 and later         ["", topic, seq, payload]   end ["", "", -1,
//   ""]
//
// Returns the sequence number (-1: the end) and points *payload at the
// payload part.
absl::StatusOr<int64_t> ReplayFrame(const std::string& endpoint,
                                    std::vector<zmq::message_t>& parts,
                                    zmq::message_t** payload) {
  if ((parts.size() != 3 && parts.size() != 4) || parts[0].size() != 0) {
    return absl::DataLossError(absl::StrCat(
        "replay from ", endpoint, " answered a frame of ", parts.size(),
        " parts",
        parts.empty() || parts[0].size() == 0 ? "" : " (no delimiter)",
        ", neither [\"\", seq, payload] nor [\"\", topic, seq, payload]"));
  }
  const zmq::message_t& seq_part = parts[parts.size() - 2];
  std::optional<int64_t> seq = ReadBe64(seq_part);
  if (!seq.has_value()) {
    return absl::DataLossError(absl::StrCat("replay from ", endpoint,
                                            " sent a ", seq_part.size(),
                                            "-byte sequence number, not 8"));
  }
  if (*seq < -1) {
    return absl::DataLossError(
        absl::StrCat("replay from ", endpoint, " sent sequence number ", *seq));
  }
  *payload = &parts.back();
  return *seq;
}

// Asks a replay endpoint for batches from `from` on: `["", from]` to its
// ROUTER, which answers one frame per buffered batch and an end marker
// (ReplayFrame).
absl::StatusOr<ReplayFrames> FetchReplay(const std::string& endpoint,
                                         int64_t from,
                                         const IngestOptions& options) {
  const absl::Duration timeout = options.replay_timeout;
  zmq::socket_t dealer(ZmqContext(), zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::ipv6, DialsIpv6(endpoint));
  dealer.set(zmq::sockopt::maxmsgsize, kMaxKvMessageBytes);
  dealer.set(zmq::sockopt::rcvhwm, kReceiveQueueMessages);
  dealer.connect(endpoint);
  const std::string start = Be64(from);  // outlives the send
  std::array<zmq::const_buffer, 2> request = {zmq::const_buffer("", 0),
                                              zmq::buffer(start)};
  if (!zmq::send_multipart(dealer, request, zmq::send_flags::dontwait)) {
    // The request is queued until the connection is up; a full queue means
    // no peer at all.
  }
  ReplayFrames frames;
  int64_t bytes = 0;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("replay from ", endpoint, " did not finish within ",
                       absl::FormatDuration(timeout), " (", frames.size(),
                       " batches received)"));
    }
    zmq::pollitem_t item{static_cast<void*>(dealer), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1,
              std::chrono::milliseconds(
                  std::max<int64_t>(1, absl::ToInt64Milliseconds(left))));
    if ((item.revents & ZMQ_POLLIN) == 0) continue;
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(dealer, std::back_inserter(parts),
                             zmq::recv_flags::dontwait)) {
      continue;
    }
    zmq::message_t* payload = nullptr;
    ASSIGN_OR_RETURN(const int64_t seq, ReplayFrame(endpoint, parts, &payload));
    if (seq == -1) return frames;
    bytes += static_cast<int64_t>(payload->size());
    if (bytes > options.max_replay_bytes ||
        frames.size() >= options.max_replay_batches) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "replay from ", endpoint, " brought more than ",
          options.max_replay_batches, " batches or ", options.max_replay_bytes,
          " bytes (", frames.size() + 1, " batches, ", bytes, " bytes)"));
    }
    frames.emplace_back(seq, payload->to_string());
  }
}

}  // namespace

absl::Status CheckEndpoint(absl::string_view what, absl::string_view ep) {
  if (absl::StartsWith(ep, "ipc://") || absl::StartsWith(ep, "inproc://"))
    return absl::OkStatus();
  if (!SplitTcp(ep).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " \"", ep, "\" is not tcp://HOST:PORT (or ipc://PATH)"));
  }
  return absl::OkStatus();
}

// Whether `s` is pinned and named as the index names the sources of an
// SGLang worker followed by URL: <name>/dp<r> for its rank r > 0, and
// <name>/<host>:<port> (rank 0) or <name>/<host>:<port>/dp<r> for a worker
// of a pool.
bool NamedAsSglangRank(const IndexSource& s) {
  if (!s.pinned) return false;
  absl::string_view rest = s.name;
  const size_t slash = rest.find('/');
  if (slash == 0 || slash == absl::string_view::npos) return false;
  rest.remove_prefix(slash + 1);
  const std::string rank = absl::StrCat("dp", s.labels.dp_rank);
  if (s.labels.dp_rank > 0 && !absl::ConsumeSuffix(&rest, rank)) return false;
  if (s.labels.dp_rank > 0 && rest.empty()) return true;  // <name>/dp<r>
  if (s.labels.dp_rank > 0 && !absl::ConsumeSuffix(&rest, "/")) return false;
  return !rest.empty() && absl::StrContains(rest, ':') &&
         !absl::StrContains(rest, '/');
}

absl::Status ValidateIndexSource(const IndexSource& s) {
  if (s.name.empty() ||
      (absl::StrContains(s.name, '/') && !NamedAsSglangRank(s))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index source name \"", s.name,
        "\" must be non-empty and contain no '/' (it names the worker; "
        "only the index names sources <name>/dp<r> and <name>/<host>:<port>)"));
  }
  RETURN_IF_ERROR(CheckEndpoint(
      absl::StrCat("index source ", s.name, " endpoint"), s.endpoint));
  if (!s.replay_endpoint.empty()) {
    RETURN_IF_ERROR(
        CheckEndpoint(absl::StrCat("index source ", s.name, " replay_endpoint"),
                      s.replay_endpoint));
  }
  if (s.replay_port < 0 || s.replay_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("index source ", s.name, " replay_port ", s.replay_port,
                     " is not a port (0-65535)"));
  }
  const bool pool =
      s.replay_port != 0 || s.resolve_interval > absl::ZeroDuration();
  if (pool && !SplitTcp(s.endpoint).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("index source ", s.name,
                     " is a pool (replay_port or "
                     "resolve_interval set) but its endpoint \"",
                     s.endpoint, "\" is not tcp://HOST:PORT"));
  }
  if (pool && s.pinned) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index source ", s.name,
        " is a pool (replay_port or resolve_interval set) and names one "
        "instance (instance_id): a registration follows one engine"));
  }
  if (s.labels.dp_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("index source ", s.name, " dp_rank ", s.labels.dp_rank,
                     " is negative"));
  }
  return absl::OkStatus();
}

absl::Status ValidateIngestOptions(const IngestOptions& o) {
  absl::flat_hash_map<std::string, int> names;
  for (const IndexSource& s : o.sources) {
    RETURN_IF_ERROR(ValidateIndexSource(s));
    if (++names[s.name] > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("index source name \"", s.name, "\" is used twice"));
    }
  }
  if (!o.listen.empty()) {
    if (absl::Status st = CheckEndpoint("index listen", o.listen); !st.ok())
      return st;
  }
  if (o.decode_budget_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index decode_budget ", o.decode_budget_bytes, " must be positive"));
  }
  if (o.replay_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index replay_timeout ", absl::FormatDuration(o.replay_timeout),
        " must be positive"));
  }
  return absl::OkStatus();
}

// One thread: a source (one engine, or a pool of them) or the listen
// socket, with every stream it reads.
class Ingest::Runner {
 public:
  // A source.
  Runner(KvIndex* index, const IngestOptions& options, DecodeBudget* budget,
         IndexSource source)
      : index_(index),
        options_(options),
        budget_(budget),
        source_(std::move(source)) {}
  // The listen socket, already bound.
  Runner(KvIndex* index, const IngestOptions& options, DecodeBudget* budget,
         std::unique_ptr<ListenGate> listen)
      : index_(index),
        options_(options),
        budget_(budget),
        listen_(std::move(listen)) {}
  ~Runner() { Stop(); }

  void Start() {
    if (listen_ == nullptr) Setup();
    thread_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    stop_ = true;
    budget_->WakeWaiters();  // a decode waiting for its turn gives up
    if (thread_.joinable()) thread_.join();
  }
  // After Stop: every worker of the source leaves the index.
  void RetireAll() {
    for (const auto& [key, s] : streams_)
      for (const auto& [rank, w] : s->workers) index_->RetireWorker(w);
  }
  const IndexSource& source() const { return source_; }
  // A pool's resolver (set before the thread starts, never replaced); null
  // for a single source.
  const PoolResolver* resolver() const {
    return resolver_.has_value() ? &*resolver_ : nullptr;
  }
  // The listen socket's gate; null for a source.
  const ListenGate* listen_gate() const { return listen_.get(); }

 private:
  struct Stream {
    std::string name;  // the worker of rank 0; rank r is name/dp<r>
    std::string endpoint;
    std::string replay_endpoint;
    std::unique_ptr<zmq::socket_t> sub;  // null: reads the listen socket
    std::unique_ptr<StreamMonitor> monitor;
    SeqTracker seq;
    std::map<int64_t, WorkerId> workers;  // by data-parallel rank
    // Until a batch names its rank, the stream is listed as worker `name`
    // (rank 0); a stream whose first batch is of rank r > 0 (one stream per
    // rank, as vLLM's port offsets make them) drops that worker.
    bool rank_known = false;
    // The catch-up of a new connection: done with the first batch that
    // arrives (replaying only what came before it), or at this time if
    // none has (an idle engine with a history).
    absl::Time catch_up_at = absl::InfiniteFuture();
    absl::Time last_heard = absl::InfinitePast();  // listen streams
  };

  void Setup() {
    const std::optional<HostPort> hp = SplitTcp(source_.endpoint);
    pool_ = source_.replay_port != 0 ||
            source_.resolve_interval > absl::ZeroDuration();
    if (!pool_ && hp.has_value() && ResolvesToSeveral(hp->host)) pool_ = true;
    if (!pool_) {
      AddStream(source_.name, source_.endpoint, source_.replay_endpoint);
      return;
    }
    resolve_interval_ = source_.resolve_interval > absl::ZeroDuration()
                            ? source_.resolve_interval
                            : options_.default_resolve_interval;
    resolver_.emplace(
        source_.name,
        absl::StrCat("pool ", source_.name, " (", source_.endpoint, ")"),
        hp->host);
    Resolve();
  }

  // Pools: one stream per address; addresses that went away retire. A
  // lookup that was not answered changes nothing (index/pool_resolver.h).
  void Resolve() {
    next_resolve_ = absl::Now() + resolve_interval_;
    const HostPort hp = *SplitTcp(source_.endpoint);
    const std::optional<std::vector<std::string>> answer = resolver_->Next();
    if (!answer.has_value()) return;
    const std::vector<std::string>& now = *answer;
    absl::flat_hash_map<std::string, bool> keep;
    for (const std::string& addr : now) {
      const std::string key = JoinHostPort(addr, hp.port);
      keep[key] = true;
      if (streams_.contains(key)) continue;
      const std::string replay =
          source_.replay_port != 0
              ? absl::StrCat(
                    "tcp://",
                    JoinHostPort(addr, absl::StrCat(source_.replay_port)))
              : "";
      AddStream(absl::StrCat(source_.name, "/", key),
                absl::StrCat("tcp://", key), replay, key);
    }
    for (auto it = streams_.begin(); it != streams_.end();) {
      if (keep.contains(it->first)) {
        ++it;
        continue;
      }
      for (const auto& [rank, w] : it->second->workers) index_->RetireWorker(w);
      streams_.erase(it++);
    }
  }

  // A worker for a new topic on the listen socket, unless
  // max_listen_workers exist and none has been heard from for listen_idle
  // (the longest idle one then makes room: retired, its blocks dropped);
  // null if full.
  Stream* AddListenStream(const std::string& worker) {
    if (streams_.size() >= options_.max_listen_workers) {
      auto idle = std::min_element(
          streams_.begin(), streams_.end(), [](const auto& a, const auto& b) {
            return a.second->last_heard < b.second->last_heard;
          });
      if (idle == streams_.end() ||
          absl::Now() - idle->second->last_heard < options_.listen_idle) {
        return nullptr;
      }
      for (const auto& [rank, w] : idle->second->workers) {
        index_->RetireWorker(w);
      }
      streams_.erase(idle);
    }
    return AddStream(worker, listen_->endpoint(), "");
  }

  Stream* AddStream(std::string name, std::string endpoint, std::string replay,
                    std::string key = "") {
    auto s = std::make_unique<Stream>();
    s->name = std::move(name);
    s->endpoint = std::move(endpoint);
    s->replay_endpoint = std::move(replay);
    s->workers[0] = NewWorker(s->name, s->endpoint, source_.labels.dp_rank);
    if (listen_ == nullptr) {
      s->sub =
          std::make_unique<zmq::socket_t>(ZmqContext(), zmq::socket_type::sub);
      s->sub->set(zmq::sockopt::linger, 0);
      s->sub->set(zmq::sockopt::ipv6, DialsIpv6(s->endpoint));
      s->sub->set(zmq::sockopt::rcvhwm, kReceiveQueueMessages);
      s->sub->set(zmq::sockopt::maxmsgsize, kMaxKvMessageBytes);
      s->sub->set(zmq::sockopt::subscribe, "");
      s->monitor = std::make_unique<StreamMonitor>();
      static std::atomic<uint64_t> next_monitor{0};
      s->monitor->init(*s->sub,
                       absl::StrCat("inproc://prefixd-index-monitor-",
                                    next_monitor.fetch_add(1)),
                       ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED);
      s->sub->connect(s->endpoint);
    }
    Stream* raw = s.get();
    streams_[key.empty() ? raw->name : key] = std::move(s);
    return raw;
  }

  void Loop() {
    const auto timeout = std::chrono::milliseconds(std::max<int64_t>(
        1, absl::ToInt64Milliseconds(options_.poll_interval)));
    while (!stop_) {
      if (pool_ && absl::Now() >= next_resolve_) Resolve();
      if (listen_ != nullptr) {
        PollListen(timeout);
      } else {
        PollStreams(timeout);
      }
    }
  }

  void PollListen(std::chrono::milliseconds timeout) {
    const bool readable = listen_->Poll(timeout);
    for (int i = 0; i < 1024 && readable; ++i) {
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(listen_->socket(), std::back_inserter(parts),
                               zmq::recv_flags::dontwait)) {
        break;
      }
      if (parts.size() != 3) continue;  // not [topic, seq, payload]
      const std::string worker =
          SafeWireName(WorkerFromTopic(parts[0].to_string()));
      auto it = streams_.find(worker);
      Stream* s =
          it != streams_.end() ? it->second.get() : AddListenStream(worker);
      if (s == nullptr) continue;  // full: the topic is not followed
      s->last_heard = absl::Now();
      Receive(*s, parts);
    }
  }

  void PollStreams(std::chrono::milliseconds timeout) {
    std::vector<zmq::pollitem_t> items;
    std::vector<Stream*> order;
    for (auto& [key, s] : streams_) {
      items.push_back({static_cast<void*>(*s->sub), 0, ZMQ_POLLIN, 0});
      order.push_back(s.get());
    }
    if (items.empty()) {
      std::this_thread::sleep_for(timeout);
      return;
    }
    zmq::poll(items, timeout);
    for (size_t i = 0; i < order.size(); ++i) {
      Stream& s = *order[i];
      CheckConnection(s);
      // A bounded number per wake-up, so one busy engine cannot starve the
      // others' monitors.
      for (int n = 0; n < 1024; ++n) {
        std::vector<zmq::message_t> parts;
        if (!zmq::recv_multipart(*s.sub, std::back_inserter(parts),
                                 zmq::recv_flags::dontwait)) {
          break;
        }
        // [topic, seq, payload]; publishers without a topic send two.
        if (parts.size() == 2) parts.insert(parts.begin(), zmq::message_t());
        if (parts.size() != 3) continue;
        Receive(s, parts);
      }
      // After reading what arrived: a batch that did so made the catch-up.
      if (absl::Now() >= s.catch_up_at) {
        s.catch_up_at = absl::InfiniteFuture();
        Replay(s, /*catch_up=*/true);
      }
    }
  }

  // What the stream's monitor saw since the last poll: a disconnection, or
  // a connection (a first one or one that came back).
  void CheckConnection(Stream& s) {
    s.monitor->check_event(0);
    if (s.monitor->disconnected) {
      s.monitor->disconnected = false;
      SetAll(s, WorkerState::kConnecting,
             absl::StrCat("disconnected from ", s.endpoint));
    }
    if (s.monitor->connected) {
      // Connected: catch up on what the engine still buffers; without a
      // replay endpoint, what it cached before now stays unknown (the
      // index under-reports it, never the reverse). A connection that
      // comes back may be a restarted engine whose new numbers already
      // passed ours, which no sequence check could tell from a
      // continuation: start over from its whole replay buffer instead.
      s.monitor->connected = false;
      if (s.seq.last() >= 0) {
        ClearAll(s, ClearReason::kReconnect,
                 absl::StrCat("reconnected to ", s.endpoint,
                              ": rebuilt from the engine's replay buffer"));
        s.seq.Reset();
      }
      if (!s.replay_endpoint.empty()) {
        s.catch_up_at = absl::Now() + kCatchUpGrace;
      } else {
        SetAll(s, WorkerState::kLive, "");
      }
    }
  }

  void Receive(Stream& s, std::vector<zmq::message_t>& parts) {
    const std::optional<int64_t> seq = ReadBe64(parts[1]);
    if (!seq.has_value() || *seq < 0) {
      ClearAll(s, ClearReason::kUndecodable,
               absl::StrCat("a batch's sequence number is ", parts[1].size(),
                            " bytes, not 8"));
      return;
    }
    const absl::string_view payload(static_cast<const char*>(parts[2].data()),
                                    parts[2].size());
    if (s.catch_up_at != absl::InfiniteFuture()) {
      // The first batch of a new connection: what the engine published
      // before it comes from the replay buffer; batch 0 needs none.
      s.catch_up_at = absl::InfiniteFuture();
      if (*seq > 0 && s.seq.last() < 0) {
        Replay(s, /*catch_up=*/true);
        if (s.seq.last() >= *seq) return;  // the replay brought this batch
      }
    }
    switch (s.seq.Classify(*seq)) {
      case SeqTracker::Verdict::kDuplicate:
        return;
      case SeqTracker::Verdict::kRestart:
        ClearAll(s, ClearReason::kRestart,
                 absl::StrCat("sequence went back from ", s.seq.last(), " to ",
                              *seq, ": the engine restarted"));
        s.seq.Reset();
        break;
      case SeqTracker::Verdict::kGap:
        for (const auto& [rank, w] : s.workers) index_->CountGap(w);
        Replay(s, /*catch_up=*/false);
        if (s.seq.last() >= *seq) return;  // the replay brought this batch
        if (s.seq.Classify(*seq) == SeqTracker::Verdict::kGap) {
          // The replay ended before this batch: still a hole.
          ClearAll(s, ClearReason::kReplayFailed,
                   absl::StrCat("replay ended at batch ", s.seq.last(),
                                ", before batch ", *seq));
          s.seq.Reset();
        }
        break;
      case SeqTracker::Verdict::kApply:
        break;
    }
    DecodeApply(s, *seq, payload);
    s.seq.Applied(*seq);
  }

  // Fetches the batches after the last applied one and applies them. A
  // catch-up (on connect) takes whatever the engine still buffers. A gap
  // must be filled from its first missing batch; if it cannot be, the
  // stream's workers are cleared, the sequence starts over, and what the
  // replay did bring is applied as new events.
  void Replay(Stream& s, bool catch_up) {
    const int64_t from = s.seq.last() + 1;
    absl::StatusOr<ReplayFrames> frames =
        absl::UnavailableError("the source has no replay endpoint");
    if (!s.replay_endpoint.empty()) {
      SetAll(s, WorkerState::kReplaying,
             absl::StrCat(catch_up ? "catching up" : "filling a gap",
                          ": replaying from batch ", from, " from ",
                          s.replay_endpoint));
      frames = FetchReplay(s.replay_endpoint, from, options_);
    }
    const bool filled =
        frames.ok() &&
        (frames->empty() ? catch_up || s.seq.last() < 0
                         : frames->front().first <= from || s.seq.last() < 0);
    if (!filled && !s.replay_endpoint.empty())
      for (const auto& [rank, w] : s.workers) index_->CountReplay(w, false);
    if (!filled) {
      if (catch_up && !frames.ok()) {
        SetAll(s, WorkerState::kConnecting, frames.status().message());
        return;
      }
      ClearAll(s, ClearReason::kReplayFailed,
               frames.ok()
                   ? absl::StrCat("batch ", from,
                                  " is gone from the replay buffer "
                                  "of ",
                                  s.replay_endpoint)
                   : absl::StrCat("batches from ", from,
                                  " were lost: ", frames.status().message()));
      s.seq.Reset();
      if (!frames.ok()) return;
    }
    // Joined late: what the engine stored before its oldest buffered
    // batch is unknown (blocks extending it are dropped as unknown
    // parents) until the engine stores it again.
    const bool late = catch_up && s.seq.last() < 0 && !frames->empty() &&
                      frames->front().first > 0;
    const int64_t joined_at = late ? frames->front().first : 0;
    s.seq.BeginReplay();
    bool applied = true;  // the last batch applied, or none came
    for (const auto& [seq, payload] : *frames) {
      if (s.seq.last() >= 0 && seq <= s.seq.last()) continue;
      applied = DecodeApply(s, seq, payload);
      s.seq.ReplayApplied(seq);
    }
    // Counted once the batches named their ranks: a catch-up's first batch
    // may replace the stream's placeholder worker (WorkerFor).
    if (filled)
      for (const auto& [rank, w] : s.workers) index_->CountReplay(w, true);
    // Caught up: LIVE, with what it could not recover said.
    if (applied) {
      SetAll(s, WorkerState::kLive,
             late ? absl::StrCat("joined at batch ", joined_at,
                                 ": blocks the engine stored before it are "
                                 "not indexed until stored again")
                  : "");
    }
  }

  // False if the payload did not decode (the stream's workers are cleared)
  // or the runner is stopping. Every batch of every path (live, replayed,
  // listen) is decoded here, within the daemon's decode budget.
  bool DecodeApply(Stream& s, int64_t seq, absl::string_view payload) {
    const DecodeBudget::Reservation reservation =
        budget_->Reserve(DecodePeakEstimate(payload.size()), stop_);
    if (!reservation.held()) return false;  // stopping: nothing changes
    if (absl::Status st = DecodeEventBatch(payload, &batch_); !st.ok()) {
      ClearAll(
          s, ClearReason::kUndecodable,
          absl::StrCat("batch ", seq, " could not be decoded: ", st.message()));
      for (const auto& [rank, w] : s.workers) index_->SetLastSeq(w, seq);
      return false;
    }
    index_->Apply(WorkerFor(s, batch_.data_parallel_rank.value_or(0)), batch_,
                  seq, absl::Now());
    // batch_ keeps its vectors' capacity for the next batch, but not what
    // an unusually large one needed.
    if (payload.size() > kKeepDecodeCapacityBytes) batch_ = KvEventBatch();
    return true;
  }

  // A worker of the source, labelled as its registration says.
  WorkerId NewWorker(absl::string_view name, absl::string_view endpoint,
                     int64_t rank) {
    const WorkerId w = index_->AddWorker(name, endpoint);
    WorkerLabels labels = source_.labels;
    labels.dp_rank = rank;
    index_->SetLabels(w, labels);
    return w;
  }

  WorkerId WorkerFor(Stream& s, int64_t rank) {
    if (source_.pinned) return s.workers.begin()->second;
    if (!s.rank_known) {
      s.rank_known = true;
      auto first = s.workers.find(0);
      if (rank != 0 && first != s.workers.end()) {
        index_->RetireWorker(first->second);
        s.workers.erase(first);
      }
    }
    auto it = s.workers.find(rank);
    if (it != s.workers.end()) return it->second;
    const WorkerId w =
        NewWorker(rank == 0 ? s.name : absl::StrCat(s.name, "/dp", rank),
                  s.endpoint, rank);
    s.workers[rank] = w;
    return w;
  }

  void ClearAll(Stream& s, ClearReason reason, absl::string_view detail) {
    for (const auto& [rank, w] : s.workers)
      index_->ClearWorker(w, reason, detail);
  }
  void SetAll(Stream& s, WorkerState state, absl::string_view detail) {
    for (const auto& [rank, w] : s.workers) index_->SetState(w, state, detail);
  }

  KvIndex* const index_;
  const IngestOptions& options_;
  DecodeBudget* const budget_;  // the Ingest's, shared by every runner
  IndexSource source_;
  std::unique_ptr<ListenGate> listen_;
  bool pool_ = false;
  std::optional<PoolResolver> resolver_;  // pools; set in Setup
  absl::Duration resolve_interval_;
  absl::Time next_resolve_ = absl::InfiniteFuture();
  std::map<std::string, std::unique_ptr<Stream>> streams_;
  KvEventBatch batch_;  // reused: its vectors keep their capacity
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<Ingest>> Ingest::Start(KvIndex* index,
                                                      IngestOptions options) {
  if (absl::Status s = ValidateIngestOptions(options); !s.ok()) return s;
  std::unique_ptr<Ingest> ingest(new Ingest());
  std::vector<IndexSource> sources = std::move(options.sources);
  options.sources.clear();
  ingest->options_ = std::move(options);
  ingest->index_ = index;
  ingest->decode_budget_ =
      std::make_unique<DecodeBudget>(ingest->options_.decode_budget_bytes);
  const IngestOptions& o = ingest->options_;
  if (!o.listen.empty()) {
    // IPv6 only when asked for: with it on, a v4 address is reported back
    // v4-mapped ([::ffff:127.0.0.1]).
    const std::optional<HostPort> hp = SplitTcp(o.listen);
    const bool ipv6 =
        hp.has_value() && (absl::StrContains(hp->host, ':') || hp->host == "*");
    absl::StatusOr<std::unique_ptr<ListenGate>> gate = ListenGate::Bind(
        o.listen, ipv6, o.max_listen_connections, o.listen_handshake_timeout);
    if (!gate.ok()) return gate.status();
    ingest->listen_endpoint_ = (*gate)->endpoint();
    MutexLock lock(&ingest->mu_);
    ingest->listen_runner_ = std::make_unique<Runner>(
        index, o, ingest->decode_budget_.get(), *std::move(gate));
    ingest->listen_runner_->Start();
  }
  for (IndexSource& s : sources) {
    RETURN_IF_ERROR(ingest->AddSource(std::move(s)));
  }
  return ingest;
}

uint64_t Ingest::listen_connections_refused() const {
  MutexLock lock(&mu_);
  if (listen_runner_ == nullptr) return 0;
  return listen_runner_->listen_gate()->refused();
}

absl::Status Ingest::AddSource(IndexSource source) {
  RETURN_IF_ERROR(ValidateIndexSource(source));
  MutexLock lock(&mu_);
  if (stopped_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "index source ", source.name, " cannot start: ingestion stopped"));
  }
  if (runners_.contains(source.name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("index source name \"", source.name, "\" is in use"));
  }
  const std::string name = source.name;
  auto runner = std::make_unique<Runner>(index_, options_, decode_budget_.get(),
                                         std::move(source));
  runner->Start();
  runners_.emplace(name, std::move(runner));
  return absl::OkStatus();
}

// The runner stops and its workers retire under the lock, so that a source
// of the same name added next cannot have its workers retired by this one.
absl::Status Ingest::RemoveSource(absl::string_view name) {
  MutexLock lock(&mu_);
  auto it = runners_.find(name);
  if (it == runners_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no index source is named \"", name, "\""));
  }
  it->second->Stop();
  it->second->RetireAll();
  runners_.erase(it);
  return absl::OkStatus();
}

std::vector<IndexSource> Ingest::Sources() const {
  MutexLock lock(&mu_);
  std::vector<IndexSource> out;
  for (const auto& [name, r] : runners_) out.push_back(r->source());
  return out;
}

std::vector<PoolLookups> Ingest::pool_lookups() const {
  MutexLock lock(&mu_);
  std::vector<PoolLookups> out;
  for (const auto& [name, r] : runners_) {
    if (const PoolResolver* p = r->resolver()) out.push_back(p->lookups());
  }
  return out;
}

Ingest::~Ingest() { Stop(); }

void Ingest::Stop() {
  MutexLock lock(&mu_);
  stopped_ = true;
  for (auto& [name, r] : runners_) r->Stop();
  runners_.clear();
  if (listen_runner_ != nullptr) listen_runner_->Stop();
  listen_runner_.reset();
}

}  // namespace prefixd
