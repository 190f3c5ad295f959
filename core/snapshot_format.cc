#include "core/snapshot_format.h"

#include <array>

#include "absl/strings/str_format.h"

namespace prefixd {

uint32_t Crc32(absl::string_view bytes) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

void SnapshotWriter::Varint(uint64_t v) {
  while (v >= 0x80) {
    out_.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out_.push_back(static_cast<char>(v));
}

void SnapshotWriter::Fixed64(uint64_t v) {
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
}

void SnapshotWriter::Fixed32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
}

void SnapshotWriter::String(absl::string_view s) {
  Varint(s.size());
  Raw(s);
}

bool SnapshotReader::Varint(uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos_ >= in_.size()) return false;
    const uint8_t b = static_cast<uint8_t>(in_[pos_++]);
    *v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

bool SnapshotReader::Fixed64(uint64_t* v) {
  if (in_.size() - pos_ < 8) return false;
  *v = 0;
  for (int i = 0; i < 8; ++i)
    *v |= uint64_t{static_cast<uint8_t>(in_[pos_ + i])} << (8 * i);
  pos_ += 8;
  return true;
}

bool SnapshotReader::Fixed32(uint32_t* v) {
  if (in_.size() - pos_ < 4) return false;
  *v = 0;
  for (int i = 0; i < 4; ++i)
    *v |= uint32_t{static_cast<uint8_t>(in_[pos_ + i])} << (8 * i);
  pos_ += 4;
  return true;
}

bool SnapshotReader::Raw(size_t n, absl::string_view* s) {
  if (in_.size() - pos_ < n) return false;
  *s = in_.substr(pos_, n);
  pos_ += n;
  return true;
}

bool SnapshotReader::String(std::string* s, size_t max_len) {
  uint64_t n;
  absl::string_view raw;
  if (!Varint(&n) || n > max_len || !Raw(n, &raw)) return false;
  s->assign(raw.data(), raw.size());
  return true;
}

absl::Status SnapshotReader::Error(absl::string_view what) const {
  return absl::DataLossError(
      absl::StrFormat("snapshot: bad or truncated %s at byte %d of %d", what,
                      pos_, in_.size()));
}

}  // namespace prefixd
