#include "sparsekv/index_groups.h"

#include <gtest/gtest.h>

namespace sparsekv {
namespace {

CacheOptions Layers(int32_t n) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(n, 8);
  o.top_k = 16;
  return o;
}

TEST(IndexGroupsTest, UniformGroupsFollowLayersPerIndex) {
  CacheOptions o = Layers(7);
  o.layers_per_index = 3;
  const IndexGroups g(o);
  ASSERT_EQ(g.count(), 3);
  EXPECT_EQ(g.First(0), 0);
  EXPECT_EQ(g.End(0), 3);
  EXPECT_EQ(g.First(2), 6);
  EXPECT_EQ(g.End(2), 7);  // the last group is shorter
  EXPECT_EQ(g.Of(4), 1);
  EXPECT_EQ(g.Leader(5), 3);
  EXPECT_TRUE(g.Leads(3));
  EXPECT_FALSE(g.Leads(4));
  EXPECT_EQ(g.LayerTopK(6), 16);
  EXPECT_EQ(g.max_top_k(), 16);
  EXPECT_TRUE(g.shared());
  EXPECT_FALSE(g.named());
}

TEST(IndexGroupsTest, OneLayerPerGroupSharesNothing) {
  const IndexGroups g(Layers(3));
  EXPECT_EQ(g.count(), 3);
  EXPECT_FALSE(g.shared());
  for (int32_t l = 0; l < 3; ++l) EXPECT_EQ(g.Leader(l), l);
}

// GLM-5.3's pattern, scaled down: {0}, {1}, {2-5}, {6-9}, with the groups' own top-k.
TEST(IndexGroupsTest, ExplicitGroupsAndTopKPerGroup) {
  CacheOptions o = Layers(10);
  const int32_t group[] = {0, 1, 2, 2, 2, 2, 6, 6, 6, 6};
  for (int32_t l = 0; l < 10; ++l) {
    o.geometry.layers[l].index_group = group[l];
    o.geometry.layers[l].top_k = l >= 6 ? 8 : 0;
  }
  const IndexGroups g(o);
  ASSERT_EQ(g.count(), 4);
  EXPECT_EQ(g.Size(0), 1);
  EXPECT_EQ(g.Size(1), 1);
  EXPECT_EQ(g.First(2), 2);
  EXPECT_EQ(g.Size(2), 4);
  EXPECT_EQ(g.First(3), 6);
  EXPECT_EQ(g.End(3), 10);
  for (int32_t l = 0; l < 10; ++l) EXPECT_EQ(g.Leader(l), group[l]) << "layer " << l;
  EXPECT_EQ(g.TopK(2), 16);  // 0: the options' top_k
  EXPECT_EQ(g.TopK(3), 8);
  EXPECT_EQ(g.LayerTopK(9), 8);
  EXPECT_EQ(g.max_top_k(), 16);
  EXPECT_TRUE(g.named());
  EXPECT_STREQ(g.option(), "index_group");
}

TEST(IndexGroupsTest, UniformFactoryMatchesTheOptions) {
  CacheOptions o = Layers(5);
  o.layers_per_index = 2;
  const IndexGroups a(o);
  const IndexGroups b = IndexGroups::Uniform(5, 2, 16);
  ASSERT_EQ(a.count(), b.count());
  for (int32_t l = 0; l < 5; ++l) EXPECT_EQ(a.Of(l), b.Of(l));
  EXPECT_EQ(b.max_top_k(), 16);
}

}  // namespace
}  // namespace sparsekv
