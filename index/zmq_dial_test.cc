#include "index/zmq_dial.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace prefixd {
namespace {

using ::testing::ElementsAre;

// A name of both families is each host once, at its IPv4 address: in
// Debian's stock /etc/hosts, localhost is ::1 and 127.0.0.1, and a source
// on tcp://localhost:PORT was a pool of two workers, one of them on ::1,
// where an engine bound to tcp://*:PORT never answers.
TEST(HostAddresses, ANameOfBothFamiliesIsItsIpv4Addresses) {
  EXPECT_THAT(HostAddresses({"::1", "127.0.0.1"}), ElementsAre("127.0.0.1"));
  EXPECT_THAT(
      HostAddresses({"fd00::7", "10.0.0.2", "fd00::6", "10.0.0.1", "10.0.0.2"}),
      ElementsAre("10.0.0.1", "10.0.0.2"));
}

TEST(HostAddresses, IPv6OnlyIsKept) {
  EXPECT_THAT(HostAddresses({"fd00::2", "fd00::1", "fd00::2"}),
              ElementsAre("fd00::1", "fd00::2"));
  EXPECT_THAT(HostAddresses({}), ElementsAre());
}

TEST(ResolveHost, LiteralsAndNames) {
  EXPECT_THAT(*ResolveHost("127.0.0.1"), ElementsAre("127.0.0.1"));
  EXPECT_THAT(*ResolveHost("::1"), ElementsAre("::1"));
  EXPECT_THAT(*ResolveHost("localhost"), ElementsAre("127.0.0.1"));
  EXPECT_FALSE(ResolvesToSeveral("localhost"));
  // NXDOMAIN where a DNS server answers, a failure naming the host where
  // none does; never an address. The resolver's two answers are told
  // apart against a real DNS server in tests/index/test_pool_dns.py.
  const absl::StatusOr<std::vector<std::string>> none =
      ResolveHost("no-such-host.invalid");
  if (none.ok()) {
    EXPECT_THAT(*none, ElementsAre());
  } else {
    EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(none.status().message()),
                ::testing::HasSubstr("\"no-such-host.invalid\""));
  }
}

TEST(JoinHostPort, IPv6InBrackets) {
  EXPECT_EQ(JoinHostPort("10.0.0.1", "5557"), "10.0.0.1:5557");
  EXPECT_EQ(JoinHostPort("fd00::1", "5557"), "[fd00::1]:5557");
  EXPECT_EQ(BracketedHost("fd00::1"), "[fd00::1]");
  EXPECT_EQ(BracketedHost("10.0.0.1"), "10.0.0.1");
}

// With ZMQ_IPV6 on, ZeroMQ resolves a name to its IPv6 addresses alone:
// localhost was dialled at ::1, and an engine bound to tcp://*:PORT was
// never reached. Only IPv6 literals (and names with nothing else) take it.
TEST(DialsIpv6, LiteralsOfV6AndNamesWithV4) {
  EXPECT_TRUE(DialsIpv6("tcp://[::1]:5557"));
  EXPECT_TRUE(DialsIpv6("tcp://[fd00::5]:5557"));
  EXPECT_TRUE(DialsIpv6("tcp://fd00::5:5557"));  // SGLang's endpoint_host
  EXPECT_FALSE(DialsIpv6("tcp://127.0.0.1:5557"));
  EXPECT_FALSE(DialsIpv6("tcp://localhost:5557"));
  EXPECT_FALSE(DialsIpv6("tcp://no-such-host.invalid:5557"));
  EXPECT_FALSE(DialsIpv6("ipc:///tmp/kv"));
  EXPECT_FALSE(DialsIpv6("tcp://*:5557"));
}

}  // namespace
}  // namespace prefixd
