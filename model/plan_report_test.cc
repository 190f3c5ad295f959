// The plan's reports as the daemon's /plan page reads them: lines and
// tables with stable keys, the same text prefixctl prints, a config.json
// given as text read as the file is, and the flags of a geometry. The
// command line itself: client/plan_test.cc.
#include "model/plan_report.h"

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<PlanReport> Report(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedFlags> flags = ParsedFlags::Parse(PlanFlags(), args);
  if (!flags.ok()) return flags.status();
  return MakePlanReport(*flags);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string HfConfig(const std::string& name) {
  return absl::StrCat(PREFIXD_SOURCE_DIR, "/tests/data/hf_configs/", name);
}

const PlanLine* FindLine(const PlanReport& r, const std::string& key) {
  for (const PlanLine& line : r.lines) {
    if (line.key == key) return &line;
  }
  return nullptr;
}

TEST(PlanReportTest, ForwardLinesAndTablesHaveKeys) {
  absl::StatusOr<PlanReport> r =
      Report({"--model", "llama-3-70b", "--batch", "32", "--context", "8k",
              "--weights", "140GB", "--gpus", "4xH100-80GB"});
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> keys;
  for (const PlanLine& line : r->lines) keys.push_back(line.key);
  EXPECT_THAT(keys,
              ElementsAre("model", "kv_dtype", "tokens", "bpt", "kv", "weights",
                          "overhead", "total", "crossover", "pool"));
  EXPECT_EQ(FindLine(*r, "kv")->value,
            "85,899,345,920 B (80 GiB) = 262,144 tokens x 327,680 B");
  ASSERT_EQ(r->tables.size(), 2u);
  const PlanTable& kv = r->tables[0];
  EXPECT_EQ(kv.key, "kv");
  EXPECT_THAT(kv.keys, ElementsAre("dtype", "MHA-64", "GQA-8", "MQA-1"));
  EXPECT_THAT(kv.rows[1], ElementsAre("fp16 *", "640 GiB", "80 GiB", "10 GiB"));
  const PlanTable& gpus = r->tables[1];
  EXPECT_EQ(gpus.keys.size(), gpus.rows[0].size());
  EXPECT_EQ(gpus.rows[1][0], "H100-80GB");
  // The text is the lines and the tables.
  const std::string text = r->Text();
  EXPECT_THAT(text, HasSubstr("Weights + KV      225,899,345,920 B"));
  EXPECT_THAT(text, HasSubstr("\n  fp16 *  640 GiB   80 GiB   10 GiB\n"));
  EXPECT_THAT(r->json, HasSubstr("\"kv_bytes\": 85899345920,"));
}

TEST(PlanReportTest, ErrorsSayUsageOrNoPlan) {
  // A malformed value is a usage error, named as the flag.
  absl::StatusOr<PlanReport> r =
      Report({"--model", "llama-3-70b", "--batch", "2", "--context", "8k",
              "--weights", "140"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--weights"));
  // Well-formed, but no plan: the geometry is invalid.
  r = Report({"--layers", "32", "--kv_heads", "8", "--head_dim", "100",
              "--kv_dtype", "nvfp4", "--batch", "1", "--context", "10"});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("head_dim 100 is not a multiple of 16"));
}

// --hf_config_json is --hf_config with the file's text: the same plan, its
// notes under the name "config.json".
TEST(PlanReportTest, AConfigJsonAsTextReadsAsTheFile) {
  const std::string path = HfConfig("deepseek-v3.json");
  absl::StatusOr<PlanReport> file =
      Report({"--hf_config", path, "--batch", "2", "--context", "1k"});
  absl::StatusOr<PlanReport> text = Report(
      {"--hf_config_json", ReadFile(path), "--batch", "2", "--context", "1k"});
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->tables[0].rows, file->tables[0].rows);
  EXPECT_EQ(FindLine(*text, "bpt")->value, FindLine(*file, "bpt")->value);
  EXPECT_THAT(FindLine(*text, "model")->value,
              HasSubstr("MLA (kv_lora_rank 512, qk_rope_head_dim 64)"));
  // Not a config.json: the parser's words, named as the flag.
  absl::StatusOr<PlanReport> bad =
      Report({"--hf_config_json", "{\"num_hidden_layers\": 0}", "--batch", "1",
              "--context", "1"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("--hf_config_json: "));
  // One source of the model at a time.
  bad = Report({"--hf_config_json", "{}", "--model", "llama-3-8b"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// The flags of a geometry give that geometry back, MLA, sliding-window and
// state layers included.
TEST(PlanReportTest, GeometryFlagsRoundTrip) {
  for (const std::string& name : PresetNames()) {
    const ModelGeometry g = FindPreset(name).value().geometry;
    std::vector<std::string> args = {"--batch", "1", "--context", "1"};
    for (const auto& [flag, value] : GeometryFlags(g)) {
      args.push_back("--" + flag);
      args.push_back(value);
    }
    absl::StatusOr<PlanReport> from_flags = Report(args);
    absl::StatusOr<PlanReport> from_preset =
        Report({"--model", name, "--batch", "1", "--context", "1"});
    ASSERT_TRUE(from_flags.ok()) << name << ": " << from_flags.status();
    ASSERT_TRUE(from_preset.ok()) << name;
    EXPECT_EQ(from_flags->tables[0].rows, from_preset->tables[0].rows) << name;
    EXPECT_EQ(FindLine(*from_flags, "bpt")->value,
              FindLine(*from_preset, "bpt")->value)
        << name;
  }
  const ModelGeometry mla = FindPreset("deepseek-v3").value().geometry;
  EXPECT_EQ(GeometryFlags(mla)[1],
            std::make_pair(std::string("attention_heads"), std::string("128")));
  EXPECT_EQ(GeometryFlags(mla)[2],
            std::make_pair(std::string("kv_lora_rank"), std::string("512")));
}

TEST(PlanReportTest, ModelTextSaysMla) {
  EXPECT_EQ(ModelText(FindPreset("deepseek-v3").value().geometry),
            "deepseek-v3: 61 layers, MLA (kv_lora_rank 512, qk_rope_head_dim "
            "64), 128 attention heads");
  EXPECT_EQ(ModelText(FindPreset("llama-3-70b").value().geometry),
            "llama-3-70b: 80 layers, 8 KV heads, 64 attention heads, head_dim "
            "128");
}

}  // namespace
}  // namespace prefixd
