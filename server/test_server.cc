#include "server/test_server.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace prefixd {

const char* TestServer::TransportName(Transport t) {
  return t == Transport::kTcp ? "Tcp" : "Unix";
}

absl::StatusOr<ServerConfig> TestServer::Config(absl::string_view text) {
  v1::Config proto;
  if (!google::protobuf::TextFormat::ParseFromString(std::string(text),
                                                     &proto)) {
    return absl::InvalidArgumentError(
        absl::StrCat("test config does not parse:\n", text));
  }
  FillDefaults(&proto);
  ASSIGN_OR_RETURN(ServerConfig config, ResolveConfig(proto));
  config.drain_timeout = absl::Seconds(5);
  config.watch_poll_interval = absl::Milliseconds(5);
  return config;
}

std::unique_ptr<grpc::ClientContext> TestServer::Context(
    const std::string& tenant) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(30));
  if (!tenant.empty()) ctx->AddMetadata("x-prefixd-tenant", tenant);
  return ctx;
}

TestServer::~TestServer() { Stop(); }

absl::Status TestServer::Start(ServerConfig config, ServerDeps deps) {
  Stop();
  // One directory per start: a restarted server never finds the previous
  // one's socket, and tests running in parallel never share one.
  static std::atomic<int> counter{0};
  socket_dir_ = absl::StrCat(::testing::TempDir(), "/prefixd-test-", getpid(),
                             "-", counter++);
  const std::vector<std::string> listen = {
      "127.0.0.1:0", absl::StrCat("unix://", socket_dir_, "/prefixd.sock")};
  config.listen.clear();
  config.proto.clear_listen();
  for (const std::string& text : listen) {
    ASSIGN_OR_RETURN(ListenAddress a, ParseListenAddress(text));
    config.listen.push_back(std::move(a));
    config.proto.add_listen(text);
  }
  ASSIGN_OR_RETURN(server_, Server::Start(std::move(config), std::move(deps)));
  return absl::OkStatus();
}

void TestServer::Stop() {
  server_.reset();
  if (!socket_dir_.empty()) std::filesystem::remove_all(socket_dir_);
  socket_dir_.clear();
}

const std::string& TestServer::address(Transport t) const {
  return server_->addresses()[t == Transport::kTcp ? 0 : 1];
}

std::shared_ptr<grpc::Channel> TestServer::Channel(Transport t) const {
  return grpc::CreateChannel(address(t), grpc::InsecureChannelCredentials());
}

std::unique_ptr<v1::PrefixCache::Stub> TestServer::Stub(Transport t) const {
  return v1::PrefixCache::NewStub(Channel(t));
}

}  // namespace prefixd
