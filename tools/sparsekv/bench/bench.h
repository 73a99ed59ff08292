// The end-to-end decode benchmark behind `sparsekv bench`: a decode loop on the real
// SparseKVCacheManager, fed by synthetic top-k selections (sparsekv/topk_generator.h).
//
// Flow: create a manager sized for the run; admit every request and ingest random prompt KV for
// every layer; then per step: generate the step's top-k rows and new-token rows and upload them
// (untimed), then PlanStep, AppendToken + RunLayer for every layer, FinishStep and a backend
// Synchronize (timed, wall clock). Warm-up steps are run but neither timed nor counted in the
// cache statistics.
//
// What a step's time covers: plan upload, newest-token append and write-back, resolve, miss copy
// (and assemble when enabled) for all layers. No attention and no model weights: it is the cost
// that offloading adds to a decode step, not a decode step. This is the CPU path of `sparsekv
// bench`; on a GPU the command runs the end-to-end comparison of gpu_bench.h instead, which the
// fields under "end to end" configure.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/index_groups.h"
#include "sparsekv/kv_footprint.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv::tools {

struct BenchConfig {
  std::string preset = "deepseek-v3.2";              // a FindPreset name
  KVRowFormat row_format = KVRowFormat::kFp8Row656;  // fp8: 656-B rows; bf16: 1152-B rows
  int32_t layers = 0;                                // 0 = the preset's layer count
  int32_t batch = 32;                                // requests, all decoding in every step
  int32_t context = 32768;                           // prompt tokens per request
  int32_t steps = 16;        // decode steps (per point on the GPU), warm-up included
  int32_t warmup_steps = 4;  // first steps, neither timed nor counted
  int32_t top_k = 2048;
  int32_t hot_slots = 4096;
  int32_t window = 1;
  int32_t page_tokens = 64;
  double reuse = 0.45;    // fraction of each row reused from the previous step (layers >= 2)
  double recency = 0.10;  // fraction drawn from the newest 10% of positions
  int32_t sinks = 4;      // positions 0 .. sinks-1 always selected
  uint64_t seed = 1;
  bool assemble = false;     // also gather the selected rows into a dense buffer
  bool scaled_down = false;  // defaults were reduced for the CPU backend (a label only)
  // --config FILE (docs/config.md): the path ("" without one) and the keys it gives, labels only.
  // The run's CacheOptions start from cache_base (the file's, CacheOptions{} without one), then
  // take the fields of this struct and the bench's sizing (BenchCacheOptions).
  std::string config_path;
  std::vector<std::string> config_keys;
  CacheOptions cache_base;

  // ---- End to end (GPU). Of these, the CPU path uses only miss_rates (one value). ----
  // Miss-rate targets: the generator's miss-rate mode (sparsekv/topk_generator.h) at each rate;
  // empty = the locality parameters above decide, and the miss rate is only measured.
  std::vector<double> miss_rates;
  // Non-empty: the GPU run's timed steps draw their top-k from this locality-mode preset
  // (LocalityPreset in sparsekv/topk_generator.h; "calibrated" = "glm5-published") instead of
  // miss_rates: one point per batch, the miss rate an outcome of the hot cache's size.
  std::string locality;
  // >= 0: the generator's cross_layer_overlap (GPU; layer L + 1's rows share this fraction of
  // positions with layer L's); -1: the locality preset's calibrated value, 0 without a preset.
  double cross_layer_overlap = -1;
  std::vector<int32_t> contexts;  // contexts to run; empty = {context}
  std::vector<std::string> variants = {"full-hbm", "sparsekv", "no-cache", "page-offload"};
  int32_t offload_page_tokens = 64;  // page-offload: tokens per page it fetches and caches
  // page-offload: cap on its batch (0: none). Its page copies run at the PCIe limit from small
  // batches on, so its tokens/s stops growing early while each step grows with the batch.
  int32_t offload_max_batch = 0;
  // sparsekv: layers per shared top-k (CacheOptions::layers_per_index; also applied to the top-k
  // every variant reads).
  int32_t layers_per_index = 1;
  // sparsekv: Resolve sorts each request's misses by host row in steps of at least
  // sort_misses_min_batch requests (CacheOptions::sort_misses, sort_misses_min_batch).
  bool sort_misses = true;
  int32_t sort_misses_min_batch = CacheOptions{}.sort_misses_min_batch;
  // sparsekv: largest grid of the miss and prefetch copies (CacheOptions::copy_blocks; 0: fill the
  // GPU).
  int32_t copy_blocks = CacheOptions{}.copy_blocks;
  // sparsekv: steps of at least this many requests copy each row's misses inside its resolve
  // (CacheOptions::fused_copy_min_batch; 0: never), and how the other copies move their rows
  // (CacheOptions::copy_strategy: lattice, lattice-wide, warp-rows, bulk).
  int32_t fused_copy_min_batch = CacheOptions{}.fused_copy_min_batch;
  int32_t prefetch_copy_blocks = 0;  // sparsekv: CacheOptions::prefetch_copy_blocks
  // sparsekv: a pipelined layer: each chunk of this many batch rows is copied on its own and
  // attended as soon as it is in (CacheOptions::copy_chunk_rows; 0: off). Not with --mtp or
  // --layers-per-index.
  int32_t copy_chunk_rows = 0;
  std::string copy_strategy = "lattice";
  // sparsekv: the SMs cuBLAS plans the attention's and the proxy's GEMMs for
  // (SetSmCountTarget), leaving the rest to the copies that run beside them; 0: all. full-hbm
  // always runs on all of them.
  int32_t compute_sms = 0;
  // sparsekv: the peer tier: every request's prompt rows are also lent by a region on this CUDA
  // device, and misses on them are read from there instead of host memory (peer_tier.h); the
  // decode device itself stands in for a peer on a one-GPU machine. -1: off.
  int32_t peer_device = -1;
  // sparsekv: hybrid residency with a hot cache sized by the HBM budget (CacheOptions::
  // hybrid_residency, device_budget_bytes with hot_slots = 0): the batch the host pool allows,
  // the slots chosen by the library (--hot-slots is then unused), requests resident while
  // they fit (docs/residency.md).
  bool hybrid = false;
  // sparsekv cross-layer speculative prefetch: right after each index group's resolve, its top-k
  // is prefetched into the next group's hot cache on a side stream (PrefetchLayer), ahead of that
  // group's own resolve, which waits for it (docs/prefetch.md).
  bool crosslayer_prefetch = false;
  // sparsekv, with index groups of several layers (--layers-per-index > 1, glm-5.3): the planned
  // copy (StepChoice::planned_copy): right after each group's resolve, every layer of the group
  // is copied on a side stream, and each layer's attention waits only for its own copy. -1: off;
  // 0: its copies on the options' grid (--copy-blocks); B > 0: on B thread blocks.
  int32_t planned_copy = -1;
  // sparsekv: "manual" runs every step in the schedule the flags above name (--crosslayer-prefetch,
  // --planned-copy, --copy-chunk-rows); "auto" lets the library's StepSchedule choose per step
  // (step_schedule.h): it may prefetch, and copies by chunks of --copy-chunk-rows rows (8 if 0) or
  // multiples of it.
  std::string schedule = "manual";
  // Query tokens per request and step (multi-token prediction / speculative decoding), each with
  // its own top-k; the T rows of a request follow one another as consecutive steps' rows do.
  // sparsekv resolves a request's T * top_k entries as one row with share_repeated_positions.
  // full-hbm and sparsekv only.
  int32_t mtp = 1;
  bool batch_given = false;  // run `batch` only, instead of sweeping up to each max batch
  // HBM for everything KV-related, per variant (141 - 84 - 8). The GPU run of a preset with
  // weights_per_gpu_gb (deepseek-v3.2, glm-5.3) takes HbmLeftForKvGb(weights_gb) unless given.
  double hbm_budget_gb = 49;
  double host_pool_gb = 100;  // pinned host pool; also caps the batch of the offloading variants
  int32_t max_batch = 0;      // caps every variant's batch; 0 = no cap
  int32_t heads = 128;        // attention query heads per request (128: DP attention)
  bool proxy = true;          // run the weight-streaming proxy for the rest of the model
  // Proxy weights streamed per step (per-GPU weight bytes); the GPU run of a preset with
  // weights_per_gpu_gb takes the preset's unless given (glm-5.3: 93).
  double weights_gb = 84;
  double time_limit_s = 0;  // stop starting new points after this long; 0 = no limit
  // --trace-step: after each point's timed steps, one more replay of its step under a CUPTI
  // activity trace (gpu_trace.h), kept in E2EReport::step_traces; planned as one more step.
  bool trace_step = false;
};

// The cap on `variant`'s batch: max_batch, and for page-offload also offload_max_batch (0 = no
// cap).
int32_t BatchCap(const BenchConfig& config, KVVariant variant);

// What a command line gave besides --sweep, kept by it.
struct SweepKeeps {
  bool contexts = false;
  bool miss_rates = false;
  bool variants = false;
};

// The standard sweep (--sweep): contexts 32K, 16K, 64K, 128K (32K first: the summary keys use
// it), miss rates 20%, 5%, 40%, every variant, every batch size up to each max batch; contexts,
// miss rates and variants that `keep` marks stay as `config` has them.
BenchConfig WithStandardSweep(BenchConfig config, SweepKeeps keep = {});

// InvalidArgument naming the offending option (as spelled on the command line) if the
// configuration cannot run, e.g. top_k > context.
Status ValidateBenchConfig(const BenchConfig& config);

// "FILE (its keys; sized by the bench instead: the keys of BenchSizedKeys it has)", for the
// reports of a run with --config.
std::string ConfigSummary(const BenchConfig& config);

// The CacheOptions keys the bench sets for its own workload, whatever config.cache_base says:
// the host pool and the request limits, from --batch, --context and --steps, and
// indexer_key_bytes (0: its steps append no indexer keys; the GPU run's --hybrid sets the
// preset's).
const std::vector<std::string>& BenchSizedKeys();

// The HBM an H200 (141 GB) leaves for everything KV-related beside `weights_gb` of weights per
// GPU and 8 GB of activations and runtime: 49 for DeepSeek-V3.2's 84, 40 for GLM-5.3's 93.
inline double HbmLeftForKvGb(double weights_gb) { return 141 - weights_gb - 8; }

// The GPU run's standard scenario of config.preset (docs/workload-shapes.md) where the flags
// leave it open: the preset's weights per GPU as weights_gb unless `weights_given`, and the HBM
// they leave (HbmLeftForKvGb) as hbm_budget_gb unless `hbm_given`. A preset without
// weights_per_gpu_gb (or an unknown one) leaves `config` as it is.
void ApplyPresetScenario(BenchConfig& config, bool weights_given, bool hbm_given);

// Whether the preset has resident or window-only layers or a raw window (DeepSeek-V4).
bool HasDenseLayers(const ModelPreset& preset);

// Whether the preset's layers name their index groups (LayerShape::index_group: glm-5.3).
bool NamesIndexGroups(const ModelPreset& preset);

// The benchmark's layers: config.layers (or the preset's count if 0) of the preset's rows; for a
// preset that names its index groups, its first layers' groups, top-k and indexer keys (a cut
// group stays a group); for DeepSeek-V4, its first layers' kinds and cadences, every offloaded
// layer at --top-k and without indexer keys.
KVGeometry BenchGeometry(const BenchConfig& config, const ModelPreset& preset);

// The index groups every variant of the run shares a top-k by: the preset's named groups (glm-5.3:
// {0}, {1}, {2-5}, ...), or groups of config.layers_per_index; each of config.top_k.
IndexGroups BenchIndexGroups(const BenchConfig& config, const ModelPreset& preset);

// OK if the end-to-end GPU run can plan the preset's layers it runs (its first config.layers, or
// all). A preset without resident or window-only layers: every layer offloaded with a row per token
// and config.top_k entries per top-k (glm-5.3, deepseek-v3.2, glm-5), else Unimplemented naming
// the preset and the layer. DeepSeek-V4 (HasDenseLayers): its CSA, HCA and window-only layers,
// planned for full-hbm and sparsekv only (the variants kv_footprint.h defines for layer classes),
// with config.layers <= the preset's, every context holding config.top_k CSA entries, and none of
// --hybrid, --mtp > 1, --layers-per-index > 1, --peer-device; InvalidArgument naming the option
// otherwise.
Status CheckE2ELayers(const BenchConfig& config, const ModelPreset& preset);

// The request shape of the end-to-end run (tokens unset; the plan sets each context's): the
// preset's rows and key size, config.layers of them, top_k for config.mtp queries, the sparsekv
// and page-offload fields of `config`, and the index groups and keyed layers of BenchIndexGroups
// and BenchGeometry (what the manager's hot cache and the HBM budget count). DeepSeek-V4: the
// layer classes (LayerClassesOf) of its first config.layers layers, each CSA top-k of
// config.top_k entries and its CSA layers' indexer keys charged, and the preset's raw window, so
// that Footprint and PlanVariant size full-hbm and sparsekv by kind (page_tokens counts entries).
RequestShape E2ERequestShape(const BenchConfig& config, const ModelPreset& preset);

// The options of the CPU run's manager: config.cache_base with the geometry (the preset's rows,
// config.layers of them, or the preset's count if 0; for a preset that names its index groups,
// its first layers' groups and top-k), top_k, hot_slots, window and host_page_tokens of
// `config`, and the BenchSizedKeys sized for `config`'s requests. Not validated
// (SparseKVCacheManager::Create does that). NotFound for an unknown preset.
StatusOr<CacheOptions> BenchCacheOptions(const BenchConfig& config);

struct BenchResult {
  BenchConfig config;        // as run: layers is the resolved count
  std::string backend_name;  // Backend::name()
  BackendKind backend_kind = BackendKind::kCpu;
  int32_t preset_layers = 0;  // the preset's full layer count
  int32_t row_bytes = 0;      // KV bytes per token and layer
  int32_t timed_steps = 0;    // steps - warmup_steps

  std::vector<double> step_ms;  // wall time of each timed step
  double ms_per_step_median = 0;
  double ms_per_step_mean = 0;

  // hit_rate = (hits + window_hits) / (hits + window_hits + misses) over timed steps and all
  // layers; miss_rate = 1 - hit_rate. miss_rate_target: the generator's, or < 0 (locality mode).
  double miss_rate_target = -1;
  double hit_rate = 0;
  double miss_rate = 0;
  std::vector<double> layer_hit_rate;  // the same per layer
  uint64_t skipped_entries = 0;        // padding + duplicates + out of range (0 by construction)

  // Misses' rows copied host -> device per timed step (bytes_host_to_device / timed_steps), and
  // that volume over the mean step time.
  double bytes_h2d_per_step = 0;
  double h2d_gb_per_s = 0;

  // HBM one request holds in the hot cache (HotCache::BlockBytes: slots + window rows over the
  // offloaded layers, plus their groups' replacement state) and, with DeepSeek-V4's layer kinds,
  // its resident layers' entries in pages and every layer's raw window at --context ("dense"),
  // vs what its full KV would take: context * token bytes, or with layer kinds floor(context / r)
  // entries of every offloaded and resident layer and every layer's raw window.
  int64_t hot_cache_bytes_per_request = 0;
  int64_t dense_bytes_per_request = 0;
  int64_t full_kv_bytes_per_request = 0;
  int64_t hbm_saved_bytes_per_request = 0;  // full - (hot + dense)
  double hbm_saved_ratio = 0;               // full / (hot + dense)
  int64_t host_pool_bytes = 0;              // the whole pinned pool
  CacheOptions options;                     // the manager's, as created
};

// Called with the phase ("ingest" or "decode"), units done and units in all.
using ProgressFn = std::function<void(std::string_view phase, int64_t done, int64_t total)>;

// Runs the benchmark on `backend`. Errors: InvalidArgument for a bad configuration, anything the
// manager or backend returns (e.g. ResourceExhausted when the pool cannot be allocated).
StatusOr<BenchResult> RunBench(const BenchConfig& config, std::shared_ptr<Backend> backend,
                               const ProgressFn& progress = nullptr);

// The human-readable report: one "name  value" line per figure, headed by the backend label.
std::string FormatBenchTable(const BenchResult& result);
// The same figures as a JSON object (pretty-printed); `command` is recorded as given.
std::string FormatBenchJson(const BenchResult& result, const std::string& command);
// "CPU reference backend (scaled down)", "CPU reference backend" or "CUDA backend (<name>)".
std::string BackendLabel(const BenchResult& result);

std::string_view PrecisionName(KVRowFormat format);

}  // namespace sparsekv::tools
