#include "server/snapshot_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Optional;

constexpr char kFingerprint[] = "0123456789abcdef";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class SnapshotFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = absl::StrCat(::testing::TempDir(), "/prefixd-snapshot-file-test-",
                        getpid(), "-", counter++);
    fs::create_directories(dir_);
    path_ = dir_ + "/snapshot.bin";
  }
  void TearDown() override { fs::remove_all(dir_); }

  CacheOptions Options(uint64_t budget_blocks = 100, int block_size = 2) {
    CacheOptions o;
    o.block_size = block_size;
    o.block_bytes = 1;
    o.budget_bytes = budget_blocks;
    o.clock = &clock_;
    o.default_lease_ttl = absl::Seconds(30);
    return o;
  }

  // Two tenants, three blocks, one lease.
  std::unique_ptr<PrefixCache> Filled() {
    auto cache = std::move(PrefixCache::Create(Options())).value();
    std::vector<Token> tokens = {1, 1, 2, 2};
    std::vector<BlockId> ids = {10, 20};
    InsertRequest req;
    req.tokens = tokens;
    req.block_ids = ids;
    req.pin = true;
    EXPECT_TRUE(cache->Insert("a", req).ok());
    std::vector<Token> other = {5, 5};
    std::vector<BlockId> other_ids = {50};
    req.tokens = other;
    req.block_ids = other_ids;
    req.pin = false;
    EXPECT_TRUE(cache->Insert("b", req).ok());
    return cache;
  }

  static std::string State(const PrefixCache& cache) {
    std::string out;
    for (const TenantUsage& t : cache.Stats(TenantScope::All()).tenants) {
      absl::StrAppend(&out, t.tenant, " cached ", t.cached_blocks, " pinned ",
                      t.pinned_blocks, " leases ", t.active_leases, "\n");
      const std::vector<std::string> namespaces =
          cache.Namespaces(t.tenant).value();
      for (const std::string& ns : namespaces) {
        const std::vector<DumpNode> nodes = cache.Dump(t.tenant, ns).value();
        for (const DumpNode& n : nodes) {
          absl::StrAppend(&out, "  d", n.depth, " s", n.stamp, " p", n.pins);
          for (BlockId id : n.block_ids) absl::StrAppend(&out, " ", id);
          absl::StrAppend(&out, "\n");
        }
      }
    }
    return out;
  }

  ManualClock clock_;
  std::string dir_;
  std::string path_;
};

TEST_F(SnapshotFileTest, WriteFileAtomicallyLeavesOnlyTheWholeFile) {
  ASSERT_TRUE(WriteFileAtomically(path_, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path_, "second, longer").ok());
  EXPECT_EQ(ReadFile(path_), "second, longer");
  EXPECT_EQ(Files(dir_), std::vector<std::string>{"snapshot.bin"});
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // it holds prompts' tokens
}

TEST_F(SnapshotFileTest, WriteFileAtomicallyNeverFollowsAPlantedSymlink) {
  // Whoever can write the directory could point <path>.tmp at a file the
  // daemon may write; the snapshot must not land in that file.
  const std::string victim = dir_ + "/victim";
  WriteFile(victim, "precious");
  ASSERT_EQ(symlink(victim.c_str(), (path_ + ".tmp").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomically(path_, "snapshot bytes").ok());
  EXPECT_EQ(ReadFile(victim), "precious");
  EXPECT_EQ(ReadFile(path_), "snapshot bytes");
  struct stat st;
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(Files(dir_), (std::vector<std::string>{"snapshot.bin", "victim"}));
}

TEST_F(SnapshotFileTest, WriteFileAtomicallyFailsNamingThePath) {
  const std::string bad = dir_ + "/missing/snapshot.bin";
  absl::Status s = WriteFileAtomically(bad, "x");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(bad + ".tmp"));
  EXPECT_TRUE(Files(dir_).empty());
}

TEST_F(SnapshotFileTest, RestoresOnceThenStartsEmpty) {
  auto before = Filled();
  absl::StatusOr<std::string> written =
      WriteSnapshot(*before, {kFingerprint, 0xfeed}, path_);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_THAT(*written, HasSubstr("2 tenants, 3 blocks, 1 leases"));
  EXPECT_THAT(*written, HasSubstr("000000000000feed"));

  auto restored = RestoreSnapshot(path_, kFingerprint, Options());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_THAT(restored->epoch, Optional(0xfeed));
  EXPECT_EQ(State(*restored->cache), State(*before));
  EXPECT_TRUE(restored->cache->CheckInvariants().ok());
  EXPECT_THAT(restored->summary,
              HasSubstr("2 tenants, 3 blocks, 1 leases, epoch "
                        "000000000000feed"));
  // Consumed before anything is served: a crash now leaves no snapshot.
  EXPECT_EQ(Files(dir_), std::vector<std::string>{"snapshot.bin.consumed"});
  DiscardConsumedSnapshot(path_);
  EXPECT_TRUE(Files(dir_).empty());

  auto again = RestoreSnapshot(path_, kFingerprint, Options());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->epoch, std::nullopt);
  EXPECT_EQ(State(*again->cache), "");
  EXPECT_THAT(again->summary, HasSubstr("no snapshot"));
}

TEST_F(SnapshotFileTest, AFailedStartReturnsTheConsumedSnapshot) {
  ASSERT_TRUE(WriteSnapshot(*Filled(), {kFingerprint, 7}, path_).ok());
  ASSERT_TRUE(RestoreSnapshot(path_, kFingerprint, Options()).ok());
  ASSERT_TRUE(ReturnConsumedSnapshot(path_).ok());
  auto restored = RestoreSnapshot(path_, kFingerprint, Options());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_THAT(restored->epoch, Optional(7));
}

TEST_F(SnapshotFileTest, LeasesKeepTheTimeTheyHadLeft) {
  auto before = Filled();
  clock_.Advance(absl::Seconds(20));  // the lease has 10 s left
  ASSERT_TRUE(WriteSnapshot(*before, {kFingerprint, 7}, path_).ok());
  auto restored = RestoreSnapshot(path_, kFingerprint, Options());
  ASSERT_TRUE(restored.ok());
  clock_.Advance(absl::Seconds(9));
  EXPECT_EQ(restored->cache->ExpireLeases(), 0u);
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(restored->cache->ExpireLeases(), 1u);
}

// Every unusable file is moved aside with a reason, and the daemon starts
// empty with a new epoch.
TEST_F(SnapshotFileTest, UnusableSnapshotsAreMovedAside) {
  const std::string good = Filled()->SaveSnapshot({kFingerprint, 7});
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x01;
  struct Case {
    std::string name;
    std::string bytes;
    std::string reason;
    uint64_t budget_blocks = 100;
    int block_size = 2;
  };
  const std::vector<Case> cases = {
      {"empty", "", "not a prefixd snapshot (0 bytes"},
      {"garbage", "hello world, not a snapshot", "not a prefixd snapshot"},
      {"truncated", good.substr(0, good.size() - 5), "checksum"},
      {"one bit flipped", flipped, "checksum"},
      {"another fingerprint", Filled()->SaveSnapshot({"fedcba9876543210", 7}),
       "fingerprint fedcba9876543210, this daemon serves 0123456789abcdef"},
      {"epoch 0", Filled()->SaveSnapshot({kFingerprint, 0}), "epoch 0"},
      {"another block size", good, "block_size 2, this daemon uses 4", 100, 4},
      {"over the budget", good,
       "holds 3 blocks, over this daemon's budget of 2", 2},
  };
  int64_t now = 1700000000;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    WriteFile(path_, c.bytes);
    auto r = RestoreSnapshot(path_, kFingerprint,
                             Options(c.budget_blocks, c.block_size),
                             absl::FromUnixSeconds(++now));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->epoch, std::nullopt);
    EXPECT_EQ(State(*r->cache), "");  // fresh, not half-built
    EXPECT_TRUE(r->cache->CheckInvariants().ok());
    const std::string aside = absl::StrCat("snapshot.bin.bad-", now);
    EXPECT_THAT(r->summary, HasSubstr(c.reason));
    EXPECT_THAT(r->summary, HasSubstr(aside));
    EXPECT_FALSE(fs::exists(path_));
    EXPECT_EQ(ReadFile(dir_ + "/" + aside), c.bytes);
  }
}

TEST_F(SnapshotFileTest, TwoBadFilesInOneSecondKeepBoth) {
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  WriteFile(path_, "one");
  ASSERT_TRUE(RestoreSnapshot(path_, kFingerprint, Options(), now).ok());
  WriteFile(path_, "two");
  ASSERT_TRUE(RestoreSnapshot(path_, kFingerprint, Options(), now).ok());
  EXPECT_EQ(Files(dir_),
            (std::vector<std::string>{"snapshot.bin.bad-1700000000",
                                      "snapshot.bin.bad-1700000000-1"}));
}

TEST_F(SnapshotFileTest, ATemporaryFileOfAnInterruptedWriteIsRemoved) {
  WriteFile(path_ + ".tmp", "half a snapshot");
  auto r = RestoreSnapshot(path_, kFingerprint, Options());
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->summary, HasSubstr("interrupted write"));
  EXPECT_TRUE(Files(dir_).empty());
}

TEST_F(SnapshotFileTest, TheStateDirectoryIsCreatedForTheDaemonAlone) {
  const std::string state = dir_ + "/var/prefixd";
  const mode_t old_umask = umask(022);
  auto r = RestoreSnapshot(state + "/snapshot.bin", kFingerprint, Options());
  umask(old_umask);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const std::string& d : {dir_ + "/var", state}) {
    struct stat st;
    ASSERT_EQ(stat(d.c_str(), &st), 0) << d;
    EXPECT_EQ(st.st_mode & 0777, 0700u) << d;
  }
}

TEST_F(SnapshotFileTest, ADirectoryThatCannotHoldASnapshotStopsStartUp) {
  WriteFile(dir_ + "/file", "");
  auto r =
      RestoreSnapshot(dir_ + "/file/snapshot.bin", kFingerprint, Options());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr(dir_ + "/file"));
}

TEST_F(SnapshotFileTest, OneDaemonPerSnapshotPath) {
  auto first = SnapshotLock::Acquire(path_);
  ASSERT_TRUE(first.ok()) << first.status();
  // flock locks belong to open files, so a second open in this process
  // conflicts exactly as a second daemon would.
  auto second = SnapshotLock::Acquire(path_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr(path_ + ".lock"));
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("pid ", getpid())));
  first->reset();
  EXPECT_TRUE(SnapshotLock::Acquire(path_).ok());
}

// Only a regular file is read: a FIFO would block start-up in open() until
// someone writes to it, a directory is no snapshot. Both are moved aside at
// once and the daemon starts empty.
TEST_F(SnapshotFileTest, SpecialFilesAreMovedAsideWithoutWaiting) {
  struct Case {
    std::string name;
    std::function<int()> make;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"fifo", [&] { return mkfifo(path_.c_str(), 0600); },
       "is a FIFO, not a regular file"},
      {"directory", [&] { return mkdir(path_.c_str(), 0700); },
       "is a directory, not a regular file"},
  };
  int64_t now = 1700000000;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(c.make(), 0);
    auto restore = std::async(std::launch::async, [&] {
      return RestoreSnapshot(path_, kFingerprint, Options(),
                             absl::FromUnixSeconds(++now));
    });
    if (restore.wait_for(std::chrono::seconds(10)) !=
        std::future_status::ready) {
      // Blocked opening the FIFO: a writer that closes at once lets it go.
      close(open(path_.c_str(), O_WRONLY | O_NONBLOCK));
      restore.wait();
      FAIL() << "RestoreSnapshot waited on the FIFO for 10 s";
    }
    auto r = restore.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->epoch, std::nullopt);
    EXPECT_EQ(State(*r->cache), "");
    EXPECT_THAT(r->summary, HasSubstr(c.reason));
    EXPECT_THAT(r->summary, HasSubstr(absl::StrCat("snapshot.bin.bad-", now)));
    EXPECT_FALSE(fs::exists(fs::symlink_status(path_)));
  }
}

// A symlink at the path is never followed (the daemon only ever reads the
// regular file it wrote there): not to a snapshot elsewhere, not to
// /dev/zero, which would be read until memory runs out. The link itself is
// moved aside; its target is untouched.
TEST_F(SnapshotFileTest, ASymlinkIsMovedAsideNotFollowed) {
  const std::string elsewhere = dir_ + "/elsewhere.bin";
  ASSERT_TRUE(WriteSnapshot(*Filled(), {kFingerprint, 7}, elsewhere).ok());
  int64_t now = 1700000000;
  for (const std::string& target : {elsewhere, std::string("/dev/zero")}) {
    SCOPED_TRACE(target);
    ASSERT_EQ(symlink(target.c_str(), path_.c_str()), 0);
    auto r = RestoreSnapshot(path_, kFingerprint, Options(),
                             absl::FromUnixSeconds(++now));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->epoch, std::nullopt);
    EXPECT_EQ(State(*r->cache), "");
    EXPECT_THAT(r->summary, HasSubstr("is a symbolic link"));
    const std::string aside = dir_ + absl::StrCat("/snapshot.bin.bad-", now);
    EXPECT_EQ(fs::read_symlink(aside).string(), target);
    EXPECT_FALSE(fs::exists(fs::symlink_status(path_)));
  }
  EXPECT_TRUE(fs::is_regular_file(elsewhere));
}

// A regular file larger than any snapshot of the configuration (a sparse
// file costs no disk) is refused from its size, before it is read.
TEST_F(SnapshotFileTest, AFileLargerThanAnySnapshotIsNotRead) {
  const uint64_t max =
      PrefixCache::Create(Options()).value()->MaxSnapshotBytes();
  const int fd = open(path_.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(max + 1)), 0);
  close(fd);
  auto r = RestoreSnapshot(path_, kFingerprint, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epoch, std::nullopt);
  EXPECT_THAT(r->summary, HasSubstr(absl::StrCat(
                              "is ", max + 1, " bytes, more than the ", max,
                              " bytes a snapshot of this configuration")));
}

// What the log quotes from a file is short and printable: a fingerprint of
// 64 KiB of arbitrary bytes does not become a 64 KiB log line.
TEST_F(SnapshotFileTest, TheLogQuotesAFileBoundedAndPrintable) {
  std::string fingerprint(1 << 16, '\n');
  fingerprint[0] = '\x1b';
  WriteFile(path_, Filled()->SaveSnapshot({fingerprint, 7}));
  auto r = RestoreSnapshot(path_, kFingerprint, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->summary, HasSubstr("fingerprint \\x1b\\x0a"));
  EXPECT_THAT(r->summary, HasSubstr("... (65536 bytes)"));
  EXPECT_LT(r->summary.size(), 1024u) << r->summary.substr(0, 2048);
  EXPECT_TRUE(std::all_of(r->summary.begin(), r->summary.end(),
                          [](char c) { return c >= 0x20 && c < 0x7f; }));
}

// The lock file's contents reach the log only as a pid: a 1 MiB file, or
// one that is not a regular file, does not.
TEST_F(SnapshotFileTest, TheLockFileIsRegularAndQuotedOnlyAsAPid) {
  auto first = SnapshotLock::Acquire(path_);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string lock = path_ + ".lock";
  {
    std::ofstream out(lock, std::ios::binary | std::ios::in);
    out << std::string(1 << 20, 'A');
  }
  auto second = SnapshotLock::Acquire(path_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("(pid unknown)"));
  EXPECT_LT(second.status().message().size(), 512u);
  first->reset();

  ASSERT_TRUE(fs::remove(lock));
  ASSERT_EQ(mkfifo(lock.c_str(), 0600), 0);
  auto fifo = SnapshotLock::Acquire(path_);
  EXPECT_EQ(fifo.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fifo.status().message(),
              HasSubstr(lock + " is a FIFO, not a regular file"));
}

TEST_F(SnapshotFileTest, InvalidOptionsFailAsCreateDoes) {
  CacheOptions o = Options();
  o.block_size = 0;
  EXPECT_EQ(RestoreSnapshot(path_, kFingerprint, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace prefixd
