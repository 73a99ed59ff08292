// The results of the end-to-end GPU benchmark (docs/benchmark.md) and their three renderings: the
// table printed last, the JSON record (every point, the ceilings, the checks, the summary keys) and
// a CSV with one line per point. Pure code: the tests build reports by hand.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sparsekv/kv_footprint.h"
#include "tools/sparsekv/bench/step_trace.h"

namespace sparsekv::tools {

// One (variant, context, miss rate, batch) measurement. Times are medians over the timed steps.
// For page-offload, lookups, hits and misses are counted in pages (the distinct pages of each
// top-k row; a miss is a page copied), as is misses_per_step.
struct E2EPoint {
  std::string preset;
  KVVariant variant = KVVariant::kSparseKV;
  int32_t context = 0;
  std::optional<double> miss_rate_target;  // sparsekv, page-offload in miss-rate mode; else none
  int32_t batch = 0;
  int32_t max_batch = 0;  // the variant's largest batch under the budgets at this context
  int32_t timed_steps = 0;
  int32_t hot_slots = 0;  // sparsekv: LRU slots per request and layer (chosen with --hybrid)
  int32_t resident_requests = 0;  // sparsekv --hybrid: of the batch, requests resident in HBM
  // sparsekv: the step schedule of the timed steps (StepChoice::ToString) and why it was chosen.
  std::string schedule, schedule_reason;

  double tpot_ms = 0;  // step time of the captured graph replay (all layers), median
  double tpot_min_ms = 0;
  double tpot_max_ms = 0;
  double tokens_per_s = 0;  // batch / tpot
  int64_t hbm_bytes_per_request = 0;
  int64_t host_bytes_per_request = 0;

  // hit_rate = resident lookups / all lookups (full-hbm 1, no-cache 0); miss_rate = 1 - hit_rate.
  double hit_rate = 0;
  double miss_rate = 0;
  double misses_per_step = 0;         // rows fetched from the host per step
  double prefetch_rows_per_step = 0;  // rows prefetched (sparsekv --prefetch), also in pcie_bytes
  double pcie_bytes_per_step = 0;
  double pcie_gbps = 0;        // pcie_bytes_per_step / tpot (a step average)
  double pcie_to_ceiling = 0;  // pcie_gbps / the pinned-memcpy ceiling
  double attention_us_per_layer = 0;
  double proxy_us_per_layer = 0;
  double topk_host_ms = 0;    // generating the step's top-k on the host (untimed), median
  double topk_upload_ms = 0;  // uploading it (untimed), median
  double floor_ms = 0;        // StepFloorMs
  double ideal_ms = 0;        // StepIdealMs
  double step_to_floor = 0;   // tpot / floor
};

// The correctness check of one variant against full-hbm: the attention outputs of every layer of
// the same check steps, compared byte for byte.
struct E2ECheck {
  std::string preset;
  KVVariant variant = KVVariant::kSparseKV;
  int32_t context = 0;
  int32_t batch = 0;
  int32_t steps = 0;
  int64_t bytes_compared = 0;
  int64_t bytes_different = 0;
  bool output_nonzero = false;  // the reference output is not all zeros (the check means something)
  bool passed() const { return bytes_compared > 0 && bytes_different == 0 && output_nonzero; }
};

struct E2EReport {
  std::string command;
  // --config FILE: its path ("" without one), ConfigSummary, and its CacheOptions as read
  // (CacheOptionsToJson), which every point's manager starts from before the bench sizes it.
  std::string config;
  std::string config_summary;
  std::string config_options;
  std::string device;
  std::string preset;
  std::string precision;
  int32_t layers = 0;
  int32_t row_bytes = 0;
  int32_t top_k = 0;
  int32_t hot_slots = 0;
  int32_t window = 0;
  int32_t page_tokens = 0;
  int32_t offload_page_tokens = 0;  // page-offload's page
  int32_t heads = 0;
  bool proxy = true;
  double proxy_weights_gb = 0;        // per step, as asked
  int64_t proxy_bytes_per_layer = 0;  // as streamed (rounded to the GEMM shape)
  double hbm_budget_gb = 0;
  double host_pool_gb = 0;         // the budget
  double host_pool_pinned_gb = 0;  // allocated
  // The arena's start-up: mapped, populated and registered in chunks (host_memory.h);
  // host_pool_ready_gb_per_s = host_pool_pinned_gb / host_pool_ready_s.
  double host_pool_ready_s = 0;
  double host_pool_ready_gb_per_s = 0;
  int32_t steps = 0;
  int32_t warmup_steps = 0;
  Ceilings ceilings;
  std::vector<E2EPoint> points;
  std::vector<E2ECheck> checks;
  std::vector<std::string> notes;      // what was skipped, and why
  std::vector<StepTrace> step_traces;  // --trace-step: one traced step per point, in their order
};

// The flat summary keys (docs/benchmark.md), computed from the points at 32K context; a key whose
// points are missing is null.
//   e2e_throughput_ratio_vs_full_hbm_32k_m20: peak sparsekv tokens/s (miss rate 20%) / peak
//     full-hbm tokens/s, each over its batches (the largest is its max batch under the budget);
//   e2e_throughput_to_ideal_32k_m20: that sparsekv peak / max over its batches of batch / floor;
//   e2e_throughput_ratio_vs_page_offload_32k_m20: that sparsekv peak / peak page-offload tokens/s
//     (miss rate 20%);
//   e2e_tpot_overhead_b1_m5, _m20: sparsekv TPOT / full-hbm TPOT - 1 at batch 1;
//   e2e_step_to_floor_ratio: sparsekv (20%) step / floor at its largest batch.
// Over every context: e2e_min_ratio_vs_full_hbm (_m5, _m20), and per context in the locality mode
// e2e_throughput_ratio_vs_full_hbm_<model><C>_calibrated (C: "32k", ..., "1m"). For a model other
// than DeepSeek-V3.2 (<model>: "glm53", "v4pro", "v4flash"), per context C in the locality mode
// e2e_throughput_ratio_vs_full_hbm_<model>_<C> (sparsekv at its largest batch, the host pool's,
// over full-hbm's peak), e2e_ideal_ratio_vs_full_hbm_<model>_<C> (the same point's ideal
// throughput over full-hbm's peak), and e2e_min_ratio_vs_full_hbm_<model> (the smallest ratio at
// a batch both ran).
std::string FormatE2ESummaryJson(const E2EReport& report);
std::string FormatE2EJson(const E2EReport& report);
std::string FormatE2ECsv(const E2EReport& report);
std::string FormatE2ETable(const E2EReport& report);

}  // namespace sparsekv::tools
