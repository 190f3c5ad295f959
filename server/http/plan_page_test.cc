// /plan.json and /plan/presets.json (server/http/plan_page.h): the report
// is prefixctl plan's (model/plan_report.h) for the same flags, and what
// the page may not ask is refused with a 400 naming it. The page itself in
// a real browser: tests/python/test_web_ui.py.
#include "server/http/plan_page.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/plan_report.h"

namespace prefixd {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

PlanReport CliReport(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedFlags> flags = ParsedFlags::Parse(PlanFlags(), args);
  EXPECT_TRUE(flags.ok()) << flags.status();
  absl::StatusOr<PlanReport> report = MakePlanReport(*flags);
  EXPECT_TRUE(report.ok()) << report.status();
  return *std::move(report);
}

std::string Error(const HttpResponse& r) {
  EXPECT_EQ(r.status, 400) << r.body;
  return json::parse(r.body).value("error", "");
}

TEST(PlanJsonTest, IsPrefixctlPlansReport) {
  const HttpResponse r = PlanPage::PlanJson(
      "model=llama-3-70b&batch=32&context=8k&weights=140GB&gpus=4xH100-80GB");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "application/json");
  const json answer = json::parse(r.body);
  const PlanReport cli =
      CliReport({"--model", "llama-3-70b", "--batch", "32", "--context", "8k",
                 "--weights", "140GB", "--gpus", "4xH100-80GB"});
  EXPECT_EQ(answer["plan"], json::parse(cli.json));
  ASSERT_EQ(answer["lines"].size(), cli.lines.size());
  for (size_t i = 0; i < cli.lines.size(); ++i) {
    EXPECT_EQ(answer["lines"][i]["key"], cli.lines[i].key);
    EXPECT_EQ(answer["lines"][i]["value"], cli.lines[i].value);
  }
  ASSERT_EQ(answer["tables"].size(), 2u);
  EXPECT_EQ(answer["tables"][0]["rows"], json(cli.tables[0].rows));
  EXPECT_EQ(answer["tables"][1]["keys"], json(cli.tables[1].keys));
  EXPECT_EQ(answer["model_flags"], json({{"layers", "80"},
                                         {"kv_heads", "8"},
                                         {"head_dim", "128"},
                                         {"attention_heads", "64"}}));
  // Numbers past 2^53 stay exact.
  const HttpResponse big =
      PlanPage::PlanJson("model=llama-3-70b&batch=2000000&context=1M");
  ASSERT_EQ(big.status, 200) << big.body;
  EXPECT_THAT(big.body, HasSubstr("\"kv_bytes\":687194767360000000,"));
}

// Bad input gets prefixctl's message, naming the flag and the value.
TEST(PlanJsonTest, BadInputGetsTheCliMessage) {
  EXPECT_THAT(Error(PlanPage::PlanJson(
                  "model=llama-3-70b&batch=2&context=8k&weights=140")),
              HasSubstr("--weights"));
  EXPECT_THAT(Error(PlanPage::PlanJson("model=nope&batch=1&context=1")),
              HasSubstr("unknown model preset \"nope\""));
  EXPECT_THAT(Error(PlanPage::PlanJson("batch=1&context=1&colour=red")),
              HasSubstr("--colour"));
  EXPECT_THAT(Error(PlanPage::PlanJson("model=llama-3-8b&weights=%zz")),
              HasSubstr("\"weights\""));
  EXPECT_THAT(Error(PlanPage::PlanJson(
                  "layers=32&kv_heads=8&head_dim=100&kv_dtype=nvfp4&batch=1&"
                  "context=1")),
              HasSubstr("head_dim 100 is not a multiple of 16"));
}

// Bytes that are not UTF-8 come back in the message as U+FFFD, never as an
// exception out of the JSON writer (which ended the daemon).
TEST(PlanJsonTest, BytesThatAreNotUtf8AreReplacedInTheMessage) {
  const HttpResponse r = PlanPage::PlanJson(
      "hf_config_json=%7B%22num_hidden_layers%ba&batch=1&context=10");
  EXPECT_THAT(Error(r), HasSubstr("\xEF\xBF\xBD"));  // U+FFFD
}

// The daemon reads no files: a config.json comes as its text.
TEST(PlanJsonTest, ReadsNoFiles) {
  EXPECT_THAT(Error(PlanPage::PlanJson("hf_config=/etc/passwd&batch=1")),
              HasSubstr("the daemon reads no files"));
  EXPECT_THAT(Error(PlanPage::PlanJson("model=/tmp/x.json&batch=1")),
              HasSubstr("the daemon reads no files"));
  EXPECT_THAT(Error(PlanPage::PlanJson("model=llama-3-8b&help")),
              HasSubstr("help"));
  const HttpResponse r = PlanPage::PlanJson(
      "hf_config_json=%7B%22num_hidden_layers%22%3A2%2C%22num_attention_"
      "heads%22%3A4%2C%22hidden_size%22%3A256%7D&batch=1&context=10");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["plan"]["bytes_per_token"], 2 * 2 * 4 * 64 * 2);
}

TEST(PlanPageTest, PresetsAreNamesAndTheDaemonsFlags) {
  DaemonFacts facts;
  facts.model.geometry = FindPreset("deepseek-v3").value().geometry;
  facts.model.kv_dtype = KvDtype::kFp8;
  const json presets = json::parse(PlanPage(facts).PresetsJson());
  EXPECT_EQ(presets["daemon"]["name"], "deepseek-v3");
  EXPECT_EQ(presets["daemon"]["kv_dtype"], "fp8");
  EXPECT_EQ(presets["daemon"]["flags"], json({{"layers", "61"},
                                              {"attention_heads", "128"},
                                              {"kv_lora_rank", "512"},
                                              {"qk_rope_head_dim", "64"}}));
  EXPECT_EQ(presets["presets"], json(PresetNames()));
  EXPECT_EQ(presets["gpus"][0], "H100-80GB");
  EXPECT_EQ(presets["dtypes"].back(), "nvfp4");
}

TEST(PlanPageTest, ServesThePageAndItsScript) {
  const PlanPage page{DaemonFacts{}};
  std::optional<HttpResponse> html = page.Handle({"GET", "/plan", "", ""});
  ASSERT_TRUE(html.has_value());
  EXPECT_THAT(html->body, HasSubstr("<script src=\"/plan.js\"></script>"));
  EXPECT_THAT(html->body, testing::Not(HasSubstr("http://")));
  std::optional<HttpResponse> js = page.Handle({"GET", "/plan.js", "", ""});
  ASSERT_TRUE(js.has_value());
  EXPECT_THAT(js->body, HasSubstr("fetch(\"/plan.json?\""));
  EXPECT_FALSE(page.Handle({"GET", "/nothing", "", ""}).has_value());
}

}  // namespace
}  // namespace prefixd
