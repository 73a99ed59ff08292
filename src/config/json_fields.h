// Reading one JSON object member by member, for the CacheOptions readers (config.h): the text is
// parsed once (a key given twice in any object is refused, where a plain parse keeps the last),
// the keys are checked against the reader's list before any value is read, and each getter checks
// the type and range of one member and names it in its error.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sparsekv/status.h"

namespace sparsekv::config_internal {

using Json = nlohmann::json;

// Parses `text` as one JSON value. InvalidArgument, starting with `source`, when the text is not
// JSON or an object anywhere in it has a key twice.
StatusOr<Json> ParseJson(std::string_view text, std::string_view source);

// The members of one JSON object. `source` starts every message ("SGLang hisparse config");
// `path` is prefixed to every key in them ("geometry." for a nested object, or empty).
class JsonFields {
 public:
  // InvalidArgument when `value` is not an object or has a key not in `accepted` (the message
  // lists them).
  static StatusOr<JsonFields> Open(const Json& value, std::string source, std::string path,
                                   const std::vector<std::string>& accepted);

  bool Has(std::string_view key) const { return object_->contains(key); }
  // The key is present with the value null.
  bool IsNull(std::string_view key) const { return Has(key) && object_->at(key).is_null(); }
  // The member itself; REQUIRES: Has(key).
  const Json& At(std::string_view key) const { return object_->at(key); }

  // Each getter returns nullopt when the key is absent and InvalidArgument naming the key when
  // its value is not of the type (null included) or outside [min, max].
  StatusOr<std::optional<int64_t>> Integer(std::string_view key, int64_t min, int64_t max) const;
  StatusOr<std::optional<double>> Number(std::string_view key) const;  // integer or not
  StatusOr<std::optional<bool>> Bool(std::string_view key) const;
  StatusOr<std::optional<std::string>> String(std::string_view key) const;

  // "<source>: <path><key> <what>": the form of every message about one member.
  Status Error(std::string_view key, std::string_view what) const;
  // The key as messages name it: path + key.
  std::string Name(std::string_view key) const { return path_ + std::string(key); }
  const std::string& source() const { return source_; }

 private:
  JsonFields(const Json* object, std::string source, std::string path)
      : object_(object), source_(std::move(source)), path_(std::move(path)) {}

  const Json* object_;  // not owned: the caller keeps the parsed value alive
  std::string source_;
  std::string path_;
};

// "a, b, c".
std::string JoinKeys(const std::vector<std::string>& keys);

}  // namespace sparsekv::config_internal
