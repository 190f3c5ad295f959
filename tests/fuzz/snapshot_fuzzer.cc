// libFuzzer: snapshot files with a valid checksum but arbitrary contents,
// the kind a buggy or older writer could leave, must never crash the daemon
// or leave a broken cache (docs/operations.md).
//
// The input is a snapshot's body (everything between the magic and the
// CRC); the target wraps it in "PFXDSNP3" and the right CRC-32, so every
// input reaches the parser instead of stopping at the checksum. A load that
// succeeds must leave a cache that passes CheckInvariants() and survives a
// save and a second load unchanged. The raw input also goes through
// ReadSnapshotMeta as is.
//
// The seed corpus (bodies of real snapshots) is written by
//   PREFIXD_WRITE_SEEDS=tests/fuzz/corpus/snapshot_fuzzer
//   build/tests/fuzz/snapshot_fuzzer_replay     (both on one line)
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "core/cache.h"
#include "core/snapshot_format.h"

namespace prefixd {
namespace {

constexpr absl::string_view kMagic = "PFXDSNP3";

ManualClock* TheClock() {
  static ManualClock* clock = new ManualClock;
  return clock;
}

CacheOptions Options() {
  CacheOptions o;
  o.block_size = 2;
  o.block_bytes = 1;
  o.budget_bytes = 64;
  o.clock = TheClock();
  o.seed = 1;
  o.events_per_tenant = 16;
  o.limits.max_tenants = 4;
  o.limits.max_namespaces_per_tenant = 4;
  o.limits.max_leases_per_tenant = 16;
  o.limits.max_lease_ttl = absl::Minutes(10);
  o.default_lease_ttl = absl::Seconds(30);
  o.tenants = {{"a", {4, 40}}};
  return o;
}

std::unique_ptr<PrefixCache> NewCache() {
  return std::move(PrefixCache::Create(Options())).value();
}

std::string Wrap(absl::string_view body) {
  std::string file = absl::StrCat(kMagic, body);
  SnapshotWriter crc;
  crc.Fixed32(Crc32(file));
  return file + crc.bytes();
}

// Everything a snapshot should restore, as text.
std::string State(const PrefixCache& c) {
  std::string out;
  for (const TenantUsage& t : c.Stats(TenantScope::All()).tenants) {
    absl::StrAppend(&out, t.tenant, " ", t.cached_blocks, " ", t.pinned_blocks,
                    " ", t.active_leases, " ", t.match_requests, "\n");
    const std::vector<std::string> namespaces = c.Namespaces(t.tenant).value();
    for (const std::string& ns : namespaces) {
      const std::vector<DumpNode> nodes = c.Dump(t.tenant, ns).value();
      for (const DumpNode& n : nodes) {
        absl::StrAppend(&out, ns, " d", n.depth, " @", n.position, " s",
                        n.stamp, " p", n.pins, ":");
        for (BlockId id : n.block_ids) absl::StrAppend(&out, " ", id);
        absl::StrAppend(&out, "\n");
      }
    }
  }
  return out;
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "snapshot_fuzzer: %s\n", what.c_str());
  std::abort();
}

void Insert(PrefixCache& c, const char* tenant, std::string ns,
            std::vector<Token> tokens, std::vector<BlockId> ids, bool pin) {
  InsertRequest req{std::move(ns),        tokens,      ids, 0, pin,
                    absl::ZeroDuration(), std::nullopt};
  if (!c.Insert(tenant, req).ok()) Fail("seed insert failed");
}

// Bodies of real snapshots: empty, one tree, several tenants with
// namespaces, splits and leases.
void WriteSeeds(const std::string& dir) {
  std::vector<std::unique_ptr<PrefixCache>> caches;
  caches.push_back(NewCache());
  caches.push_back(NewCache());
  Insert(*caches.back(), "a", "", {1, 1, 2, 2, 3, 3}, {10, 20, 30}, false);
  caches.push_back(NewCache());
  PrefixCache& c = *caches.back();
  Insert(c, "a", "", {1, 1, 2, 2, 3, 3}, {10, 20, 30}, true);
  Insert(c, "a", "", {1, 1, 2, 2, 4, 4}, {10, 20, 40}, false);
  Insert(c, "a", "lora", {5, 5}, {50}, true);
  Insert(c, "b", "", {7, 7, 8, 8}, {70, 80}, true);
  std::vector<Token> probe = {1, 1, 2, 2};
  if (!c.Match("a", {"", probe, 0, true, absl::ZeroDuration()}).ok())
    Fail("seed match failed");
  int n = 0;
  for (const auto& cache : caches) {
    const std::string file = cache->SaveSnapshot({"0123456789abcdef", 7});
    const std::string body =
        file.substr(kMagic.size(), file.size() - kMagic.size() - 4);
    std::ofstream(absl::StrCat(dir, "/snapshot_", n++), std::ios::binary)
        << body;
  }
  std::exit(0);
}

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("PREFIXD_WRITE_SEEDS"))
    prefixd::WriteSeeds(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prefixd;
  const absl::string_view raw(reinterpret_cast<const char*>(data), size);
  PrefixCache::ReadSnapshotMeta(raw).IgnoreError();
  const std::string file = Wrap(raw);
  std::unique_ptr<PrefixCache> cache = NewCache();
  if (!cache->LoadSnapshot(file).ok()) return 0;  // refused: nothing to check
  if (absl::Status s = cache->CheckInvariants(); !s.ok())
    Fail(absl::StrCat("a loaded snapshot broke an invariant: ", s.ToString()));
  const std::string state = State(*cache);
  std::unique_ptr<PrefixCache> again = NewCache();
  absl::StatusOr<SnapshotMeta> meta =
      again->LoadSnapshot(cache->SaveSnapshot({"fp", 1}));
  if (!meta.ok())
    Fail(absl::StrCat("a re-saved snapshot: ", meta.status().ToString()));
  if (State(*again) != state) {
    Fail(absl::StrCat("save and load changed the state:\n", state, "---\n",
                      State(*again)));
  }
  return 0;
}
