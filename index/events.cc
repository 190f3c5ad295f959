// Decoding walks msgpack-cxx's object tree in place: one unpack per payload,
// then type switches on each msgpack::object, with no conversion through STL
// containers on the way (the ingest path handles millions of blocks a second
// on one thread). Strings and bytes point into the payload, not copies.
#include "index/events.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "index/extra_keys.h"
#include "index/msgpack_view.h"
#include "index/wire_names.h"

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

// Bounds on what one payload may declare (a fuzzed or hostile payload must
// not exhaust memory). Real batches stay far below them: a batch holds
// hundreds of events, and extra_keys nest about six levels deep.
constexpr size_t kMaxArray = size_t{1} << 24;
constexpr size_t kMaxMap = size_t{1} << 16;
constexpr size_t kMaxBytes = size_t{1} << 24;  // one str, bin or ext
constexpr size_t kMaxDepth = 32;

// msgpack-cxx allocates a container's elements as soon as it reads the
// declared count, before their bytes arrive. Every array element takes at
// least one byte and every map entry two, so a count is also capped by the
// payload's size: a few bytes cannot ask for hundreds of megabytes.
msgpack::unpack_limit Limits(size_t payload_size) {
  return msgpack::unpack_limit(std::min(kMaxArray, payload_size),
                               std::min(kMaxMap, payload_size / 2), kMaxBytes,
                               kMaxBytes, kMaxBytes, kMaxDepth);
}

// Strings, bytes and exts reference the payload instead of being copied
// into the zone: the payload outlives the object tree (both live within
// DecodeEventBatch). msgpack-cxx checks the size limits only on the copy
// path, so oversized ones take it and are refused there.
bool ReferenceInPayload(mtype::object_type /*type*/, size_t size,
                        void* /*user_data*/) {
  return size <= kMaxBytes;
}

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
    {"tenant_id", -1},
    {"model_name", -1},
    {"event_id", -1},
    {"timestamp", -1},
};

// Map form only (they have no place in the array form).
constexpr Field kStoredMapFields[] = {kAdditionalSalt};

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

absl::Span<const Field> FieldsOf(Kind kind) {
  switch (kind) {
    case Kind::kStored:
      return kStoredFields;
    case Kind::kRemoved:
      return kRemovedFields;
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

// Decodes the events of one batch. Errors name the event's index in the
// batch, its type and the field.
class EventDecoder {
 public:
  explicit EventDecoder(KvEventBatch* out) : out_(out) {}

  absl::Status Decode(const object& events) {
    // Allocated once: a growing vector holds its old and new arrays at
    // once, and an event takes hundreds of bytes from as few as 18.
    out_->events.reserve(events.via.array.size);
    for (uint32_t i = 0; i < events.via.array.size; ++i) {
      index_ = i;
      type_ = "";
      if (absl::Status s = DecodeEvent(events.via.array.ptr[i]); !s.ok()) {
        return s;
      }
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

  absl::Status WrongType(Field f, const object& o,
                         absl::string_view want) const {
    return Error(
        absl::StrCat(kFieldNames[f], " is a ", TypeName(o), ", want ", want));
  }

  absl::Status DecodeEvent(const object& ev) {
    const object* fields[kNumFields] = {};
    Kind kind;
    if (ev.type == mtype::ARRAY) {
      RETURN_IF_ERROR(ArrayFields(ev, fields, &kind));
    } else if (ev.type == mtype::MAP) {
      RETURN_IF_ERROR(MapFields(ev, fields, &kind));
    } else {
      return Error(absl::StrCat("an event is a ", TypeName(ev),
                                ", want an array or a map"));
    }
    switch (kind) {
      case Kind::kStored:
        return DecodeStored(fields,
                            &NextSlot<BlockStoredEvent>(&out_->events, &used_));
      case Kind::kRemoved:
        return DecodeRemoved(
            fields, &NextSlot<BlockRemovedEvent>(&out_->events, &used_));
      case Kind::kCleared:
        NextSlot<AllBlocksClearedEvent>(&out_->events, &used_);
        return absl::OkStatus();
      case Kind::kUnknown:
        ++out_->unknown_events;
        break;
    }
    return absl::OkStatus();
  }

  // ["BlockStored", field, field, ...]: fields by position.
  absl::Status ArrayFields(const object& ev, const object** fields,
                           Kind* kind) {
    const object* items = ev.via.array.ptr;
    const uint32_t size = ev.via.array.size;
    if (size == 0 || items[0].type != mtype::STR) {
      return Error("an array event must start with its type name (a str)");
    }
    type_ = Str(items[0]);
    *kind = KindOf(type_);
    if (*kind == Kind::kUnknown) return absl::OkStatus();
    const absl::Span<const Field> known = FieldsOf(*kind);
    for (uint32_t j = 1; j < size; ++j) {
      if (j - 1 < known.size()) {
        fields[known[j - 1]] = &items[j];
      } else {
        ++out_->unknown_fields;
      }
    }
    return absl::OkStatus();
  }

  // {"type": "BlockStored", name: field, ...} (vLLM), or RFC #1527's
  // {"event_type": "stored", ...}: fields by name.
  absl::Status MapFields(const object& ev, const object** fields, Kind* kind) {
    const object* type = MapValue(ev, "type");
    if (type == nullptr) type = MapValue(ev, "event_type");
    if (type == nullptr || type->type != mtype::STR) {
      return Error("a map event must have a str \"type\" (or \"event_type\")");
    }
    type_ = Str(*type);
    *kind = KindOf(type_);
    if (*kind == Kind::kUnknown) return absl::OkStatus();
    const absl::Span<const Field> known = FieldsOf(*kind);
    const msgpack::object_kv* kvs = ev.via.map.ptr;
    for (uint32_t j = 0; j < ev.via.map.size; ++j) {
      if (kvs[j].key.type != mtype::STR) {
        ++out_->unknown_fields;
        continue;
      }
      const absl::string_view name = Str(kvs[j].key);
      if (name == "type") continue;
      const int f = MapField(*kind, known, name);
      if (f == kUnknownField) {
        ++out_->unknown_fields;
      } else if (f >= 0 && fields[f] == nullptr) {
        fields[f] = &kvs[j].val;
      }
    }
    return absl::OkStatus();
  }

  static constexpr int kUnknownField = -2;
  // The Field a map key names (-1: known, not used), or kUnknownField.
  static int MapField(Kind kind, absl::Span<const Field> known,
                      absl::string_view name) {
    for (Field f : known) {
      if (kFieldNames[f] == name) return f;
    }
    if (kind == Kind::kStored) {
      for (Field f : kStoredMapFields) {
        if (kFieldNames[f] == name) return f;
      }
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

  absl::Status DecodeStored(const object* const* f, BlockStoredEvent* ev) {
    RETURN_IF_ERROR(BlockHashes(f[kBlockHashes], &ev->block_hashes));
    if (IsNull(f[kTokenIds])) {
      // A store of hashes alone (RFC #1527's storage daemons): placed by
      // its keys, if its worker's hashes are the index's keys.
      ev->token_ids.clear();
      ev->block_size = 0;
      if (!IsNull(f[kBlockSize])) {
        RETURN_IF_ERROR(BlockSize(f[kBlockSize], &ev->block_size));
      }
    } else {
      RETURN_IF_ERROR(BlockSize(f[kBlockSize], &ev->block_size));
      RETURN_IF_ERROR(TokenIds(f[kTokenIds], ev));
    }
    RETURN_IF_ERROR(Parent(f[kParentBlockHash], &ev->parent_block_hash));
    RETURN_IF_ERROR(OptionalInt(kLoraId, f[kLoraId], &ev->lora_id));
    RETURN_IF_ERROR(UpperName(kMedium, f[kMedium], "GPU", &ev->medium));
    RETURN_IF_ERROR(LoraName(f[kLoraName], &ev->lora_name));
    RETURN_IF_ERROR(IntOrZero(kGroupIdx, f[kGroupIdx], &ev->group_idx));
    RETURN_IF_ERROR(GroupSpec(f, ev));
    RETURN_IF_ERROR(UpperName(kLocality, f[kLocality], "", &ev->locality));
    RETURN_IF_ERROR(Name(kOwnership, f[kOwnership], &ev->ownership));
    RETURN_IF_ERROR(Known(kSessionId, f[kSessionId]));
    RETURN_IF_ERROR(
        IntOrZero(kEventVersion, f[kEventVersion], &ev->event_version));
    if (!ReadExtraKeys(f[kExtraKeys], ev)) {
      return WrongType(kExtraKeys, *f[kExtraKeys], "an array or nil");
    }
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

  absl::Status DecodeRemoved(const object* const* f, BlockRemovedEvent* ev) {
    RETURN_IF_ERROR(BlockHashes(f[kBlockHashes], &ev->block_hashes));
    RETURN_IF_ERROR(UpperName(kMedium, f[kMedium], "GPU", &ev->medium));
    RETURN_IF_ERROR(IntOrZero(kGroupIdx, f[kGroupIdx], &ev->group_idx));
    RETURN_IF_ERROR(UpperName(kLocality, f[kLocality], "", &ev->locality));
    RETURN_IF_ERROR(Name(kOwnership, f[kOwnership], &ev->ownership));
    return IntOrZero(kEventVersion, f[kEventVersion], &ev->event_version);
  }

  absl::Status BlockHashes(const object* o, std::vector<EngineHash>* out) {
    if (IsNull(o)) return Error("block_hashes is missing");
    if (o->type != mtype::ARRAY) {
      return WrongType(kBlockHashes, *o, "an array");
    }
    const uint32_t n = o->via.array.size;
    out->resize(n);
    EngineHash* dst = out->data();
    const object* src = o->via.array.ptr;
    for (uint32_t i = 0; i < n; ++i) {
      if (!ToHash(src[i], &dst[i])) {
        return Error(absl::StrCat("block_hashes[", i, "] is a ",
                                  TypeName(src[i]), ", want an int or bytes"));
      }
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

  // token_ids: block_hashes * block_size token ids (0 <= id < 2^32).
  absl::Status TokenIds(const object* tokens, BlockStoredEvent* ev) {
    if (tokens->type != mtype::ARRAY) {
      return WrongType(kTokenIds, *tokens, "an array");
    }
    const uint64_t blocks = ev->block_hashes.size();
    const uint64_t count = tokens->via.array.size;
    const uint64_t bs = static_cast<uint64_t>(ev->block_size);
    // A huge block_size must not wrap the product around to the count.
    const bool fits =
        blocks == 0 || bs <= std::numeric_limits<uint64_t>::max() / blocks;
    if (!fits || count != blocks * bs) {
      return Error(absl::StrCat(
          "token_ids has ", count, " tokens, want block_hashes * block_size = ",
          blocks, " * ", bs, fits ? absl::StrCat(" = ", blocks * bs) : ""));
    }
    ev->token_ids.resize(count);
    Token* out = ev->token_ids.data();
    const object* in = tokens->via.array.ptr;
    for (uint64_t i = 0; i < count; ++i) {
      const object& t = in[i];
      if (t.type != mtype::POSITIVE_INTEGER ||
          t.via.u64 > std::numeric_limits<Token>::max()) {
        if (!IsInt(t)) {
          return Error(absl::StrCat("token_ids[", i, "] is a ", TypeName(t),
                                    ", want an int"));
        }
        return Error(absl::StrCat("token_ids[", i, "] = ", IntText(t),
                                  " is not a token id (0 <= id < 2^32)"));
      }
      out[i] = static_cast<Token>(t.via.u64);
    }
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
    out->assign(o->via.str.ptr, o->via.str.size);
    return CheckName(kFieldNames[field], *out);
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

  KvEventBatch* const out_;
  size_t used_ = 0;         // events of out_->events filled so far
  uint32_t index_ = 0;      // of the event being decoded, in the batch
  absl::string_view type_;  // its type name, once known
};

absl::Status BatchError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("event batch: ", what));
}

constexpr double kMaxTs = 4102444800;  // 2100-01-01T00:00:00Z

absl::Status Ts(const object* o, double* ts) {
  if (o == nullptr) return BatchError("ts is missing");
  switch (o->type) {
    case mtype::POSITIVE_INTEGER:
      *ts = static_cast<double>(o->via.u64);
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

}  // namespace

EngineHash FoldHashBytes(absl::string_view bytes) {
  return static_cast<EngineHash>(absl::Hash<absl::string_view>{}(bytes));
}

absl::Status DecodeEventBatch(absl::string_view payload, KvEventBatch* out) {
  out->ts = 0;
  out->data_parallel_rank.reset();
  out->unknown_events = 0;
  out->unknown_fields = 0;

  msgpack::object_handle handle;
  size_t offset = 0;
  try {
    bool referenced;
    msgpack::unpack(handle, payload.data(), payload.size(), offset, referenced,
                    ReferenceInPayload, nullptr, Limits(payload.size()));
  } catch (const msgpack::unpack_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload is not valid msgpack: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::InvalidArgumentError(
        "payload is not valid msgpack: it declares more than fits in memory");
  } catch (const std::exception& e) {
    // Nothing else is documented to come out of unpack; still, no exception
    // may leave the decoder.
    return absl::InvalidArgumentError(
        absl::StrCat("payload could not be unpacked: ", e.what()));
  }
  if (offset != payload.size()) {
    return BatchError(absl::StrCat(payload.size() - offset,
                                   " trailing bytes after the batch (", offset,
                                   " bytes)"));
  }

  const object& root = handle.get();
  const object* ts = nullptr;
  const object* events = nullptr;
  const object* rank = nullptr;
  if (root.type == mtype::ARRAY) {
    // msgspec array_like: [ts, events, data_parallel_rank], trailing
    // defaults omitted.
    const uint32_t size = root.via.array.size;
    const object* items = root.via.array.ptr;
    if (size > 0) ts = &items[0];
    if (size > 1) events = &items[1];
    if (size > 2) rank = &items[2];
    if (size > 3) out->unknown_fields += size - 3;
  } else if (root.type == mtype::MAP) {
    for (uint32_t j = 0; j < root.via.map.size; ++j) {
      const msgpack::object_kv& kv = root.via.map.ptr[j];
      const absl::string_view key =
          kv.key.type == mtype::STR ? Str(kv.key) : absl::string_view();
      if (kv.key.type == mtype::STR && key == "ts") {
        ts = &kv.val;
      } else if (kv.key.type == mtype::STR && key == "events") {
        events = &kv.val;
      } else if (kv.key.type == mtype::STR && key == "data_parallel_rank") {
        rank = &kv.val;
      } else {
        ++out->unknown_fields;
      }
    }
  } else {
    return BatchError(absl::StrCat("the payload is a ", TypeName(root),
                                   ", want an array or a map"));
  }

  if (absl::Status s = Ts(ts, &out->ts); !s.ok()) return s;
  if (events == nullptr) return BatchError("events is missing");
  if (events->type != mtype::ARRAY) {
    return BatchError(
        absl::StrCat("events is a ", TypeName(*events), ", want an array"));
  }
  if (absl::Status s = Rank(rank, &out->data_parallel_rank); !s.ok()) return s;
  return EventDecoder(out).Decode(*events);
}

}  // namespace prefixd
