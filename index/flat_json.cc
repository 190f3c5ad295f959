#include "index/flat_json.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "base/status_macros.h"
#include "index/wire_names.h"

namespace prefixd {

using Json = nlohmann::json;
using Kind = FlatJson::Field::Kind;

absl::string_view FlatJson::Field::TypeName() const {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kString:
      return "string";
    case Kind::kUnsigned:
    case Kind::kSigned:
    case Kind::kFloat:
      return "number";
    case Kind::kBool:
      return "boolean";
    case Kind::kArray:
      return "array";
    case Kind::kObject:
      return "object";
  }
  return "unknown";
}

// nlohmann's SAX events into a FlatJson: depth 1 is the object's members,
// depth 2 the entries of a member that is an array; anything deeper only
// counts as that entry.
class FlatJsonSax final : public nlohmann::json_sax<Json> {
 public:
  static constexpr int kMaxDepth = 32;

  FlatJsonSax(FlatJson* out, BodyFormat format)
      : out_(out),
        format_name_(format == BodyFormat::kJson ? "JSON" : "MessagePack") {}

  bool null() override { return Scalar(Field(), "null"); }
  bool boolean(bool v) override {
    Field f;
    f.kind = Kind::kBool;
    return Scalar(std::move(f), v ? "true" : "false");
  }
  bool number_integer(number_integer_t v) override {
    // JSON's non-negative integers come as unsigned; MessagePack's may come
    // either way (an int8 of 5).
    if (v >= 0) return number_unsigned(static_cast<number_unsigned_t>(v));
    Field f;
    f.kind = Kind::kSigned;
    f.signed_value = v;
    return Scalar(std::move(f), absl::StrCat(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (depth_ == 2 && in_array_ && entry_depth_ == 0) {
      current_->numbers.push_back(v);
      ++current_->size;
      return true;
    }
    Field f;
    f.kind = Kind::kUnsigned;
    f.unsigned_value = v;
    return Scalar(std::move(f), absl::StrCat(v));
  }
  bool number_float(number_float_t, const string_t& text) override {
    Field f;
    f.kind = Kind::kFloat;
    f.text = text;
    return Scalar(std::move(f), text);
  }
  bool string(string_t& v) override {
    Field f;
    f.kind = Kind::kString;
    f.text = v;
    return Scalar(std::move(f),
                  Json(v).dump(-1, ' ', false, Json::error_handler_t::replace));
  }
  bool binary(binary_t& bytes) override {
    if (depth_ == 0) return Refuse("binary");
    if (depth_ != 1) return Scalar(Field(), "binary");
    out_->fields_[key_] = Int32s(bytes);
    return true;
  }
  bool start_object(std::size_t) override { return Open(Kind::kObject); }
  bool start_array(std::size_t) override { return Open(Kind::kArray); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override {
    if (depth_ == 1) key_ = k;
    return true;
  }
  bool parse_error(std::size_t byte, const std::string&,
                   const nlohmann::detail::exception& e) override {
    error_ = absl::InvalidArgumentError(absl::StrCat(
        "the body is not ", format_name_, " (byte ", byte, "): ", e.what()));
    return false;
  }

  absl::Status status() const { return error_; }

 private:
  using Field = FlatJson::Field;

  // A bin member: the array of its little-endian int32.
  static Field Int32s(const binary_t& bytes) {
    Field f;
    f.kind = Kind::kArray;
    f.size = (bytes.size() + 3) / 4;
    f.numbers.reserve(bytes.size() / 4);
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
      const uint32_t u = uint32_t{bytes[i]} | uint32_t{bytes[i + 1]} << 8 |
                         uint32_t{bytes[i + 2]} << 16 |
                         uint32_t{bytes[i + 3]} << 24;
      const int32_t v = static_cast<int32_t>(u);
      if (v < 0) {
        f.bad.emplace(i / 4, absl::StrCat(v));
        return f;
      }
      f.numbers.push_back(u);
    }
    if (bytes.size() % 4 != 0) {
      f.bad.emplace(
          bytes.size() / 4,
          absl::StrCat(bytes.size() % 4, " bytes past the last int32"));
    }
    return f;
  }

  // A value: the whole body (refused), a member, or an array's entry.
  bool Scalar(Field f, const std::string& text) {
    if (depth_ == 0) return Refuse(f.TypeName());
    if (depth_ == 1) {
      out_->fields_[key_] = std::move(f);
    } else if (depth_ == 2 && in_array_ && entry_depth_ == 0) {
      Entry(text);
    }
    return true;
  }
  void Entry(const std::string& text) {
    if (!current_->bad.has_value()) current_->bad.emplace(current_->size, text);
    ++current_->size;
  }
  bool Open(Kind kind) {
    if (depth_ == 0 && kind != Kind::kObject)
      return Refuse(kind == Kind::kArray ? "array" : "object");
    // nlohmann reads MessagePack recursively: a body of nested arrays must
    // not take the stack.
    if (depth_ == kMaxDepth) {
      error_ = absl::InvalidArgumentError(
          absl::StrCat("the body nests deeper than ", kMaxDepth, " levels"));
      return false;
    }
    if (depth_ == 1) {
      Field f;
      f.kind = kind;
      current_ = &(out_->fields_[key_] = std::move(f));
      in_array_ = kind == Kind::kArray;
    } else if (depth_ == 2 && in_array_) {
      if (entry_depth_ == 0) Entry(kind == Kind::kArray ? "[...]" : "{...}");
      ++entry_depth_;
    } else if (depth_ > 2 && in_array_) {
      ++entry_depth_;
    }
    ++depth_;
    return true;
  }
  bool Close() {
    --depth_;
    if (depth_ > 1 && in_array_) --entry_depth_;
    if (depth_ == 1) in_array_ = false;
    return true;
  }
  bool Refuse(absl::string_view type) {
    error_ = absl::InvalidArgumentError(absl::StrCat(
        "the body must be a ", format_name_, " object, not ", type));
    return false;
  }

  FlatJson* const out_;
  const char* const format_name_;
  int depth_ = 0;
  std::string key_;
  Field* current_ = nullptr;  // the member being read (depth 2)
  bool in_array_ = false;     // ... and it is an array
  int entry_depth_ = 0;       // containers open inside its current entry
  absl::Status error_;
};

absl::StatusOr<FlatJson> FlatJson::Parse(absl::string_view text,
                                         BodyFormat format) {
  FlatJson out;
  FlatJsonSax sax(&out, format);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &sax,
                                  format == BodyFormat::kJson
                                      ? Json::input_format_t::json
                                      : Json::input_format_t::msgpack);
  if (!sax.status().ok()) return sax.status();
  if (!ok) {
    return absl::InvalidArgumentError(format == BodyFormat::kJson
                                          ? "the body is not JSON"
                                          : "the body is not MessagePack");
  }
  return out;
}

absl::Status FlatJson::OptionalObject(absl::string_view name) const {
  const Field* f = Find(name);
  if (f == nullptr || f->kind == Kind::kObject) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": must be an object, not ", f->TypeName()));
}

const FlatJson::Field* FlatJson::Find(absl::string_view name) const {
  auto it = fields_.find(name);
  return it == fields_.end() || it->second.kind == Kind::kNull ? nullptr
                                                               : &it->second;
}

bool FlatJson::Has(absl::string_view name) const {
  return Find(name) != nullptr;
}

absl::StatusOr<std::string> FlatJson::String(absl::string_view name,
                                             bool required) const {
  const Field* f = Find(name);
  if (f == nullptr) {
    if (required)
      return absl::InvalidArgumentError(absl::StrCat(name, ": is required"));
    return std::string();
  }
  if (f->kind != Kind::kString) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": must be a string, not ", f->TypeName()));
  }
  // Every string of these requests names something (a model, LoRA, tenant,
  // instance, endpoint, salt) that may reach answers and labels.
  RETURN_IF_ERROR(CheckWireName(name, f->text));
  return f->text;
}

absl::StatusOr<int64_t> FlatJson::Int(absl::string_view name, int64_t min,
                                      int64_t max) const {
  const Field* f = Find(name);
  if (f == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(name, ": is required"));
  if (f->kind == Kind::kUnsigned &&
      f->unsigned_value > static_cast<uint64_t>(max)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", f->unsigned_value, " exceeds ", max));
  }
  if (f->kind != Kind::kUnsigned && f->kind != Kind::kSigned) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": must be an integer, not ", f->TypeName()));
  }
  const int64_t v = f->kind == Kind::kSigned
                        ? f->signed_value
                        : static_cast<int64_t>(f->unsigned_value);
  if (v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", v, " is outside ", min, "..", max));
  }
  return v;
}

absl::StatusOr<std::optional<int64_t>> FlatJson::OptionalInt(
    absl::string_view name, int64_t min, int64_t max) const {
  const Field* f = Find(name);
  if (f == nullptr || f->kind == Kind::kNull) return std::nullopt;
  return Int(name, min, max);
}

absl::Status FlatJson::CheckList(absl::string_view name, const Field* f,
                                 size_t max_count, uint64_t max_value) const {
  if (f == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(name, ": is required"));
  if (f->kind != Kind::kArray) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": must be an array, not ", f->TypeName()));
  }
  if (f->size > max_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", f->size, " entries exceed the limit of ", max_count));
  }
  size_t bad_index = f->size;
  std::string bad_text;
  if (f->bad.has_value()) std::tie(bad_index, bad_text) = *f->bad;
  for (size_t i = 0; i < f->numbers.size() && i < bad_index; ++i) {
    if (f->numbers[i] > max_value) {
      bad_index = i;
      bad_text = absl::StrCat(f->numbers[i]);
      break;
    }
  }
  if (bad_index < f->size) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": entry ", bad_index, " (", bad_text,
                     ") is not an integer in 0..", max_value));
  }
  return absl::OkStatus();
}

}  // namespace prefixd
