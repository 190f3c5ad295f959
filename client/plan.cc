#include "client/plan.h"

#include <algorithm>
#include <ostream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/flag_parser.h"
#include "model/plan_report.h"

namespace prefixd {

std::string PlanUsage() {
  std::string out =
      "Usage: prefixctl plan (--model PRESET|FILE | --hf_config FILE |\n"
      "           --layers N --kv_heads N --head_dim N) [--gpus GPUS]\n"
      "           [--weights SIZE | --params COUNT] [flags]\n\n"
      "Capacity planning from the model's KV geometry; needs no daemon.\n"
      "Without --gpus: the geometry, bytes per token and sequence, and with\n"
      "the weights the decode crossover; with --gpus (and the weights) the\n"
      "KV budget and what fits in it; with --batch the KV of a batch and the\n"
      "GPUs (and tensor-parallel degree) it needs.\n"
      "bytes_per_token = 2 x layers x kv_heads x head_dim x dtype bytes\n"
      "(MLA: layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes);\n"
      "KV budget = GPU memory - weights - overhead. Sizes need a unit: B, kB,\n"
      "MB, GB, TB (10^n) or KiB, MiB, GiB, TiB (2^n).\n\nFlags:\n";
  std::ostringstream flags;
  PrintFlagHelp(PlanFlags(), flags);
  absl::StrAppend(&out, flags.str());
  absl::StrAppend(&out,
                  "\nExample:\n  prefixctl plan --model llama-3-70b --gpus "
                  "4xH100-80GB --weights 140GB --overhead 20GB\n"
                  "\nExit codes: 0 ok, 1 no plan possible, 2 usage error.\n");
  return out;
}

int RunPlanCommand(int argc, char** argv, std::ostream& out,
                   std::ostream& err) {
  absl::StatusOr<ParsedFlags> flags =
      ParsedFlags::Parse(PlanFlags(), {argv + std::min(argc, 1), argv + argc});
  const absl::Status parsed =
      flags.ok() ? flags->NoPositional() : flags.status();
  if (!parsed.ok()) {
    err << "prefixctl plan: " << parsed.message()
        << " (see prefixctl plan --help)\n";
    return kExitUsage;
  }
  if (flags->Bool("help")) {
    out << PlanUsage();
    return kExitOk;
  }
  absl::StatusOr<PlanReport> report = MakePlanReport(*flags);
  if (!report.ok()) {
    err << "prefixctl plan: " << report.status().message() << "\n";
    return report.status().code() == absl::StatusCode::kInvalidArgument
               ? kExitUsage
               : kExitFailure;
  }
  out << (flags->Bool("json") ? report->json : report->Text());
  return kExitOk;
}

}  // namespace prefixd
