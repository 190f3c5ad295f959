// The snapshot on disk (docs/operations.md): written
// atomically when the daemon stops cleanly, read at most once at start-up.
//
//   start:  RestoreSnapshot(path, ...)      restored cache + epoch, or empty
//           Server::Start(...)              ok: DiscardConsumedSnapshot(path)
//                                           failed:
//                                           ReturnConsumedSnapshot(path)
//   stop:   Server::Shutdown()              drained: nothing changes any more
//           WriteSnapshot(cache, meta, path)
//
// A snapshot is trusted once. Restoring renames it to `<path>.consumed`
// before anything is served, so a crash afterwards finds no clean snapshot
// and the daemon starts empty with a new epoch: the engine has reused the
// IDs the old file names by then. The core's format carries the checksum;
// this file adds the file-system half (temp file, fsync, rename, fsync of
// the directory) and the policy for files that cannot be used.
#ifndef PREFIXD_SERVER_SNAPSHOT_FILE_H_
#define PREFIXD_SERVER_SNAPSHOT_FILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/cache.h"

namespace prefixd {

// Writes `bytes` to `path` so that a reader sees the old file or the whole
// new one, even across a power cut: `<path>.tmp` (mode 0600) is written and
// fsync'd, renamed over `path`, and the directory is fsync'd. The temporary
// file is created with O_EXCL|O_NOFOLLOW once whatever was there is
// unlinked: a symlink planted at `<path>.tmp` is never written through. On
// error the temporary file is removed and `path` is untouched. Errors name the
// path and the failing system call.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes);

// Saves `cache` with `meta` to `path` atomically. Returns one line for the
// log: blocks, leases, bytes, epoch. REQUIRES: nothing mutates the cache
// any more (the server has drained), so the file is the final state.
absl::StatusOr<std::string> WriteSnapshot(const PrefixCache& cache,
                                          const SnapshotMeta& meta,
                                          const std::string& path);

struct RestoredSnapshot {
  // The cache to serve: the snapshot's state, or a fresh empty one.
  std::unique_ptr<PrefixCache> cache;
  // The snapshot's epoch; unset when the daemon must pick a new one.
  std::optional<uint64_t> epoch;
  // One line for the log: what was restored (tenants, blocks, leases,
  // epoch), that there was no snapshot, or why the file was set aside.
  std::string summary;
};

// Start-up. With no file at `path`: a fresh cache. With a clean snapshot of
// this daemon's `fingerprint` that fits `options`: the restored cache and its
// epoch, and the file is consumed (renamed to `<path>.consumed`, directory
// fsync'd). With any other file (unreadable, truncated, corrupt, another
// fingerprint, another block size, over the budget or limits): the file is
// moved to `<path>.bad-<unix seconds>`, and the result is a fresh cache (a
// failed load leaves a cache half-built) and no epoch. A `<path>.tmp` left by
// an interrupted write is removed. `now` names the moved-aside file.
//
// Fails (the daemon must not start) only when the options are invalid, or
// the file cannot be consumed or moved aside: left in place, it would be
// restored by a later start, after the engine reused its IDs. Also fails when
// the directory of `path` cannot be created (mode 0700) or written, since
// the snapshot could not be written at shutdown either.
absl::StatusOr<RestoredSnapshot> RestoreSnapshot(const std::string& path,
                                                 absl::string_view fingerprint,
                                                 const CacheOptions& options,
                                                 absl::Time now = absl::Now());

// One daemon per snapshot_path: an exclusive flock(2) on `<path>.lock`,
// held while the object lives (the lock goes with its file descriptor, so a
// crash releases it too). Two daemons on one path would each restore and
// then overwrite the other's snapshot at shutdown.
class SnapshotLock {
 public:
  // Creates the directory of `path` (mode 0700) if needed, and takes the
  // lock. FAILED_PRECONDITION naming the lock file and the holder's pid if
  // another process holds it; other errors name the path and the call.
  static absl::StatusOr<std::unique_ptr<SnapshotLock>> Acquire(
      const std::string& path);
  ~SnapshotLock();
  SnapshotLock(const SnapshotLock&) = delete;
  SnapshotLock& operator=(const SnapshotLock&) = delete;

 private:
  explicit SnapshotLock(int fd) : fd_(fd) {}
  const int fd_;
};

// After the server started serving a restored cache: removes the consumed
// file (best effort; the daemon never reads it).
void DiscardConsumedSnapshot(const std::string& path);

// When the server could not start with a restored cache (nothing was
// served, so the snapshot still describes the engine's state): renames
// `<path>.consumed` back to `path` for the next attempt.
absl::Status ReturnConsumedSnapshot(const std::string& path);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_SNAPSHOT_FILE_H_
