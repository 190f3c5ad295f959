// `prefixctl plan`: the capacity planner on the command line. Needs no
// daemon; the arithmetic is model/planner.h and model/forward.h, the flags
// and the reports model/plan_report.h (which the daemon's /plan page uses
// too); this file prints the report as text (default) or JSON (--json).
//
//   prefixctl plan --model llama-3-70b --kv_dtype fp16
//       --gpus 4xH100-80GB --weights 140GB --overhead 20GB
//
// `prefixctl plan --help` lists every flag.
#ifndef PREFIXD_CLIENT_PLAN_H_
#define PREFIXD_CLIENT_PLAN_H_

#include <ostream>
#include <string>

namespace prefixd {

// argv[0] is the program name and is skipped; argv[1..argc-1] are the plan
// flags ("--flag=value" or "--flag value"). Writes the plan (or --help) to
// `out` and diagnostics to `err`. Returns base/flag_parser.h's exit codes:
// kExitOk (0) on success, kExitFailure (1) when the inputs are well-formed
// but no plan is possible (unreadable --hf_config, invalid geometry, weights
// + overhead larger than the GPUs), kExitUsage (2) on a usage error (unknown
// flag, missing or malformed value).
int RunPlanCommand(int argc, char** argv, std::ostream& out, std::ostream& err);

// The --help text.
std::string PlanUsage();

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_PLAN_H_
