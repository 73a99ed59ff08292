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

// The host_capacity_tokens of a pool of `rows` host rows (where they come from: `what`): the
// rows rounded down to whole host pages of o (host_page_tokens rows each), times the offloaded
// layers' cadence r (KVGeometry::offloaded_entry_tokens), since the manager gives the pool
// host_capacity_tokens / r rows. This is the one place the peers' sizes become tokens.
// InvalidArgument naming `key` when that is less than one page or more than 32-bit host rows
// index.
StatusOr<int64_t> WholeHostPages(const JsonFields& fields, std::string_view key, double rows,
                                 const std::string& what, const CacheOptions& o) {
  if (o.host_page_tokens <= 0) {
    return fields.Error(key, "needs host_page_tokens > 0 in the base options");
  }
  const int64_t page = o.host_page_tokens;
  const int64_t r = o.geometry.offloaded_entry_tokens();
  if (!(rows < static_cast<double>(kInt32Max))) {
    return fields.Error(key, what + " is more than " + std::to_string(kInt32Max) +
                                 " rows: host rows are 32-bit indices");
  }
  const int64_t whole_pages = static_cast<int64_t>(rows) / page * page;
  if (whole_pages < page) {
    return fields.Error(key, what + " is " + std::to_string(static_cast<int64_t>(rows)) +
                                 " rows, less than one host page (" + std::to_string(page) +
                                 " rows)");
  }
  return whole_pages * r;
}

// host_to_device_ratio: the host pool as a multiple of the device's slots. In SGLang the device
// pool holds every running request's buffer (device_buffer_size plus a page for new tokens) and
// the host pool ratio times as many; here the device holds max_requests hot caches of
// hot_slots + window slots, a slot per entry (r tokens), and the host pool ratio times as many
// rows.
StatusOr<int64_t> RatioTokens(const JsonFields& fields, double ratio, const CacheOptions& o) {
  constexpr std::string_view kKey = "host_to_device_ratio";
  if (!std::isfinite(ratio) || ratio < 1) {
    return fields.Error(
        kKey, "must be a number >= 1 (host rows per device slot), got " + Json(ratio).dump());
  }
  if (o.max_requests <= 0) {
    return fields.Error(kKey,
                        "needs max_requests in the base options: the host pool is the ratio "
                        "times max_requests * (hot_slots + window) device slots");
  }
  const int64_t device_slots = int64_t{o.max_requests} * o.slots_per_request();
  return WholeHostPages(fields, kKey, std::floor(ratio * static_cast<double>(device_slots)),
                        Json(ratio).dump() + " x " + std::to_string(device_slots) +
                            " device slots (max_requests x (hot_slots + window))",
                        o);
}

// host_pool_gib: the rows of o.geometry (an entry of every offloaded layer each) that many GiB
// hold, as tokens.
StatusOr<int64_t> GibTokens(const JsonFields& fields, double gib, const CacheOptions& o) {
  constexpr std::string_view kKey = "host_pool_gib";
  if (!std::isfinite(gib) || gib <= 0) {
    return fields.Error(kKey, "must be a positive number of GiB");
  }
  const int64_t row_bytes = o.geometry.token_stride_bytes();
  if (o.geometry.layers.empty() || row_bytes <= 0) {
    return fields.Error(kKey,
                        "needs the model's rows in the base options (geometry) to size the host "
                        "pool");
  }
  return WholeHostPages(fields, kKey,
                        std::floor(gib * double{1 << 30} / static_cast<double>(row_bytes)),
                        Json(gib).dump() + " GiB of " + std::to_string(row_bytes) + "-B rows", o);
}

constexpr char kSglang[] = "SGLang hisparse config";
constexpr char kVllm[] = "vLLM HiSparse config";

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
  // The host pool: host_to_device_ratio when given; SGLang's default ratio (2) when base has no
  // host pool; else base's.
  SPARSEKV_ASSIGN_OR_RETURN(std::optional<double> ratio, fields.Number("host_to_device_ratio"));
  if (!ratio && base.host_capacity_tokens == 0) ratio = 2;
  if (ratio) {
    SPARSEKV_ASSIGN_OR_RETURN(options.host_capacity_tokens, RatioTokens(fields, *ratio, options));
  }
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
  // The host pool: host_pool_gib; without it host_to_device_ratio, as vLLM read it (ignored when
  // host_pool_gib is given); without either, base's.
  SPARSEKV_ASSIGN_OR_RETURN(std::optional<double> ratio, fields.Number("host_to_device_ratio"));
  if (gib) {
    SPARSEKV_ASSIGN_OR_RETURN(options.host_capacity_tokens, GibTokens(fields, *gib, options));
  } else if (ratio) {
    SPARSEKV_ASSIGN_OR_RETURN(options.host_capacity_tokens, RatioTokens(fields, *ratio, options));
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
