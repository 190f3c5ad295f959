// Names that come off the wire: worker topics, mediums, LoRA names, salts,
// ownership and group kinds that engines (or anyone who can reach a socket)
// send. They end up in proto string fields, Prometheus labels and the
// index's namespace keys, so each is bounded and must be valid UTF-8
// without control characters: one bad name must never break every Route,
// ListWorkers or /metrics answer, or pin megabytes for the daemon's life.
#ifndef PREFIXD_INDEX_WIRE_NAMES_H_
#define PREFIXD_INDEX_WIRE_NAMES_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace prefixd {

// The longest name accepted off the wire, in bytes.
inline constexpr size_t kMaxWireNameBytes = 256;

// OK if `value` is at most kMaxWireNameBytes of valid UTF-8 without control
// characters; else INVALID_ARGUMENT naming `field`, the length and the
// first offending byte (escaped).
absl::Status CheckWireName(absl::string_view field, absl::string_view value);

// `value` itself when CheckWireName accepts it; otherwise a printable name
// that stands for it alone: its first 48 bytes C-escaped, then `~` and 16
// hex digits of a 64-bit hash of all of it (two different values never
// share a name in practice).
std::string SafeWireName(absl::string_view value);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_WIRE_NAMES_H_
