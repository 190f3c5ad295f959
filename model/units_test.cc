#include "model/units.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

TEST(UnitsTest, ParsesBytesWithUnits) {
  EXPECT_EQ(*ParseBytes("4GiB"), 4294967296u);
  EXPECT_EQ(*ParseBytes("160GB"), 160000000000u);
  EXPECT_EQ(*ParseBytes("512MiB"), 536870912u);
  EXPECT_EQ(*ParseBytes("1048576"), 1048576u);
  EXPECT_EQ(*ParseBytes("1.5TiB"), 1649267441664u);
  EXPECT_EQ(*ParseBytes("0"), 0u);
  EXPECT_EQ(*ParseBytes("7B"), 7u);
  EXPECT_EQ(*ParseBytes("2kB"), 2000u);
  EXPECT_EQ(*ParseBytes("2KiB"), 2048u);
  EXPECT_EQ(*ParseBytes("3MB"), 3000000u);
  EXPECT_EQ(*ParseBytes("1TB"), 1000000000000u);
  EXPECT_EQ(*ParseBytes("1PiB"), 1ULL << 50);
  EXPECT_EQ(*ParseBytes(" 80 GB "), 80000000000u);
  EXPECT_EQ(*ParseBytes("4gib"), 4294967296u);
  EXPECT_EQ(*ParseBytes("1.25GB"), 1250000000u);
  EXPECT_EQ(*ParseBytes("0.5KiB"), 512u);
  EXPECT_EQ(*ParseBytes("1e9"), 1000000000u);
  EXPECT_EQ(*ParseBytes("2.5e3MB"), 2500000000u);
  EXPECT_EQ(*ParseBytes("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(*ParseBytes("16383PiB"), 16383ULL << 50);
}

TEST(UnitsTest, RefusesBadBytes) {
  struct Case {
    const char* text;
    const char* why;
  };
  for (const Case& c : {
           Case{"-4GiB", "negative"},
           Case{"4XB", "unknown unit \"XB\""},
           Case{"GiB", "expected a number"},
           Case{"", "expected a number"},
           Case{"18446744073709551616", "larger than 2^64"},
           Case{"16EB", "unknown unit"},
           Case{"16385PiB", "larger than 2^64"},
           Case{"1e30", "larger than 2^64"},
           Case{"0.1KiB", "not a whole number"},
           Case{"1.5", "not a whole number"},
           Case{"4 GiB extra", "unknown unit"},
           Case{"123456789012345678901234", "larger than 2^64"},
           Case{"1.23456789012345678901234", "too many significant digits"},
       }) {
    absl::StatusOr<uint64_t> parsed = ParseBytes(c.text);
    ASSERT_FALSE(parsed.ok()) << c.text << " -> " << *parsed;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(),
                HasSubstr(absl::StrCat("\"", c.text, "\"")));
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.why)) << c.text;
  }
}

TEST(UnitsTest, FormatsBytesExactlyWhenItCan) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(999), "999 B");
  EXPECT_EQ(FormatBytes(131072), "128 KiB");
  EXPECT_EQ(FormatBytes(327680), "320 KiB");
  EXPECT_EQ(FormatBytes(4294967296), "4 GiB");
  EXPECT_EQ(FormatBytes(160000000000), "160 GB");
  EXPECT_EQ(FormatBytes(1610612736), "1.5 GiB");
  EXPECT_EQ(FormatBytes(2684354560), "2.5 GiB");
  EXPECT_EQ(FormatBytes(1250000000), "1.25 GB");
  EXPECT_EQ(FormatBytes(1025), "1.00 KiB");
  // Not exact in any unit at two decimals: binary, rounded.
  EXPECT_EQ(FormatBytes(160000000001), "149.01 GiB");
  // Exact in MiB, but 40647.5 MiB reads worse than 39.69 GiB.
  EXPECT_EQ(FormatBytes(42621992960), "39.69 GiB");
  EXPECT_EQ(FormatBytes(1000 * 1024), "1000 KiB");
  // Every exact form parses back to the same value.
  for (uint64_t v : {131072ULL, 327680ULL, 4294967296ULL, 160000000000ULL,
                     1610612736ULL, 1250000000ULL, 5242880ULL}) {
    std::string text = FormatBytes(v);
    text.erase(text.find(' '), 1);
    EXPECT_EQ(*ParseBytes(text), v) << text;
  }
}

TEST(UnitsTest, FormatsCounts) {
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(1000), "1,000");
  EXPECT_EQ(FormatCount(488281), "488,281");
  EXPECT_EQ(FormatCount(160000000000), "160,000,000,000");
}

TEST(UnitsTest, ParsesCounts) {
  EXPECT_EQ(*ParseCount("70e9"), 70000000000u);
  EXPECT_EQ(*ParseCount("70B"), 70000000000u);
  EXPECT_EQ(*ParseCount("8.03B"), 8030000000u);
  EXPECT_EQ(*ParseCount("1.5M"), 1500000u);
  EXPECT_EQ(*ParseCount("488k"), 488000u);
  EXPECT_EQ(*ParseCount("1000000"), 1000000u);
  EXPECT_FALSE(ParseCount("1.5").ok());
  EXPECT_FALSE(ParseCount("-3").ok());
  EXPECT_FALSE(ParseCount("5m").ok());  // milli is no count
  EXPECT_THAT(ParseCount("3 apples").status().message(),
              HasSubstr("unknown unit \"apples\""));
}

TEST(UnitsTest, ParsesDurations) {
  EXPECT_EQ(*ParseDuration("300s"), absl::Seconds(300));
  EXPECT_EQ(*ParseDuration("5m"), absl::Minutes(5));
  EXPECT_EQ(*ParseDuration("1h"), absl::Hours(1));
  EXPECT_EQ(*ParseDuration("250ms"), absl::Milliseconds(250));
  EXPECT_EQ(*ParseDuration("1h30m"), absl::Minutes(90));
  EXPECT_EQ(*ParseDuration("0"), absl::ZeroDuration());
  EXPECT_THAT(ParseDuration("300").status().message(),
              HasSubstr("needs a unit"));
  EXPECT_THAT(ParseDuration("-5s").status().message(), HasSubstr("negative"));
  EXPECT_THAT(ParseDuration("inf").status().message(), HasSubstr("finite"));
  absl::StatusOr<absl::Duration> bad = ParseDuration("5 minutes");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("\"5 minutes\""));
}

TEST(UnitsTest, SizesWhereABareNumberIsAmbiguousNeedAUnit) {
  EXPECT_EQ(*ParseSizeWithUnit("--weights", "140GB"), 140000000000u);
  EXPECT_EQ(*ParseSizeWithUnit("--weights", "0"), 0u);
  EXPECT_EQ(*ParseSizeWithUnit("--weights", "140B"), 140u);
  absl::StatusOr<uint64_t> bare = ParseSizeWithUnit("--weights", "140");
  EXPECT_EQ(bare.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bare.status().message(),
              HasSubstr("--weights 140: a size needs a unit, e.g. 140GB"));
  EXPECT_THAT(ParseSizeWithUnit("--overhead", "x").status().message(),
              HasSubstr("--overhead x: invalid size"));
  EXPECT_THAT(ParseKvBudget("4294967296", 10).status().message(),
              HasSubstr("\"4294967296\": a bare number could be bytes or "
                        "tokens"));
  EXPECT_EQ(*ParseKvBudget("0", 10), 0u);
}

TEST(UnitsTest, ParsesKvBudgetInBytesOrTokens) {
  EXPECT_EQ(*ParseKvBudget("4GiB", 131072), 4294967296u);
  EXPECT_EQ(*ParseKvBudget("1000000tokens", 131072), 131072000000u);
  EXPECT_EQ(*ParseKvBudget("32768 tokens", 131072), 4294967296u);
  EXPECT_EQ(*ParseKvBudget("488k tokens", 327680), 488000ULL * 327680);
  EXPECT_EQ(*ParseKvBudget("1tok", 327680), 327680u);
  EXPECT_EQ(*ParseKvBudget("1 Token", 10), 10u);
  EXPECT_THAT(ParseKvBudget("many tokens", 10).status().message(),
              HasSubstr("token count"));
  EXPECT_THAT(ParseKvBudget("100000000000000tokens", 327680).status().message(),
              HasSubstr("larger than 2^64"));
  EXPECT_FALSE(ParseKvBudget("-1tokens", 10).ok());
}

}  // namespace
}  // namespace prefixd
