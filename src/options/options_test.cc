#include "sparsekv/options.h"

#include <gtest/gtest.h>

namespace sparsekv {
namespace {

CacheOptions Valid() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(4, 656);
  o.top_k = 64;
  o.hot_slots = 128;
  o.host_capacity_tokens = 4096;
  o.max_requests = 8;
  o.max_context = 1024;
  return o;
}

void ExpectInvalid(const CacheOptions& o, const std::string& mentions) {
  const Status s = ValidateOptions(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(mentions), std::string::npos) << s.message();
}

TEST(OptionsTest, ValidOptionsPass) { EXPECT_TRUE(ValidateOptions(Valid()).ok()); }

TEST(OptionsTest, HotSlotsBelowTopKRejected) {
  CacheOptions o = Valid();
  o.hot_slots = o.top_k - 1;
  ExpectInvalid(o, "hot_slots");
  o.hot_slots = o.top_k;  // C == K is allowed
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(OptionsTest, SortMissesMinBatchValidated) {
  CacheOptions o = Valid();
  EXPECT_EQ(o.sort_misses_min_batch, 32);  // the documented default
  o.sort_misses_min_batch = -1;
  ExpectInvalid(o, "sort_misses_min_batch");
  o.sort_misses_min_batch = 0;  // every step
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(OptionsTest, CopyBlocksValidated) {
  CacheOptions o = Valid();
  EXPECT_EQ(o.copy_blocks, 0);  // the documented default: as many blocks as the GPU holds
  o.copy_blocks = -1;
  ExpectInvalid(o, "copy_blocks");
  o.copy_blocks = 1;
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(OptionsTest, EvictionPolicyValidated) {
  CacheOptions o = Valid();
  EXPECT_EQ(o.eviction, EvictionPolicy::kClock);  // the documented default
  o.protected_percent = 101;
  ExpectInvalid(o, "protected_percent");
  o.protected_percent = -1;
  ExpectInvalid(o, "protected_percent");
  o.protected_percent = 0;
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.eviction = static_cast<EvictionPolicy>(7);
  ExpectInvalid(o, "eviction");
  o.eviction = EvictionPolicy::kLru;
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(OptionsTest, StrideBelowRowBytesRejected) {
  CacheOptions o = Valid();
  o.geometry.layers[2].row_stride = 600;
  ExpectInvalid(o, "geometry.layers[2].row_stride");
  o.geometry.layers[2].row_stride = 704;  // padding a row is allowed
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(OptionsTest, EmptyGeometryRejected) {
  CacheOptions o = Valid();
  o.geometry.layers.clear();
  ExpectInvalid(o, "geometry.layers");
}

TEST(OptionsTest, WindowMustHoldTheNewestToken) {
  CacheOptions o = Valid();
  o.window = 0;
  ExpectInvalid(o, "window");
}

TEST(OptionsTest, RequiredFieldsRejectedWhenMissing) {
  CacheOptions o = Valid();
  o.max_requests = 0;
  ExpectInvalid(o, "max_requests");
  o = Valid();
  o.max_context = 0;
  ExpectInvalid(o, "max_context");
  o = Valid();
  o.host_capacity_tokens = 0;
  ExpectInvalid(o, "host_capacity_tokens");
  o = Valid();
  o.max_batch = o.max_requests + 1;
  ExpectInvalid(o, "max_batch");
  o = Valid();
  o.max_host_requests = o.max_requests - 1;
  ExpectInvalid(o, "max_host_requests");
}

TEST(OptionsTest, ThirtyTwoBitOverflowRejected) {
  CacheOptions o = Valid();
  o.host_capacity_tokens = int64_t{1} << 31;
  ExpectInvalid(o, "32-bit row");
  o = Valid();
  o.max_requests = 1 << 20;
  o.hot_slots = 4096;
  ExpectInvalid(o, "32-bit slot");
}

TEST(OptionsTest, PresetsMatchTheModels) {
  StatusOr<ModelPreset> ds = FindPreset("deepseek-v3.2", KVRowFormat::kFp8Row656);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->num_layers, 61);
  EXPECT_EQ(ds->geometry().token_bytes(), 61 * 656);
  StatusOr<ModelPreset> glm = FindPreset("glm-5", KVRowFormat::kBf16Row1152);
  ASSERT_TRUE(glm.ok());
  EXPECT_EQ(glm->num_layers, 78);
  EXPECT_EQ(glm->row_bytes, 1152);
  EXPECT_EQ(FindPreset("llama", KVRowFormat::kFp8Row656).status().code(), StatusCode::kNotFound);
}

TEST(OptionsTest, BudgetAndResidencyValidated) {
  CacheOptions o = Valid();
  o.hot_slots = 0;  // chosen from a budget, so one is needed
  ExpectInvalid(o, "device_budget_bytes");
  o.device_budget_bytes = int64_t{1} << 30;
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.device_budget_bytes = -1;
  ExpectInvalid(o, "device_budget_bytes");
  o = Valid();
  o.hot_slots = kMaxHotSlots + 1;
  ExpectInvalid(o, "hot_slots");
  o = Valid();
  o.hybrid_residency = true;
  o.resident_page_rows = o.hot_slots + o.window + 1;
  ExpectInvalid(o, "resident_page_rows");
  o.resident_page_rows = 0;
  ExpectInvalid(o, "resident_page_rows");
  o.resident_page_rows = 16;
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(OptionsTest, IndexerKeysNeedWordsAndOneRowStride) {
  CacheOptions o = Valid();
  o.geometry = KVGeometry::Uniform(3, 656);
  o.indexer_key_bytes = 132;
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.indexer_key_bytes = 130;  // not a multiple of 4
  ExpectInvalid(o, "indexer_key_bytes");
  o.indexer_key_bytes = -4;
  ExpectInvalid(o, "indexer_key_bytes");
  o.indexer_key_bytes = 132;
  o.geometry.layers[1].row_stride = 704;  // layers of different strides
  ExpectInvalid(o, "one row_stride");
  o.geometry = KVGeometry::Uniform(3, 654);  // a stride that is not a multiple of 4
  ExpectInvalid(o, "one row_stride");
  // Only the offloaded layers hold keys, in the hot cache's pages: a resident layer may have
  // another stride, even as layer 0.
  o.geometry = KVGeometry::Uniform(3, 656);
  o.geometry.layers[0] = LayerShape{584, 590};
  o.geometry.layers[0].kind = LayerKind::kResident;
  o.geometry.layers[0].entry_tokens = 128;
  o.geometry.layers[0].indexer_keys = false;
  EXPECT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o).ToString();
  o.geometry.layers[2].row_stride = 704;  // offloaded layers of different strides
  ExpectInvalid(o, "one row_stride, a multiple of 4, in every offloaded layer");
  o.geometry = KVGeometry::Uniform(3, 8);
  o.resident_page_rows = 16;
  o.indexer_key_bytes = 132;  // more than a page of 16 rows of 8 bytes
  ExpectInvalid(o, "exceeds a page");
  o.indexer_key_bytes = 128;
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.resident_page_rows = 0;  // pages are needed for the keys, with or without residency
  ExpectInvalid(o, "resident_page_rows");
}

}  // namespace
}  // namespace sparsekv
