#include "tools/sparsekv/bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <span>
#include <thread>

#include "sparsekv/capacity.h"
#include "sparsekv/config.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/index_groups.h"
#include "sparsekv/kv_footprint.h"
#include "sparsekv/manager.h"
#include "sparsekv/topk_generator.h"

namespace sparsekv::tools {
namespace {

Status Bad(const std::string& message) { return InvalidArgument(message); }

constexpr int64_t kMaxPoolRows = std::numeric_limits<int32_t>::max();

// A block of the backend's device memory, freed on destruction. Not cuda_common::DeviceBuffer:
// it allocates through the Backend (host memory on the CPU backend this loop also runs on).
class DeviceMemory {
 public:
  static StatusOr<std::unique_ptr<DeviceMemory>> Create(Backend& backend, size_t bytes) {
    SPARSEKV_ASSIGN_OR_RETURN(void* p, backend.AllocateDevice(std::max<size_t>(bytes, 1)));
    return std::unique_ptr<DeviceMemory>(new DeviceMemory(backend, p));
  }
  ~DeviceMemory() { backend_.FreeDevice(ptr_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  std::byte* get() const { return static_cast<std::byte*>(ptr_); }

 private:
  DeviceMemory(Backend& backend, void* ptr) : backend_(backend), ptr_(ptr) {}
  Backend& backend_;
  void* ptr_;
};

void FillRandom(std::mt19937_64& rng, std::span<std::byte> out) {
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(out.data() + i, &r, 8);
  }
  const uint64_t r = rng();
  std::memcpy(out.data() + i, &r, out.size() - i);
}

// One step's rows of every layer into topk ([layers][batch * top_k]); layers run in parallel
// (each generator owns its layer, so the result does not depend on the thread count).
void GenerateStep(std::vector<LayerTopKGenerator>& generators, std::span<const int32_t> seq_lens,
                  int64_t layer_elems, std::vector<int32_t>& topk) {
  const int32_t layers = static_cast<int32_t>(generators.size());
  auto run = [&](int32_t first, int32_t every) {
    for (int32_t l = first; l < layers; l += every) {
      generators[l].Next(seq_lens, std::span(topk.data() + l * layer_elems, layer_elems));
    }
  };
  const int32_t threads =
      std::clamp<int32_t>(static_cast<int32_t>(std::thread::hardware_concurrency()), 1, layers);
  if (threads == 1) return run(0, 1);
  std::vector<std::jthread> pool;
  for (int32_t t = 0; t < threads; ++t) pool.emplace_back(run, t, threads);
}

std::string Fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, value);
  return buf;
}

// Decimal units, as GB/s is (1 GB = 1e9 bytes).
std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  double v = bytes;
  while (std::abs(v) >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  return Fixed(v, u == 0 ? 0 : (std::abs(v) < 10 ? 2 : 1)) + " " + units[u];
}

// The host pool and the hot cache the run allocates, against what the machine has, in the flags'
// words, before the manager allocates them (whose own refusal names library fields). On the CPU
// backend both are host memory.
// The offloaded layers: their count and cadence (one, ValidateOptions), which the host pool's
// rows and the hot cache's slots are of.
struct OffloadedLayers {
  int32_t count = 0;
  int32_t entry_tokens = 1;
};
OffloadedLayers OffloadedLayersOf(const CacheOptions& o) {
  OffloadedLayers off;
  for (const LayerShape& l : o.geometry.layers) {
    if (l.kind != LayerKind::kOffloaded) continue;
    ++off.count;
    off.entry_tokens = l.entry_tokens;
  }
  return off;
}

// Device bytes of one request's hot-cache block: its rows of the offloaded layers and the
// replacement state of their index groups (the manager's HotCache holds nothing else; the clock's
// position map covers max_context / r entries, as the manager sizes it).
int64_t BlockBytes(const CacheOptions& o) {
  CacheOptions entries = o;
  entries.max_context = std::max(1, o.max_context / OffloadedLayersOf(o).entry_tokens);
  return o.geometry.token_stride_bytes() * (int64_t{o.hot_slots} + o.window) +
         HotCache::StateBytesOf(o.offloaded_index_groups(), o.hot_slots, ReplacementOf(entries));
}

// Device bytes one request of `tokens` tokens holds outside the hot cache (DeepSeek-V4's layer
// kinds): its resident layers' entries in pages of resident_page_rows, and a raw window of
// every layer. 0 when every layer is offloaded and there is no raw window.
int64_t DenseBytesPerRequest(const CacheOptions& o, int64_t tokens) {
  int64_t bytes = 0;
  for (const LayerShape& l : o.geometry.layers) {
    bytes += int64_t{o.raw_window} * l.row_stride;
    if (l.kind != LayerKind::kResident) continue;
    const int64_t pages =
        (tokens / l.entry_tokens + o.resident_page_rows - 1) / o.resident_page_rows;
    bytes += pages * o.resident_page_rows * l.row_stride;
  }
  return bytes;
}

// Bytes of one request's whole KV of `tokens` tokens kept in HBM: a row per token of every layer,
// or for DeepSeek-V4's layer kinds an entry per r tokens of the offloaded and resident layers and
// a raw window of every layer.
int64_t FullKvBytesPerRequest(const CacheOptions& o, int64_t tokens) {
  int64_t bytes = 0;
  for (const LayerShape& l : o.geometry.layers) {
    bytes += int64_t{o.raw_window} * l.row_bytes;
    if (l.kind != LayerKind::kWindowOnly) bytes += tokens / l.entry_tokens * l.row_bytes;
  }
  return bytes;
}

Status CheckBenchMemory(const BenchConfig& c, const CacheOptions& o, Backend& backend) {
  const OffloadedLayers off = OffloadedLayersOf(o);
  const int64_t row = o.geometry.token_stride_bytes() / off.count;
  const int64_t pool_rows = o.host_capacity_tokens / off.entry_tokens / c.batch;
  const int64_t pool_bytes =
      o.host_capacity_tokens / off.entry_tokens * o.geometry.token_stride_bytes();
  const int64_t hot_bytes = int64_t{c.batch} * BlockBytes(o);
  const std::string rows =
      " x " + std::to_string(off.count) +
      (off.count == o.geometry.num_layers() ? " layers" : " offloaded layers") + " x " +
      std::to_string(row) + " B rows";
  const std::string pool = "--batch " + std::to_string(c.batch) + " x " +
                           std::to_string(pool_rows) + " rows (--context " +
                           std::to_string(c.context) + " + --steps " + std::to_string(c.steps) +
                           ", in pages)" + rows;
  const std::string hot = "--batch " + std::to_string(c.batch) + " x (--hot-slots " +
                          std::to_string(c.hot_slots) + " + --window " + std::to_string(c.window) +
                          ") rows" + rows;
  if (backend.kind() == BackendKind::kCpu) {
    return CheckHostMemory({.what = "host pool and hot cache",
                            .sizing = pool + ", and " + hot + ",",
                            .bytes = pool_bytes + hot_bytes,
                            .remedy = "lower --batch, --context, --hot-slots or --layers"});
  }
  SPARSEKV_RETURN_IF_ERROR(CheckHostMemory({.what = "host pool",
                                            .sizing = pool,
                                            .bytes = pool_bytes,
                                            .remedy = "lower --batch, --context or --layers"}));
  return CheckDeviceMemory({.what = "hot cache",
                            .sizing = hot,
                            .bytes = hot_bytes,
                            .remedy = "lower --batch, --hot-slots or --layers"},
                           backend);
}

}  // namespace

std::string_view PrecisionName(KVRowFormat format) {
  switch (format) {
    case KVRowFormat::kBf16Row1152:
      return "bf16";
    case KVRowFormat::kMxfp4Entry368:
      return "mxfp4";
    default:
      return "fp8";
  }
}

Status ValidateBenchConfig(const BenchConfig& c) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  if (c.layers < 0) return Bad("--layers must be >= 1");
  if (c.batch < 1) return Bad("--batch must be >= 1");
  if (c.context < 1) return Bad("--context must be >= 1");
  if (c.steps < 1) return Bad("--steps must be >= 1");
  if (c.warmup_steps < 0 || c.warmup_steps >= c.steps) {
    return Bad("--warmup (" + std::to_string(c.warmup_steps) + ") must be in [0, --steps (" +
               std::to_string(c.steps) + ")): at least one step must be timed");
  }
  if (c.top_k < 1) return Bad("--top-k must be >= 1");
  if (c.top_k > c.context) {
    return Bad("--top-k (" + std::to_string(c.top_k) + ") must be <= --context (" +
               std::to_string(c.context) + "): a row holds distinct positions of the history");
  }
  if (c.hot_slots < c.top_k) {
    return Bad("--hot-slots (" + std::to_string(c.hot_slots) + ") must be >= --top-k (" +
               std::to_string(c.top_k) + ")");
  }
  if (c.window < 1) return Bad("--window must be >= 1");
  if (c.window > c.context) {
    return Bad("--window (" + std::to_string(c.window) + ") must be <= --context (" +
               std::to_string(c.context) + "): the window holds the newest tokens of the history");
  }
  if (c.page_tokens < 1) return Bad("--page-tokens must be >= 1");
  if (!(c.reuse >= 0 && c.reuse <= 1)) return Bad("--reuse must be in [0, 1]");
  if (!(c.recency >= 0 && c.recency <= 1)) return Bad("--recency must be in [0, 1]");
  if (c.reuse + c.recency > 1) return Bad("--reuse + --recency must be <= 1");
  if (c.sinks < 0 || c.sinks > c.top_k) return Bad("--sinks must be in [0, --top-k]");
  if (int64_t{c.context} + c.steps + c.page_tokens > kInt32Max) {
    return Bad("--context + --steps + --page-tokens overflows 32-bit positions");
  }
  for (double m : c.miss_rates) {
    if (!(m >= 0 && m <= 1)) return Bad("--miss-rate values must be in [0, 1]");
  }
  for (int32_t context : c.contexts) {
    if (context < c.top_k || int64_t{context} + 16 * int64_t{c.steps} > kInt32Max / 2) {
      return Bad(
          "--contexts values must be in [--top-k, 2^30): a row selects --top-k distinct "
          "positions, and a context and its steps' positions stay below 2^30 so that "
          "32-bit positions keep their headroom (1048576 = 1M tokens is accepted)");
    }
  }
  for (const std::string& v : c.variants) {
    if (!ParseVariant(v).ok()) return Bad("--variants: unknown variant '" + v + "'");
  }
  if (c.variants.empty()) return Bad("--variants must name at least one variant");
  if (c.mtp < 1 || c.mtp > 8) return Bad("--mtp must be in [1, 8]");
  const StatusOr<ModelPreset> preset = FindPreset(c.preset, c.row_format);
  if (preset.ok() && NamesIndexGroups(*preset) && c.layers_per_index > 1) {
    return Bad("--layers-per-index must be 1 with --preset " + c.preset +
               ": its layers name their own index groups");
  }
  if (c.planned_copy >= 0 && c.schedule == "auto") {
    return Bad(
        "--planned-copy names a manual schedule; --schedule auto measures the planned copy "
        "where the index groups offer it");
  }
  if (c.copy_chunk_rows > 0 && (c.mtp > 1 || c.layers_per_index > 1)) {
    return Bad("--copy-chunk-rows needs --mtp 1 and --layers-per-index 1");
  }
  if (c.mtp > 1) {
    for (const std::string& v : c.variants) {
      if (v != "full-hbm" && v != "sparsekv") {
        return Bad("--mtp > 1 runs full-hbm and sparsekv only, not '" + v + "'");
      }
    }
    if (int64_t{c.top_k} * c.mtp > c.hot_slots) {
      return Bad("--mtp * --top-k must be <= --hot-slots (one row holds every query's top-k)");
    }
  }
  if (c.offload_page_tokens < 1 || c.offload_page_tokens > 4096) {
    return Bad("--offload-page-tokens must be in [1, 4096]");
  }
  if (!(c.hbm_budget_gb > 0)) return Bad("--hbm-budget-gb must be > 0");
  if (!(c.host_pool_gb > 0)) return Bad("--host-pool-gb must be > 0");
  if (c.max_batch < 0) return Bad("--max-batch must be >= 0");
  if (c.offload_max_batch < 0) return Bad("--offload-max-batch must be >= 0");
  if (c.heads < 1 || c.heads > 1024) return Bad("--heads must be in [1, 1024]");
  if (!(c.weights_gb > 0)) return Bad("--weights-gb must be > 0");
  if (!(c.time_limit_s >= 0)) return Bad("--time-limit must be >= 0");
  return Status::Ok();
}

const std::vector<std::string>& BenchSizedKeys() {
  static const std::vector<std::string> keys = {"host_capacity_tokens", "max_requests",
                                                "max_host_requests",    "max_batch",
                                                "max_context",          "indexer_key_bytes"};
  return keys;
}

void ApplyPresetScenario(BenchConfig& c, bool weights_given, bool hbm_given) {
  const StatusOr<ModelPreset> preset = FindPreset(c.preset, c.row_format);
  if (!preset.ok() || preset->weights_per_gpu_gb <= 0) return;
  if (!weights_given) c.weights_gb = preset->weights_per_gpu_gb;
  if (!hbm_given) c.hbm_budget_gb = HbmLeftForKvGb(c.weights_gb);
}

bool HasDenseLayers(const ModelPreset& preset) {
  return preset.raw_window > 0 ||
         std::any_of(preset.layers.begin(), preset.layers.end(),
                     [](const LayerShape& l) { return l.kind != LayerKind::kOffloaded; });
}

bool NamesIndexGroups(const ModelPreset& preset) {
  return std::any_of(preset.layers.begin(), preset.layers.end(),
                     [](const LayerShape& l) { return l.index_group >= 0; });
}

KVGeometry BenchGeometry(const BenchConfig& c, const ModelPreset& preset) {
  KVGeometry g = KVGeometry::Uniform(c.layers > 0 ? c.layers : preset.num_layers, preset.row_bytes);
  if (NamesIndexGroups(preset)) {
    for (int32_t l = 0; l < g.num_layers() && l < preset.num_layers; ++l) {
      g.layers[l].index_group = preset.layers[l].index_group;
      g.layers[l].top_k = preset.layers[l].top_k;
      g.layers[l].indexer_keys = preset.layers[l].indexer_keys;
    }
  }
  if (HasDenseLayers(preset)) {
    // DeepSeek-V4: its first layers' kinds and cadences; --top-k for every offloaded layer, and
    // no indexer keys.
    for (int32_t l = 0; l < g.num_layers() && l < preset.num_layers; ++l) {
      LayerShape& s = g.layers[l];
      s.kind = preset.layers[l].kind;
      s.entry_tokens = preset.layers[l].entry_tokens;
      s.top_k = 0;
      s.indexer_keys = false;
    }
  }
  return g;
}

IndexGroups BenchIndexGroups(const BenchConfig& c, const ModelPreset& preset) {
  CacheOptions o;
  o.geometry = BenchGeometry(c, preset);
  o.top_k = c.top_k;
  o.layers_per_index = NamesIndexGroups(preset) ? 1 : c.layers_per_index;
  return IndexGroups(o);
}

namespace {

// CheckE2ELayers for DeepSeek-V4: what its end-to-end plan is defined for.
Status CheckE2EEntryLayers(const BenchConfig& c, const ModelPreset& preset) {
  const std::string at = " with --preset " + c.preset;
  if (c.layers > preset.num_layers) {
    return InvalidArgument("--layers must be <= " + std::to_string(preset.num_layers) + at +
                           " (its layers' kinds come from the preset)");
  }
  for (const std::string& v : c.variants) {
    if (v != "full-hbm" && v != "sparsekv") {
      return InvalidArgument("--variants: '" + v + "' is not defined for DeepSeek-V4's layer " +
                             "kinds (full-hbm and sparsekv only)" + at);
    }
  }
  if (c.hybrid) return InvalidArgument("--hybrid is not defined" + at);
  if (c.mtp > 1) return InvalidArgument("--mtp must be 1" + at);
  if (c.layers_per_index > 1) return InvalidArgument("--layers-per-index must be 1" + at);
  // The manager refuses extensions over resident layers and raw windows.
  if (c.peer_device >= 0) return InvalidArgument("--peer-device is not defined" + at);
  // A CSA top-k selects distinct entries: every context must have --top-k of them.
  int32_t csa_cadence = 0;
  const int32_t layers = c.layers > 0 ? c.layers : preset.num_layers;
  for (int32_t l = 0; l < layers; ++l) {
    const LayerShape& s = preset.layers[l];
    if (s.kind == LayerKind::kOffloaded) csa_cadence = std::max(csa_cadence, s.entry_tokens);
  }
  std::vector<int32_t> contexts = c.contexts.empty() ? std::vector{c.context} : c.contexts;
  for (int32_t context : contexts) {
    if (csa_cadence > 0 && context / csa_cadence < c.top_k) {
      return InvalidArgument("--contexts: " + std::to_string(context) + " tokens hold " +
                             std::to_string(context / csa_cadence) +
                             " entries of an offloaded layer, fewer than --top-k (" +
                             std::to_string(c.top_k) + ")" + at);
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckE2ELayers(const BenchConfig& c, const ModelPreset& preset) {
  if (HasDenseLayers(preset)) return CheckE2EEntryLayers(c, preset);
  const int32_t layers = BenchGeometry(c, preset).num_layers();
  for (int32_t l = 0; l < layers && l < static_cast<int32_t>(preset.layers.size()); ++l) {
    const LayerShape& s = preset.layers[l];
    const bool top_k = s.top_k == 0 || s.top_k == c.top_k;
    if (s.kind == LayerKind::kOffloaded && s.entry_tokens == 1 && top_k) continue;
    return Unimplemented("--preset " + c.preset + ": layer " + std::to_string(l) +
                         (top_k ? " is not offloaded with a row per token"
                                : " has a top-k of " + std::to_string(s.top_k) + ", not --top-k") +
                         "; the GPU benchmark runs every layer offloaded, a row per token, one "
                         "--top-k");
  }
  return Status::Ok();
}

RequestShape E2ERequestShape(const BenchConfig& c, const ModelPreset& preset) {
  const KVGeometry geometry = BenchGeometry(c, preset);
  RequestShape shape;
  shape.layers = geometry.num_layers();
  shape.row_bytes = preset.row_bytes;
  shape.indexer_key_bytes = preset.indexer_key_bytes;
  shape.top_k = c.top_k * c.mtp;  // the variants see one row of every query's top-k
  shape.hot_slots = c.hot_slots;
  shape.window = c.window;
  shape.page_tokens = c.page_tokens;
  shape.offload_page_tokens = c.offload_page_tokens;
  shape.index_groups = BenchIndexGroups(c, preset).count();
  shape.keyed_layers =
      static_cast<int32_t>(std::count_if(geometry.layers.begin(), geometry.layers.end(),
                                         [](const LayerShape& l) { return l.indexer_keys; }));
  if (HasDenseLayers(preset)) {
    // DeepSeek-V4: the classes of its first layers, every CSA top-k of --top-k entries, and the
    // indexer keys of its CSA layers charged as the engine would hold them (the steps append
    // none, as for the other presets' keys).
    ModelPreset cut = preset;
    cut.layers.resize(std::min<size_t>(cut.layers.size(), geometry.layers.size()));
    cut.num_layers = static_cast<int32_t>(cut.layers.size());
    cut.top_k = c.top_k;
    for (LayerShape& l : cut.layers) l.top_k = 0;
    shape.classes = LayerClassesOf(cut);
    shape.raw_window = preset.raw_window;
    shape.index_groups = 0;
    shape.keyed_layers = -1;
  }
  return shape;
}

StatusOr<CacheOptions> BenchCacheOptions(const BenchConfig& c) {
  SPARSEKV_ASSIGN_OR_RETURN(const ModelPreset preset, FindPreset(c.preset, c.row_format));
  CacheOptions o = c.cache_base;
  o.geometry = BenchGeometry(c, preset);
  if (NamesIndexGroups(preset)) o.layers_per_index = 1;
  if (HasDenseLayers(preset)) o.raw_window = preset.raw_window;  // DeepSeek-V4's raw window
  o.top_k = c.top_k;
  o.hot_slots = c.hot_slots;
  o.window = c.window;
  o.host_page_tokens = c.page_tokens;
  // The host pool's pages hold page_tokens entries of the offloaded layers' cadence r.
  int64_t unit = c.page_tokens;
  for (int32_t l = o.geometry.num_layers() - 1; l >= 0; --l) {
    const LayerShape& s = o.geometry.layers[l];
    if (s.kind == LayerKind::kOffloaded) unit = int64_t{c.page_tokens} * s.entry_tokens;
  }
  const int64_t tokens_per_request = (int64_t{c.context} + c.steps + unit - 1) / unit * unit;
  o.host_capacity_tokens = tokens_per_request * c.batch;
  o.max_requests = c.batch;
  o.max_host_requests = 0;
  o.max_batch = 0;
  o.max_context = c.context + c.steps + c.page_tokens;
  o.indexer_key_bytes = 0;  // the bench's steps append no indexer keys
  return o;
}

int32_t BatchCap(const BenchConfig& c, KVVariant variant) {
  if (variant != KVVariant::kPageOffload || c.offload_max_batch == 0) return c.max_batch;
  return c.max_batch == 0 ? c.offload_max_batch : std::min(c.max_batch, c.offload_max_batch);
}

BenchConfig WithStandardSweep(BenchConfig config, SweepKeeps keep) {
  if (!keep.contexts) config.contexts = {32768, 16384, 65536, 131072};
  if (!keep.miss_rates) config.miss_rates = {0.2, 0.05, 0.4};
  if (!keep.variants) config.variants = {"full-hbm", "sparsekv", "no-cache", "page-offload"};
  config.batch_given = false;
  return config;
}

StatusOr<BenchResult> RunBench(const BenchConfig& config, std::shared_ptr<Backend> backend,
                               const ProgressFn& progress) {
  using Clock = std::chrono::steady_clock;
  SPARSEKV_RETURN_IF_ERROR(ValidateBenchConfig(config));
  if (backend == nullptr) return InvalidArgument("RunBench: backend is null");
  SPARSEKV_ASSIGN_OR_RETURN(const ModelPreset preset, FindPreset(config.preset, config.row_format));
  auto report = [&](std::string_view phase, int64_t done, int64_t total) {
    if (progress) progress(phase, done, total);
  };

  BenchResult r;
  r.config = config;
  if (r.config.layers == 0) r.config.layers = preset.num_layers;
  const BenchConfig& c = r.config;
  r.backend_name = backend->name();
  r.backend_kind = backend->kind();
  r.preset_layers = preset.num_layers;
  r.row_bytes = preset.row_bytes;
  r.timed_steps = c.steps - c.warmup_steps;

  SPARSEKV_ASSIGN_OR_RETURN(const CacheOptions o, BenchCacheOptions(c));
  const int64_t tokens_per_request = o.host_capacity_tokens / c.batch;
  // A row per entry of the offloaded layers' cadence r.
  const int64_t pool_rows = o.host_capacity_tokens / o.geometry.offloaded_entry_tokens();
  if (pool_rows > kMaxPoolRows) {
    return InvalidArgument("the host pool would hold --batch " + std::to_string(c.batch) + " x " +
                           std::to_string(tokens_per_request) + " tokens (--context " +
                           std::to_string(c.context) + " + --steps " + std::to_string(c.steps) +
                           ", in pages) = " + std::to_string(pool_rows) +
                           " rows, more than its 2^31 - 1; lower --batch or --context");
  }
  SPARSEKV_RETURN_IF_ERROR(CheckBenchMemory(c, o, *backend));
  SPARSEKV_ASSIGN_OR_RETURN(auto manager, SparseKVCacheManager::Create(o, backend));
  Backend& be = *backend;
  const StreamHandle stream = nullptr;
  const int32_t layers = c.layers;
  const IndexGroups groups(o);
  const int64_t stride = o.geometry.layers[0].row_stride;  // uniform geometry
  // The offloaded layers' cadence: their top-k name entries of r tokens (DeepSeek-V4: 4).
  int32_t cadence = 1;
  for (int32_t l = layers - 1; l >= 0; --l) {
    if (o.geometry.layers[l].kind == LayerKind::kOffloaded) {
      cadence = o.geometry.layers[l].entry_tokens;
    }
  }
  const int64_t topk_elems = int64_t{c.batch} * c.top_k;  // one layer's top-k rows

  // Admission and prompt ingestion. Every request reads the same random rows at its own offset:
  // the content does not change the timing, and one buffer keeps set-up fast at any batch.
  std::mt19937_64 rng(c.seed);
  std::vector<std::byte> prompt(static_cast<size_t>(int64_t{c.context} + c.batch) * stride);
  FillRandom(rng, prompt);
  std::vector<RequestId> ids(c.batch);
  std::iota(ids.begin(), ids.end(), RequestId{1});
  for (int32_t b = 0; b < c.batch; ++b) {
    SPARSEKV_RETURN_IF_ERROR(manager->Admit(ids[b], c.context, c.steps, stream));
    for (int32_t l = 0; l < layers; ++l) {
      // The same rows give the entries and, with a raw window, the window's newest rows.
      const std::byte* rows = prompt.data() + int64_t{b} * stride;
      SPARSEKV_RETURN_IF_ERROR(
          manager->IngestPrompt(ids[b], l, PromptRows{.entries = rows, .window = rows}, stream));
    }
    report("ingest", b + 1, c.batch);
  }
  SPARSEKV_RETURN_IF_ERROR(be.Synchronize(stream));
  prompt = {};

  // The run phase's fixed buffers in device memory.
  SPARSEKV_ASSIGN_OR_RETURN(auto topk_device,
                            DeviceMemory::Create(be, layers * topk_elems * sizeof(int32_t)));
  SPARSEKV_ASSIGN_OR_RETURN(auto rows_device,
                            DeviceMemory::Create(be, int64_t{layers} * c.batch * stride));
  SPARSEKV_ASSIGN_OR_RETURN(auto slots_device,
                            DeviceMemory::Create(be, topk_elems * sizeof(int32_t)));
  std::unique_ptr<DeviceMemory> assembled_device;
  if (c.assemble) {
    SPARSEKV_ASSIGN_OR_RETURN(assembled_device, DeviceMemory::Create(be, topk_elems * stride));
  }

  TopKGeneratorOptions g;
  g.top_k = c.top_k;
  g.reuse = c.reuse;
  g.recency = c.recency;
  g.sinks = c.sinks;
  g.seed = c.seed;
  if (!c.miss_rates.empty()) {
    g.miss_rate = c.miss_rates.front();
    g.fresh_range = c.context / cadence;
  }
  std::vector<LayerTopKGenerator> generators;
  for (int32_t l = 0; l < layers; ++l) generators.emplace_back(g, l, c.batch);
  std::vector<int32_t> topk(layers * topk_elems);
  std::vector<std::byte> new_rows(static_cast<size_t>(layers) * c.batch * stride);
  std::vector<int32_t> seq_lens(c.batch);

  for (int32_t step = 0; step < c.steps; ++step) {
    if (step == c.warmup_steps) SPARSEKV_RETURN_IF_ERROR(manager->ResetStats(stream));
    // Inputs (untimed): in an engine the indexer writes top-k on the device.
    // Entries, the new token included.
    std::fill(seq_lens.begin(), seq_lens.end(), (c.context + step + 1) / cadence);
    GenerateStep(generators, seq_lens, topk_elems, topk);
    FillRandom(rng, new_rows);
    SPARSEKV_RETURN_IF_ERROR(
        be.CopyAsync(topk_device->get(), topk.data(), topk.size() * sizeof(int32_t), stream));
    SPARSEKV_RETURN_IF_ERROR(
        be.CopyAsync(rows_device->get(), new_rows.data(), new_rows.size(), stream));
    SPARSEKV_RETURN_IF_ERROR(be.Synchronize(stream));

    const Clock::time_point start = Clock::now();
    SPARSEKV_RETURN_IF_ERROR(manager->PlanStep(ids, stream));
    for (int32_t l = 0; l < layers; ++l) {
      const std::byte* rows = rows_device->get() + int64_t{l} * c.batch * stride;
      SPARSEKV_RETURN_IF_ERROR(
          manager->AppendToken(l, StepRows{.entries = rows, .window = rows}, stream));
      // A resident or window-only layer (DeepSeek-V4) has no top-k: its attention reads the
      // manager's views in place.
      if (o.geometry.layers[l].kind != LayerKind::kOffloaded) continue;
      auto* slots = reinterpret_cast<int32_t*>(slots_device->get());
      void* assembled = assembled_device ? assembled_device->get() : nullptr;
      if (groups.Leads(l)) {
        SPARSEKV_RETURN_IF_ERROR(manager->RunLayer(
            l, reinterpret_cast<const int32_t*>(topk_device->get()) + l * topk_elems, slots,
            assembled, stream));
        continue;
      }
      // A layer of a named group (glm-5.3) reads the slots its group's first layer resolved.
      SPARSEKV_RETURN_IF_ERROR(manager->CopyMisses(l, stream));
      if (assembled != nullptr) {
        SPARSEKV_RETURN_IF_ERROR(manager->AssembleLayer(l, slots, assembled, stream));
      }
    }
    SPARSEKV_RETURN_IF_ERROR(manager->FinishStep(stream));
    SPARSEKV_RETURN_IF_ERROR(be.Synchronize(stream));
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (step >= c.warmup_steps) r.step_ms.push_back(ms);
    report("decode", step + 1, c.steps);
  }

  SPARSEKV_ASSIGN_OR_RETURN(const CacheStats stats, manager->ReadStats(stream));
  std::vector<double> sorted = r.step_ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  r.ms_per_step_median = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  const double total_ms = std::accumulate(sorted.begin(), sorted.end(), 0.0);
  r.ms_per_step_mean = total_ms / static_cast<double>(n);

  r.miss_rate_target = c.miss_rates.empty() ? -1 : c.miss_rates.front();
  r.hit_rate = stats.total.hit_rate();
  r.miss_rate =
      stats.total.hits + stats.total.window_hits + stats.total.misses == 0 ? 0.0 : 1.0 - r.hit_rate;
  for (const LayerStats& l : stats.layers) r.layer_hit_rate.push_back(l.hit_rate());
  r.skipped_entries = stats.total.padding + stats.total.duplicates + stats.total.out_of_range;
  r.bytes_h2d_per_step =
      static_cast<double>(stats.bytes_host_to_device) / static_cast<double>(r.timed_steps);
  r.h2d_gb_per_s = total_ms > 0
                       ? static_cast<double>(stats.bytes_host_to_device) / (total_ms * 1e-3) / 1e9
                       : 0.0;

  r.hot_cache_bytes_per_request = BlockBytes(o);
  r.dense_bytes_per_request = DenseBytesPerRequest(o, c.context);
  r.full_kv_bytes_per_request = FullKvBytesPerRequest(o, c.context);
  const int64_t held = r.hot_cache_bytes_per_request + r.dense_bytes_per_request;
  r.hbm_saved_bytes_per_request = r.full_kv_bytes_per_request - held;
  r.hbm_saved_ratio = static_cast<double>(r.full_kv_bytes_per_request) / static_cast<double>(held);
  r.host_pool_bytes = manager->host_pool().bytes();
  r.options = manager->options();
  return r;
}

std::string ConfigSummary(const BenchConfig& c) {
  std::string given, sized;
  for (const std::string& key : c.config_keys) {
    const bool replaced =
        std::find(BenchSizedKeys().begin(), BenchSizedKeys().end(), key) != BenchSizedKeys().end();
    std::string& list = replaced ? sized : given;
    list += (list.empty() ? "" : ", ") + key;
  }
  return c.config_path + " (" + (given.empty() ? "no keys" : given) +
         (sized.empty() ? "" : "; sized by the bench instead: " + sized) + ")";
}

std::string BackendLabel(const BenchResult& r) {
  if (r.backend_kind == BackendKind::kCuda) return "CUDA backend (" + r.backend_name + ")";
  return r.config.scaled_down ? "CPU reference backend (scaled down)" : "CPU reference backend";
}

namespace {

// The index groups that resolve a top-k: those of offloaded layers.
int32_t ResolvingGroups(const CacheOptions& o) {
  const IndexGroups groups(o);
  int32_t n = 0;
  for (int32_t g = 0; g < groups.count(); ++g) {
    n += o.geometry.layers[groups.First(g)].kind == LayerKind::kOffloaded;
  }
  return n;
}

}  // namespace

std::string FormatBenchTable(const BenchResult& r) {
  const BenchConfig& c = r.config;
  std::vector<std::pair<std::string, std::string>> rows = {
      {"backend", r.backend_name},
      {"preset", c.preset + ", " + std::string(PrecisionName(c.row_format)) + " (" +
                     std::to_string(r.row_bytes) + " B rows), " + std::to_string(c.layers) +
                     " of " + std::to_string(r.preset_layers) + " layers"},
      {"index groups",
       std::to_string(ResolvingGroups(r.options)) + " (top-k resolved once per group)"},
      {"batch", std::to_string(c.batch) + " requests"},
      {"context", std::to_string(c.context) + " tokens"},
      {"steps", std::to_string(c.steps) + " (" + std::to_string(c.warmup_steps) + " warm-up, " +
                    std::to_string(r.timed_steps) + " timed)"},
      {"top-k", std::to_string(c.top_k) + " of " + std::to_string(c.hot_slots) + " hot slots + " +
                    std::to_string(c.window) + " window"},
      {"locality", "reuse " + Fixed(c.reuse, 2) + ", recency " + Fixed(c.recency, 2) + ", sinks " +
                       std::to_string(c.sinks)},
      {"ms per step", Fixed(r.ms_per_step_median, 3) + " median, " + Fixed(r.ms_per_step_mean, 3) +
                          " mean" + (c.assemble ? " (with assemble)" : "")},
      {"hit rate", Fixed(100 * r.hit_rate, 1) + " %"},
      {"miss rate",
       Fixed(100 * r.miss_rate, 1) + " %" +
           (r.miss_rate_target >= 0 ? " (target " + Fixed(100 * r.miss_rate_target, 1) + " %)"
                                    : "")},
      {"host->device",
       HumanBytes(r.bytes_h2d_per_step) + " per step, " + Fixed(r.h2d_gb_per_s, 2) + " GB/s"},
      {"HBM per request",
       "hot cache " + HumanBytes(r.hot_cache_bytes_per_request) +
           (r.dense_bytes_per_request > 0
                ? " + resident entries and raw windows " + HumanBytes(r.dense_bytes_per_request)
                : "") +
           " vs full KV " + HumanBytes(r.full_kv_bytes_per_request)},
      {"HBM saved",
       r.hbm_saved_bytes_per_request >= 0
           ? HumanBytes(r.hbm_saved_bytes_per_request) + " per request (" +
                 Fixed(r.hbm_saved_ratio, 1) + "x)"
           : std::string("none: the hot cache (--hot-slots + --window)") +
                 (r.dense_bytes_per_request > 0 ? " with the resident entries and raw windows"
                                                : "") +
                 " is larger than the full KV of --context"},
      {"host pool", Fixed(static_cast<double>(r.host_pool_bytes) / 1e9, 2) + " GB"},
  };
  if (!c.config_path.empty()) rows.emplace_back("config", ConfigSummary(c));
  std::string out = "sparsekv bench: " + BackendLabel(r) + "\n";
  for (const auto& [name, value] : rows) {
    out += "  " + name + std::string(18 - name.size(), ' ') + value + "\n";
  }
  out +=
      "  (a step = plan + append + resolve + miss copy over all layers; no attention, no "
      "weights)\n";
  if (r.backend_kind == BackendKind::kCpu) {
    out +=
        "  (attention, weight proxy and the full-hbm / no-cache variants run on a GPU only: "
        "skipped on the CPU backend)\n";
  }
  int32_t kinds[3] = {0, 0, 0};  // offloaded, resident, window-only
  for (const LayerShape& l : r.options.geometry.layers) ++kinds[static_cast<int>(l.kind)];
  if (kinds[1] + kinds[2] > 0 || r.options.raw_window > 0) {
    out += "  (layer kinds: " + std::to_string(kinds[0]) + " offloaded, " +
           std::to_string(kinds[1]) + " resident, " + std::to_string(kinds[2]) +
           " window-only, raw window " + std::to_string(r.options.raw_window) +
           "; only the offloaded layers resolve a top-k, of entries; the hot cache and the host "
           "pool hold the offloaded layers only, and full KV counts every layer's entries and "
           "raw window at --context)\n";
  }
  return out;
}

std::string FormatBenchJson(const BenchResult& r, const std::string& command) {
  const BenchConfig& c = r.config;
  nlohmann::ordered_json j;
  j["command"] = command;
  j["label"] = BackendLabel(r);
  j["backend"] = r.backend_kind == BackendKind::kCuda ? "cuda" : "cpu";
  j["backend_name"] = r.backend_name;
  j["scaled_down"] = c.scaled_down;
  j["preset"] = c.preset;
  j["precision"] = PrecisionName(c.row_format);
  j["row_bytes"] = r.row_bytes;
  j["layers"] = c.layers;
  j["preset_layers"] = r.preset_layers;
  j["batch"] = c.batch;
  j["context"] = c.context;
  j["steps"] = c.steps;
  j["warmup_steps"] = c.warmup_steps;
  j["timed_steps"] = r.timed_steps;
  j["top_k"] = c.top_k;
  j["hot_slots"] = c.hot_slots;
  j["window"] = c.window;
  j["page_tokens"] = c.page_tokens;
  j["reuse"] = c.reuse;
  j["recency"] = c.recency;
  j["sinks"] = c.sinks;
  j["seed"] = c.seed;
  j["assemble"] = c.assemble;
  j["ms_per_step_median"] = r.ms_per_step_median;
  j["ms_per_step_mean"] = r.ms_per_step_mean;
  j["step_ms"] = r.step_ms;
  j["hit_rate"] = r.hit_rate;
  j["miss_rate"] = r.miss_rate;
  j["miss_rate_target"] =
      r.miss_rate_target >= 0 ? nlohmann::ordered_json(r.miss_rate_target) : nullptr;
  j["attention"] = "skipped (GPU only)";
  j["proxy"] = "skipped (GPU only)";
  j["layer_hit_rate"] = r.layer_hit_rate;
  j["skipped_entries"] = r.skipped_entries;
  j["bytes_h2d_per_step"] = r.bytes_h2d_per_step;
  j["h2d_gb_per_s"] = r.h2d_gb_per_s;
  j["hot_cache_bytes_per_request"] = r.hot_cache_bytes_per_request;
  j["dense_bytes_per_request"] = r.dense_bytes_per_request;
  j["full_kv_bytes_per_request"] = r.full_kv_bytes_per_request;
  j["hbm_saved_bytes_per_request"] = r.hbm_saved_bytes_per_request;
  j["hbm_saved_ratio"] = r.hbm_saved_ratio;
  j["host_pool_gb"] = static_cast<double>(r.host_pool_bytes) / 1e9;
  j["config"] =
      c.config_path.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(c.config_path);
  j["config_keys"] = c.config_keys;
  j["cache_options"] = nlohmann::ordered_json::parse(CacheOptionsToJson(r.options));
  return j.dump(2) + "\n";
}

}  // namespace sparsekv::tools
