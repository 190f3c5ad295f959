#include "client/plan.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result RunPlan(std::vector<std::string> args) {
  args.insert(args.begin(), "prefixctl");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::ostringstream out, err;
  const int code =
      RunPlanCommand(static_cast<int>(args.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

const std::vector<std::string> kLlama70b = {
    "--model",     "llama-3-70b", "--kv_dtype", "fp16",       "--gpus",
    "4xH100-80GB", "--weights",   "140GB",      "--overhead", "20GB"};

TEST(PlanCommandTest, Llama70bTables) {
  const Result r = RunPlan(kLlama70b);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr("327,680 B (320 KiB) = 2 x 80 layers x 8 "
                               "kv_heads x 128 head_dim x 2 B"));
  EXPECT_THAT(r.out, HasSubstr("5,242,880 B (5 MiB)"));
  EXPECT_THAT(r.out, HasSubstr("320,000,000,000 B (320 GB) = 4 x H100-80GB"));
  EXPECT_THAT(r.out, HasSubstr("160,000,000,000 B (160 GB)"));
  EXPECT_THAT(r.out, HasSubstr("488,281 (30,517 blocks of 16 tokens)"));
  EXPECT_THAT(r.out, HasSubstr("427,247 cached tokens"));
  // Context table rows: context, KV per sequence, sequences.
  EXPECT_THAT(r.out, HasSubstr("    8,192  2,684,354,560 B (2.5 GiB)"));
  EXPECT_THAT(r.out, HasSubstr("131,072  42,949,672,960 B (40 GiB)"));
  // Head variants, this model starred.
  EXPECT_THAT(r.out, HasSubstr("MHA-64"));
  EXPECT_THAT(r.out, HasSubstr("GQA-8 *"));
  EXPECT_THAT(r.out, HasSubstr("3,906,250"));
  // Paged vs contiguous for 1000 tokens against 131072.
  EXPECT_THAT(r.out, HasSubstr("42,621,992,960 B (39.69 GiB)"));
  EXPECT_THAT(r.out, HasSubstr("2,621,440 B (2.5 MiB)"));
}

TEST(PlanCommandTest, Llama70bJson) {
  std::vector<std::string> args = kLlama70b;
  args.push_back("--json");
  const Result r = RunPlan(args);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* want : {
           "\"bytes_per_token\": 327680,",
           "\"block_bytes\": 5242880,",
           "\"gpu_bytes\": 320000000000,",
           "\"weight_bytes\": 140000000000,",
           "\"overhead_bytes\": 20000000000,",
           "\"kv_budget_bytes\": 160000000000,",
           "\"tokens_that_fit\": 488281,",
           "\"budget_blocks\": 30517,",
           "\"crossover_tokens\": 427247,",
           "{\"context_len\": 8192, \"kv_bytes_per_sequence\": 2684354560, "
           "\"concurrent_sequences\": 59}",
           "{\"context_len\": 32768, \"kv_bytes_per_sequence\": 10737418240, "
           "\"concurrent_sequences\": 14}",
           "{\"context_len\": 131072, \"kv_bytes_per_sequence\": 42949672960, "
           "\"concurrent_sequences\": 3}",
           "{\"label\": \"MHA-64\", \"kv_heads\": 64, \"is_model\": false, "
           "\"bytes_per_token\": 2621440, \"tokens_that_fit\": 61035, "
           "\"crossover_tokens\": 53406",
           "{\"label\": \"MQA-1\", \"kv_heads\": 1, \"is_model\": false, "
           "\"bytes_per_token\": 40960, \"tokens_that_fit\": 3906250",
           "\"paged_reserved_tokens\": 1008",
           "\"paged_sequences\": 484",
           "\"contiguous_sequences\": 3,",
           "\"gpus\": {\"count\": 4, \"model\": \"H100-80GB\"",
       }) {
    EXPECT_THAT(r.out, HasSubstr(want));
  }
  EXPECT_THAT(r.out, Not(HasSubstr("e+")));  // integers, never floats
}

TEST(PlanCommandTest, HelpListsEveryFlag) {
  const Result r = RunPlan({"--help"});
  ASSERT_EQ(r.code, 0);
  for (const char* flag :
       {"--model", "--hf_config", "--layers", "--kv_heads", "--head_dim",
        "--attention_heads", "--kv_dtype", "--gpus", "--weights", "--params",
        "--weight_dtype", "--overhead", "--context", "--block_size",
        "--actual_len", "--max_seq_len", "--json", "--help"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
  EXPECT_EQ(RunPlan({"-h"}).code, 0);
}

TEST(PlanCommandTest, ParamsAndExplicitGeometry) {
  const Result r = RunPlan({"--layers=80", "--kv_heads=8", "--head_dim=128",
                            "--attention_heads=64", "--gpus=320GB",
                            "--params=70e9", "--weight_dtype=bf16",
                            "--overhead=20GB", "--context=8k,32k", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"weight_bytes\": 140000000000,"));
  EXPECT_THAT(r.out, HasSubstr("\"tokens_that_fit\": 488281,"));
  EXPECT_THAT(r.out, HasSubstr("\"name\": \"custom\""));
  EXPECT_THAT(r.out, Not(HasSubstr("131072")));
  EXPECT_THAT(r.out, HasSubstr("70,000,000,000 parameters x 16 bits"));
}

TEST(PlanCommandTest, OverridesAndOptions) {
  std::vector<std::string> args = kLlama70b;
  for (const char* extra : {"--kv_dtype", "fp8", "--block_size", "32",
                            "--actual_len", "0", "--json"}) {
    args.push_back(extra);
  }
  const Result r = RunPlan(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"bytes_per_token\": 163840,"));
  EXPECT_THAT(r.out, HasSubstr("\"block_bytes\": 5242880,"));
  EXPECT_THAT(r.out, HasSubstr("\"waste\": null"));
}

TEST(PlanCommandTest, HfConfigFile) {
  const std::string path = ::testing::TempDir() + "/prefixd_plan_test." +
                           std::to_string(getpid()) + ".json";
  {
    std::ofstream file(path);
    file << R"({"model_type": "llama", "hidden_size": 4096,
               "num_attention_heads": 32, "num_hidden_layers": 32})";
  }
  const Result r = RunPlan(
      {"--hf_config", path, "--gpus", "H100-80GB", "--weights", "16GB"});
  std::remove(path.c_str());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("note: " + path +
                               ": num_key_value_heads "
                               "absent: assumed multi-head attention"));
  EXPECT_THAT(r.out, HasSubstr("524,288 B (512 KiB)"));
  EXPECT_THAT(r.out, HasSubstr("MHA-32 *"));
}

// --batch: the forward calculator. The headline table (Llama-3-70B, fp16, 8k
// context, batch 32: 640 / 80 / 10 GiB) and its int4 row read off the
// output.
TEST(PlanCommandTest, ForwardLlama70bTable) {
  const Result r = RunPlan({"--model", "llama-3-70b", "--batch", "32",
                            "--context", "8k", "--weights", "140GB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(
      r.out, HasSubstr("Batch x context   32 x 8,192 tokens = 262,144 tokens"));
  EXPECT_THAT(r.out,
              HasSubstr("KV cache          85,899,345,920 B (80 GiB) = 262,144 "
                        "tokens x 327,680 B"));
  EXPECT_THAT(r.out, HasSubstr("  dtype    MHA-64  GQA-8 *    MQA-1\n"
                               "  fp16 *  640 GiB   80 GiB   10 GiB\n"
                               "  fp8     320 GiB   40 GiB    5 GiB\n"
                               "  int4    160 GiB   20 GiB  2.5 GiB\n"));
  EXPECT_THAT(r.out, HasSubstr("Weights           140,000,000,000 B (140 GB)"));
  EXPECT_THAT(r.out, HasSubstr("427,247 cached tokens in flight"));
  // 225,899,345,920 B: 3 H100-80GB; 80 GiB alone is 107% of one.
  EXPECT_THAT(r.out, HasSubstr("  H100-80GB    80 GB            3          "
                               "107%  exceeds one GPU\n"));
  EXPECT_THAT(r.out, HasSubstr("  H200-141GB  141 GB            2           "
                               "60%     fits one GPU\n"));
}

// The 8B crossover: Llama-3-8B's 15 GB of fp16 weights equal the KV of
// ceil(15e9 / 131,072) = 114,441 tokens.
TEST(PlanCommandTest, ForwardLlama8bCrossover) {
  const Result r =
      RunPlan({"--model", "llama-3-8b", "--batch", "1", "--context", "114441",
               "--weights", "15GB", "--gpus", "L4-24GB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Decode crossover  114,441 cached tokens"));
  EXPECT_THAT(r.out, HasSubstr("KV cache          15,000,010,752 B"));
  EXPECT_THAT(r.out, HasSubstr("GPUs              1 x L4-24GB = 24 GB: do not "
                               "fit, 5.59 GiB short"));
}

TEST(PlanCommandTest, ForwardJson) {
  const Result r =
      RunPlan({"--model", "llama-3-70b", "--batch", "32", "--context", "8192",
               "--kv_dtype", "int4", "--gpus", "8xH100-80GB", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"kv_dtype\": \"int4\""));
  EXPECT_THAT(r.out, HasSubstr("\"kv_bytes\": 21474836480,"));
  EXPECT_THAT(r.out, HasSubstr("\"weight_bytes\": 0,"));
  EXPECT_THAT(r.out,
              HasSubstr("{\"label\": \"MHA-64\", \"kv_heads\": 64, "
                        "\"is_model\": false, \"dtypes\": [{\"dtype\": "
                        "\"fp16\", \"bytes_per_token\": 2621440, \"kv_bytes\": "
                        "687194767360}, {\"dtype\": \"fp8\", "
                        "\"bytes_per_token\": 1310720, \"kv_bytes\": "
                        "343597383680}, {\"dtype\": \"int4\", "
                        "\"bytes_per_token\": 655360, \"kv_bytes\": "
                        "171798691840}]}"));
  EXPECT_THAT(r.out, HasSubstr("\"total_bytes\": 640000000000, \"fits\": "
                               "true}"));
  EXPECT_THAT(r.out, HasSubstr("{\"gpu\": \"A10-24GB\", \"memory_bytes\": "
                               "24000000000, \"gpus_needed\": 1, "
                               "\"kv_percent_of_gpu\": 89, \"kv_exceeds_gpu\": "
                               "false}"));
}

TEST(PlanCommandTest, ForwardUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<std::string> model = {"--model", "llama-3-8b"};
  for (const Case& c : {
           Case{{"--batch", "4"}, "--batch needs --context LEN"},
           Case{{"--batch", "0", "--context", "8k"},
                "--batch must be an integer >= 1, got \"0\""},
           Case{{"--batch", "4", "--context", "8k,32k"},
                "--batch takes one --context length, got 2 in \"8k,32k\""},
           Case{{"--batch", "4", "--context", "8k", "--block_size", "32"},
                "--block_size does not apply with --batch"},
           Case{{"--batch", "4", "--context", "8k", "--weights", "1GB",
                 "--params", "8B"},
                "exactly one of --weights"},
           Case{{"--batch", "4", "--context", "8k", "--gpus", "2xTPU"},
                "unknown GPU \"2xTPU\""},
       }) {
    std::vector<std::string> args = model;
    args.insert(args.end(), c.args.begin(), c.args.end());
    const Result r = RunPlan(args);
    EXPECT_EQ(r.code, 2) << c.message;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_EQ(r.out, "");
  }
}

TEST(PlanCommandTest, UsageErrors) {
  struct Case {
    std::vector<std::string> args;
    int code;
    const char* message;
  };
  for (const Case& c : {
           Case{{"--bogus"}, 2, "unknown flag --bogus"},
           Case{{"stray"}, 2, "unexpected argument"},
           Case{{"--model"}, 2, "--model needs a value"},
           Case{{"--gpus", "4xH100-80GB", "--weights", "1GB"}, 2, "no model"},
           Case{{"--model", "llama-3-70b", "--weights", "1GB"},
                2,
                "--gpus is required"},
           Case{{"--model", "llama-3-70b", "--gpus", "H100-80GB"},
                2,
                "exactly one of --weights"},
           Case{{"--model", "llama-3-70b", "--hf_config", "x.json"},
                2,
                "not both"},
           Case{{"--model", "gpt-5", "--gpus", "H100-80GB", "--weights", "1GB"},
                2,
                "unknown model preset"},
           Case{{"--model", "llama-3-70b", "--gpus", "9xTPU", "--weights",
                 "1GB"},
                2,
                "unknown GPU"},
           Case{{"--model", "llama-3-70b", "--gpus", "H100-80GB", "--weights",
                 "lots"},
                2,
                "invalid size \"lots\""},
           Case{{"--model", "llama-3-70b", "--gpus", "H100-80GB", "--weights",
                 "1GB", "--context", "8q"},
                2,
                "--context"},
           Case{{"--model", "llama-3-70b", "--gpus", "H100-80GB", "--weights",
                 "1GB", "--block_size", "0"},
                2,
                "--block_size must be an integer >= 1"},
           Case{{"--json=yes"}, 2, "takes no value"},
           Case{{"--model", "llama-3-70b", "--gpus", "H100-80GB", "--weights",
                 "140GB"},
                1,
                "exceed GPU memory"},
           Case{{"--hf_config", "/nonexistent/config.json", "--gpus",
                 "H100-80GB", "--weights", "1GB"},
                1,
                "cannot read /nonexistent/config.json"},
       }) {
    const Result r = RunPlan(c.args);
    EXPECT_EQ(r.code, c.code) << c.message;
    EXPECT_THAT(r.err, HasSubstr(c.message));
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
}  // namespace prefixd
