// Test support: the BlockStoredEvent that the tests of the event publishers
// (index/publisher_test.cc, server/kv_event_sockets_test.cc) build, in one
// place. Not for product code.
#ifndef PREFIXD_INDEX_STORED_FOR_TEST_H_
#define PREFIXD_INDEX_STORED_FOR_TEST_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "index/events.h"

namespace prefixd::test {

inline constexpr int kStoredBlockSize = 4;

// A store of `hashes` after `parent`, on GPU, whose block h carries the
// tokens h*10+1 .. h*10+kStoredBlockSize.
inline BlockStoredEvent Stored(std::vector<EngineHash> hashes,
                               std::optional<EngineHash> parent,
                               std::optional<std::string> lora = std::nullopt,
                               std::string salt = "") {
  BlockStoredEvent e;
  e.block_hashes = std::move(hashes);
  e.parent_block_hash = parent;
  for (EngineHash h : e.block_hashes)
    for (int t = 1; t <= kStoredBlockSize; ++t)
      e.token_ids.push_back(static_cast<Token>(h * 10 + t));
  e.block_size = kStoredBlockSize;
  e.lora_name = std::move(lora);
  e.cache_salt = std::move(salt);
  return e;
}

}  // namespace prefixd::test

#endif  // PREFIXD_INDEX_STORED_FOR_TEST_H_
