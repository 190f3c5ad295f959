#include "model/plan_report.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "model/forward.h"
#include "model/hf_config.h"
#include "model/planner.h"
#include "model/units.h"

namespace prefixd {
namespace {

const std::vector<FlagSpec>& PlanFlagTable() {
  static const auto* flags = new std::vector<FlagSpec>{
      {"model", "PRESET|FILE",
       "model preset: llama-3-8b, llama-3-70b, mistral-7b, gemma-2-9b, "
       "gemma-3-27b, deepseek-v3, qwen3-next-80b-a3b, jamba-v0.1; or, as "
       "prefixd's --model, a Hugging Face config.json (a name ending in "
       ".json: --hf_config)",
       ""},
      {"hf_config", "FILE", "read the model from a Hugging Face config.json",
       ""},
      {"hf_config_json", "TEXT",
       "the text of a Hugging Face config.json, read as --hf_config reads a "
       "file (the daemon's /plan page sends it; the daemon reads no files)",
       ""},
      {"layers", "N", "layers (sets or overrides the model's)", ""},
      {"kv_heads", "N", "KV heads (num_key_value_heads)", ""},
      {"head_dim", "N", "dimension of one attention head", ""},
      {"attention_heads", "N",
       "query heads (num_attention_heads), for the MHA comparison", ""},
      {"kv_lora_rank", "N",
       "multi-head latent attention: latent values per layer (with "
       "--qk_rope_head_dim; sets kv_heads 1)",
       ""},
      {"qk_rope_head_dim", "N", "MLA: rotated key values per layer", ""},
      {"sliding_window", "N",
       "tokens a sliding-window layer attends to (with --sliding_layers)", ""},
      {"sliding_layers", "N", "how many of --layers use the sliding window",
       ""},
      {"state_layers", "N",
       "hybrid models: layers with a fixed state per sequence and no KV, "
       "besides --layers (with --state_bytes)",
       ""},
      {"state_bytes", "SIZE", "state of one such layer per sequence, e.g. 1MiB",
       ""},
      {"kv_dtype", "DTYPE",
       "KV cache dtype: fp32 fp16 bf16 fp8 int8 int4 nvfp4 (4 bits + one "
       "fp8 scale per 16 values)",
       "fp16"},
      {"gpus", "GPUS",
       "GPU memory: 4xH100-80GB, 8xB200, "
       "H100-80GB, 4x80GiB or a size. Known: H100-80GB H100-94GB H200-141GB "
       "B200-180GB GB200-186GB MI300X-192GB A100-40GB A100-80GB L40S-48GB "
       "A10-24GB L4-24GB; GB in a GPU name is 10^9 bytes",
       ""},
      {"weights", "SIZE", "weight bytes with a unit, e.g. 140GB", ""},
      {"params", "COUNT",
       "parameter count instead of --weights, e.g. 70e9 or 70B", ""},
      {"weight_dtype", "DTYPE", "dtype of the weights for --params", "fp16"},
      {"overhead", "SIZE",
       "memory kept back for activations, CUDA graphs, fragmentation", "0"},
      {"context", "LIST",
       "context lengths in tokens, k = 1024; with --batch one length",
       "8k,32k,128k"},
      {"batch", "N",
       "sequences in flight: print the KV bytes of N x --context tokens per "
       "KV-head variant and dtype, and the GPUs the weights plus cache need",
       ""},
      {"block_size", "N", "tokens per KV block", "16"},
      {"actual_len", "N",
       "tokens of the sequence in the paged-vs-contiguous comparison (0 "
       "skips it)",
       "1000"},
      {"max_seq_len", "N",
       "tokens a contiguous allocator reserves per sequence",
       "the largest --context"},
      {"json", "",
       "print JSON for scripts instead of tables (numbers as numbers, exact "
       "integers)",
       ""},
      {"help", "", "print this help", ""},
  };
  return *flags;
}

absl::StatusOr<int64_t> Integer(const ParsedFlags& flags,
                                const std::string& name, int64_t fallback,
                                int64_t min) {
  const std::string* text = flags.Find(name);
  if (text == nullptr) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(*text, &value) || value < min || value > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, " must be an integer >= ", min, ", got \"", *text, "\""));
  }
  return value;
}

// "8k,32k,128k": k = 1024 and M = 1024^2 tokens, as context windows are
// named.
absl::StatusOr<std::vector<int64_t>> ParseContexts(absl::string_view text) {
  std::vector<int64_t> lengths;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    absl::string_view digits = absl::StripAsciiWhitespace(part);
    int64_t multiplier = 1;
    if (absl::ConsumeSuffix(&digits, "k") ||
        absl::ConsumeSuffix(&digits, "K")) {
      multiplier = 1024;
    } else if (absl::ConsumeSuffix(&digits, "M") ||
               absl::ConsumeSuffix(&digits, "m")) {
      multiplier = 1024 * 1024;
    }
    int64_t value = 0;
    if (!absl::SimpleAtoi(digits, &value) || value <= 0 ||
        value > (int64_t{1} << 40) / multiplier) {
      return absl::InvalidArgumentError(
          absl::StrCat("--context: invalid length \"", part,
                       "\"; expected e.g. 8k,32k,128k or 8192"));
    }
    lengths.push_back(value * multiplier);
  }
  if (lengths.empty()) {
    return absl::InvalidArgumentError("--context: no lengths given");
  }
  return lengths;
}

absl::Status Usage(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// Everything the reports show besides the Plan itself.
struct PlanRequest {
  PlanInput input;
  GpuPool gpus;
  std::vector<std::string> notes;
  // --batch: the forward calculator's inputs (model/forward.h).
  ForwardInput forward;
  bool has_gpus = false;
  bool has_weights = false;
};

// --qk_rope_head_dim is MLA's head_dim (its rotated key part), with one
// latent "head"; --state_bytes is a size.
absl::Status ReadMlaAndState(const ParsedFlags& flags, bool base_mla,
                             ModelGeometry& g) {
  ASSIGN_OR_RETURN(const int64_t rope_dim,
                   Integer(flags, "qk_rope_head_dim", 0, 1));
  if (!base_mla && (rope_dim > 0) != (g.kv_lora_rank > 0)) {
    return Usage("give --kv_lora_rank and --qk_rope_head_dim together");
  }
  if (rope_dim > 0) g.head_dim = static_cast<int>(rope_dim);
  if (g.kv_lora_rank > 0) g.kv_heads = 1;
  if (const std::string* state = flags.Find("state_bytes")) {
    ASSIGN_OR_RETURN(g.state_bytes_per_layer,
                     ParseSizeWithUnit("--state_bytes", *state));
  }
  return absl::OkStatus();
}

// The model of --model, --hf_config or --hf_config_json, if any. Usage
// errors are INVALID_ARGUMENT; a model that cannot be read is
// FAILED_PRECONDITION.
absl::Status ReadBaseModel(const ParsedFlags& flags, PlanRequest& req) {
  ModelGeometry& g = req.input.geometry;
  const std::string* preset = flags.Find("model");
  const std::string* hf = flags.Find("hf_config");
  const std::string* hf_text = flags.Find("hf_config_json");
  if (preset != nullptr && hf != nullptr) {
    return Usage("give --model or --hf_config, not both");
  }
  if (hf_text != nullptr && (preset != nullptr || hf != nullptr)) {
    return Usage("give --hf_config_json alone, without --model or --hf_config");
  }
  // prefixd's rule for --model: a name ending in .json is a config.json.
  if (preset != nullptr && absl::EndsWith(*preset, ".json")) {
    std::swap(preset, hf);
  }
  if (preset != nullptr) {
    absl::StatusOr<ModelPreset> p = FindPreset(*preset);
    if (!p.ok()) {
      return Usage(absl::StrCat(
          p.status().message(), "; a Hugging Face config.json is read with ",
          "--hf_config=FILE (or --model=FILE when its name ends in .json)"));
    }
    g = p->geometry;
    return absl::OkStatus();
  }
  if (hf == nullptr && hf_text == nullptr) return absl::OkStatus();
  const std::string source = hf != nullptr ? *hf : "config.json";
  absl::StatusOr<ModelSpecFromHf> spec =
      hf != nullptr ? ReadHfConfig(*hf) : ParseHfConfig(*hf_text);
  if (!spec.ok()) {
    return absl::FailedPreconditionError(
        hf != nullptr
            ? spec.status().message()
            : absl::StrCat("--hf_config_json: ", spec.status().message()));
  }
  g = spec->geometry;
  if (g.name.empty()) g.name = source;
  for (std::string& note : spec->notes) {
    req.notes.push_back(absl::StrCat(source, ": ", note));
  }
  return absl::OkStatus();
}

// The model (ReadBaseModel), then explicit numbers on top.
absl::Status ReadModel(const ParsedFlags& flags, PlanRequest& req) {
  ModelGeometry& g = req.input.geometry;
  RETURN_IF_ERROR(ReadBaseModel(flags, req));
  const bool base_mla = g.kv_lora_rank > 0;
  for (auto [name, field] : {std::pair<const char*, int*>{"layers", &g.layers},
                             {"kv_heads", &g.kv_heads},
                             {"head_dim", &g.head_dim},
                             {"attention_heads", &g.attention_heads},
                             {"kv_lora_rank", &g.kv_lora_rank},
                             {"sliding_window", &g.sliding_window},
                             {"sliding_layers", &g.sliding_layers},
                             {"state_layers", &g.state_layers}}) {
    ASSIGN_OR_RETURN(int64_t value, Integer(flags, name, *field, 1));
    *field = static_cast<int>(value);
  }
  RETURN_IF_ERROR(ReadMlaAndState(flags, base_mla, g));
  if (g.layers == 0 || g.kv_heads == 0 || g.head_dim == 0) {
    return Usage(
        "no model: give --model PRESET, --hf_config FILE, or --layers, "
        "--kv_heads and --head_dim");
  }
  if (g.name.empty()) g.name = "custom";
  return absl::OkStatus();
}

// --weights or --params, at most one; required unless `optional`.
absl::Status ReadWeights(const ParsedFlags& flags, bool optional,
                         PlanRequest& req) {
  const std::string* weights = flags.Find("weights");
  const std::string* params = flags.Find("params");
  if (weights != nullptr && params != nullptr) {
    return Usage(
        "give exactly one of --weights SIZE or --params COUNT, not both");
  }
  req.has_weights = weights != nullptr || params != nullptr;
  if (!req.has_weights) {
    if (optional) return absl::OkStatus();
    return Usage(
        "give exactly one of --weights SIZE or --params COUNT (use "
        "--weights 0 when the weights live elsewhere)");
  }
  PlanInput& in = req.input;
  if (weights != nullptr) {
    ASSIGN_OR_RETURN(in.weight_bytes, ParseSizeWithUnit("--weights", *weights));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const uint64_t count, ParseCount(*params));
  const std::string* dtype_name = flags.Find("weight_dtype");
  ASSIGN_OR_RETURN(const KvDtype dtype,
                   ParseKvDtype(dtype_name ? *dtype_name : "fp16"));
  ASSIGN_OR_RETURN(in.weight_bytes, WeightBytes(count, dtype));
  req.notes.push_back(
      absl::StrCat("weights: ", FormatCount(count), " parameters x ",
                   KvDtypeBits(dtype), " bits",
                   KvDtypeScaleGroup(dtype) > 0
                       ? absl::StrCat(" + 8 per ", KvDtypeScaleGroup(dtype))
                       : ""));
  return absl::OkStatus();
}

// --gpus, --weights/--params and --overhead. The weights are required with
// --gpus (the KV budget is what they leave) and optional otherwise: without
// GPUs the plan is the model's geometry, and the decode crossover if the
// weights are known; with --batch the cache is sized whatever holds it.
absl::Status ReadMemory(const ParsedFlags& flags, PlanRequest& req) {
  PlanInput& in = req.input;
  const std::string* gpus = flags.Find("gpus");
  req.has_gpus = gpus != nullptr;
  if (gpus != nullptr) {
    ASSIGN_OR_RETURN(req.gpus, ParseGpus(*gpus));
    in.gpu_bytes = req.gpus.total_bytes;
  }
  const bool forward = flags.Has("batch");
  RETURN_IF_ERROR(ReadWeights(flags, forward || !req.has_gpus, req));
  if (const std::string* overhead = flags.Find("overhead")) {
    ASSIGN_OR_RETURN(in.overhead_bytes,
                     ParseSizeWithUnit("--overhead", *overhead));
  }
  return absl::OkStatus();
}

absl::Status ReadRest(const ParsedFlags& flags, PlanRequest& req) {
  PlanInput& in = req.input;
  const std::string* dtype = flags.Find("kv_dtype");
  ASSIGN_OR_RETURN(in.kv_dtype, ParseKvDtype(dtype ? *dtype : "fp16"));
  if (const std::string* contexts = flags.Find("context")) {
    ASSIGN_OR_RETURN(in.context_lengths, ParseContexts(*contexts));
  }
  ASSIGN_OR_RETURN(const int64_t block, Integer(flags, "block_size", 16, 1));
  in.block_size = static_cast<int>(block);
  ASSIGN_OR_RETURN(in.actual_len, Integer(flags, "actual_len", 1000, 0));
  ASSIGN_OR_RETURN(in.max_seq_len, Integer(flags, "max_seq_len", 0, 1));
  return absl::OkStatus();
}

// --batch N with one --context length: the forward calculator's inputs.
// The flags of the sequences-that-fit plan alone are refused rather than
// ignored, so that nobody reads a table that did not use them.
absl::Status ReadForward(const ParsedFlags& flags, PlanRequest& req) {
  for (const char* name : {"block_size", "actual_len", "max_seq_len"}) {
    if (flags.Find(name) != nullptr) {
      return Usage(absl::StrCat("--", name, " does not apply with --batch"));
    }
  }
  ForwardInput& f = req.forward;
  ASSIGN_OR_RETURN(f.batch, Integer(flags, "batch", 1, 1));
  const std::string* context = flags.Find("context");
  if (context == nullptr) {
    return Usage("--batch needs --context LEN, e.g. --context 8k");
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> lengths, ParseContexts(*context));
  if (lengths.size() != 1) {
    return Usage(absl::StrCat("--batch takes one --context length, got ",
                              lengths.size(), " in \"", *context, "\""));
  }
  const std::string* dtype = flags.Find("kv_dtype");
  ASSIGN_OR_RETURN(f.kv_dtype, ParseKvDtype(dtype ? *dtype : "fp16"));
  f.geometry = req.input.geometry;
  f.context_len = lengths[0];
  f.weight_bytes = req.input.weight_bytes;
  f.overhead_bytes = req.input.overhead_bytes;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Text: lines and tables

std::string Bytes(uint64_t bytes) {
  return absl::StrCat(FormatCount(bytes), " B (", FormatBytes(bytes), ")");
}

std::string BytesPerTokenFormula(const ModelGeometry& g, KvDtype dtype) {
  const std::string size = KvDtypeScaleGroup(dtype) > 0
                               ? absl::StrCat("(", KvDtypeSizeText(dtype), ")")
                               : KvDtypeSizeText(dtype);
  if (g.kv_lora_rank > 0) {
    return absl::StrCat(g.layers, " layers x (", g.kv_lora_rank,
                        " kv_lora_rank + ", g.head_dim, " qk_rope_head_dim) x ",
                        size);
  }
  return absl::StrCat("2 x ", g.layers, " layers x ", g.kv_heads,
                      " kv_heads x ", g.head_dim, " head_dim x ", size);
}

// Columns padded to their widest cell; the first `left` columns
// left-aligned (labels), the rest right-aligned (numbers).
std::string Table(const std::vector<std::vector<std::string>>& rows,
                  size_t left) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t c = 0; c < row.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = "  ";
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      if (c > 0) line += "  ";
      line += c < left ? row[c] + pad : pad + row[c];
    }
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return out;
}

std::string GpusText(const GpuPool& gpus) {
  return gpus.model.empty()
             ? absl::StrCat(gpus.count, " x ", FormatBytes(gpus.bytes_per_gpu))
             : absl::StrCat(gpus.count, " x ", gpus.model);
}

// The model, its bytes per token and per block: the first lines of every
// plan.
std::vector<PlanLine> GeometryLines(const PlanRequest& req, const Plan& plan) {
  const PlanInput& in = req.input;
  const ModelGeometry& g = in.geometry;
  std::vector<PlanLine> out = {
      {"model", "Model", ModelText(g)},
      {"kv_dtype", "KV dtype", std::string(KvDtypeName(in.kv_dtype))},
      {"bpt", "Bytes per token",
       absl::StrCat(Bytes(plan.bytes_per_token), " = ",
                    BytesPerTokenFormula(g, in.kv_dtype))}};
  if (g.sliding_layers > 0) {
    out.push_back(
        {"sliding", "Sliding layers",
         absl::StrCat(FormatCount(plan.window_bytes_per_token),
                      " B per token up to ", FormatCount(g.sliding_window),
                      " tokens per sequence; the other layers ",
                      FormatCount(plan.full_bytes_per_token), " B per token")});
  }
  if (g.state_layers > 0) {
    out.push_back(
        {"state", "State",
         absl::StrCat(Bytes(plan.state_bytes_per_sequence),
                      " per sequence = ", g.state_layers, " layers x ",
                      FormatCount(g.state_bytes_per_layer), " B")});
  }
  out.push_back({"block_bytes", "Block bytes",
                 absl::StrCat(Bytes(plan.block_bytes), " = ", in.block_size,
                              " tokens per block")});
  return out;
}

PlanLine CrossoverLine(const PlanRequest& req, const Plan& plan) {
  return {"crossover", "Decode crossover",
          req.has_weights
              ? absl::StrCat(FormatCount(plan.crossover_tokens),
                             " cached tokens in flight read as many bytes "
                             "per decode step as the weights")
              : "give --weights or --params"};
}

// Without --gpus: what does not depend on the KV budget.
void GeometryReport(const PlanRequest& req, const Plan& plan, PlanReport& r) {
  r.lines = GeometryLines(req, plan);
  if (req.has_weights) {
    r.lines.push_back({"weights", "Weights", Bytes(plan.weight_bytes)});
  }
  r.lines.push_back(CrossoverLine(req, plan));
  r.lines.push_back({"pool", "GPUs",
                     "not given: --gpus (e.g. 4xH100-80GB) adds the KV "
                     "budget and what fits in it"});
  PlanTable contexts{"contexts",
                     "KV per sequence",
                     {"context", "sequence"},
                     {{"context", "KV per sequence"}},
                     0};
  for (const ContextRow& row : plan.contexts) {
    contexts.rows.push_back(
        {FormatCount(row.context_len), Bytes(row.kv_bytes_per_sequence)});
  }
  r.tables.push_back(std::move(contexts));
  if (plan.head_variants.empty()) return;
  PlanTable variants{"variants",
                     "KV heads as the only variable (* = this model)",
                     {"variant", "kv_heads", "bpt", "crossover"},
                     {{"variant", "kv_heads", "bytes/token", "crossover"}},
                     1};
  for (const HeadVariant& v : plan.head_variants) {
    variants.rows.push_back(
        {absl::StrCat(v.label, v.is_model ? " *" : ""),
         absl::StrCat(v.kv_heads), FormatCount(v.bytes_per_token),
         req.has_weights ? FormatCount(v.crossover_tokens) : "-"});
  }
  r.tables.push_back(std::move(variants));
}

// With --gpus: the one-line figures, the budget's included.
std::vector<PlanLine> SummaryLines(const PlanRequest& req, const Plan& plan) {
  const PlanInput& in = req.input;
  std::vector<PlanLine> out = GeometryLines(req, plan);
  const std::string gpus = GpusText(req.gpus);
  out.push_back({"gpu_memory", "GPU memory",
                 absl::StrCat(Bytes(plan.gpu_bytes), " = ", gpus)});
  out.push_back({"weights", "Weights", Bytes(plan.weight_bytes)});
  out.push_back({"overhead", "Overhead", Bytes(plan.overhead_bytes)});
  out.push_back({"kv_budget", "KV budget",
                 absl::StrCat(Bytes(plan.kv_budget_bytes),
                              " = GPU memory - weights - overhead")});
  out.push_back({"tokens_that_fit", "Tokens that fit",
                 absl::StrCat(FormatCount(plan.tokens_that_fit), " (",
                              FormatCount(plan.budget_blocks), " blocks of ",
                              in.block_size, " tokens)")});
  out.push_back(CrossoverLine(req, plan));
  return out;
}

// KV per sequence and concurrent sequences, per context length.
PlanTable ContextTable(const Plan& plan) {
  PlanTable t{"contexts",
              "KV per sequence and sequences that fit at once",
              {"context", "sequence", "sequences"},
              {{"context", "KV per sequence", "concurrent sequences"}},
              0};
  for (const ContextRow& row : plan.contexts) {
    t.rows.push_back({FormatCount(row.context_len),
                      Bytes(row.kv_bytes_per_sequence),
                      FormatCount(row.concurrent_sequences)});
  }
  return t;
}

// The same budget with the KV-head count as the only variable.
PlanTable HeadVariantTable(const Plan& plan) {
  if (plan.head_variants.empty()) {
    return {"variants",
            "KV heads as the only variable: not applicable (MLA caches one "
            "latent per layer, whatever the head count)",
            {},
            {},
            1};
  }
  PlanTable t{"variants",
              "KV heads as the only variable (same budget; * = this model)",
              {"variant", "kv_heads", "bpt", "tokens_that_fit"},
              {{"variant", "kv_heads", "bytes/token", "tokens that fit"}},
              1};
  for (const ContextRow& row : plan.contexts) {
    t.keys.push_back(absl::StrCat("seqs@", row.context_len));
    t.rows[0].push_back(absl::StrCat("seqs@", FormatCount(row.context_len)));
  }
  t.keys.push_back("crossover");
  t.rows[0].push_back("crossover");
  for (const HeadVariant& v : plan.head_variants) {
    t.rows.push_back({absl::StrCat(v.label, v.is_model ? " *" : ""),
                      absl::StrCat(v.kv_heads), FormatCount(v.bytes_per_token),
                      FormatCount(v.tokens_that_fit)});
    for (const ContextRow& row : v.contexts) {
      t.rows.back().push_back(FormatCount(row.concurrent_sequences));
    }
    t.rows.back().push_back(FormatCount(v.crossover_tokens));
  }
  return t;
}

// Contiguous reservation against paged blocks for one sequence.
PlanTable WasteTable(const WasteReport& w) {
  return {
      "waste",
      absl::StrCat("One sequence of ", FormatCount(w.actual_len),
                   " tokens: contiguous reservation of max_seq_len ",
                   FormatCount(w.max_seq_len), " vs paged blocks of ",
                   w.block_size),
      {"allocation", "reserved", "wasted_tokens", "wasted_bytes", "sequences"},
      {{"allocation", "reserved tokens", "wasted tokens", "wasted bytes",
        "sequences that fit"},
       {"contiguous", FormatCount(w.contiguous_reserved_tokens),
        FormatCount(w.contiguous_wasted_tokens),
        Bytes(w.contiguous_wasted_bytes), FormatCount(w.contiguous_sequences)},
       {"paged", FormatCount(w.paged_reserved_tokens),
        FormatCount(w.paged_wasted_tokens), Bytes(w.paged_wasted_bytes),
        FormatCount(w.paged_sequences)}},
      1};
}

// With --gpus: the KV budget and what fits in it.
void BudgetReport(const PlanRequest& req, const Plan& plan, PlanReport& r) {
  r.lines = SummaryLines(req, plan);
  r.tables.push_back(ContextTable(plan));
  r.tables.push_back(HeadVariantTable(plan));
  if (plan.waste.has_value()) r.tables.push_back(WasteTable(*plan.waste));
}

// Whether the given GPUs hold weights + overhead + KV, and by how much.
std::string PoolVerdict(const GpuPool& gpus, uint64_t need) {
  const std::string pool =
      absl::StrCat(GpusText(gpus), " = ", FormatBytes(gpus.total_bytes));
  if (gpus.total_bytes >= need) {
    return absl::StrCat(pool, ": fit, ", FormatBytes(gpus.total_bytes - need),
                        " to spare");
  }
  return absl::StrCat(pool, ": do not fit, ",
                      FormatBytes(need - gpus.total_bytes), " short");
}

// The dtype x KV-head table: rows fp16, fp8, int4 (and the chosen dtype).
PlanTable ForwardKvTable(const ForwardInput& in, const Forward& f) {
  PlanTable t{"kv",
              absl::StrCat("KV cache of ", FormatCount(in.batch), " x ",
                           FormatCount(in.context_len),
                           " tokens by KV heads and dtype (* = this model, "
                           "this dtype)"),
              {"dtype"},
              {{"dtype"}},
              1};
  for (const ForwardVariant& v : f.variants) {
    t.keys.push_back(v.label);
    t.rows[0].push_back(absl::StrCat(v.label, v.is_model ? " *" : ""));
  }
  const std::vector<KvDtype> dtypes = ForwardDtypes(in.kv_dtype);
  for (size_t d = 0; d < dtypes.size(); ++d) {
    t.rows.push_back({absl::StrCat(KvDtypeName(dtypes[d]),
                                   dtypes[d] == in.kv_dtype ? " *" : "")});
    for (const ForwardVariant& v : f.variants) {
      t.rows.back().push_back(FormatBytes(v.cells[d].kv_bytes));
    }
  }
  return t;
}

PlanTable ForwardGpuTable(const Forward& f) {
  PlanTable t{"gpus",
              absl::StrCat("GPUs for weights + overhead + KV (",
                           FormatBytes(f.total_bytes), "), by GPU"),
              {"gpu", "memory", "need", "tensor_parallel", "pct", "alone"},
              {{"gpu", "memory", "gpus needed", "tensor parallel",
                "KV / one GPU", "cache alone"}},
              1};
  for (const GpuNeed& g : f.gpus) {
    t.rows.push_back(
        {g.gpu, FormatBytes(g.memory_bytes), FormatCount(g.gpus_needed),
         g.tensor_parallel > 0 ? FormatCount(g.tensor_parallel) : "none",
         absl::StrCat(FormatCount(g.kv_percent_of_gpu), "%"),
         g.kv_exceeds_gpu ? "exceeds one GPU" : "fits one GPU"});
  }
  return t;
}

bool KeepsEveryToken(const ModelGeometry& g) {
  return g.sliding_layers == 0 && g.state_layers == 0;
}

// The KV cache line; with sliding-window or state layers also the one
// sequence it is batch times, split by layer kind.
std::vector<PlanLine> ForwardKvLines(const ForwardInput& in, const Forward& f) {
  const ModelGeometry& g = in.geometry;
  if (KeepsEveryToken(g)) {
    return {{"kv", "KV cache",
             absl::StrCat(Bytes(f.kv_bytes), " = ", FormatCount(f.tokens),
                          " tokens x ", FormatCount(f.bytes_per_token), " B")}};
  }
  const uint64_t layer = f.bytes_per_token / static_cast<uint64_t>(g.layers);
  const int64_t window = std::min<int64_t>(in.context_len, g.sliding_window);
  std::string parts =
      absl::StrCat("(", FormatCount(in.context_len), " tokens x ",
                   g.layers - g.sliding_layers, " layers");
  if (g.sliding_layers > 0) {
    absl::StrAppend(&parts, " + ", FormatCount(window), " tokens x ",
                    g.sliding_layers, " sliding layers");
  }
  absl::StrAppend(&parts, ") x ", FormatCount(layer), " B");
  if (g.state_layers > 0) {
    absl::StrAppend(&parts, " + ", g.state_layers, " state layers x ",
                    FormatCount(g.state_bytes_per_layer), " B");
  }
  return {{"seq", "Per sequence",
           absl::StrCat(Bytes(f.sequence_bytes), " = ", parts)},
          {"kv", "KV cache",
           absl::StrCat(Bytes(f.kv_bytes), " = ", FormatCount(in.batch), " x ",
                        FormatCount(f.sequence_bytes), " B")}};
}

// Summed over the batch when every token costs the same; otherwise the
// context per sequence at this batch (model/forward.h).
std::string ForwardCrossover(const ForwardInput& in, const Forward& f) {
  if (KeepsEveryToken(in.geometry)) {
    return absl::StrCat(FormatCount(f.crossover_tokens),
                        " cached tokens in flight read as many bytes per "
                        "decode step as the weights");
  }
  if (f.crossover_context == 0) {
    return absl::StrCat("never at batch ", FormatCount(in.batch),
                        ": every KV layer slides, so the KV stops growing "
                        "below the weights");
  }
  return absl::StrCat(FormatCount(f.crossover_context),
                      " tokens per sequence (", FormatCount(f.crossover_tokens),
                      " in flight): batch ", FormatCount(in.batch),
                      " then reads as many KV bytes per decode step as "
                      "weights");
}

std::vector<PlanLine> ForwardLines(const PlanRequest& req, const Forward& f) {
  const ForwardInput& in = req.forward;
  const ModelGeometry& g = in.geometry;
  std::vector<PlanLine> out = {
      {"model", "Model", ModelText(g)},
      {"kv_dtype", "KV dtype", std::string(KvDtypeName(in.kv_dtype))},
      {"tokens", "Batch x context",
       absl::StrCat(FormatCount(in.batch), " x ", FormatCount(in.context_len),
                    " tokens = ", FormatCount(f.tokens), " tokens")},
      {"bpt", "Bytes per token",
       absl::StrCat(Bytes(f.bytes_per_token), " = ",
                    BytesPerTokenFormula(g, in.kv_dtype))}};
  for (PlanLine& line : ForwardKvLines(in, f)) out.push_back(std::move(line));
  out.push_back({"weights", "Weights",
                 req.has_weights ? Bytes(f.weight_bytes)
                                 : "not given (--weights or --params): 0 B"});
  out.push_back({"overhead", "Overhead", Bytes(f.overhead_bytes)});
  out.push_back(
      {"total", "Weights + KV",
       absl::StrCat(Bytes(f.total_bytes), " = weights + overhead + KV")});
  if (req.has_weights) {
    out.push_back({"crossover", "Decode crossover", ForwardCrossover(in, f)});
  }
  if (req.has_gpus) {
    out.push_back({"pool", "GPUs", PoolVerdict(req.gpus, f.total_bytes)});
  }
  return out;
}

// ---------------------------------------------------------------------------
// JSON output: integers and strings only, written by hand so that 64-bit
// numbers stay exact.

std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// A number that needs the GPUs (the KV budget), or null without them.
std::string IfGpus(bool has_gpus, uint64_t value) {
  return has_gpus ? absl::StrCat(value) : "null";
}

std::string ContextsJson(const std::vector<ContextRow>& rows, bool has_gpus) {
  std::vector<std::string> items;
  for (const ContextRow& row : rows) {
    items.push_back(absl::StrCat(
        "{\"context_len\": ", row.context_len, ", \"kv_bytes_per_sequence\": ",
        row.kv_bytes_per_sequence, ", \"concurrent_sequences\": ",
        IfGpus(has_gpus, row.concurrent_sequences), "}"));
  }
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

// The model's geometry, as both JSON reports print it.
std::string ModelJson(const ModelGeometry& g) {
  return absl::StrCat(
      "{\"name\": ", Quote(g.name), ", \"layers\": ", g.layers,
      ", \"kv_heads\": ", g.kv_heads, ", \"head_dim\": ", g.head_dim,
      ", \"attention_heads\": ", g.attention_heads,
      ", \"kv_lora_rank\": ", g.kv_lora_rank,
      ", \"sliding_window\": ", g.sliding_window,
      ", \"sliding_layers\": ", g.sliding_layers,
      ", \"state_layers\": ", g.state_layers,
      ", \"state_bytes_per_layer\": ", g.state_bytes_per_layer, "}");
}

// Without --gpus the numbers that need a KV budget are null (GeometryReport).
std::string JsonReport(const PlanRequest& req, const Plan& plan) {
  const PlanInput& in = req.input;
  const ModelGeometry& g = in.geometry;
  const bool gpus = req.has_gpus;
  std::vector<std::string> notes;
  for (const std::string& note : req.notes) notes.push_back(Quote(note));
  std::vector<std::string> variants;
  for (const HeadVariant& v : plan.head_variants) {
    variants.push_back(absl::StrCat(
        "    {\"label\": ", Quote(v.label), ", \"kv_heads\": ", v.kv_heads,
        ", \"is_model\": ", v.is_model ? "true" : "false",
        ", \"bytes_per_token\": ", v.bytes_per_token,
        ", \"tokens_that_fit\": ", IfGpus(gpus, v.tokens_that_fit),
        ", \"crossover_tokens\": ", v.crossover_tokens,
        ", \"contexts\": ", ContextsJson(v.contexts, gpus), "}"));
  }
  std::string waste = "null";
  if (plan.waste.has_value() && gpus) {
    const WasteReport& w = *plan.waste;
    waste = absl::StrCat(
        "{\"actual_len\": ", w.actual_len, ", \"max_seq_len\": ", w.max_seq_len,
        ", \"block_size\": ", w.block_size,
        ", \"contiguous_reserved_tokens\": ", w.contiguous_reserved_tokens,
        ", \"contiguous_wasted_tokens\": ", w.contiguous_wasted_tokens,
        ", \"contiguous_wasted_bytes\": ", w.contiguous_wasted_bytes,
        ", \"contiguous_sequences\": ", w.contiguous_sequences,
        ", \"paged_reserved_tokens\": ", w.paged_reserved_tokens,
        ", \"paged_wasted_tokens\": ", w.paged_wasted_tokens,
        ", \"paged_wasted_bytes\": ", w.paged_wasted_bytes,
        ", \"paged_sequences\": ", w.paged_sequences, "}");
  }
  const std::string pool =
      gpus ? absl::StrCat("{\"count\": ", req.gpus.count,
                          ", \"model\": ", Quote(req.gpus.model),
                          ", \"bytes_per_gpu\": ", req.gpus.bytes_per_gpu,
                          ", \"total_bytes\": ", req.gpus.total_bytes, "}")
           : "null";
  return absl::StrCat(
      "{\n  \"model\": ", ModelJson(g), ",\n",
      "  \"kv_dtype\": ", Quote(KvDtypeName(in.kv_dtype)), ",\n",
      "  \"block_size\": ", in.block_size, ",\n", "  \"gpus\": ", pool, ",\n",
      "  \"bytes_per_token\": ", plan.bytes_per_token, ",\n",
      "  \"full_bytes_per_token\": ", plan.full_bytes_per_token, ",\n",
      "  \"window_bytes_per_token\": ", plan.window_bytes_per_token, ",\n",
      "  \"state_bytes_per_sequence\": ", plan.state_bytes_per_sequence, ",\n",
      "  \"block_bytes\": ", plan.block_bytes, ",\n",
      "  \"gpu_bytes\": ", IfGpus(gpus, plan.gpu_bytes), ",\n",
      "  \"weight_bytes\": ", plan.weight_bytes, ",\n",
      "  \"overhead_bytes\": ", plan.overhead_bytes, ",\n",
      "  \"kv_budget_bytes\": ", IfGpus(gpus, plan.kv_budget_bytes), ",\n",
      "  \"tokens_that_fit\": ", IfGpus(gpus, plan.tokens_that_fit), ",\n",
      "  \"budget_blocks\": ", IfGpus(gpus, plan.budget_blocks), ",\n",
      "  \"crossover_tokens\": ", plan.crossover_tokens, ",\n",
      "  \"contexts\": ", ContextsJson(plan.contexts, gpus), ",\n",
      "  \"head_variants\": [\n", absl::StrJoin(variants, ",\n"), "\n  ],\n",
      "  \"waste\": ", waste, ",\n", "  \"notes\": [",
      absl::StrJoin(notes, ", "), "]\n}\n");
}

std::string ForwardJsonReport(const PlanRequest& req, const Forward& f) {
  const ForwardInput& in = req.forward;
  const ModelGeometry& g = in.geometry;
  std::vector<std::string> notes;
  for (const std::string& note : req.notes) notes.push_back(Quote(note));
  std::vector<std::string> variants;
  for (const ForwardVariant& v : f.variants) {
    std::vector<std::string> cells;
    for (const ForwardCell& c : v.cells) {
      cells.push_back(absl::StrCat("{\"dtype\": ", Quote(KvDtypeName(c.dtype)),
                                   ", \"bytes_per_token\": ", c.bytes_per_token,
                                   ", \"kv_bytes\": ", c.kv_bytes, "}"));
    }
    variants.push_back(absl::StrCat(
        "    {\"label\": ", Quote(v.label), ", \"kv_heads\": ", v.kv_heads,
        ", \"is_model\": ", v.is_model ? "true" : "false", ", \"dtypes\": [",
        absl::StrJoin(cells, ", "), "]}"));
  }
  std::vector<std::string> gpus;
  for (const GpuNeed& n : f.gpus) {
    gpus.push_back(absl::StrCat(
        "    {\"gpu\": ", Quote(n.gpu), ", \"memory_bytes\": ", n.memory_bytes,
        ", \"gpus_needed\": ", n.gpus_needed, ", \"tensor_parallel\": ",
        n.tensor_parallel, ", \"kv_percent_of_gpu\": ", n.kv_percent_of_gpu,
        ", \"kv_exceeds_gpu\": ", n.kv_exceeds_gpu ? "true" : "false", "}"));
  }
  std::string pool = "null";
  if (req.has_gpus) {
    pool = absl::StrCat(
        "{\"count\": ", req.gpus.count, ", \"model\": ", Quote(req.gpus.model),
        ", \"bytes_per_gpu\": ", req.gpus.bytes_per_gpu,
        ", \"total_bytes\": ", req.gpus.total_bytes, ", \"fits\": ",
        req.gpus.total_bytes >= f.total_bytes ? "true" : "false", "}");
  }
  return absl::StrCat(
      "{\n  \"model\": ", ModelJson(g), ",\n",
      "  \"kv_dtype\": ", Quote(KvDtypeName(in.kv_dtype)), ",\n",
      "  \"batch\": ", in.batch, ",\n", "  \"context_len\": ", in.context_len,
      ",\n", "  \"tokens\": ", f.tokens, ",\n",
      "  \"bytes_per_token\": ", f.bytes_per_token, ",\n",
      "  \"sequence_bytes\": ", f.sequence_bytes, ",\n",
      "  \"kv_bytes\": ", f.kv_bytes, ",\n",
      "  \"weight_bytes\": ", f.weight_bytes, ",\n",
      "  \"overhead_bytes\": ", f.overhead_bytes, ",\n",
      "  \"total_bytes\": ", f.total_bytes, ",\n",
      "  \"crossover_context\": ", f.crossover_context, ",\n",
      "  \"crossover_tokens\": ", f.crossover_tokens, ",\n",
      "  \"gpus\": ", pool, ",\n", "  \"variants\": [\n",
      absl::StrJoin(variants, ",\n"), "\n  ],\n", "  \"per_gpu\": [\n",
      absl::StrJoin(gpus, ",\n"), "\n  ],\n", "  \"notes\": [",
      absl::StrJoin(notes, ", "), "]\n}\n");
}

// --batch: the forward calculator. Every error reading its flags is a
// usage error.
absl::StatusOr<PlanReport> ForwardReport(const ParsedFlags& flags,
                                         PlanRequest& req) {
  absl::Status status = ReadMemory(flags, req);
  if (status.ok()) status = ReadForward(flags, req);
  if (!status.ok()) return absl::InvalidArgumentError(status.message());
  absl::StatusOr<Forward> f = MakeForward(req.forward);
  if (!f.ok()) return absl::FailedPreconditionError(f.status().message());
  PlanReport r;
  r.model = req.forward.geometry;
  r.notes = req.notes;
  r.lines = ForwardLines(req, *f);
  r.tables.push_back(ForwardKvTable(req.forward, *f));
  r.tables.push_back(ForwardGpuTable(*f));
  r.json = ForwardJsonReport(req, *f);
  return r;
}

}  // namespace

const std::vector<FlagSpec>& PlanFlags() { return PlanFlagTable(); }

std::string ModelText(const ModelGeometry& g) {
  std::string model = absl::StrCat(g.name, ": ", g.layers, " layers, ");
  if (g.kv_lora_rank > 0) {
    absl::StrAppend(&model, "MLA (kv_lora_rank ", g.kv_lora_rank,
                    ", qk_rope_head_dim ", g.head_dim, ")");
  } else {
    absl::StrAppend(&model, g.kv_heads, " KV heads");
  }
  if (g.attention_heads > 0) {
    absl::StrAppend(&model, ", ", g.attention_heads, " attention heads");
  }
  if (g.kv_lora_rank == 0) absl::StrAppend(&model, ", head_dim ", g.head_dim);
  if (g.sliding_layers > 0) {
    absl::StrAppend(&model, ", ", g.sliding_layers, " of them sliding over ",
                    FormatCount(g.sliding_window), " tokens");
  }
  if (g.state_layers > 0) {
    absl::StrAppend(&model, ", + ", g.state_layers, " state layers");
  }
  return model;
}

std::string PlanReport::Text() const {
  std::string out;
  for (const std::string& note : notes)
    absl::StrAppend(&out, "note: ", note, "\n");
  for (const PlanLine& line : lines) {
    absl::StrAppend(&out, absl::StrFormat("%-18s%s\n", line.label, line.value));
  }
  for (const PlanTable& t : tables) {
    absl::StrAppend(&out, "\n", t.title, "\n");
    if (!t.rows.empty()) absl::StrAppend(&out, Table(t.rows, t.label_columns));
  }
  return out;
}

absl::StatusOr<PlanReport> MakePlanReport(const ParsedFlags& flags) {
  PlanRequest req;
  RETURN_IF_ERROR(ReadModel(flags, req));
  if (flags.Has("batch")) return ForwardReport(flags, req);
  RETURN_IF_ERROR(ReadMemory(flags, req));
  RETURN_IF_ERROR(ReadRest(flags, req));
  // Without GPUs nothing is left for KV: the plan keeps what does not
  // depend on the budget (bytes per token and sequence, the crossover).
  if (!req.has_gpus) {
    req.input.gpu_bytes = req.input.weight_bytes + req.input.overhead_bytes;
  }
  absl::StatusOr<Plan> plan = MakePlan(req.input);
  if (!plan.ok()) return absl::FailedPreconditionError(plan.status().message());
  PlanReport r;
  r.model = req.input.geometry;
  r.notes = req.notes;
  if (req.has_gpus) {
    BudgetReport(req, *plan, r);
  } else {
    GeometryReport(req, *plan, r);
  }
  r.json = JsonReport(req, *plan);
  return r;
}

std::vector<std::pair<std::string, std::string>> GeometryFlags(
    const ModelGeometry& g) {
  std::vector<std::pair<std::string, std::string>> out = {
      {"layers", absl::StrCat(g.layers)}};
  const bool mla = g.kv_lora_rank > 0;
  if (!mla) {
    out.push_back({"kv_heads", absl::StrCat(g.kv_heads)});
    out.push_back({"head_dim", absl::StrCat(g.head_dim)});
  }
  const std::pair<const char*, int> optional[] = {
      {"attention_heads", g.attention_heads},
      {"kv_lora_rank", g.kv_lora_rank},
      {"qk_rope_head_dim", mla ? g.head_dim : 0},
      {"sliding_window", g.sliding_window},
      {"sliding_layers", g.sliding_layers},
      {"state_layers", g.state_layers}};
  for (const auto& [name, value] : optional) {
    if (value > 0) out.push_back({name, absl::StrCat(value)});
  }
  if (g.state_bytes_per_layer > 0) {
    out.push_back({"state_bytes", absl::StrCat(g.state_bytes_per_layer, "B")});
  }
  return out;
}

}  // namespace prefixd
