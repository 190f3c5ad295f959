// libFuzzer: operation sequences decoded from the input run against
// PrefixCache and core/reference_model.cc side by side by the differential
// test's driver (core/differential_driver.h), with bytes instead of a seeded
// generator: every result compared, CheckInvariants() after every operation.
// Any disagreement or broken invariant aborts with the operation log.
//
// The input: one byte for the RoPE policy (bit 0) and the eviction policy
// (the rest, modulo 3: LRU, ADAPTIVE, SHADOW), then up to 256 operations, each
// decoded from the bytes by BytesChoices as the driver asks; it stops when
// the bytes run out.
//
//   build-fuzz/tests/fuzz/core_ops_fuzzer tests/fuzz/corpus/core_ops_fuzzer
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/differential_driver.h"

namespace prefixd {
namespace {

constexpr int kMaxSteps = 256;

// The driver's choices as FuzzedDataProvider reads them. Changing what any
// method reads changes what every corpus file means.
class BytesChoices : public DifferentialChoices {
 public:
  explicit BytesChoices(FuzzedDataProvider* in) : in_(*in) {}

  bool Exhausted() override { return in_.remaining_bytes() == 0; }
  DifferentialOp NextOp(int* tenant) override {
    *tenant = Int(0, 2);
    switch (Int(0, 10)) {
      case 0:
      case 1:
        return DifferentialOp::kMatch;
      case 2:
      case 3:
      case 4:
        return DifferentialOp::kInsert;
      case 5:
        return DifferentialOp::kRelease;
      case 6:
        return DifferentialOp::kKeepAlive;
      case 7:
        return DifferentialOp::kEvict;
      case 8:
        return in_.ConsumeBool() ? DifferentialOp::kInvalidate
                                 : DifferentialOp::kReset;
      case 9:
        return DifferentialOp::kMalformed;
      default:
        return DifferentialOp::kAdvance;
    }
  }
  int Int(int lo, int hi) override {
    return in_.ConsumeIntegralInRange(lo, hi);
  }
  int64_t AnyInt64() override { return in_.ConsumeIntegral<int64_t>(); }
  bool DefaultNamespace() override { return in_.ConsumeBool(); }
  int OffsetBlocks() override { return Int(0, 3); }
  bool Pin(DifferentialOp) override { return in_.ConsumeBool(); }
  Id PickId(bool cached, bool used) override {
    switch (Int(0, 3)) {
      case 0:
        return used ? Id::kUsed : Id::kFresh;
      case 1:
        return cached ? Id::kCached : Id::kFresh;
      default:
        return Id::kFresh;
    }
  }
  // Reads nothing: kMalformed sends repeated IDs.
  bool RepeatId() override { return false; }
  bool FromHolder(DifferentialOp) override { return in_.ConsumeBool(); }
  int EvictCount() override { return Int(1, 8); }
  bool SecondId() override { return in_.ConsumeBool(); }

 private:
  FuzzedDataProvider& in_;
};

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const uint8_t first = in.ConsumeIntegral<uint8_t>();
  const auto shift =
      (first & 1) != 0 ? prefixd::RopeShift::kAllow : prefixd::RopeShift::kDeny;
  constexpr prefixd::EvictionPolicy kPolicies[] = {
      prefixd::EvictionPolicy::kLru, prefixd::EvictionPolicy::kAdaptive,
      prefixd::EvictionPolicy::kShadow};
  prefixd::BytesChoices choices(&in);
  prefixd::DifferentialDriver driver(&choices, shift, /*seed=*/1,
                                     kPolicies[(first >> 1) % 3]);
  const std::string err = driver.Run(prefixd::kMaxSteps);
  if (!err.empty()) {
    std::fprintf(stderr, "core_ops_fuzzer: %s\nlog:\n%s\n", err.c_str(),
                 driver.log().c_str());
    std::abort();
  }
  return 0;
}
