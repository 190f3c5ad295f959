// ConductorRegistry: the publishers registered through the Mooncake
// Conductor API's /register (docs/index.md, "As a Mooncake Conductor"),
// followed as index sources (index/ingest.h) and kept in a file so that
// they survive a restart of the daemon.
//
// A registration names one engine data-parallel rank: its worker is
// "<instance_id>|<tenant>|<dp_rank>", labelled with the registration's
// instance, tenant, model, LoRA and salt, and pinned to that rank.
//
// The file (`index.state_dir`/conductor_registrations.json, when a state
// directory is configured) is a JSON array of the registrations as
// /register took them. Every change rewrites it whole: a temporary file in
// the same directory, flushed, then renamed over the old one, so a crash
// leaves either the old list or the new one, never a mix.
//
// Thread safety: every method may be called from any thread; mu_
// serializes changes, so the file and the sources always agree.
#ifndef PREFIXD_INDEX_CONDUCTOR_REGISTRY_H_
#define PREFIXD_INDEX_CONDUCTOR_REGISTRY_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"
#include "index/ingest.h"

namespace prefixd {

// One /register, as read (index/conductor_api.h).
struct Registration {
  std::string endpoint;
  std::string replay_endpoint;  // "" = none
  std::string type;             // "vLLM", "SGLang" or "Mooncake"
  std::string model;            // `modelname`
  std::string lora_name;
  std::string tenant = "default";  // `tenant_id`
  std::string instance_id;
  int64_t dp_rank = 0;
  std::string salt;  // `additionalsalt`

  // "<instance_id>|<tenant>|<dp_rank>": its worker and source name.
  std::string Name() const;
  // The index source that follows it.
  IndexSource Source() const;
  bool operator==(const Registration& other) const;
};

class ConductorRegistry {
 public:
  // `state_dir` "" keeps registrations in memory only; `block_size` is the
  // index's (every registration's).
  ConductorRegistry(Ingest* ingest, const std::string& state_dir,
                    int block_size);

  // Creates the state directory if it is missing (mode 0700), reads the
  // file and follows every registration in it (none if there is no file).
  // INVALID_ARGUMENT naming the file and the entry for a file that cannot
  // be read back; INTERNAL naming the directory when it cannot be created
  // or written in.
  absl::Status Restore();

  // Follows `r`; a registration of the same name is replaced (unchanged if
  // equal). ALREADY_EXISTS when the name belongs to a configured source;
  // INTERNAL naming the file when it cannot be written (nothing changed).
  absl::Status Add(const Registration& r);
  // Stops following the registration named `name`. NOT_FOUND if none.
  absl::Status Remove(const std::string& name);

  std::vector<Registration> List() const;
  // The file, or "" without a state directory.
  const std::string& path() const { return path_; }

 private:
  absl::Status Save() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Ingest* const ingest_;
  const std::string path_;
  const int block_size_;
  mutable Mutex mu_;
  std::map<std::string, Registration> registrations_ ABSL_GUARDED_BY(mu_);
};

// The registrations in `text` (the file's JSON: /register bodies, each
// checked as /register checks it) and back.
absl::StatusOr<std::vector<Registration>> ParseRegistrationFile(
    absl::string_view text, int block_size);
std::string RegistrationFileText(const std::vector<Registration>& list,
                                 int block_size);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_CONDUCTOR_REGISTRY_H_
