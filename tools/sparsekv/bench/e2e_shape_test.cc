// The end-to-end benchmark's sizing on the host: the index groups and keyed layers every variant
// reads and the HBM budget counts (glm-5.3's named groups, --layers-per-index), the footprints
// and the hybrid hot cache they give, and the flag checks that go with them.
#include <gtest/gtest.h>

#include <algorithm>

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
}

BenchConfig V4Config(const std::string& preset, int32_t top_k) {
  BenchConfig c = Config(preset);
  c.row_format = KVRowFormat::kFp8Entry584;
  c.top_k = top_k;
  c.hot_slots = 2 * top_k;
  c.variants = {"full-hbm", "sparsekv"};
  return c;
}

TEST(E2EShapeTest, DeepSeekV4PlansFullHbmAndSparsekvOnly) {
  for (const char* name : {"deepseek-v4-flash", "deepseek-v4-pro"}) {
    EXPECT_TRUE(CheckE2ELayers(V4Config(name, 512), *FindPreset(name)).ok()) << name;
  }
  const ModelPreset pro = *FindPreset("deepseek-v4-pro");
  auto refused = [&](const BenchConfig& c, const std::string& option) {
    const Status s = CheckE2ELayers(c, pro);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << option;
    EXPECT_NE(s.message().find(option), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("deepseek-v4-pro"), std::string::npos) << s.ToString();
  };
  BenchConfig c = V4Config("deepseek-v4-pro", 1024);
  c.variants = {"full-hbm", "no-cache"};
  refused(c, "--variants");
  c = V4Config("deepseek-v4-pro", 1024);
  c.hybrid = true;
  refused(c, "--hybrid");
  c = V4Config("deepseek-v4-pro", 1024);
  c.mtp = 2;
  refused(c, "--mtp");
  c = V4Config("deepseek-v4-pro", 1024);
  c.layers = 63;
  refused(c, "--layers");
  c = V4Config("deepseek-v4-pro", 1024);
  c.peer_device = 0;
  refused(c, "--peer-device");
  c = V4Config("deepseek-v4-pro", 1024);
  c.contexts = {1048576, 4095};  // 1023 CSA entries
  refused(c, "--contexts");
  c.contexts = {4096, 1048576};
  EXPECT_TRUE(CheckE2ELayers(c, pro).ok());
}

TEST(E2EShapeTest, DeepSeekV4sShapeHasItsLayerClassesAndRawWindow) {
  BenchConfig c = V4Config("deepseek-v4-pro", 1024);
  const RequestShape s = E2ERequestShape(c, *FindPreset("deepseek-v4-pro"));
  ASSERT_EQ(s.classes.size(), 3u);
  EXPECT_EQ(s.classes[0].kind, LayerKind::kResident);
  EXPECT_EQ(s.classes[0].layers, 31);
  EXPECT_EQ(s.classes[1].kind, LayerKind::kOffloaded);
  EXPECT_EQ(s.classes[1].layers, 30);
  EXPECT_EQ(s.classes[1].top_k, 1024);
  EXPECT_EQ(s.classes[1].keyed_layers, 30);
  EXPECT_EQ(s.classes[2].kind, LayerKind::kWindowOnly);
  EXPECT_EQ(s.raw_window, 128);
  EXPECT_EQ(s.row_bytes, 584);
  c.layers = 4;  // [128, 128, 4, 128]: no window-only layer
  const RequestShape cut = E2ERequestShape(c, *FindPreset("deepseek-v4-pro"));
  ASSERT_EQ(cut.classes.size(), 2u);
  EXPECT_EQ(cut.classes[0].layers, 3);
  EXPECT_EQ(cut.classes[1].layers, 1);
}

// The batches of the V4-Pro run at 256K, 512K and 1M in its standard scenario (24.9 GB of HBM for
// KV) with an 80-GB host pool: full-hbm's from the HBM, sparsekv's from the host pool (the HBM
// would admit more), as docs/workload-shapes.md's figures give them with decode headroom.
TEST(E2EShapeTest, DeepSeekV4ProBatchesTo1M) {
  BenchConfig c = V4Config("deepseek-v4-pro", 1024);
  ApplyPresetScenario(c, false, false);
  EXPECT_DOUBLE_EQ(c.weights_gb, 108.1);
  EXPECT_NEAR(c.hbm_budget_gb, 24.9, 1e-9);
  const int64_t hbm = static_cast<int64_t>(c.hbm_budget_gb * 1e9);
  const int64_t host = 80'000'000'000;
  RequestShape shape = E2ERequestShape(c, *FindPreset("deepseek-v4-pro"));
  struct Expected {
    int32_t context, full_hbm, sparsekv;
  };
  for (const Expected& e :
       {Expected{262144, 17, 69}, Expected{524288, 8, 34}, Expected{1048576, 4, 17}}) {
    shape.tokens = e.context;
    const VariantPlan full = PlanVariant(KVVariant::kFullHbm, shape, hbm, host, 0, 1, 16, 2, 0);
    const VariantPlan sparse =
        PlanVariant(KVVariant::kSparseKV, shape, hbm, host, 0, 1, 16, 2, 0, full.max_batch);
    EXPECT_EQ(full.max_batch, e.full_hbm) << e.context;
    EXPECT_EQ(sparse.max_batch, e.sparsekv) << e.context;
    EXPECT_LE(int64_t{sparse.max_batch} * sparse.footprint.host_bytes, host);
    EXPECT_GT(int64_t{sparse.max_batch + 1} * sparse.footprint.host_bytes, host) << e.context;
    // sparsekv is also measured at full-hbm's largest batch.
    EXPECT_NE(std::find(sparse.batches.begin(), sparse.batches.end(), full.max_batch),
              sparse.batches.end());
  }
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
