#include "index/publisher.h"

#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

// Debian's msgpack-cxx is header-only and needs Boost unless told not to.
#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

namespace prefixd {
namespace {

// The most batches a replay buffer may keep.
constexpr size_t kMaxBufferBatches = size_t{1} << 24;

// msgpack-cxx writes into any stream with write(const char*, size_t).
struct StringStream {
  std::string* out;
  void write(const char* data, size_t size) { out->append(data, size); }
};
using Packer = msgpack::packer<StringStream>;

void PackStr(Packer& pk, absl::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHashes(Packer& pk, const std::vector<EngineHash>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (EngineHash h : hashes) pk.pack_uint64(h);
}

void PackStored(Packer& pk, const BlockStoredEvent& ev) {
  pk.pack_map(9);
  PackStr(pk, "type");
  PackStr(pk, "BlockStored");
  PackStr(pk, "block_hashes");
  PackHashes(pk, ev.block_hashes);
  PackStr(pk, "parent_block_hash");
  if (ev.parent_block_hash.has_value()) {
    pk.pack_uint64(*ev.parent_block_hash);
  } else {
    pk.pack_nil();
  }
  PackStr(pk, "token_ids");
  pk.pack_array(static_cast<uint32_t>(ev.token_ids.size()));
  for (Token t : ev.token_ids) pk.pack_uint32(t);
  PackStr(pk, "block_size");
  pk.pack_int64(ev.block_size);
  PackStr(pk, "lora_id");
  if (ev.lora_id.has_value()) {
    pk.pack_int64(*ev.lora_id);
  } else {
    pk.pack_nil();
  }
  PackStr(pk, "medium");
  PackStr(pk, ev.medium);
  PackStr(pk, "lora_name");
  if (ev.lora_name.has_value()) {
    PackStr(pk, *ev.lora_name);
  } else {
    pk.pack_nil();
  }
  // vLLM's per-block extra keys: the LoRA name in every block, the salt
  // after it in the first block of a chain that starts at the root.
  PackStr(pk, "extra_keys");
  const bool lora = ev.lora_name.has_value();
  const bool salt = !ev.cache_salt.empty() && !ev.parent_block_hash.has_value();
  const size_t n = ev.block_hashes.size();
  if (n == 0 || (!lora && !salt)) {
    pk.pack_nil();
    return;
  }
  pk.pack_array(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const bool with_salt = salt && i == 0;
    const uint32_t keys = (lora ? 1 : 0) + (with_salt ? 1 : 0);
    if (keys == 0) {
      pk.pack_nil();
      continue;
    }
    pk.pack_array(keys);
    if (lora) PackStr(pk, *ev.lora_name);
    if (with_salt) PackStr(pk, ev.cache_salt);
  }
}

void PackRemoved(Packer& pk, const BlockRemovedEvent& ev) {
  pk.pack_map(3);
  PackStr(pk, "type");
  PackStr(pk, "BlockRemoved");
  PackStr(pk, "block_hashes");
  PackHashes(pk, ev.block_hashes);
  PackStr(pk, "medium");
  PackStr(pk, ev.medium);
}

absl::Status CheckEndpoint(absl::string_view what, absl::string_view ep) {
  absl::string_view rest = ep;
  if (absl::ConsumePrefix(&rest, "ipc://") ||
      absl::ConsumePrefix(&rest, "inproc://")) {
    if (!rest.empty()) return absl::OkStatus();
  } else if (absl::ConsumePrefix(&rest, "tcp://")) {
    const size_t colon = rest.rfind(':');
    if (colon != absl::string_view::npos && colon > 0) {
      const absl::string_view port = rest.substr(colon + 1);
      int p;
      if (port == "*" || (absl::SimpleAtoi(port, &p) && p >= 0 && p <= 65535)) {
        return absl::OkStatus();
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " \"", ep, "\" is not tcp://HOST:PORT (or ipc://PATH)"));
}

}  // namespace

std::string EncodeEventBatch(const KvEventBatch& batch) {
  std::string out;
  StringStream stream{&out};
  Packer pk(stream);
  pk.pack_map(batch.data_parallel_rank.has_value() ? 3 : 2);
  PackStr(pk, "ts");
  pk.pack_double(batch.ts);
  PackStr(pk, "events");
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const KvEvent& e : batch.events) {
    if (const auto* st = std::get_if<BlockStoredEvent>(&e)) {
      PackStored(pk, *st);
    } else if (const auto* rm = std::get_if<BlockRemovedEvent>(&e)) {
      PackRemoved(pk, *rm);
    } else {
      pk.pack_map(1);
      PackStr(pk, "type");
      PackStr(pk, "AllBlocksCleared");
    }
  }
  if (batch.data_parallel_rank.has_value()) {
    PackStr(pk, "data_parallel_rank");
    pk.pack_int64(*batch.data_parallel_rank);
  }
  return out;
}

absl::Status ValidateKvPublisherOptions(const KvPublisherOptions& o) {
  if (absl::Status s = CheckEndpoint("events_publish endpoint", o.endpoint);
      !s.ok()) {
    return s;
  }
  if (!o.replay_endpoint.empty()) {
    if (absl::Status s =
            CheckEndpoint("events_publish replay_endpoint", o.replay_endpoint);
        !s.ok()) {
      return s;
    }
  }
  if (o.buffer_batches == 0 || o.buffer_batches > kMaxBufferBatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("events_publish buffer_batches ", o.buffer_batches,
                     " is not in 1..", kMaxBufferBatches));
  }
  return absl::OkStatus();
}

}  // namespace prefixd
