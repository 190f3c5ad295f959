// prefixd::Client against the real server, in-process on port 0 and a Unix
// socket: the library's promises (leases released on destruction, errors
// mapped with code and message, epoch change across a daemon restart, health
// during shutdown) hold end to end, not only against client_test's fake.
// The fleet index's calls (Route, RouteBatch, ListWorkers) too: refused as
// UNIMPLEMENTED without an index, answered with one source configured.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/prefixctl_cli.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "server/flags.h"
#include "server/server.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<uint32_t> Tokens(uint32_t first, uint32_t last) {
  std::vector<uint32_t> t;
  for (uint32_t i = first; i <= last; ++i) t.push_back(i);
  return t;
}

PrefixOptions Pinned() {
  PrefixOptions o;
  o.pin = true;
  return o;
}

ClientOptions ForTenant(const std::string& tenant) {
  ClientOptions o;
  o.tenant = tenant;
  return o;
}

class ClientServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = absl::StrCat(::testing::TempDir(), "/client_server_test.",
                           getpid(), ".sock");
    server_ = StartServer(std::nullopt);
  }

  // config_text: a textproto config file for the daemon ("": none).
  std::unique_ptr<Server> StartServer(std::optional<uint64_t> epoch,
                                      const std::string& config_text = "") {
    CommandLine flags;
    if (!config_text.empty()) {
      const std::string path = absl::StrCat(
          ::testing::TempDir(), "/client_server_test.", getpid(), ".textproto");
      std::ofstream(path) << config_text;
      flags.config_paths = {path};
    }
    flags.listen = {"127.0.0.1:0", "unix://" + socket_};
    flags.metrics_listen = "127.0.0.1:0";
    absl::StatusOr<ServerConfig> config = LoadServerConfig(flags);
    EXPECT_TRUE(config.ok()) << config.status();
    config->drain_timeout = absl::Seconds(5);
    ServerDeps deps;
    deps.epoch = epoch;
    absl::StatusOr<std::unique_ptr<Server>> server =
        Server::Start(*std::move(config), std::move(deps));
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  std::unique_ptr<Client> Connect(ClientOptions options = {},
                                  bool unix_socket = false) {
    auto client = Client::Connect(server_->addresses()[unix_socket ? 1 : 0],
                                  std::move(options));
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  uint64_t ActiveLeases(Client* client) {
    auto stats = client->Stats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    uint64_t leases = 0;
    for (const auto& t : stats->tenants()) leases += t.active_leases();
    return leases;
  }

  std::string socket_;
  std::unique_ptr<Server> server_;
};

TEST_F(ClientServerTest, InsertThenMatchOverTcpAndUnix) {
  auto tcp = Connect();
  auto ins = tcp->Insert(Tokens(1, 32), std::vector<uint64_t>{100, 101});
  ASSERT_TRUE(ins.ok()) << ins.status();
  EXPECT_EQ(ins->response.cached_tokens(), 0u);
  EXPECT_EQ(ins->response.epoch(), server_->epoch());

  auto unix_client = Connect({}, /*unix_socket=*/true);
  auto m = unix_client->Match(Tokens(1, 40));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->matched_tokens(), 32u);
  EXPECT_THAT(m->block_ids(), ElementsAre(100, 101));
  EXPECT_FALSE(m->lease.valid());
}

TEST_F(ClientServerTest, InfoAndHandshake) {
  auto client = Connect();
  auto info = client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->epoch(), server_->epoch());
  EXPECT_EQ(info->block_size(), 16u);
  auto ok = client->Handshake("engine-0", info->model_fingerprint());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->epoch(), server_->epoch());
  auto bad = client->Handshake("engine-0", "0123456789abcdef");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("0123456789abcdef"));
}

TEST_F(ClientServerTest, ErrorsArriveWithCodeAndMessage) {
  auto client = Connect();
  auto partial = client->Insert(Tokens(1, 20), std::vector<uint64_t>{1});
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(partial.status().message()), HasSubstr("20"));
  EXPECT_EQ(client->Release(12345).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->KeepAlive(std::vector<uint64_t>{12345}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ClientServerTest, LeaseIsReleasedWhenDestroyed) {
  auto client = Connect();
  ASSERT_TRUE(
      client->Insert(Tokens(1, 32), std::vector<uint64_t>{100, 101}).ok());
  {
    auto m = client->Match(Tokens(1, 32), Pinned());
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(m->lease.valid());
    EXPECT_EQ(ActiveLeases(client.get()), 1u);
    auto left = m->lease.KeepAlive();
    ASSERT_TRUE(left.ok()) << left.status();
    EXPECT_GT(*left, absl::ZeroDuration());
    // Pinned blocks are never evicted.
    auto evicted = client->Evict(2);
    ASSERT_TRUE(evicted.ok());
    EXPECT_TRUE(evicted->empty());
  }
  EXPECT_EQ(ActiveLeases(client.get()), 0u);
  auto evicted = client->Evict(2);
  ASSERT_TRUE(evicted.ok());
  EXPECT_THAT(*evicted, ElementsAre(101, 100));
}

TEST_F(ClientServerTest, InsertLeaseMovesAndReleasesOnce) {
  auto client = Connect();
  auto ins = client->Insert(Tokens(1, 16), std::vector<uint64_t>{7}, Pinned());
  ASSERT_TRUE(ins.ok()) << ins.status();
  Client::Lease lease = std::move(ins->lease);
  EXPECT_EQ(ActiveLeases(client.get()), 1u);
  EXPECT_TRUE(lease.Release().ok());
  EXPECT_EQ(ActiveLeases(client.get()), 0u);
}

TEST_F(ClientServerTest, TenantsComeFromMetadata) {
  auto acme = Connect(ForTenant("acme"));
  ASSERT_TRUE(
      acme->Insert(Tokens(1, 16), std::vector<uint64_t>{1}, PrefixOptions())
          .ok());
  auto other = Connect(ForTenant("other"));
  auto m = other->Match(Tokens(1, 16));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->matched_tokens(), 0u);
  auto mine = acme->Match(Tokens(1, 16));
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->matched_tokens(), 16u);
}

TEST_F(ClientServerTest, InvalidateResetDump) {
  auto client = Connect();
  ASSERT_TRUE(
      client->Insert(Tokens(1, 48), std::vector<uint64_t>{1, 2, 3}).ok());
  auto dump = client->Dump();
  ASSERT_TRUE(dump.ok()) << dump.status();
  std::vector<uint64_t> dumped;
  for (const auto& n : dump->nodes()) {
    dumped.insert(dumped.end(), n.block_ids().begin(), n.block_ids().end());
  }
  EXPECT_THAT(dumped, ElementsAre(1, 2, 3));
  auto removed = client->Invalidate(std::vector<uint64_t>{2});
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ::testing::UnorderedElementsAre(2, 3));
  auto reset = client->Reset();
  ASSERT_TRUE(reset.ok()) << reset.status();
  EXPECT_THAT(reset->removed_block_ids(), ElementsAre(1));
}

TEST_F(ClientServerTest, WatchEventsSeesInserts) {
  auto client = Connect();
  ASSERT_TRUE(
      client->Insert(Tokens(1, 32), std::vector<uint64_t>{100, 101}).ok());
  std::vector<uint64_t> stored;
  absl::Status s = client->WatchEvents(
      0,
      [&](const v1::WatchEventsResponse& batch) {
        for (const auto& e : batch.events()) {
          if (e.has_block_stored()) {
            stored.insert(stored.end(), e.block_stored().block_ids().begin(),
                          e.block_stored().block_ids().end());
          }
        }
        return stored.size() < 2;
      },
      absl::Seconds(10));
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_THAT(stored, ElementsAre(100, 101));
}

TEST_F(ClientServerTest, EpochChangeAcrossARestart) {
  server_.reset();
  server_ = StartServer(1111);
  ASSERT_NE(server_, nullptr);
  ClientOptions options;
  options.wait_for_ready = true;  // ride out the restart below
  options.deadline = absl::Seconds(30);
  auto client = Connect(options, /*unix_socket=*/true);
  uint64_t old_seen = 0, new_seen = 0;
  client->OnEpochChange([&](uint64_t old_epoch, uint64_t new_epoch) {
    old_seen = old_epoch;
    new_seen = new_epoch;
  });
  ASSERT_TRUE(client->GetInfo().ok());
  EXPECT_EQ(client->epoch(), 1111u);

  server_.reset();  // the daemon restarts: same socket, new epoch
  server_ = StartServer(2222);
  ASSERT_NE(server_, nullptr);
  absl::Status status = client->Match(Tokens(1, 16)).status();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_TRUE(client->epoch_changed());
  EXPECT_EQ(old_seen, 1111u);
  EXPECT_EQ(new_seen, 2222u);
}

TEST_F(ClientServerTest, HealthTurnsNotServingOnShutdown) {
  auto client = Connect({}, /*unix_socket=*/true);
  auto status = client->Health();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, HealthStatus::kServing);
  auto named = client->Health("prefixd.v1.PrefixCache");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(*named, HealthStatus::kServing);

  auto stream = client->WatchHealth();
  HealthStatus s;
  ASSERT_TRUE(stream->Read(&s));
  EXPECT_EQ(s, HealthStatus::kServing);
  std::thread stopper([this] { server_->Shutdown(); });
  ASSERT_TRUE(stream->Read(&s));
  EXPECT_EQ(s, HealthStatus::kNotServing);
  stream->Cancel();
  stream->Finish().IgnoreError();
  stopper.join();
  EXPECT_EQ(client->Health().status().code(), absl::StatusCode::kUnavailable);
}

// ---- the fleet index (PrefixIndex) ----

// Runs prefixctl against `addr`; returns the exit code.
int Ctl(const std::string& addr, std::vector<std::string> args,
        std::string* out, std::string* err) {
  args.insert(args.begin(), {"prefixctl", "--addr", addr});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::ostringstream o, e;
  const int rc = RunPrefixctl(static_cast<int>(argv.size()), argv.data(), o, e);
  *out = o.str();
  *err = e.str();
  return rc;
}

// Without an `index` config the daemon does not register PrefixIndex: gRPC
// answers UNIMPLEMENTED, and prefixctl says how to turn the index on.
TEST_F(ClientServerTest, TheIndexIsUnimplementedWithoutAnIndexConfig) {
  auto client = Connect();
  EXPECT_EQ(client->Route(Tokens(1, 16)).status().code(),
            absl::StatusCode::kUnimplemented);
  v1::RouteBatchRequest batch;
  *batch.add_requests() = RouteRequestFor(Tokens(1, 16));
  EXPECT_EQ(client->RouteBatch(batch).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(client->ListWorkers().status().code(),
            absl::StatusCode::kUnimplemented);
  const std::string addr = server_->addresses()[0];
  std::string out, err;
  EXPECT_EQ(Ctl(addr, {"workers"}, &out, &err), kExitRpcError);
  EXPECT_EQ(err, "error: the daemon at " + addr +
                     " does not serve the fleet index: start it with "
                     "--index_source=NAME=ENDPOINT or an index { } config "
                     "(docs/index.md)\n");
}

// A TCP port nobody listens on (bound, then closed).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// The daemon with a fleet index of one source, w0, whose endpoint nobody
// listens on: ZeroMQ connects lazily, so w0 stays CONNECTING, holds nothing
// and has applied no batch. The config is a file (the `index` message of
// config.proto), so these tests need nothing of the server's C++ API.
//
// What they expect of the daemon:
//   Route:       no WorkerMatch (w0 matches nothing) unless all_workers or
//                a `workers` filter asks for w0: then one {worker "w0",
//                matched_blocks 0, no mediums, state CONNECTING, last_seq
//                -1}; best_worker "", prompt_blocks = len(tokens) / 16,
//                block_size 16;
//   RouteBatch:  one OK item per request, each that same response;
//   ListWorkers: one WorkerInfo {worker "w0", endpoint tcp://127.0.0.1:PORT,
//                state CONNECTING, no mediums, zero counters, last_seq -1,
//                last_event_unix_ms 0}, block_size 16, entries 0,
//                max_entries > 0.
class ClientIndexServerTest : public ClientServerTest {
 protected:
  void SetUp() override {
    socket_ = absl::StrCat(::testing::TempDir(), "/client_server_test.",
                           getpid(), ".sock");
    const int port = FreePort();
    ASSERT_GT(port, 0);
    endpoint_ = absl::StrCat("tcp://127.0.0.1:", port);
    server_ =
        StartServer(std::nullopt,
                    absl::StrCat("index { sources { name: \"w0\" endpoint: \"",
                                 endpoint_, "\" } }\n"));
    ASSERT_NE(server_, nullptr);
  }

  // `listed`: the request asked for w0 (all_workers or a filter).
  static void ExpectNothingHeld(const v1::RouteResponse& r,
                                uint64_t prompt_blocks, bool listed) {
    EXPECT_EQ(r.best_worker(), "");
    EXPECT_EQ(r.prompt_blocks(), prompt_blocks);
    EXPECT_EQ(r.block_size(), 16u);
    ASSERT_EQ(r.workers_size(), listed ? 1 : 0);
    if (!listed) return;
    const v1::WorkerMatch& w = r.workers(0);
    EXPECT_EQ(w.worker(), "w0");
    EXPECT_EQ(w.matched_blocks(), 0u);
    EXPECT_TRUE(w.mediums().empty());
    EXPECT_EQ(w.state(), v1::CONNECTING);
    EXPECT_EQ(w.last_seq(), -1);
  }

  std::string endpoint_;
};

TEST_F(ClientIndexServerTest, RouteAnswersForTheConnectingWorker) {
  auto client = Connect();
  auto r = client->Route(Tokens(1, 64));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNothingHeld(*r, 4, false);
  RouteOptions all;
  all.all_workers = true;
  r = client->Route(Tokens(1, 64), all);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNothingHeld(*r, 4, true);
  RouteOptions options;
  options.lora_name = "sql-adapter";
  options.cache_salt = "salt";
  options.workers = {"w0"};
  auto unix_client = Connect({}, /*unix_socket=*/true);
  r = unix_client->Route(Tokens(1, 40), options);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNothingHeld(*r, 2, true);
}

TEST_F(ClientIndexServerTest, RouteBatchAnswersEveryItem) {
  auto client = Connect();
  v1::RouteBatchRequest batch;
  *batch.add_requests() = RouteRequestFor(Tokens(1, 32));
  RouteOptions lora;
  lora.lora_id = 3;
  lora.all_workers = true;
  *batch.add_requests() = RouteRequestFor(Tokens(1, 16), lora);
  auto r = client->RouteBatch(batch);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->responses_size(), 2);
  EXPECT_EQ(r->responses(0).code(), 0) << r->responses(0).message();
  ExpectNothingHeld(r->responses(0).response(), 2, false);
  EXPECT_EQ(r->responses(1).code(), 0) << r->responses(1).message();
  ExpectNothingHeld(r->responses(1).response(), 1, true);
}

// A Route's per-block extra keys: bad ones are INVALID_ARGUMENT naming the
// field and the numbers; good ones (vLLM's typed keys) are answered.
TEST_F(ClientIndexServerTest, RouteBlockExtraKeysAreCheckedAndNamed) {
  auto client = Connect();
  auto keys = [](uint32_t block, std::vector<v1::ExtraKey> ks) {
    v1::BlockExtraKeys b;
    b.set_block(block);
    for (v1::ExtraKey& k : ks) *b.add_keys() = std::move(k);
    return b;
  };
  v1::ExtraKey image;
  image.mutable_mm()->set_modality("image");
  image.mutable_mm()->set_hash("img-1");
  image.mutable_mm()->set_block_offset(4);
  v1::ExtraKey lora, salt, unset;
  lora.set_lora("other");
  salt.set_cache_salt("s");
  RouteOptions ok;
  ok.lora_name = "sql-adapter";
  ok.block_extra_keys = {keys(1, {image}), keys(0, {salt})};
  auto r = client->Route(Tokens(1, 64), ok);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectNothingHeld(*r, 4, false);

  const std::vector<std::pair<std::vector<v1::BlockExtraKeys>, std::string>>
      bad = {
          {{keys(4, {image})},
           "block_extra_keys[0].block 4 is past the prompt's 4 whole blocks"},
          {{keys(1, {image}), keys(1, {image})},
           "block_extra_keys[1].block 1 is listed twice"},
          {{keys(2, {unset})}, "block_extra_keys[0].keys[0] sets no key"},
          {{keys(0, {image, lora})},
           "block_extra_keys[0].keys[1] names lora_name \"other\" but the "
           "request's lora_name is \"sql-adapter\""},
          {{keys(3, {salt})},
           "block_extra_keys[0].keys[0] is a cache_salt in block 3"},
      };
  for (const auto& [extra, want] : bad) {
    RouteOptions o;
    o.lora_name = "sql-adapter";
    o.block_extra_keys = extra;
    const absl::Status st = client->Route(Tokens(1, 64), o).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(st.message(), HasSubstr(want));
  }
  // In a batch, the item names itself.
  RouteOptions o;
  o.block_extra_keys = {keys(9, {image})};
  v1::RouteBatchRequest batch;
  *batch.add_requests() = RouteRequestFor(Tokens(1, 16));
  *batch.add_requests() = RouteRequestFor(Tokens(1, 16), o);
  auto items = client->RouteBatch(batch);
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_EQ(items->responses(0).code(), 0);
  EXPECT_EQ(items->responses(1).code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(items->responses(1).message(),
              HasSubstr("requests[1]: block_extra_keys[0].block 9"));
}

TEST_F(ClientIndexServerTest, ListWorkersShowsTheSource) {
  auto client = Connect();
  auto r = client->ListWorkers();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->block_size(), 16u);
  EXPECT_EQ(r->entries(), 0u);
  EXPECT_GT(r->max_entries(), 0u);
  ASSERT_EQ(r->workers_size(), 1);
  const v1::WorkerInfo& w = r->workers(0);
  EXPECT_EQ(w.worker(), "w0");
  EXPECT_EQ(w.endpoint(), endpoint_);
  EXPECT_EQ(w.state(), v1::CONNECTING);
  EXPECT_TRUE(w.mediums().empty());
  EXPECT_EQ(w.events(), 0u);
  EXPECT_EQ(w.last_seq(), -1);
  EXPECT_EQ(w.last_event_unix_ms(), 0);

  std::string out, err;
  ASSERT_EQ(Ctl(server_->addresses()[0], {"workers"}, &out, &err), kExitOk)
      << err;
  EXPECT_THAT(out, HasSubstr("1 worker  entries 0/"));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("w0      CONNECTING  ", endpoint_,
                                          "  -       0       0     0        "
                                          "0       0        -         never")));
}

}  // namespace
}  // namespace prefixd
