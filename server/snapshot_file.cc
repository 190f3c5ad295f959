#include "server/snapshot_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "model/units.h"

namespace prefixd {
namespace {

// Call right after the failing system call: reads errno first.
absl::Status Errno(absl::string_view call, const std::string& path) {
  const int err = errno;
  return absl::Status(err == ENOENT ? absl::StatusCode::kNotFound
                                    : absl::StatusCode::kFailedPrecondition,
                      absl::StrCat(call, " ", path, ": ", std::strerror(err)));
}

std::string Directory(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// Like std::filesystem::create_directories, but every directory it creates
// is mode 0700: the snapshot holds prompts' tokens, and the directory is the
// daemon's alone (existing directories keep the mode the operator gave).
void CreateDirectories(const std::string& dir, std::error_code& ec) {
  const std::filesystem::path p(dir);
  if (std::filesystem::is_directory(p, ec) || p.parent_path() == p) return;
  ec.clear();
  if (p.has_parent_path()) {
    CreateDirectories(p.parent_path().string(), ec);
    if (ec) return;
  }
  if (mkdir(dir.c_str(), 0700) != 0) {
    const int err = errno == EEXIST ? ENOTDIR : errno;  // a file is in the way
    ec = std::error_code(err, std::generic_category());
  }
}

// A rename is durable only once its directory is on disk.
absl::Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open", dir);
  const bool ok = fsync(fd) == 0;
  absl::Status status = ok ? absl::OkStatus() : Errno("fsync", dir);
  close(fd);
  return status;
}

absl::Status WriteAll(int fd, absl::string_view bytes,
                      const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("write", path);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Text that came from a file (a fingerprint, a tenant name, a pid), as a
// log line may show it: printable ASCII, others as \xNN, and at most
// `max_bytes` of it.
std::string Printable(absl::string_view text, size_t max_bytes) {
  std::string out;
  for (unsigned char c : text.substr(0, max_bytes)) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
    }
  }
  if (text.size() > max_bytes) {
    absl::StrAppend(&out, "... (", text.size(), " bytes)");
  }
  return out;
}

// The most of a reason quoted in a log line.
constexpr size_t kReasonBytes = 512;

std::string FileType(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// *out = the first `size` bytes of `fd` (fewer if the file ends first).
absl::Status ReadUpTo(int fd, const std::string& path, size_t size,
                      std::string* out) {
  out->resize(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = read(fd, out->data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("read", path);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out->resize(done);
  return absl::OkStatus();
}

// The whole of the regular file at `path`, if it is at most `max_bytes`.
// Never follows a symlink at `path`, never blocks opening a FIFO, and never
// reads more than the size fstat reported: a special file, or a file that
// grows while it is read, cannot make the daemon wait or hold more.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            uint64_t max_bytes) {
  const int fd =
      open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ELOOP) {
    return absl::FailedPreconditionError(
        absl::StrCat(path,
                     " is a symbolic link; prefixd reads only the "
                     "regular file it wrote there"));
  }
  if (fd < 0) return Errno("open", path);
  struct stat st;
  absl::Status status;
  if (fstat(fd, &st) != 0) {
    status = Errno("fstat", path);
  } else if (!S_ISREG(st.st_mode)) {
    status = absl::FailedPreconditionError(
        absl::StrCat(path, " is ", FileType(st.st_mode),
                     ", not a regular file; prefixd reads only the regular "
                     "file it wrote there"));
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    status = absl::FailedPreconditionError(absl::StrCat(
        path, " is ", st.st_size, " bytes, more than the ", max_bytes,
        " bytes a snapshot of this configuration can take"));
  }
  std::string out;
  if (status.ok()) status = ReadUpTo(fd, path, st.st_size, &out);
  close(fd);
  RETURN_IF_ERROR(status);
  return out;
}

// The pid a lock holder wrote into its lock file (at most 20 digits are
// read), or "unknown" when the file holds anything else.
std::string HolderPid(int fd) {
  char buf[21];
  const ssize_t n = pread(fd, buf, sizeof(buf), 0);
  if (n <= 0 || n == static_cast<ssize_t>(sizeof(buf))) return "unknown";
  const absl::string_view pid(buf, static_cast<size_t>(n));
  for (char c : pid) {
    if (c < '0' || c > '9') return "unknown";
  }
  return std::string(pid);
}

absl::Status Rename(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) {
    return Errno("rename", from);
  }
  return SyncDirectory(Directory(to));
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// `<path>.bad-<unix seconds>`, with a suffix if that is taken.
std::string AsideName(const std::string& path, absl::Time now) {
  const std::string base =
      absl::StrCat(path, ".bad-", absl::ToUnixSeconds(now));
  std::string name = base;
  for (int i = 1; Exists(name); ++i) name = absl::StrCat(base, "-", i);
  return name;
}

// Checks everything about `bytes` that does not need a cache, then loads it
// into `cache`.
absl::StatusOr<SnapshotMeta> Load(absl::string_view bytes,
                                  absl::string_view fingerprint,
                                  PrefixCache* cache) {
  ASSIGN_OR_RETURN(SnapshotMeta meta, PrefixCache::ReadSnapshotMeta(bytes));
  if (meta.fingerprint != fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "it was written for model fingerprint ",
        Printable(meta.fingerprint, 64), ", this daemon serves ", fingerprint));
  }
  if (meta.epoch == 0) {
    return absl::DataLossError("it carries epoch 0, which no daemon uses");
  }
  return cache->LoadSnapshot(bytes);
}

std::string Describe(const PrefixCache& cache) {
  uint64_t blocks = 0, leases = 0;
  const CacheStats stats = cache.Stats(TenantScope::All());
  for (const TenantUsage& t : stats.tenants) {
    blocks += t.cached_blocks;
    leases += t.active_leases;
  }
  return absl::StrCat(stats.tenants.size(), " tenants, ", FormatCount(blocks),
                      " blocks, ", FormatCount(leases), " leases");
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  // Whatever sits at <path>.tmp (a write cut short, or a symlink planted to
  // make the daemon overwrite its target) is unlinked, never followed, and
  // the file is created anew: O_EXCL fails rather than reuse one that
  // reappears in between.
  if (unlink(tmp.c_str()) != 0 && errno != ENOENT) return Errno("unlink", tmp);
  const int fd = open(
      tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("open", tmp);
  absl::Status status = WriteAll(fd, bytes, tmp);
  if (status.ok() && fsync(fd) != 0) status = Errno("fsync", tmp);
  if (close(fd) != 0 && status.ok()) status = Errno("close", tmp);
  if (status.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    status = Errno("rename", tmp);
  }
  if (!status.ok()) {
    unlink(tmp.c_str());
    return status;
  }
  return SyncDirectory(Directory(path));
}

absl::StatusOr<std::string> WriteSnapshot(const PrefixCache& cache,
                                          const SnapshotMeta& meta,
                                          const std::string& path) {
  const absl::Time start = absl::Now();
  const std::string bytes = cache.SaveSnapshot(meta);
  RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
  return absl::StrFormat("snapshot written to %s: %s, %s, epoch %016x, in %s",
                         path, Describe(cache), FormatBytes(bytes.size()),
                         meta.epoch,
                         absl::FormatDuration(absl::Trunc(
                             absl::Now() - start, absl::Milliseconds(1))));
}

namespace {

// Creates the snapshot's directory, fails if the snapshot could not be
// written there at shutdown, and removes a temporary file an interrupted
// write left; returns a note for the summary ("" or " (removed ...)").
absl::StatusOr<std::string> PrepareDirectory(const std::string& path) {
  const std::string dir = Directory(path);
  std::error_code ec;
  CreateDirectories(dir, ec);
  if (ec || access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot directory ", dir, " is not writable",
                     ec ? absl::StrCat(" (", ec.message(), ")") : "",
                     ": the snapshot could not be written at shutdown"));
  }
  const std::string tmp = absl::StrCat(path, ".tmp");
  if (unlink(tmp.c_str()) != 0) return std::string();
  return absl::StrCat(" (removed ", tmp, ", left by an interrupted write)");
}

}  // namespace

absl::StatusOr<RestoredSnapshot> RestoreSnapshot(const std::string& path,
                                                 absl::string_view fingerprint,
                                                 const CacheOptions& options,
                                                 absl::Time now) {
  RestoredSnapshot out;
  ASSIGN_OR_RETURN(out.cache, PrefixCache::Create(options));
  ASSIGN_OR_RETURN(const std::string removed_tmp, PrepareDirectory(path));
  absl::StatusOr<std::string> bytes =
      ReadRegularFile(path, out.cache->MaxSnapshotBytes());
  if (!bytes.ok() && bytes.status().code() == absl::StatusCode::kNotFound) {
    out.summary =
        absl::StrCat("no snapshot at ", path,
                     ": starting empty with a new epoch", removed_tmp);
    return out;
  }
  std::unique_ptr<PrefixCache> restored;
  absl::StatusOr<SnapshotMeta> meta = absl::UnknownError("unread");
  if (bytes.ok()) {
    ASSIGN_OR_RETURN(restored, PrefixCache::Create(options));
    meta = Load(*bytes, fingerprint, restored.get());
  } else {
    meta = bytes.status();
  }
  if (!meta.ok()) {
    const std::string reason = Printable(meta.status().message(), kReasonBytes);
    const std::string aside = AsideName(path, now);
    if (absl::Status s = Rename(path, aside); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("snapshot ", path, " is unusable (", reason,
                       ") and cannot be moved aside (", s.message(),
                       "); remove it by hand"));
    }
    out.summary =
        absl::StrCat("snapshot ", path, " is unusable: ", reason, "; moved to ",
                     aside, ", starting empty with a new epoch", removed_tmp);
    return out;
  }
  const std::string consumed = absl::StrCat(path, ".consumed");
  if (absl::Status s = Rename(path, consumed); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "snapshot ", path, " cannot be consumed (", s.message(),
        "): restoring it now would let a later start restore it again; "
        "fix the directory's permissions or remove the file"));
  }
  out.cache = std::move(restored);
  out.epoch = meta->epoch;
  out.summary = absl::StrFormat(
      "restored snapshot %s: %s, epoch %016x (the file is consumed: a crash "
      "from now on restarts empty)%s",
      path, Describe(*out.cache), meta->epoch, removed_tmp);
  return out;
}

absl::StatusOr<std::unique_ptr<SnapshotLock>> SnapshotLock::Acquire(
    const std::string& path) {
  std::error_code ec;
  CreateDirectories(Directory(path), ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create directory ", Directory(path), ": ", ec.message()));
  }
  const std::string lock = absl::StrCat(path, ".lock");
  const int fd =
      open(lock.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
           0600);
  if (fd < 0) return Errno("open", lock);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status status = Errno("fstat", lock);
    close(fd);
    return status;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(lock, " is ", FileType(st.st_mode),
                     ", not a regular file: remove it (prefixd creates it)"));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const bool held = errno == EWOULDBLOCK;
    absl::Status status = Errno("flock", lock);
    const std::string pid = HolderPid(fd);
    close(fd);
    if (!held) return status;
    return absl::FailedPreconditionError(absl::StrCat(
        "another prefixd (pid ", pid, ") uses snapshot_path ", path,
        " (it holds ", lock,
        "): two daemons on one snapshot would overwrite each other's"));
  }
  // The holder's pid, for the message above; the file is never removed
  // (removing a lock file lets two processes lock two different files).
  const std::string pid = absl::StrCat(getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    absl::Status status = Errno("write", lock);
    close(fd);
    return status;
  }
  return std::unique_ptr<SnapshotLock>(new SnapshotLock(fd));
}

SnapshotLock::~SnapshotLock() { close(fd_); }

void DiscardConsumedSnapshot(const std::string& path) {
  unlink(absl::StrCat(path, ".consumed").c_str());
}

absl::Status ReturnConsumedSnapshot(const std::string& path) {
  return Rename(absl::StrCat(path, ".consumed"), path);
}

}  // namespace prefixd
