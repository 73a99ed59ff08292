// The model presets: their layer lists against the models' configurations
// (docs/workload-shapes.md), and the formats each one has.
#include <gtest/gtest.h>

#include <string>

#include "sparsekv/options.h"

namespace sparsekv {
namespace {

ModelPreset Preset(const std::string& name) {
  StatusOr<ModelPreset> p = FindPreset(name);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : ModelPreset{};
}

// Options a manager of `p` would validate with (small pool and batch).
CacheOptions OptionsFor(const ModelPreset& p) {
  CacheOptions o;
  o.geometry = p.geometry();
  o.top_k = p.top_k;
  o.hot_slots = 2 * p.top_k;
  o.raw_window = p.raw_window;
  o.indexer_key_bytes = p.indexer_key_bytes;
  o.host_capacity_tokens = 1 << 16;
  o.max_requests = 4;
  o.max_context = 1 << 15;
  return o;
}

TEST(PresetsTest, EveryNameIsFoundAndValid) {
  for (const std::string& name : PresetNames()) {
    const ModelPreset p = Preset(name);
    EXPECT_EQ(p.name, name);
    EXPECT_EQ(p.geometry().num_layers(), p.num_layers) << name;
    const Status s = ValidateOptions(OptionsFor(p));
    EXPECT_TRUE(s.ok()) << name << ": " << s.ToString();
  }
  EXPECT_EQ(FindPreset("llama").status().code(), StatusCode::kNotFound);
}

TEST(PresetsTest, DsaPresetsAreUniformAndServed) {
  for (const std::string name : {"deepseek-v3.2", "glm-5"}) {
    for (KVRowFormat format : {KVRowFormat::kFp8Row656, KVRowFormat::kBf16Row1152}) {
      const ModelPreset p = *FindPreset(name, format);
      const KVGeometry uniform = KVGeometry::Uniform(p.num_layers, KVRowBytes(format));
      ASSERT_EQ(p.geometry().num_layers(), uniform.num_layers());
      for (int32_t i = 0; i < p.num_layers; ++i) {
        EXPECT_EQ(p.layers[i].row_bytes, uniform.layers[i].row_bytes);
        EXPECT_EQ(p.layers[i].row_stride, uniform.layers[i].row_stride);
      }
      EXPECT_EQ(p.raw_window, 0);
      EXPECT_TRUE(CheckServedGeometry(p.geometry(), p.raw_window).ok()) << name;
    }
  }
  EXPECT_EQ(Preset("deepseek-v3.2").num_layers, 61);
  EXPECT_EQ(Preset("glm-5").num_layers, 78);
}

// compress_ratios [0, 0] + [4, 128] x 20 + [4], then the MTP layer's 0.
TEST(PresetsTest, DeepSeekV4FlashLayers) {
  const ModelPreset p = Preset("deepseek-v4-flash");
  EXPECT_EQ(p.num_layers, 44);
  EXPECT_EQ(p.layers_of(LayerKind::kOffloaded), 21);
  EXPECT_EQ(p.layers_of(LayerKind::kResident), 20);
  EXPECT_EQ(p.layers_of(LayerKind::kWindowOnly), 3);
  EXPECT_EQ(p.layers_of(LayerKind::kOffloaded, /*keyed=*/true), 21);
  EXPECT_EQ(p.layers_of(LayerKind::kResident, /*keyed=*/true), 0);
  for (int32_t i : {0, 1, 43}) EXPECT_EQ(p.layers[i].kind, LayerKind::kWindowOnly) << i;
  for (int32_t i : {2, 40, 42}) {
    EXPECT_EQ(p.layers[i].kind, LayerKind::kOffloaded) << i;
    EXPECT_EQ(p.layers[i].entry_tokens, 4);
    EXPECT_EQ(p.layers[i].top_k, 512);
    EXPECT_EQ(p.layers[i].index_group, i);  // every CSA layer has its own indexer
  }
  for (int32_t i : {3, 41}) {
    EXPECT_EQ(p.layers[i].kind, LayerKind::kResident) << i;
    EXPECT_EQ(p.layers[i].entry_tokens, 128);
  }
  EXPECT_EQ(p.top_k, 512);
  EXPECT_EQ(p.raw_window, 128);
  EXPECT_EQ(p.row_bytes, 584);
  EXPECT_EQ(p.layers[0].format, KVRowFormat::kFp8Entry584);
  EXPECT_DOUBLE_EQ(p.weights_per_gpu_gb, 19.95);
}

// compress_ratios [128, 128] + [4, 128] x 29 + [4], then the MTP layer's 0.
TEST(PresetsTest, DeepSeekV4ProLayers) {
  const ModelPreset p = Preset("deepseek-v4-pro");
  EXPECT_EQ(p.num_layers, 62);
  EXPECT_EQ(p.layers_of(LayerKind::kOffloaded), 30);
  EXPECT_EQ(p.layers_of(LayerKind::kResident), 31);
  EXPECT_EQ(p.layers_of(LayerKind::kWindowOnly), 1);
  for (int32_t i : {0, 1, 3, 59}) EXPECT_EQ(p.layers[i].kind, LayerKind::kResident) << i;
  for (int32_t i : {2, 58, 60}) {
    EXPECT_EQ(p.layers[i].kind, LayerKind::kOffloaded) << i;
    EXPECT_EQ(p.layers[i].top_k, 1024);
  }
  EXPECT_EQ(p.layers[61].kind, LayerKind::kWindowOnly);
  EXPECT_DOUBLE_EQ(p.weights_per_gpu_gb, 108.1);
}

// indexer_types "full" at 0, 1, 2, 6, 10, ..., 74; each shared layer uses the newest full one's.
TEST(PresetsTest, Glm53IndexGroupsAndKeys) {
  const ModelPreset p = Preset("glm-5.3");
  EXPECT_EQ(p.num_layers, 78);
  EXPECT_EQ(p.layers_of(LayerKind::kOffloaded), 78);
  EXPECT_EQ(p.layers_of(LayerKind::kOffloaded, /*keyed=*/true), 21);
  const int32_t groups[] = {0, 1, 2, 2, 2, 2, 6, 6, 6, 6, 10};
  for (int32_t i = 0; i < 11; ++i) EXPECT_EQ(p.layers[i].index_group, groups[i]) << i;
  EXPECT_EQ(p.layers[77].index_group, 74);
  EXPECT_TRUE(p.layers[74].indexer_keys);
  EXPECT_FALSE(p.layers[75].indexer_keys);
  EXPECT_EQ(p.row_bytes, 656);
  EXPECT_EQ(p.top_k, 2048);
}

TEST(PresetsTest, FormatsAModelDoesNotHaveAreRefused) {
  const Status v4 = FindPreset("deepseek-v4-pro", KVRowFormat::kFp8Row656).status();
  EXPECT_EQ(v4.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v4.message().find("656-B"), std::string::npos) << v4.message();
  EXPECT_EQ(FindPreset("glm-5.3", KVRowFormat::kFp8Entry584).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(FindPreset("glm-5.3", KVRowFormat::kBf16Row1152).ok());
  EXPECT_EQ(FindPreset("glm-5", KVRowFormat::kMxfp4Entry368).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(PresetsTest, DeepSeekV4InMxfp4Has368ByteEntries) {
  const StatusOr<ModelPreset> p = FindPreset("deepseek-v4-flash", KVRowFormat::kMxfp4Entry368);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->row_bytes, 368);
  for (const LayerShape& layer : p->layers) {
    EXPECT_EQ(layer.format, KVRowFormat::kMxfp4Entry368);
    EXPECT_EQ(layer.row_bytes, 368);
  }
  EXPECT_EQ(p->layers_of(LayerKind::kOffloaded), 21);  // the layer list does not change
}

TEST(PresetsTest, DeepSeekV4AndGlm53AreServed) {
  for (const std::string name : {"deepseek-v4-flash", "deepseek-v4-pro"}) {
    const ModelPreset p = Preset(name);
    EXPECT_TRUE(CheckServedGeometry(p.geometry(), p.raw_window).ok()) << name;
  }
  const ModelPreset glm = Preset("glm-5.3");
  EXPECT_TRUE(CheckServedGeometry(glm.geometry(), glm.raw_window).ok());
}

}  // namespace
}  // namespace sparsekv
