// prefixd::Client against the real server, in-process on port 0 and a Unix
// socket: the library's promises (leases released on destruction, errors
// mapped with code and message, epoch change across a daemon restart, health
// during shutdown) hold end to end, not only against client_test's fake.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
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

  std::unique_ptr<Server> StartServer(std::optional<uint64_t> epoch) {
    CommandLine flags;
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

}  // namespace
}  // namespace prefixd
