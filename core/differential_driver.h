// The driver shared by core/differential_test.cc and
// tests/fuzz/core_ops_fuzzer.cc: it decodes operations from a
// DifferentialChoices, runs each against PrefixCache and ReferenceModel side
// by side, compares every result, and after every operation runs
// CheckInvariants() and compares each tenant's cached, pinned and lease
// counts (and its blocks by retention class). Half the Inserts carry a
// retention hint, some with a range, lapsing with the fake clock. The test's
// choices come from a seeded generator, the fuzzer's from its input bytes.
// The driver asks for them in a fixed order, so a seed or a
// corpus file replays one exact operation sequence.
//
// Sizes are kept small (block size 2, a 24-block budget, three tenants "a",
// "b" and "c" with reservations and limits, four distinct blocks of tokens)
// so that prefixes are shared, trees split, budgets fill and leases pin
// often. Under ADAPTIVE the history keeps 6 blocks per list, so that it
// fills and forgets too. Shapes the model does not know
// (DifferentialOp::kMalformed: empty, misaligned or mismatched requests,
// negative offsets) are sent to the cache alone: they must be INVALID_ARGUMENT
// (NOT_FOUND for a lease never issued) and change nothing.
//
// Test support (the prefixd_differential library), not part of prefixd_core.
#ifndef PREFIXD_CORE_DIFFERENTIAL_DRIVER_H_
#define PREFIXD_CORE_DIFFERENTIAL_DRIVER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "core/cache.h"
#include "core/reference_model.h"

namespace prefixd {

enum class DifferentialOp {
  kMatch,
  kInsert,
  kRelease,
  kKeepAlive,
  kEvict,  // every tenant
  kInvalidate,
  kReset,      // the step's tenant
  kMalformed,  // a request the cache alone sees and must refuse
  kAdvance,    // the clock moves 1 to 6 seconds; leases expire
};

// Where a DifferentialDriver's choices come from. Each method is one
// decision; the driver asks only for those the operation at hand needs
// (PickId once per block of an Insert, nothing more for a Reset), always in
// the same order, so what an implementation draws or reads fixes the
// operation sequence.
class DifferentialChoices {
 public:
  // The ID an Insert passes for one block.
  enum class Id {
    kFresh,   // never used before
    kUsed,    // one used before (cached, returned or never adopted)
    kCached,  // the one cached at that position (an engine confirming a Match)
  };

  virtual ~DifferentialChoices() = default;

  // No choices left: DifferentialDriver::Run stops before the next step.
  virtual bool Exhausted() = 0;
  // The next operation, and in `tenant` the index (0 to 2) of the tenant
  // that issues it.
  virtual DifferentialOp NextOp(int* tenant) = 0;
  // An integer in [lo, hi]: counts, token values, indices into the IDs and
  // leases seen so far.
  virtual int Int(int lo, int hi) = 0;
  // Any 64-bit integer (a kMalformed request's offset or lease ID).
  virtual int64_t AnyInt64() = 0;
  // Whether a Match or Insert goes to the default namespace "" (else "x").
  virtual bool DefaultNamespace() = 0;
  // A Match or Insert's position offset, in blocks (0 to 3).
  virtual int OffsetBlocks() = 0;
  // Whether `op` (kMatch or kInsert) takes a lease.
  virtual bool Pin(DifferentialOp op) = 0;
  // kCached only if `cached` (an ID is cached at that position), kUsed only
  // if `used` (some ID was used before).
  virtual Id PickId(bool cached, bool used) = 0;
  // Whether an Insert of two or more blocks passes its first ID again as
  // its second.
  virtual bool RepeatId() = 0;
  // Whether `op` (kRelease or kKeepAlive) comes from the tenant holding the
  // lease, else from the step's tenant.
  virtual bool FromHolder(DifferentialOp op) = 0;
  // How many blocks an Evict asks for (1 or more).
  virtual int EvictCount() = 0;
  // Whether an Invalidate names a second ID (dropped if it repeats the
  // first).
  virtual bool SecondId() = 0;
};

class DifferentialDriver {
 public:
  // `choices` must outlive the driver; `seed` is the cache's
  // CacheOptions::seed.
  DifferentialDriver(DifferentialChoices* choices, RopeShift shift,
                     uint64_t seed,
                     EvictionPolicy policy = EvictionPolicy::kLru);

  // Runs up to `max_steps` operations, fewer if the choices are exhausted.
  // Returns "" or the first disagreement or broken invariant, as
  // "step N (operation): what".
  std::string Run(int max_steps);

  // The operations that ran without a disagreement, one a line.
  const std::string& log() const { return log_; }

 private:
  struct KnownLease {
    std::string tenant;
    LeaseId real, model;
  };

  std::string Step();  // one operation; "" or what disagreed
  std::string DoMatch(const std::string& tenant);
  std::string DoInsert(const std::string& tenant);
  // An Insert's retention hint, or none.
  std::optional<Retention> PickRetention(size_t tokens);
  static std::string DescribeRetention(const std::optional<Retention>& r);
  std::string DoLeaseOp(DifferentialOp op, const std::string& tenant);
  std::string DoEvict();
  std::string DoInvalidate();
  std::string DoReset(const std::string& tenant);
  std::string DoMalformed(const std::string& tenant);
  std::string DoAdvance();
  std::string CompareCounts();

  std::string Namespace();
  int64_t Offset();
  std::vector<Token> Tokens(int blocks);
  // Where an Insert's block ID comes from; `key` names the position (Key).
  BlockId PickId(const std::string& key);
  // The key of the first `blocks` blocks of `tokens` in cached_ids_.
  static std::string Key(const std::string& tenant, const std::string& ns,
                         const std::vector<Token>& tokens, size_t blocks);

  DifferentialChoices& choices_;
  ManualClock clock_;
  std::unique_ptr<PrefixCache> cache_;
  std::unique_ptr<ReferenceModel> model_;
  std::vector<KnownLease> leases_;
  std::vector<BlockId> used_;
  std::map<std::string, BlockId> cached_ids_;
  BlockId next_id_ = 1;
  std::string last_op_;
  std::string log_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_DIFFERENTIAL_DRIVER_H_
