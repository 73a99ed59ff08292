#include "config/json_fields.h"

#include <set>
#include <utility>

namespace sparsekv::config_internal {

StatusOr<Json> ParseJson(std::string_view text, std::string_view source) {
  // One set of keys per object being parsed, innermost last.
  std::vector<std::set<std::string>> open_objects;
  std::string repeated;
  const Json::parser_callback_t note_keys = [&](int /*depth*/, Json::parse_event_t event,
                                                Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == Json::parse_event_t::key && !open_objects.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && repeated.empty()) repeated = key;
    }
    return true;
  };
  Json value;
  try {
    value = Json::parse(text.begin(), text.end(), note_keys);
  } catch (const Json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 3: ...".
    std::string what = e.what();
    const size_t tag_end = what.find("] ");
    if (tag_end != std::string::npos) what.erase(0, tag_end + 2);
    return InvalidArgument(std::string(source) + ": not valid JSON: " + what);
  }
  if (!repeated.empty()) {
    return InvalidArgument(std::string(source) + ": key \"" + repeated +
                           "\" is given twice in one object");
  }
  return value;
}

std::string JoinKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& key : keys) {
    if (!out.empty()) out += ", ";
    out += key;
  }
  return out;
}

StatusOr<JsonFields> JsonFields::Open(const Json& value, std::string source, std::string path,
                                      const std::vector<std::string>& accepted) {
  if (!value.is_object()) {
    const std::string what = path.empty() ? "the text" : path.substr(0, path.size() - 1);
    return InvalidArgument(source + ": " + what + " must be a JSON object, got " + value.dump());
  }
  for (const auto& [key, member] : value.items()) {
    bool known = false;
    for (const std::string& name : accepted) known = known || name == key;
    if (!known) {
      return InvalidArgument(source + ": unknown key \"" + path + key +
                             "\" (accepted: " + JoinKeys(accepted) + ")");
    }
  }
  return JsonFields(&value, std::move(source), std::move(path));
}

Status JsonFields::Error(std::string_view key, std::string_view what) const {
  return InvalidArgument(source_ + ": " + Name(key) + " " + std::string(what));
}

StatusOr<std::optional<int64_t>> JsonFields::Integer(std::string_view key, int64_t min,
                                                     int64_t max) const {
  if (!Has(key)) return std::optional<int64_t>();
  const Json& v = At(key);
  std::string range = "[";
  range += std::to_string(min);
  range += ", ";
  range += std::to_string(max);
  range += "]";
  if (!v.is_number_integer()) {
    return Error(key, "must be an integer in " + range + ", got " + v.dump());
  }
  // The parser stores every non-negative integer as unsigned: compare it without converting, so
  // that values above int64's range are out of range rather than wrapped.
  bool fits;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    fits = max >= 0 && u <= static_cast<uint64_t>(max) &&
           (min <= 0 || u >= static_cast<uint64_t>(min));
  } else {
    fits = v.get<int64_t>() >= min && v.get<int64_t>() <= max;
  }
  if (!fits) return Error(key, "must be in " + range + ", got " + v.dump());
  return std::optional<int64_t>(v.get<int64_t>());
}

StatusOr<std::optional<double>> JsonFields::Number(std::string_view key) const {
  if (!Has(key)) return std::optional<double>();
  const Json& v = At(key);
  if (!v.is_number()) return Error(key, "must be a number, got " + v.dump());
  return std::optional<double>(v.get<double>());
}

StatusOr<std::optional<bool>> JsonFields::Bool(std::string_view key) const {
  if (!Has(key)) return std::optional<bool>();
  const Json& v = At(key);
  if (!v.is_boolean()) return Error(key, "must be true or false, got " + v.dump());
  return std::optional<bool>(v.get<bool>());
}

StatusOr<std::optional<std::string>> JsonFields::String(std::string_view key) const {
  if (!Has(key)) return std::optional<std::string>();
  const Json& v = At(key);
  if (!v.is_string()) return Error(key, "must be a string, got " + v.dump());
  return std::optional<std::string>(v.get<std::string>());
}

}  // namespace sparsekv::config_internal
