#include "index/sglang_server_info.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// What SGLang's describe_kv_events_publisher gives for --dp-size 2,
// --kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'
// and --load-publish-endpoint auto, among /server_info's other members.
constexpr char kServerInfo[] = R"({
  "model_path": "Qwen/Qwen3-8B", "page_size": 16, "dp_size": 2,
  "version": "0.5.9",
  "kv_events": {"publisher": "zmq", "endpoint_host": "*",
                "endpoint_port_base": 5557, "topic": "", "block_size": 16,
                "dp_size": 2, "load_endpoint_port_base": 5559,
                "load_topic": "load"},
  "internal_states": [{"last_gen_throughput": 0.0}]})";

std::string WithKvEvents(const std::string& kv) {
  return R"({"model_path": "m", "kv_events": )" + kv + "}";
}

absl::Status ErrorOf(const std::string& body) {
  return ParseSglangServerInfo(body, "10.0.0.3").status();
}

TEST(SglangServerInfoTest, AWildcardHostDialsTheWorkersOwn) {
  absl::StatusOr<std::optional<SglangEventSockets>> s =
      ParseSglangServerInfo(kServerInfo, "10.0.0.3");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->has_value());
  const SglangEventSockets& k = **s;
  EXPECT_EQ(k.block_size, 16);
  EXPECT_EQ(k.dp_size, 2);
  EXPECT_THAT(k.EventEndpoints(),
              ElementsAre("tcp://10.0.0.3:5557", "tcp://10.0.0.3:5558"));
  EXPECT_THAT(k.LoadEndpoints(),
              ElementsAre("tcp://10.0.0.3:5559", "tcp://10.0.0.3:5560"));
}

TEST(SglangServerInfoTest, EveryWildcardAndANamedHost) {
  for (const char* wildcard : {"*", "0.0.0.0", "::", "[::]", ""}) {
    const std::string body = WithKvEvents(
        std::string(R"({"publisher": "zmq", "endpoint_host": ")") + wildcard +
        R"(", "endpoint_port_base": 7000, "block_size": 64})");
    absl::StatusOr<std::optional<SglangEventSockets>> s =
        ParseSglangServerInfo(body, "[fd00::7]");
    ASSERT_TRUE(s.ok() && s->has_value()) << wildcard << s.status();
    EXPECT_THAT((*s)->EventEndpoints(), ElementsAre("tcp://[fd00::7]:7000"))
        << wildcard;
    EXPECT_THAT((*s)->LoadEndpoints(), ElementsAre()) << "no load keys";
  }
  absl::StatusOr<std::optional<SglangEventSockets>> named =
      ParseSglangServerInfo(
          WithKvEvents(R"({"publisher": "zmq", "endpoint_host": "10.9.9.9",
                           "endpoint_port_base": 7000, "block_size": 64,
                           "dp_size": null, "topic": "kv"})"),
          "worker.local");
  ASSERT_TRUE(named.ok() && named->has_value()) << named.status();
  EXPECT_THAT((*named)->EventEndpoints(), ElementsAre("tcp://10.9.9.9:7000"));
  EXPECT_EQ((*named)->topic, "kv");
}

// With --dcp-size N SGLang's events store blocks of page_size x N tokens.
// Releases that advertised page_size as kv_events.block_size (with
// dcp_size beside it) were followed at the page size, and every batch was
// refused for its block size; an index set to the real width refused the
// worker.
TEST(SglangServerInfoTest, DecodeContextParallelismWidensTheBlocks) {
  const auto block_size = [](const std::string& top, int advertised) {
    const std::string body =
        R"({"model_path": "m", )" + top +
        R"(, "kv_events": {"publisher": "zmq", "endpoint_host": "*",
            "endpoint_port_base": 5557, "block_size": )" +
        std::to_string(advertised) + "}}";
    absl::StatusOr<std::optional<SglangEventSockets>> s =
        ParseSglangServerInfo(body, "10.0.0.3");
    EXPECT_TRUE(s.ok() && s->has_value()) << body << s.status();
    return s.ok() && s->has_value() ? (*s)->block_size : -1;
  };
  // The page size advertised, as earlier releases did: widened.
  EXPECT_EQ(block_size(R"("page_size": 16, "dcp_size": 4)", 16), 64);
  // The width advertised, as newer releases do: left as it is.
  EXPECT_EQ(block_size(R"("page_size": 16, "dcp_size": 4)", 64), 64);
  // No DCP, or nothing to go by: the advertised size.
  EXPECT_EQ(block_size(R"("page_size": 16, "dcp_size": 1)", 16), 16);
  EXPECT_EQ(block_size(R"("page_size": 16)", 16), 16);
  EXPECT_EQ(block_size(R"("dcp_size": 4)", 16), 16);
  EXPECT_EQ(block_size(R"("page_size": 16, "dcp_size": "4")", 16), 16);
  EXPECT_EQ(block_size(R"("page_size": 16, "dcp_size": -4)", 16), 16);
  EXPECT_EQ(block_size(R"("page_size": 16, "dcp_size": 1048576)", 16), 16);
}

TEST(SglangServerInfoTest, NoPublisherIsNoSockets) {
  for (const char* body : {R"({"model_path": "m"})",
                           R"({"model_path": "m", "kv_events": null})"}) {
    absl::StatusOr<std::optional<SglangEventSockets>> s =
        ParseSglangServerInfo(body, "h");
    ASSERT_TRUE(s.ok()) << body << s.status();
    EXPECT_FALSE(s->has_value()) << body;
  }
}

TEST(SglangServerInfoTest, MalformedBodiesNameTheMember) {
  const struct {
    std::string body;
    const char* want;
  } kCases[] = {
      {"not json", "server_info: the body is not JSON"},
      {"[1, 2]", "the body is a array; want an object"},
      {WithKvEvents("5"), "kv_events is a number; want an object"},
      {WithKvEvents(R"({"publisher": "null", "endpoint_port_base": 1,
                        "block_size": 16})"),
       "kv_events.publisher is \"null\"; want \"zmq\""},
      {WithKvEvents(R"({"publisher": "zmq", "block_size": 16})"),
       "kv_events.endpoint_port_base is missing"},
      {WithKvEvents(R"({"publisher": "zmq", "endpoint_port_base": 70000,
                        "block_size": 16})"),
       "kv_events.endpoint_port_base is 70000; want 1 to 65535"},
      {WithKvEvents(R"({"publisher": "zmq", "endpoint_port_base": "5557",
                        "block_size": 16})"),
       "kv_events.endpoint_port_base is a string; want an integer"},
      {WithKvEvents(R"({"publisher": "zmq", "endpoint_port_base": 5557.5,
                        "block_size": 16})"),
       "kv_events.endpoint_port_base is a number; want an integer"},
      {WithKvEvents(R"({"publisher": "zmq", "endpoint_port_base": 5557,
                        "block_size": 0})"),
       "kv_events.block_size is 0; want 1 to 1048576"},
      {WithKvEvents(R"({"publisher": "zmq", "endpoint_port_base": 65535,
                        "block_size": 16, "dp_size": 2})"),
       "kv_events.endpoint_port_base 65535 + dp_size 2 - 1 is past 65535"},
      {WithKvEvents(R"({"publisher": "zmq", "endpoint_port_base": 5557,
                        "block_size": 16, "dp_size": 18446744073709551615})"),
       "kv_events.dp_size is 18446744073709551615; want 1 to 65535"},
      {WithKvEvents(R"({"publisher": "zmq", "endpoint_port_base": 5557,
                        "block_size": 16, "load_endpoint_port_base": 5559,
                        "load_topic": "stats"})"),
       "kv_events.load_topic is \"stats\"; want \"load\""},
      {WithKvEvents(R"({"publisher": "zmq", "endpoint_host": 7,
                        "endpoint_port_base": 5557, "block_size": 16})"),
       "kv_events.endpoint_host is a number; want a string"},
  };
  for (const auto& c : kCases) {
    const absl::Status s = ErrorOf(c.body);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_THAT(s.message(), HasSubstr(c.want)) << c.body;
  }
}

}  // namespace
}  // namespace prefixd
