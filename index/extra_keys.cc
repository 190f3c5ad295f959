#include "index/extra_keys.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"

namespace prefixd {
namespace {

using msgpack_view::Bin;
using msgpack_view::Bytes;
using msgpack_view::IntText;
using msgpack_view::IsInt;
using msgpack_view::IsNull;
using msgpack_view::MapValue;
using msgpack_view::object;
using msgpack_view::Str;
using msgpack_view::ToInt64;
using msgpack_view::TypeName;
namespace mtype = msgpack::type;

// Items in one block's entry at most: its LoRA, salt and prompt embeddings
// and the multimodal inputs that overlap it (a block of 16 tokens overlaps
// a few at most). Each item becomes a ContentKey of about 48 bytes from as
// little as one payload byte, so a longer entry ends the chain instead of
// costing the decoder 50 times its size (bench/decode_peak).
constexpr uint32_t kMaxKeysPerBlock = 32;

// The keys entries[0, n) can give at most, so that ev->content.keys is
// allocated once rather than grown (a growing vector holds its old and new
// arrays at once).
size_t MaxKeys(const object* entries, size_t n) {
  size_t keys = 0;
  for (size_t i = 0; i < n; ++i) {
    if (entries[i].type != mtype::ARRAY) continue;
    keys += std::min(entries[i].via.array.size, kMaxKeysPerBlock);
  }
  return keys;
}

// The msgpack encoding of a value: a legacy key's identity, the same for a
// raw item and for a typed key's "value".
std::string Packed(const object& o) {
  msgpack::sbuffer buffer;
  msgpack::pack(buffer, o);
  return std::string(buffer.data(), buffer.size());
}

// The keys of one block, read item by item.
class BlockKeysReader {
 public:
  BlockKeysReader(BlockStoredEvent* ev, size_t block)
      : ev_(ev),
        salt_allowed_(block == 0 && !ev->parent_block_hash.has_value()) {}

  // False: the item cannot be understood (the chain ends at this block).
  bool Item(const object& item) {
    switch (item.type) {
      case mtype::MAP:
        return Typed(item);
      case mtype::STR:
        if (IsLora(Str(item))) return true;
        strings_.push_back(&item);
        return true;
      case mtype::BIN:
        Add(ContentKey::Kind::kPromptEmbeds, Bin(item), 0);
        return true;
      case mtype::ARRAY:
        if (MultiModalTuple(item)) return true;
        break;
      case mtype::POSITIVE_INTEGER:
      case mtype::NEGATIVE_INTEGER: {
        // Older vLLM put the LoRA's integer id in the keys.
        int64_t id;
        if (!lora_seen_ && ev_->lora_id.has_value() && ToInt64(item, &id) &&
            id == *ev_->lora_id) {
          lora_seen_ = true;
          return true;
        }
        break;
      }
      default:
        break;
    }
    Add(ContentKey::Kind::kLegacy, Packed(item), 0);
    return true;
  }

  // The raw strings left: the last one of a root event's first block is
  // its salt (vLLM puts the salt after the multimodal keys), the others
  // legacy keys.
  void Finish() {
    if (!strings_.empty() && salt_allowed_ && !typed_salt_) {
      const absl::string_view salt = Str(*strings_.back());
      ev_->cache_salt.assign(salt.data(), salt.size());
      strings_.pop_back();
    }
    for (const object* s : strings_) {
      Add(ContentKey::Kind::kLegacy, Packed(*s), 0);
    }
  }

  absl::InlinedVector<ContentKey, 2>& keys() { return keys_; }

 private:
  bool IsLora(absl::string_view name) {
    if (lora_seen_ || !ev_->lora_name.has_value() || name != *ev_->lora_name) {
      return false;
    }
    lora_seen_ = true;
    return true;
  }

  // [hash, offset]: a multimodal input as newer raw tuples carry it.
  bool MultiModalTuple(const object& item) {
    absl::string_view hash;
    int64_t offset;
    if (item.via.array.size != 2 || !Bytes(item.via.array.ptr[0], &hash) ||
        !ToInt64(item.via.array.ptr[1], &offset)) {
      return false;
    }
    Add(ContentKey::Kind::kMultiModal, hash, offset);
    return true;
  }

  bool Typed(const object& map) {
    const object* type = MapValue(map, "type");
    absl::string_view t;
    if (type == nullptr || type->type != mtype::STR) return false;
    t = Str(*type);
    if (t == "lora") return TypedLora(map);
    if (t == "cache_salt") return TypedSalt(map);
    if (t == "mm") return TypedMultiModal(map);
    if (t == "prompt_embeds") {
      absl::string_view hash;
      const object* h = MapValue(map, "hash");
      if (h == nullptr || !Bytes(*h, &hash)) return false;
      Add(ContentKey::Kind::kPromptEmbeds, hash, 0);
      return true;
    }
    if (t == "legacy") {
      const object* v = MapValue(map, "value");
      if (v == nullptr) return false;
      Add(ContentKey::Kind::kLegacy, Packed(*v), 0);
      return true;
    }
    return false;  // a kind of key this decoder does not know
  }

  // The event's LoRA, if it names none; a block naming another one cannot
  // be in the event's namespace.
  bool TypedLora(const object& map) {
    const object* name = MapValue(map, "name");
    if (name == nullptr || name->type != mtype::STR) return false;
    if (!ev_->lora_name.has_value()) ev_->lora_name.emplace(Str(*name));
    lora_seen_ = true;
    return *ev_->lora_name == Str(*name);
  }

  bool TypedSalt(const object& map) {
    const object* salt = MapValue(map, "salt");
    if (!salt_allowed_ || typed_salt_ || salt == nullptr ||
        salt->type != mtype::STR) {
      return false;
    }
    ev_->cache_salt.assign(salt->via.str.ptr, salt->via.str.size);
    typed_salt_ = true;
    return true;
  }

  bool TypedMultiModal(const object& map) {
    const object* hash = MapValue(map, "hash");
    const object* offset = MapValue(map, "block_offset");
    const object* modality = MapValue(map, "modality");
    absl::string_view h;
    int64_t k;
    if (hash == nullptr || !Bytes(*hash, &h) || offset == nullptr ||
        !ToInt64(*offset, &k) ||
        (!IsNull(modality) && modality->type != mtype::STR)) {
      return false;
    }
    Add(ContentKey::Kind::kMultiModal, h, k);
    return true;
  }

  void Add(ContentKey::Kind kind, absl::string_view id, int64_t offset) {
    ContentKey& k = keys_.emplace_back();
    k.kind = kind;
    k.id.assign(id.data(), id.size());
    k.offset = offset;
  }

  BlockStoredEvent* const ev_;
  const bool salt_allowed_;
  bool lora_seen_ = false;
  bool typed_salt_ = false;
  absl::InlinedVector<const object*, 2> strings_;
  absl::InlinedVector<ContentKey, 2> keys_;
};

// Appends block `block`'s keys to ev->content (sorted).
void AppendContent(size_t block, absl::InlinedVector<ContentKey, 2>& keys,
                   BlockStoredEvent* ev) {
  BlockContent& c = ev->content;
  if (keys.empty() && c.empty()) return;
  // The first block with keys: earlier blocks get empty ranges.
  while (c.begin.size() < block + 1) {
    c.begin.push_back(static_cast<uint32_t>(c.keys.size()));
  }
  std::sort(keys.begin(), keys.end());
  for (ContentKey& k : keys) c.keys.push_back(std::move(k));
  c.begin.push_back(static_cast<uint32_t>(c.keys.size()));
}

}  // namespace

ContentKey MultiModalContentKey(absl::string_view hash, int64_t block_offset) {
  ContentKey k;
  k.kind = ContentKey::Kind::kMultiModal;
  k.id.assign(hash.data(), hash.size());
  k.offset = block_offset;
  return k;
}

ContentKey PromptEmbedsContentKey(absl::string_view hash) {
  ContentKey k;
  k.kind = ContentKey::Kind::kPromptEmbeds;
  k.id.assign(hash.data(), hash.size());
  return k;
}

ContentKey LegacyStringContentKey(absl::string_view value) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  packer.pack_str(static_cast<uint32_t>(value.size()));
  packer.pack_str_body(value.data(), static_cast<uint32_t>(value.size()));
  ContentKey k;
  k.kind = ContentKey::Kind::kLegacy;
  k.id.assign(buffer.data(), buffer.size());
  return k;
}

bool ReadExtraKeys(const object* extra_keys, BlockStoredEvent* ev) {
  const size_t blocks = ev->block_hashes.size();
  ev->cache_salt.clear();
  ev->content.Clear();
  ev->chain_blocks = blocks;
  if (IsNull(extra_keys)) return true;
  if (extra_keys->type != mtype::ARRAY) return false;
  // Entries past the blocks describe nothing; missing ones are plain.
  const size_t entries = std::min<size_t>(extra_keys->via.array.size, blocks);
  ev->content.keys.reserve(MaxKeys(extra_keys->via.array.ptr, entries));
  for (size_t i = 0; i < entries; ++i) {
    const object& entry = extra_keys->via.array.ptr[i];
    BlockKeysReader reader(ev, i);
    bool ok =
        entry.type == mtype::NIL || (entry.type == mtype::ARRAY &&
                                     entry.via.array.size <= kMaxKeysPerBlock);
    if (ok && entry.type == mtype::ARRAY) {
      for (uint32_t k = 0; ok && k < entry.via.array.size; ++k) {
        ok = reader.Item(entry.via.array.ptr[k]);
      }
    }
    if (!ok) {
      ev->chain_blocks = i;
      break;
    }
    reader.Finish();
    AppendContent(i, reader.keys(), ev);
  }
  // Every chained block has a range once any has keys.
  BlockContent& c = ev->content;
  if (!c.empty()) {
    while (c.begin.size() < ev->chain_blocks + 1) {
      c.begin.push_back(static_cast<uint32_t>(c.keys.size()));
    }
  }
  return true;
}

}  // namespace prefixd
