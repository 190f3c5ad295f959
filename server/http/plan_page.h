// The KV calculator in the browser (docs/capacity.md, "In the browser"):
//
//   /plan                the page: a form whose fields are `prefixctl
//                        plan`'s flags; it sends them to /plan.json and
//                        renders the answer, computing nothing itself
//   /plan.js             its script
//   /plan.json?FLAGS     the report of `prefixctl plan --FLAG=VALUE ...`
//                        (model/plan_report.h, the code prefixctl runs):
//                        {"plan": what --json prints, "notes", "lines":
//                        [{key, label, value}], "tables": [{key, title,
//                        keys, rows, label_columns}], "model_flags": the
//                        flags of the model's geometry}; or 400 {"error":
//                        prefixctl's message}
//   /plan/presets.json   what the form offers: preset names, GPU names,
//                        dtypes, and the daemon's own model as flags
//
// The page's URL carries its flags (/plan?model=llama-3-70b&batch=32&...),
// so a link reproduces the figures, and a config.json chosen in the page is
// sent as its text (hf_config_json): the daemon reads no files, so
// hf_config and a model ending in .json are refused.
//
// Thread safety: every method may be called from several threads at once.
#ifndef PREFIXD_SERVER_HTTP_PLAN_PAGE_H_
#define PREFIXD_SERVER_HTTP_PLAN_PAGE_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "server/http/http_listener.h"
#include "server/http/sources.h"

namespace prefixd {

class PlanPage {
 public:
  explicit PlanPage(DaemonFacts facts) : facts_(std::move(facts)) {}

  // The answer at `request.path`, or nullopt when it is none of the above.
  std::optional<HttpResponse> Handle(const HttpRequest& request) const;

  // The parts, for tests.
  std::string PresetsJson() const;
  // 200 and the report, or 400 and the error.
  static HttpResponse PlanJson(absl::string_view query);

 private:
  const DaemonFacts facts_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_PLAN_PAGE_H_
