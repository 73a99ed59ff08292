// The end-to-end benchmark's DeepSeek-V4 layers: what full-hbm holds and what both variants attend
// per layer kind, against the footprint the plan sizes batches with.
#include "tools/sparsekv/bench/entry_layers.h"

#include <gtest/gtest.h>

#include "sparsekv/kv_footprint.h"
#include "tools/sparsekv/bench/bench.h"

namespace sparsekv::tools {
namespace {

BenchConfig ProConfig() {
  BenchConfig c;
  c.preset = "deepseek-v4-pro";
  c.row_format = KVRowFormat::kFp8Entry584;
  c.top_k = 1024;
  c.hot_slots = 2048;
  return c;
}

TEST(EntryLayersTest, EachKindHoldsAndAttendsItsOwnScopes) {
  const BenchConfig c = ProConfig();
  const ModelPreset preset = *FindPreset(c.preset, c.row_format);
  const int64_t tokens = 1048576 + 100;
  const auto layers = EntryLayerScopesOf(BenchGeometry(c, preset), c.top_k, 128, tokens);
  ASSERT_EQ(layers.size(), 62u);
  // Pro: [128, 128] + [4, 128] x 29 + [4, 0].
  EXPECT_EQ(layers[0].kind, LayerKind::kResident);
  EXPECT_EQ(layers[0].entries, tokens / 128);
  EXPECT_EQ(layers[0].selected, tokens / 128);  // HCA attends every entry
  EXPECT_EQ(layers[2].kind, LayerKind::kOffloaded);
  EXPECT_EQ(layers[2].entries, tokens / 4);
  EXPECT_EQ(layers[2].selected, 1024);  // CSA attends its top-k
  EXPECT_EQ(layers[61].kind, LayerKind::kWindowOnly);
  EXPECT_EQ(layers[61].entries, 0);
  EXPECT_EQ(layers[61].selected, 0);
  for (const EntryLayerScopes& l : layers) {
    EXPECT_EQ(l.window, 128);
    EXPECT_EQ(l.entry_bytes, 584);
  }
  EXPECT_EQ(MaxSelected(layers), tokens / 128);
  // A request younger than the window attends what it has.
  EXPECT_EQ(EntryLayerScopesOf(BenchGeometry(c, preset), c.top_k, 128, 100)[61].window, 100);
}

// full-hbm allocates exactly what its footprint charges, less the CSA layers' indexer keys (the
// engine's) and the top-k row's indices.
TEST(EntryLayersTest, FullHbmAllocatesItsFootprintLessKeysAndIndices) {
  const BenchConfig c = ProConfig();
  const ModelPreset preset = *FindPreset(c.preset, c.row_format);
  for (int64_t tokens : {int64_t{262144}, int64_t{524288 + 37}, int64_t{1048576 + 100}}) {
    RequestShape shape = E2ERequestShape(c, preset);
    shape.tokens = tokens;
    const auto layers = EntryLayerScopesOf(BenchGeometry(c, preset), c.top_k, 128, tokens);
    const int64_t keys = int64_t{30} * (tokens / 4) * preset.indexer_key_bytes;
    EXPECT_EQ(FullHbmEntryBytes(layers, 128) + keys + int64_t{c.top_k} * 4,
              Footprint(KVVariant::kFullHbm, shape).hbm_bytes)
        << tokens;
  }
}

// The step's bytes by kind, on a small geometry: an HCA, a CSA and a window-only layer.
TEST(EntryLayersTest, TrafficCountsEachKindsBytes) {
  KVGeometry g = KVGeometry::Uniform(3, 584);
  g.layers[0].kind = LayerKind::kResident;
  g.layers[0].entry_tokens = 128;
  g.layers[1].entry_tokens = 4;
  g.layers[2].kind = LayerKind::kWindowOnly;
  const auto layers = EntryLayerScopesOf(g, 8, 128, 1024);  // HCA: 8 entries, CSA: top-k 8
  const StepTraffic full = EntryTraffic(KVVariant::kFullHbm, layers, 16, 2, 100);
  EXPECT_DOUBLE_EQ(full.pcie_bytes, 0);
  EXPECT_DOUBLE_EQ(full.hbm_bytes,
                   2 * ((584 + 584.0 / 128 + 2 * 8 * 4) + (584 + 584.0 / 4 + 2 * 8 * 4) + 584));
  const StepTraffic sparse = EntryTraffic(KVVariant::kSparseKV, layers, 16, 2, 100);
  EXPECT_DOUBLE_EQ(sparse.pcie_bytes, 100 * 584 + 2 * 584.0 / 4);
  EXPECT_DOUBLE_EQ(sparse.hbm_bytes,
                   100 * 584 + 2 * ((584 + 584.0 / 128 + 2 * 8 * 4) +
                                    (584 + 584.0 / 4 + 3 * 8 * 4 + 4 * 16 * 4) + 584));
  EXPECT_DOUBLE_EQ(EntryTraffic(KVVariant::kNoCache, layers, 16, 2, 100).hbm_bytes, 0);
}

}  // namespace
}  // namespace sparsekv::tools
