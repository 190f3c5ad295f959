// libFuzzer: PrefixIndex PickRequests as the wire brings them, through the
// reader (server/pick_request.h) into a Picker (index/picker.h) over one
// FleetIndex of three workers that store the fuzzer's prompts, with the
// clock moving on, as the PrefixIndex service does.
//
// Input: records, each
//   u8   selector   op = selector % 4: 0, 1 a Pick; 2 worker selector / 4 % 3
//                   stores the record's bytes as tokens (whole blocks, GPU
//                   or, for odd selectors / 4, CPU); 3 below 128: the clock
//                   moves on by the record's first byte x 100 ms; 3 from 128
//                   to 191: worker selector / 4 % 3's engine reports its
//                   load now (running, waiting: the first two bytes; KV
//                   usage: the third / 255), fresh for 2 s
//                   (index.pick.engine_metrics); 3 from 192: worker
//                   selector / 4 % 3's stream state becomes LIVE,
//                   REPLAYING, ERROR or CONNECTING (the first byte % 4), as
//                   the ingest sets it (a later store makes it LIVE)
//   u8   len
//   len  bytes      the PickRequest (fewer if the input ends)
//
// Checked after every Pick: a refusal is INVALID_ARGUMENT or
// FAILED_PRECONDITION and changes nothing (decisions, predicted blocks,
// window); an answer ranks each candidate once, cheapest first, every cost
// finite and equal to its terms, prefill within the prompt, predicted
// blocks within the prompt's blocks past the matched ones (all of them for
// a worker not LIVE, which is credited only its predicted ones), the chosen the
// first, a churn term that is churn_weight x a tally of no more than the
// window's picks' prompts, a load from at most one source (the request, or
// the engine's reading, which is then the one reported, KV usage in
// [0, 1]); predicted blocks stay within max_predicted and the picks kept
// for both windows within max_window_picks.
//
//   build-fuzz/tests/fuzz/pick_fuzzer tests/fuzz/corpus/pick_fuzzer
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cache_types.h"
#include "google/protobuf/stubs/logging.h"
#include "index/engine_loads.h"
#include "index/fleet_index.h"
#include "index/picker.h"
#include "server/pick_request.h"

namespace prefixd {
namespace {

constexpr int kBlockSize = 4;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "pick_fuzzer: %s\n", what.c_str());
  std::abort();
}

CacheLimits Limits() {
  CacheLimits l;
  l.max_tokens_per_request = 64;
  l.max_block_ids_per_request = 16;
  return l;
}

PickerOptions Options() {
  PickerOptions o;
  o.request_tokens = 3;
  o.kv_tokens = 50;
  o.affinity_tokens = 2;
  o.affinity_blocks = 2;
  o.predicted_ttl = absl::Seconds(2);
  o.load_window = absl::Seconds(3);
  o.churn_weight = 0.5;
  o.churn_window = absl::Seconds(7);
  o.max_predicted = 32;
  o.max_window_picks = 8;
  return o;
}

bool Same(const Picker::Counts& a, const Picker::Counts& b) {
  return a.picks == b.picks && a.predicted == b.predicted &&
         a.window_picks == b.window_picks && a.kept_picks == b.kept_picks;
}

void CheckAnswer(const PickResult& r, const PickQuery& q,
                 const PickerOptions& o, const EngineLoads& engines,
                 absl::Time now) {
  if (r.ranked.empty() || r.worker != r.ranked.front().worker)
    Fail("the chosen worker is not the first ranked");
  std::set<absl::string_view> seen;
  const double tokens = static_cast<double>(q.prompt.tokens.size());
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    const PickCandidate& c = r.ranked[i];
    if (!seen.insert(c.worker).second) Fail("a candidate ranked twice");
    if (i > 0 && c.cost < r.ranked[i - 1].cost) Fail("not cheapest first");
    if (!std::isfinite(c.cost)) Fail("a cost that is not finite");
    const double sum = o.prefill_weight * c.prefill_tokens + c.load_term +
                       c.churn_term + c.affinity_term;
    if (std::abs(sum - c.cost) > 1e-6 * (1 + std::abs(sum)))
      Fail("a cost that is not the sum of its terms");
    if (c.prefill_tokens < 0 || c.prefill_tokens > tokens)
      Fail("prefill outside the prompt");
    // Every pick's prefill is within a prompt of at most 64 tokens.
    if (c.churn_tokens < 0 ||
        c.churn_tokens > 64.0 * static_cast<double>(o.max_window_picks) ||
        c.churn_term != o.churn_weight * c.churn_tokens)
      Fail("a churn term outside its window");
    if (c.load_from_request && c.load_from_engine)
      Fail("a load from the request and the engine at once");
    if (c.kv_usage < 0 || c.kv_usage > 1) Fail("KV usage outside [0, 1]");
    if (c.load_from_engine) {
      const std::optional<EngineLoad> e = engines.Fresh(c.worker, now);
      if (!e.has_value() || c.requests_in_flight != e->running + e->waiting ||
          c.kv_usage != e->kv_usage) {
        Fail("an engine load that is not the engine's fresh reading");
      }
    } else if (!c.load_from_request && c.kv_usage != 0) {
      Fail("a window load with a KV usage");
    }
    const bool live = c.state == WorkerState::kLive;
    const uint64_t held =
        live ? std::min(c.matched_blocks, r.prompt_blocks) : 0;
    if (c.predicted_blocks > r.prompt_blocks - held)
      Fail("predicted blocks past the prompt");
    if (!live &&
        c.credited_blocks !=
            o.predicted_credit * static_cast<double>(c.predicted_blocks))
      Fail("a worker not LIVE credited more than its predicted blocks");
  }
  if (!q.candidates.empty() && r.ranked.size() != q.candidates.size())
    Fail("not every candidate ranked");
}

void DoPick(const std::string& bytes, Picker& picker,
            const EngineLoads& engines, absl::Time now) {
  v1::PickRequest req;
  if (!req.ParseFromString(bytes)) return;
  PickRequestReader reader;
  const absl::Status read = reader.Read(req, -1, Limits(), kBlockSize);
  if (!read.ok()) {
    if (read.code() != absl::StatusCode::kInvalidArgument)
      Fail("reader: " + read.ToString());
    return;
  }
  const Picker::Counts before = picker.counts();
  absl::StatusOr<PickResult> r = picker.Pick(reader.query(), now);
  if (!r.ok()) {
    const absl::StatusCode code = r.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kFailedPrecondition) {
      Fail("unexpected status " + r.status().ToString());
    }
    if (!Same(before, picker.counts())) Fail("a refused Pick changed state");
    return;
  }
  CheckAnswer(*r, reader.query(), picker.options(), engines, now);
  const Picker::Counts after = picker.counts();
  if (after.predicted > picker.options().max_predicted ||
      after.window_picks > after.kept_picks ||
      after.kept_picks > picker.options().max_window_picks) {
    Fail("past the bounds");
  }
  if (reader.query().dry_run && after.picks != before.picks)
    Fail("a dry run was recorded");
}

void Store(FleetIndex& index, WorkerId worker, const uint8_t* data, size_t len,
           bool cpu, int64_t* seq, uint64_t* next_hash) {
  const size_t blocks = len / kBlockSize;
  if (blocks == 0) return;
  BlockStoredEvent ev;
  for (size_t i = 0; i < blocks * kBlockSize; ++i)
    ev.token_ids.push_back(data[i] % 8);  // few values: shared prefixes
  for (size_t b = 0; b < blocks; ++b) ev.block_hashes.push_back((*next_hash)++);
  ev.block_size = kBlockSize;
  ev.chain_blocks = blocks;
  ev.medium = cpu ? "CPU" : "GPU";
  KvEventBatch batch;
  batch.events.emplace_back(std::move(ev));
  index.Apply(worker, batch, (*seq)++, absl::Now());
}

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prefixd;  // NOLINT
  google::protobuf::SetLogHandler(nullptr);
  IndexOptions io;
  io.block_size = kBlockSize;
  FleetIndex index(io);
  const WorkerId workers[] = {index.AddWorker("w0", "tcp://a"),
                              index.AddWorker("w1", "tcp://b"),
                              index.AddWorker("w2", "tcp://c")};
  int64_t seq[3] = {0, 0, 0};
  uint64_t next_hash = 1;
  EngineLoads engines(absl::Seconds(2));
  Picker picker(&index, Options(), &engines);
  absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  size_t i = 0;
  while (i + 2 <= size) {
    const int selector = data[i];
    const size_t len = std::min<size_t>(data[i + 1], size - i - 2);
    const uint8_t* bytes = data + i + 2;
    i += 2 + len;
    switch (selector % 4) {
      case 0:
      case 1:
        DoPick(std::string(reinterpret_cast<const char*>(bytes), len), picker,
               engines, now);
        break;
      case 2: {
        const int w = (selector / 4) % 3;
        Store(index, workers[w], bytes, len, (selector / 12) % 2 == 1, &seq[w],
              &next_hash);
        break;
      }
      default:
        if (selector < 128) {
          now += absl::Milliseconds(100) * (len > 0 ? bytes[0] : 1);
        } else if (selector >= 192) {
          constexpr WorkerState kStates[] = {
              WorkerState::kLive, WorkerState::kReplaying, WorkerState::kError,
              WorkerState::kConnecting};
          index.SetState(workers[(selector / 4) % 3],
                         kStates[(len > 0 ? bytes[0] : 0) % 4], "fuzzed");
        } else {
          const auto byte = [&](size_t k) { return k < len ? bytes[k] : 0; };
          engines.Set(absl::StrCat("w", (selector / 4) % 3),
                      EngineLoad{byte(0), byte(1), byte(2) / 255.0}, now);
        }
        break;
    }
  }
  return 0;
}
