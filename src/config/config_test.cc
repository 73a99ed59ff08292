#include "sparsekv/config.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sparsekv/options.h"

namespace sparsekv {
namespace {

// A valid manager's options: four DeepSeek-V3.2 fp8 layers.
CacheOptions Base() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(4, 656);
  o.host_capacity_tokens = 1 << 16;
  o.max_requests = 8;
  o.max_context = 8192;
  return o;
}

// A valid manager's options for DeepSeek-V4-Flash: offloaded CSA layers of an entry per 4
// tokens beside resident and window-only layers.
CacheOptions V4Base() {
  StatusOr<ModelPreset> preset = FindPreset("deepseek-v4-flash");
  EXPECT_TRUE(preset.ok()) << preset.status().ToString();
  CacheOptions o;
  o.geometry = preset->geometry();
  o.raw_window = preset->raw_window;
  o.top_k = preset->top_k;
  o.hot_slots = 2 * preset->top_k;
  o.host_capacity_tokens = 1 << 16;
  o.max_requests = 8;
  o.max_context = 8192;
  return o;
}

// Every field of CacheOptions, by name, so that a failure says which one differs.
void ExpectSameOptions(const CacheOptions& a, const CacheOptions& b) {
  ASSERT_EQ(a.geometry.num_layers(), b.geometry.num_layers());
  for (int32_t i = 0; i < a.geometry.num_layers(); ++i) {
    EXPECT_EQ(a.geometry.layers[i].row_bytes, b.geometry.layers[i].row_bytes) << "layer " << i;
    EXPECT_EQ(a.geometry.layers[i].row_stride, b.geometry.layers[i].row_stride) << "layer " << i;
  }
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.hot_slots, b.hot_slots);
  EXPECT_EQ(a.device_budget_bytes, b.device_budget_bytes);
  EXPECT_EQ(a.hybrid_residency, b.hybrid_residency);
  EXPECT_EQ(a.indexer_key_bytes, b.indexer_key_bytes);
  EXPECT_EQ(a.window, b.window);
  EXPECT_EQ(a.eviction, b.eviction);
  EXPECT_EQ(a.protected_percent, b.protected_percent);
  EXPECT_EQ(a.host_capacity_tokens, b.host_capacity_tokens);
  EXPECT_EQ(a.max_requests, b.max_requests);
  EXPECT_EQ(a.max_host_requests, b.max_host_requests);
  EXPECT_EQ(a.max_batch, b.max_batch);
  EXPECT_EQ(a.max_context, b.max_context);
  EXPECT_EQ(a.host_page_tokens, b.host_page_tokens);
  EXPECT_EQ(a.layers_per_index, b.layers_per_index);
  EXPECT_EQ(a.share_repeated_positions, b.share_repeated_positions);
  EXPECT_EQ(a.sort_misses, b.sort_misses);
  EXPECT_EQ(a.sort_misses_min_batch, b.sort_misses_min_batch);
  EXPECT_EQ(a.max_prefetch, b.max_prefetch);
  EXPECT_EQ(a.copy_blocks, b.copy_blocks);
  EXPECT_EQ(a.prefetch_copy_blocks, b.prefetch_copy_blocks);
  EXPECT_EQ(a.resident_page_rows, b.resident_page_rows);
  EXPECT_EQ(a.fused_copy_min_batch, b.fused_copy_min_batch);
  EXPECT_EQ(a.copy_chunk_rows, b.copy_chunk_rows);
  EXPECT_EQ(a.copy_strategy, b.copy_strategy);
}

// One change away from Base() per field, each still valid: the round trip must carry it.
const std::vector<std::pair<std::string, std::function<void(CacheOptions&)>>>& FieldChanges() {
  static const std::vector<std::pair<std::string, std::function<void(CacheOptions&)>>> changes = {
      {"geometry", [](CacheOptions& o) { o.geometry = KVGeometry::Uniform(3, 1152, 1216); }},
      {"top_k", [](CacheOptions& o) { o.top_k = 1024; }},
      {"hot_slots", [](CacheOptions& o) { o.hot_slots = 3000; }},
      {"device_budget_bytes", [](CacheOptions& o) { o.device_budget_bytes = int64_t{5} << 32; }},
      {"hybrid_residency", [](CacheOptions& o) { o.hybrid_residency = true; }},
      {"indexer_key_bytes", [](CacheOptions& o) { o.indexer_key_bytes = 132; }},
      {"window", [](CacheOptions& o) { o.window = 7; }},
      {"eviction", [](CacheOptions& o) { o.eviction = EvictionPolicy::kLru; }},
      {"protected_percent", [](CacheOptions& o) { o.protected_percent = 55; }},
      {"host_capacity_tokens", [](CacheOptions& o) { o.host_capacity_tokens = 1'000'000'000; }},
      {"max_requests", [](CacheOptions& o) { o.max_requests = 12; }},
      {"max_host_requests", [](CacheOptions& o) { o.max_host_requests = 20; }},
      {"max_batch", [](CacheOptions& o) { o.max_batch = 6; }},
      {"max_context", [](CacheOptions& o) { o.max_context = 131072; }},
      {"host_page_tokens", [](CacheOptions& o) { o.host_page_tokens = 128; }},
      {"layers_per_index", [](CacheOptions& o) { o.layers_per_index = 2; }},
      {"share_repeated_positions", [](CacheOptions& o) { o.share_repeated_positions = true; }},
      {"sort_misses", [](CacheOptions& o) { o.sort_misses = false; }},
      {"sort_misses_min_batch", [](CacheOptions& o) { o.sort_misses_min_batch = 0; }},
      {"max_prefetch", [](CacheOptions& o) { o.max_prefetch = 256; }},
      {"copy_blocks", [](CacheOptions& o) { o.copy_blocks = 16; }},
      {"prefetch_copy_blocks", [](CacheOptions& o) { o.prefetch_copy_blocks = 8; }},
      {"resident_page_rows", [](CacheOptions& o) { o.resident_page_rows = 32; }},
      {"fused_copy_min_batch", [](CacheOptions& o) { o.fused_copy_min_batch = 0; }},
      {"copy_chunk_rows", [](CacheOptions& o) { o.copy_chunk_rows = 16; }},
      {"copy_strategy", [](CacheOptions& o) { o.copy_strategy = CopyStrategy::kBulk; }},
  };
  return changes;
}

template <typename T>
std::string ErrorOf(const StatusOr<T>& result) {
  EXPECT_FALSE(result.ok());
  if (result.ok()) return "";
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << result.status().ToString();
  return result.status().message();
}

// ---- sparsekv's own keys ----

TEST(CacheOptionsJsonTest, WritesEveryFieldInTheOrderOfTheHeader) {
  const nlohmann::ordered_json written = nlohmann::ordered_json::parse(CacheOptionsToJson(Base()));
  std::vector<std::string> keys;
  for (const auto& [key, value] : written.items()) keys.push_back(key);
  std::vector<std::string> fields;
  for (const auto& [name, change] : FieldChanges()) fields.push_back(name);
  EXPECT_EQ(keys, fields);
}

TEST(CacheOptionsJsonTest, RoundTripCarriesEachField) {
  const std::string base_json = CacheOptionsToJson(Base());
  for (const auto& [name, change] : FieldChanges()) {
    SCOPED_TRACE(name);
    CacheOptions changed = Base();
    change(changed);
    ASSERT_TRUE(ValidateOptions(changed).ok()) << ValidateOptions(changed).ToString();
    const std::string json = CacheOptionsToJson(changed);
    EXPECT_NE(json, base_json);
    StatusOr<CacheOptions> back = CacheOptionsFromJson(json, CacheOptions{});
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSameOptions(*back, changed);
  }
}

TEST(CacheOptionsJsonTest, RoundTripOfEveryFieldChangedAtOnce) {
  CacheOptions all = Base();
  for (const auto& [name, change] : FieldChanges()) change(all);
  ASSERT_TRUE(ValidateOptions(all).ok()) << ValidateOptions(all).ToString();
  StatusOr<CacheOptions> back = CacheOptionsFromJson(CacheOptionsToJson(all), Base());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameOptions(*back, all);
}

TEST(CacheOptionsJsonTest, RoundTripOfLayersThatDiffer) {
  CacheOptions o = Base();
  o.geometry.layers = {{656, 656}, {1152, 1152}, {656, 704}};
  const std::string json = CacheOptionsToJson(o);
  EXPECT_NE(json.find("\"layers\""), std::string::npos) << json;
  StatusOr<CacheOptions> back = CacheOptionsFromJson(json, CacheOptions{});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectSameOptions(*back, o);
}

TEST(CacheOptionsJsonTest, KeysLeftOutKeepTheBase) {
  StatusOr<CacheOptions> o =
      CacheOptionsFromJson(R"({"hot_slots": 6144, "eviction": "lru"})", Base());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  CacheOptions expected = Base();
  expected.hot_slots = 6144;
  expected.eviction = EvictionPolicy::kLru;
  ExpectSameOptions(*o, expected);
}

TEST(CacheOptionsJsonTest, ReadsAWholeConfigWithoutABase) {
  StatusOr<CacheOptions> o = CacheOptionsFromJson(R"({
    "geometry": {"num_layers": 61, "row_bytes": 656},
    "top_k": 2048, "hot_slots": 4096, "host_capacity_tokens": 2000000,
    "max_requests": 64, "max_context": 32768, "copy_strategy": "lattice_wide"
  })",
                                                  CacheOptions{});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->geometry.num_layers(), 61);
  EXPECT_EQ(o->geometry.layers[60].row_stride, 656);  // row_stride left out: row_bytes
  EXPECT_EQ(o->host_capacity_tokens, 2000000);
  EXPECT_EQ(o->copy_strategy, CopyStrategy::kLatticeWide);
}

TEST(CacheOptionsJsonTest, UnknownKeyIsNamedWithTheAcceptedOnes) {
  const std::string message = ErrorOf(CacheOptionsFromJson(R"({"hot_slot": 4096})", Base()));
  EXPECT_NE(message.find("unknown key \"hot_slot\""), std::string::npos) << message;
  EXPECT_NE(message.find("accepted: geometry, top_k, hot_slots"), std::string::npos) << message;
  EXPECT_NE(message.find("copy_strategy"), std::string::npos) << message;
}

TEST(CacheOptionsJsonTest, WrongTypesNameTheKey) {
  EXPECT_NE(ErrorOf(CacheOptionsFromJson(R"({"top_k": "2048"})", Base()))
                .find("top_k must be an integer"),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromJson(R"({"top_k": 2048.5})", Base()))
                .find("top_k must be an integer"),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromJson(R"({"sort_misses": 1})", Base()))
                .find("sort_misses must be true or false"),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromJson(R"({"window": null})", Base())).find("window must be"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(CacheOptionsFromJson(R"({"eviction": "fifo"})", Base()))
          .find("eviction must be one of \"lru\", \"segmented_lru\", \"clock\", got \"fifo\""),
      std::string::npos);
}

TEST(CacheOptionsJsonTest, ValuesBeyondTheFieldTypeNameTheKey) {
  const std::string message =
      ErrorOf(CacheOptionsFromJson(R"({"max_context": 3000000000})", Base()));
  EXPECT_NE(message.find("max_context must be in [-2147483648, 2147483647]"), std::string::npos)
      << message;
  EXPECT_NE(
      ErrorOf(CacheOptionsFromJson(R"({"host_capacity_tokens": 18446744073709551615})", Base()))
          .find("host_capacity_tokens must be in"),
      std::string::npos);
}

TEST(CacheOptionsJsonTest, InvalidResultNamesTheField) {
  const std::string message = ErrorOf(CacheOptionsFromJson(R"({"hot_slots": 100})", Base()));
  EXPECT_NE(message.find("hot_slots (100) must be in [top_k = 2048"), std::string::npos) << message;
  EXPECT_NE(ErrorOf(CacheOptionsFromJson("{}", CacheOptions{})).find("geometry"),
            std::string::npos);
}

TEST(CacheOptionsJsonTest, KeyGivenTwiceIsRefused) {
  EXPECT_NE(ErrorOf(CacheOptionsFromJson(R"({"top_k": 2048, "top_k": 1024})", Base()))
                .find("key \"top_k\" is given twice"),
            std::string::npos);
}

TEST(CacheOptionsJsonTest, TextThatIsNotAnObjectIsRefused) {
  EXPECT_NE(ErrorOf(CacheOptionsFromJson("{\"top_k\": ", Base())).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromJson("", Base())).find("not valid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromJson("[1, 2]", Base())).find("must be a JSON object"),
            std::string::npos);
}

TEST(CacheOptionsJsonTest, GeometryErrorsNameTheNestedKey) {
  EXPECT_NE(
      ErrorOf(CacheOptionsFromJson(
                  R"({"geometry": {"layers": [{"row_bytes": 656}, {"row_stride": 656}]}})", Base()))
          .find("geometry.layers[1].row_bytes is required"),
      std::string::npos);
  EXPECT_NE(
      ErrorOf(CacheOptionsFromJson(
                  R"({"geometry": {"num_layers": 2, "row_bytes": 656, "layers": []}})", Base()))
          .find("geometry.layers cannot be given with num_layers"),
      std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromJson(
                        R"({"geometry": {"num_layers": 100000000, "row_bytes": 656}})", Base()))
                .find("geometry.num_layers must be in [1, 65536]"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(CacheOptionsFromJson(R"({"geometry": {"num_layers": 0, "row_bytes": 656}})", Base()))
          .find("geometry.num_layers must be in [1, 65536], got 0"),
      std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromJson(R"({"geometry": {"rows": 3}})", Base()))
                .find("unknown key \"geometry.rows\""),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromJson(
                        R"({"geometry": {"num_layers": 2, "row_bytes": 656, "row_stride": 600}})",
                        Base()))
                .find("geometry.layers[0].row_stride (600) < row_bytes (656)"),
            std::string::npos);
}

TEST(CacheOptionsJsonTest, MangledTextIsRefusedOrValid) {
  // Bytes of a valid config replaced, dropped or repeated: every reader returns valid options or
  // InvalidArgument, never anything else.
  const std::string valid = CacheOptionsToJson(Base());
  const std::string_view json_chars = R"({}[]",:0123456789e.-+tfnul )";
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[at] = json_chars[rng() % json_chars.size()];
          break;
        case 1:
          text.erase(at, 1 + rng() % 8);
          break;
        default:
          text.insert(at, text.substr(at, 1 + rng() % 8));
          break;
      }
    }
    for (const StatusOr<CacheOptions>& result :
         {CacheOptionsFromJson(text, Base()), CacheOptionsFromSglangHisparseConfig(text, Base()),
          CacheOptionsFromVllmHisparse(text, Base())}) {
      if (result.ok()) {
        EXPECT_TRUE(ValidateOptions(*result).ok()) << text;
      } else {
        EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << text;
      }
    }
  }
}

// ---- SGLang's --hisparse-config ----

TEST(SglangHisparseConfigTest, DeviceBufferSizeIsTheHotSlots) {
  // The shape of SGLang's documented DeepSeek-V3.2 launch.
  StatusOr<CacheOptions> o = CacheOptionsFromSglangHisparseConfig(
      R"({"top_k": 2048, "device_buffer_size": 6144, "swap_in_block_size": 960})", Base());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  CacheOptions expected = Base();
  expected.hot_slots = 6144;
  ExpectSameOptions(*o, expected);
}

TEST(SglangHisparseConfigTest, DefaultsAreSglangs) {
  CacheOptions base = Base();
  base.hot_slots = 2500;
  StatusOr<CacheOptions> o = CacheOptionsFromSglangHisparseConfig("{}", base);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->top_k, 2048);
  EXPECT_EQ(o->hot_slots, 4096);  // 2 * top_k
  EXPECT_EQ(o->host_capacity_tokens, base.host_capacity_tokens);
  // Without a host pool in the base, SGLang's default host_to_device_ratio of 2 sizes it:
  // 2 x 8 requests x (4096 + 1) slots = 65552 tokens, down to whole 64-token pages.
  base.host_capacity_tokens = 0;
  o = CacheOptionsFromSglangHisparseConfig("{}", base);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->host_capacity_tokens, 1024 * 64);
}

TEST(SglangHisparseConfigTest, HostToDeviceRatioSizesTheHostPool) {
  // The example of SGLang's --hisparse-config help, with a larger ratio.
  StatusOr<CacheOptions> o = CacheOptionsFromSglangHisparseConfig(
      R"({"top_k": 2048, "device_buffer_size": 4096, "host_to_device_ratio": 10})", Base());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  // 10 x 8 x 4097 = 327760 tokens: 5121 whole pages.
  EXPECT_EQ(o->host_capacity_tokens, 5121 * 64);
  EXPECT_EQ(o->hot_slots, 4096);
}

TEST(SglangHisparseConfigTest, HostToDeviceRatioCountsRowsAtEveryCadence) {
  // A slot holds an entry of r = 4 tokens, so the host pool holds ratio times the device's
  // slots in rows, r times as many tokens.
  const CacheOptions base = V4Base();
  ASSERT_EQ(base.geometry.offloaded_entry_tokens(), 4);
  StatusOr<CacheOptions> o = CacheOptionsFromSglangHisparseConfig(
      R"({"device_buffer_size": 1024, "host_to_device_ratio": 2})", base);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  // 2 x 8 x (1024 + 1) = 16400 rows, down to whole 64-row pages: 256 pages, 4 tokens a row.
  EXPECT_EQ(o->host_capacity_tokens, 256 * 64 * 4);
}

TEST(SglangHisparseConfigTest, BadRatiosNameTheKey) {
  EXPECT_NE(
      ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"host_to_device_ratio": 0.5})", Base()))
          .find("host_to_device_ratio must be a number >= 1"),
      std::string::npos);
  EXPECT_NE(
      ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"host_to_device_ratio": "2"})", Base()))
          .find("host_to_device_ratio must be a number"),
      std::string::npos);
  EXPECT_NE(
      ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"host_to_device_ratio": 100000})", Base()))
          .find("host rows are 32-bit indices"),
      std::string::npos);
  CacheOptions base = Base();
  base.max_requests = 0;
  EXPECT_NE(ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"host_to_device_ratio": 2})", base))
                .find("host_to_device_ratio needs max_requests in the base options"),
            std::string::npos);
}

TEST(SglangHisparseConfigTest, KeysWithoutEffectOnSparsekvAreAccepted) {
  StatusOr<CacheOptions> o = CacheOptionsFromSglangHisparseConfig(R"({
    "top_k": 2048, "device_buffer_size": 4096, "algorithm": " DeepSeek_NSA ",
    "backend": "flashmla_sparse", "min_sparse_prompt_len": 0, "page_size": 1,
    "swap_in_block_size": 512
  })",
                                                                  Base());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ExpectSameOptions(*o, Base());
  ASSERT_TRUE(CacheOptionsFromSglangHisparseConfig(
                  R"({"algorithm": null, "backend": null, "min_sparse_prompt_len": null,
                      "page_size": null, "device_buffer_size": null})",
                  Base())
                  .ok());
  ASSERT_TRUE(
      CacheOptionsFromSglangHisparseConfig(R"({"algorithm": "deepseek_dsa"})", Base()).ok());
}

TEST(SglangHisparseConfigTest, SettingsSparsekvCannotHonourAreRefused) {
  EXPECT_NE(ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"algorithm": "quest"})", Base()))
                .find("algorithm \"quest\" has no equivalent"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"min_sparse_prompt_len": 2048})", Base()))
          .find("min_sparse_prompt_len (2048) has no equivalent"),
      std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"page_size": 64})", Base()))
                .find("page_size (64) has no equivalent"),
            std::string::npos);
}

TEST(SglangHisparseConfigTest, TopKOtherThanTheModelsIsRefused) {
  EXPECT_NE(ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"top_k": 1024})", Base()))
                .find("top_k (1024) differs from the model's top-k in the base options (2048)"),
            std::string::npos);
  CacheOptions base = Base();
  base.top_k = 1024;
  StatusOr<CacheOptions> o = CacheOptionsFromSglangHisparseConfig(R"({"top_k": 1024})", base);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->hot_slots, 2048);
}

TEST(SglangHisparseConfigTest, BadValuesNameTheKey) {
  EXPECT_NE(ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"device_buffer_size": 1000})", Base()))
                .find("device_buffer_size (1000) must be at least top_k (2048)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"swap_in_block_size": 2048})", Base()))
                .find("swap_in_block_size must be in [1, 1024]"),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"swap_in_block_size": 0})", Base()))
                .find("swap_in_block_size must be in [1, 1024], got 0"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"swap_in_block_size": "960"})", Base()))
          .find("swap_in_block_size must be an integer"),
      std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"top_k": null})", Base()))
                .find("top_k must be an integer"),
            std::string::npos);
}

TEST(SglangHisparseConfigTest, UnknownKeyListsSglangsKeys) {
  const std::string message = ErrorOf(CacheOptionsFromSglangHisparseConfig(
      R"({"algorithm": "quest", "quest_page_size": 64})", Base()));
  EXPECT_NE(message.find("SGLang hisparse config: unknown key \"quest_page_size\""),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("accepted: top_k, device_buffer_size, host_to_device_ratio"),
            std::string::npos)
      << message;
}

TEST(SglangHisparseConfigTest, ResultIsValidatedAgainstTheBase) {
  CacheOptions base = Base();
  base.max_context = 0;
  EXPECT_NE(ErrorOf(CacheOptionsFromSglangHisparseConfig(R"({"device_buffer_size": 4096})", base))
                .find("max_context must be > 0"),
            std::string::npos);
}

// ---- vLLM's HiSparse keys ----

TEST(VllmHisparseTest, HostPoolGibSizesThePoolInWholePages) {
  // attention_config.hisparse_config {"device_buffer_size": 6144} with the HiSparseConnector's
  // kv_connector_extra_config {"host_pool_gib": 1}.
  StatusOr<CacheOptions> o =
      CacheOptionsFromVllmHisparse(R"({"device_buffer_size": 6144, "host_pool_gib": 1})", Base());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->hot_slots, 6144);
  // 2^30 B / (4 layers x 656 B) = 409200.8 tokens, down to whole 64-token pages: 6393 x 64.
  EXPECT_EQ(o->host_capacity_tokens, 6393 * 64);
  EXPECT_EQ(o->top_k, 2048);
}

TEST(VllmHisparseTest, HostPoolGibHoldsRowsOfTheOffloadedLayersAtEveryCadence) {
  // DeepSeek-V4-Flash: the pool's rows are entries of its 21 CSA layers (584 B each), an entry
  // per 4 tokens; the manager gives host_capacity_tokens / 4 of them.
  const CacheOptions base = V4Base();
  const int64_t r = base.geometry.offloaded_entry_tokens();
  const int64_t row_bytes = base.geometry.token_stride_bytes();
  ASSERT_EQ(r, 4);
  ASSERT_EQ(row_bytes, 21 * 584);
  StatusOr<CacheOptions> o = CacheOptionsFromVllmHisparse(R"({"host_pool_gib": 1})", base);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  // 2^30 / 12264 = 87552.3 rows, down to whole 64-row pages: 1368 pages, 4 tokens a row.
  EXPECT_EQ(o->host_capacity_tokens, 1368 * 64 * 4);
  // The pool the manager allocates: within a page of the GiB asked for.
  const int64_t pool_bytes = o->host_capacity_tokens / r * row_bytes;
  EXPECT_LE(pool_bytes, int64_t{1} << 30);
  EXPECT_GT(pool_bytes, (int64_t{1} << 30) - o->host_page_tokens * row_bytes);
}

TEST(VllmHisparseTest, FractionalGibAndDefaultBuffer) {
  StatusOr<CacheOptions> o =
      CacheOptionsFromVllmHisparse(R"({"host_pool_gib": 0.5, "device_buffer_size": null})", Base());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->hot_slots, 4096);                         // 2 * top_k
  EXPECT_EQ(o->host_capacity_tokens, 204600 / 64 * 64);  // 2^29 / 2624 = 204600.4
}

TEST(VllmHisparseTest, LeftOutPoolKeepsTheBase) {
  StatusOr<CacheOptions> o = CacheOptionsFromVllmHisparse(
      R"({"device_buffer_size": 4096, "eager_host_mirror": true})", Base());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ExpectSameOptions(*o, Base());
}

TEST(VllmHisparseTest, EarlierReleasesKeys) {
  // top_k (equal to the model's) and host_to_device_ratio, which vLLM read only without
  // host_pool_gib.
  StatusOr<CacheOptions> o = CacheOptionsFromVllmHisparse(
      R"({"top_k": 2048, "device_buffer_size": 4096, "host_to_device_ratio": 2,
          "host_pool_gib": 1})",
      Base());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->host_capacity_tokens, 6393 * 64);
  o = CacheOptionsFromVllmHisparse(R"({"device_buffer_size": 4096, "host_to_device_ratio": 2})",
                                   Base());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->host_capacity_tokens, 1024 * 64);  // 2 x 8 x 4097 = 65552, in whole pages
}

TEST(VllmHisparseTest, LazyHostMirrorIsRefused) {
  EXPECT_NE(ErrorOf(CacheOptionsFromVllmHisparse(R"({"eager_host_mirror": false})", Base()))
                .find("eager_host_mirror (false) has no equivalent"),
            std::string::npos);
}

TEST(VllmHisparseTest, BadPoolSizesNameHostPoolGib) {
  for (const char* json : {R"({"host_pool_gib": 0})", R"({"host_pool_gib": -4})"}) {
    EXPECT_NE(ErrorOf(CacheOptionsFromVllmHisparse(json, Base()))
                  .find("host_pool_gib must be a positive number of GiB"),
              std::string::npos)
        << json;
  }
  EXPECT_NE(ErrorOf(CacheOptionsFromVllmHisparse(R"({"host_pool_gib": "8"})", Base()))
                .find("host_pool_gib must be a number"),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromVllmHisparse(R"({"host_pool_gib": 100000})", Base()))
                .find("host rows are 32-bit indices"),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromVllmHisparse(R"({"host_pool_gib": 0.0001})", Base()))
                .find("less than one host page (64 rows)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromVllmHisparse(R"({"host_pool_gib": 1})", CacheOptions{}))
                .find("needs the model's rows in the base options"),
            std::string::npos);
}

TEST(VllmHisparseTest, UnknownKeyListsVllmsKeys) {
  const std::string message =
      ErrorOf(CacheOptionsFromVllmHisparse(R"({"enable_hisparse": true})", Base()));
  EXPECT_NE(message.find("vLLM HiSparse config: unknown key \"enable_hisparse\""),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("accepted: device_buffer_size, host_pool_gib, eager_host_mirror"),
            std::string::npos)
      << message;
}

TEST(VllmHisparseTest, BufferBelowTopKIsRefused) {
  EXPECT_NE(ErrorOf(CacheOptionsFromVllmHisparse(R"({"device_buffer_size": 512})", Base()))
                .find("device_buffer_size (512) must be at least top_k (2048)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(CacheOptionsFromVllmHisparse(R"({"device_buffer_size": 70000})", Base()))
                .find("device_buffer_size must be in [1, 65536]"),
            std::string::npos);
}

}  // namespace
}  // namespace sparsekv
