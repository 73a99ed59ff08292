// The footprint of models whose layers differ in kind (DeepSeek-V4, GLM-5.3): hand-computed cases,
// and docs/workload-shapes.md's per-request tables recomputed from the presets.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sparsekv/host_kv_pool.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/kv_footprint.h"
#include "sparsekv/options.h"

namespace sparsekv {
namespace {

constexpr int64_t k128K = 131072, k256K = 262144, k512K = 524288, k1M = 1048576;

// A request of `preset` at `tokens` with a hot cache of `hot_slots` per offloaded layer.
RequestShape RequestOf(const std::string& preset, int64_t tokens, int32_t hot_slots) {
  const ModelPreset p = *FindPreset(preset);
  RequestShape s;
  s.classes = LayerClassesOf(p);
  s.raw_window = p.raw_window;
  s.indexer_key_bytes = p.indexer_key_bytes;
  s.hot_slots = hot_slots;
  s.tokens = tokens;
  return s;
}

// The standard scenario's HBM for KV: 141 GB - weights per GPU - 8 GB.
int64_t KVBudget(const std::string& preset) {
  return static_cast<int64_t>((141 - FindPreset(preset)->weights_per_gpu_gb - 8) * 1e9);
}

TEST(LayerClassesTest, DeepSeekV4ProHasThreeKinds) {
  const std::vector<LayerClass> c = LayerClassesOf(*FindPreset("deepseek-v4-pro"));
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].kind, LayerKind::kResident);  // layer 0 is HCA
  EXPECT_EQ(c[0].layers, 31);
  EXPECT_EQ(c[0].entry_tokens, 128);
  EXPECT_EQ(c[0].keyed_layers, 0);
  EXPECT_EQ(c[1].kind, LayerKind::kOffloaded);
  EXPECT_EQ(c[1].layers, 30);
  EXPECT_EQ(c[1].entry_tokens, 4);
  EXPECT_EQ(c[1].entry_bytes, 584);
  EXPECT_EQ(c[1].top_k, 1024);
  EXPECT_EQ(c[1].keyed_layers, 30);
  EXPECT_EQ(c[1].index_groups, 30);
  EXPECT_EQ(c[2].kind, LayerKind::kWindowOnly);
  EXPECT_EQ(c[2].layers, 1);
}

TEST(LayerClassesTest, Glm53IsOneClassWithItsKeysAndGroups) {
  const std::vector<LayerClass> c = LayerClassesOf(*FindPreset("glm-5.3"));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].layers, 78);
  EXPECT_EQ(c[0].keyed_layers, 21);
  EXPECT_EQ(c[0].index_groups, 21);
  EXPECT_EQ(c[0].top_k, 2048);
}

TEST(LayerClassesTest, AUniformModelAsClassesCostsWhatItsUniformShapeCosts) {
  RequestShape classes = RequestOf("deepseek-v3.2", 32768, 4096);
  RequestShape uniform;  // DeepSeek-V3.2's defaults
  uniform.tokens = 32768;
  EXPECT_EQ(Footprint(KVVariant::kFullHbm, classes).hbm_bytes,
            Footprint(KVVariant::kFullHbm, uniform).hbm_bytes);
  EXPECT_EQ(Footprint(KVVariant::kSparseKV, classes).host_bytes,
            Footprint(KVVariant::kSparseKV, uniform).host_bytes);
  EXPECT_EQ(Footprint(KVVariant::kSparseKV, classes).hbm_bytes,
            Footprint(KVVariant::kSparseKV, uniform).hbm_bytes);
}

// DeepSeek-V4-Pro at 1M tokens with a hot cache of 2 x top-k = 2048 entries per CSA layer.
TEST(LayerKindsFootprintTest, DeepSeekV4ProAtOneMillionByHand) {
  const RequestShape s = RequestOf("deepseek-v4-pro", k1M, 2048);
  const int64_t csa = k1M / 4, hca = k1M / 128;  // 262,144 and 8,192 entries
  // Rows, then per CSA layer the clock's state: tokens and use counts of 2048 slots, its hand and
  // the slot of each of the 262,144 entries.
  const int64_t hot = int64_t{30} * 2049 * 584 + int64_t{30} * (2048 * 5 + 4 + csa * 4);
  const int64_t resident = int64_t{31} * (hca * 584 + hca / 64 * 4);  // pages, page ids
  const int64_t rings = int64_t{62} * 128 * 584;
  const int64_t keys = int64_t{30} * csa * 132;
  const int64_t tables = csa / 64 * 4 + 1024 * (4 * 5 + 1);
  const RequestFootprint f = Footprint(KVVariant::kSparseKV, s);
  EXPECT_EQ(f.hbm_bytes, hot + resident + rings + keys + tables);
  EXPECT_EQ(f.host_bytes, int64_t{30} * csa * 584);
  EXPECT_EQ(Footprint(KVVariant::kFullHbm, s).hbm_bytes,
            int64_t{30} * csa * (584 + 132) + int64_t{31} * hca * 584 + rings + 1024 * 4);
  // docs/workload-shapes.md: 1.26 GB of HBM and 4.59 GB of host per request; 19 requests in
  // 24.9 GB where 4 fit without offloading; 54 in a 250-GB host pool.
  EXPECT_NEAR(f.hbm_bytes / 1e9, 1.2587, 0.0005);
  EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, s, KVBudget("deepseek-v4-pro"), 250'000'000'000, 0), 19);
  EXPECT_EQ(MaxBatch(KVVariant::kFullHbm, s, KVBudget("deepseek-v4-pro"), 0, 0), 4);
  EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, s, int64_t{1} << 50, 250'000'000'000, 0), 54);
}

// What the planner charges a request's host pages and hot-cache block is what the manager's parts
// size from the preset's whole geometry, whose resident and window-only layers have no rows there.
TEST(LayerKindsFootprintTest, DeepSeekV4ChargesWhatTheManagersPartsHold) {
  for (const char* name : {"deepseek-v4-flash", "deepseek-v4-pro"}) {
    const ModelPreset p = *FindPreset(name);
    const KVGeometry g = p.geometry();
    const int64_t csa = k1M / 4;
    RequestShape s = RequestOf(name, k1M, 2048);
    const int64_t offloaded = p.layers_of(LayerKind::kOffloaded);
    EXPECT_EQ(Footprint(KVVariant::kSparseKV, s).host_bytes,
              csa / s.page_tokens * HostKVPool::PageBytes(g, s.page_tokens))
        << name;
    // The hot part of the HBM figure: what HotCache::BlockBytes gives the whole geometry, its
    // clock's map over the request's entries.
    const HotCacheReplacement clock{EvictionPolicy::kClock, static_cast<int32_t>(csa)};
    const int64_t block = HotCache::BlockBytes(g, 2048, 1, 1, clock);
    EXPECT_EQ(block, offloaded * 2049 * p.row_bytes +
                         HotCache::StateBytesOf(static_cast<int32_t>(offloaded), 2048, clock))
        << name;
    const int64_t with = Footprint(KVVariant::kSparseKV, s).hbm_bytes;
    s.hot_slots = 1024;
    const int64_t without = Footprint(KVVariant::kSparseKV, s).hbm_bytes;
    EXPECT_EQ(with - without, block - HotCache::BlockBytes(g, 1024, 1, 1, clock)) << name;
  }
}

// GLM-5.3 at 128K: 78 layers of 656-B rows offloaded with 4096 slots, keys on 21 layers, the
// clock's state per index group.
TEST(LayerKindsFootprintTest, Glm53At128KByHand) {
  const RequestShape s = RequestOf("glm-5.3", k128K, 4096);
  const RequestFootprint f = Footprint(KVVariant::kSparseKV, s);
  EXPECT_EQ(f.hbm_bytes, int64_t{78} * 4097 * 656 + int64_t{21} * (4096 * 5 + 4 + k128K * 4) +
                             int64_t{21} * k128K * 132 + k128K / 64 * 4 + 2048 * 21);
  EXPECT_EQ(f.host_bytes, int64_t{78} * k128K * 656);
  EXPECT_EQ(Footprint(KVVariant::kFullHbm, s).hbm_bytes,
            int64_t{78} * k128K * 656 + int64_t{21} * k128K * 132 + 2048 * 4);
}

// A resident layer's entries take whole pages of resident_page_rows.
TEST(LayerKindsFootprintTest, ResidentEntriesTakeWholePages) {
  RequestShape s = RequestOf("deepseek-v4-flash", 128 * 65, 1024);  // 65 HCA entries
  const int64_t with_65 = Footprint(KVVariant::kSparseKV, s).hbm_bytes;
  s.tokens = 128 * 66;  // one more HCA entry; 32 more CSA entries, keys and clock map entries
  const int64_t csa_growth = int64_t{21} * 32 * (132 + 4);
  EXPECT_EQ(Footprint(KVVariant::kSparseKV, s).hbm_bytes - with_65, csa_growth);
  s.tokens = 128 * 64;  // back below the second page (and 2048 CSA entries: 32 host pages, not 33)
  const int64_t pages_dropped = int64_t{20} * (64 * 584 + 4);
  EXPECT_EQ(with_65 - Footprint(KVVariant::kSparseKV, s).hbm_bytes,
            pages_dropped + int64_t{21} * 32 * (132 + 4) + 4);
}

// docs/workload-shapes.md, "What a DeepSeek-V4 request holds" and "The standard scenarios":
// the per-request totals and the batches they admit, recomputed from the presets.
struct Row {
  std::string preset;
  int64_t tokens;
  double total_mb;         // the table's total (every entry, key and window; full-hbm)
  int32_t full_hbm;        // requests per GPU with every entry in HBM
  double offloaded_mb;     // HBM per request with the CSA entries offloaded
  int32_t offloaded;       // requests the HBM admits then
  double host_gb;          // host per request
  int32_t host_250gb_cap;  // requests a 250-GB host pool holds
};

TEST(LayerKindsFootprintTest, WorkloadShapesTablesFromThePresets) {
  const int32_t c_flash = 2 * 512, c_pro = 2 * 1024;
  const std::vector<Row> rows = {
      {"deepseek-v4-flash", k128K, 507.9, 222, 122, 930, 0.40, 622},
      {"deepseek-v4-flash", k256K, 1012.6, 111, 227, 497, 0.80, 311},
      {"deepseek-v4-flash", k512K, 2021.9, 55, 438, 258, 1.61, 155},
      {"deepseek-v4-flash", k1M, 4040.6, 27, 860, 131, 3.21, 77},
      {"deepseek-v4-pro", k128K, 727.0, 34, 193, 128, 0.57, 435},
      {"deepseek-v4-pro", k256K, 1449.4, 17, 345, 72, 1.15, 217},
      {"deepseek-v4-pro", k512K, 2894.2, 8, 650, 38, 2.30, 108},
      {"deepseek-v4-pro", k1M, 5783.8, 4, 1259, 19, 4.59, 54},
  };
  for (const Row& r : rows) {
    const std::string at = r.preset + " at " + std::to_string(r.tokens);
    const int32_t top_k = FindPreset(r.preset)->top_k;
    const RequestShape s =
        RequestOf(r.preset, r.tokens, r.preset == "deepseek-v4-pro" ? c_pro : c_flash);
    const int64_t budget = KVBudget(r.preset);
    const RequestFootprint full = Footprint(KVVariant::kFullHbm, s);
    EXPECT_NEAR((full.hbm_bytes - top_k * 4) / 1e6, r.total_mb, 0.05) << at;
    EXPECT_EQ(MaxBatch(KVVariant::kFullHbm, s, budget, 0, 0), r.full_hbm) << at;
    const RequestFootprint off = Footprint(KVVariant::kSparseKV, s);
    EXPECT_NEAR(off.hbm_bytes / 1e6, r.offloaded_mb, 0.9) << at;
    EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, s, budget, int64_t{1} << 50, 0), r.offloaded) << at;
    EXPECT_NEAR(off.host_bytes / 1e9, r.host_gb, 0.005) << at;
    EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, s, int64_t{1} << 50, 250'000'000'000, 0),
              r.host_250gb_cap)
        << at;
  }
}

// docs/workload-shapes.md, "GLM-5.3": 40 GB for KV, a hot cache of 4096 slots per layer.
TEST(LayerKindsFootprintTest, Glm53TableFromThePreset) {
  const int64_t tokens[] = {k128K, k256K, k512K, k1M};
  const int32_t full_hbm[] = {5, 2, 1, 0}, offloaded[] = {68, 41, 23, 12};
  const double host_gb[] = {6.71, 13.41, 26.83, 53.65};
  const int32_t in_250gb[] = {37, 18, 9, 4}, in_2tb[] = {298, 149, 74, 37};
  for (int i = 0; i < 4; ++i) {
    const RequestShape s = RequestOf("glm-5.3", tokens[i], 4096);
    const int64_t budget = KVBudget("glm-5.3");
    EXPECT_EQ(MaxBatch(KVVariant::kFullHbm, s, budget, 0, 0), full_hbm[i]) << tokens[i];
    EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, s, budget, int64_t{1} << 50, 0), offloaded[i]);
    EXPECT_NEAR(Footprint(KVVariant::kSparseKV, s).host_bytes / 1e9, host_gb[i], 0.005);
    EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, s, int64_t{1} << 50, 250'000'000'000, 0), in_250gb[i]);
    EXPECT_EQ(MaxBatch(KVVariant::kSparseKV, s, int64_t{1} << 50, 2'000'000'000'000, 0), in_2tb[i]);
  }
}

}  // namespace
}  // namespace sparsekv
