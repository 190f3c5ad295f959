// Random operations against PrefixCache and ReferenceModel side by side
// (core/differential_driver.h), comparing every result and checking every
// invariant after each step.
//
//   PREFIXD_DIFF_STEPS=1000000 ./core_differential_test   # a longer run
//   PREFIXD_DIFF_SEED=1234 ./core_differential_test       # replay one seed
#include <cstdlib>
#include <random>
#include <string>

#include "core/differential_driver.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

// The driver's choices from a seeded generator, weighted towards the common
// case: mostly matches and inserts, in the default namespace at offset 0,
// from the lease's own tenant. Never a malformed request (the fuzzer sends
// those).
class RandomChoices : public DifferentialChoices {
 public:
  explicit RandomChoices(uint64_t seed) : rng_(seed) {}

  bool Exhausted() override { return false; }
  DifferentialOp NextOp(int* tenant) override {
    const int op = Int(1, 100);
    *tenant = Int(0, 2);
    if (op <= 30) return DifferentialOp::kMatch;
    if (op <= 65) return DifferentialOp::kInsert;
    if (op <= 73) return DifferentialOp::kRelease;
    if (op <= 78) return DifferentialOp::kKeepAlive;
    if (op <= 85) return DifferentialOp::kEvict;
    if (op <= 90) return DifferentialOp::kInvalidate;
    if (op <= 91) return DifferentialOp::kReset;
    return DifferentialOp::kAdvance;
  }
  int Int(int lo, int hi) override {
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }
  int64_t AnyInt64() override {
    return std::uniform_int_distribution<int64_t>()(rng_);
  }
  bool DefaultNamespace() override { return Chance(80); }
  int OffsetBlocks() override { return Chance(70) ? 0 : Int(0, 3); }
  bool Pin(DifferentialOp op) override {
    return Chance(op == DifferentialOp::kMatch ? 30 : 25);
  }
  Id PickId(bool cached, bool used) override {
    if (Chance(30) && cached) return Id::kCached;
    if (Chance(8) && used) return Id::kUsed;
    return Id::kFresh;
  }
  bool RepeatId() override { return Chance(3); }
  bool FromHolder(DifferentialOp op) override {
    return Chance(op == DifferentialOp::kRelease ? 80 : 85);
  }
  int EvictCount() override { return Int(1, 5); }
  bool SecondId() override { return Chance(30); }

 private:
  bool Chance(int percent) { return Int(1, 100) <= percent; }

  std::mt19937_64 rng_;
};

TEST(DifferentialTest, RandomOperationsAgreeWithTheReferenceModel) {
  const uint64_t total = EnvOr("PREFIXD_DIFF_STEPS", 60000);
  const uint64_t fixed_seed = EnvOr("PREFIXD_DIFF_SEED", 0);
  const int per_seed = 2000;
  uint64_t seed = fixed_seed != 0 ? fixed_seed : std::random_device{}();
  for (uint64_t done = 0; done < total; done += per_seed, ++seed) {
    for (EvictionPolicy policy :
         {EvictionPolicy::kLru, EvictionPolicy::kAdaptive,
          EvictionPolicy::kShadow}) {
      for (RopeShift shift : {RopeShift::kAllow, RopeShift::kDeny}) {
        RandomChoices choices(seed);
        DifferentialDriver d(&choices, shift, seed + 1, policy);
        const std::string err = d.Run(per_seed / 4);
        ASSERT_EQ(err, "") << "seed " << seed << " (PREFIXD_DIFF_SEED=" << seed
                           << " replays it), shift " << static_cast<int>(shift)
                           << ", " << EvictionPolicyName(policy);
      }
    }
    if (fixed_seed != 0) break;
  }
}

}  // namespace
}  // namespace prefixd
