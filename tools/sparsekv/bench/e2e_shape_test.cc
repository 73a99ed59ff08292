// The end-to-end benchmark's sizing on the host: the index groups and keyed layers every variant
// reads and the HBM budget counts (glm-5.3's named groups, --layers-per-index), the footprints
// and the hybrid hot cache they give, and the flag checks that go with them.
#include <gtest/gtest.h>

#include "sparsekv/hot_cache.h"
#include "sparsekv/kv_footprint.h"
#include "tools/sparsekv/bench/bench.h"

namespace sparsekv::tools {
namespace {

BenchConfig Config(const std::string& preset) {
  BenchConfig c;
  c.preset = preset;
  return c;
}

RequestShape ShapeOf(const BenchConfig& c, int64_t tokens) {
  RequestShape s = E2ERequestShape(c, *FindPreset(c.preset, c.row_format));
  s.tokens = tokens;
  return s;
}

TEST(E2EShapeTest, Glm53HasTwentyOneGroupsWithKeysOnTheirFirstLayers) {
  const BenchConfig c = Config("glm-5.3");
  const ModelPreset preset = *FindPreset("glm-5.3");
  const IndexGroups groups = BenchIndexGroups(c, preset);
  EXPECT_TRUE(groups.named());
  ASSERT_EQ(groups.count(), 21);
  EXPECT_EQ(groups.Size(0), 1);
  EXPECT_EQ(groups.Size(1), 1);
  EXPECT_EQ(groups.First(2), 2);
  EXPECT_EQ(groups.Size(2), 4);
  EXPECT_EQ(groups.First(20), 74);
  EXPECT_EQ(groups.max_top_k(), c.top_k);
  const RequestShape s = E2ERequestShape(c, preset);
  EXPECT_EQ(s.layers, 78);
  EXPECT_EQ(s.index_groups, 21);
  EXPECT_EQ(s.keyed_layers, 21);
  EXPECT_EQ(s.indexer_key_bytes, 132);
  const KVGeometry g = BenchGeometry(c, preset);
  for (int32_t l = 0; l < g.num_layers(); ++l) {
    EXPECT_EQ(g.layers[l].indexer_keys, groups.Leads(l)) << l;
  }
}

TEST(E2EShapeTest, ACutGroupStaysAGroup) {
  BenchConfig c = Config("glm-5.3");
  c.layers = 8;  // {0}, {1}, {2-5}, {6, 7}
  const RequestShape s = E2ERequestShape(c, *FindPreset("glm-5.3"));
  EXPECT_EQ(s.layers, 8);
  EXPECT_EQ(s.index_groups, 4);
  EXPECT_EQ(s.keyed_layers, 4);
}

TEST(E2EShapeTest, LayersPerIndexGroupsUniformlyWithKeysEverywhere) {
  BenchConfig c = Config("deepseek-v3.2");
  c.layers_per_index = 2;
  c.mtp = 2;
  const ModelPreset preset = *FindPreset("deepseek-v3.2");
  EXPECT_FALSE(BenchIndexGroups(c, preset).named());
  const RequestShape s = E2ERequestShape(c, preset);
  EXPECT_EQ(s.layers, 61);
  EXPECT_EQ(s.index_groups, 31);
  EXPECT_EQ(s.keyed_layers, 61);
  EXPECT_EQ(s.top_k, 2 * c.top_k);  // one row of both queries' entries
}

TEST(E2EShapeTest, EveryVariantChargesOnlyTheKeyedLayersKeys) {
  const int64_t tokens = 32768 + 100;
  const RequestShape glm = ShapeOf(Config("glm-5.3"), tokens);
  RequestShape every = glm;  // the same layers with a top-k and keys each
  every.index_groups = 0;
  every.keyed_layers = -1;
  const int64_t keys = tokens * (78 - 21) * 132;
  for (KVVariant v : {KVVariant::kFullHbm, KVVariant::kNoCache, KVVariant::kPageOffload}) {
    EXPECT_EQ(Footprint(v, every).hbm_bytes - Footprint(v, glm).hbm_bytes, keys) << VariantName(v);
    EXPECT_EQ(Footprint(v, every).host_bytes, Footprint(v, glm).host_bytes) << VariantName(v);
  }
  // sparsekv also keeps one replacement state per group, not per layer.
  CacheOptions defaults;
  defaults.max_context = static_cast<int32_t>(tokens);
  const int64_t state = HotCache::StateBytesOf(1, glm.hot_slots, ReplacementOf(defaults));
  EXPECT_EQ(Footprint(KVVariant::kSparseKV, every).hbm_bytes -
                Footprint(KVVariant::kSparseKV, glm).hbm_bytes,
            keys + (78 - 21) * state);
}

TEST(E2EShapeTest, OneGroupPerLayerKeepsTheBlockBytesOfTheHotCache) {
  RequestShape s = ShapeOf(Config("deepseek-v3.2"), 32768);
  CacheOptions defaults;
  defaults.max_context = 32768;
  const int64_t pages = (s.tokens + s.page_tokens - 1) / s.page_tokens;
  EXPECT_EQ(Footprint(KVVariant::kSparseKV, s).hbm_bytes,
            HotCache::BlockBytes(KVGeometry::Uniform(61, 656), s.hot_slots, s.window, 1,
                                 ReplacementOf(defaults)) +
                s.tokens * 61 * 132 + pages * 4 + int64_t{s.top_k} * 21);
}

// --hybrid: the hot cache the plan sizes is the one the manager chooses from the same budget,
// with glm-5.3's own groups and keys.
TEST(E2EShapeTest, HybridSizingChoosesWhatTheManagerChooses) {
  BenchConfig c = Config("glm-5.3");
  const ModelPreset preset = *FindPreset("glm-5.3");
  RequestShape s = ShapeOf(c, 32768 + 64);
  s.hot_slots = 0;
  const int64_t hbm = 40'000'000'000, host = 80'000'000'000;
  const BudgetedHotCache b = PlanBudgetedHotCache(s, hbm, host, 0);
  ASSERT_GT(b.max_batch, 0);
  ASSERT_GE(b.hot_slots, c.top_k);
  CacheOptions o;
  o.geometry = BenchGeometry(c, preset);
  o.top_k = c.top_k;
  o.window = s.window;
  o.max_requests = b.max_batch;
  o.max_context = static_cast<int32_t>(s.tokens);
  o.hybrid_residency = true;
  o.indexer_key_bytes = s.indexer_key_bytes;
  o.hot_slots = 0;
  o.device_budget_bytes = b.hot_cache_bytes;
  const StatusOr<HotCacheShape> chosen = ChooseHotCacheShape(o);
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  EXPECT_EQ(chosen->hot_slots, b.hot_slots);
  // The rest of the budget: the requests' state besides the manager's memory.
  EXPECT_LE(b.hot_cache_bytes + int64_t{b.max_batch} * b.per_request_bytes, hbm);
  // Fewer replacement states than one per layer leave room for more slots.
  RequestShape every = s;
  every.index_groups = 0;
  EXPECT_GE(b.hot_slots, PlanBudgetedHotCache(every, hbm, host, b.max_batch).hot_slots);
}

TEST(E2EShapeTest, OnlyLayersOfARowPerTokenAndOneTopKRunOnTheGpu) {
  for (const char* name : {"glm-5.3", "deepseek-v3.2", "glm-5"}) {
    EXPECT_TRUE(CheckE2ELayers(Config(name), *FindPreset(name)).ok()) << name;
  }
  BenchConfig glm = Config("glm-5.3");
  glm.layers = 6;
  EXPECT_TRUE(CheckE2ELayers(glm, *FindPreset("glm-5.3")).ok());
  const BenchConfig v4 = Config("deepseek-v4-flash");
  const Status s = CheckE2ELayers(v4, *FindPreset("deepseek-v4-flash"));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("--preset deepseek-v4-flash: layer 0"), std::string::npos)
      << s.ToString();
}

TEST(E2EShapeTest, Glm53RefusesLayersPerIndex) {
  BenchConfig c = Config("glm-5.3");
  c.layers_per_index = 2;
  const Status s = ValidateBenchConfig(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--layers-per-index"), std::string::npos) << s.ToString();
  c.layers_per_index = 1;
  EXPECT_TRUE(ValidateBenchConfig(c).ok());
}

TEST(E2EShapeTest, Glm53sScenarioIsItsWeightsAndTheHbmTheyLeave) {
  BenchConfig c = Config("glm-5.3");
  ApplyPresetScenario(c, false, false);
  EXPECT_DOUBLE_EQ(c.weights_gb, 93);
  EXPECT_DOUBLE_EQ(c.hbm_budget_gb, 40);
  BenchConfig v32 = Config("deepseek-v3.2");  // the defaults are its scenario already
  ApplyPresetScenario(v32, false, false);
  EXPECT_DOUBLE_EQ(v32.weights_gb, BenchConfig{}.weights_gb);
  EXPECT_DOUBLE_EQ(v32.hbm_budget_gb, BenchConfig{}.hbm_budget_gb);
  BenchConfig given = Config("glm-5.3");
  given.hbm_budget_gb = 30;
  ApplyPresetScenario(given, false, true);
  EXPECT_DOUBLE_EQ(given.weights_gb, 93);
  EXPECT_DOUBLE_EQ(given.hbm_budget_gb, 30);
  BenchConfig glm5 = Config("glm-5");  // no weights in the preset: left as given
  glm5.weights_gb = 50;
  ApplyPresetScenario(glm5, true, false);
  EXPECT_DOUBLE_EQ(glm5.weights_gb, 50);
  EXPECT_DOUBLE_EQ(glm5.hbm_budget_gb, BenchConfig{}.hbm_budget_gb);
}

}  // namespace
}  // namespace sparsekv::tools
