#include "client/plan.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
  for (const char* flag : {"--model",          "--hf_config",
                           "--layers",         "--kv_heads",
                           "--head_dim",       "--attention_heads",
                           "--kv_lora_rank",   "--qk_rope_head_dim",
                           "--sliding_window", "--sliding_layers",
                           "--state_layers",   "--state_bytes",
                           "--kv_dtype",       "--gpus",
                           "--weights",        "--params",
                           "--weight_dtype",   "--overhead",
                           "--context",        "--block_size",
                           "--actual_len",     "--max_seq_len",
                           "--json",           "--help"}) {
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

// Without --gpus: the geometry, bytes per token, the KV of a sequence and,
// with the weights, the decode crossover; nothing that needs a KV budget.
TEST(PlanCommandTest, WithoutGpusTheGeometryAndTheCrossover) {
  Result r = RunPlan({"--model", "llama-3-8b", "--params", "8B"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, HasSubstr("Bytes per token   131,072 B (128 KiB) = 2 x 32 "
                               "layers x 8 kv_heads x 128 head_dim x 2 B\n"));
  EXPECT_THAT(r.out, HasSubstr("Block bytes       2,097,152 B (2 MiB)"));
  EXPECT_THAT(r.out, HasSubstr("Weights           16,000,000,000 B (16 GB)\n"));
  EXPECT_THAT(r.out, HasSubstr("Decode crossover  122,071 cached tokens in "
                               "flight read as many bytes per decode step as "
                               "the weights\n"));
  EXPECT_THAT(r.out, HasSubstr("GPUs              not given: --gpus"));
  EXPECT_THAT(r.out, HasSubstr("  context            KV per sequence\n"
                               "    8,192    1,073,741,824 B (1 GiB)\n"));
  EXPECT_THAT(r.out,
              HasSubstr("  GQA-8 *         8      131,072    122,071\n"));
  for (const char* absent :
       {"\nKV budget ", "\nTokens that fit", "concurrent", "contiguous"}) {
    EXPECT_THAT(r.out, Not(HasSubstr(absent)));
  }
  r = RunPlan({"--model", "llama-3-8b"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("Decode crossover  give --weights or --params\n"));
  r = RunPlan({"--model", "llama-3-8b", "--params", "8B", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* field :
       {"\"gpus\": null", "\"kv_budget_bytes\": null",
        "\"tokens_that_fit\": null", "\"crossover_tokens\": 122071",
        "\"bytes_per_token\": 131072", "\"concurrent_sequences\": null",
        "\"waste\": null"}) {
    EXPECT_THAT(r.out, HasSubstr(field));
  }
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
  // 225,899,345,920 B: 3 H100-80GB, so tensor parallel 4 (64 heads split
  // 4 ways, not 3); 80 GiB alone is 107% of one.
  EXPECT_THAT(r.out, HasSubstr("  gpu           memory  gpus needed  tensor "
                               "parallel  KV / one GPU      cache alone\n"));
  EXPECT_THAT(r.out, HasSubstr("  H100-80GB      80 GB            3          "
                               "      4          107%  exceeds one GPU\n"));
  EXPECT_THAT(r.out, HasSubstr("  H200-141GB    141 GB            2          "
                               "      2           60%     fits one GPU\n"));
  EXPECT_THAT(r.out, HasSubstr("  L40S-48GB      48 GB            5          "
                               "      8          178%  exceeds one GPU\n"));
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
                               "\"tensor_parallel\": 1, "
                               "\"kv_percent_of_gpu\": 89, \"kv_exceeds_gpu\": "
                               "false}"));
}

// Gemma-2-9B: half its 42 layers slide over 4,096 tokens, so a sequence of
// 8,192 holds (8,192 x 21 + 4,096 x 21) x 8,192 B, not 8,192 x 344,064 B.
TEST(PlanCommandTest, ForwardSlidingWindowPerSequence) {
  const Result r = RunPlan({"--model", "gemma-2-9b", "--batch", "4",
                            "--context", "8k", "--weights", "10GB", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"sequence_bytes\": 2113929216,"));
  EXPECT_THAT(r.out, HasSubstr("\"kv_bytes\": 8455716864,"));
  EXPECT_THAT(r.out, HasSubstr("\"sliding_window\": 4096, "
                               "\"sliding_layers\": 21"));
  EXPECT_THAT(r.out, HasSubstr("\"crossover_context\": 10437,"));
  const Result text = RunPlan({"--model", "gemma-2-9b", "--batch", "4",
                               "--context", "8k", "--weights", "10GB"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out,
              HasSubstr("Per sequence      2,113,929,216 B (1.97 GiB) = "
                        "(8,192 tokens x 21 layers + 4,096 tokens x 21 "
                        "sliding layers) x 8,192 B\n"));
  EXPECT_THAT(text.out, HasSubstr("KV cache          8,455,716,864 B (7.88 "
                                  "GiB) = 4 x 2,113,929,216 B\n"));
  EXPECT_THAT(text.out, HasSubstr("Decode crossover  10,437 tokens per "
                                  "sequence (41,748 in flight)"));
}

// DeepSeek-V3's latent is shared by all heads: one row, no MHA or MQA.
TEST(PlanCommandTest, ForwardMlaHasOneColumn) {
  const Result r = RunPlan({"--model", "deepseek-v3", "--batch", "2",
                            "--context", "1000", "--kv_dtype", "nvfp4"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  dtype         MLA *\n"
                               "  fp16     134.03 MiB\n"));
  EXPECT_THAT(r.out, HasSubstr("  nvfp4 *   37.70 MiB\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("MQA-1")));
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

// The published config.json files in tests/data/hf_configs.
std::string HfConfig(const std::string& name) {
  return std::string(PREFIXD_SOURCE_DIR) + "/tests/data/hf_configs/" + name;
}

// DeepSeek-V3 caches one latent of kv_lora_rank + qk_rope_head_dim values
// per layer: (512 + 64) x 61 x 2 B, not 128 KV heads x 56 x 2 x 61 x 2.
// prefixd's --model takes a config.json path; so does plan's, as
// --hf_config.
TEST(PlanCommandTest, ModelFlagTakesAConfigJsonAsPrefixdDoes) {
  const std::string path = HfConfig("gemma-2-9b.json");
  const Result by_model = RunPlan({"--model", path, "--params", "9B"});
  const Result by_hf = RunPlan({"--hf_config", path, "--params", "9B"});
  ASSERT_EQ(by_model.code, 0) << by_model.err;
  EXPECT_EQ(by_model.out, by_hf.out);
  EXPECT_THAT(by_model.out, HasSubstr("344,064 B (336 KiB)"));
}

TEST(PlanCommandTest, DeepSeekV3IsSizedAsLatentAttention) {
  for (const std::vector<std::string>& model :
       {std::vector<std::string>{"--model", "deepseek-v3"},
        std::vector<std::string>{"--hf_config",
                                 HfConfig("deepseek-v3.json")}}) {
    std::vector<std::string> args = model;
    for (const char* arg :
         {"--kv_dtype", "bf16", "--gpus", "8xH200-141GB", "--params", "671B",
          "--weight_dtype", "fp8", "--overhead", "57GB"}) {
      args.push_back(arg);
    }
    const Result r = RunPlan(args);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("70,272 B (68.62 KiB) = 61 layers x (512 "
                                 "kv_lora_rank + 64 qk_rope_head_dim) x 2 B"));
    EXPECT_THAT(r.out, HasSubstr("400,000,000,000 B (400 GB)"));
    EXPECT_THAT(r.out, HasSubstr("5,692,167 (355,760 blocks of 16 tokens)"));
    EXPECT_THAT(r.out, HasSubstr("131,072  9,210,691,584 B"));
    EXPECT_THAT(r.out, HasSubstr("KV heads as the only variable: not "
                                 "applicable"));
    EXPECT_THAT(r.out, Not(HasSubstr("1,748,992")));
  }
}

TEST(PlanCommandTest, Nvfp4CountsItsScales) {
  std::vector<std::string> args = kLlama70b;
  args[3] = "nvfp4";  // --kv_dtype
  args.push_back("--json");
  const Result r = RunPlan(args);
  ASSERT_EQ(r.code, 0) << r.err;
  // 2 x 80 x 8 x (128 x 4 bits + 128 / 16 x 8 bits) / 8.
  EXPECT_THAT(r.out, HasSubstr("\"bytes_per_token\": 92160,"));
  EXPECT_THAT(r.out, HasSubstr("\"kv_dtype\": \"nvfp4\""));
  const Result text =
      RunPlan({"--layers=80", "--kv_heads=8", "--head_dim=72",
               "--kv_dtype=nvfp4", "--gpus=H100-80GB", "--weights=0"});
  EXPECT_EQ(text.code, 1);
  EXPECT_THAT(text.err, HasSubstr("head_dim 72 is not a multiple of 16"));
}

TEST(PlanCommandTest, SlidingWindowLayersStopAtTheWindow) {
  // Gemma 2 9B: 21 of 42 layers slide over 4,096 tokens. At 32k a sequence
  // holds 32,768 + 4,096 tokens' worth of 172,032 B, and in whole blocks
  // 32,768 + 257 x 16, so 61.5e9 / 6,344,540,160 = 9 fit (not 5).
  const Result r =
      RunPlan({"--hf_config", HfConfig("gemma-2-9b.json"), "--kv_dtype", "bf16",
               "--gpus", "H100-80GB", "--weights", "18.5GB", "--context",
               "4k,32k", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"bytes_per_token\": 344064,"));
  EXPECT_THAT(r.out, HasSubstr("\"window_bytes_per_token\": 172032,"));
  EXPECT_THAT(r.out, HasSubstr("{\"context_len\": 4096, "
                               "\"kv_bytes_per_sequence\": 1409286144, "
                               "\"concurrent_sequences\": 43}"));
  EXPECT_THAT(r.out, HasSubstr("{\"context_len\": 32768, "
                               "\"kv_bytes_per_sequence\": 6341787648, "
                               "\"concurrent_sequences\": 9}"));
  // Mistral-7B-v0.1 slides every layer: 128k tokens hold 4,096 tokens' KV.
  const Result mistral = RunPlan(
      {"--hf_config", HfConfig("mistral-7b-v0.1.json"), "--gpus", "H100-80GB",
       "--weights", "14.5GB", "--context", "128k", "--json"});
  ASSERT_EQ(mistral.code, 0) << mistral.err;
  EXPECT_THAT(mistral.out,
              HasSubstr("{\"context_len\": 131072, \"kv_bytes_per_sequence\": "
                        "536870912, \"concurrent_sequences\": 121}"));
}

TEST(PlanCommandTest, HybridModelsCountOnlyAttentionLayersAndAState) {
  const Result qwen =
      RunPlan({"--hf_config", HfConfig("qwen3-next-80b-a3b-instruct.json"),
               "--gpus", "4xH100-80GB", "--weights", "160GB", "--json"});
  ASSERT_EQ(qwen.code, 0) << qwen.err;
  // 12 of 48 layers: 2 x 12 x 2 x 256 x 2 B; 36 x 548,864 values x 2 B.
  EXPECT_THAT(qwen.out, HasSubstr("\"bytes_per_token\": 24576,"));
  EXPECT_THAT(qwen.out, HasSubstr("\"state_bytes_per_sequence\": 39518208,"));
  EXPECT_THAT(qwen.out, HasSubstr("{\"context_len\": 8192, "
                                  "\"kv_bytes_per_sequence\": 240844800, "));
  const Result jamba =
      RunPlan({"--hf_config", HfConfig("jamba-v0.1.json"), "--gpus",
               "H100-80GB", "--weights", "0", "--json"});
  ASSERT_EQ(jamba.code, 0) << jamba.err;
  EXPECT_THAT(jamba.out, HasSubstr("\"bytes_per_token\": 16384,"));
  EXPECT_THAT(jamba.out, HasSubstr("\"state_bytes_per_sequence\": 8716288,"));
}

TEST(PlanCommandTest, RefusesWhatItCannotSizeNamingTheField) {
  struct Case {
    const char* json;
    const char* field;
  };
  for (const Case& c : {
           Case{R"({"num_hidden_layers": 4, "num_attention_heads": 8,
                    "hidden_size": 512, "kv_lora_rank": 64})",
                "qk_rope_head_dim is missing"},
           Case{R"({"num_hidden_layers": 2, "num_attention_heads": 8,
                    "hidden_size": 512,
                    "hybrid_override_pattern": "M*"})",
                "hybrid_override_pattern"},
           Case{R"({"num_hidden_layers": 2, "num_attention_heads": 8,
                    "hidden_size": 512, "layer_types":
                    ["full_attention", "chunked_attention"]})",
                "layer_types[1] \"chunked_attention\""},
           Case{R"({"num_hidden_layers": 8, "num_attention_heads": 8,
                    "hidden_size": 512, "attn_layer_period": 8,
                    "attn_layer_offset": 4, "mamba_d_conv": 4,
                    "mamba_expand": 2})",
                "mamba_d_state is missing"},
       }) {
    const std::string path = ::testing::TempDir() + "/prefixd_plan_refuse." +
                             std::to_string(getpid()) + ".json";
    std::ofstream(path) << c.json;
    const Result r =
        RunPlan({"--hf_config", path, "--gpus", "H100-80GB", "--weights", "0"});
    std::remove(path.c_str());
    EXPECT_EQ(r.code, 1) << c.json;
    EXPECT_THAT(r.err, HasSubstr(c.field)) << c.json;
  }
}

TEST(PlanCommandTest, SizesNeedAUnit) {
  for (const auto& [flag, value] :
       {std::pair<const char*, const char*>{"--weights", "140"},
        {"--overhead", "20"}}) {
    std::vector<std::string> args = {"--model",     "llama-3-70b", "--gpus",
                                     "4xH100-80GB", "--weights",   "140GB"};
    if (std::string(flag) == "--weights") {
      args[5] = value;
    } else {
      args.push_back(flag);
      args.push_back(value);
    }
    const Result r = RunPlan(args);
    EXPECT_EQ(r.code, 2) << flag;
    EXPECT_THAT(r.err, HasSubstr(std::string(flag) + " " + value +
                                 ": a size needs a unit"));
    EXPECT_EQ(r.out, "");
  }
  const Result gpus = RunPlan(
      {"--model", "llama-3-70b", "--gpus", "4x80", "--weights", "140GB"});
  EXPECT_EQ(gpus.code, 2);
  EXPECT_THAT(gpus.err, HasSubstr("GPU memory 80: a size needs a unit"));
  EXPECT_EQ(
      RunPlan({"--model", "llama-3-70b", "--gpus", "4x80GB", "--weights", "0"})
          .code,
      0);
}

TEST(PlanCommandTest, CurrentGpus) {
  struct Case {
    const char* gpus;
    const char* bytes;
    const char* named;
  };
  for (const Case& c : {
           Case{"8xB200", "1,440,000,000,000 B", "= 8 x B200-180GB"},
           Case{"4xGB200", "744,000,000,000 B", "= 4 x GB200-186GB"},
           Case{"8xMI300X", "1,536,000,000,000 B", "= 8 x MI300X-192GB"},
           Case{"8xH200", "1,128,000,000,000 B", "= 8 x H200-141GB"},
           Case{"2xL40S", "96,000,000,000 B", "= 2 x L40S-48GB"},
       }) {
    const Result r =
        RunPlan({"--model", "llama-3-70b", "--gpus", c.gpus, "--weights", "0"});
    ASSERT_EQ(r.code, 0) << c.gpus << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("GPU memory        ", c.bytes)));
    EXPECT_THAT(r.out, HasSubstr(c.named));
  }
  const Result h100 =
      RunPlan({"--model", "llama-3-70b", "--gpus", "4xH100", "--weights", "0"});
  EXPECT_EQ(h100.code, 2);
  EXPECT_THAT(h100.err, HasSubstr("\"4xH100\" is ambiguous: say H100-80GB or "
                                  "H100-94GB"));
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
           Case{{"--model", "llama-3-70b", "--gpus", "H100-80GB"},
                2,
                "exactly one of --weights"},
           Case{{"--model", "llama-3-70b", "--hf_config", "x.json"},
                2,
                "not both"},
           Case{{"--model", "gpt-5", "--gpus", "H100-80GB", "--weights", "1GB"},
                2,
                "unknown model preset \"gpt-5\"; known presets: llama-3-8b, "
                "llama-3-70b, mistral-7b, gemma-2-9b, gemma-3-27b, "
                "deepseek-v3, qwen3-next-80b-a3b, jamba-v0.1; a Hugging Face "
                "config.json is read with --hf_config=FILE (or --model=FILE "
                "when its name ends in .json)"},
           Case{
               {"--model", "/nonexistent/config.json", "--hf_config", "x.json"},
               2,
               "not both"},
           Case{{"--model", "/nonexistent/config.json"},
                1,
                "cannot read /nonexistent/config.json"},
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
