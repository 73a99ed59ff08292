// CacheOptions from the HiSparse configs of SGLang and vLLM (config.h; docs/config.md has the
// tables). A peer key is either mapped to a field, accepted and ignored where it only tunes the
// peer's own kernels or engine (ignoring it changes nothing sparsekv does), or refused with the
// reason when honouring it would take behaviour sparsekv does not have.
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "config/json_fields.h"
#include "sparsekv/config.h"
#include "sparsekv/kernel_views.h"

namespace sparsekv {
namespace {

using config_internal::Json;
using config_internal::JsonFields;
using config_internal::ParseJson;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// "(value)", as messages quote what they refuse.
std::string Shown(const Json& value) {
  std::string shown = "(";
  shown += value.dump();
  shown += ")";
  return shown;
}

// top_k and device_buffer_size, the keys both peers share. Both peers run the model's own top-k
// (SGLang reads the model's index_topk over its config's top_k; vLLM required them equal), which
// base carries: a top_k that differs from it is refused rather than silently overruled.
// device_buffer_size defaults to 2 * buffer_top_k (the peer's default) and must be >= top_k.
// The result passes ValidateOptions, whose messages name the field.
StatusOr<CacheOptions> ReadTopKAndBuffer(const JsonFields& fields, const CacheOptions& base,
                                         int64_t default_buffer_top_k) {
  CacheOptions o = base;
  SPARSEKV_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, fields.Integer("top_k", 1, kInt32Max));
  if (top_k && *top_k != base.top_k) {
    return fields.Error("top_k", Shown(*top_k) +
                                     " differs from the model's top-k in the base options (" +
                                     std::to_string(base.top_k) +
                                     "): the engine runs the model's; set base.top_k instead");
  }
  std::optional<int64_t> buffer;
  if (!fields.IsNull("device_buffer_size")) {
    SPARSEKV_ASSIGN_OR_RETURN(buffer, fields.Integer("device_buffer_size", 1, kMaxHotSlots));
  }
  if (buffer && *buffer < o.top_k) {
    return fields.Error("device_buffer_size", Shown(*buffer) + " must be at least top_k (" +
                                                  std::to_string(o.top_k) +
                                                  "): below it a step's misses find no slot");
  }
  const int64_t hot_slots = buffer.value_or(2 * top_k.value_or(default_buffer_top_k));
  if (hot_slots > kMaxHotSlots) {
    return fields.Error("device_buffer_size",
                        "defaults to 2 * top_k = " + std::to_string(hot_slots) + ", above the " +
                            std::to_string(kMaxHotSlots) + " hot slots a request may have: set it");
  }
  o.hot_slots = static_cast<int32_t>(hot_slots);
  return o;
}

Status RefuseHostToDeviceRatio(const JsonFields& fields) {
  return fields.Error("host_to_device_ratio",
                      "has no equivalent: it sizes the host pool as a multiple of the engine's "
                      "device KV pool, and sparsekv keeps no device KV pool (its HBM holds only "
                      "the hot caches); leave it out and set host_capacity_tokens, the host pool "
                      "in tokens, in the base options");
}

// ---- SGLang ----

constexpr char kSglang[] = "SGLang hisparse config";

// A string key whose null means SGLang's default (None), trimmed and lower-cased as SGLang does.
StatusOr<std::optional<std::string>> SglangName(const JsonFields& fields, std::string_view key) {
  if (fields.IsNull(key)) return std::optional<std::string>();
  SPARSEKV_ASSIGN_OR_RETURN(std::optional<std::string> name, fields.String(key));
  if (!name) return name;
  const size_t first = name->find_first_not_of(" \t\n\r");
  const size_t last = name->find_last_not_of(" \t\n\r");
  std::string trimmed = first == std::string::npos ? "" : name->substr(first, last - first + 1);
  for (char& c : trimmed) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return std::optional<std::string>(trimmed);
}

// An integer key whose null means SGLang's default (None).
StatusOr<std::optional<int64_t>> SglangOptionalInt(const JsonFields& fields, std::string_view key) {
  if (fields.IsNull(key)) return std::optional<int64_t>();
  return fields.Integer(key, 0, kInt32Max);
}

}  // namespace

StatusOr<CacheOptions> CacheOptionsFromSglangHisparseConfig(std::string_view json,
                                                            const CacheOptions& base) {
  SPARSEKV_ASSIGN_OR_RETURN(const Json value, ParseJson(json, kSglang));
  SPARSEKV_ASSIGN_OR_RETURN(
      const JsonFields fields,
      JsonFields::Open(value, kSglang, "",
                       {"top_k", "device_buffer_size", "host_to_device_ratio", "swap_in_block_size",
                        "algorithm", "backend", "min_sparse_prompt_len", "page_size"}));
  // SGLang's default top_k (2048) sizes its default buffer whatever the model's top-k.
  constexpr int64_t kSglangDefaultTopK = 2048;
  SPARSEKV_ASSIGN_OR_RETURN(CacheOptions options,
                            ReadTopKAndBuffer(fields, base, kSglangDefaultTopK));
  if (fields.Has("host_to_device_ratio")) return RefuseHostToDeviceRatio(fields);
  // Threads per block of SGLang's swap-in kernel, checked as SGLang checks it; sparsekv's resolve
  // has its own launch shape.
  SPARSEKV_RETURN_IF_ERROR(fields.Integer("swap_in_block_size", 1, 1024).status());

  SPARSEKV_ASSIGN_OR_RETURN(std::optional<std::string> algorithm, SglangName(fields, "algorithm"));
  if (algorithm && *algorithm != "deepseek_nsa" && *algorithm != "deepseek_dsa") {
    return fields.Error("algorithm", "\"" + *algorithm +
                                         "\" has no equivalent: sparsekv takes the top-k "
                                         "positions from the model's own indexer "
                                         "(\"deepseek_nsa\" / \"deepseek_dsa\") and selects "
                                         "nothing itself");
  }
  // The engine's attention backend: sparsekv hands rows to whichever kernel the engine runs.
  SPARSEKV_RETURN_IF_ERROR(SglangName(fields, "backend").status());

  SPARSEKV_ASSIGN_OR_RETURN(std::optional<int64_t> min_prompt,
                            SglangOptionalInt(fields, "min_sparse_prompt_len"));
  if (min_prompt && *min_prompt > 0) {
    return fields.Error("min_sparse_prompt_len",
                        Shown(*min_prompt) +
                            " has no equivalent: sparsekv has no dense path for short prompts "
                            "(every admitted request is served from its hot cache); leave it out "
                            "or set 0");
  }
  SPARSEKV_ASSIGN_OR_RETURN(std::optional<int64_t> page_size,
                            SglangOptionalInt(fields, "page_size"));
  if (page_size && *page_size != 1) {
    return fields.Error("page_size", Shown(*page_size) +
                                         " has no equivalent: sparsekv resolves single "
                                         "positions, not pages of them; leave it out or set 1");
  }
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options));
  return options;
}

// ---- vLLM ----

namespace {

constexpr char kVllm[] = "vLLM HiSparse config";

// host_pool_gib GiB as whole host pages of base's geometry.
StatusOr<int64_t> HostPoolTokens(const JsonFields& fields, double gib, const CacheOptions& o) {
  if (!std::isfinite(gib) || gib <= 0) {
    return fields.Error("host_pool_gib", "must be a positive number of GiB");
  }
  const int64_t token_bytes = o.geometry.token_stride_bytes();
  if (o.geometry.layers.empty() || token_bytes <= 0) {
    return fields.Error("host_pool_gib",
                        "needs the model's rows in the base options (geometry) to size the host "
                        "pool in tokens");
  }
  if (o.host_page_tokens <= 0) {
    return fields.Error("host_pool_gib", "needs host_page_tokens > 0 in the base options");
  }
  const double tokens = std::floor(gib * double{1 << 30} / static_cast<double>(token_bytes));
  const int64_t page = o.host_page_tokens;
  if (tokens >= static_cast<double>(kInt32Max)) {
    return fields.Error("host_pool_gib", Shown(gib) + " holds more than " +
                                             std::to_string(kInt32Max) + " tokens of " +
                                             std::to_string(token_bytes) +
                                             " B: host rows are 32-bit indices");
  }
  const int64_t whole_pages = static_cast<int64_t>(tokens) / page * page;
  if (whole_pages < page) {
    return fields.Error("host_pool_gib",
                        Shown(gib) + " holds " + std::to_string(static_cast<int64_t>(tokens)) +
                            " tokens of " + std::to_string(token_bytes) +
                            " B, less than one host page (" + std::to_string(page) + " tokens)");
  }
  return whole_pages;
}

}  // namespace

StatusOr<CacheOptions> CacheOptionsFromVllmHisparse(std::string_view json,
                                                    const CacheOptions& base) {
  SPARSEKV_ASSIGN_OR_RETURN(const Json value, ParseJson(json, kVllm));
  SPARSEKV_ASSIGN_OR_RETURN(
      const JsonFields fields,
      JsonFields::Open(value, kVllm, "",
                       {"device_buffer_size", "host_pool_gib", "eager_host_mirror", "top_k",
                        "host_to_device_ratio"}));
  SPARSEKV_ASSIGN_OR_RETURN(CacheOptions options, ReadTopKAndBuffer(fields, base, base.top_k));

  std::optional<double> gib;
  if (!fields.IsNull("host_pool_gib")) {
    SPARSEKV_ASSIGN_OR_RETURN(gib, fields.Number("host_pool_gib"));
  }
  if (gib) {
    SPARSEKV_ASSIGN_OR_RETURN(options.host_capacity_tokens, HostPoolTokens(fields, *gib, options));
  } else if (fields.Has("host_to_device_ratio")) {
    // vLLM itself read the ratio only when host_pool_gib was not given; with it, it is ignored.
    return RefuseHostToDeviceRatio(fields);
  }
  SPARSEKV_ASSIGN_OR_RETURN(std::optional<bool> eager, fields.Bool("eager_host_mirror"));
  if (eager && !*eager) {
    return fields.Error("eager_host_mirror",
                        "(false) has no equivalent: sparsekv writes every new row to the host "
                        "pool in the step that appends it; leave it out or set true");
  }
  SPARSEKV_RETURN_IF_ERROR(ValidateOptions(options));
  return options;
}

}  // namespace sparsekv
