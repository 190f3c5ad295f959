// What prefixctl prints: aligned tables for people, one JSON object per line
// for scripts. JSON is protobuf's canonical mapping of the response message
// with the .proto field names, every field present (64-bit numbers are
// strings, as proto3 JSON has it), so the names are as stable as the API.
// The one change: "epoch" is 16 hex digits, as in the tables.
#ifndef PREFIXD_CLIENT_OUTPUT_H_
#define PREFIXD_CLIENT_OUTPUT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "prefixd/v1/prefix_cache.pb.h"
#include "prefixd/v1/prefix_index.pb.h"

namespace prefixd {

// Columns separated by two spaces, each as wide as its widest cell.
class Table {
 public:
  explicit Table(std::vector<std::string> header) {
    rows_.push_back(std::move(header));
  }
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // A line printed as is under the last row added; it takes no part in the
  // column widths.
  void AddNote(std::string line) {
    notes_.push_back({rows_.size() - 1, std::move(line)});
  }
  void Print(std::ostream& out) const;

 private:
  std::vector<std::vector<std::string>> rows_;
  std::vector<std::pair<size_t, std::string>> notes_;  // (row, line)
};

// "0 B", "512 B", "2.0 MiB", "4.0 GiB".
std::string HumanBytes(uint64_t bytes);
// Epochs and fingerprints print as 16 hex digits.
std::string Hex64(uint64_t v);
// Hit rate in percent with one decimal, "-" when nothing was looked up.
std::string HitRate(uint64_t hit_tokens, uint64_t looked_up_tokens);

// The message as one line of JSON (see above).
std::string ToJson(const google::protobuf::Message& message);

void PrintInfo(const v1::GetInfoResponse& info, std::ostream& out);
void PrintStats(const v1::StatsResponse& stats, std::ostream& out);
// query_tokens: how many tokens were asked for.
void PrintMatch(const v1::MatchResponse& match, size_t query_tokens,
                std::ostream& out);
void PrintInsert(const v1::InsertResponse& insert, size_t tokens, size_t blocks,
                 std::ostream& out);
// One line per event.
void PrintEvent(const v1::Event& event, std::ostream& out);
void PrintDump(const v1::DumpResponse& dump, const std::string& ns,
               std::ostream& out);

// The fleet index. "CONNECTING", "LIVE", "REPLAYING", "ERROR",
// "UNSPECIFIED"; the number for a state this build does not know.
std::string WorkerStateName(int state);
// query_tokens: how many tokens were asked for.
void PrintRoute(const v1::RouteResponse& route, size_t query_tokens,
                std::ostream& out);
// query_tokens: how many tokens were asked for.
void PrintPick(const v1::PickResponse& pick, size_t query_tokens,
               std::ostream& out);
// `now` dates LAST_EVENT ("1.5s ago").
void PrintWorkers(const v1::ListWorkersResponse& workers, absl::Time now,
                  std::ostream& out);

}  // namespace prefixd

#endif  // PREFIXD_CLIENT_OUTPUT_H_
