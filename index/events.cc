// Decoding reads the payload in place with msgpack-cxx's parser
// (index/msgpack_view.h): one check of the whole payload against the
// limits, then each value read where the decoder meets it, in one pass.
// Block hashes and token ids go straight from the parser into the event's
// vectors; no object tree of the payload is built, no STL container stands
// in between (the ingest path handles millions of blocks a second on one
// thread), and strings and bytes point into the payload, not copies.
#include "index/events.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "index/decode_budget.h"
#include "index/extra_keys.h"
#include "index/group_rules.h"
#include "index/msgpack_view.h"
#include "index/object_key.h"
#include "index/wire_names.h"

namespace prefixd {
namespace {

using msgpack_view::Bin;
using msgpack_view::IntText;
using msgpack_view::IsInt;
using msgpack_view::IsNull;
using msgpack_view::object;
using msgpack_view::Reader;
using msgpack_view::Str;
using msgpack_view::ToInt64;
using msgpack_view::TypeName;
using msgpack_view::Value;
namespace mtype = msgpack::type;

// Bounds on what one payload may declare (a fuzzed or hostile payload must
// not exhaust memory). Real batches stay far below them: a batch holds
// hundreds of events, and extra_keys nest about six levels deep.
constexpr size_t kMaxArray = size_t{1} << 24;
constexpr size_t kMaxMap = size_t{1} << 16;
constexpr size_t kMaxBytes = size_t{1} << 24;  // one str, bin or ext
constexpr size_t kMaxDepth = 32;

// The decoder sizes block_hashes and token_ids by their declared count
// before their elements are read. Every array element takes at least one
// byte and every map entry two, so a count is also capped by the payload's
// size: a few bytes cannot ask for hundreds of megabytes.
msgpack::unpack_limit Limits(size_t payload_size, size_t depth = kMaxDepth) {
  return msgpack::unpack_limit(std::min(kMaxArray, payload_size),
                               std::min(kMaxMap, payload_size / 2), kMaxBytes,
                               kMaxBytes, kMaxBytes, depth);
}

// The decoder reads no value that starts deeper than this (an extra_keys
// item's elements), so a read that allows kMaxDepth - kDeepestRead nested
// containers from where it starts never lets the payload nest deeper than
// kMaxDepth (it may refuse one that does not: see DecodeEventBatch).
constexpr size_t kDeepestRead = 6;

bool ToHash(const object& o, EngineHash* h) {
  switch (o.type) {
    case mtype::POSITIVE_INTEGER:
      *h = o.via.u64;
      return true;
    case mtype::NEGATIVE_INTEGER:
      // msgspec sends Python's signed hashes as they are; the index keys on
      // their 64-bit pattern.
      *h = static_cast<uint64_t>(o.via.i64);
      return true;
    case mtype::STR:
      *h = FoldHashBytes(Str(o));
      return true;
    case mtype::BIN:
      *h = FoldHashBytes(Bin(o));
      return true;
    default:
      return false;
  }
}

// The fields of the event types, in msgspec declaration order, which is
// their position (after the tag) in the array form (events.h).
enum Field : int {
  kBlockHashes,
  kParentBlockHash,
  kTokenIds,
  kBlockSize,
  kLoraId,
  kMedium,
  kLoraName,
  kExtraKeys,
  kGroupIdx,
  kKvCacheSpecKind,
  kKvCacheSpecSlidingWindow,
  kLocality,
  kOwnership,
  // Known so it is not counted as unknown; the index has no use for it.
  kSessionId,
  kEventVersion,
  // RFC #1527's names (map form only): the namespace salt of its stores.
  kAdditionalSalt,
  // SGLang's, map form only (its newest releases send tagged maps): the
  // request's cache salt, in every store of a salted request.
  kCacheSalt,
  // vLLM's, map form only: per removed hash, the copies of it left.
  kRemainingCopyCounts,
  // SGLang's, by name in its map form; its array form's is a list in
  // kLoraName's slot.
  kComponentTypes,
  // SGLang's earlier component-typed events': by name in the map form,
  // moved here from their positions in the array form (OneComponentLayout).
  kComponentType,
  kComponentId,
  kSnapshotVersion,
  // Mooncake's store master's, map form only: the stored object's key,
  // which names the block's engine hash (index/object_key.h).
  kObjectKey,
  // TensorRT-LLM's, map form only: per block, the multimodal inputs in it.
  kMmKeys,
  // RFC #1527's, map form only (also on removals and clears): the tenant
  // whose object the event is about.
  kTenantId,
  kNumFields,
};

constexpr absl::string_view kFieldNames[kNumFields] = {
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "event_version",
    "additional_salt",
    "cache_salt",
    "remaining_copy_counts",
    "component_types",
    "component_type",
    "component_id",
    "snapshot_version",
    "object_key",
    "mm_keys",
    "tenant_id",
};

// RFC #1527's other names for vLLM's fields (Mooncake's store master sends
// both when its legacy compatibility is on), and the fields of its envelope
// the index reads past: known, so not counted as unknown.
struct FieldAlias {
  absl::string_view name;
  int field;  // a Field, or -1: known and not used
};
constexpr FieldAlias kAliases[] = {
    {"seq_hashes", kBlockHashes},
    {"parent_hash", kParentBlockHash},
    {"event_type", -1},
    {"base_block_idx", -1},
    {"backend_id", -1},
    {"dp_rank", -1},
    {"model_name", -1},
    {"event_id", -1},
    {"timestamp", -1},
    // Mooncake's object events: the Store call's group, and what earlier
    // publishers parsed out of the object key themselves.
    {"group_id", -1},
    {"connector_block_hash", -1},
    {"cache_prefix", -1},
    {"tp_rank", -1},
    {"head_or_tp_rank", -1},
    {"pcp_rank", -1},
    {"dcp_rank", -1},
    {"pp_rank", -1},
    {"layer_id", -1},
};

// Map form only (they have no place in the array form).
constexpr Field kStoredMapFields[] = {
    kAdditionalSalt,  kCacheSalt, kComponentTypes, kComponentType, kComponentId,
    kSnapshotVersion, kObjectKey, kMmKeys,         kTenantId};
// Mooncake's removals carry its every event's model, LoRA, block size and
// salt too: known there, not used.
constexpr Field kRemovedMapFields[] = {
    kRemainingCopyCounts, kComponentType,  kComponentId,
    kSnapshotVersion,     kObjectKey,      kLoraName,
    kBlockSize,           kAdditionalSalt, kTenantId};
constexpr Field kClearedMapFields[] = {kTenantId};

constexpr Field kStoredFields[] = {
    kBlockHashes,
    kParentBlockHash,
    kTokenIds,
    kBlockSize,
    kLoraId,
    kMedium,
    kLoraName,
    kExtraKeys,
    kGroupIdx,
    kKvCacheSpecKind,
    kKvCacheSpecSlidingWindow,
    kLocality,
    kOwnership,
    kSessionId,
    kEventVersion,
};
constexpr Field kRemovedFields[] = {kBlockHashes, kMedium,    kGroupIdx,
                                    kLocality,    kOwnership, kEventVersion};

enum class Kind { kStored, kRemoved, kCleared, kUnknown };

Kind KindOf(absl::string_view type) {
  if (type == "BlockStored" || type == "stored") return Kind::kStored;
  if (type == "BlockRemoved" || type == "removed") return Kind::kRemoved;
  if (type == "AllBlocksCleared" || type == "cleared") return Kind::kCleared;
  return Kind::kUnknown;
}

// An event type's fields: those of the array form, in their order, and
// those read by name only.
struct EventFields {
  absl::Span<const Field> positional;
  absl::Span<const Field> map_only;
};

EventFields FieldsOf(Kind kind) {
  switch (kind) {
    case Kind::kStored:
      return {kStoredFields, kStoredMapFields};
    case Kind::kRemoved:
      return {kRemovedFields, kRemovedMapFields};
    case Kind::kCleared:
      return {{}, kClearedMapFields};
    default:
      return {};
  }
}

// The next event of *out: an existing element is reused when it holds the
// same type, so its vectors keep their capacity from batch to batch.
template <typename T>
T& NextSlot(std::vector<KvEvent>* events, size_t* used) {
  if (*used < events->size()) {
    KvEvent& slot = (*events)[(*used)++];
    if (T* same = std::get_if<T>(&slot)) return *same;
    return slot.emplace<T>();
  }
  ++*used;
  return std::get<T>(events->emplace_back(std::in_place_type<T>));
}

// The first element of block_hashes or token_ids that is not a hash or a
// token id, kept for the error that names it: the fields checked before
// it come first.
struct BadElement {
  bool found = false;
  uint32_t index = 0;
  object head;

  void Note(uint32_t i, const object& o) {
    if (found) return;
    found = true;
    index = i;
    head = o;
  }
};

// Sizes *out for an array's `size` elements if the allowance has room for
// them (else empties it, and the elements are not read): their storage, or
// nullptr.
template <typename T>
T* SizeFor(uint32_t size, DecodeAllowance* allowance, std::vector<T>* out) {
  if (!allowance->Take(DecodeAllowance::ArrayBytes(size, sizeof(T)))) {
    out->clear();
    return nullptr;
  }
  out->resize(size);
  return out->data();
}

// Reads block_hashes into the event's vector (Reader::ReadElements).
struct HashesSink {
  std::vector<EngineHash>* out;
  BadElement* bad;
  DecodeAllowance* allowance;
  EngineHash* data = nullptr;

  bool Begin(uint32_t size) {
    data = SizeFor(size, allowance, out);
    return data != nullptr;
  }
  void Element(uint32_t i, const object& o) {
    if (!ToHash(o, &data[i])) bad->Note(i, o);
  }
};

bool IsToken(const object& o) {
  return o.type == mtype::POSITIVE_INTEGER &&
         o.via.u64 <= std::numeric_limits<Token>::max();
}

// Reads token_ids (0 <= id < 2^32) into the event's vector.
struct TokensSink {
  std::vector<Token>* out;
  BadElement* bad;
  DecodeAllowance* allowance;
  Token* data = nullptr;

  bool Begin(uint32_t size) {
    data = SizeFor(size, allowance, out);
    return data != nullptr;
  }
  // Inlined into the parser's loop: it runs for every token id.
  ABSL_ATTRIBUTE_ALWAYS_INLINE void Element(uint32_t i, const object& o) {
    if (!IsToken(o)) {
      bad->Note(i, o);
      return;
    }
    data[i] = static_cast<Token>(o.via.u64);
  }
};

// Decodes the events of one batch. Errors name the event's index in the
// batch, its type and the field.
class EventDecoder {
 public:
  EventDecoder(const Reader& reader, DecodeAllowance* allowance,
               KvEventBatch* out)
      : reader_(reader), allowance_(allowance), out_(out) {}

  // The array `events`, whose elements start at *pos (Reader::Enter); *pos
  // past it. Counts its unknown events and fields into *out_.
  absl::Status Decode(const Value& events, size_t* pos) {
    // Allocated once: a growing vector holds its old and new arrays at
    // once, and an event takes hundreds of bytes from as few as 9. The
    // allowance runs out before more events than this are made.
    const size_t most =
        static_cast<size_t>(allowance_->limit()) / sizeof(KvEvent) + 1;
    out_->events.reserve(std::min<size_t>(events.head.via.array.size, most));
    for (uint32_t i = 0; i < events.head.via.array.size; ++i) {
      index_ = i;
      type_ = "";
      const absl::Status s = DecodeEvent(pos);
      if (allowance_->exceeded()) return TooDense();
      if (!s.ok()) return s;
    }
    out_->events.erase(out_->events.begin() + used_, out_->events.end());
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    if (type_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("event ", index_, ": ", what));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("event ", index_, " (", type_, "): ", what));
  }

  // The batch would hold more than its allowance: nothing an engine sends
  // is this dense (index/decode_budget.h).
  absl::Status TooDense() const {
    return Error(absl::StrCat(
        "the batch decodes to more than ", allowance_->limit(), " bytes (",
        kDecodePeakPerPayloadByte, " per byte of its ",
        allowance_->payload_bytes(), "-byte payload): refused as too dense"));
  }

  absl::Status WrongType(Field f, const object& o,
                         absl::string_view want) const {
    return Error(
        absl::StrCat(kFieldNames[f], " is a ", TypeName(o), ", want ", want));
  }

  // The event at *pos; *pos past it.
  absl::Status DecodeEvent(size_t* pos) {
    const Value ev = reader_.Enter(pos);
    if (ev.head.type == mtype::ARRAY) return ArrayEvent(ev, pos);
    if (ev.head.type == mtype::MAP) return MapEvent(ev, pos);
    return Error(absl::StrCat("an event is a ", TypeName(ev.head),
                              ", want an array or a map"));
  }

  // Steps over the event `ev` (*pos anywhere in it).
  void Skip(const Value& ev, size_t* pos) const {
    *pos = ev.pos;
    reader_.Read(pos);
  }

  // ["BlockStored", field, field, ...]: fields by position.
  absl::Status ArrayEvent(const Value& ev, size_t* pos) {
    const uint32_t size = ev.head.via.array.size;
    const Value type = size > 0 ? reader_.Read(pos) : Value();
    if (type.head.type != mtype::STR) {
      return Error("an array event must start with its type name (a str)");
    }
    type_ = Str(type.head);
    const Kind kind = KindOf(type_);
    if (kind == Kind::kUnknown) {
      ++out_->unknown_events;
      Skip(ev, pos);
      return absl::OkStatus();
    }
    if (!NewEvent(kind)) return TooDense();
    const absl::Span<const Field> known = FieldsOf(kind).positional;
    Value fields[kNumFields];
    uint32_t j = 1;
    for (; j < size && j - 1 < known.size(); ++j) {
      ReadField(known[j - 1], pos, fields);
    }
    if (j < size) {
      out_->unknown_fields += size - j;
      Skip(ev, pos);
    }
    OneComponentLayout(kind, fields);
    return DecodeFields(kind, fields);
  }

  // SGLang's earlier component-typed events (--enable-kv-events-component-
  // types), in the array form: a component's name where vLLM has medium,
  // then component_id, snapshot_version and medium:
  //
  //   BlockStored  block_hashes, parent_block_hash, token_ids, block_size,
  //                lora_id, component_type, component_id, snapshot_version,
  //                medium
  //   BlockRemoved block_hashes, component_type, component_id,
  //                snapshot_version, medium
  //
  // No medium is named "full", "swa" or "mamba": such a name there is this
  // layout, whose fields move to the places of their names. (In the map
  // form they are read by name.)
  static void OneComponentLayout(Kind kind, Value* fields) {
    const object* name = fields[kMedium].get();
    if (name == nullptr || name->type != mtype::STR ||
        ComponentBit(Str(*name)) == 0) {
      return;
    }
    // Where component_id, snapshot_version and medium were read.
    const bool stored = kind == Kind::kStored;
    const Field id = stored ? kLoraName : kGroupIdx;
    const Field version = stored ? kExtraKeys : kLocality;
    const Field medium = stored ? kGroupIdx : kOwnership;
    fields[kComponentType] = fields[kMedium];
    fields[kComponentId] = std::exchange(fields[id], Value());
    fields[kSnapshotVersion] = std::exchange(fields[version], Value());
    fields[kMedium] = std::exchange(fields[medium], Value());
  }

  // The component SGLang's earlier layout names (its bit; 0: none, or one
  // the index has no group for), its component_id and snapshot_version
  // checked and not used.
  absl::Status OneComponent(const object* const* f, uint32_t* bit) {
    *bit = 0;
    for (const Field n : {kComponentId, kSnapshotVersion}) {
      if (!IsNull(f[n]) && f[n]->type != mtype::POSITIVE_INTEGER) {
        return WrongType(n, *f[n], "an int >= 0 or nil");
      }
    }
    const object* name = f[kComponentType];
    if (IsNull(name)) return absl::OkStatus();
    if (name->type != mtype::STR) {
      return WrongType(kComponentType, *name, "a str or nil");
    }
    *bit = ComponentBit(Str(*name));
    return absl::OkStatus();
  }

  // {"type": "BlockStored", name: field, ...} (vLLM), or RFC #1527's
  // {"event_type": "stored", ...}: fields by name, once the type is known.
  absl::Status MapEvent(const Value& ev, size_t* pos) {
    static constexpr absl::string_view kTypeKeys[] = {"type", "event_type"};
    Value types[2];
    // msgspec and EncodeEventBatch write "type" first: read it there, not
    // by a pass over every value of the map (its token ids included).
    size_t first = *pos;
    const Value key = ev.head.via.map.size > 0 ? reader_.Read(&first) : Value();
    if (key.head.type == mtype::STR && Str(key.head) == "type") {
      types[0] = reader_.Read(&first);
    } else {
      reader_.MapValues(ev, kTypeKeys, types);
    }
    const Value& type = types[0].present() ? types[0] : types[1];
    if (!type.present() || type.head.type != mtype::STR) {
      return Error("a map event must have a str \"type\" (or \"event_type\")");
    }
    type_ = Str(type.head);
    const Kind kind = KindOf(type_);
    if (kind == Kind::kUnknown) {
      ++out_->unknown_events;
      Skip(ev, pos);
      return absl::OkStatus();
    }
    if (!NewEvent(kind)) return TooDense();
    const absl::Span<const Field> known = FieldsOf(kind).positional;
    Value fields[kNumFields];
    for (uint32_t j = 0; j < ev.head.via.map.size; ++j) {
      const Value key = reader_.Read(pos);
      int f = -1;  // a Field, or -1: the value is stepped over
      if (key.head.type != mtype::STR) {
        ++out_->unknown_fields;
      } else if (Str(key.head) != "type") {
        f = MapField(kind, known, Str(key.head));
        if (f == kUnknownField) ++out_->unknown_fields;
      }
      if (f >= 0 && !fields[f].present()) {
        ReadField(static_cast<Field>(f), pos, fields);
      } else {
        reader_.Read(pos);
      }
    }
    return DecodeFields(kind, fields);
  }

  static constexpr int kUnknownField = -2;
  // The Field a map key names (-1: known, not used), or kUnknownField.
  static int MapField(Kind kind, absl::Span<const Field> known,
                      absl::string_view name) {
    for (Field f : known) {
      if (kFieldNames[f] == name) return f;
    }
    for (Field f : FieldsOf(kind).map_only) {
      if (kFieldNames[f] == name) return f;
    }
    for (const FieldAlias& a : kAliases) {
      if (a.name != name) continue;
      if (a.field < 0) return -1;
      return std::find(known.begin(), known.end(), a.field) != known.end()
                 ? a.field
                 : -1;
    }
    return kUnknownField;
  }

  // Makes out_'s next event, of `kind`'s type, and points hashes_ and
  // tokens_ at its vectors, emptied: ReadField reads into them. False if
  // the allowance has no room for it.
  bool NewEvent(Kind kind) {
    if (!allowance_->Take(sizeof(KvEvent))) return false;
    hashes_ = nullptr;
    tokens_ = nullptr;
    bad_hash_ = BadElement();
    bad_token_ = BadElement();
    text_token_ = kNoTextToken;
    if (kind == Kind::kStored) {
      auto& ev = NextSlot<BlockStoredEvent>(&out_->events, &used_);
      hashes_ = &ev.block_hashes;
      tokens_ = &ev.token_ids;
    } else if (kind == Kind::kRemoved) {
      hashes_ =
          &NextSlot<BlockRemovedEvent>(&out_->events, &used_).block_hashes;
    } else {
      NextSlot<AllBlocksClearedEvent>(&out_->events, &used_);
    }
    if (hashes_ != nullptr) hashes_->clear();
    if (tokens_ != nullptr) tokens_->clear();
    return true;
  }

  // Field f's value at *pos, *pos past it: block_hashes and token_ids into
  // the event's vectors (their elements checked later, in field order),
  // the others as heads.
  void ReadField(Field f, size_t* pos, Value* fields) {
    if (f == kBlockHashes) {
      HashesSink sink{hashes_, &bad_hash_, allowance_};
      fields[f] = reader_.ReadElements(pos, sink);
    } else if (f == kTokenIds) {
      TokensSink sink{tokens_, &bad_token_, allowance_};
      fields[f] = reader_.ReadElements(pos, sink);
    } else {
      fields[f] = reader_.Read(pos);
    }
  }

  // The event NewEvent made, from its fields.
  absl::Status DecodeFields(Kind kind, const Value* fields) {
    KvEvent& ev = out_->events[used_ - 1];
    switch (kind) {
      case Kind::kStored:
        return DecodeStored(fields, &std::get<BlockStoredEvent>(ev));
      case Kind::kRemoved:
        return DecodeRemoved(fields, &std::get<BlockRemovedEvent>(ev));
      default:
        return Name(kTenantId, fields[kTenantId].get(),
                    &std::get<AllBlocksClearedEvent>(ev).tenant);
    }
  }

  // The fields' heads, nullptr for those absent.
  static void Heads(const Value* fields, const object** f) {
    for (int i = 0; i < kNumFields; ++i) f[i] = fields[i].get();
  }

  absl::Status DecodeStored(const Value* fields, BlockStoredEvent* ev) {
    const object* f[kNumFields];
    Heads(fields, f);
    RETURN_IF_ERROR(StoredBlocks(fields, f, ev));
    RETURN_IF_ERROR(Parent(f[kParentBlockHash], &ev->parent_block_hash));
    RETURN_IF_ERROR(OptionalInt(kLoraId, f[kLoraId], &ev->lora_id));
    RETURN_IF_ERROR(UpperName(kMedium, f[kMedium], "GPU", &ev->medium));
    // SGLang's BlockStoredMetadata, a map holding the request's cache salt:
    // right after medium, in the lora_name slot, in some releases; past
    // ownership, in session_id's, in later ones.
    // SGLang's component_types, a list: in the lora_name slot in its array
    // form (no LoRA name is a list), by name in its map form.
    std::string metadata_salt;
    const Value* components = &fields[kComponentTypes];
    if (IsMap(f[kLoraName])) {
      ev->lora_name.reset();
      RETURN_IF_ERROR(Metadata(kLoraName, fields[kLoraName], &metadata_salt));
    } else if (IsArray(f[kLoraName]) && !components->present()) {
      ev->lora_name.reset();
      components = &fields[kLoraName];
    } else {
      RETURN_IF_ERROR(LoraName(f[kLoraName], &ev->lora_name));
    }
    RETURN_IF_ERROR(Components(*components, &ev->components));
    uint32_t one = 0;
    RETURN_IF_ERROR(OneComponent(f, &one));
    ev->one_component = one != 0;
    if (ev->one_component) ev->components = one;
    RETURN_IF_ERROR(IntOrZero(kGroupIdx, f[kGroupIdx], &ev->group_idx));
    RETURN_IF_ERROR(GroupSpec(f, ev));
    RETURN_IF_ERROR(UpperName(kLocality, f[kLocality], "", &ev->locality));
    RETURN_IF_ERROR(Name(kOwnership, f[kOwnership], &ev->ownership));
    RETURN_IF_ERROR(Name(kTenantId, f[kTenantId], &ev->tenant));
    if (IsMap(f[kSessionId])) {
      RETURN_IF_ERROR(Metadata(kSessionId, fields[kSessionId], &metadata_salt));
    } else {
      RETURN_IF_ERROR(Known(kSessionId, f[kSessionId]));
    }
    RETURN_IF_ERROR(
        IntOrZero(kEventVersion, f[kEventVersion], &ev->event_version));
    if (!ReadExtraKeys(reader_, fields[kExtraKeys], allowance_, ev)) {
      return WrongType(kExtraKeys, *f[kExtraKeys], "an array or nil");
    }
    RETURN_IF_ERROR(EndChainAtOpaqueBlocks(fields, ev));
    if (ev->bigram) RETURN_IF_ERROR(AddNextTokens(ev));
    RETURN_IF_ERROR(RequestSalts(f, std::move(metadata_salt), ev));
    // The LoRA name and salt as the event or its extra keys gave them.
    if (ev->lora_name.has_value()) {
      RETURN_IF_ERROR(CheckName("lora_name", *ev->lora_name));
    }
    RETURN_IF_ERROR(CheckName("cache_salt", ev->cache_salt));
    // RFC #1527's additional_salt: the namespace's salt, unless the extra
    // keys gave one.
    std::string salt;
    RETURN_IF_ERROR(Name(kAdditionalSalt, f[kAdditionalSalt], &salt));
    if (ev->cache_salt.empty() && !ev->parent_block_hash.has_value()) {
      ev->cache_salt = std::move(salt);  // checked by Name
    }
    return absl::OkStatus();
  }

  // The store's blocks: block_hashes and token_ids, or the one engine hash
  // a Mooncake object's key names.
  absl::Status StoredBlocks(const Value* fields, const object* const* f,
                            BlockStoredEvent* ev) {
    RETURN_IF_ERROR(BlockHashes(f[kBlockHashes]));
    RETURN_IF_ERROR(
        ObjectKey(f[kObjectKey], &ev->block_hashes, &ev->from_object_key));
    if (!ev->from_object_key) return StoredTokens(fields, f, ev);
    // Placed by its engine hash: its tokens and block size, if any, are not
    // read (one object may hold a chunk of several blocks).
    ev->token_ids.clear();
    ev->placeholder = ev->bigram = ev->sparse = false;
    ev->block_size = 0;
    return absl::OkStatus();
  }

  // token_ids and block_size: tokens, EAGLE's pairs, a placeholder's empty
  // array, or nil.
  absl::Status StoredTokens(const Value* fields, const object* const* f,
                            BlockStoredEvent* ev) {
    ev->placeholder = IsEmptyArray(f[kTokenIds]);
    ev->bigram = false;
    ev->sparse = false;
    if (ev->placeholder) {
      // vLLM's offloading placeholder: token_ids [], block_size 0 (older
      // vLLM: the offloaded block's size).
      ev->token_ids.clear();
      RETURN_IF_ERROR(PlaceholderBlockSize(f[kBlockSize], &ev->block_size));
    } else if (IsNull(f[kTokenIds])) {
      // A store of hashes alone (RFC #1527's storage daemons): placed by
      // its keys, if its worker's hashes are the index's keys.
      ev->token_ids.clear();
      ev->block_size = 0;
      if (!IsNull(f[kBlockSize])) {
        RETURN_IF_ERROR(BlockSize(f[kBlockSize], &ev->block_size));
      }
    } else {
      RETURN_IF_ERROR(BlockSize(f[kBlockSize], &ev->block_size));
      RETURN_IF_ERROR(TokenCount(f[kTokenIds], ev));
      ev->bigram = bad_token_.found && bad_token_.index == 0 &&
                   bad_token_.head.type == mtype::ARRAY;
      if (ev->bigram && ev->sparse) {
        return Error(absl::StrCat(
            "token_ids has ", f[kTokenIds]->via.array.size,
            " pairs, want block_hashes * block_size = ",
            ev->block_hashes.size() * static_cast<uint64_t>(ev->block_size)));
      }
      RETURN_IF_ERROR(ev->bigram ? BigramTokenIds(fields[kTokenIds], ev)
                                 : TokenIds(ev->sparse));
    }
    return absl::OkStatus();
  }

  // The request's salt as SGLang names it, in its metadata map or as a
  // field of its own: each must agree with the salt named before it (the
  // extra keys' first).
  absl::Status RequestSalts(const object* const* f, std::string metadata_salt,
                            BlockStoredEvent* ev) {
    std::string named;
    RETURN_IF_ERROR(Name(kCacheSalt, f[kCacheSalt], &named));
    absl::string_view from = "extra_keys'";
    RETURN_IF_ERROR(AgreeingSalt("metadata's cache_salt",
                                 std::move(metadata_salt), &from, ev));
    return AgreeingSalt("cache_salt", std::move(named), &from, ev);
  }

  // `salt` (from `source`; empty: none) as the event's salt, which *from
  // named before if any.
  absl::Status AgreeingSalt(absl::string_view source, std::string salt,
                            absl::string_view* from, BlockStoredEvent* ev) {
    if (salt.empty()) return absl::OkStatus();
    if (ev->cache_salt.empty()) {
      ev->cache_salt = std::move(salt);
      *from = source;
    } else if (ev->cache_salt != salt) {
      return Error(absl::StrCat(source, " \"", salt, "\" is not ", *from, " \"",
                                ev->cache_salt, "\""));
    }
    return absl::OkStatus();
  }

  absl::Status DecodeRemoved(const Value* fields, BlockRemovedEvent* ev) {
    const object* f[kNumFields];
    Heads(fields, f);
    RETURN_IF_ERROR(BlockHashes(f[kBlockHashes]));
    bool from_object_key = false;
    RETURN_IF_ERROR(
        ObjectKey(f[kObjectKey], &ev->block_hashes, &from_object_key));
    RETURN_IF_ERROR(UpperName(kMedium, f[kMedium], "GPU", &ev->medium));
    RETURN_IF_ERROR(IntOrZero(kGroupIdx, f[kGroupIdx], &ev->group_idx));
    RETURN_IF_ERROR(UpperName(kLocality, f[kLocality], "", &ev->locality));
    RETURN_IF_ERROR(Name(kOwnership, f[kOwnership], &ev->ownership));
    RETURN_IF_ERROR(
        IntOrZero(kEventVersion, f[kEventVersion], &ev->event_version));
    RETURN_IF_ERROR(Name(kTenantId, f[kTenantId], &ev->tenant));
    RETURN_IF_ERROR(OneComponent(f, &ev->components));
    return DropCopiesLeft(fields[kRemainingCopyCounts], ev);
  }

  // object_key (Mooncake's store master), nil or a str: when it names an
  // engine hash (index/object_key.h), that hash is the event's one block,
  // whatever seq_hashes says (its current publisher sends them empty).
  absl::Status ObjectKey(const object* key, std::vector<EngineHash>* hashes,
                         bool* named) {
    *named = false;
    if (IsNull(key)) return absl::OkStatus();
    if (key->type != mtype::STR) {
      return WrongType(kObjectKey, *key, "a str or nil");
    }
    const std::optional<EngineHash> h = EngineHashOfObjectKey(Str(*key));
    if (!h.has_value()) return absl::OkStatus();
    if (!allowance_->Take(sizeof(EngineHash))) return TooDense();
    hashes->assign(1, *h);
    *named = true;
    return absl::OkStatus();
  }

  // remaining_copy_counts (vLLM): one count per hash of block_hashes, the
  // engine's copies of that block left after this removal. A block with a
  // copy left is still held, so its hash leaves the event. Nil: no count,
  // every hash is removed.
  absl::Status DropCopiesLeft(const Value& counts, BlockRemovedEvent* ev) {
    const object* o = counts.get();
    if (IsNull(o)) return absl::OkStatus();
    if (o->type != mtype::ARRAY) {
      return WrongType(kRemainingCopyCounts, *o, "an array or nil");
    }
    std::vector<EngineHash>& hashes = ev->block_hashes;
    if (o->via.array.size != hashes.size()) {
      return Error(absl::StrCat("remaining_copy_counts has ", o->via.array.size,
                                " counts for ", hashes.size(),
                                " block_hashes, want one per hash"));
    }
    size_t pos = counts.pos;
    reader_.Enter(&pos);
    size_t kept = 0;
    for (size_t i = 0; i < hashes.size(); ++i) {
      const Value c = reader_.Read(&pos);
      if (c.head.type == mtype::NEGATIVE_INTEGER) {
        return Error(absl::StrCat("remaining_copy_counts[", i, "] ",
                                  c.head.via.i64, " is negative"));
      }
      if (c.head.type != mtype::POSITIVE_INTEGER) {
        return Error(absl::StrCat("remaining_copy_counts[", i, "] is a ",
                                  TypeName(c.head), ", want an int >= 0"));
      }
      if (c.head.via.u64 == 0) hashes[kept++] = hashes[i];
    }
    hashes.resize(kept);
    return absl::OkStatus();
  }

  // block_hashes, read into the event by ReadField.
  absl::Status BlockHashes(const object* o) {
    if (IsNull(o)) return Error("block_hashes is missing");
    if (o->type != mtype::ARRAY) {
      return WrongType(kBlockHashes, *o, "an array");
    }
    if (bad_hash_.found) {
      return Error(absl::StrCat("block_hashes[", bad_hash_.index, "] is a ",
                                TypeName(bad_hash_.head),
                                ", want an int or bytes"));
    }
    return absl::OkStatus();
  }

  static bool IsEmptyArray(const object* o) {
    return o != nullptr && o->type == mtype::ARRAY && o->via.array.size == 0;
  }

  // A placeholder's block_size: nil, 0 or the offloaded block's size.
  absl::Status PlaceholderBlockSize(const object* size, int64_t* out) {
    *out = 0;
    if (IsNull(size)) return absl::OkStatus();
    if (!IsInt(*size)) return WrongType(kBlockSize, *size, "an int >= 0");
    if (!ToInt64(*size, out) || *out < 0) {
      return Error(absl::StrCat("block_size ", IntText(*size),
                                " is not an int >= 0 (token_ids is empty: "
                                "want 0 or the offloaded block's size)"));
    }
    return absl::OkStatus();
  }

  absl::Status BlockSize(const object* size, int64_t* out) {
    if (IsNull(size)) return Error("block_size is missing");
    if (!IsInt(*size)) return WrongType(kBlockSize, *size, "a positive int");
    if (!ToInt64(*size, out) || *out <= 0) {
      return Error(
          absl::StrCat("block_size ", IntText(*size), " is not positive"));
    }
    return absl::OkStatus();
  }

  // token_ids: an array of block_hashes * block_size elements, or of more
  // whole blocks than block_hashes names (BlockStoredEvent::sparse).
  absl::Status TokenCount(const object* tokens, BlockStoredEvent* ev) {
    if (tokens->type != mtype::ARRAY) {
      return WrongType(kTokenIds, *tokens, "an array");
    }
    const uint64_t blocks = ev->block_hashes.size();
    const uint64_t count = tokens->via.array.size;
    const uint64_t bs = static_cast<uint64_t>(ev->block_size);
    // A huge block_size must not wrap the product around to the count.
    const bool fits =
        blocks == 0 || bs <= std::numeric_limits<uint64_t>::max() / blocks;
    ev->sparse = fits && count > blocks * bs && count % bs == 0;
    if (!fits || (count != blocks * bs && !ev->sparse)) {
      return Error(absl::StrCat(
          "token_ids has ", count, " tokens, want block_hashes * block_size = ",
          blocks, " * ", bs, fits ? absl::StrCat(" = ", blocks * bs) : "",
          " or more whole blocks"));
    }
    return absl::OkStatus();
  }

  // TensorRT-LLM's blocks whose content is more than their token ids end
  // the indexed chain (BlockStoredEvent::chain_blocks), as unreadable
  // extra keys do: a token given as text (its EventTokenId is int | str),
  // and a block with multimodal keys (mm_keys, one list per block), which
  // a prompt's token ids alone would match falsely.
  absl::Status EndChainAtOpaqueBlocks(const Value* fields,
                                      BlockStoredEvent* ev) {
    size_t end = ev->chain_blocks;
    if (text_token_ != kNoTextToken && ev->block_size > 0) {
      end = std::min<size_t>(
          end, text_token_ / static_cast<uint64_t>(ev->block_size));
    }
    const Value& mm = fields[kMmKeys];
    if (mm.present() && !IsNull(mm.get())) {
      if (mm.head.type != mtype::ARRAY) {
        return WrongType(kMmKeys, mm.head, "an array or nil");
      }
      size_t pos = mm.pos;
      reader_.Enter(&pos);
      const size_t entries = std::min<size_t>(mm.head.via.array.size, end);
      for (size_t i = 0; i < entries; ++i) {
        const Value entry = reader_.Read(&pos);
        if (!IsNull(entry.get()) && !IsEmptyArray(entry.get())) {
          end = i;
          break;
        }
      }
    }
    if (end >= ev->chain_blocks) return absl::OkStatus();
    ev->chain_blocks = end;
    BlockContent& c = ev->content;
    if (!c.empty()) {
      c.begin.resize(end + 1);
      c.keys.resize(c.begin.back());
    }
    return absl::OkStatus();
  }

  // token_ids' elements, token ids (0 <= id < 2^32), read into the event by
  // ReadField. A token given as text is left for EndChainAtOpaqueBlocks
  // (not in a sparse store, whose tokens run past its blocks).
  absl::Status TokenIds(bool sparse) {
    text_token_ = kNoTextToken;
    if (bad_token_.found && bad_token_.head.type == mtype::STR && !sparse) {
      text_token_ = bad_token_.index;
      return absl::OkStatus();
    }
    if (bad_token_.found) {
      const object& t = bad_token_.head;
      const uint32_t i = bad_token_.index;
      if (!IsInt(t)) {
        return Error(absl::StrCat("token_ids[", i, "] is a ", TypeName(t),
                                  ", want an int"));
      }
      return Error(absl::StrCat("token_ids[", i, "] = ", IntText(t),
                                " is not a token id (0 <= id < 2^32)"));
    }
    return absl::OkStatus();
  }

  // token_ids of EAGLE's bigram pages (SGLang's radix cache under
  // speculative decoding): pairs [t_i, t_i+1], each starting with the token
  // the one before ends with. token_ids gets the pairs' first tokens and
  // bigram_after_ the last pair's second, the token after the last block.
  absl::Status BigramTokenIds(const Value& tokens, BlockStoredEvent* ev) {
    size_t pos = tokens.pos;
    reader_.Enter(&pos);
    const size_t count = tokens.head.via.array.size;
    if (ev->token_ids.size() != count) return TooDense();  // not sized
    Token last = 0;
    for (size_t i = 0; i < count; ++i) {
      const Value pair = reader_.Enter(&pos);
      if (pair.head.type != mtype::ARRAY || pair.head.via.array.size != 2) {
        const std::string what =
            pair.head.type == mtype::ARRAY
                ? absl::StrCat("an array of ", pair.head.via.array.size)
                : absl::StrCat("a ", TypeName(pair.head));
        return Error(absl::StrCat(
            "token_ids[", i, "] is ", what,
            ", want a pair [token, next token] as token_ids[0] is"));
      }
      const Value first = reader_.Read(&pos);
      const Value second = reader_.Read(&pos);
      for (const Value* t : {&first, &second}) {
        if (!IsToken(t->head)) {
          return Error(absl::StrCat("token_ids[", i, "][", t == &second,
                                    "] is not a token id (0 <= id < 2^32)"));
        }
      }
      const Token a = static_cast<Token>(first.head.via.u64);
      if (i > 0 && a != last) {
        return Error(absl::StrCat("token_ids[", i, "] starts with ", a,
                                  " but token_ids[", i - 1, "] ends with ",
                                  last, ": bigram pairs overlap by a token"));
      }
      ev->token_ids[i] = a;
      last = static_cast<Token>(second.head.via.u64);
    }
    bigram_after_ = last;
    return absl::OkStatus();
  }

  // A bigram store's chained blocks get the token after each as a content
  // key: the next block's first token, or for the last, bigram_after_.
  absl::Status AddNextTokens(BlockStoredEvent* ev) {
    const size_t chained = ev->chain_blocks;
    if (!allowance_->Take(
            DecodeAllowance::ArrayBytes(chained, sizeof(ContentKey)) +
            DecodeAllowance::ArrayBytes(chained + 1, sizeof(uint32_t)))) {
      return TooDense();
    }
    ev->content = WithNextTokens(&ev->content, ev->token_ids,
                                 static_cast<size_t>(ev->block_size), chained,
                                 bigram_after_);
    return absl::OkStatus();
  }

  static bool IsMap(const object* o) {
    return o != nullptr && o->type == mtype::MAP;
  }
  static bool IsArray(const object* o) {
    return o != nullptr && o->type == mtype::ARRAY;
  }

  // SGLang's component_types: nil, or a list of names, each a str; the
  // names it does not have are left out, as its own indexer does.
  absl::Status Components(const Value& list, uint32_t* out) {
    *out = 0;
    const object* o = list.get();
    if (IsNull(o)) return absl::OkStatus();
    if (o->type != mtype::ARRAY) {
      return WrongType(kComponentTypes, *o, "an array or nil");
    }
    size_t pos = list.pos;
    reader_.Enter(&pos);
    for (uint32_t i = 0; i < o->via.array.size; ++i) {
      const Value name = reader_.Read(&pos);
      if (name.head.type != mtype::STR) {
        return Error(absl::StrCat("component_types[", i, "] is a ",
                                  TypeName(name.head), ", want a str"));
      }
      *out |= ComponentBit(Str(name.head));
    }
    return absl::OkStatus();
  }

  // SGLang's metadata map in field f's slot: its "cache_salt", if any.
  absl::Status Metadata(Field f, const Value& map, std::string* salt) {
    static constexpr absl::string_view kKeys[] = {"cache_salt"};
    Value v[1];
    reader_.MapValues(map, kKeys, v);
    const object* s = v[0].get();
    if (IsNull(s)) return absl::OkStatus();
    if (s->type != mtype::STR) {
      return Error(absl::StrCat(kFieldNames[f],
                                " is SGLang's metadata, whose cache_salt is a ",
                                TypeName(*s), ", want a str"));
    }
    if (!TakeString(s->via.str.size)) return TooDense();
    salt->assign(s->via.str.ptr, s->via.str.size);
    return absl::OkStatus();
  }

  absl::Status Parent(const object* parent, std::optional<EngineHash>* out) {
    if (IsNull(parent)) {
      out->reset();
      return absl::OkStatus();
    }
    EngineHash h;
    if (!ToHash(*parent, &h)) {
      return WrongType(kParentBlockHash, *parent, "an int, bytes or nil");
    }
    *out = h;
    return absl::OkStatus();
  }

  absl::Status LoraName(const object* o, std::optional<std::string>* out) {
    if (IsNull(o)) {
      out->reset();
    } else if (o->type == mtype::STR) {
      if (!TakeString(o->via.str.size)) return TooDense();
      // Assigned in place: a reused event keeps the string's capacity.
      if (out->has_value()) {
        (*out)->assign(o->via.str.ptr, o->via.str.size);
      } else {
        out->emplace(Str(*o));
      }
    } else {
      return WrongType(kLoraName, *o, "a str or nil");
    }
    return absl::OkStatus();
  }

  // The KV-cache group's kind (lower-cased) and sliding window.
  absl::Status GroupSpec(const object* const* f, BlockStoredEvent* ev) {
    RETURN_IF_ERROR(
        Name(kKvCacheSpecKind, f[kKvCacheSpecKind], &ev->kv_cache_spec_kind));
    absl::AsciiStrToLower(&ev->kv_cache_spec_kind);
    RETURN_IF_ERROR(IntOrZero(kKvCacheSpecSlidingWindow,
                              f[kKvCacheSpecSlidingWindow],
                              &ev->kv_cache_spec_sliding_window));
    if (ev->kv_cache_spec_sliding_window < 0) {
      return Error(absl::StrCat("kv_cache_spec_sliding_window ",
                                ev->kv_cache_spec_sliding_window,
                                " is negative"));
    }
    return absl::OkStatus();
  }

  absl::Status OptionalInt(Field field, const object* o,
                           std::optional<int64_t>* out) {
    if (IsNull(o)) {
      out->reset();
      return absl::OkStatus();
    }
    int64_t v;
    if (!IsInt(*o)) return WrongType(field, *o, "an int or nil");
    if (!ToInt64(*o, &v)) {
      return Error(absl::StrCat(kFieldNames[field], " ", IntText(*o),
                                " is out of range"));
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status IntOrZero(Field field, const object* o, int64_t* out) {
    std::optional<int64_t> v;
    RETURN_IF_ERROR(OptionalInt(field, o, &v));
    *out = v.value_or(0);
    return absl::OkStatus();
  }

  // A str or nil (then "").
  absl::Status Name(Field field, const object* o, std::string* out) {
    if (IsNull(o)) {
      out->clear();
      return absl::OkStatus();
    }
    if (o->type != mtype::STR) return WrongType(field, *o, "a str or nil");
    if (!TakeString(o->via.str.size)) return TooDense();
    out->assign(o->via.str.ptr, o->via.str.size);
    return CheckName(kFieldNames[field], *out);
  }

  // Room in the allowance for a string of `size` chars.
  bool TakeString(size_t size) {
    return allowance_->Take(DecodeAllowance::StringBytes(size));
  }

  // Names end up in answers and labels (index/wire_names.h).
  absl::Status CheckName(absl::string_view field, absl::string_view value) {
    if (absl::Status s = CheckWireName(field, value); !s.ok()) {
      return Error(s.message());
    }
    return absl::OkStatus();
  }

  // A str, upper-cased, or `if_null`.
  absl::Status UpperName(Field field, const object* o, const char* if_null,
                         std::string* out) {
    if (IsNull(o)) {
      *out = if_null;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(Name(field, o, out));
    absl::AsciiStrToUpper(out);
    return absl::OkStatus();
  }

  // A field read only to be checked: a str or nil.
  absl::Status Known(Field field, const object* o) {
    if (IsNull(o) || o->type == mtype::STR) return absl::OkStatus();
    return WrongType(field, *o, "a str or nil");
  }

  const Reader& reader_;
  DecodeAllowance* const allowance_;
  KvEventBatch* const out_;
  size_t used_ = 0;         // events of out_->events filled so far
  uint32_t index_ = 0;      // of the event being decoded, in the batch
  absl::string_view type_;  // its type name, once known
  // The event's vectors ReadField reads into (NewEvent), and their first
  // elements that are not hashes or token ids.
  std::vector<EngineHash>* hashes_ = nullptr;
  std::vector<Token>* tokens_ = nullptr;
  BadElement bad_hash_;
  BadElement bad_token_;
  Token bigram_after_ = 0;  // see BigramTokenIds
  // The first token given as text in the store's token_ids (TokenIds).
  static constexpr uint64_t kNoTextToken = UINT64_MAX;
  uint64_t text_token_ = kNoTextToken;
};

absl::Status BatchError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("event batch: ", what));
}

constexpr double kMaxTs = 4102444800;  // 2100-01-01T00:00:00Z

absl::Status Ts(const object* o, double* ts) {
  if (o == nullptr) return BatchError("ts is missing");
  switch (o->type) {
    case mtype::POSITIVE_INTEGER:
      // Mooncake's store master stamps its batches in integer milliseconds
      // (vLLM and SGLang in seconds): an integer past 2100 in seconds is
      // milliseconds.
      *ts = static_cast<double>(o->via.u64);
      if (*ts >= kMaxTs && *ts < kMaxTs * 1000) *ts /= 1000;
      break;
    case mtype::NEGATIVE_INTEGER:
      *ts = static_cast<double>(o->via.i64);
      break;
    case mtype::FLOAT32:
    case mtype::FLOAT64:
      *ts = o->via.f64;
      break;
    default:
      return BatchError(
          absl::StrCat("ts is a ", TypeName(*o), ", want a number"));
  }
  // Seconds since the epoch, before 2100: lags stay within int64
  // nanoseconds, and a NaN or infinite clock is refused, not histogrammed.
  if (!(*ts >= 0 && *ts < kMaxTs)) {
    return BatchError(absl::StrCat("ts ", *ts, " is not within [0, ",
                                   static_cast<int64_t>(kMaxTs),
                                   ") seconds since the epoch"));
  }
  return absl::OkStatus();
}

absl::Status Rank(const object* o, std::optional<int64_t>* rank) {
  rank->reset();
  if (IsNull(o)) return absl::OkStatus();
  int64_t v;
  if (!IsInt(*o)) {
    return BatchError(absl::StrCat("data_parallel_rank is a ", TypeName(*o),
                                   ", want an int or nil"));
  }
  if (!ToInt64(*o, &v) || v < 0 || v >= kMaxDataParallelRanks) {
    return BatchError(absl::StrCat("data_parallel_rank ", IntText(*o),
                                   " is not within [0, ", kMaxDataParallelRanks,
                                   ")"));
  }
  *rank = v;
  return absl::OkStatus();
}

// The batch: [ts, events, data_parallel_rank] (msgspec's array_like,
// trailing defaults omitted) or a map of them. The events are decoded
// where the pass over the payload meets them; their error waits until ts
// and data_parallel_rank are checked, whose errors come first.
class BatchDecoder {
 public:
  BatchDecoder(const Reader& reader, size_t payload_bytes, KvEventBatch* out)
      : reader_(reader), allowance_(payload_bytes), out_(out) {}

  // *end: where the batch ends in the payload (once it decoded). The pass
  // reads every byte of the batch, so that its reads check them all.
  absl::Status Decode(size_t* end) {
    size_t& pos = *end;
    pos = 0;
    const Value root = reader_.Enter(&pos);
    uint64_t unknown = 0;  // the batch's own unknown fields
    if (root.head.type == mtype::ARRAY) {
      const uint32_t size = root.head.via.array.size;
      if (size > 0) ts_ = reader_.Read(&pos);
      if (size > 1) ReadEvents(&pos);
      if (size > 2) rank_ = reader_.Read(&pos);
      for (uint32_t j = 3; j < size; ++j) reader_.Read(&pos);
      if (size > 3) unknown = size - 3;
    } else if (root.head.type == mtype::MAP) {
      for (uint32_t j = 0; j < root.head.via.map.size; ++j) {
        const Value key = reader_.Read(&pos);
        const absl::string_view name =
            key.head.type == mtype::STR ? Str(key.head) : absl::string_view();
        if (key.head.type == mtype::STR && name == "ts") {
          ts_ = reader_.Read(&pos);
        } else if (key.head.type == mtype::STR && name == "events") {
          ReadEvents(&pos);
        } else if (key.head.type == mtype::STR &&
                   name == "data_parallel_rank") {
          rank_ = reader_.Read(&pos);
        } else {
          ++unknown;
          reader_.Read(&pos);
        }
      }
    } else {
      return BatchError(absl::StrCat("the payload is a ", TypeName(root.head),
                                     ", want an array or a map"));
    }
    return Check(unknown);
  }

 private:
  // The events at *pos, decoded if they are an array; *pos past them. A
  // map's later "events" replaces an earlier one.
  void ReadEvents(size_t* pos) {
    const size_t start = *pos;
    events_ = reader_.Enter(pos);
    events_status_ = absl::OkStatus();
    if (events_.head.type == mtype::ARRAY) {
      out_->unknown_events = 0;
      out_->unknown_fields = 0;
      events_status_ =
          EventDecoder(reader_, &allowance_, out_).Decode(events_, pos);
      if (events_status_.ok()) return;
    }
    *pos = start;
    reader_.Read(pos);
  }

  absl::Status Check(uint64_t unknown) {
    RETURN_IF_ERROR(Ts(ts_.get(), &out_->ts));
    if (!events_.present()) return BatchError("events is missing");
    if (events_.head.type != mtype::ARRAY) {
      return BatchError(absl::StrCat("events is a ", TypeName(events_.head),
                                     ", want an array"));
    }
    RETURN_IF_ERROR(Rank(rank_.get(), &out_->data_parallel_rank));
    RETURN_IF_ERROR(events_status_);
    out_->unknown_fields += unknown;
    return absl::OkStatus();
  }

  const Reader& reader_;
  DecodeAllowance allowance_;  // a map's later "events" decodes on it too
  KvEventBatch* const out_;
  Value ts_;
  Value events_;
  Value rank_;
  absl::Status events_status_;
};

}  // namespace

EngineHash FoldHashBytes(absl::string_view bytes) {
  return static_cast<EngineHash>(absl::Hash<absl::string_view>{}(bytes));
}

absl::Status DecodeEventBatch(absl::string_view payload, KvEventBatch* out) {
  out->ts = 0;
  out->data_parallel_rank.reset();
  out->unknown_events = 0;
  out->unknown_fields = 0;

  // One pass, whose reads check the payload as they go. Should anything be
  // wrong, the payload's own errors come first, as the first of them in the
  // payload, then what the batch says: as if it had been checked whole
  // before it was decoded (and it is, then).
  absl::Status decoded;
  size_t end = 0;
  bool read_refused = false;
  try {
    const Reader reader(payload,
                        Limits(payload.size(), kMaxDepth - kDeepestRead));
    decoded = BatchDecoder(reader, payload.size(), out).Decode(&end);
  } catch (const std::exception&) {
    read_refused = true;
  }
  if (!read_refused && decoded.ok() && end == payload.size()) return decoded;
  try {
    msgpack_view::CheckPayload(payload, Limits(payload.size()), &end);
  } catch (const msgpack::unpack_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload is not valid msgpack: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::InvalidArgumentError(
        "payload is not valid msgpack: it declares more than fits in memory");
  } catch (const std::exception& e) {
    // Nothing else is documented to come out of the parser; still, no
    // exception may leave the decoder.
    return absl::InvalidArgumentError(
        absl::StrCat("payload could not be unpacked: ", e.what()));
  }
  if (end != payload.size()) {
    return BatchError(absl::StrCat(payload.size() - end,
                                   " trailing bytes after the batch (", end,
                                   " bytes)"));
  }
  if (!read_refused) return decoded;
  // The payload is fine, but nests deeper than a read allowed from where
  // it started (kDeepestRead): read it again without limits.
  const Reader unlimited(payload, msgpack::unpack_limit());
  return BatchDecoder(unlimited, payload.size(), out).Decode(&end);
}

}  // namespace prefixd
