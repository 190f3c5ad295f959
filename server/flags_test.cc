#include "server/flags.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<CommandLine> Parse(std::vector<const char*> args) {
  return ParseCommandLine(absl::MakeConstSpan(args));
}

TEST(FlagsTest, NoArgumentsSetsNothing) {
  absl::StatusOr<CommandLine> cl = Parse({});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_TRUE(cl->config_paths.empty());
  EXPECT_TRUE(cl->listen.empty());
  EXPECT_FALSE(cl->model.has_value());
  EXPECT_FALSE(cl->block_size.has_value());
  EXPECT_FALSE(cl->help);
}

TEST(FlagsTest, ListenRepeatsAndBothValueFormsWork) {
  absl::StatusOr<CommandLine> cl =
      Parse({"--listen=127.0.0.1:1", "--listen", "unix:///tmp/x.sock",
             "--block_size", "32", "--model=mistral-7b", "--kv_budget=1GiB",
             "--config", "/etc/prefixd.textproto"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_THAT(cl->listen, ElementsAre("127.0.0.1:1", "unix:///tmp/x.sock"));
  EXPECT_EQ(cl->block_size, 32u);
  EXPECT_EQ(cl->model, "mistral-7b");
  EXPECT_EQ(cl->kv_budget, "1GiB");
  EXPECT_THAT(cl->config_paths, ElementsAre("/etc/prefixd.textproto"));
}

TEST(FlagsTest, EventsPublish) {
  absl::StatusOr<CommandLine> cl =
      Parse({"--events_publish=tcp://*:5557,tcp://*:5558"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->events_publish, "tcp://*:5557,tcp://*:5558");
  EXPECT_THAT(Parse({"--events_publish=,tcp://*:5558"}).status().message(),
              HasSubstr("ENDPOINT[,REPLAY_ENDPOINT]"));
}

TEST(FlagsTest, IndexSourcesRepeatAndOtherFlagsTakeTheLastValue) {
  absl::StatusOr<CommandLine> cl =
      Parse({"--index_source=a=tcp://h:1", "--index_source", "b=tcp://h:2",
             "--model=llama-3-8b", "--model", "mistral-7b"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_THAT(cl->index_sources, ElementsAre("a=tcp://h:1", "b=tcp://h:2"));
  EXPECT_EQ(cl->model, "mistral-7b");
  EXPECT_THAT(Parse({"--index_source=tcp://h:1"}).status().message(),
              HasSubstr("--index_source=tcp://h:1: want NAME=ENDPOINT"));
  EXPECT_THAT(Parse({"--index_block_size=x"}).status().message(),
              HasSubstr("--index_block_size=x: want a positive integer"));
  cl = Parse({"--index_decode_budget=64MiB"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->index_decode_budget, "64MiB");
  EXPECT_THAT(CommandLineHelp(), HasSubstr("--index_decode_budget=SIZE"));
  cl = Parse({"--index_http_answer=by_instance"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->index_http_answer, "by_instance");
  EXPECT_THAT(CommandLineHelp(), HasSubstr("--index_http_answer=FORM"));
}

TEST(FlagsTest, CheckConfigNamesTheFileOnce) {
  absl::StatusOr<CommandLine> cl = Parse({"--check_config", "/etc/p.txtpb"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_TRUE(cl->check_config);
  EXPECT_THAT(cl->config_paths, ElementsAre("/etc/p.txtpb"));
  cl = Parse({"--config=/etc/p.txtpb", "--check_config=/etc/p.txtpb"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_TRUE(cl->check_config);
  // Several files, joined in order (a ConfigMap's config, a Secret's
  // principals), as with several --config.
  cl = Parse(
      {"--check_config=base.textproto", "--check_config=principals.textproto"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_THAT(cl->config_paths,
              ElementsAre("base.textproto", "principals.textproto"));
  cl = Parse({"--config=a", "--config", "b"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_FALSE(cl->check_config);
  EXPECT_THAT(cl->config_paths, ElementsAre("a", "b"));
  // Either order: the same error naming both files.
  for (const std::vector<const char*>& args :
       {std::vector<const char*>{"--config=a", "--check_config=b"},
        std::vector<const char*>{"--check_config=b", "--config=a"}}) {
    EXPECT_EQ(Parse(args).status().message(),
              "--check_config=b with --config=a: name the files once, with "
              "--check_config");
  }
}

TEST(FlagsTest, EvictionPolicyIsCheckedAndStoredByItsConfigName) {
  EXPECT_FALSE(Parse({})->eviction_policy.has_value());
  EXPECT_EQ(Parse({"--eviction_policy=adaptive"})->eviction_policy, "ADAPTIVE");
  EXPECT_EQ(Parse({"--eviction_policy", "LRU"})->eviction_policy, "LRU");
  EXPECT_EQ(Parse({"--eviction_policy=Shadow"})->eviction_policy, "SHADOW");
  absl::StatusOr<CommandLine> bad = Parse({"--eviction_policy=lfu"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              AllOf(HasSubstr("--eviction_policy=lfu"), HasSubstr("lru"),
                    HasSubstr("adaptive"), HasSubstr("shadow")));
}

TEST(FlagsTest, HelpAndShortHelp) {
  EXPECT_TRUE(Parse({"--help"})->help);
  EXPECT_TRUE(Parse({"-h"})->help);
}

TEST(FlagsTest, ErrorsNameTheFlag) {
  EXPECT_THAT(Parse({"--lisen=x"}).status().message(),
              HasSubstr("unknown flag --lisen"));
  EXPECT_THAT(Parse({"--block_size=0"}).status().message(),
              HasSubstr("--block_size=0"));
  EXPECT_THAT(Parse({"--block_size=-3"}).status().message(),
              HasSubstr("--block_size=-3"));
  EXPECT_THAT(Parse({"--kv_budget"}).status().message(),
              HasSubstr("--kv_budget needs a value"));
  EXPECT_THAT(Parse({"--help=yes"}).status().message(),
              HasSubstr("--help takes no value"));
  EXPECT_THAT(Parse({"serve"}).status().message(),
              HasSubstr("unexpected argument \"serve\""));
}

TEST(FlagsTest, HelpListsEveryFlagWithItsDefault) {
  std::string help = CommandLineHelp();
  for (const char* flag :
       {"--config=FILE", "--listen=ADDR", "--metrics_listen=HOST:PORT",
        "--model=NAME|FILE", "--kv_dtype=DTYPE", "--block_size=TOKENS",
        "--kv_budget=SIZE", "--lease_ttl=DURATION", "--snapshot_path=FILE",
        "--eviction_policy=lru|adaptive|shadow", "--help", "--version"}) {
    EXPECT_THAT(help, HasSubstr(flag));
  }
  for (const char* value :
       {"127.0.0.1:50051", "unix:///tmp/prefixd.sock", "127.0.0.1:9464",
        "llama-3-8b", "fp16", "default: 16", "4GiB", "300s", "default: lru"}) {
    EXPECT_THAT(help, HasSubstr(value));
  }
}

}  // namespace
}  // namespace prefixd
