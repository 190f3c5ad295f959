// libFuzzer: the engines' /metrics bodies (index/engine_metrics.h) come from
// any server an index.pick.engine_metrics URL reaches, so no byte string
// may crash the reader or yield a load Pick cannot charge. The first byte
// picks the labels a series must carry (none, engine="0", or
// model_name="m" and engine="1"); the rest is the body. Checked for every
// input:
//   - a reading has running and waiting >= 0 and a KV usage in [0, 1];
//   - an error is INVALID_ARGUMENT naming its line, or NOT_FOUND;
//   - reading the body again, after a comment line and before a line of
//     another metric, gives the same result (those lines are never read),
//     the error's line number one more;
//   - a series the labels must carry does not make a body that fails
//     without labels succeed, and no series counts with more labels than
//     without: the running requests with labels are at most those without.
//
//   build-fuzz/tests/fuzz/engine_metrics_fuzzer
//   tests/fuzz/corpus/engine_metrics_fuzzer
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "index/engine_metrics.h"

namespace prefixd {
namespace {

void Check(bool ok, const char* what, absl::string_view detail = "") {
  if (ok) return;
  std::fprintf(stderr, "engine_metrics_fuzzer: %s %.*s\n", what,
               static_cast<int>(detail.size()), detail.data());
  __builtin_trap();
}

bool Same(const absl::StatusOr<EngineLoad>& a,
          const absl::StatusOr<EngineLoad>& b) {
  if (a.ok() != b.ok()) return false;
  if (!a.ok()) return a.status().code() == b.status().code();
  return a->running == b->running && a->waiting == b->waiting &&
         a->kv_usage == b->kv_usage;
}

void CheckReading(const absl::StatusOr<EngineLoad>& r) {
  if (r.ok()) {
    Check(r->running >= 0 && r->waiting >= 0, "negative requests");
    Check(r->kv_usage >= 0 && r->kv_usage <= 1, "KV usage outside [0, 1]");
    return;
  }
  const absl::StatusCode code = r.status().code();
  Check(code == absl::StatusCode::kNotFound ||
            (code == absl::StatusCode::kInvalidArgument &&
             absl::StartsWith(r.status().message(), "line ")),
        "unexpected error", r.status().message());
}

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prefixd;
  if (size == 0) return 0;
  static const std::vector<LabelPair> kMatches[] = {
      {}, {{"engine", "0"}}, {{"engine", "1"}, {"model_name", "m"}}};
  const std::vector<LabelPair>& match = kMatches[data[0] % 3];
  const absl::string_view body(reinterpret_cast<const char*>(data + 1),
                               size - 1);
  const absl::StatusOr<EngineLoad> r = ReadEngineMetrics(body, match);
  CheckReading(r);
  // Lines it never reads change nothing (but the numbering).
  const std::string padded =
      absl::StrCat("# HELP x y\n", body, "\nvllm:other{a=\"b\"} 1\n");
  const absl::StatusOr<EngineLoad> p = ReadEngineMetrics(padded, match);
  Check(Same(r, p), "unread lines changed the result",
        p.ok() ? "" : p.status().message());
  if (!r.ok() && r.status().code() == absl::StatusCode::kInvalidArgument) {
    const std::string line = std::string(r.status().message())
                                 .substr(0, r.status().message().find(' ', 5));
    const std::string number = line.substr(5);
    Check(absl::StartsWith(p.status().message(),
                           absl::StrCat("line ", std::stoll(number) + 1)),
          "the line number is not one more", p.status().message());
  }
  if (!match.empty()) {
    const absl::StatusOr<EngineLoad> all = ReadEngineMetrics(body, {});
    Check(!r.ok() || all.ok(), "labels made a failing body succeed");
    if (r.ok() && all.ok()) {
      Check(r->running <= all->running && r->waiting <= all->waiting,
            "more requests count with labels than without");
    }
  }
  return 0;
}
