#include "index/picker.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace prefixd {
namespace {

int64_t UnixMs(absl::Time t) { return absl::ToUnixMillis(t); }

uint64_t WorkerTag(absl::string_view worker) {
  return XXH3_64bits(worker.data(), worker.size());
}

// Rendezvous hashing: the candidate with the highest score for `key` wins,
// and a candidate joining or leaving moves only the prompts it wins.
uint64_t AffinityScore(uint64_t key, absl::string_view worker) {
  return XXH3_64bits_withSeed(worker.data(), worker.size(), key);
}

std::string Quoted(absl::string_view s) {
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, 256)),
                      s.size() > 256 ? "...\"" : "\"");
}

absl::Status CheckLoads(absl::Span<const WorkerLoadInput> loads) {
  for (size_t i = 0; i < loads.size(); ++i) {
    const WorkerLoadInput& l = loads[i];
    const std::string where =
        absl::StrCat("loads[", i, "] (", Quoted(l.worker), ")");
    if (l.requests_in_flight < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".requests_in_flight is ", l.requests_in_flight,
                       "; it must be >= 0"));
    }
    if (l.queued_prefill_tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".queued_prefill_tokens is ",
                       l.queued_prefill_tokens, "; it must be >= 0"));
    }
    if (!(l.kv_usage >= 0 && l.kv_usage <= 1)) {  // NaN fails too
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".kv_usage is ", l.kv_usage, "; it must be in [0, 1]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Picker::Picker(const KvIndex* index, PickerOptions options)
    : index_(index),
      options_(std::move(options)),
      predicted_(options_.max_predicted),
      window_(absl::ToInt64Milliseconds(options_.load_window),
              options_.max_window_picks) {}

Picker::Counts Picker::counts() const {
  Counts c;
  c.picks = next_decision_.load(std::memory_order_relaxed) - 1;
  MutexLock lock(&mu_);
  c.predicted = predicted_.size();
  c.window_picks = window_.picks();
  return c;
}

std::vector<uint64_t> Picker::PromptKeys(const RouteQuery& prompt,
                                         uint64_t blocks) const {
  if (!prompt.keys.empty()) {
    return std::vector<uint64_t>(prompt.keys.begin(), prompt.keys.end());
  }
  std::vector<uint64_t> keys(blocks);
  const std::string ns =
      NamespaceKey(prompt.lora_name, prompt.lora_id, prompt.cache_salt);
  keys_.Chain(keys_.Root(ns), /*first=*/true, prompt.tokens,
              static_cast<size_t>(index_->options().block_size), blocks,
              prompt.content, keys.data());
  return keys;
}

double Picker::TierCreditOf(absl::string_view medium) const {
  // "CPU/REMOTE" and "CPU/lmcache" are CPU tiers.
  const absl::string_view base = medium.substr(0, medium.find('/'));
  for (const TierCredit& t : options_.tier_credits) {
    if (absl::EqualsIgnoreCase(t.medium, base)) return t.credit;
  }
  return options_.other_tier_credit;
}

// Each block counts at the best credit of a medium whose run covers it:
// the runs from the prompt's start, best credit first, each adding the
// blocks past the ones before it.
double Picker::EngineCredit(const WorkerMatch& m) const {
  if (m.state != WorkerState::kLive || m.matched_blocks == 0) return 0;
  absl::InlinedVector<std::pair<double, uint64_t>, 4> runs;
  for (const RouteMedium& r : m.mediums) {
    runs.push_back(
        {TierCreditOf(r.medium), std::min(r.blocks, m.matched_blocks)});
  }
  if (runs.empty()) runs.push_back({1.0, m.matched_blocks});
  std::sort(runs.begin(), runs.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  double credit = 0;
  uint64_t covered = 0;
  for (const auto& [c, run] : runs) {
    if (run <= covered) continue;
    credit += c * static_cast<double>(run - covered);
    covered = run;
  }
  return credit;
}

absl::StatusOr<PickResult> Picker::Pick(const PickQuery& query,
                                        absl::Time now) {
  const RouteQuery& prompt = query.prompt;
  const int block_size = index_->options().block_size;
  const double prompt_tokens =
      prompt.keys.empty()
          ? static_cast<double>(prompt.tokens.size())
          : static_cast<double>(prompt.keys.size()) * block_size;
  if (prompt_tokens == 0) {
    return absl::InvalidArgumentError(
        "prompt has no tokens (nor keys): there is nothing to place");
  }
  {
    absl::flat_hash_set<absl::string_view> seen;
    for (size_t i = 0; i < query.candidates.size(); ++i) {
      if (!seen.insert(query.candidates[i]).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("candidates[", i, "] ", Quoted(query.candidates[i]),
                         " is named twice"));
      }
    }
  }
  if (absl::Status s = CheckLoads(query.loads); !s.ok()) return s;

  RouteQuery route = prompt;
  route.filter = WorkerFilter();
  route.filter.workers = query.candidates;
  route.filter.all_workers = query.candidates.empty();
  RouteResult found = index_->Route(route);

  // Every candidate must be a worker of the index (retired ones are not).
  absl::flat_hash_map<absl::string_view, const WorkerMatch*> by_name;
  for (const WorkerMatch& m : found.workers) by_name[m.worker] = &m;
  for (size_t i = 0; i < query.candidates.size(); ++i) {
    if (!by_name.contains(query.candidates[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "candidates[", i, "] ", Quoted(query.candidates[i]),
          " is not a worker of the index (ListWorkers names them)"));
    }
  }
  if (found.workers.empty()) {
    return absl::FailedPreconditionError(
        "the index has no worker to pick: no engine has registered or "
        "published yet");
  }
  absl::flat_hash_map<absl::string_view, const WorkerLoadInput*> given;
  for (size_t i = 0; i < query.loads.size(); ++i) {
    const WorkerLoadInput& l = query.loads[i];
    if (!by_name.contains(l.worker)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loads[", i, "] names ", Quoted(l.worker),
          ", which is not a candidate",
          query.candidates.empty() ? " (not a worker of the index)" : ""));
    }
    if (!given.emplace(l.worker, &l).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loads[", i, "] names ", Quoted(l.worker), " a second time"));
    }
  }

  const uint64_t blocks = found.prompt_blocks;
  const std::vector<uint64_t> keys = PromptKeys(prompt, blocks);
  absl::string_view affinity_winner;
  if (options_.affinity_blocks > 0 && blocks > 0) {
    const uint64_t key =
        keys[std::min<uint64_t>(blocks, options_.affinity_blocks) - 1];
    uint64_t best = 0;
    for (const WorkerMatch& m : found.workers) {
      const uint64_t score = AffinityScore(key, m.worker);
      if (affinity_winner.empty() || score > best ||
          (score == best && m.worker < affinity_winner)) {
        best = score;
        affinity_winner = m.worker;
      }
    }
  }

  const int64_t now_ms = UnixMs(now);
  PickResult result;
  result.prompt_blocks = blocks;
  result.ranked.reserve(found.workers.size());
  MutexLock lock(&mu_);
  predicted_.Expire(now_ms);
  window_.Expire(now_ms);
  for (const WorkerMatch& m : found.workers) {
    PickCandidate c;
    c.worker = m.worker;
    c.state = m.state;
    c.matched_blocks = m.matched_blocks;
    const uint64_t tag = WorkerTag(m.worker);
    const uint64_t held = std::min<uint64_t>(m.matched_blocks, blocks);
    c.predicted_blocks = predicted_.Run(tag, keys, held, now_ms);
    c.credited_blocks =
        EngineCredit(m) +
        options_.predicted_credit * static_cast<double>(c.predicted_blocks);
    c.prefill_tokens =
        std::max(prompt_tokens - c.credited_blocks * block_size, 0.0);
    if (auto it = given.find(m.worker); it != given.end()) {
      c.load_from_request = true;
      c.requests_in_flight = it->second->requests_in_flight;
      c.queued_prefill_tokens =
          static_cast<double>(it->second->queued_prefill_tokens);
      c.kv_usage = it->second->kv_usage;
    } else {
      const PickWindow::Load w = window_.Of(m.worker);
      c.requests_in_flight = w.picks;
      c.queued_prefill_tokens = w.prefill_tokens;
    }
    c.load_term =
        options_.queued_weight * c.queued_prefill_tokens +
        options_.request_tokens * static_cast<double>(c.requests_in_flight) +
        options_.kv_tokens * c.kv_usage;
    c.affinity_term =
        m.worker == affinity_winner ? -options_.affinity_tokens : 0.0;
    c.cost = options_.prefill_weight * c.prefill_tokens + c.load_term +
             c.affinity_term;
    result.ranked.push_back(c);
  }
  std::sort(result.ranked.begin(), result.ranked.end(),
            [&](const PickCandidate& a, const PickCandidate& b) {
              if (a.cost != b.cost) return a.cost < b.cost;
              if (a.requests_in_flight != b.requests_in_flight)
                return a.requests_in_flight < b.requests_in_flight;
              const bool wa = a.worker == affinity_winner;
              const bool wb = b.worker == affinity_winner;
              if (wa != wb) return wa;
              return a.worker < b.worker;
            });
  const PickCandidate& chosen = result.ranked.front();
  result.worker = chosen.worker;
  if (query.dry_run) return result;
  result.decision_id = next_decision_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t tag = WorkerTag(chosen.worker);
  const uint64_t held = std::min<uint64_t>(chosen.matched_blocks, blocks);
  // What its events report needs no prediction; the rest of the prompt is
  // predicted from where they stop.
  const absl::Span<const uint64_t> all(keys);
  predicted_.Confirm(tag, all.subspan(0, held));
  predicted_.Add(tag, all.subspan(held),
                 now_ms + absl::ToInt64Milliseconds(options_.predicted_ttl));
  window_.Add(chosen.worker, now_ms, chosen.prefill_tokens);
  return result;
}

}  // namespace prefixd
