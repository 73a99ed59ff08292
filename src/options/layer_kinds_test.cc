// ValidateOptions' rules on layer kinds, cadences, per-layer top-k, formats, index groups and
// keys, and CheckServedGeometry: each refusal names the field.
#include <gtest/gtest.h>

#include <string>

#include "sparsekv/options.h"

namespace sparsekv {
namespace {

LayerShape Offloaded(int32_t entry_tokens = 4) {
  LayerShape l;
  l.row_bytes = l.row_stride = 584;
  l.entry_tokens = entry_tokens;
  return l;
}

LayerShape Resident() {
  LayerShape l = Offloaded(128);
  l.kind = LayerKind::kResident;
  l.indexer_keys = false;
  return l;
}

LayerShape WindowOnly() {
  LayerShape l = Offloaded(1);
  l.kind = LayerKind::kWindowOnly;
  l.indexer_keys = false;
  return l;
}

// A small DeepSeek-V4-like geometry: CSA, HCA, CSA, window-only.
CacheOptions V4Like() {
  CacheOptions o;
  o.geometry.layers = {Offloaded(), Resident(), Offloaded(), WindowOnly()};
  o.top_k = 64;
  o.hot_slots = 128;
  o.raw_window = 128;
  o.indexer_key_bytes = 132;
  o.host_capacity_tokens = 4096;
  o.max_requests = 8;
  o.max_context = 1024;
  return o;
}

// GLM-5.3-like explicit groups {0}, {1, 2}, {3}.
CacheOptions Grouped() {
  CacheOptions o = V4Like();
  o.raw_window = 0;
  o.geometry.layers.assign(4, Offloaded(1));
  const int32_t groups[] = {0, 1, 1, 3};
  for (int32_t i = 0; i < 4; ++i) {
    o.geometry.layers[i].index_group = groups[i];
    o.geometry.layers[i].indexer_keys = groups[i] == i;
  }
  return o;
}

void ExpectInvalid(const CacheOptions& o, const std::string& mentions) {
  const Status s = ValidateOptions(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(mentions), std::string::npos) << s.message();
}

TEST(LayerKindsTest, MixedKindsAndExplicitGroupsPass) {
  EXPECT_TRUE(ValidateOptions(V4Like()).ok()) << ValidateOptions(V4Like()).ToString();
  EXPECT_TRUE(ValidateOptions(Grouped()).ok()) << ValidateOptions(Grouped()).ToString();
}

TEST(LayerKindsTest, KindCadenceAndTopKOfALayerValidated) {
  CacheOptions o = V4Like();
  o.geometry.layers[0].kind = static_cast<LayerKind>(9);
  ExpectInvalid(o, "layers[0].kind");
  o = V4Like();
  o.geometry.layers[1].entry_tokens = 0;
  ExpectInvalid(o, "layers[1].entry_tokens");
  o = V4Like();
  o.geometry.layers[0].top_k = -1;
  ExpectInvalid(o, "layers[0].top_k");
  o = V4Like();
  o.geometry.layers[1].top_k = 64;
  ExpectInvalid(o, "layers[1].top_k must be 0 for a kResident layer");
}

TEST(LayerKindsTest, OffloadedTopKMustFitTheHotCache) {
  CacheOptions o = V4Like();
  o.geometry.layers[2].top_k = 256;
  ExpectInvalid(o, "layers[2].top_k (256) exceeds hot_slots (128)");
}

TEST(LayerKindsTest, FormatMustMatchTheRowBytes) {
  CacheOptions o = V4Like();
  o.geometry.layers[0].format = KVRowFormat::kFp8Entry584;
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.geometry.layers[0].format = KVRowFormat::kFp8Row656;
  ExpectInvalid(o, "layers[0].row_bytes (584) must be 656");
  o.geometry.layers[0].format = static_cast<KVRowFormat>(9);
  ExpectInvalid(o, "layers[0].format");
}

TEST(LayerKindsTest, LayersWithoutTopKHaveNoGroupOrKeys) {
  CacheOptions o = V4Like();
  o.geometry.layers[1].index_group = 1;
  ExpectInvalid(o, "layers[1].index_group must be -1");
  o = V4Like();
  o.geometry.layers[3].indexer_keys = true;
  ExpectInvalid(o, "layers[3].indexer_keys must be false for a kWindowOnly layer");
  o.indexer_key_bytes = 0;  // no keys kept: the flag says nothing
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(LayerKindsTest, RawWindowValidated) {
  CacheOptions o = V4Like();
  o.raw_window = 0;
  ExpectInvalid(o, "layers[3].kind is kWindowOnly, which needs a raw_window");
  o.raw_window = -1;
  ExpectInvalid(o, "raw_window");
}

TEST(LayerKindsTest, OffloadedLayersShareOneCadence) {
  CacheOptions o = V4Like();
  o.geometry.layers[2].entry_tokens = 8;
  ExpectInvalid(o, "layers[2].entry_tokens (8) differs from geometry.layers[0]'s (4)");
}

TEST(LayerKindsTest, SomeOffloadedLayerIsNeeded) {
  CacheOptions o = V4Like();
  o.geometry.layers = {Resident(), WindowOnly()};
  ExpectInvalid(o, "no offloaded layer");
}

TEST(LayerKindsTest, UniformGroupsNeedOffloadedLayersOnly) {
  CacheOptions o = V4Like();
  o.layers_per_index = 2;
  ExpectInvalid(o, "layers_per_index (2) with a layer that is not offloaded (geometry.layers[1])");
}

TEST(LayerKindsTest, ExplicitGroupsOnEveryOffloadedLayerOrNone) {
  CacheOptions o = Grouped();
  o.geometry.layers[3].index_group = -1;
  ExpectInvalid(o, "layers[3].index_group: set it on every offloaded layer or on none");
  o = Grouped();
  o.layers_per_index = 2;
  ExpectInvalid(o, "and so is layers_per_index");
  o = Grouped();
  o.geometry.layers[2].index_group = 3;
  ExpectInvalid(o, "layers[2].index_group (3) must be -1 or an earlier layer's index");
}

TEST(LayerKindsTest, GroupIsNamedByItsFirstLayer) {
  CacheOptions o = Grouped();
  o.geometry.layers[1].index_group = 0;  // layer 2 still names 1, which is now in group 0
  ExpectInvalid(o, "layers[2].index_group (1) must name the first layer");
}

TEST(LayerKindsTest, GroupLayersAreConsecutive) {
  CacheOptions o = Grouped();
  o.geometry.layers[3].index_group = 0;  // {0, 3} around group 1
  ExpectInvalid(o, "layers[3].index_group (0): a group's layers must be consecutive");
}

TEST(LayerKindsTest, GroupSharesOneTopK) {
  CacheOptions o = Grouped();
  o.geometry.layers[2].top_k = 32;
  ExpectInvalid(o, "layers[2].top_k (32) differs from its group's first layer's (64)");
}

TEST(LayerKindsTest, GroupKeysStartAtItsFirstLayer) {
  CacheOptions o = Grouped();
  o.geometry.layers[1].indexer_keys = false;
  o.geometry.layers[2].indexer_keys = true;
  ExpectInvalid(o, "layers[2].indexer_keys is true but its group's first layer");
}

TEST(LayerKindsTest, DefaultsAreToday) {
  const LayerShape l;
  EXPECT_EQ(l.kind, LayerKind::kOffloaded);
  EXPECT_EQ(l.entry_tokens, 1);
  EXPECT_EQ(l.top_k, 0);
  EXPECT_FALSE(l.format.has_value());
  EXPECT_EQ(l.index_group, -1);
  EXPECT_TRUE(l.indexer_keys);
  EXPECT_EQ(CacheOptions{}.raw_window, 0);
  EXPECT_TRUE(CheckServedGeometry(KVGeometry::Uniform(61, 656), 0).ok());
}

TEST(LayerKindsTest, ManagerServesEveryKindBesideAnOffloadedLayer) {
  const auto expect_refused = [](const KVGeometry& g, int32_t raw_window, const std::string& m) {
    const Status s = CheckServedGeometry(g, raw_window);
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
    EXPECT_NE(s.message().find(m), std::string::npos) << s.message();
  };
  const KVGeometry uniform = KVGeometry::Uniform(3, 656);
  KVGeometry g = uniform;
  g.layers[1].kind = LayerKind::kResident;
  g.layers[2].kind = LayerKind::kWindowOnly;
  EXPECT_TRUE(CheckServedGeometry(g, 128).ok());
  EXPECT_TRUE(CheckServedGeometry(uniform, 128).ok());
  g.layers[0].kind = LayerKind::kResident;
  expect_refused(g, 128, "no layer is kOffloaded");
  // GLM-5.3's layers: their own top-k, explicit groups, keys on the groups' first layers.
  g = uniform;
  g.layers[0].top_k = 512;
  g.layers[0].index_group = 0;
  g.layers[1].index_group = g.layers[2].index_group = 1;
  g.layers[2].indexer_keys = false;
  EXPECT_TRUE(CheckServedGeometry(g, 0).ok());
  // One entry per 4 tokens in every layer.
  g = uniform;
  for (LayerShape& l : g.layers) l.entry_tokens = 4;
  EXPECT_TRUE(CheckServedGeometry(g, 0).ok());
}

}  // namespace
}  // namespace sparsekv
