// Tests of the step model of layers of several kinds (StepBytesPerRequest, PredictKindStep in
// planner.h): hand-computed bytes and times on a small geometry, their monotonicity in context
// and miss rate, agreement with the uniform model, and the uniform model's projection unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sparsekv/options.h"
#include "sparsekv/planner.h"

namespace sparsekv {
namespace {

// Two offloaded layers (an entry per 4 tokens, 100-B entries, top-k 8, keys of 1000 B in both),
// one resident layer (an entry per 16 tokens) and one window-only layer; a raw window of 4.
// Calibration: attention 10 µs + 2 µs per request for 1000 B of rows (500 B/µs), weights and the
// indexer's scan at 100 GB/s (1e8 weight bytes per layer: 1000 µs), full-hbm overhead 1 + 0.5B,
// sparsekv overhead 5 + B, gather 0.01 GB/s on a 0.02 GB/s link (efficiency 0.5).
struct KindCase {
  Calibration cal;
  ModelShape model;
  GpuSpec gpu;
  KindCase() {
    cal.attention_fixed_us = 10;
    cal.attention_per_request_us = 2;
    cal.attention_bytes_per_request = 1000;
    cal.weight_gbps = 100;
    cal.rest_per_request_us = 0;
    cal.full_hbm = {1, 0.5, 0};
    cal.sparsekv = {5, 1, 0.01};
    cal.link_gbps = 0.02;
    model.layers = 4;
    model.indexer_key_bytes = 1000;
    model.raw_window = 4;
    model.weights_gb = 0.4;
    LayerClass csa;
    csa.kind = LayerKind::kOffloaded;
    csa.layers = 2;
    csa.entry_tokens = 4;
    csa.entry_bytes = 100;
    csa.top_k = 8;
    csa.keyed_layers = 2;
    csa.index_groups = 2;
    LayerClass hca;
    hca.kind = LayerKind::kResident;
    hca.layers = 1;
    hca.entry_tokens = 16;
    hca.entry_bytes = 100;
    LayerClass window;
    window.kind = LayerKind::kWindowOnly;
    window.layers = 1;
    window.entry_bytes = 100;
    model.classes = {csa, hca, window};
    gpu.flops_tflops = 0;  // no roofline term
  }
};

// At 1000 tokens: 250 CSA entries, 62 HCA entries.
//   offloaded attention 2 * (8 + 4) * 100 = 2400; resident (62 + 4) * 100 = 6600; window 4 * 100
//   indexer 2 * 250 * 1000 = 500000; fetched at m = 0.5: 2 * 0.5 * 8 * 100 = 800;
//   appended 2 * 100 / 4 = 50.
TEST(KindStepBytesTest, EachKindReadsWhatItsFormulaSays) {
  const KindCase k;
  const KindStepBytes b = StepBytesPerRequest(k.model, KVVariant::kSparseKV, 1000, 0.5);
  EXPECT_DOUBLE_EQ(b.offloaded_attention, 2400);
  EXPECT_DOUBLE_EQ(b.resident_attention, 6600);
  EXPECT_DOUBLE_EQ(b.window_attention, 400);
  EXPECT_DOUBLE_EQ(b.attention(), 9400);
  EXPECT_DOUBLE_EQ(b.indexer, 500000);
  EXPECT_DOUBLE_EQ(b.fetched, 800);
  EXPECT_DOUBLE_EQ(b.appended, 50);
}

// A request of 16 tokens has 4 CSA entries, fewer than the top-k of 8, and 1 HCA entry: the
// top-k reads and misses what there is. Offloaded 2 * (4 + 4) * 100, fetched 2 * 0.5 * 4 * 100,
// resident (1 + 4) * 100. A request of 2 tokens reads a raw window of 2.
TEST(KindStepBytesTest, AShortRequestReadsTheEntriesItHas) {
  const KindCase k;
  const KindStepBytes b = StepBytesPerRequest(k.model, KVVariant::kSparseKV, 16, 0.5);
  EXPECT_DOUBLE_EQ(b.offloaded_attention, 1600);
  EXPECT_DOUBLE_EQ(b.fetched, 400);
  EXPECT_DOUBLE_EQ(b.resident_attention, 500);
  EXPECT_DOUBLE_EQ(StepBytesPerRequest(k.model, KVVariant::kSparseKV, 2, 0.5).window_attention,
                   200);
}

TEST(KindStepBytesTest, FullHbmReadsTheSameAndMovesNothing) {
  const KindCase k;
  const KindStepBytes full = StepBytesPerRequest(k.model, KVVariant::kFullHbm, 1000, 0.5);
  const KindStepBytes offloaded = StepBytesPerRequest(k.model, KVVariant::kSparseKV, 1000, 0.5);
  EXPECT_DOUBLE_EQ(full.attention(), offloaded.attention());
  EXPECT_DOUBLE_EQ(full.indexer, offloaded.indexer);
  EXPECT_EQ(full.fetched, 0);
  EXPECT_EQ(full.appended, 0);
  // no-cache fetches every selected entry: 2 * 8 * 100.
  EXPECT_DOUBLE_EQ(StepBytesPerRequest(k.model, KVVariant::kNoCache, 1000, 0.5).fetched, 1600);
}

// Batch 2, sparsekv, m = 0.5, 1000 tokens, serial (µs):
//   attention 4 * 10 + 2 * 9400 / 500 = 77.6; indexer 2 * 500000 / 1e5 = 10;
//   weights 4 * 1000 = 4000; overhead 2 * (5 + 2) + 2 * (1 + 1) = 18;
//   transfer 2 * 800 B / 10 B/µs = 160 (0.5 of the 0.02 GB/s link)
//   TPOT 18 + 77.6 + 10 + 4000 + 160 = 4265.6; ideal 18 + max(4087.6, 160) = 4105.6.
TEST(KindStepTest, SerialStepAddsEveryKindsPart) {
  const KindCase k;
  const StepInputs in{KVVariant::kSparseKV, 2, 0.5, 0.02, 0, 1000};
  const StepTime t = PredictKindStep(k.cal, k.model, k.gpu, in);
  EXPECT_NEAR(t.attention_ms, 0.0776, 1e-12);
  EXPECT_NEAR(t.indexer_ms, 0.010, 1e-12);
  EXPECT_NEAR(t.rest_ms, 4.0, 1e-12);
  EXPECT_NEAR(t.overhead_ms, 0.018, 1e-12);
  EXPECT_NEAR(t.transfer_ms, 0.160, 1e-12);
  EXPECT_NEAR(t.total_ms, 4.2656, 1e-12);
  EXPECT_NEAR(t.ideal_ms, 4.1056, 1e-12);
  EXPECT_EQ(t.binding, "weights");
  // PredictStep takes this path for a model with classes.
  EXPECT_EQ(PredictStep(k.cal, k.model, k.gpu, in).total_ms, t.total_ms);
}

// Full HBM at batch 2: overhead 4 * (1 + 1) = 8 µs, no transfer: 8 + 77.6 + 10 + 4000 = 4095.6.
TEST(KindStepTest, FullHbmPaysItsOverheadOnEveryLayerAndNoTransfer) {
  const KindCase k;
  const StepTime t =
      PredictKindStep(k.cal, k.model, k.gpu, {KVVariant::kFullHbm, 2, 0.5, 0.02, 0, 1000});
  EXPECT_NEAR(t.overhead_ms, 0.008, 1e-12);
  EXPECT_EQ(t.transfer_ms, 0);
  EXPECT_NEAR(t.total_ms, 4.0956, 1e-12);
  EXPECT_EQ(t.ideal_ms, t.total_ms);
}

// h hides that share of the transfer: 4265.6 - 0.5 * 160 = 4185.6 µs.
TEST(KindStepTest, HiddenFractionHidesThatShareOfTheOffloadedLayersTransfer) {
  const KindCase k;
  const StepTime t =
      PredictKindStep(k.cal, k.model, k.gpu, {KVVariant::kSparseKV, 2, 0.5, 0.02, 0.5, 1000});
  EXPECT_NEAR(t.total_ms, 4.1856, 1e-12);
  const StepTime all =
      PredictKindStep(k.cal, k.model, k.gpu, {KVVariant::kSparseKV, 2, 0.5, 0.02, 1, 1000});
  EXPECT_NEAR(all.total_ms, all.ideal_ms, 1e-12);
}

// More context: more HCA entries read and more keys scanned; the CSA layers' top-k, the window
// and the misses stay; so the step grows. More misses: more transfer, the same attention.
TEST(KindStepTest, ContextGrowsTheResidentReadAndTheScanOnly) {
  const KindCase k;
  const KindStepBytes short_bytes = StepBytesPerRequest(k.model, KVVariant::kSparseKV, 1000, 0.5);
  const KindStepBytes long_bytes = StepBytesPerRequest(k.model, KVVariant::kSparseKV, 64000, 0.5);
  EXPECT_GT(long_bytes.resident_attention, short_bytes.resident_attention);
  EXPECT_GT(long_bytes.indexer, short_bytes.indexer);
  EXPECT_EQ(long_bytes.offloaded_attention, short_bytes.offloaded_attention);
  EXPECT_EQ(long_bytes.window_attention, short_bytes.window_attention);
  EXPECT_EQ(long_bytes.fetched, short_bytes.fetched);

  double previous_ms = 0;
  for (int64_t tokens : {1000, 8000, 64000, 512000}) {
    const StepTime t =
        PredictKindStep(k.cal, k.model, k.gpu, {KVVariant::kSparseKV, 4, 0.5, 0.02, 0, tokens});
    EXPECT_GT(t.total_ms, previous_ms) << tokens;
    previous_ms = t.total_ms;
  }
  const StepTime few =
      PredictKindStep(k.cal, k.model, k.gpu, {KVVariant::kSparseKV, 4, 0.1, 0.02, 0, 8000});
  const StepTime many =
      PredictKindStep(k.cal, k.model, k.gpu, {KVVariant::kSparseKV, 4, 0.9, 0.02, 0, 8000});
  EXPECT_GT(many.transfer_ms, few.transfer_ms);
  EXPECT_EQ(many.attention_ms, few.attention_ms);
}

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

// DeepSeek-V4-Pro at 1M: the indexer scans 30 * 262144 keys of 132 B (1.04 GB, the figure of
// docs/deepseek-v4.md), the HCA layers read 31 * (8192 + 128) entries of 584 B, the CSA layers
// 30 * (1024 + 128), and at 20% misses 30 * 0.2 * 1024 entries are fetched.
TEST(KindStepTest, DeepSeekV4ProAtOneMillionReadsItsKindsBytes) {
  const ModelShape m = ShapeOf("deepseek-v4-pro");
  const KindStepBytes b = StepBytesPerRequest(m, KVVariant::kSparseKV, 1048576, 0.2);
  EXPECT_DOUBLE_EQ(b.indexer, 30.0 * 262144 * 132);
  EXPECT_NEAR(b.indexer / 1e9, 1.04, 0.005);
  EXPECT_DOUBLE_EQ(b.resident_attention, 31.0 * (8192 + 128) * 584);
  EXPECT_DOUBLE_EQ(b.offloaded_attention, 30.0 * (1024 + 128) * 584);
  EXPECT_DOUBLE_EQ(b.window_attention, 1.0 * 128 * 584);
  EXPECT_NEAR(b.fetched, 30 * 0.2 * 1024 * 584, 1e-6);
  // With the default calibration the offloaded step costs more than full HBM's at one batch, and
  // the ideal is never above the serial step.
  const Calibration cal;
  const StepTime full = PredictStep(cal, m, GpuSpec{}, {KVVariant::kFullHbm, 4, 0, 0, 0, 1048576});
  const StepTime offloaded =
      PredictStep(cal, m, GpuSpec{}, {KVVariant::kSparseKV, 4, 0.2, 55, 0, 1048576});
  EXPECT_GT(offloaded.total_ms, full.total_ms);
  EXPECT_LE(offloaded.ideal_ms, offloaded.total_ms);
  EXPECT_GT(offloaded.indexer_ms, 0);
}

// The table "What a decode step reads per request" of docs/workload-shapes.md, from the presets
// (MB per request and step at 128K / 256K / 512K / 1M).
TEST(KindStepTest, WorkloadShapesStepTableFromThePresets) {
  struct Row {
    const char* preset;
    double csa, hca[4], keys[4];
  };
  for (const Row& r :
       {Row{"deepseek-v4-flash", 7.85, {13.5, 25.4, 49.3, 97.2}, {90.8, 181.7, 363.3, 726.7}},
        Row{"deepseek-v4-pro", 20.2, {20.9, 39.4, 76.5, 150.6}, {129.8, 259.5, 519.0, 1038.1}}}) {
    const ModelShape m = ShapeOf(r.preset);
    for (int i = 0; i < 4; ++i) {
      const KindStepBytes b = StepBytesPerRequest(m, KVVariant::kSparseKV, 131072 << i, 0.2);
      EXPECT_NEAR(b.offloaded_attention / 1e6, r.csa, 0.05) << r.preset << " " << i;
      EXPECT_NEAR(b.resident_attention / 1e6, r.hca[i], 0.05) << r.preset << " " << i;
      EXPECT_NEAR(b.indexer / 1e6, r.keys[i], 0.05) << r.preset << " " << i;
    }
  }
  // Only the CSA top-k misses: Pro fetches 3.6 MB per request at m = 0.2.
  EXPECT_NEAR(
      StepBytesPerRequest(ShapeOf("deepseek-v4-pro"), KVVariant::kSparseKV, 131072, 0.2).fetched /
          1e6,
      3.6, 0.05);
}

// A preset of uniform layers written as one class (a row per token, a key and a top-k per layer,
// no raw window) is the uniform model plus the indexer's scan, at every batch and variant.
TEST(KindStepTest, OneUniformClassIsTheUniformModelPlusTheScan) {
  const ModelPreset p = *FindPreset("deepseek-v3.2");
  ModelShape uniform;  // DeepSeek-V3.2's defaults
  ModelShape classes = uniform;
  classes.classes = LayerClassesOf(p);
  ASSERT_EQ(classes.classes.size(), 1u);
  const Calibration cal;
  for (KVVariant v : {KVVariant::kFullHbm, KVVariant::kSparseKV}) {
    for (int32_t batch : {1, 7, 64}) {
      const StepInputs in{v, batch, 0.2, 55, 0, 32768};
      const StepTime u = PredictStep(cal, uniform, GpuSpec{}, in);
      const StepTime k = PredictStep(cal, classes, GpuSpec{}, in);
      EXPECT_NEAR(k.attention_ms, u.attention_ms, 1e-9 * u.attention_ms);
      EXPECT_NEAR(k.rest_ms, u.rest_ms, 1e-9 * u.rest_ms);
      EXPECT_NEAR(k.overhead_ms, u.overhead_ms, 1e-9 * u.overhead_ms);
      EXPECT_NEAR(k.transfer_ms, u.transfer_ms, 1e-9 * (u.transfer_ms + 1));
      EXPECT_NEAR(k.total_ms - k.indexer_ms, u.total_ms, 1e-9 * u.total_ms);
      // 61 layers * 32768 keys of 132 B at 4446 GB/s per request.
      EXPECT_NEAR(k.indexer_ms, batch * 61.0 * 32768 * 132 / 4446e6, 1e-9);
      EXPECT_EQ(u.indexer_ms, 0);
    }
  }
}

// The uniform model's projection does not read the context, and its figures are those of its
// formula: DeepSeek-V3.2 at batch 44, 20% misses on a 55 GB/s tier, per layer (µs):
//   attention 12.23 + 3.279 * 44, rest 84e9 / 61 / 4446e3 + 0.2822 * 44 (the weights bind),
//   overhead 40.8 + 1.24 * 44, transfer 44 * 0.2 * 2048 * 656 / (55 * 48.5 / 55.4 * 1e3).
TEST(KindStepTest, TheUniformProjectionIsUnchanged) {
  const Calibration cal;
  const ModelShape m;
  StepInputs in{KVVariant::kSparseKV, 44, 0.2, 55, 0, 0};
  const StepTime t = PredictStep(cal, m, GpuSpec{}, in);
  const double attention = 12.23 + 3.279 * 44;
  const double rest = 84e9 / 61 / 4446e3 + 0.2822 * 44;
  const double overhead = 40.8 + 1.24 * 44;
  const double transfer = 44 * 0.2 * 2048 * 656 / (55 * 48.5 / 55.4 * 1e3);
  EXPECT_NEAR(t.total_ms, 61 * (attention + rest + overhead + transfer) / 1e3, 1e-9);
  EXPECT_NEAR(t.ideal_ms, 61 * (overhead + std::max(attention + rest, transfer)) / 1e3, 1e-9);
  EXPECT_EQ(t.indexer_ms, 0);
  in.context = 1048576;
  EXPECT_EQ(PredictStep(cal, m, GpuSpec{}, in).total_ms, t.total_ms);
}

// Limits for a model with classes: the HBM and capacity limits are the footprint's (Capacity's),
// and the latency limit is the largest batch whose PredictKindStep at the request's context is
// within the SLO.
TEST(KindStepTest, LimitsUseTheFootprintAndTheKindStep) {
  const ModelShape m = ShapeOf("deepseek-v4-pro");
  const Calibration cal;
  const MemoryTier tier = NodeDramTier(250, 8, 55);
  const CapacityCase c = Capacity(m, GpuSpec{}, {tier}, 1048576, 2048);
  const RequestShape r = CapacityRequest(m, 1048576, 2048);
  const StepInputs in{KVVariant::kSparseKV, 1, 0.2, 55, 0, 0};
  const BatchLimits l = Limits(cal, m, GpuSpec{}, r, in, tier.capacity_gb, 35);
  EXPECT_EQ(l.by_hbm, c.offloaded_by_hbm);
  EXPECT_EQ(std::min(l.by_hbm, l.by_capacity), c.offloaded_by_tier[0]);
  ASSERT_GT(l.by_latency, 0);
  StepInputs at = in;
  at.context = 1048576;
  at.batch = l.by_latency;
  EXPECT_LE(PredictKindStep(cal, m, GpuSpec{}, at).total_ms, 35);
  at.batch = l.by_latency + 1;
  EXPECT_GT(PredictKindStep(cal, m, GpuSpec{}, at).total_ms, 35);
}

}  // namespace
}  // namespace sparsekv
