// FlatJson: a JSON object read one level deep, with its arrays of unsigned
// integers kept as plain vectors: what the Mooncake Conductor API's request
// bodies are (index/conductor_api.h). nlohmann-json parses (its SAX
// interface); this only keeps what a request needs: a 2k-token prompt's
// token_ids then cost no JSON value per token.
//
// The same object may come as MessagePack (BodyFormat::kMsgpack), which
// nlohmann reads into JSON's data model: Mooncake's current Conductor
// clients send it, with token_ids as one bin of little-endian int32. A bin
// member is therefore read as the array of its int32 (a negative one, or
// bytes past the last whole int32, is a bad entry). A body nested deeper
// than 32 levels is refused in either encoding (nlohmann reads MessagePack
// recursively).
//
//   absl::StatusOr<FlatJson> body = FlatJson::Parse(text);
//   absl::StatusOr<std::string> model = body->String("model", true);
//   absl::StatusOr<int64_t> bs = body->Int("block_size", 1, 1 << 16);
//   std::vector<uint32_t> tokens;
//   absl::Status s = body->List("token_ids", 1 << 20, UINT32_MAX, &tokens);
//
// Errors are INVALID_ARGUMENT naming the field and the numbers
// ("block_size: must be an integer, not string").
//
// Thread safety: a value; const methods may be called concurrently.
#ifndef PREFIXD_INDEX_FLAT_JSON_H_
#define PREFIXD_INDEX_FLAT_JSON_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace prefixd {

// How a request body is encoded (its Content-Type).
enum class BodyFormat { kJson, kMsgpack };

class FlatJson {
 public:
  // One member of the object.
  struct Field {
    enum class Kind {
      kNull,
      kString,
      kUnsigned,
      kSigned,
      kFloat,
      kBool,
      kArray,
      kObject
    };
    Kind kind = Kind::kNull;
    std::string text;  // kString: the string; kFloat: as written
    uint64_t unsigned_value = 0;
    int64_t signed_value = 0;  // kSigned (negative)
    // kArray: its entries while all are unsigned integers, how many it has,
    // and the first that is not (its index and JSON text).
    std::vector<uint64_t> numbers;
    size_t size = 0;
    std::optional<std::pair<size_t, std::string>> bad;

    // "string", "number", "array", ... as nlohmann names JSON types.
    absl::string_view TypeName() const;
  };

  // INVALID_ARGUMENT for text that is not JSON, or bytes that are not
  // MessagePack (naming the byte), or not an object (naming what it is).
  static absl::StatusOr<FlatJson> Parse(absl::string_view text,
                                        BodyFormat format = BodyFormat::kJson);

  bool Has(absl::string_view name) const;
  // OK when the member is absent, null or an object (whose members are not
  // read); INVALID_ARGUMENT naming what it is otherwise.
  absl::Status OptionalObject(absl::string_view name) const;
  // A string member; "" when absent or null and not `required`.
  absl::StatusOr<std::string> String(absl::string_view name,
                                     bool required) const;
  // A required integer member within [min, max].
  absl::StatusOr<int64_t> Int(absl::string_view name, int64_t min,
                              int64_t max) const;
  // The same, optional: nullopt when absent or null.
  absl::StatusOr<std::optional<int64_t>> OptionalInt(absl::string_view name,
                                                     int64_t min,
                                                     int64_t max) const;
  // A required array of at most `max_count` integers, each within
  // [0, max_value], appended to *out.
  template <typename T>
  absl::Status List(absl::string_view name, size_t max_count,
                    uint64_t max_value, std::vector<T>* out) const;

 private:
  friend class FlatJsonSax;
  const Field* Find(absl::string_view name) const;
  absl::Status CheckList(absl::string_view name, const Field* f,
                         size_t max_count, uint64_t max_value) const;

  std::map<std::string, Field, std::less<>> fields_;
};

template <typename T>
absl::Status FlatJson::List(absl::string_view name, size_t max_count,
                            uint64_t max_value, std::vector<T>* out) const {
  const Field* f = Find(name);
  if (absl::Status s = CheckList(name, f, max_count, max_value); !s.ok())
    return s;
  out->reserve(out->size() + f->numbers.size());
  for (uint64_t v : f->numbers) out->push_back(static_cast<T>(v));
  return absl::OkStatus();
}

}  // namespace prefixd

#endif  // PREFIXD_INDEX_FLAT_JSON_H_
