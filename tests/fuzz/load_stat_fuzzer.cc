// libFuzzer: SGLang's load messages (index/load_stat.h) come from any
// socket an index.pick.engine_load_sockets endpoint reaches, so no byte
// string may crash the decoder or yield a load Pick cannot charge. Checked
// for every input:
//   - a reading has running and waiting >= 0 and a KV usage in [0, 1];
//   - an error is INVALID_ARGUMENT starting "LoadStat: ";
//   - a reading's counts, written back as SGLang writes them, decode to
//     the same reading.
//
//   build-fuzz/tests/fuzz/load_stat_fuzzer
//   tests/fuzz/corpus/load_stat_fuzzer
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <msgpack.hpp>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "index/load_stat.h"

namespace prefixd {
namespace {

void Check(bool ok, const char* what, absl::string_view detail = "") {
  if (ok) return;
  std::fprintf(stderr, "load_stat_fuzzer: %s %.*s\n", what,
               static_cast<int>(detail.size()), detail.data());
  __builtin_trap();
}

// `load` as SGLang would send it, its KV tokens out of a capacity of 1e6.
std::string Rewritten(const EngineLoad& load) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(6);
  p.pack(std::string("LoadStat"));
  p.pack(load.running);
  p.pack(load.waiting);
  p.pack(static_cast<int64_t>(load.kv_usage * 1e6));
  p.pack(int64_t{1000000});
  p.pack_nil();
  return std::string(buf.data(), buf.size());
}

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using prefixd::Check;
  const absl::string_view payload(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<prefixd::EngineLoad> r =
      prefixd::DecodeLoadStat(payload);
  if (!r.ok()) {
    Check(r.status().code() == absl::StatusCode::kInvalidArgument &&
              absl::StartsWith(r.status().message(), "LoadStat: "),
          "unexpected error", r.status().message());
    return 0;
  }
  Check(r->running >= 0 && r->waiting >= 0, "negative requests");
  Check(r->kv_usage >= 0 && r->kv_usage <= 1, "KV usage outside [0, 1]");
  const absl::StatusOr<prefixd::EngineLoad> again =
      prefixd::DecodeLoadStat(prefixd::Rewritten(*r));
  Check(again.ok(), "a reading written back does not decode");
  Check(again->running == r->running && again->waiting == r->waiting,
        "a reading written back decodes to other counts");
  return 0;
}
