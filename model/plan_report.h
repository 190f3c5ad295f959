// The one KV calculator's front: `prefixctl plan`'s flags turned into the
// planner's inputs (model/planner.h, model/forward.h) and its answer turned
// into reports: the text prefixctl prints, the JSON of `--json`, and the
// same figures as labelled lines and tables for the daemon's /plan page
// (server/http/plan_page.h), which renders them and computes nothing.
//
//   absl::StatusOr<ParsedFlags> flags = ParsedFlags::Parse(PlanFlags(), args);
//   absl::StatusOr<PlanReport> report = MakePlanReport(*flags);
//   std::cout << (json ? report->json : report->Text());
//
// Thread safety: pure functions.
#ifndef PREFIXD_MODEL_PLAN_REPORT_H_
#define PREFIXD_MODEL_PLAN_REPORT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/flag_parser.h"
#include "model/kv_geometry.h"

namespace prefixd {

// Every flag of `prefixctl plan`, for its parser and its --help.
const std::vector<FlagSpec>& PlanFlags();

// One "Label   value" line of the text report; `key` names it for a page
// ("bpt", "kv", "crossover", ...; stable).
struct PlanLine {
  std::string key;
  std::string label;
  std::string value;
};

// One table of the text report: `title` above it; `rows` (the first is the
// header) with the first `label_columns` left-aligned; `keys` names each
// column for a page. A title without rows stands alone (a table that does
// not apply, and why).
struct PlanTable {
  std::string key;
  std::string title;
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> rows;
  size_t label_columns = 1;
};

struct PlanReport {
  ModelGeometry model;             // as planned: presets, files and flags read
  std::vector<std::string> notes;  // assumptions made reading the model
  std::vector<PlanLine> lines;
  std::vector<PlanTable> tables;
  std::string json;  // what --json prints: numbers as exact integers

  // What `prefixctl plan` prints without --json: "note: " lines, the lines,
  // then each table under its title.
  std::string Text() const;
};

// The report `prefixctl plan` prints for `flags` (parsed with PlanFlags()):
// with --batch the forward calculator (the KV of a batch, the GPUs it
// needs), otherwise the sequences that fit (with --gpus) or the geometry
// alone. INVALID_ARGUMENT for a usage error (flags that exclude each other,
// a missing or malformed value; exit code 2); FAILED_PRECONDITION when the
// inputs are well-formed but no plan is possible (an unreadable config.json,
// an invalid geometry, weights larger than the GPUs; exit code 1). Messages
// name the flag and the value. --hf_config and --model FILE.json read the
// file.
absl::StatusOr<PlanReport> MakePlanReport(const ParsedFlags& flags);

// The model in words: "llama-3-70b: 80 layers, 8 KV heads, 64 attention
// heads, head_dim 128"; an MLA model as "61 layers, MLA (kv_lora_rank 512,
// qk_rope_head_dim 64), 128 attention heads".
std::string ModelText(const ModelGeometry& g);

// The flags that give `g` to `prefixctl plan` (its name aside), in the
// order --help lists them: --layers, --kv_heads and --head_dim (MLA:
// --kv_lora_rank and --qk_rope_head_dim), and those of the others that are
// not 0. MakePlanReport of them has `g`'s geometry.
std::vector<std::pair<std::string, std::string>> GeometryFlags(
    const ModelGeometry& g);

}  // namespace prefixd

#endif  // PREFIXD_MODEL_PLAN_REPORT_H_
