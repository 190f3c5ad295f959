// The byte-level pieces of the snapshot format (docs/operations.md):
// little-endian varints, length-prefixed strings, fixed-width integers and a
// CRC-32 over the whole file. The Reader never reads past its input; every
// shortfall is an error naming the offset.
#ifndef PREFIXD_CORE_SNAPSHOT_FORMAT_H_
#define PREFIXD_CORE_SNAPSHOT_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace prefixd {

uint32_t Crc32(absl::string_view bytes);

class SnapshotWriter {
 public:
  void Varint(uint64_t v);
  void Fixed64(uint64_t v);
  void Fixed32(uint32_t v);
  void String(absl::string_view s);
  void Raw(absl::string_view s) { out_.append(s.data(), s.size()); }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

class SnapshotReader {
 public:
  explicit SnapshotReader(absl::string_view in) : in_(in) {}
  bool Varint(uint64_t* v);
  bool Fixed64(uint64_t* v);
  bool Fixed32(uint32_t* v);
  bool String(std::string* s, size_t max_len);
  bool Raw(size_t n, absl::string_view* s);
  size_t offset() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }
  bool done() const { return pos_ == in_.size(); }
  // DATA_LOSS naming what was being read and where.
  absl::Status Error(absl::string_view what) const;

 private:
  absl::string_view in_;
  size_t pos_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_SNAPSHOT_FORMAT_H_
