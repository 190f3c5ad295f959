#include "server/listen_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

TEST(ListenAddressTest, ParsesTcpAndUnix) {
  absl::StatusOr<ListenAddress> a = ParseListenAddress("127.0.0.1:50051");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, ListenAddress::Kind::kTcp);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 50051);
  EXPECT_EQ(a->ToGrpcUri(), "127.0.0.1:50051");

  a = ParseListenAddress("[::1]:0");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "[::1]");
  EXPECT_EQ(a->port, 0);

  a = ParseListenAddress("unix:///run/prefixd/prefixd.sock");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->kind, ListenAddress::Kind::kUnix);
  EXPECT_EQ(a->path, "/run/prefixd/prefixd.sock");
  EXPECT_EQ(a->ToGrpcUri(), "unix:///run/prefixd/prefixd.sock");

  a = ParseListenAddress("unix:relative.sock");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->path, "relative.sock");
  EXPECT_EQ(a->ToGrpcUri(), "unix:relative.sock");
}

TEST(ListenAddressTest, Loopback) {
  for (const char* text :
       {"127.0.0.1:1", "127.8.9.10:1", "localhost:1", "[::1]:1",
        "[::ffff:127.0.0.1]:1", "unix:///tmp/a.sock"}) {
    EXPECT_TRUE(ParseListenAddress(text)->IsLoopback()) << text;
  }
  for (const char* text :
       {"0.0.0.0:1", ":1", "[::]:1", "10.0.0.1:1", "example.com:1"}) {
    EXPECT_FALSE(ParseListenAddress(text)->IsLoopback()) << text;
  }
}

TEST(ListenAddressTest, LoopbackEndpoint) {
  for (const char* e : {"tcp://127.0.0.1:5557", "tcp://localhost:5557",
                        "tcp://[::1]:5557", "ipc:///tmp/x", "inproc://x"}) {
    EXPECT_TRUE(IsLoopbackEndpoint(e)) << e;
  }
  for (const char* e : {"tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://[::]:5557",
                        "tcp://10.0.0.7:5557", "tcp://engine:5557", "tcp://"}) {
    EXPECT_FALSE(IsLoopbackEndpoint(e)) << e;
  }
}

// A TCP socket listening on 127.0.0.1 on a free port; its port.
int ListenOnLoopback(int* fd) {
  *fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(*fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(listen(*fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(*fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

TEST(ProbeTcpListenTest, NamesAPortInUseAndTheFlag) {
  int fd = -1;
  const int port = ListenOnLoopback(&fd);
  const std::string busy = "127.0.0.1:" + std::to_string(port);
  absl::Status s = ProbeTcpListen(*ParseListenAddress(busy), "--listen");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), busy +
                             ": address already in use (is another prefixd "
                             "running? change --listen)");
  // Every interface includes the loopback one.
  s = ProbeTcpListen(*ParseListenAddress(":" + std::to_string(port)), "--x");
  EXPECT_EQ(s.message(), "*:" + std::to_string(port) +
                             ": address already in use (is another prefixd "
                             "running? change --x)");
  close(fd);
  // Free again (SO_REUSEADDR: a closed listener's port is reusable at once).
  EXPECT_TRUE(ProbeTcpListen(*ParseListenAddress(busy), "--listen").ok());
}

TEST(ProbeTcpListenTest, PortZeroAndUnixAreNotProbed) {
  EXPECT_TRUE(ProbeTcpListen(*ParseListenAddress("127.0.0.1:0"), "-").ok());
  EXPECT_TRUE(
      ProbeTcpListen(*ParseListenAddress("unix:///nonexistent/a.sock"), "-")
          .ok());
}

TEST(ProbeTcpListenTest, AnAddressOfAnotherHost) {
  // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never an address of this host.
  absl::Status s =
      ProbeTcpListen(*ParseListenAddress("192.0.2.1:9464"), "--metrics_listen");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(),
            "192.0.2.1:9464: not an address of this host (change "
            "--metrics_listen)");
}

class UnixSocketPathTest : public ::testing::Test {
 protected:
  std::string dir_ =
      ::testing::TempDir() + "/listen_address_test." + std::to_string(getpid());
  std::string path_ = dir_ + "/sub/prefixd.sock";

  void TearDown() override {
    unlink(path_.c_str());
    rmdir((dir_ + "/sub").c_str());
    rmdir(dir_.c_str());
  }

  // A bound socket file; listening or not.
  int Bind(bool listen_on_it) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (listen_on_it) {
      EXPECT_EQ(listen(fd, 1), 0);
    }
    return fd;
  }
};

TEST_F(UnixSocketPathTest, CreatesMissingDirectory) {
  ASSERT_TRUE(PrepareUnixSocketPath(path_).ok());
  struct stat st;
  EXPECT_EQ(stat((dir_ + "/sub").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST_F(UnixSocketPathTest, RemovesStaleSocket) {
  ASSERT_TRUE(PrepareUnixSocketPath(path_).ok());
  close(Bind(/*listen_on_it=*/false));  // the file stays, nobody listens
  ASSERT_EQ(access(path_.c_str(), F_OK), 0);
  EXPECT_TRUE(PrepareUnixSocketPath(path_).ok());
  EXPECT_NE(access(path_.c_str(), F_OK), 0);
}

TEST_F(UnixSocketPathTest, RefusesLiveSocketAndRegularFile) {
  ASSERT_TRUE(PrepareUnixSocketPath(path_).ok());
  int fd = Bind(/*listen_on_it=*/true);
  absl::Status s = PrepareUnixSocketPath(path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("another process"));
  close(fd);
  unlink(path_.c_str());

  std::ofstream(path_) << "precious";
  s = PrepareUnixSocketPath(path_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("not a socket"));
  EXPECT_EQ(access(path_.c_str(), F_OK), 0);
}

}  // namespace
}  // namespace prefixd
