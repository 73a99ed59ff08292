// The end-to-end benchmark's top-k rows on the host: one top-k per index group (glm-5.3's named
// groups, uniform groups), each group's rows those of its first layer's generator, the same
// whatever the thread count.
#include "tools/sparsekv/bench/topk_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "sparsekv/options.h"

namespace sparsekv::tools {
namespace {

constexpr int32_t kBatch = 3;

// glm-5.3's groups over its 78 layers: {0}, {1}, {2-5}, {6-9}, ..., {74-77}.
IndexGroups Glm53Groups() {
  const ModelPreset preset = *FindPreset("glm-5.3");
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(preset.num_layers, preset.row_bytes);
  for (int32_t l = 0; l < preset.num_layers; ++l) {
    o.geometry.layers[l].index_group = preset.layers[l].index_group;
  }
  o.top_k = 16;
  return IndexGroups(o);
}

TopKGeneratorOptions Options() {
  TopKGeneratorOptions g;
  g.top_k = 16;
  g.seed = 7;
  return g;
}

const std::vector<int32_t> kSeqLens = {200, 300, 400};

TEST(TopKRowsTest, Glm53LayersReadTheirGroupsRows) {
  const TopKRows rows(Options(), Glm53Groups(), kBatch);
  ASSERT_EQ(rows.groups().count(), 21);
  const int64_t g = rows.group_elems();
  EXPECT_EQ(g, kBatch * 16);
  EXPECT_EQ(rows.size(), static_cast<size_t>(21 * g));
  EXPECT_EQ(rows.LayerOffset(0), 0);
  EXPECT_EQ(rows.LayerOffset(1), g);
  for (int32_t l = 2; l <= 5; ++l) EXPECT_EQ(rows.LayerOffset(l), 2 * g) << l;
  EXPECT_EQ(rows.LayerOffset(6), 3 * g);
  EXPECT_EQ(rows.LayerOffset(77), 20 * g);
}

TEST(TopKRowsTest, EachGroupsRowsAreItsFirstLayersGenerators) {
  TopKRows rows(Options(), Glm53Groups(), kBatch);
  for (int step = 0; step < 2; ++step) {
    rows.Generate(kSeqLens);
    for (int32_t g = 0; g < rows.groups().count(); ++g) {
      // A lone generator of the group's first layer, taken through the same steps.
      LayerTopKGenerator alone(Options(), rows.groups().First(g), kBatch);
      std::vector<int32_t> want(kBatch * 16);
      for (int s = 0; s <= step; ++s) alone.Next(kSeqLens, want);
      const std::span<const int32_t> got = rows.group(g);
      ASSERT_EQ(std::vector<int32_t>(got.begin(), got.begin() + want.size()), want)
          << "group " << g << " step " << step;
    }
  }
}

TEST(TopKRowsTest, RowsDoNotDependOnTheThreadCount) {
  TopKRows many(Options(), Glm53Groups(), kBatch);
  TopKRows one(Options(), Glm53Groups(), kBatch);
  many.Generate(kSeqLens, /*spare_cores=*/0);
  one.Generate(kSeqLens, /*spare_cores=*/1 << 20);  // a single thread
  EXPECT_EQ(std::vector<int32_t>(many.data(), many.data() + many.size()),
            std::vector<int32_t>(one.data(), one.data() + one.size()));
}

TEST(TopKRowsTest, CrossLayerOverlapChainsTheGroupsFirstLayers) {
  TopKGeneratorOptions o = *LocalityPreset("glm5-published");  // a mode that reads `lower`
  o.top_k = 16;
  o.seed = 7;
  o.cross_layer_overlap = 0.5;
  TopKRows rows(o, Glm53Groups(), kBatch);
  rows.Generate(kSeqLens);
  // Group g's rows take shared positions of group g - 1's, as the groups' indexers would.
  std::vector<int32_t> below(kBatch * 16), here(kBatch * 16);
  for (int32_t g = 0; g < rows.groups().count(); ++g) {
    LayerTopKGenerator gen(o, rows.groups().First(g), kBatch);
    if (g == 0) {
      gen.Next(kSeqLens, here);
    } else {
      gen.Next(kSeqLens, here, below);
    }
    const std::span<const int32_t> got = rows.group(g);
    ASSERT_EQ(std::vector<int32_t>(got.begin(), got.begin() + here.size()), here) << g;
    below = here;
  }
}

TEST(TopKRowsTest, QueriesShareARequestsRow) {
  TopKRows rows(Options(), IndexGroups::Uniform(4, 2, 16), kBatch, /*queries=*/2);
  EXPECT_EQ(rows.row_elems(), 32);
  EXPECT_EQ(rows.LayerOffset(1), 0);
  EXPECT_EQ(rows.LayerOffset(2), rows.group_elems());
  rows.Generate(kSeqLens);
  LayerTopKGenerator alone(Options(), 2, kBatch);
  std::vector<int32_t> q0(kBatch * 16), q1(kBatch * 16);
  alone.Next(kSeqLens, q0);
  alone.Next(kSeqLens, q1);
  const std::span<const int32_t> got = rows.group(1);
  for (int32_t b = 0; b < kBatch; ++b) {
    EXPECT_TRUE(std::equal(q0.begin() + b * 16, q0.begin() + (b + 1) * 16, got.begin() + b * 32));
    EXPECT_TRUE(
        std::equal(q1.begin() + b * 16, q1.begin() + (b + 1) * 16, got.begin() + b * 32 + 16));
  }
}

// DeepSeek-V4's CSA rows name entries of 4 tokens: the rows a generator gives for the requests'
// entry counts, every position below them.
TEST(TopKRowsTest, EntryRowsSelectAmongTheRequestsEntries) {
  const IndexGroups groups = IndexGroups::Uniform(2, 1, 16);
  TopKRows entries(Options(), groups, kBatch, 1, /*entry_tokens=*/4);
  TopKRows direct(Options(), groups, kBatch);
  const std::vector<int32_t> counts = {50, 75, 100};  // kSeqLens / 4
  for (int step = 0; step < 2; ++step) {
    entries.Generate(kSeqLens);
    direct.Generate(counts);
    for (int32_t g = 0; g < groups.count(); ++g) {
      const std::span<const int32_t> got = entries.group(g);
      const std::span<const int32_t> want = direct.group(g);
      ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << step << " " << g;
      for (int32_t b = 0; b < kBatch; ++b) {
        for (int32_t k = 0; k < 16; ++k) {
          EXPECT_LT(got[b * 16 + k], counts[b]) << b << " " << k;
          EXPECT_GE(got[b * 16 + k], 0) << b << " " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sparsekv::tools
