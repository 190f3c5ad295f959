// DecodeBudget: what the fleet index's decoding of KV-event payloads may
// hold at once, across every source thread (index/ingest.h).
//
// A payload is decoded into a KvEventBatch, which can be many times the
// payload's size (kDecodePeakPerPayloadByte). Each source decodes on its
// own thread, so without a shared bound N sources decoding large payloads
// at once would hold N such peaks. Before decoding, a thread reserves the
// payload's estimated peak (DecodePeakEstimate) and gives it back once the
// batch is applied:
//
//   DecodeBudget::Reservation r = budget.Reserve(payload.size(), stop_);
//   if (!r.held()) return;  // stopping
//   DecodeEventBatch(payload, &batch); index->Apply(...);
//   // ~Reservation releases it
//
// Reservations are granted in the order they were asked for (a large one
// is not starved by small ones behind it), each once it fits beside those
// held; one larger than the whole budget waits until it is the only one,
// so a message of the largest size the sockets take always proceeds. A
// waiting thread returns empty-handed as soon as its stop flag is set and
// WakeWaiters() is called (Ingest's Stop and RemoveSource do both).
//
// Thread safety: every method may be called from any thread; mu_ guards
// the reservations and counters, and waiters sleep on changed_.
#ifndef PREFIXD_INDEX_DECODE_BUDGET_H_
#define PREFIXD_INDEX_DECODE_BUDGET_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"

namespace prefixd {

// What the batch decoded from one payload may hold, per payload byte. The
// decoder counts what it allocates against this (DecodeAllowance) and
// refuses a payload that would need more, so a reservation of
// DecodePeakEstimate bounds its decode whatever the payload's shape. An
// event takes sizeof(KvEvent) (376 bytes) from as few as 9 payload bytes,
// and an extra_keys item a ContentKey (48 bytes) from one, so without the
// count a 16 MiB message decoded to 683 MiB. What engines send is far
// below it: vLLM's densest batches, one BlockRemoved per evicted block
// (25 bytes each with a 64-bit hash), decode to 16 bytes per byte, and a
// BlockStored of 16 tokens to about 6. bench/decode_peak measures the peak
// RSS of decoding and applying one payload of each shape
// (`build/bench/decode_peak`, 16 MiB payloads):
//
//   BlockStored, one block of 1-byte tokens         4.0x
//   BlockStored, blocks of 16 1-byte tokens         3.8x
//   BlockStored, blocks of one token                6.0x
//   BlockRemoved, 1-byte hashes                     8.0x
//   AllBlocksCleared events (18 bytes each)        20.9x
//   denser shapes (cleared events of 9 bytes, one-byte extra_keys items,
//   removed events of 11 bytes): refused once they hold 24x
inline constexpr int64_t kDecodePeakPerPayloadByte = 24;
// Every payload may decode to this much, however small (a one-event batch
// is dense by nature).
inline constexpr int64_t kDecodeAllowanceFloor = 64 << 10;

// The bytes to reserve for decoding a payload of `payload_bytes`.
inline int64_t DecodePeakEstimate(size_t payload_bytes) {
  return static_cast<int64_t>(payload_bytes) * kDecodePeakPerPayloadByte;
}

// What decoding one payload may still allocate: kDecodePeakPerPayloadByte
// bytes per payload byte, at least kDecodeAllowanceFloor. The decoder takes
// from it before each allocation it makes (an event, a vector, a string
// too long to be kept inline) and refuses the payload once a Take fails.
// One decode's: not thread-safe.
class DecodeAllowance {
 public:
  explicit DecodeAllowance(size_t payload_bytes)
      : payload_bytes_(payload_bytes),
        limit_(std::max(DecodePeakEstimate(payload_bytes),
                        kDecodeAllowanceFloor)) {}

  // Takes `bytes`; false, and exceeded() from then on, if they do not fit.
  bool Take(size_t bytes) {
    if (exceeded_ || bytes > static_cast<uint64_t>(limit_ - taken_)) {
      exceeded_ = true;
      return false;
    }
    taken_ += static_cast<int64_t>(bytes);
    return true;
  }
  bool exceeded() const { return exceeded_; }
  size_t payload_bytes() const { return payload_bytes_; }
  int64_t limit() const { return limit_; }
  int64_t taken() const { return taken_; }

  // What malloc takes for n elements of `size` bytes: the bytes and the
  // chunk's header, rounded up to its 16-byte steps, at least 32 (0 for
  // none).
  static size_t ArrayBytes(size_t n, size_t size) {
    if (n == 0) return 0;
    return std::max<size_t>(32, (n * size + 8 + 15) & ~size_t{15});
  }
  // The heap bytes of a std::string of n chars: none while they fit in
  // the string itself (15 in libstdc++).
  static size_t StringBytes(size_t n) {
    return n <= 15 ? 0 : ArrayBytes(n + 1, 1);
  }

 private:
  const size_t payload_bytes_;
  const int64_t limit_;
  int64_t taken_ = 0;
  bool exceeded_ = false;
};

class DecodeBudget {
 public:
  // What is reserved; released when it goes (or by Release()). Empty when
  // the wait for it was ended by the stop flag.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation() { Release(); }

    bool held() const { return budget_ != nullptr; }
    int64_t bytes() const { return bytes_; }
    void Release();

   private:
    friend class DecodeBudget;
    Reservation(DecodeBudget* budget, int64_t bytes)
        : budget_(budget), bytes_(bytes) {}
    DecodeBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  // REQUIRES: budget_bytes > 0.
  explicit DecodeBudget(int64_t budget_bytes);
  DecodeBudget(const DecodeBudget&) = delete;
  DecodeBudget& operator=(const DecodeBudget&) = delete;

  // Waits until `bytes` may be held (see above) and holds them, or until
  // `stop` is set (then returns an empty Reservation). `stop` is checked
  // whenever the reservations change and on WakeWaiters().
  Reservation Reserve(int64_t bytes, const std::atomic<bool>& stop);
  // Wakes every waiting Reserve to look at its stop flag. Call it after
  // setting one.
  void WakeWaiters();

  int64_t budget_bytes() const { return budget_bytes_; }
  // Reserved now; the most ever reserved at once; Reserve calls that had
  // to wait (for the budget or for their turn).
  int64_t reserved_bytes() const;
  int64_t peak_reserved_bytes() const;
  uint64_t waits() const;
  // Threads waiting in Reserve now.
  size_t waiting() const;

 private:
  void Release(int64_t bytes);
  bool Fits(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t budget_bytes_;
  mutable Mutex mu_;
  CondVar changed_;  // a reservation was released or granted, or a stop
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  size_t holders_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
  // Tickets of the waiting Reserve calls, oldest first; only the front
  // one may be granted.
  std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_DECODE_BUDGET_H_
