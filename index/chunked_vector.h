// ChunkedVector: a vector that grows by fixed-size chunks and never moves
// what it holds. Growing it copies nothing and never needs the old and the
// new array at once, which a std::vector of millions of elements does at
// every doubling (the fleet index's slots: docs/performance.md).
#ifndef PREFIXD_INDEX_CHUNKED_VECTOR_H_
#define PREFIXD_INDEX_CHUNKED_VECTOR_H_

#include <cstddef>
#include <memory>
#include <vector>

namespace prefixd {

template <typename T, size_t kChunk = 4096>
class ChunkedVector {
  static_assert((kChunk & (kChunk - 1)) == 0, "kChunk is a power of two");

 public:
  size_t size() const { return size_; }
  T& operator[](size_t i) { return chunks_[i / kChunk][i % kChunk]; }
  const T& operator[](size_t i) const {
    return chunks_[i / kChunk][i % kChunk];
  }

  // A value-initialised element at the end.
  T& emplace_back() {
    if (size_ % kChunk == 0) chunks_.push_back(std::make_unique<T[]>(kChunk));
    return (*this)[size_++];
  }

 private:
  std::vector<std::unique_ptr<T[]>> chunks_;
  size_t size_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_CHUNKED_VECTOR_H_
