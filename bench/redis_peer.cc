#include "bench/redis_peer.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace prefixd::bench {
namespace {

constexpr char kModel[] = "llama-3-8b";
constexpr char kPod[] = "10.0.0.1:8000";

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

absl::StatusOr<Context> ConnectBlocking(int port) {
  timeval tv{5, 0};
  Context c(redisConnectWithTimeout("127.0.0.1", port, tv));
  if (c == nullptr || c->err != 0) {
    return absl::UnavailableError(
        absl::StrCat("redis 127.0.0.1:", port, ": ",
                     c == nullptr ? "no memory" : c->errstr));
  }
  return c;
}

// FNV-1a 64 over the parent's hash and the block's tokens.
uint64_t ChainHash(uint64_t parent, uint64_t hash_id, int block_size) {
  uint64_t h = 14695981039346656037ULL;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ULL;
    }
  };
  mix(parent);
  for (int j = 0; j < block_size; ++j) mix(hash_id * block_size + j);
  return h;
}

std::string Format(const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  char* cmd = nullptr;
  const int n = redisFormatCommandArgv(&cmd, static_cast<int>(argv.size()),
                                       argv.data(), lens.data());
  std::string out(cmd, static_cast<size_t>(n));
  redisFreeCommand(cmd);
  return out;
}

// One connection's round trip: `depth` lookups, replies parsed in order.
struct Conn {
  Context ctx;
  Rng rng{1};
  int64_t sent_ns = 0;
  std::vector<size_t> batch;  // the lookups of this round trip
  size_t current = 0;         // lookup whose replies arrive now
  size_t replies = 0;         // llm-d: replies seen for `current`
  int matched = 0;
  bool broken = false;
  bool writing = false;
};

struct ThreadOut {
  uint64_t calls = 0, lookups = 0, errors = 0, all_calls = 0;
  std::string first_error;
  std::vector<int64_t> latency_ns;
};

class RedisLoop {
 public:
  RedisLoop(const std::vector<std::vector<std::string>>& lookups,
            const std::vector<int>& expected,
            const std::vector<std::string>& commands,
            const RedisDriveOptions& o, int64_t begin_ns, int64_t end_ns)
      : lookups_(lookups),
        expected_(expected),
        commands_(commands),
        o_(o),
        begin_ns_(begin_ns),
        end_ns_(end_ns) {}

  void Run(int port, int connections, uint64_t seed, ThreadOut* out) {
    out_ = out;
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    std::vector<std::unique_ptr<Conn>> conns;
    for (int i = 0; i < connections; ++i) {
      absl::StatusOr<Context> c = ConnectBlocking(port);
      if (!c.ok()) {
        Fail(std::string(c.status().message()));
        continue;
      }
      auto conn = std::make_unique<Conn>();
      conn->ctx = *std::move(c);
      conn->rng = Rng(seed * 31 + i);
      // Non-blocking from here on: hiredis then treats EAGAIN as "later".
      fcntl(conn->ctx->fd, F_SETFL, fcntl(conn->ctx->fd, F_GETFL) | O_NONBLOCK);
      conn->ctx->flags &= ~REDIS_BLOCK;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = conn.get();
      epoll_ctl(epoll_, EPOLL_CTL_ADD, conn->ctx->fd, &ev);
      conns.push_back(std::move(conn));
    }
    active_ = conns.size();
    for (auto& c : conns) Send(c.get());
    epoll_event events[64];
    while (active_ > 0) {
      const int n = epoll_wait(epoll_, events, 64, 1000);
      for (int i = 0; i < n; ++i) {
        Conn* c = static_cast<Conn*>(events[i].data.ptr);
        if (events[i].events & EPOLLOUT) Write(c);
        if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) Read(c);
      }
    }
    close(epoll_);
  }

 private:
  void Fail(const std::string& what) {
    ++out_->errors;
    if (out_->first_error.empty()) out_->first_error = what;
  }

  void Send(Conn* c) {
    c->batch.clear();
    for (int i = 0; i < o_.depth; ++i) {
      const size_t l = c->rng.Below(lookups_.size());
      c->batch.push_back(l);
      redisAppendFormattedCommand(c->ctx.get(), commands_[l].data(),
                                  commands_[l].size());
    }
    c->current = 0;
    c->replies = 0;
    c->matched = 0;
    c->broken = false;
    c->sent_ns = NowNs();
    Write(c);
  }

  void Write(Conn* c) {
    int done = 0;
    while (!done) {
      if (redisBufferWrite(c->ctx.get(), &done) != REDIS_OK) {
        Fail(c->ctx->errstr);
        Drop(c);
        return;
      }
      if (!done && errno == EAGAIN) break;
    }
    if (done == c->writing) {  // toggle EPOLLOUT only when it changes
      c->writing = !done;
      epoll_event ev{};
      ev.events = EPOLLIN | (done ? 0u : static_cast<uint32_t>(EPOLLOUT));
      ev.data.ptr = c;
      epoll_ctl(epoll_, EPOLL_CTL_MOD, c->ctx->fd, &ev);
    }
  }

  void Read(Conn* c) {
    if (redisBufferRead(c->ctx.get()) != REDIS_OK) {
      Fail(c->ctx->errstr);
      Drop(c);
      return;
    }
    void* raw = nullptr;
    while (redisGetReplyFromReader(c->ctx.get(), &raw) == REDIS_OK &&
           raw != nullptr) {
      Reply reply(static_cast<redisReply*>(raw));
      raw = nullptr;
      if (OnReply(c, *reply)) return;  // the round trip ended
    }
  }

  // Returns true when the connection's round trip is over (it may have
  // started the next one).
  bool OnReply(Conn* c, const redisReply& r) {
    const size_t l = c->batch[c->current];
    bool lookup_done = false;
    if (r.type == REDIS_REPLY_ERROR) {
      Fail(absl::StrCat("redis: ", std::string(r.str, r.len)));
    }
    if (o_.lookup == RedisLookup::kMget) {
      int n = 0;
      if (r.type == REDIS_REPLY_ARRAY) {
        while (n < static_cast<int>(r.elements) &&
               r.element[n]->type != REDIS_REPLY_NIL) {
          ++n;
        }
      }
      c->matched = n;
      lookup_done = true;
    } else {
      // llm-d stops at the first key without pods.
      const bool has = r.type == REDIS_REPLY_ARRAY && r.elements > 0;
      if (!c->broken && has) ++c->matched;
      if (!has) c->broken = true;
      lookup_done = ++c->replies == lookups_[l].size();
    }
    if (!lookup_done) return false;
    const int64_t now = NowNs();
    const bool in_window = now >= begin_ns_ && now <= end_ns_;
    if (in_window) {
      if (c->matched != expected_[l]) {
        Fail(absl::StrFormat("lookup %d: %d blocks found, %d expected", l,
                             c->matched, expected_[l]));
      } else {
        ++out_->lookups;
        out_->latency_ns.push_back(now - c->sent_ns);
      }
    }
    c->matched = 0;
    c->replies = 0;
    c->broken = false;
    if (++c->current < c->batch.size()) return false;
    ++out_->all_calls;
    if (in_window) ++out_->calls;
    if (now < end_ns_) {
      Send(c);
    } else {
      Drop(c);
    }
    return true;
  }

  void Drop(Conn* c) {
    epoll_ctl(epoll_, EPOLL_CTL_DEL, c->ctx->fd, nullptr);
    --active_;
  }

  const std::vector<std::vector<std::string>>& lookups_;
  const std::vector<int>& expected_;
  const std::vector<std::string>& commands_;
  const RedisDriveOptions& o_;
  const int64_t begin_ns_, end_ns_;
  int epoll_ = -1;
  size_t active_ = 0;
  ThreadOut* out_ = nullptr;
};

}  // namespace

absl::StatusOr<std::vector<std::vector<uint64_t>>> ReadHashIds(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::vector<std::vector<uint64_t>> out;
  std::string line;
  while (std::getline(in, line)) {
    const size_t key = line.find("\"hash_ids\"");
    if (key == std::string::npos) continue;
    const size_t open = line.find('[', key);
    const size_t close = line.find(']', open);
    if (open == std::string::npos || close == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", out.size() + 1, ": malformed hash_ids"));
    }
    std::vector<uint64_t> ids;
    for (absl::string_view v : absl::StrSplit(
             absl::string_view(line).substr(open + 1, close - open - 1), ',',
             absl::SkipWhitespace())) {
      uint64_t id;
      if (!absl::SimpleAtoi(v, &id)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", out.size() + 1, ": bad hash id ", v));
      }
      ids.push_back(id);
    }
    out.push_back(std::move(ids));
  }
  return out;
}

std::vector<std::string> ChainedKeys(const std::vector<uint64_t>& hash_ids,
                                     int block_size,
                                     std::vector<std::string>* cache) {
  std::vector<std::string> keys;
  uint64_t parent = 0;
  for (uint64_t id : hash_ids) {
    if (cache->size() <= id) cache->resize(id + 1);
    std::string& key = (*cache)[id];
    const uint64_t h = ChainHash(parent, id, block_size);
    if (key.empty()) key = absl::StrFormat("%s@%016x", kModel, h);
    keys.push_back(key);
    parent = h;
  }
  return keys;
}

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(
    const std::string& binary) {
  absl::StatusOr<int> port = FreeTcpPort();
  if (!port.ok()) return port.status();
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(
      {binary, "--port", absl::StrCat(*port), "--bind", "127.0.0.1", "--save",
       "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"});
  if (!p.ok()) return p.status();
  std::unique_ptr<RedisServer> server(new RedisServer(*std::move(p), *port));
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end) {
    absl::StatusOr<Context> c = ConnectBlocking(*port);
    if (c.ok()) {
      Reply r(static_cast<redisReply*>(redisCommand(c->get(), "PING")));
      if (r != nullptr && r->type == REDIS_REPLY_STATUS) return server;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::UnavailableError(
      absl::StrCat(binary, " did not answer PING on port ", *port));
}

RedisServer::~RedisServer() { process_->Stop(); }

absl::Status RedisServer::Populate(const std::vector<std::string>& keys) {
  absl::StatusOr<Context> c = ConnectBlocking(port_);
  if (!c.ok()) return c.status();
  constexpr size_t kChunk = 1000;
  for (size_t i = 0; i < keys.size(); i += kChunk) {
    const size_t end = std::min(keys.size(), i + kChunk);
    for (size_t k = i; k < end; ++k) {
      const std::string s = "s:" + keys[k];
      redisAppendCommand(c->get(), "HSET %b %s %s", keys[k].data(),
                         keys[k].size(), kPod, "2025-01-01T00:00:00Z");
      redisAppendCommand(c->get(), "SET %b %s", s.data(), s.size(), kPod);
    }
    for (size_t k = i; k < end; ++k) {
      for (int j = 0; j < 2; ++j) {
        void* raw = nullptr;
        if (redisGetReply(c->get(), &raw) != REDIS_OK) {
          return absl::InternalError((*c)->errstr);
        }
        Reply r(static_cast<redisReply*>(raw));
        if (r->type == REDIS_REPLY_ERROR) {
          return absl::InternalError(std::string(r->str, r->len));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RedisServer::UsedMemory() {
  absl::StatusOr<Context> c = ConnectBlocking(port_);
  if (!c.ok()) return c.status();
  Reply r(static_cast<redisReply*>(redisCommand(c->get(), "INFO memory")));
  if (r == nullptr || r->type != REDIS_REPLY_STRING) {
    return absl::InternalError("INFO memory failed");
  }
  for (absl::string_view line : absl::StrSplit(
           absl::string_view(r->str, r->len), absl::ByAnyChar("\r\n"))) {
    if (absl::ConsumePrefix(&line, "used_memory:")) {
      uint64_t v;
      if (absl::SimpleAtoi(line, &v)) return v;
    }
  }
  return absl::InternalError("no used_memory in INFO memory");
}

PhaseResult DriveRedis(int port,
                       const std::vector<std::vector<std::string>>& lookups,
                       const std::vector<int>& expected,
                       const RedisDriveOptions& o) {
  // Every lookup's command(s), formatted once: the clients measure Redis,
  // not hiredis's formatting.
  std::vector<std::string> commands;
  commands.reserve(lookups.size());
  for (const std::vector<std::string>& keys : lookups) {
    if (o.lookup == RedisLookup::kMget) {
      std::vector<std::string> args = {"MGET"};
      for (const std::string& k : keys) args.push_back("s:" + k);
      commands.push_back(Format(args));
    } else {
      std::string all;
      for (const std::string& k : keys) all += Format({"HKEYS", k});
      commands.push_back(std::move(all));
    }
  }
  const int threads = std::max(1, std::min(o.threads, o.connections));
  const int64_t start = NowNs();
  const int64_t begin = start + absl::ToInt64Nanoseconds(o.warmup);
  const int64_t end = begin + absl::ToInt64Nanoseconds(o.duration);
  std::vector<ThreadOut> outs(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    const int n = o.connections / threads + (t < o.connections % threads);
    workers.emplace_back([&, t, n] {
      RedisLoop loop(lookups, expected, commands, o, begin, end);
      loop.Run(port, n, o.seed * 7919 + t, &outs[t]);
    });
  }
  for (auto& w : workers) w.join();
  PhaseResult r;
  r.target = absl::StrCat("redis 127.0.0.1:", port);
  r.concurrency = o.connections;
  r.seconds = absl::ToDoubleSeconds(o.duration);
  std::vector<int64_t> latency;
  for (ThreadOut& t : outs) {
    r.calls += t.calls;
    r.lookups += t.lookups;
    r.errors += t.errors;
    r.all_calls += t.all_calls;
    if (r.first_error.empty()) r.first_error = t.first_error;
    latency.insert(latency.end(), t.latency_ns.begin(), t.latency_ns.end());
  }
  r.latency = Summarize(&latency);
  return r;
}

}  // namespace prefixd::bench
