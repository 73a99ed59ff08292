// MetricsExporter over a real CPU manager and step schedule: a scrape of its HTTP endpoint (a
// plain GET) shows every metric docs/metrics.md documents for a manager, its pool and a schedule,
// typed as documented, with the values the statistics hold; bad options are refused.
#include "sparsekv/metrics.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sparsekv/options.h"
#include "testing/harness.h"
#include "testing/layer_kinds_model.h"
#include "testing/prometheus_scrape.h"

namespace sparsekv {
namespace {

using testing::Exposition;

constexpr int32_t kLayers = 4;
constexpr int32_t kStride = 16;
constexpr int32_t kTopK = 6;
constexpr int32_t kPrompt = 20;

CacheOptions Options() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(kLayers, kStride);
  o.top_k = kTopK;
  o.hot_slots = 8;
  o.window = 1;
  o.host_page_tokens = 8;
  o.max_requests = 2;
  o.max_context = 64;
  o.host_capacity_tokens = 256;
  o.max_prefetch = kTopK;
  o.copy_chunk_rows = 1;
  return o;
}

// A manager with two requests, driven through a schedule that measures serial and prefetch.
class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = SparseKVCacheManager::Create(Options(), CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    manager_ = std::move(m).value();
    ScheduleOptions so;
    so.candidates = {StepChoice{}, StepChoice{.crosslayer_prefetch = true}};
    so.trials = 1;
    auto s = StepSchedule::Create(*manager_, so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    schedule_ = std::move(s).value();
    std::mt19937_64 rng(7);
    for (RequestId id : batch_) {
      ASSERT_TRUE(manager_->Admit(id, kPrompt, 16, nullptr).ok());
      for (int32_t layer = 0; layer < kLayers; ++layer) {
        const testing::Bytes rows = testing::RandomRows(rng, kPrompt, kStride);
        ASSERT_TRUE(manager_->IngestPrompt(id, layer, rows.data(), nullptr).ok());
      }
    }
  }

  // One step; every top-k row has a padding entry and a repeated position.
  void Step(std::mt19937_64& rng) {
    ASSERT_TRUE(schedule_->PlanStep(batch_, nullptr).ok());
    const testing::Bytes new_rows = testing::RandomRows(rng, 2, kStride);
    std::vector<int32_t> topk(2 * kTopK), slots(2 * kTopK);
    for (int32_t b = 0; b < 2; ++b) {
      for (int32_t k = 0; k < kTopK - 2; ++k) {
        topk[b * kTopK + k] = static_cast<int32_t>(rng() % kPrompt);
      }
      topk[b * kTopK + kTopK - 2] = topk[b * kTopK];
      topk[b * kTopK + kTopK - 1] = -1;
    }
    const AttendFn attend = [](int32_t, int32_t, int32_t, StreamHandle) { return Status::Ok(); };
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      LayerWork work;
      work.new_rows = new_rows.data();
      work.topk = topk.data();
      work.slots = slots.data();
      ASSERT_TRUE(schedule_->RunLayer(layer, work, attend, nullptr).ok());
    }
    ASSERT_TRUE(schedule_->FinishStep(nullptr).ok());
  }

  static Exposition Scrape(int port) {
    auto body = testing::HttpGet(port, "/metrics");
    EXPECT_TRUE(body.ok()) << body.status().ToString();
    auto parsed = testing::ParseExposition(body.ok() ? *body : "");
    EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
    return parsed.ok() ? *parsed : Exposition{};
  }

  std::unique_ptr<SparseKVCacheManager> manager_;
  std::unique_ptr<StepSchedule> schedule_;
  const std::vector<RequestId> batch_ = {11, 12};
};

TEST_F(MetricsTest, ScrapeShowsEveryDocumentedMetricWithTheStatisticsValues) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 6; ++i) Step(rng);

  MetricsOptions options;
  options.labels = {{"tp_rank", "0"}};
  auto exporter = MetricsExporter::Start(options);
  ASSERT_TRUE(exporter.ok()) << exporter.status().ToString();
  ASSERT_GT((*exporter)->port(), 0);
  ASSERT_TRUE((*exporter)->PublishFrom(*manager_, schedule_.get(), nullptr).ok());

  const Exposition e = Scrape((*exporter)->port());
  auto stats = manager_->ReadStats(nullptr);
  ASSERT_TRUE(stats.ok());
  const ScheduleStats schedule = schedule_->stats();
  const HostKVPool& pool = manager_->host_pool();

  // Every documented metric of a manager, its pool and a schedule, typed as documented.
  const auto documented = testing::ReadDocumentedMetrics(SPARSEKV_SOURCE_DIR "/docs/metrics.md");
  ASSERT_GT(documented.size(), 20u);
  for (const testing::DocumentedMetric& m : documented) {
    if (m.source == "pool server" || m.source == "node pool" || m.source == "collector") continue;
    ASSERT_TRUE(e.types.contains(m.name)) << m.name << " (" << m.source << ") not scraped";
    EXPECT_EQ(e.types.at(m.name), m.type) << m.name;
    EXPECT_FALSE(e.help.at(m.name).empty()) << m.name;
  }
  // ... and nothing undocumented (the HTTP server's own exposer_* metrics aside).
  for (const auto& [name, type] : e.types) {
    if (name.rfind("exposer_", 0) == 0) continue;
    bool found = false;
    for (const auto& m : documented) found = found || m.name == name;
    EXPECT_TRUE(found) << name << " is not in docs/metrics.md";
  }

  const std::string rank = "tp_rank=\"0\"";
  auto value = [&](const std::string& name, const std::string& label = "") {
    const std::string key = name + "{" + rank + (label.empty() ? "" : "," + label) + "}";
    EXPECT_TRUE(e.samples.contains(key)) << key;
    return e.samples.contains(key) ? e.samples.at(key) : -1.0;
  };
  const LayerStats& t = stats->total;
  EXPECT_GT(t.misses, 0u);
  EXPECT_GT(t.hits + t.window_hits, 0u);
  EXPECT_EQ(value("sparsekv_topk_lookups_total", "result=\"hit\""), t.hits);
  EXPECT_EQ(value("sparsekv_topk_lookups_total", "result=\"window_hit\""), t.window_hits);
  EXPECT_EQ(value("sparsekv_topk_lookups_total", "result=\"resident_hit\""), t.resident_hits);
  EXPECT_EQ(value("sparsekv_topk_lookups_total", "result=\"miss\""), t.misses);
  EXPECT_EQ(value("sparsekv_topk_skipped_entries_total", "reason=\"padding\""), 6 * 2 * kLayers);
  EXPECT_EQ(value("sparsekv_topk_skipped_entries_total", "reason=\"duplicate\""), t.duplicates);
  EXPECT_GT(t.duplicates, 0u);
  EXPECT_EQ(value("sparsekv_topk_skipped_entries_total", "reason=\"out_of_range\""), 0);
  EXPECT_EQ(value("sparsekv_transfer_bytes_total", "direction=\"host_to_device\""),
            stats->bytes_host_to_device);
  EXPECT_EQ(value("sparsekv_transfer_bytes_total", "direction=\"device_to_host\""),
            6 * 2 * kLayers * kStride);
  EXPECT_EQ(value("sparsekv_transfer_bytes_total", "direction=\"device_to_device\""),
            stats->bytes_assembled);
  EXPECT_EQ(value("sparsekv_ingested_bytes_total"), 2 * kLayers * kPrompt * kStride);
  EXPECT_EQ(value("sparsekv_prefetch_rows_total"), stats->prefetch_rows);
  EXPECT_EQ(value("sparsekv_prefetch_useful_rows_total"), stats->prefetch_useful_rows);
  EXPECT_EQ(value("sparsekv_prefetch_wasted_rows_total"), stats->prefetch_wasted_rows);
  EXPECT_EQ(value("sparsekv_prefetch_missed_rows_total"), stats->prefetch_missed_rows);
  // The schedule ran prefetch steps: their rows were fetched, and some were used.
  EXPECT_GT(stats->prefetch_rows, 0u);
  EXPECT_LE(stats->prefetch_useful_rows + stats->prefetch_wasted_rows, stats->prefetch_rows);
  EXPECT_EQ(value("sparsekv_hot_cache_used_blocks"), 2);
  EXPECT_EQ(value("sparsekv_device_memory_bytes"), stats->device_bytes);
  double device_uses = 0, host_uses = 0;
  for (const char* use :
       {"resident_rows", "hot_cache_rows", "indexer_keys", "free_rows", "replacement_state",
        "tables", "plan", "counters", "resident_entries", "windows"}) {
    device_uses += value("sparsekv_device_memory_use_bytes", "use=\"" + std::string(use) + "\"");
  }
  EXPECT_EQ(device_uses, stats->device_bytes);
  EXPECT_EQ(value("sparsekv_device_memory_use_bytes", "use=\"hot_cache_rows\""),
            stats->device_memory.hot_cache_rows);
  for (const char* use : {"private", "shared", "retained", "free"}) {
    host_uses += value("sparsekv_host_pool_use_bytes", "use=\"" + std::string(use) + "\"");
  }
  EXPECT_EQ(host_uses, stats->host_memory.total);
  EXPECT_EQ(value("sparsekv_host_pool_use_bytes", "use=\"private\""),
            stats->host_memory.private_pages);
  EXPECT_EQ(value("sparsekv_retained_entries_bytes"), stats->host_memory.retained_entries);
  EXPECT_EQ(value("sparsekv_host_pool_capacity_pages"), pool.total_pages());
  EXPECT_EQ(value("sparsekv_host_pool_used_pages"), stats->host_pages_used);
  EXPECT_EQ(value("sparsekv_host_pool_capacity_bytes"), pool.bytes());
  EXPECT_EQ(value("sparsekv_host_pool_used_owners"), 2);

  // The schedule measured both candidates (one calibration step each, at least) and counts every
  // step under its choice.
  EXPECT_EQ(schedule.steps, 6);
  EXPECT_GE(schedule.calibration_steps, 2);
  EXPECT_EQ(value("sparsekv_schedule_calibration_steps_total"), schedule.calibration_steps);
  double steps = 0;
  for (const auto& [choice, n] : schedule.steps_by_choice) {
    steps += value("sparsekv_schedule_steps_total", "choice=\"" + choice + "\"");
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(value("sparsekv_schedule_last_choice_info",
                  "choice=\"" + schedule.last_choice.ToString() + "\""),
            1);
  EXPECT_GT(value("sparsekv_stats_timestamp_seconds"), 1.7e9);

  // FormatMetrics writes what a scrape shows of the same snapshot.
  MetricsSnapshot snapshot;
  snapshot.cache = *stats;
  snapshot.pool = PoolOccupancy::Of(pool);
  snapshot.schedule = schedule;
  snapshot.timestamp_seconds = e.samples.at("sparsekv_stats_timestamp_seconds{" + rank + "}");
  auto text = FormatMetrics(snapshot, options);
  ASSERT_TRUE(text.ok());
  auto formatted = testing::ParseExposition(*text);
  ASSERT_TRUE(formatted.ok());
  for (const auto& [key, v] : formatted->samples) {
    ASSERT_TRUE(e.samples.contains(key)) << key;
    EXPECT_EQ(e.samples.at(key), v) << key;
  }
}

TEST_F(MetricsTest, ScrapeShowsTheLastSnapshotPublished) {
  auto exporter = MetricsExporter::Start({});
  ASSERT_TRUE(exporter.ok()) << exporter.status().ToString();
  EXPECT_TRUE(Scrape((*exporter)->port()).types.count("sparsekv_topk_lookups_total") == 0);
  ASSERT_TRUE((*exporter)->PublishFrom(*manager_, nullptr, nullptr).ok());
  EXPECT_EQ(Scrape((*exporter)->port()).samples.at("sparsekv_topk_lookups_total{result=\"miss\"}"),
            0);
  std::mt19937_64 rng(5);
  Step(rng);
  ASSERT_TRUE((*exporter)->PublishFrom(*manager_, nullptr, nullptr).ok());
  const Exposition e = Scrape((*exporter)->port());
  EXPECT_GT(e.samples.at("sparsekv_topk_lookups_total{result=\"miss\"}"), 0);
  EXPECT_FALSE(e.types.contains("sparsekv_schedule_steps_total"));  // no schedule given
}

// A DeepSeek-V4 manager holds resident entries and raw windows: they are uses of its device
// memory, and the scraped uses still add up to device_memory_bytes.
TEST_F(MetricsTest, ADeepSeekV4ManagersResidentEntriesAndWindowsAreUsesOfDeviceMemory) {
  const StatusOr<ModelPreset> p = FindPreset("deepseek-v4-flash");
  ASSERT_TRUE(p.ok());
  auto m = SparseKVCacheManager::Create(testing::SmallPresetOptions(*p), CreateCpuBackend());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE((*m)->Admit(1, 600, 100, nullptr).ok());
  auto exporter = MetricsExporter::Start({});
  ASSERT_TRUE(exporter.ok()) << exporter.status().ToString();
  ASSERT_TRUE((*exporter)->PublishFrom(**m, nullptr, nullptr).ok());
  const Exposition e = Scrape((*exporter)->port());
  const CacheStats s = *(*m)->ReadStats(nullptr);
  ASSERT_GT(s.device_memory.windows, 0);
  ASSERT_GT(s.device_memory.resident_entries, 0);
  const std::string use = "sparsekv_device_memory_use_bytes{use=\"";
  EXPECT_EQ(e.samples.at(use + "windows\"}"), s.device_memory.windows);
  EXPECT_EQ(e.samples.at(use + "resident_entries\"}"), s.device_memory.resident_entries);
  double sum = 0;
  for (const auto& [key, v] : e.samples) {
    if (key.rfind(use, 0) == 0) sum += v;
  }
  EXPECT_EQ(sum, e.samples.at("sparsekv_device_memory_bytes"));
  EXPECT_EQ(sum, s.device_bytes);
}

TEST(MetricsOptionsTest, BadOptionsAreRefused) {
  MetricsOptions o;
  o.prefix = "9lives";
  EXPECT_EQ(MetricsExporter::Start(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FormatMetrics({}, o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.labels = {{"result", "x"}};
  EXPECT_EQ(MetricsExporter::Start(o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.labels = {{"bad-name", "x"}};
  EXPECT_EQ(MetricsExporter::Start(o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.listen_address = "127.0.0.1";
  EXPECT_EQ(MetricsExporter::Start(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(MetricsOptionsTest, AnAddressInUseIsUnavailable) {
  auto first = MetricsExporter::Start({});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  MetricsOptions o;
  o.listen_address = "127.0.0.1:" + std::to_string((*first)->port());
  const Status second = MetricsExporter::Start(o).status();
  EXPECT_EQ(second.code(), StatusCode::kUnavailable) << second.ToString();
  EXPECT_NE(second.message().find(o.listen_address), std::string::npos) << second.ToString();
}

}  // namespace
}  // namespace sparsekv
