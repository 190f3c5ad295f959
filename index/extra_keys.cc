#include "index/extra_keys.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"

namespace prefixd {
namespace {

using msgpack_view::Bin;
using msgpack_view::Bytes;
using msgpack_view::IsNull;
using msgpack_view::object;
using msgpack_view::Reader;
using msgpack_view::Str;
using msgpack_view::ToInt64;
using msgpack_view::Value;
namespace mtype = msgpack::type;

// Items in one block's entry at most: its LoRA, salt and prompt embeddings
// and the multimodal inputs that overlap it (a block of 16 tokens overlaps
// a few at most). Each item becomes a ContentKey of 48 bytes from as
// little as one payload byte, so a longer entry ends the chain; what the
// keys of all blocks take is counted against the decode's allowance.
constexpr uint32_t kMaxKeysPerBlock = 32;

// A raw key that is a salt wherever it is: SGLang writes its requests'
// cache salt so, after Dynamo's routers.
constexpr absl::string_view kPrefixedSalt = "dynamo-cache-salt:";

// Sums the keys the first `entries` entries can give at most, so that
// ev->content.keys is allocated once rather than grown (a growing vector
// holds its old and new arrays at once).
struct MaxKeys {
  size_t entries;
  size_t keys = 0;
  bool Begin(uint32_t /*size*/) { return true; }
  void Element(uint32_t i, const object& entry) {
    if (i >= entries || entry.type != mtype::ARRAY) return;
    keys += std::min(entry.via.array.size, kMaxKeysPerBlock);
  }
};

// The keys of one block, read item by item.
class BlockKeysReader {
 public:
  BlockKeysReader(const Reader& reader, DecodeAllowance* allowance,
                  BlockStoredEvent* ev, size_t block)
      : reader_(reader),
        allowance_(allowance),
        ev_(ev),
        first_block_(block == 0),
        salt_allowed_(block == 0 && !ev->parent_block_hash.has_value()) {}

  // False: the item cannot be understood (the chain ends at this block).
  bool Item(const Value& item) {
    const object& head = item.head;
    switch (head.type) {
      case mtype::MAP:
        return Typed(item);
      case mtype::STR:
        if (IsLora(Str(head))) return true;
        if (absl::StartsWith(Str(head), kPrefixedSalt))
          return PrefixedSalt(head);
        strings_.push_back(item);
        return true;
      case mtype::BIN:
        Add(ContentKey::Kind::kPromptEmbeds, Bin(head), 0);
        return true;
      case mtype::ARRAY:
        if (MultiModalTuple(item)) return true;
        break;
      case mtype::POSITIVE_INTEGER:
      case mtype::NEGATIVE_INTEGER: {
        // Older vLLM put the LoRA's integer id in the keys.
        int64_t id;
        if (!lora_seen_ && ev_->lora_id.has_value() && ToInt64(head, &id) &&
            id == *ev_->lora_id) {
          lora_seen_ = true;
          return true;
        }
        break;
      }
      default:
        break;
    }
    AddLegacy(item);
    return true;
  }

  // The raw strings left: the last one of a root event's first block is
  // its salt (vLLM puts the salt after the multimodal keys), the others
  // legacy keys.
  void Finish() {
    if (!strings_.empty() && salt_allowed_ && !typed_salt_) {
      const absl::string_view salt = Str(strings_.back().head);
      ev_->cache_salt.assign(salt.data(), salt.size());
      strings_.pop_back();
    }
    for (const Value& s : strings_) AddLegacy(s);
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
  bool MultiModalTuple(const Value& item) {
    if (item.head.via.array.size != 2) return false;
    size_t pos = item.pos;
    reader_.Enter(&pos);
    const Value hash = reader_.Read(&pos);
    const Value offset = reader_.Read(&pos);
    absl::string_view h;
    int64_t k;
    if (!Bytes(hash.head, &h) || !ToInt64(offset.head, &k)) return false;
    Add(ContentKey::Kind::kMultiModal, h, k);
    return true;
  }

  // The keys a typed map may have.
  enum TypedKey { kType, kName, kSalt, kHash, kBlockOffset, kModality, kValue };
  static constexpr absl::string_view kTypedKeys[] = {
      "type", "name", "salt", "hash", "block_offset", "modality", "value"};

  bool Typed(const Value& map) {
    Value v[std::size(kTypedKeys)];
    reader_.MapValues(map, kTypedKeys, v);
    const object* type = v[kType].get();
    if (type == nullptr || type->type != mtype::STR) return false;
    const absl::string_view t = Str(*type);
    if (t == "lora") return TypedLora(v[kName].get());
    if (t == "cache_salt") return TypedSalt(v[kSalt].get());
    if (t == "mm") return TypedMultiModal(v);
    if (t == "prompt_embeds") {
      absl::string_view hash;
      const object* h = v[kHash].get();
      if (h == nullptr || !Bytes(*h, &hash)) return false;
      Add(ContentKey::Kind::kPromptEmbeds, hash, 0);
      return true;
    }
    if (t == "legacy") {
      if (!v[kValue].present()) return false;
      AddLegacy(v[kValue]);
      return true;
    }
    return false;  // a kind of key this decoder does not know
  }

  // The event's LoRA, if it names none; a block naming another one cannot
  // be in the event's namespace.
  bool TypedLora(const object* name) {
    if (name == nullptr || name->type != mtype::STR) return false;
    if (!ev_->lora_name.has_value()) ev_->lora_name.emplace(Str(*name));
    lora_seen_ = true;
    return *ev_->lora_name == Str(*name);
  }

  // SGLang's salt as Dynamo's routers read it: in the first block of every
  // store of a salted request, root or not (HolderTree checks that a
  // child's is its parent's namespace's).
  bool PrefixedSalt(const object& item) {
    if (!first_block_ || typed_salt_) return false;
    const absl::string_view salt = Str(item).substr(kPrefixedSalt.size());
    ev_->cache_salt.assign(salt.data(), salt.size());
    typed_salt_ = true;
    return true;
  }

  bool TypedSalt(const object* salt) {
    if (!salt_allowed_ || typed_salt_ || salt == nullptr ||
        salt->type != mtype::STR) {
      return false;
    }
    ev_->cache_salt.assign(salt->via.str.ptr, salt->via.str.size);
    typed_salt_ = true;
    return true;
  }

  bool TypedMultiModal(const Value* v) {
    const object* hash = v[kHash].get();
    const object* offset = v[kBlockOffset].get();
    const object* modality = v[kModality].get();
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
    if (!allowance_->Take(DecodeAllowance::StringBytes(id.size()))) return;
    ContentKey& k = keys_.emplace_back();
    k.kind = kind;
    k.id.assign(id.data(), id.size());
    k.offset = offset;
  }

  // A legacy key: the value's msgpack encoding, the same for a raw item
  // and for a typed key's "value".
  void AddLegacy(const Value& value) {
    ContentKey& k = keys_.emplace_back();
    k.kind = ContentKey::Kind::kLegacy;
    reader_.Pack(value, &k.id);  // no longer than the value in the payload
    allowance_->Take(DecodeAllowance::StringBytes(k.id.size()));
  }

  const Reader& reader_;
  DecodeAllowance* const allowance_;
  BlockStoredEvent* const ev_;
  const bool first_block_;
  const bool salt_allowed_;
  bool lora_seen_ = false;
  bool typed_salt_ = false;
  absl::InlinedVector<Value, 2> strings_;
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

// Reads the entry at *pos (*pos past it, if it could be read) into block
// `block`'s keys; false if they cannot be understood or the allowance ran
// out.
bool ReadEntry(const Reader& reader, size_t* pos, size_t block,
               DecodeAllowance* allowance, BlockStoredEvent* ev) {
  const Value entry = reader.Enter(pos);
  const object& head = entry.head;
  if (head.type != mtype::NIL &&
      (head.type != mtype::ARRAY || head.via.array.size > kMaxKeysPerBlock)) {
    return false;
  }
  BlockKeysReader keys(reader, allowance, ev, block);
  if (head.type == mtype::ARRAY) {
    for (uint32_t k = 0; k < head.via.array.size; ++k) {
      if (!keys.Item(reader.Read(pos)) || allowance->exceeded()) return false;
    }
  }
  keys.Finish();
  AppendContent(block, keys.keys(), ev);
  return true;
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

BlockContent WithNextTokens(const BlockContent* content,
                            absl::Span<const Token> tokens, size_t block_size,
                            size_t blocks, Token after) {
  BlockContent out;
  const size_t own = content == nullptr ? 0 : content->keys.size();
  out.keys.reserve(own + blocks);
  out.begin.reserve(blocks + 1);
  for (size_t i = 0; i < blocks; ++i) {
    const size_t next = (i + 1) * block_size;
    out.begin.push_back(static_cast<uint32_t>(out.keys.size()));
    if (content != nullptr) {
      for (const ContentKey& k : content->Of(i)) out.keys.push_back(k);
    }
    ContentKey k;
    k.kind = ContentKey::Kind::kNextToken;
    k.offset = next < tokens.size() ? tokens[next] : after;
    out.keys.push_back(std::move(k));
  }
  out.begin.push_back(static_cast<uint32_t>(out.keys.size()));
  return out;
}

bool ReadExtraKeys(const Reader& reader, const Value& extra_keys,
                   DecodeAllowance* allowance, BlockStoredEvent* ev) {
  const size_t blocks = ev->block_hashes.size();
  ev->cache_salt.clear();
  ev->content.Clear();
  ev->chain_blocks = blocks;
  if (IsNull(extra_keys.get())) return true;
  if (extra_keys.head.type != mtype::ARRAY) return false;
  // Entries past the blocks describe nothing; missing ones are plain.
  const size_t entries =
      std::min<size_t>(extra_keys.head.via.array.size, blocks);
  MaxKeys max{entries};
  size_t pos = extra_keys.pos;
  reader.ReadElements(&pos, max);
  if (!allowance->Take(
          DecodeAllowance::ArrayBytes(max.keys, sizeof(ContentKey)) +
          DecodeAllowance::ArrayBytes(entries + 1, sizeof(uint32_t)))) {
    return true;  // the caller refuses the payload
  }
  ev->content.keys.reserve(max.keys);
  pos = extra_keys.pos;
  reader.Enter(&pos);
  for (size_t i = 0; i < entries; ++i) {
    if (!ReadEntry(reader, &pos, i, allowance, ev)) {
      ev->chain_blocks = i;
      break;
    }
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
