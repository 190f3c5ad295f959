// belady: the offline-optimal block hit rate of the trace replay at each
// capacity (bench/belady.h), the bound docs/performance.md puts every
// eviction policy against.
//
//   belady [--traces=conversation,synthetic] [--capacities=1953,5859,19531]
//          [--json]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/belady.h"
#include "bench/trace.h"

ABSL_FLAG(std::vector<std::string>, capacities,
          std::vector<std::string>({"64", "256", "1953", "5859", "19531",
                                    "60000", "infinite"}),
          "cache capacities in blocks; 'infinite' for no limit");
ABSL_FLAG(bool, json, false, "print JSON instead of a table");

namespace prefixd {
namespace bench {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "belady: %s\n", what.c_str());
  std::exit(1);
}

struct Row {
  std::string trace;
  uint64_t capacity;
  ReplayCounts counts;
};

double HitPercent(const ReplayCounts& c) {
  return c.blocks == 0 ? 0.0 : 100.0 * c.hit_blocks / c.blocks;
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf("%-14s %9s %9s %9s %9s %9s %8s\n", "trace", "capacity", "blocks",
              "hit_blk", "blk_hit", "evicted", "refused");
  for (const Row& r : rows) {
    std::printf("%-14s %9s %9llu %9llu %8.4f%% %9llu %8llu\n", r.trace.c_str(),
                CapacityName(r.capacity).c_str(),
                static_cast<unsigned long long>(r.counts.blocks),
                static_cast<unsigned long long>(r.counts.hit_blocks),
                HitPercent(r.counts),
                static_cast<unsigned long long>(r.counts.evicted_blocks),
                static_cast<unsigned long long>(r.counts.refused_inserts));
  }
}

// The shape of bench/lru_sim.py's --json, one object per trace.
void PrintJson(const std::vector<Row>& rows) {
  std::vector<std::string> items;
  for (const Row& r : rows) {
    items.push_back(absl::StrCat(
        "{\"trace\": \"", r.trace, "\", \"capacity\": \"",
        CapacityName(r.capacity), "\", \"blocks\": ", r.counts.blocks,
        ", \"hit_blocks\": ", r.counts.hit_blocks,
        ", \"block_hit_rate\": ", HitPercent(r.counts) / 100.0,
        ", \"evicted_blocks\": ", r.counts.evicted_blocks,
        ", \"refused_inserts\": ", r.counts.refused_inserts, "}"));
  }
  std::printf("{\"policy\": \"belady\", \"results\": [\n  %s\n]}\n",
              absl::StrJoin(items, ",\n  ").c_str());
}

int Main() {
  std::vector<uint64_t> capacities;
  for (const std::string& c : absl::GetFlag(FLAGS_capacities)) {
    absl::StatusOr<uint64_t> cap = ParseCapacity(c);
    if (!cap.ok()) Die(std::string(cap.status().message()));
    capacities.push_back(*cap);
  }
  std::vector<Row> rows;
  for (const std::string& name : absl::GetFlag(FLAGS_traces)) {
    absl::StatusOr<Trace> trace =
        LoadTrace(name, absl::GetFlag(FLAGS_trace_dir));
    if (!trace.ok()) Die(std::string(trace.status().message()));
    for (uint64_t cap : capacities) {
      std::fprintf(stderr, "belady: %s capacity %s\n", name.c_str(),
                   CapacityName(cap).c_str());
      rows.push_back({name, cap, ReplayBelady(*trace, cap)});
    }
  }
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(rows);
  } else {
    PrintTable(rows);
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace prefixd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Prints the offline-optimal (Belady) block hit rate of the Mooncake "
      "trace replay at each capacity: the bound for every eviction policy "
      "(docs/performance.md, \"Eviction\").");
  prefixd::bench::ListBenchFlagsInHelp();
  absl::ParseCommandLine(argc, argv);
  return prefixd::bench::Main();
}
