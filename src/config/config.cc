// sparsekv's own JSON form of CacheOptions (config.h): one table of the fields, in the order of
// options.h, drives the accepted keys, the reader and the writer, so that a field added to the
// table is read and written alike (config_test checks the round trip of every field).
#include "sparsekv/config.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "config/json_fields.h"

namespace sparsekv {
namespace {

using config_internal::Json;
using config_internal::JsonFields;
using config_internal::ParseJson;

constexpr char kSource[] = "sparsekv config";
// More layers than any model has; bounds what a uniform geometry may ask to allocate.
constexpr int64_t kMaxConfigLayers = 1 << 16;
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// The fields that are not plain integers or flags.
struct GeometryField {};
struct EvictionField {};
struct CopyStrategyField {};
using Member = std::variant<GeometryField, EvictionField, CopyStrategyField,
                            int32_t CacheOptions::*, int64_t CacheOptions::*, bool CacheOptions::*>;
struct Field {
  const char* name;
  Member member;
};

const std::vector<Field>& Fields() {
  static const std::vector<Field> fields = {
      {"geometry", GeometryField{}},
      {"top_k", &CacheOptions::top_k},
      {"hot_slots", &CacheOptions::hot_slots},
      {"device_budget_bytes", &CacheOptions::device_budget_bytes},
      {"hybrid_residency", &CacheOptions::hybrid_residency},
      {"indexer_key_bytes", &CacheOptions::indexer_key_bytes},
      {"window", &CacheOptions::window},
      {"eviction", EvictionField{}},
      {"protected_percent", &CacheOptions::protected_percent},
      {"host_capacity_tokens", &CacheOptions::host_capacity_tokens},
      {"max_requests", &CacheOptions::max_requests},
      {"max_host_requests", &CacheOptions::max_host_requests},
      {"max_batch", &CacheOptions::max_batch},
      {"max_context", &CacheOptions::max_context},
      {"host_page_tokens", &CacheOptions::host_page_tokens},
      {"layers_per_index", &CacheOptions::layers_per_index},
      {"share_repeated_positions", &CacheOptions::share_repeated_positions},
      {"sort_misses", &CacheOptions::sort_misses},
      {"sort_misses_min_batch", &CacheOptions::sort_misses_min_batch},
      {"max_prefetch", &CacheOptions::max_prefetch},
      {"copy_blocks", &CacheOptions::copy_blocks},
      {"prefetch_copy_blocks", &CacheOptions::prefetch_copy_blocks},
      {"resident_page_rows", &CacheOptions::resident_page_rows},
      {"fused_copy_min_batch", &CacheOptions::fused_copy_min_batch},
      {"copy_chunk_rows", &CacheOptions::copy_chunk_rows},
      {"copy_strategy", CopyStrategyField{}},
  };
  return fields;
}

template <typename Enum>
struct EnumName {
  Enum value;
  const char* name;
};
constexpr EnumName<EvictionPolicy> kEvictionNames[] = {
    {EvictionPolicy::kLru, "lru"},
    {EvictionPolicy::kSegmentedLru, "segmented_lru"},
    {EvictionPolicy::kClock, "clock"},
};
constexpr EnumName<CopyStrategy> kCopyStrategyNames[] = {
    {CopyStrategy::kLattice, "lattice"},
    {CopyStrategy::kLatticeWide, "lattice_wide"},
    {CopyStrategy::kWarpRows, "warp_rows"},
    {CopyStrategy::kBulk, "bulk"},
};

template <typename Enum, size_t N>
std::string NameOf(const EnumName<Enum> (&names)[N], Enum value) {
  for (const EnumName<Enum>& n : names) {
    if (n.value == value) return n.name;
  }
  return std::to_string(static_cast<int>(value));  // not a known value: ValidateOptions refuses it
}

template <typename Enum, size_t N>
Status ReadEnum(const JsonFields& fields, std::string_view key, const EnumName<Enum> (&names)[N],
                Enum* out) {
  SPARSEKV_ASSIGN_OR_RETURN(std::optional<std::string> text, fields.String(key));
  if (!text) return Status::Ok();
  std::string known;
  for (const EnumName<Enum>& n : names) {
    if (*text == n.name) {
      *out = n.value;
      return Status::Ok();
    }
    known += std::string(known.empty() ? "" : ", ") + "\"" + n.name + "\"";
  }
  return fields.Error(key, "must be one of " + known + ", got \"" + *text + "\"");
}

// row_bytes is required, row_stride defaults to row_bytes.
StatusOr<LayerShape> ReadLayerShape(const JsonFields& fields) {
  SPARSEKV_ASSIGN_OR_RETURN(std::optional<int64_t> row_bytes,
                            fields.Integer("row_bytes", 1, kInt32Max));
  if (!row_bytes) return fields.Error("row_bytes", "is required");
  SPARSEKV_ASSIGN_OR_RETURN(std::optional<int64_t> row_stride,
                            fields.Integer("row_stride", 1, kInt32Max));
  return LayerShape{static_cast<int32_t>(*row_bytes),
                    static_cast<int32_t>(row_stride.value_or(*row_bytes))};
}

StatusOr<KVGeometry> ReadGeometry(const Json& value) {
  SPARSEKV_ASSIGN_OR_RETURN(const JsonFields fields,
                            JsonFields::Open(value, kSource, "geometry.",
                                             {"num_layers", "row_bytes", "row_stride", "layers"}));
  if (!fields.Has("layers")) {
    SPARSEKV_ASSIGN_OR_RETURN(std::optional<int64_t> num_layers,
                              fields.Integer("num_layers", 1, kMaxConfigLayers));
    if (!num_layers) {
      return fields.Error("num_layers", "is required (or \"layers\", one entry per layer)");
    }
    SPARSEKV_ASSIGN_OR_RETURN(const LayerShape shape, ReadLayerShape(fields));
    return KVGeometry::Uniform(static_cast<int32_t>(*num_layers), shape.row_bytes,
                               shape.row_stride);
  }
  if (fields.Has("num_layers") || fields.Has("row_bytes") || fields.Has("row_stride")) {
    return fields.Error("layers", "cannot be given with num_layers, row_bytes or row_stride");
  }
  const Json& layers = fields.At("layers");
  if (!layers.is_array() || layers.empty()) {
    return fields.Error("layers", "must be a non-empty array of {\"row_bytes\", \"row_stride\"}");
  }
  KVGeometry geometry;
  for (size_t i = 0; i < layers.size(); ++i) {
    SPARSEKV_ASSIGN_OR_RETURN(
        const JsonFields layer,
        JsonFields::Open(layers[i], kSource, "geometry.layers[" + std::to_string(i) + "].",
                         {"row_bytes", "row_stride"}));
    SPARSEKV_ASSIGN_OR_RETURN(const LayerShape shape, ReadLayerShape(layer));
    geometry.layers.push_back(shape);
  }
  return geometry;
}

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

Status ReadField(const JsonFields& fields, const Field& field, CacheOptions* o) {
  const std::string_view key = field.name;
  return std::visit(
      Overloaded{
          [&](GeometryField) -> Status {
            if (!fields.Has(key)) return Status::Ok();
            SPARSEKV_ASSIGN_OR_RETURN(o->geometry, ReadGeometry(fields.At(key)));
            return Status::Ok();
          },
          [&](EvictionField) { return ReadEnum(fields, key, kEvictionNames, &o->eviction); },
          [&](CopyStrategyField) {
            return ReadEnum(fields, key, kCopyStrategyNames, &o->copy_strategy);
          },
          [&](int32_t CacheOptions::*m) -> Status {
            SPARSEKV_ASSIGN_OR_RETURN(std::optional<int64_t> v,
                                      fields.Integer(key, kInt32Min, kInt32Max));
            if (v) o->*m = static_cast<int32_t>(*v);
            return Status::Ok();
          },
          [&](int64_t CacheOptions::*m) -> Status {
            SPARSEKV_ASSIGN_OR_RETURN(std::optional<int64_t> v,
                                      fields.Integer(key, kInt64Min, kInt64Max));
            if (v) o->*m = *v;
            return Status::Ok();
          },
          [&](bool CacheOptions::*m) -> Status {
            SPARSEKV_ASSIGN_OR_RETURN(std::optional<bool> v, fields.Bool(key));
            if (v) o->*m = *v;
            return Status::Ok();
          },
      },
      field.member);
}

nlohmann::ordered_json WriteGeometry(const KVGeometry& g) {
  bool uniform = !g.layers.empty();
  for (const LayerShape& l : g.layers) {
    uniform =
        uniform && l.row_bytes == g.layers[0].row_bytes && l.row_stride == g.layers[0].row_stride;
  }
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (uniform) {
    out["num_layers"] = g.num_layers();
    out["row_bytes"] = g.layers[0].row_bytes;
    out["row_stride"] = g.layers[0].row_stride;
    return out;
  }
  out["layers"] = nlohmann::ordered_json::array();
  for (const LayerShape& l : g.layers) {
    out["layers"].push_back({{"row_bytes", l.row_bytes}, {"row_stride", l.row_stride}});
  }
  return out;
}

}  // namespace

StatusOr<CacheOptions> CacheOptionsFromJson(std::string_view json, const CacheOptions& base) {
  SPARSEKV_ASSIGN_OR_RETURN(const Json value, ParseJson(json, kSource));
  std::vector<std::string> accepted;
  for (const Field& field : Fields()) accepted.push_back(field.name);
  SPARSEKV_ASSIGN_OR_RETURN(const JsonFields fields,
                            JsonFields::Open(value, kSource, "", accepted));
  CacheOptions options = base;
  for (const Field& field : Fields()) SPARSEKV_RETURN_IF_ERROR(ReadField(fields, field, &options));
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options));
  return options;
}

std::string CacheOptionsToJson(const CacheOptions& o) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const Field& field : Fields()) {
    std::visit(Overloaded{
                   [&](GeometryField) { out[field.name] = WriteGeometry(o.geometry); },
                   [&](EvictionField) { out[field.name] = NameOf(kEvictionNames, o.eviction); },
                   [&](CopyStrategyField) {
                     out[field.name] = NameOf(kCopyStrategyNames, o.copy_strategy);
                   },
                   [&](auto CacheOptions::*m) { out[field.name] = o.*m; },
               },
               field.member);
  }
  return out.dump(2) + "\n";
}

}  // namespace sparsekv
