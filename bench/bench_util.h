// Small helpers the benchmarks share: a 64-bit mixer, thread CPU time and
// the machine's load average.
#ifndef PREFIXD_BENCH_BENCH_UTIL_H_
#define PREFIXD_BENCH_BENCH_UTIL_H_

#include <time.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace prefixd {
namespace bench {

// SplitMix64's finalizer: a bijection of 64-bit words that scatters
// neighbouring inputs (stable across runs and platforms).
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline double CpuSeconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) +
         static_cast<double>(ts.tv_nsec) * 1e-9;
}

// CPU time of the calling thread, and of the whole process.
inline double ThreadCpuSeconds() { return CpuSeconds(CLOCK_THREAD_CPUTIME_ID); }
inline double ProcessCpuSeconds() {
  return CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
}

// The first three fields of /proc/loadavg ("1.80 2.10 2.40"), empty if
// unreadable.
inline std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  if (!(in >> a >> b >> c)) return "";
  return a + " " + b + " " + c;
}

}  // namespace bench
}  // namespace prefixd

#endif  // PREFIXD_BENCH_BENCH_UTIL_H_
