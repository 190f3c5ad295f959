#include "index/picker.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace prefixd {
namespace {

uint64_t WorkerTag(absl::string_view worker) {
  return XXH3_64bits(worker.data(), worker.size());
}

// Rendezvous hashing: the candidate with the highest score for `key` wins,
// and a candidate joining or leaving moves only the prompts it wins.
uint64_t AffinityScore(uint64_t key, absl::string_view worker) {
  return XXH3_64bits_withSeed(worker.data(), worker.size(), key);
}

// The prompt's leading blocks that Pick takes a worker's events' word for:
// none for a worker that is not LIVE (it may be behind).
uint64_t VouchedBlocks(WorkerState state, uint64_t matched, uint64_t blocks) {
  return state == WorkerState::kLive ? std::min(matched, blocks) : 0;
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

Picker::Picker(const KvIndex* index, PickerOptions options,
               const EngineLoads* engine_loads)
    : index_(index),
      options_(std::move(options)),
      engine_loads_(engine_loads),
      predicted_(options_.max_predicted),
      window_(absl::ToInt64Milliseconds(options_.load_window),
              absl::ToInt64Milliseconds(options_.churn_window),
              options_.max_window_picks) {}

Picker::Counts Picker::counts() const {
  Counts c;
  c.picks = next_decision_.load(std::memory_order_relaxed) - 1;
  MutexLock lock(&mu_);
  c.predicted = predicted_.size();
  c.window_picks = window_.picks();
  c.kept_picks = window_.kept();
  return c;
}

uint64_t Picker::PromptKeys::First() {
  if (!prompt_.keys.empty()) return prompt_.keys[0];
  if (!keys_.empty()) return keys_[0];
  const KeyScheme& scheme = picker_->keys_;
  const std::string ns =
      NamespaceKey(prompt_.lora_name, prompt_.lora_id, prompt_.cache_salt);
  uint64_t key = 0;
  scheme.Chain(scheme.Root(ns), /*first=*/true, prompt_.tokens,
               static_cast<size_t>(picker_->index_->options().block_size), 1,
               prompt_.content, &key);
  return key;
}

absl::Span<const uint64_t> Picker::PromptKeys::Get() {
  if (prompt_.keys.size() >= blocks_) return prompt_.keys.subspan(0, blocks_);
  if (keys_.size() == blocks_) return keys_;
  keys_.resize(blocks_);
  const KeyScheme& scheme = picker_->keys_;
  const std::string ns =
      NamespaceKey(prompt_.lora_name, prompt_.lora_id, prompt_.cache_salt);
  scheme.Chain(scheme.Root(ns), /*first=*/true, prompt_.tokens,
               static_cast<size_t>(picker_->index_->options().block_size),
               blocks_, prompt_.content, keys_.data());
  return keys_;
}

double Picker::TierCreditOf(absl::string_view medium) const {
  // "CPU/REMOTE" and "CPU/lmcache" are CPU tiers.
  const absl::string_view base = medium.substr(0, medium.find('/'));
  for (const TierCredit& t : options_.tier_credits) {
    if (absl::EqualsIgnoreCase(t.medium, base)) return t.credit;
  }
  // SGLang's HiCache host tier, pinned host memory, is a CPU tier unless
  // the credits name it.
  if (absl::EqualsIgnoreCase(base, "CPU_PINNED")) return TierCreditOf("CPU");
  return options_.other_tier_credit;
}

// The credit of the leading blocks Pick takes the events' word for
// (VouchedBlocks): each counts at the best credit of a medium whose run
// covers it, the runs from the prompt's start, best credit first, each
// adding the blocks past the ones before it.
double Picker::EngineCredit(const WorkerMatch& m, uint64_t vouched) const {
  if (vouched == 0) return 0;
  absl::InlinedVector<std::pair<double, uint64_t>, 4> runs;
  for (const RouteMedium& r : m.mediums) {
    runs.push_back({TierCreditOf(r.medium), std::min(r.blocks, vouched)});
  }
  if (runs.empty()) runs.push_back({1.0, vouched});
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

// Everything that can be checked before the index is asked.
absl::Status CheckQuery(const PickQuery& query, double prompt_tokens) {
  if (prompt_tokens == 0) {
    return absl::InvalidArgumentError(
        "prompt has no tokens (nor keys): there is nothing to place");
  }
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 0; i < query.candidates.size(); ++i) {
    if (!seen.insert(query.candidates[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("candidates[", i, "] ", Quoted(query.candidates[i]),
                       " is named twice"));
    }
  }
  return CheckLoads(query.loads);
}

namespace {

// A store (a source placed by rolling keys: a Mooncake store) holds blocks
// but serves no request: every worker means every engine, and a store
// named as a candidate is an error.
absl::Status DropStores(const PickQuery& query, RouteResult* found) {
  std::vector<WorkerMatch>& w = found->workers;
  const auto store = [](const WorkerMatch& m) { return m.labels->IsStore(); };
  const auto named = std::find_if(w.begin(), w.end(), store);
  if (named != w.end() && !query.candidates.empty()) {
    const auto at = std::find(query.candidates.begin(), query.candidates.end(),
                              named->worker);
    return absl::InvalidArgumentError(absl::StrCat(
        "candidates[", at - query.candidates.begin(), "] ",
        Quoted(named->worker),
        " is a KV store (its blocks are placed by rolling keys), not an "
        "engine: it serves no request"));
  }
  w.erase(std::remove_if(w.begin(), w.end(), store), w.end());
  return absl::OkStatus();
}

}  // namespace

// The candidates as the index knows them (Route's answer for them, every
// engine when none is named), and each one's load from the query, if any.
absl::Status Picker::Find(const PickQuery& query, RouteResult* found,
                          std::vector<const WorkerLoadInput*>* loads) const {
  RouteQuery route = query.prompt;
  route.filter = WorkerFilter();
  route.filter.workers = query.candidates;
  route.filter.all_workers = query.candidates.empty();
  *found = index_->Route(route);
  // Route lists each named worker that is one of the index's (retired
  // ones are not), so a missing one is the first not listed.
  if (found->workers.size() != query.candidates.size() &&
      !query.candidates.empty()) {
    absl::flat_hash_set<absl::string_view> listed;
    for (const WorkerMatch& m : found->workers) listed.insert(m.worker);
    for (size_t i = 0; i < query.candidates.size(); ++i) {
      if (!listed.contains(query.candidates[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "candidates[", i, "] ", Quoted(query.candidates[i]),
            " is not a worker of the index (ListWorkers names them)"));
      }
    }
  }
  RETURN_IF_ERROR(DropStores(query, found));
  if (found->workers.empty()) {
    return absl::FailedPreconditionError(
        "the index has no worker to pick: no engine has registered or "
        "published yet");
  }
  loads->assign(found->workers.size(), nullptr);
  if (query.loads.empty()) return absl::OkStatus();
  absl::flat_hash_map<absl::string_view, size_t> at;
  for (size_t i = 0; i < found->workers.size(); ++i)
    at[found->workers[i].worker] = i;
  for (size_t i = 0; i < query.loads.size(); ++i) {
    const WorkerLoadInput& l = query.loads[i];
    auto it = at.find(l.worker);
    if (it == at.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loads[", i, "] names ", Quoted(l.worker), ", which is not a ",
          query.candidates.empty() ? "worker of the index" : "candidate"));
    }
    if ((*loads)[it->second] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loads[", i, "] names ", Quoted(l.worker), " a second time"));
    }
    (*loads)[it->second] = &l;
  }
  return absl::OkStatus();
}

absl::string_view Picker::AffinityWinner(const RouteResult& found,
                                         PromptKeys& keys) const {
  const uint64_t blocks = found.prompt_blocks;
  if (blocks == 0) return {};
  // With the affinity off the winner still breaks ties, by the first block.
  const uint64_t n = std::min<uint64_t>(
      blocks, static_cast<uint64_t>(std::max(options_.affinity_blocks, 1)));
  const uint64_t key = n == 1 ? keys.First() : keys.Get()[n - 1];
  absl::string_view winner;
  uint64_t best = 0;
  for (const WorkerMatch& m : found.workers) {
    const uint64_t score = AffinityScore(key, m.worker);
    if (winner.empty() || score > best ||
        (score == best && m.worker < winner)) {
      best = score;
      winner = m.worker;
    }
  }
  return winner;
}

PickCandidate Picker::Cost(const WorkerMatch& m, const WorkerLoadInput* given,
                           const EngineLoad* engine, double prompt_tokens,
                           uint64_t blocks, absl::string_view affinity_winner,
                           int64_t now_ms, PromptKeys& keys) const {
  PickCandidate c;
  c.worker = m.worker;
  c.state = m.state;
  c.matched_blocks = m.matched_blocks;
  const uint64_t held = VouchedBlocks(m.state, m.matched_blocks, blocks);
  if (predicted_.size() > 0 && held < blocks) {
    c.predicted_blocks =
        predicted_.Run(WorkerTag(m.worker), keys.Get(), held, now_ms);
  }
  c.credited_blocks =
      EngineCredit(m, held) +
      options_.predicted_credit * static_cast<double>(c.predicted_blocks);
  c.prefill_tokens = std::max(
      prompt_tokens - c.credited_blocks * index_->options().block_size, 0.0);
  const PickWindow::Load w = window_.Of(m.worker);
  if (given != nullptr) {
    c.load_from_request = true;
    c.requests_in_flight = given->requests_in_flight;
    c.queued_prefill_tokens = static_cast<double>(given->queued_prefill_tokens);
    c.kv_usage = given->kv_usage;
  } else {
    // Engines publish no queued prefill tokens: those stay the window's.
    c.load_from_engine = engine != nullptr;
    c.requests_in_flight =
        engine != nullptr ? engine->running + engine->waiting : w.picks;
    c.queued_prefill_tokens = w.prefill_tokens;
    c.kv_usage = engine != nullptr ? engine->kv_usage : 0.0;
  }
  c.load_term =
      options_.queued_weight * c.queued_prefill_tokens +
      options_.request_tokens * static_cast<double>(c.requests_in_flight) +
      options_.kv_tokens * c.kv_usage;
  c.churn_tokens = w.churn_tokens;
  c.churn_term = options_.churn_weight * c.churn_tokens;
  c.affinity_term = options_.affinity_blocks > 0 && m.worker == affinity_winner
                        ? -options_.affinity_tokens
                        : 0.0;
  c.cost = options_.prefill_weight * c.prefill_tokens + c.load_term +
           c.churn_term + c.affinity_term;
  return c;
}

// A replay's clock is not the scraper's: no engine figures under
// replay_clock.
std::vector<std::optional<EngineLoad>> Picker::EngineReadings(
    const RouteResult& found, absl::Time now) const {
  if (engine_loads_ == nullptr || options_.replay_clock) {
    return std::vector<std::optional<EngineLoad>>(found.workers.size());
  }
  return engine_loads_->FreshOf(found.workers, now);
}

absl::Status Picker::CheckClock(const PickQuery& query) const {
  if (options_.replay_clock && query.replay_time_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replay_time_ms is ", query.replay_time_ms,
        ": index.pick.replay_clock is on, so each Pick gives its time "
        "(milliseconds, > 0)"));
  }
  if (!options_.replay_clock && query.replay_time_ms != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replay_time_ms is ", query.replay_time_ms,
        " but index.pick.replay_clock is off: Pick keeps the daemon's time"));
  }
  return absl::OkStatus();
}

int64_t Picker::ClockMs(const PickQuery& query, absl::Time now) const {
  if (!options_.replay_clock) return absl::ToUnixMillis(now);
  return std::max(query.replay_time_ms, replay_ms_);
}

void Picker::Record(const PickCandidate& chosen, uint64_t blocks,
                    int64_t now_ms, PromptKeys& keys) {
  // Every block, those the events report too: a worker may evict them
  // before it runs the prompt, and then computes them again. Except when
  // the events report the whole prompt: the usual Pick of a hot prompt,
  // which would otherwise hash the prompt and add an entry per block (in
  // process, about 3x Route's cost instead of 1.2-1.5x). The events of a
  // worker that is not LIVE vouch for nothing.
  if (VouchedBlocks(chosen.state, chosen.matched_blocks, blocks) < blocks) {
    predicted_.Add(WorkerTag(chosen.worker), keys.Get(),
                   now_ms + absl::ToInt64Milliseconds(options_.predicted_ttl));
  }
  window_.Add(chosen.worker, now_ms, chosen.prefill_tokens);
}

absl::StatusOr<PickResult> Picker::Pick(const PickQuery& query,
                                        absl::Time now) {
  const RouteQuery& prompt = query.prompt;
  const double prompt_tokens = prompt.keys.empty()
                                   ? static_cast<double>(prompt.tokens.size())
                                   : static_cast<double>(prompt.keys.size()) *
                                         index_->options().block_size;
  RETURN_IF_ERROR(CheckQuery(query, prompt_tokens));
  RETURN_IF_ERROR(CheckClock(query));
  RouteResult found;
  std::vector<const WorkerLoadInput*> loads;
  RETURN_IF_ERROR(Find(query, &found, &loads));

  const uint64_t blocks = found.prompt_blocks;
  PromptKeys keys(this, prompt, blocks);
  const absl::string_view affinity_winner = AffinityWinner(found, keys);
  const std::vector<std::optional<EngineLoad>> engines =
      EngineReadings(found, now);
  PickResult result;
  result.prompt_blocks = blocks;
  result.ranked.reserve(found.workers.size());
  MutexLock lock(&mu_);
  const int64_t now_ms = ClockMs(query, now);
  predicted_.Expire(now_ms);
  window_.Expire(now_ms);
  for (size_t i = 0; i < found.workers.size(); ++i) {
    const EngineLoad* engine = engines[i] ? &*engines[i] : nullptr;
    result.ranked.push_back(Cost(found.workers[i], loads[i], engine,
                                 prompt_tokens, blocks, affinity_winner, now_ms,
                                 keys));
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
  result.worker = result.ranked.front().worker;
  if (query.dry_run) return result;
  result.decision_id = next_decision_.fetch_add(1, std::memory_order_relaxed);
  Record(result.ranked.front(), blocks, now_ms, keys);
  if (options_.replay_clock) replay_ms_ = now_ms;
  return result;
}

}  // namespace prefixd
