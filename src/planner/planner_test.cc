// Tests of the planner's model on hand-computed cases and of its calibration (a round trip and
// the committed H200 results).
#include "sparsekv/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "sparsekv/options.h"
#include "sparsekv/planner_calibration.h"

namespace sparsekv {
namespace {

// Two layers of 1e9 weight bytes at 1000 GB/s (1000 µs per layer), attention 10 + 2B µs,
// sparsekv overhead 5 + B µs, gather 10 GB/s on a 20 GB/s link (efficiency 0.5); rows of 1000 B,
// top-k 100.
struct HandCase {
  Calibration cal;
  ModelShape model;
  GpuSpec gpu;
  HandCase() {
    cal.attention_fixed_us = 10;
    cal.attention_per_request_us = 2;
    cal.weight_gbps = 1000;
    cal.rest_per_request_us = 0;
    cal.sparsekv = {5, 1, 10};
    cal.link_gbps = 20;
    model.layers = 2;
    model.row_bytes = 1000;
    model.top_k = 100;
    model.weights_gb = 2;
    gpu.flops_tflops = 0;  // no roofline term
  }
};

TEST(PlanModelTest, SerialStepAddsEveryPart) {
  HandCase h;
  // Per layer at B = 4, miss 0.5: attention 18, rest 1000, overhead 9, transfer 200 rows * 1000 B
  // / 10 GB/s = 20 µs; two layers.
  const StepTime t = PredictStep(h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0.5, 0, 0});
  EXPECT_DOUBLE_EQ(t.attention_ms, 0.036);
  EXPECT_DOUBLE_EQ(t.rest_ms, 2.0);
  EXPECT_DOUBLE_EQ(t.overhead_ms, 0.018);
  EXPECT_DOUBLE_EQ(t.transfer_ms, 0.040);
  EXPECT_DOUBLE_EQ(t.total_ms, 2.094);
  EXPECT_EQ(t.binding, "weights");
}

TEST(PlanModelTest, AllHiddenIsTheLongerOfComputeAndTransfer) {
  HandCase h;
  const StepTime t = PredictStep(h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0.5, 0, 1});
  EXPECT_DOUBLE_EQ(t.total_ms, 0.018 + 2.036);
  // A slow link makes the transfer the binding part even when overlapped.
  h.cal.sparsekv.gather_gbps = 0.1;
  const StepTime slow = PredictStep(h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0.5, 0, 1});
  EXPECT_DOUBLE_EQ(slow.transfer_ms, 4.0);
  EXPECT_DOUBLE_EQ(slow.total_ms, 0.018 + 4.0);
  EXPECT_EQ(slow.binding, "transfer");
}

TEST(PlanModelTest, HiddenFractionHidesThatShareOfTheTransfer) {
  HandCase h;
  // Half of the 0.040 ms transfer hidden behind 2.036 ms of compute.
  const StepTime t = PredictStep(h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0.5, 0, 0.5});
  EXPECT_DOUBLE_EQ(t.total_ms, 0.018 + 2.036 + 0.020);
  // Never more than the compute: a 4 ms transfer hides at most 2.036 ms.
  h.cal.sparsekv.gather_gbps = 0.1;
  const StepTime slow = PredictStep(h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0.5, 0, 0.75});
  EXPECT_DOUBLE_EQ(slow.total_ms, 0.018 + 4.0);
}

TEST(PlanModelTest, TierBandwidthScalesByGatherEfficiency) {
  HandCase h;
  // A 40 GB/s tier at efficiency 0.5 gathers at 20 GB/s: half the calibrated transfer.
  const StepTime t = PredictStep(h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0.5, 40, 0});
  EXPECT_DOUBLE_EQ(t.transfer_ms, 0.020);
}

TEST(PlanModelTest, FullHbmMovesNoRowsAndRooflineBoundsLargeBatches) {
  HandCase h;
  EXPECT_EQ(PredictStep(h.cal, h.model, h.gpu, {KVVariant::kFullHbm, 4, 0.5, 0, 0}).transfer_ms, 0);
  // 1 TFLOP/s, bf16: 5e8 params per layer, 2 * 5e8 * 4 flops = 4000 µs > 1000 µs of streaming.
  h.gpu.flops_tflops = 1;
  EXPECT_DOUBLE_EQ(PredictStep(h.cal, h.model, h.gpu, {KVVariant::kFullHbm, 4, 0.5, 0, 0}).rest_ms,
                   8.0);
}

TEST(PlanModelTest, LimitsByHbmCapacityAndLatency) {
  HandCase h;
  RequestShape r;
  r.layers = 2;
  r.row_bytes = 1000;
  r.top_k = 100;
  r.hot_slots = 200;
  r.tokens = 100000;
  const RequestFootprint f = Footprint(KVVariant::kSparseKV, r);
  h.gpu.hbm_gb = 2 + 0 + 1;  // weights 2, reserved 0: a 1 GB budget
  h.gpu.reserved_gb = 0;
  // Per layer TPOT(B) = 1015 + 8B µs (attention 10+2B, rest 1000, overhead 5+B, transfer 5B);
  // two layers: B <= 5 keeps it within 2.11 ms.
  const BatchLimits l = Limits(h.cal, h.model, h.gpu, r, {KVVariant::kSparseKV, 1, 0.5, 0, 0},
                               /*tier_capacity_gb=*/1, /*tpot_slo_ms=*/2.11);
  EXPECT_EQ(l.by_hbm, static_cast<int32_t>(1e9 / f.hbm_bytes));
  EXPECT_EQ(l.by_capacity, static_cast<int32_t>(1e9 / f.host_bytes));
  EXPECT_EQ(l.by_latency, 5);
  EXPECT_EQ(l.max_batch(), std::min({l.by_hbm, l.by_capacity, 5}));
  const BatchLimits none =
      Limits(h.cal, h.model, h.gpu, r, {KVVariant::kFullHbm, 1, 0, 0, 0}, 1, 0);
  EXPECT_EQ(none.by_capacity, kUnlimited);
  EXPECT_EQ(none.by_latency, kUnlimited);
  EXPECT_EQ(none.binding(), "hbm");
}

// Points made by the model itself must be fitted back exactly.
TEST(PlanCalibrationTest, FitRecoversTheModelsParameters) {
  Calibration truth;
  truth.sparsekv = {30, 1.5, 40};
  truth.no_cache = {12, 0, 45};  // no per-request term: see FitCalibration
  truth.full_hbm = {4, 0.5, 0};
  MeasuredRun run;
  run.pcie_h2d_gbps = truth.link_gbps;
  ModelShape model;
  GpuSpec gpu;
  gpu.flops_tflops = 0;
  for (KVVariant v : {KVVariant::kFullHbm, KVVariant::kSparseKV, KVVariant::kNoCache}) {
    for (int32_t b : {1, 4, 16, 64}) {
      for (double m : {0.05, 0.4}) {
        MeasuredPoint p;
        p.preset = "x";
        p.variant = v;
        p.batch = b;
        p.model = model;
        p.attention_us_per_layer = truth.attention_fixed_us + truth.attention_per_request_us * b;
        p.proxy_us_per_layer = model.weights_gb * 1e9 / model.layers / (truth.weight_gbps * 1e3) +
                               truth.rest_per_request_us * b;
        p.misses_per_step = v == KVVariant::kSparseKV  ? b * m * model.top_k * model.layers
                            : v == KVVariant::kNoCache ? b * model.top_k * model.layers
                                                       : 0;
        p.tpot_ms = PredictStep(truth, model, gpu, {v, b, m, 0, 0}).total_ms;
        run.points.push_back(p);
      }
    }
  }
  StatusOr<Calibration> fit = FitCalibration(run);
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  EXPECT_NEAR(fit->weight_gbps, truth.weight_gbps, 1e-6 * truth.weight_gbps);
  EXPECT_NEAR(fit->sparsekv.fixed_us, 30, 1e-6);
  EXPECT_NEAR(fit->sparsekv.per_request_us, 1.5, 1e-6);
  EXPECT_NEAR(fit->sparsekv.gather_gbps, 40, 1e-6);
  EXPECT_NEAR(fit->no_cache.gather_gbps, 45, 1e-6);
  EXPECT_LT(CheckCalibration(*fit, run).max_abs_error_pct, 1e-6);
  // What the per-request attention term read: every point's top-k rows.
  EXPECT_EQ(fit->attention_bytes_per_request, double{1} * model.top_k * model.row_bytes);
}

// The acceptance criterion on the committed H200 results: every point within 15%.
TEST(PlanCalibrationTest, CommittedResultsWithinFifteenPercent) {
  const std::string dir = std::string(SPARSEKV_SOURCE_DIR) + "/bench/results/2026-11-30-e2e-sweep/";
  StatusOr<MeasuredRun> run =
      ReadMeasured({dir + "e2e-deepseek-v3.2.json", dir + "e2e-glm-5.json"});
  ASSERT_TRUE(run.ok()) << run.status().message();
  StatusOr<Calibration> fit = FitCalibration(*run);
  ASSERT_TRUE(fit.ok());
  EXPECT_LT(CheckCalibration(*fit, *run).max_abs_error_pct, 15);
  // Out of sample: GLM-5 predicted from DeepSeek-V3.2 alone.
  const auto preset = [](const MeasuredPoint& p) { return p.preset; };
  StatusOr<CalibrationCheck> held = HoldOutCalibration(*run, preset, {"glm-5"});
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->points.size(), 126u);
  EXPECT_LT(held->max_abs_error_pct, 15);
  // The built-in defaults are this fit to fewer digits; both presets read 2048 rows of 656 B.
  EXPECT_LT(CheckCalibration(Calibration{}, *run).max_abs_error_pct, 15);
  EXPECT_EQ(fit->attention_bytes_per_request, Calibration{}.attention_bytes_per_request);
}

TEST(PlanCalibrationTest, RejectsFilesWithoutPoints) {
  const std::string path = ::testing::TempDir() + "/not_bench.json";
  std::ofstream(path) << R"({"summary": {}})";
  EXPECT_EQ(ReadMeasured({path}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadMeasured({path + ".missing"}).status().code(), StatusCode::kInvalidArgument);
}

TEST(HostPoolReadyTest, TimeIsSizeOverRateInChunksOf64GiB) {
  const HostPoolReady one_tb = ModelHostPoolReady(1000, 2.0);
  EXPECT_DOUBLE_EQ(one_tb.seconds, 500);
  EXPECT_EQ(one_tb.chunks, 15);  // 1e12 B / 64 GiB = 14.55
  EXPECT_TRUE(one_tb.single_registration_fails);
  const HostPoolReady two_tb = ModelHostPoolReady(2000, 2.0);
  EXPECT_DOUBLE_EQ(two_tb.seconds, 1000);
  EXPECT_EQ(two_tb.chunks, 30);
  const HostPoolReady small = ModelHostPoolReady(100, 4.0);
  EXPECT_EQ(small.chunks, 2);
  EXPECT_FALSE(small.single_registration_fails);
  EXPECT_FALSE(ModelHostPoolReady(549, 1).single_registration_fails);  // 511.3 GiB
  EXPECT_TRUE(ModelHostPoolReady(550, 1).single_registration_fails);   // 512.2 GiB
  EXPECT_EQ(ModelHostPoolReady(0, 1).chunks, 0);
}

// ---- ForecastSchedule ----

// The hand case's manager: two layers of 1000-B rows, top-k 100, one index group per layer.
CacheOptions HandOptions(int32_t max_prefetch, int32_t copy_chunk_rows) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(2, 1000);
  o.top_k = 100;
  o.hot_slots = 200;
  o.max_prefetch = max_prefetch;
  o.copy_chunk_rows = copy_chunk_rows;
  return o;
}

TEST(ScheduleForecastTest, SerialIsTheOnlyCandidateWithoutPrefetchOrChunks) {
  HandCase h;
  const ScheduleForecast f = ForecastSchedule(
      h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0.5, 0, 0}, HandOptions(0, 0));
  ASSERT_EQ(f.candidates.size(), 1u);
  EXPECT_EQ(f.candidates[0].choice.ToString(), "serial");
  EXPECT_DOUBLE_EQ(f.candidates[0].total_ms, 2.094);  // PredictStep at h = 0
  EXPECT_EQ(f.reason,
            "the only choice the options allow (max_prefetch < top_k: no prefetch; "
            "copy_chunk_rows 0: no chunks)");
}

// One index group of both layers: no prefetch, but the planned copy, on the options' grid and on
// the bounded one; neither is modelled, so serial stays expected.
TEST(ScheduleForecastTest, ASharedIndexGroupListsThePlannedCopyAsNotModelled) {
  HandCase h;
  CacheOptions o = HandOptions(100, 4);
  o.layers_per_index = 2;
  const ScheduleForecast f =
      ForecastSchedule(h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0.5, 0, 0}, o);
  std::vector<std::string> names;
  for (const ScheduleEstimate& e : f.candidates) names.push_back(e.choice.ToString());
  EXPECT_EQ(names, (std::vector<std::string>{"serial", "planned", "planned:16"}));
  for (size_t i = 1; i < f.candidates.size(); ++i) {
    EXPECT_FALSE(f.candidates[i].modelled);
    EXPECT_NE(f.candidates[i].why.find("not modelled: the copies of a shared indexer"),
              std::string::npos)
        << f.candidates[i].why;
  }
  EXPECT_EQ(f.expected, 0u);
  EXPECT_EQ(f.reason, "no other candidate is modelled faster");
}

// Attention 10 + 50 * 4 = 210 µs per layer, transfer 200 rows * 1000 B at 1 GB/s = 200 µs:
// serial 2 * (9 + 210 + 1000 + 200) µs = 2.838 ms. Two slices of 2 rows: (0.40 + 0.42) / 2 +
// 0.42 / 2 = 0.62 ms of copies and attention, 2 * 2 * 10 µs of launches: 0.018 + 2 + 0.62 + 0.04.
TEST(ScheduleForecastTest, ChunksWinWhenAttentionCoversTheirCopies) {
  HandCase h;
  h.cal.attention_per_request_us = 50;
  h.cal.sparsekv.gather_gbps = 1;
  const ScheduleForecast f = ForecastSchedule(
      h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0.5, 0, 0}, HandOptions(0, 2));
  ASSERT_EQ(f.candidates.size(), 2u);
  EXPECT_DOUBLE_EQ(f.candidates[0].total_ms, 2.838);
  EXPECT_EQ(f.candidates[1].choice.ToString(), "chunks2");
  EXPECT_NEAR(f.candidates[1].total_ms, 2.678, 1e-12);
  EXPECT_EQ(f.expected, 1u);
  EXPECT_EQ(f.reason,
            "2 slices: copies beside attention hide 0.20 ms of 0.40 ms of transfer, for 0.04 ms "
            "of launches; 0.16 ms below serial");
}

// Attention 18 µs per layer, transfer 200 µs: two slices hide only 9 µs a layer for 20 µs of
// launches (2.476 ms), while the prefetch hides 34% of the transfer: 0.018 + 2.036 + 0.66 * 0.4
// = 2.318 ms against serial's 2.454. Of the six allowed choices, the prefetch on every SM and the
// prefetch with chunks are not modelled.
TEST(ScheduleForecastTest, ThePrefetchOnTheBoundedGridWinsWhenAttentionIsShort) {
  HandCase h;
  h.cal.sparsekv.gather_gbps = 1;
  const ScheduleForecast f = ForecastSchedule(
      h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0.5, 0, 0}, HandOptions(100, 2));
  std::vector<std::string> names;
  for (const ScheduleEstimate& e : f.candidates) names.push_back(e.choice.ToString());
  EXPECT_EQ(names, (std::vector<std::string>{"serial", "chunks2", "prefetch", "prefetch+chunks2",
                                             "prefetch:16", "prefetch:16+chunks2"}));
  EXPECT_DOUBLE_EQ(f.candidates[0].total_ms, 2.454);
  EXPECT_NEAR(f.candidates[1].total_ms, 2.476, 1e-12);
  EXPECT_FALSE(f.candidates[2].modelled);
  EXPECT_NE(f.candidates[2].why.find("every SM"), std::string::npos) << f.candidates[2].why;
  EXPECT_FALSE(f.candidates[3].modelled);
  EXPECT_NEAR(f.candidates[4].total_ms, 2.318, 1e-12);
  EXPECT_FALSE(f.candidates[5].modelled);
  EXPECT_EQ(f.expected, 4u);
  EXPECT_EQ(f.reason, "hides 34% of the transfer behind the previous layer; 0.14 ms below serial");
}

TEST(ScheduleForecastTest, NothingMissingKeepsSerial) {
  HandCase h;
  const ScheduleForecast f = ForecastSchedule(
      h.cal, h.model, h.gpu, {KVVariant::kSparseKV, 4, 0, 0, 0}, HandOptions(100, 2));
  EXPECT_EQ(f.expected, 0u);
  EXPECT_EQ(f.reason, "nothing misses: no copy to hide");
}

// A model with layers of several kinds, from its preset (what `sparsekv plan` models for
// DeepSeek-V4), at its standard scenario's weights.
ModelShape ShapeOf(const std::string& name) {
  const ModelPreset p = *FindPreset(name);
  ModelShape m;
  m.layers = p.num_layers;
  m.row_bytes = p.row_bytes;
  m.indexer_key_bytes = p.indexer_key_bytes;
  m.top_k = p.top_k;
  m.weights_gb = p.weights_per_gpu_gb;
  m.classes = LayerClassesOf(p);
  m.raw_window = p.raw_window;
  return m;
}

// DeepSeek-V4-Pro at 1M tokens on an H200 (24.9 GB for KV): 4 requests with every entry in HBM,
// 19 with the CSA entries offloaded, which any host tier of 250 GB to 2 TB holds.
TEST(CapacityTest, DeepSeekV4ProAtOneMillionIsBoundByHbm) {
  const std::vector<MemoryTier> tiers = {
      {"dram-250", 250, 55}, {"dram-500", 500, 55}, {"dram-1t", 1000, 55}, {"dram-2t", 2000, 55}};
  const CapacityCase c = Capacity(ShapeOf("deepseek-v4-pro"), GpuSpec{}, tiers, 1048576, 2048);
  EXPECT_EQ(c.full_hbm_batch, 4);
  EXPECT_EQ(c.offloaded_by_hbm, 19);
  EXPECT_EQ(c.offloaded_by_tier, (std::vector<int32_t>{19, 19, 19, 19}));
  EXPECT_NEAR(c.offloaded.host_bytes / 1e9, 4.59, 0.005);
}

// DeepSeek-V4-Flash at 1M (113 GB for KV): 131 requests by HBM, 77 in 250 GB of host memory.
TEST(CapacityTest, DeepSeekV4FlashAtOneMillionIsBoundByASmallHostTier) {
  const std::vector<MemoryTier> tiers = {{"dram-250", 250, 55}, {"dram-2t", 2000, 55}};
  const CapacityCase c = Capacity(ShapeOf("deepseek-v4-flash"), GpuSpec{}, tiers, 1048576, 1024);
  EXPECT_EQ(c.full_hbm_batch, 27);
  EXPECT_EQ(c.offloaded_by_hbm, 131);
  EXPECT_EQ(c.offloaded_by_tier, (std::vector<int32_t>{77, 131}));
}

TEST(CapacityTest, NodeDramTierIsEachGpusShareOfTheNode) {
  const MemoryTier t = NodeDramTier(250, 8, 55);
  EXPECT_EQ(t.name, "node-250GB");
  EXPECT_EQ(t.capacity_gb, 31.25);
  EXPECT_EQ(t.gbps, 55);
  EXPECT_EQ(NodeDramTier(2000, 8, 55).name, "node-2000GB");
  EXPECT_EQ(NodeDramTier(2000, 4, 55).capacity_gb, 500);
}

// DeepSeek-V4-Pro at 1M with 250 GB to 2 TB of DRAM per 8-GPU node (31.25 to 250 GB per GPU) and
// 4.59 GB of host memory per request: the two smaller nodes bind (6 and 13 requests per GPU), from
// 1 TB per node the HBM does (19).
TEST(CapacityTest, DeepSeekV4ProAtOneMillionOnNodesOf250GbTo2Tb) {
  std::vector<MemoryTier> tiers;
  for (double node_gb : {250.0, 500.0, 1000.0, 2000.0}) {
    tiers.push_back(NodeDramTier(node_gb, 8, 55));
  }
  const CapacityCase c = Capacity(ShapeOf("deepseek-v4-pro"), GpuSpec{}, tiers, 1048576, 2048);
  EXPECT_EQ(c.offloaded_by_hbm, 19);
  EXPECT_EQ(c.offloaded_by_tier, (std::vector<int32_t>{6, 13, 19, 19}));
}

// A uniform model's capacity is the one Limits gives.
TEST(CapacityTest, UniformModelAgreesWithLimits) {
  const ModelShape m;  // DeepSeek-V3.2
  const MemoryTier tier{"pcie-dram", 250, 55};
  const CapacityCase c = Capacity(m, GpuSpec{}, {tier}, 32768, 4096);
  const RequestShape r = CapacityRequest(m, 32768, 4096);
  const StepInputs in{KVVariant::kSparseKV, 1, 0.2, 55, 0};
  const BatchLimits l = Limits(Calibration{}, m, GpuSpec{}, r, in, tier.capacity_gb, 0);
  EXPECT_EQ(c.offloaded_by_hbm, l.by_hbm);
  EXPECT_EQ(c.offloaded_by_tier[0], std::min(l.by_hbm, l.by_capacity));
}

}  // namespace
}  // namespace sparsekv
