// For tests only: the real prefixd Server in the test's own process, on
// 127.0.0.1 with a kernel-chosen port and on a Unix socket in a directory of
// its own, with channels and stubs to either. The in-process integration
// and security tests share it.
//
//   absl::StatusOr<ServerConfig> config = TestServer::Config("block_size: 4");
//   TestServer server;
//   ASSERT_TRUE(server.Start(*std::move(config)).ok());
//   std::unique_ptr<v1::PrefixCache::Stub> stub =
//       server.Stub(TestServer::Transport::kUnix);
#ifndef PREFIXD_SERVER_TEST_SERVER_H_
#define PREFIXD_SERVER_TEST_SERVER_H_

#include <grpcpp/client_context.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "prefixd/v1/prefix_cache.grpc.pb.h"
#include "server/config.h"
#include "server/server.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace prefixd {

class TestServer {
 public:
  enum class Transport { kTcp, kUnix };

  // "Tcp" or "Unix", for parameterized test names.
  static const char* TransportName(Transport t);

  // `text` (a prefixd.v1.Config textproto) over the embedded defaults,
  // resolved, with the timings tests want: a 5 s drain and 5 ms WatchEvents
  // polls. INVALID_ARGUMENT quoting `text` if it does not parse.
  static absl::StatusOr<ServerConfig> Config(absl::string_view text);

  // A context with a 30 s deadline, naming `tenant` unless it is empty.
  static std::unique_ptr<grpc::ClientContext> Context(
      const std::string& tenant = "");

  TestServer() = default;
  // Stops the server and removes its socket directory.
  ~TestServer();
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;

  // Stops the running server, if any, then serves `config` on exactly two
  // listeners, whatever config.listen says: "127.0.0.1:0" and a socket in a
  // fresh directory. The listen addresses are loopback, so any auth mode
  // passes config validation with them.
  absl::Status Start(ServerConfig config, ServerDeps deps = {});
  // Shuts the server down and removes its socket directory. Idempotent.
  void Stop();

  Server& server() const { return *server_; }
  bool running() const { return server_ != nullptr; }
  // As clients dial it: "127.0.0.1:<port>" or "unix:///<dir>/prefixd.sock".
  const std::string& address(Transport t) const;
  // A plaintext channel (auth mode NONE) and a PrefixCache stub on it.
  std::shared_ptr<grpc::Channel> Channel(Transport t) const;
  std::unique_ptr<v1::PrefixCache::Stub> Stub(Transport t) const;

 private:
  std::string socket_dir_;
  std::unique_ptr<Server> server_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_TEST_SERVER_H_
