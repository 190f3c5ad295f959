#include "base/flag_parser.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const std::vector<FlagSpec>& Spec() {
  static const auto* spec = new std::vector<FlagSpec>{
      {"addr", "ADDR", "daemon address", "127.0.0.1:50051"},
      {"listen", "ADDR", "address to serve on; repeat for several", ""},
      {"position", "N", "absolute position", "0"},
      {"json", "", "print JSON", ""},
      {"pin", "", "pin the path", ""},
      {"help", "", "show help", ""},
  };
  return *spec;
}

absl::StatusOr<ParsedFlags> Parse(std::vector<std::string> args) {
  return ParsedFlags::Parse(Spec(), args);
}

std::string ErrorOf(std::vector<std::string> args) {
  absl::StatusOr<ParsedFlags> f = Parse(std::move(args));
  EXPECT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(f.status().message());
}

TEST(FlagParserTest, EqualsAndSeparateValueAreTheSame) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"--addr=x:1", "--position=-16"},
           {"--addr", "x:1", "--position", "-16"},
           {"-addr", "x:1", "-position=-16"}}) {
    absl::StatusOr<ParsedFlags> f = Parse(args);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->String("addr"), "x:1");
    EXPECT_EQ(*f->Int("position", 0), -16);
    EXPECT_FALSE(f->Has("json"));
  }
}

TEST(FlagParserTest, UnknownFlagIsNamed) {
  EXPECT_EQ(ErrorOf({"--json", "--bogus", "7"}), "unknown flag --bogus");
  EXPECT_EQ(ErrorOf({"-x"}), "unknown flag --x");
  // --no only negates a boolean.
  EXPECT_EQ(ErrorOf({"--noaddr"}),
            "unknown flag --noaddr: --no negates a boolean flag; --addr takes "
            "a value");
}

TEST(FlagParserTest, UnknownFlagSuggestsTheFlagMostLikelyMeant) {
  // vLLM's and SGLang's spelling, with dashes.
  const std::vector<FlagSpec> spec = {{"index_source", "NAME=ENDPOINT", "", ""},
                                      {"index_block_size", "N", "", ""},
                                      {"listen", "ADDR", "", ""},
                                      {"addr", "ADDR", "", ""}};
  const auto error = [&](const std::string& arg) {
    return std::string(ParsedFlags::Parse(spec, {arg}).status().message());
  };
  EXPECT_EQ(error("--index-source=e0=tcp://h:1"),
            "unknown flag --index-source: flags are spelled with underscores, "
            "--index_source");
  EXPECT_EQ(error("--index-block-size=16"),
            "unknown flag --index-block-size: flags are spelled with "
            "underscores, --index_block_size");
  // Near misses: typos within 2 edits (and a third of the name).
  EXPECT_EQ(error("--lisen=x:1"),
            "unknown flag --lisen; did you mean --listen?");
  EXPECT_EQ(error("--adr=x:1"), "unknown flag --adr; did you mean --addr?");
  EXPECT_EQ(error("--index_sources=x"),
            "unknown flag --index_sources; did you mean --index_source?");
  EXPECT_EQ(error("--index-sorce=x"),
            "unknown flag --index-sorce; did you mean --index_source?");
  // Too far, or too short to tell: no guess.
  EXPECT_EQ(error("--model=x"), "unknown flag --model");
  EXPECT_EQ(error("--ad=x"), "unknown flag --ad");
}

TEST(FlagParserTest, MissingValueNamesTheFlagAndItsForm) {
  EXPECT_EQ(ErrorOf({"--json", "--addr"}),
            "--addr needs a value (--addr=ADDR)");
  // A value that looks like a flag is still the value.
  absl::StatusOr<ParsedFlags> f = Parse({"--addr", "--json"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->String("addr"), "--json");
  EXPECT_FALSE(f->Has("json"));
}

TEST(FlagParserTest, BooleanForms) {
  absl::StatusOr<ParsedFlags> f = Parse({"--json", "--nopin"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->Bool("json"));
  EXPECT_FALSE(f->Bool("pin"));
  EXPECT_TRUE(f->Has("pin"));
  EXPECT_FALSE(f->Bool("help"));
  f = Parse({"--json=false", "--pin=true", "-h"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->Bool("json"));
  EXPECT_TRUE(f->Has("json"));
  EXPECT_TRUE(f->Bool("pin"));
  EXPECT_TRUE(f->Bool("help"));
  EXPECT_EQ(ErrorOf({"--json=yes"}),
            "--json takes no value (or true or false), not \"yes\"");
  EXPECT_EQ(ErrorOf({"--help=1"}),
            "--help takes no value (or true or false), not \"1\"");
  // A boolean does not take the next argument as its value.
  f = Parse({"--json", "false"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->Bool("json"));
  EXPECT_THAT(f->positional(), ElementsAre("false"));
}

TEST(FlagParserTest, RepeatedFlagsKeepEveryValueAndTheLastWins) {
  absl::StatusOr<ParsedFlags> f =
      Parse({"--listen=a:1", "--listen", "unix:///b", "--addr=x", "--addr=y",
             "--json", "--nojson"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT(f->All("listen"), ElementsAre("a:1", "unix:///b"));
  EXPECT_EQ(f->String("listen"), "unix:///b");
  EXPECT_EQ(*f->Find("addr"), "y");
  EXPECT_FALSE(f->Bool("json"));
  EXPECT_THAT(f->All("position"), IsEmpty());
  EXPECT_EQ(f->Find("position"), nullptr);
}

TEST(FlagParserTest, PositionalArguments) {
  absl::StatusOr<ParsedFlags> f =
      Parse({"first", "--json", "-", "--", "--addr", "x"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT(f->positional(), ElementsAre("first", "-", "--addr", "x"));
  EXPECT_FALSE(f->Has("addr"));  // after --: not a flag
  EXPECT_EQ(f->NoPositional().message(),
            "unexpected argument \"first\"; flags start with --");
  EXPECT_TRUE(Parse({"--json"})->NoPositional().ok());
}

TEST(FlagParserTest, TypedValuesNameTheFlagAndValue) {
  absl::StatusOr<ParsedFlags> f =
      Parse({"--position=0x1F", "--addr=250ms", "--listen=x"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f->Uint("position", 0), 31u);
  EXPECT_EQ(*f->Duration("addr", absl::ZeroDuration()),
            absl::Milliseconds(250));
  EXPECT_EQ(*f->Uint("pin", 7), 7u);  // absent: the fallback
  EXPECT_EQ(f->Duration("listen", absl::ZeroDuration()).status().message(),
            "--listen takes a duration such as 5s or 250ms, not 'x'");
  f = Parse({"--position=-1", "--addr=2"});
  EXPECT_EQ(f->Uint("position", 0).status().message(),
            "--position takes a non-negative integer, not '-1'");
  EXPECT_EQ(*f->Duration("addr", absl::ZeroDuration()), absl::Seconds(2));
  f = Parse({"--position=many"});
  EXPECT_EQ(f->Int("position", 0).status().message(),
            "--position takes an integer, not 'many'");
}

TEST(FlagParserTest, HelpListsEveryFlagWithValueAndDefault) {
  std::ostringstream out;
  PrintFlagHelp(Spec(), out);
  EXPECT_EQ(out.str(),
            "  --addr=ADDR     daemon address (default: 127.0.0.1:50051)\n"
            "  --listen=ADDR   address to serve on; repeat for several\n"
            "  --position=N    absolute position (default: 0)\n"
            "  --json          print JSON\n"
            "  --pin           pin the path\n"
            "  --help          show help\n");
}

TEST(FlagParserTest, HelpWrapsAt80ColumnsAndPutsLongFlagsOnTheirOwnLine) {
  const std::vector<FlagSpec> spec = {
      {"n", "N", std::string(30, 'a') + " " + std::string(30, 'b'), "7"},
      {"index_source", "NAME=ENDPOINT[,REPLAY]", "one source", ""},
  };
  std::ostringstream out;
  PrintFlagHelp(spec, out);
  EXPECT_EQ(out.str(), "  --n=N   " + std::string(30, 'a') + " " +
                           std::string(30, 'b') + "\n" +
                           "          (default: 7)\n"
                           "  --index_source=NAME=ENDPOINT[,REPLAY]\n"
                           "          one source\n");
  for (absl::string_view line : absl::StrSplit(out.str(), '\n'))
    EXPECT_LE(line.size(), 80u) << line;
}

}  // namespace
}  // namespace prefixd
