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

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"

namespace prefixd {

// The peak memory of decoding and applying one payload, per payload byte,
// at most. By construction: the decoder reads the payload in place
// (index/msgpack_view.h) and holds only what it makes of it, vectors sized
// once, not grown; of that, one payload byte becomes at most 48 bytes (an
// extra_keys item's ContentKey, from as little as one byte; a block hash
// 8, a token 4, an event 376 from at least 9 bytes, ["cleared"]).
// Measured by bench/decode_peak (`build/bench/decode_peak`: one payload
// just under the 16 MiB message cap per shape, the growth of peak RSS while
// it is decoded and applied, over its size):
//
//   BlockStored, one block of 1-byte tokens         4.0x
//   BlockStored, blocks of 16 1-byte tokens         3.8x
//   BlockStored, blocks of one token                6.0x
//   BlockRemoved, 1-byte hashes                     8.0x
//   AllBlocksCleared events (18 bytes each)        20.9x
//   cleared events (9 bytes each)                  41.8x
//   unknown trailing fields (nil)                   0.0x
//   extra_keys, 32 one-byte items per block        41.5x
//   extra_keys, 32 one-byte items, no tokens       42.7x  (the worst)
//   extra_keys, one entry of 1-byte items           0.0x  (refused past 32)
inline constexpr int64_t kDecodePeakPerPayloadByte = 48;

// The bytes to reserve for decoding a payload of `payload_bytes`.
inline int64_t DecodePeakEstimate(size_t payload_bytes) {
  return static_cast<int64_t>(payload_bytes) * kDecodePeakPerPayloadByte;
}

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
