// Node::class_priority_stamp: Node has no room for another field
// (radix_tree.h caps it at 104 bytes), so one word holds, from the top bit
// down:
//
//   bit 63       the node's eviction class (kRecent or kFrequent; LRU uses
//                kRecent only)
//   bits 56..62  its retention priority, 0..100 (cache_types.h)
//   bits 0..55   the stamp of its entry in its class's eviction set; 0: no
//                entry. Stamps never come near 2^56 (snapshots refuse
//                larger ones).
//
// The low 63 bits, (priority, stamp), are one comparable number: the key of
// the node's entry in its class's set, which therefore orders by priority
// first, and the key by which the cache picks the next victim across
// tenants (Tenant::NextVictimPriorityStamp).
#ifndef PREFIXD_CORE_CLASS_PRIORITY_STAMP_H_
#define PREFIXD_CORE_CLASS_PRIORITY_STAMP_H_

#include <cstdint>

#include "core/radix_tree.h"

namespace prefixd {

enum NodeClass : int { kRecent = 0, kFrequent = 1 };

inline constexpr uint64_t kClassBit = uint64_t{1} << 63;
inline constexpr int kPriorityShift = 56;
inline constexpr uint64_t kPriorityBits = uint64_t{0x7f} << kPriorityShift;
inline constexpr uint64_t kStampMask = (uint64_t{1} << kPriorityShift) - 1;
inline constexpr uint64_t kMaxStamp = kStampMask;

inline int ClassOf(const Node& n) {
  return static_cast<int>(n.class_priority_stamp >> 63);
}
inline int PriorityOf(const Node& n) {
  return static_cast<int>((n.class_priority_stamp >> kPriorityShift) & 0x7f);
}
// The stamp of n's entry in its class's set; 0: n has no entry.
inline uint64_t EntryStampOf(const Node& n) {
  return n.class_priority_stamp & kStampMask;
}
// (priority, stamp) as one comparable number.
inline uint64_t PriorityStamp(int priority, uint64_t stamp) {
  return (static_cast<uint64_t>(priority) << kPriorityShift) | stamp;
}
// The key of n's entry in its class's set: (its priority, its entry stamp).
inline uint64_t PriorityStampOf(const Node& n) {
  return n.class_priority_stamp & ~kClassBit;
}

}  // namespace prefixd

#endif  // PREFIXD_CORE_CLASS_PRIORITY_STAMP_H_
