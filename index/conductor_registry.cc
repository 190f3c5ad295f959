#include "index/conductor_registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "index/conductor_api.h"

namespace prefixd {
namespace {

constexpr char kFileName[] = "conductor_registrations.json";

absl::Status Errno(absl::string_view what, absl::string_view path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view text, const std::string& tmp) {
  while (!text.empty()) {
    const ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("write", tmp);
    text.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// `text` as the file at `path`, whole or not at all: written to a temporary
// file beside it, flushed, renamed over it, and the directory flushed.
absl::Status WriteAtomically(const std::string& path, absl::string_view text) {
  const std::string tmp = path + ".tmp";
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", tmp);
  absl::Status s = WriteAll(fd, text, tmp);
  if (s.ok() && fsync(fd) != 0) s = Errno("fsync", tmp);
  close(fd);
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0)
    s = Errno("rename", tmp);
  if (!s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  const std::string dir = path.substr(0, path.rfind('/') + 1);
  const int dfd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace

std::string Registration::Name() const {
  return absl::StrCat(instance_id, "|", tenant, "|", dp_rank);
}

IndexSource Registration::Source() const {
  IndexSource s;
  s.name = Name();
  s.endpoint = endpoint;
  s.replay_endpoint = replay_endpoint;
  s.labels.instance_id = instance_id;
  s.labels.tenant = tenant;
  s.labels.model = model;
  s.labels.dp_rank = dp_rank;
  s.labels.lora_name = lora_name;
  s.labels.salt = salt;
  s.labels.hashes_are_keys = type == "Mooncake";
  s.pinned = true;
  return s;
}

bool Registration::operator==(const Registration& o) const {
  return endpoint == o.endpoint && replay_endpoint == o.replay_endpoint &&
         type == o.type && model == o.model && lora_name == o.lora_name &&
         tenant == o.tenant && instance_id == o.instance_id &&
         dp_rank == o.dp_rank && salt == o.salt;
}

absl::StatusOr<std::vector<Registration>> ParseRegistrationFile(
    absl::string_view text, int block_size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("not JSON (byte ", e.byte, "): ", e.what()));
  }
  if (!j.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be a JSON array, not ", j.type_name()));
  }
  std::vector<Registration> out;
  for (size_t i = 0; i < j.size(); ++i) {
    absl::StatusOr<Registration> r = RegistrationFromJson(j[i], block_size);
    if (!r.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry ", i, ": ", r.status().message()));
    }
    out.push_back(*std::move(r));
  }
  return out;
}

std::string RegistrationFileText(const std::vector<Registration>& list,
                                 int block_size) {
  nlohmann::json j = nlohmann::json::array();
  for (const Registration& r : list)
    j.push_back(RegistrationToJson(r, block_size));
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

ConductorRegistry::ConductorRegistry(Ingest* ingest,
                                     const std::string& state_dir,
                                     int block_size)
    : ingest_(ingest),
      path_(state_dir.empty() ? "" : absl::StrCat(state_dir, "/", kFileName)),
      block_size_(block_size) {}

absl::Status ConductorRegistry::Restore() {
  if (path_.empty()) return absl::OkStatus();
  const std::string dir = path_.substr(0, path_.rfind('/'));
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Errno("index.state_dir: cannot create", dir);
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    return Errno("index.state_dir: cannot write in", dir);
  std::ifstream in(path_);
  if (!in) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno("cannot read", path_);
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<Registration>> list =
      ParseRegistrationFile(text.str(), block_size_);
  if (!list.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "registrations file ", path_, ": ", list.status().message(),
        " (fix or remove it; it is index.state_dir's)"));
  }
  MutexLock lock(&mu_);
  for (const Registration& r : *list) {
    RETURN_IF_ERROR(ingest_->AddSource(r.Source()));
    registrations_[r.Name()] = r;
  }
  return absl::OkStatus();
}

absl::Status ConductorRegistry::Add(const Registration& r) {
  MutexLock lock(&mu_);
  const std::string name = r.Name();
  auto it = registrations_.find(name);
  if (it != registrations_.end() && it->second == r) return absl::OkStatus();
  const bool replaces = it != registrations_.end();
  if (!replaces) {
    for (const IndexSource& s : ingest_->Sources()) {
      if (s.name == name) {
        return absl::AlreadyExistsError(absl::StrCat(
            "instance_id: \"", name, "\" is a source of the config"));
      }
    }
  }
  // The file first: a registration that cannot be kept is not followed.
  const std::optional<Registration> old =
      replaces ? std::optional<Registration>(it->second) : std::nullopt;
  registrations_[name] = r;
  if (absl::Status s = Save(); !s.ok()) {
    if (old.has_value()) {
      registrations_[name] = *old;
    } else {
      registrations_.erase(name);
    }
    return s;
  }
  if (replaces) ingest_->RemoveSource(name).IgnoreError();
  return ingest_->AddSource(r.Source());
}

absl::Status ConductorRegistry::Remove(const std::string& name) {
  MutexLock lock(&mu_);
  auto it = registrations_.find(name);
  if (it == registrations_.end()) {
    return absl::NotFoundError(
        absl::StrCat("instance_id: no registration of \"", name,
                     "\" (instance|tenant|dp_rank)"));
  }
  const Registration old = it->second;
  registrations_.erase(it);
  if (absl::Status s = Save(); !s.ok()) {
    registrations_[name] = old;
    return s;
  }
  return ingest_->RemoveSource(name);
}

std::vector<Registration> ConductorRegistry::List() const {
  MutexLock lock(&mu_);
  std::vector<Registration> out;
  for (const auto& [name, r] : registrations_) out.push_back(r);
  return out;
}

absl::Status ConductorRegistry::Save() const {
  if (path_.empty()) return absl::OkStatus();
  std::vector<Registration> list;
  for (const auto& [name, r] : registrations_) list.push_back(r);
  return WriteAtomically(path_, RegistrationFileText(list, block_size_));
}

}  // namespace prefixd
