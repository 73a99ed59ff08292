// FinishReplayedStep on the CPU backend: one manager records its first step's run phase and
// replays it for every later step (testing::RecordingBackend, as a CUDA graph replays a capture),
// a second one calls every run phase; both are given the same steps and must return the same
// rows and count the same statistics, the prefetch's outcome included.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "sparsekv/manager.h"
#include "testing/harness.h"
#include "testing/recording_backend.h"

namespace sparsekv {
namespace {

using testing::Bytes;
using testing::DeviceBuffer;

constexpr int32_t kLayers = 2;
constexpr int32_t kTopK = 2;
constexpr int32_t kPrefetch = 2;
constexpr int32_t kBatch = 2;
constexpr int32_t kPrompt = 12;

// Two layers of 8-byte rows, each its own index group; a hot cache of 4 slots per request.
CacheOptions Options() {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(kLayers, 8);
  o.top_k = kTopK;
  o.hot_slots = 4;
  o.window = 1;
  o.max_prefetch = kPrefetch;
  o.host_capacity_tokens = 256;
  o.max_requests = kBatch;
  o.max_batch = kBatch;
  o.max_context = 64;
  o.host_page_tokens = 8;
  return o;
}

// A manager and the fixed buffers of its run phase.
struct Engine {
  explicit Engine(std::shared_ptr<Backend> b) : backend(std::move(b)) {
    auto created = SparseKVCacheManager::Create(Options(), backend);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    m = std::move(*created);
    for (int32_t l = 0; l < kLayers; ++l) {
      rows.push_back(std::make_unique<DeviceBuffer>(*backend, kBatch * 8));
      topk.push_back(std::make_unique<DeviceBuffer>(*backend, kBatch * kTopK * 4));
      slots.push_back(std::make_unique<DeviceBuffer>(*backend, kBatch * kTopK * 4));
      prefetch.push_back(std::make_unique<DeviceBuffer>(*backend, kBatch * kPrefetch * 4));
    }
  }
  // The run phase a graph captures: each group's resolve and copy, then its prefetch for the
  // next step (after the resolve: PrefetchLayer's second legal place), and FinishStep.
  Status RunPhase() {
    for (int32_t l = 0; l < kLayers; ++l) {
      SPARSEKV_RETURN_IF_ERROR(m->AppendToken(l, rows[l]->get(), nullptr));
      SPARSEKV_RETURN_IF_ERROR(
          m->ResolveLayer(l, topk[l]->get<int32_t>(), slots[l]->get<int32_t>(), nullptr, nullptr));
      SPARSEKV_RETURN_IF_ERROR(m->CopyMisses(l, nullptr));
      SPARSEKV_RETURN_IF_ERROR(
          m->PrefetchLayer(l, prefetch[l]->get<int32_t>(), kPrefetch, nullptr));
    }
    return m->FinishStep(nullptr);
  }

  std::shared_ptr<Backend> backend;
  std::unique_ptr<SparseKVCacheManager> m;
  std::vector<std::unique_ptr<DeviceBuffer>> rows, topk, slots, prefetch;
};

// The counters both managers must agree on (the gauges are the same by construction).
std::vector<uint64_t> Counters(SparseKVCacheManager& m) {
  const StatusOr<CacheStats> s = m.ReadStats(nullptr);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return {};
  return {s->total.hits,           s->total.window_hits,    s->total.misses,
          s->total.padding,        s->total.duplicates,     s->total.out_of_range,
          s->prefetch_lookups,     s->prefetch_rows,        s->prefetch_useful_rows,
          s->prefetch_wasted_rows, s->prefetch_missed_rows, s->bytes_host_to_device,
          s->bytes_device_to_host, s->bytes_assembled,      s->invalid_copy_entries};
}

TEST(ManagerReplayTest, AReplayedStepCountsWhatTheSameStepRunByTheHostCounts) {
  auto recorder = std::make_shared<testing::RecordingBackend>();
  Engine replayed(recorder);
  Engine eager(CreateCpuBackend());
  ASSERT_NE(replayed.m, nullptr);
  ASSERT_NE(eager.m, nullptr);
  std::mt19937_64 rng(11);
  for (RequestId id = 1; id <= kBatch; ++id) {
    for (Engine* e : {&replayed, &eager}) ASSERT_TRUE(e->m->Admit(id, kPrompt, 40, nullptr).ok());
    for (int32_t l = 0; l < kLayers; ++l) {
      const Bytes prompt = testing::RandomRows(rng, kPrompt, 8);
      for (Engine* e : {&replayed, &eager}) {
        ASSERT_TRUE(e->m->IngestPrompt(id, l, prompt.data(), nullptr).ok());
      }
    }
  }
  const std::vector<RequestId> batch = {1, 2};
  uint64_t missed = 0;
  testing::RecordingBackend::Recording graph;
  for (int32_t step = 0; step < 30; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step == 20) {
      // A reset between replays: what a replay counts starts from nothing too.
      missed += Counters(*eager.m)[10];
      for (Engine* e : {&replayed, &eager}) ASSERT_TRUE(e->m->ResetStats(nullptr).ok());
    }
    const int32_t len = kPrompt + step + 1;  // this step's token included
    for (int32_t l = 0; l < kLayers; ++l) {
      const Bytes rows = testing::RandomRows(rng, kBatch, 8);
      std::vector<int32_t> topk(kBatch * kTopK), prefetch(kBatch * kPrefetch);
      for (int32_t& p : topk) p = static_cast<int32_t>(rng() % len);
      for (int32_t& p : prefetch) p = static_cast<int32_t>(rng() % len);
      for (Engine* e : {&replayed, &eager}) {
        e->rows[l]->Upload(rows.data(), rows.size(), nullptr);
        e->topk[l]->Upload(topk);
        e->prefetch[l]->Upload(prefetch);
      }
    }
    for (Engine* e : {&replayed, &eager}) ASSERT_TRUE(e->m->PlanStep(batch, nullptr).ok());
    ASSERT_TRUE(eager.RunPhase().ok());
    if (step == 0) {
      // The capture consumes the planned step, and its first replay runs it.
      recorder->BeginCapture();
      const Status captured = replayed.RunPhase();
      graph = recorder->EndCapture();
      ASSERT_TRUE(captured.ok()) << captured.ToString();
      ASSERT_TRUE(testing::RecordingBackend::Replay(graph).ok());
    } else {
      ASSERT_TRUE(testing::RecordingBackend::Replay(graph).ok());
      const Status finished = replayed.m->FinishReplayedStep();
      ASSERT_TRUE(finished.ok()) << finished.ToString();
    }
    for (int32_t l = 0; l < kLayers; ++l) {
      ASSERT_EQ(replayed.slots[l]->Download<int32_t>(), eager.slots[l]->Download<int32_t>())
          << "layer " << l;
    }
    EXPECT_EQ(Counters(*replayed.m), Counters(*eager.m));
    if (::testing::Test::HasFailure()) return;
  }
  missed += Counters(*eager.m)[10];
  EXPECT_GT(missed, 0u);  // the steps did miss rows a prefetch had not brought
}

}  // namespace
}  // namespace sparsekv
