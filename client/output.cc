#include "client/output.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/id_list.h"
#include "google/protobuf/util/json_util.h"

namespace prefixd {
namespace {

// Tokens shown per dump node before the rest is summarized.
constexpr int kDumpTokensShown = 16;

constexpr std::array<const char*, 5> kEvictReasons = {
    "budget", "limit", "requested", "invalidated", "reset"};

std::string Ids(const google::protobuf::RepeatedField<uint64_t>& ids) {
  return FormatIdList(absl::MakeConstSpan(ids.data(), ids.size()));
}

std::string Quoted(const std::string& s) {
  return absl::StrCat("\"", absl::CEscape(s), "\"");
}

// "1 block", "2 blocks".
std::string Count(uint64_t n, const char* noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

// "GPU=3,CPU=1" (in the response's order), "-" for none.
template <typename Medium, typename Blocks>
std::string MediumList(const google::protobuf::RepeatedPtrField<Medium>& list,
                       Blocks blocks) {
  if (list.empty()) return "-";
  std::vector<std::string> parts;
  for (const Medium& m : list)
    parts.push_back(absl::StrCat(m.medium(), "=", blocks(m)));
  return absl::StrJoin(parts, ",");
}

// A sequence number; "-" for -1 (nothing applied yet).
std::string Seq(int64_t seq) { return seq < 0 ? "-" : absl::StrCat(seq); }

// How long ago `unix_ms` was: "250ms ago", "3.5s ago", "2m3s ago"; "never"
// for 0.
std::string Ago(int64_t unix_ms, absl::Time now) {
  if (unix_ms == 0) return "never";
  absl::Duration age = now - absl::FromUnixMillis(unix_ms);
  if (age <= absl::ZeroDuration()) return "now";
  age = absl::Trunc(
      age, age < absl::Minutes(1) ? absl::Milliseconds(1) : absl::Seconds(1));
  return absl::StrCat(absl::FormatDuration(age), " ago");
}

// One line: control characters (newlines) become spaces.
std::string OneLine(std::string s) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return s;
}

constexpr const char* kRetentionClasses[] = {"low", "default", "high"};

uint64_t EvictedBlocks(const v1::TenantStats& t, const std::string& reason) {
  for (const v1::EvictionCount& e : t.evictions()) {
    if (e.reason() == reason) return e.blocks();
  }
  return 0;
}

}  // namespace

void Table::Print(std::ostream& out) const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  }
  auto note = notes_.begin();
  for (size_t r = 0; r < rows_.size(); ++r) {
    const std::vector<std::string>& row = rows_[r];
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size())
        line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
    for (; note != notes_.end() && note->first == r; ++note)
      out << note->second << "\n";
  }
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr std::array<const char*, 6> kUnits = {"KiB", "MiB", "GiB",
                                                        "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (v >= 1024 && unit + 1 < kUnits.size()) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string Hex64(uint64_t v) { return absl::StrFormat("%016x", v); }

std::string HitRate(uint64_t hit_tokens, uint64_t looked_up_tokens) {
  if (looked_up_tokens == 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(hit_tokens) /
                                       static_cast<double>(looked_up_tokens));
}

// protobuf's JSON prints a fixed64 as a decimal string; the epoch reads as
// 16 hex digits everywhere else (tables, the daemon's log, the Python
// client), so one epoch looks the same wherever it is printed. The key can
// only appear unescaped as a key: inside a string value its quotes would be
// escaped.
namespace {
std::string HexEpochs(std::string json) {
  constexpr char kKey[] = "\"epoch\":\"";
  for (size_t pos = json.find(kKey); pos != std::string::npos;
       pos = json.find(kKey, pos)) {
    pos += sizeof(kKey) - 1;
    const size_t end = json.find('"', pos);
    uint64_t epoch = 0;
    if (end != std::string::npos &&
        absl::SimpleAtoi(absl::string_view(json).substr(pos, end - pos),
                         &epoch)) {
      json.replace(pos, end - pos, Hex64(epoch));
    }
  }
  return json;
}
}  // namespace

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options)
           .ok()) {
    return "{}";  // only for invalid UTF-8 in strings, which the daemon never
                  // sends
  }
  return HexEpochs(std::move(json));
}

void PrintInfo(const v1::GetInfoResponse& info, std::ostream& out) {
  const v1::Limits& l = info.limits();
  Table t({"version", info.version()});
  t.AddRow({"epoch", Hex64(info.epoch())});
  t.AddRow({"model", info.model()});
  t.AddRow({"model_fingerprint", info.model_fingerprint()});
  t.AddRow({"bytes_per_token", absl::StrCat(info.bytes_per_token())});
  t.AddRow({"block_size", absl::StrCat(info.block_size(), " tokens")});
  t.AddRow({"block_bytes", absl::StrCat(info.block_bytes(), " (",
                                        HumanBytes(info.block_bytes()), ")")});
  t.AddRow({"budget", absl::StrCat(info.budget_bytes(), " bytes (",
                                   HumanBytes(info.budget_bytes()), ", ",
                                   info.budget_blocks(), " blocks)")});
  t.AddRow({"rope_shift", info.rope_shift()});
  t.AddRow({"eviction_policy", info.eviction_policy()});
  t.AddRow({"auth_mode", info.auth_mode()});
  t.AddRow(
      {"default_lease_ttl", absl::StrCat(info.default_lease_ttl_ms(), " ms")});
  t.AddRow(
      {"max_tokens_per_request", absl::StrCat(l.max_tokens_per_request())});
  t.AddRow({"max_block_ids_per_request",
            absl::StrCat(l.max_block_ids_per_request())});
  t.AddRow({"max_namespaces_per_tenant",
            absl::StrCat(l.max_namespaces_per_tenant())});
  t.AddRow({"max_tenants", absl::StrCat(l.max_tenants())});
  t.AddRow({"max_leases_per_tenant", absl::StrCat(l.max_leases_per_tenant())});
  t.AddRow({"max_namespace_bytes", absl::StrCat(l.max_namespace_bytes())});
  t.AddRow({"max_message_bytes", absl::StrCat(l.max_message_bytes())});
  t.AddRow({"max_position", absl::StrCat(l.max_position())});
  t.AddRow({"max_lease_ttl", absl::StrCat(l.max_lease_ttl_ms(), " ms")});
  t.Print(out);
}

void PrintStats(const v1::StatsResponse& stats, std::ostream& out) {
  out << "epoch " << Hex64(stats.epoch()) << "  block_size "
      << stats.block_size() << "  block_bytes "
      << HumanBytes(stats.block_bytes()) << "  budget "
      << HumanBytes(stats.budget_bytes()) << " (" << stats.budget_blocks()
      << " blocks)\n\n";
  Table t({"TENANT", "HIT_RATE", "HIT/LOOKED_UP", "MATCHES", "INSERTS",
           "CACHED", "PINNED", "LEASES"});
  Table e({"EVICTED_BLOCKS", "budget", "limit", "requested", "invalidated",
           "reset"});
  Table r({"RETENTION", "cached low", "default", "high", "evicted low",
           "default", "high"});
  auto blocks_and_bytes = [](uint64_t blocks, uint64_t bytes) {
    return absl::StrCat(blocks, " blocks (", HumanBytes(bytes), ")");
  };
  for (const v1::TenantStats& s : stats.tenants()) {
    t.AddRow({s.tenant(), HitRate(s.match_hit_tokens(), s.match_tokens()),
              absl::StrCat(s.match_hit_tokens(), "/", s.match_tokens()),
              absl::StrCat(s.match_requests()),
              absl::StrCat(s.insert_requests()),
              blocks_and_bytes(s.cached_blocks(), s.cached_bytes()),
              blocks_and_bytes(s.pinned_blocks(), s.pinned_bytes()),
              absl::StrCat(s.active_leases())});
    std::vector<std::string> row = {s.tenant()};
    for (const char* reason : kEvictReasons)
      row.push_back(absl::StrCat(EvictedBlocks(s, reason)));
    e.AddRow(std::move(row));
    // By class name; a daemon without retention counts sends none, and
    // the row is dashes.
    std::vector<std::string> cached(3, "-"), evicted(3, "-");
    for (const v1::RetentionCount& c : s.retention()) {
      for (int i = 0; i < 3; ++i) {
        if (c.retention() != kRetentionClasses[i]) continue;
        cached[i] = absl::StrCat(c.cached_blocks());
        evicted[i] = absl::StrCat(c.evicted_blocks());
      }
    }
    std::vector<std::string> by_class = {s.tenant()};
    by_class.insert(by_class.end(), cached.begin(), cached.end());
    by_class.insert(by_class.end(), evicted.begin(), evicted.end());
    r.AddRow(std::move(by_class));
  }
  t.Print(out);
  out << "\n";
  e.Print(out);
  out << "\n";
  r.Print(out);
}

void PrintMatch(const v1::MatchResponse& match, size_t query_tokens,
                std::ostream& out) {
  size_t blocks = 0;
  for (const v1::Segment& s : match.segments()) blocks += s.block_ids_size();
  out << "matched " << match.matched_tokens() << " of " << query_tokens
      << " tokens (" << Count(blocks, "block") << ", "
      << Count(match.segments_size(), "segment") << ")  epoch "
      << Hex64(match.epoch()) << "\n";
  if (match.has_rope_denied()) {
    // Without this, a prompt cached at another position shows as a plain
    // miss ("matched 0") and the user cannot tell policy from absence.
    const v1::RopeDenied& d = match.rope_denied();
    out << "stopped at position " << d.requested_position()
        << ": the next block is cached at position " << d.cached_position()
        << "; rope.shift is DENY, which matches only blocks at the requested "
           "position (ALLOW would return it with rope_delta "
        << d.requested_position() - d.cached_position()
        << " for the engine to re-rotate)\n";
  }
  if (match.segments_size() > 0) {
    Table t(
        {"SEGMENT", "BLOCKS", "CACHED_POSITION", "ROPE_DELTA", "BLOCK_IDS"});
    for (int i = 0; i < match.segments_size(); ++i) {
      const v1::Segment& s = match.segments(i);
      t.AddRow({absl::StrCat(i), absl::StrCat(s.block_ids_size()),
                absl::StrCat(s.cached_position()), absl::StrCat(s.rope_delta()),
                Ids(s.block_ids())});
    }
    t.Print(out);
  }
  if (match.lease_id() != 0) out << "lease " << match.lease_id() << "\n";
}

void PrintInsert(const v1::InsertResponse& insert, size_t tokens, size_t blocks,
                 std::ostream& out) {
  const uint64_t block_size = blocks == 0 ? 0 : tokens / blocks;
  const uint64_t cached_blocks =
      block_size == 0 ? 0 : insert.cached_tokens() / block_size;
  out << "inserted " << tokens << " tokens: " << insert.cached_tokens()
      << " already cached, "
      << blocks - std::min<uint64_t>(blocks, cached_blocks) << " of " << blocks
      << " blocks new  epoch " << Hex64(insert.epoch()) << "\n";
  Table t({"redundant_block_ids", Ids(insert.redundant_block_ids())});
  t.AddRow({"evicted_block_ids", Ids(insert.evicted_block_ids())});
  t.AddRow({"lease",
            insert.lease_id() == 0 ? "-" : absl::StrCat(insert.lease_id())});
  t.Print(out);
}

void PrintEvent(const v1::Event& event, std::ostream& out) {
  out << "#" << event.sequence() << " ";
  switch (event.kind_case()) {
    case v1::Event::kBlockStored: {
      const v1::BlockStored& s = event.block_stored();
      out << "stored ns=" << Quoted(s.namespace_())
          << " position=" << s.position() << " parent="
          << (s.has_parent() ? absl::StrCat(s.parent_block_id()) : "-")
          << " blocks=" << Ids(s.block_ids());
      break;
    }
    case v1::Event::kBlockRemoved: {
      const v1::BlockRemoved& r = event.block_removed();
      out << "removed ns=" << Quoted(r.namespace_()) << " reason=" << r.reason()
          << " blocks=" << Ids(r.block_ids());
      break;
    }
    case v1::Event::kCleared:
      out << "cleared reason=" << event.cleared().reason();
      break;
    case v1::Event::KIND_NOT_SET:
      out << "unknown";
      break;
  }
  out << "\n";
}

void PrintDump(const v1::DumpResponse& dump, const std::string& ns,
               std::ostream& out) {
  std::vector<std::string> names;
  for (const std::string& n : dump.namespaces()) names.push_back(Quoted(n));
  out << "namespaces: " << (names.empty() ? "-" : absl::StrJoin(names, " "))
      << "\n";
  out << "namespace " << Quoted(ns) << ": " << dump.nodes_size()
      << " nodes  epoch " << Hex64(dump.epoch()) << "\n";
  for (const v1::DumpNode& n : dump.nodes()) {
    const int shown = std::min(n.tokens_size(), kDumpTokensShown);
    std::vector<uint32_t> head(n.tokens().begin(), n.tokens().begin() + shown);
    out << std::string(2 * (n.depth() > 0 ? n.depth() - 1 : 0), ' ') << "- ["
        << n.position() << "," << n.position() + n.tokens_size()
        << ") blocks=" << Ids(n.block_ids()) << " pins=" << n.pins()
        << " stamp=" << n.stamp() << " tokens=" << FormatIdList(head);
    if (shown < n.tokens_size())
      out << ",...(+" << n.tokens_size() - shown << ")";
    out << "\n";
  }
}

std::string WorkerStateName(int state) {
  constexpr absl::string_view kPrefix = "WORKER_STATE_";
  if (!v1::WorkerState_IsValid(state)) return absl::StrCat(state);
  absl::string_view name =
      v1::WorkerState_Name(static_cast<v1::WorkerState>(state));
  absl::ConsumePrefix(&name, kPrefix);
  return std::string(name);
}

void PrintRoute(const v1::RouteResponse& route, size_t query_tokens,
                std::ostream& out) {
  out << "prompt " << Count(route.prompt_blocks(), "block") << " ("
      << Count(query_tokens, "token") << ", block_size " << route.block_size()
      << ")  ";
  if (route.best_worker().empty()) {
    out << "no worker holds the first block\n";
  } else {
    out << "best worker " << route.best_worker();
    for (const v1::WorkerMatch& w : route.workers()) {
      if (w.worker() == route.best_worker()) {
        out << " (" << Count(w.matched_blocks(), "block") << ")";
        break;
      }
    }
    out << "\n";
  }
  if (route.workers().empty()) return;  // no header over no rows
  Table t({"WORKER", "MATCHED_BLOCKS", "MATCHED_TOKENS", "MEDIUMS", "STATE",
           "LAST_SEQ", "LAG"});
  for (const v1::WorkerMatch& w : route.workers()) {
    t.AddRow({w.worker(), absl::StrCat(w.matched_blocks()),
              absl::StrCat(w.matched_blocks() * route.block_size()),
              MediumList(
                  w.mediums(),
                  [](const v1::MediumMatch& m) { return m.matched_blocks(); }),
              WorkerStateName(w.state()), Seq(w.last_seq()),
              w.last_seq() < 0
                  ? "-"
                  : absl::FormatDuration(absl::Milliseconds(w.lag_ms()))});
  }
  t.Print(out);
}

void PrintPick(const v1::PickResponse& pick, size_t query_tokens,
               std::ostream& out) {
  out << "prompt " << Count(pick.prompt_blocks(), "block") << " ("
      << Count(query_tokens, "token") << ", block_size " << pick.block_size()
      << ")  "
      << (pick.decision_id() == 0
              ? std::string("dry run")
              : absl::StrCat("decision ", pick.decision_id()))
      << "  picked " << pick.worker() << "\n";
  Table t({"WORKER", "COST", "PREFILL", "LOAD", "CHURN", "AFFINITY", "MATCHED",
           "PREDICTED", "CREDITED", "IN_FLIGHT", "QUEUED", "KV", "LOAD_FROM",
           "STATE"});
  for (const v1::PickCandidate& c : pick.ranked()) {
    t.AddRow({c.worker(), absl::StrFormat("%.1f", c.cost()),
              absl::StrFormat("%.0f", c.prefill_tokens()),
              absl::StrFormat("%.1f", c.load_term()),
              absl::StrFormat("%.1f", c.churn_term()),
              absl::StrFormat("%.1f", c.affinity_term()),
              absl::StrCat(c.matched_blocks()),
              absl::StrCat(c.predicted_blocks()),
              absl::StrFormat("%.2f", c.credited_blocks()),
              absl::StrCat(c.requests_in_flight()),
              absl::StrCat(c.queued_prefill_tokens()),
              absl::StrFormat("%.2f", c.kv_usage()),
              c.load_from_request()  ? "router"
              : c.load_from_engine() ? "engine"
                                     : "window",
              WorkerStateName(c.state())});
  }
  t.Print(out);
}

namespace {

// "instance a  tenant acme  model llama  dp 1 ..." for the labels a
// registration set; "" when none is.
std::string LabelsNote(const v1::WorkerLabels& l) {
  std::vector<std::string> parts;
  auto add = [&parts](absl::string_view name, const std::string& value) {
    if (!value.empty())
      parts.push_back(absl::StrCat(name, " ", OneLine(value)));
  };
  add("instance", l.instance_id());
  add("tenant", l.tenant());
  add("model", l.model());
  if (!parts.empty() || l.dp_rank() != 0)
    parts.push_back(absl::StrCat("dp ", l.dp_rank()));
  add("lora", l.lora_name());
  add("salt", l.salt());
  add("address", l.address());
  if (l.hashes_are_keys()) parts.push_back("placed by rolling keys");
  return absl::StrJoin(parts, "  ");
}

}  // namespace

void PrintWorkers(const v1::ListWorkersResponse& workers, absl::Time now,
                  std::ostream& out) {
  out << Count(workers.workers_size(), "worker") << "  entries "
      << workers.entries() << "/" << workers.max_entries() << "  block_size "
      << workers.block_size() << "\n";
  Table t({"WORKER", "STATE", "ENDPOINT", "BLOCKS", "EVENTS", "GAPS", "REPLAYS",
           "CLEARS", "DROPPED", "LAST_SEQ", "LAST_EVENT"});
  for (const v1::WorkerInfo& w : workers.workers()) {
    t.AddRow({w.worker(), WorkerStateName(w.state()),
              w.endpoint().empty() ? "-" : w.endpoint(),
              MediumList(w.mediums(),
                         [](const v1::MediumBlocks& m) { return m.blocks(); }),
              absl::StrCat(w.events()), absl::StrCat(w.gaps()),
              absl::StrCat(w.replays()), absl::StrCat(w.clears()),
              absl::StrCat(w.dropped_blocks()), Seq(w.last_seq()),
              Ago(w.last_event_unix_ms(), now)});
    if (const std::string labels = LabelsNote(w.labels()); !labels.empty())
      t.AddNote(absl::StrCat("  ", labels));
    if (!w.state_detail().empty())
      t.AddNote(absl::StrCat("  state_detail: ", OneLine(w.state_detail())));
    if (!w.last_error().empty())
      t.AddNote(absl::StrCat("  last_error: ", OneLine(w.last_error())));
    for (const v1::KvCacheGroup& g : w.groups()) {
      t.AddNote(absl::StrCat(
          "  group ", g.group(), ": ", g.kind(),
          g.kind() != "sliding_window" ? ""
          : g.window_blocks() > 0
              ? absl::StrCat(", window ", g.window_blocks(), " blocks")
              : ", window unknown (every block)"));
    }
  }
  t.Print(out);
}

}  // namespace prefixd
