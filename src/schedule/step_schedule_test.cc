// StepSchedule: every choice reads exactly the rows written (the dense model is the oracle), on
// the CPU backend and on the CUDA backend eagerly and as replayed graphs (also as the tuner's
// choice changes between graphs); the tuner measures each candidate and keeps the fastest; bad
// calls are refused. The CUDA tests skip without a GPU.
#include "sparsekv/step_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "schedule/schedule_tuner.h"
#include "testing/cuda_test_util.h"
#include "testing/forwarding_backend.h"
#include "testing/harness.h"

#if defined(SPARSEKV_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace sparsekv {
namespace {

using testing::Bytes;

constexpr int32_t kLayers = 6;
constexpr int32_t kStride = 24;
constexpr int32_t kTopK = 8;
constexpr int32_t kRequests = 6;

CacheOptions Options(int32_t layers_per_index, bool hybrid) {
  CacheOptions o;
  o.geometry = KVGeometry::Uniform(kLayers, kStride);
  o.top_k = kTopK;
  o.hot_slots = 12;
  o.window = 2;
  o.host_page_tokens = 8;
  o.max_requests = kRequests;
  o.max_context = 96;
  o.host_capacity_tokens = int64_t{kRequests} * 96;
  o.layers_per_index = layers_per_index;
  o.copy_chunk_rows = 1;
  o.max_prefetch = kTopK;
  if (hybrid) {
    // Room for about two resident requests: the others run in hot-cache mode.
    o.hybrid_residency = true;
    o.resident_page_rows = 14;
  }
  return o;
}

// Index groups as GLM-5.3 names them (LayerShape::index_group): {0}, {1}, {2-5}.
CacheOptions NamedGroupOptions(bool hybrid) {
  CacheOptions o = Options(1, hybrid);
  const int32_t leaders[kLayers] = {0, 1, 2, 2, 2, 2};
  for (int32_t l = 0; l < kLayers; ++l) o.geometry.layers[l].index_group = leaders[l];
  return o;
}

// The index groups every exactness test runs over: one layer each (no planned copy), two and four
// layers each ({0-3}, {4, 5}), and named ones of one and four layers.
struct Grouping {
  std::string name;
  CacheOptions options;
};
std::vector<Grouping> Groupings(bool hybrid) {
  return {{"layers_per_index 1", Options(1, hybrid)},
          {"layers_per_index 2", Options(2, hybrid)},
          {"layers_per_index 4", Options(4, hybrid)},
          {"named groups {0} {1} {2-5}", NamedGroupOptions(hybrid)}};
}

// Steps the schedule ran in `choice`.
int64_t StepsIn(const ScheduleStats& stats, const StepChoice& choice) {
  const auto it = stats.steps_by_choice.find(choice.ToString());
  return it == stats.steps_by_choice.end() ? 0 : it->second;
}

bool AnyPlanned(const std::vector<StepChoice>& choices) {
  return std::any_of(choices.begin(), choices.end(),
                     [](const StepChoice& c) { return c.planned_copy; });
}

// Drives random steps through a schedule on a backend, eagerly or as captured graphs (CUDA: one
// graph per choice, replayed for every later step in that choice), and checks every row the
// engine's attention may read against the dense model. The attention callback enqueues a copy of
// the layer's hot cache on the engine's stream (a snapshot of what attention would read there);
// after the step each snapshot is checked for the batch rows of its slice. Inputs live in fixed
// device buffers (the shape a captured graph needs); slots are poisoned before every step.
class ScheduleWorkload {
 public:
  ScheduleWorkload(const CacheOptions& o, const ScheduleOptions& so, uint64_t seed,
                   std::shared_ptr<Backend> backend = CreateCpuBackend(), bool captured = false)
      : rng_(seed), model_(o.geometry), groups_(o), captured_(captured) {
    auto m = SparseKVCacheManager::Create(o, std::move(backend));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    manager_ = std::move(*m);
    auto s = StepSchedule::Create(*manager_, so);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    schedule_ = std::move(*s);
    Backend& b = manager_->backend();
    if (b.kind() == BackendKind::kCuda) {
      auto stream = b.CreateStream();
      EXPECT_TRUE(stream.ok());
      stream_ = *stream;
    }
    const int32_t max_batch = o.effective_max_batch();
    // A snapshot per layer and first row of a slice, allocated here: not while capturing.
    snapshots_per_layer_ = max_batch;
    const size_t hot_bytes = size_t(manager_->HotLayerRows()) * kStride;
    for (int32_t i = 0; i < kLayers * max_batch; ++i) {
      snapshots_.push_back(std::make_unique<Buffer>(b, hot_bytes));
    }
    for (int32_t l = 0; l < kLayers; ++l) {
      rows_.push_back(std::make_unique<Buffer>(b, size_t(max_batch) * kStride));
      topk_.push_back(std::make_unique<Buffer>(b, size_t(max_batch) * kTopK * 4));
      slots_.push_back(std::make_unique<Buffer>(b, size_t(max_batch) * kTopK * 4));
    }
    for (RequestId id = 1; id <= kRequests; ++id) {
      const int32_t len = std::uniform_int_distribution<int32_t>(1, 40)(rng_);
      EXPECT_TRUE(manager_->Admit(id, len, 40, stream_).ok());
      std::vector<Bytes> layers;
      for (int32_t l = 0; l < kLayers; ++l) {
        layers.push_back(testing::RandomRows(rng_, len, kStride));
        EXPECT_TRUE(manager_->IngestPrompt(id, l, layers.back().data(), stream_).ok());
      }
      model_.Add(id, layers, len);
    }
  }
  ~ScheduleWorkload() {
    if (stream_ != nullptr) {
      manager_->backend().Synchronize(stream_).IgnoreError();
      manager_->backend().DestroyStream(stream_);
    }
  }

  // One step of a random batch (of `batch` requests; 0: a random size).
  void Step(int32_t batch = 0) {
    std::vector<RequestId> ids;
    for (RequestId id = 1; id <= kRequests; ++id) ids.push_back(id);
    std::shuffle(ids.begin(), ids.end(), rng_);
    if (batch == 0) batch = std::uniform_int_distribution<int32_t>(1, kRequests)(rng_);
    ids.resize(batch);
    ASSERT_TRUE(schedule_->PlanStep(ids, stream_).ok());
    const CacheOptions& o = manager_->options();
    // The inputs: the new rows of every layer, the top-k of every index group.
    std::vector<std::vector<int32_t>> topk(kLayers);
    for (int32_t l = 0; l < kLayers; ++l) {
      const Bytes rows = testing::RandomRows(rng_, o.effective_max_batch(), kStride);
      for (int32_t b = 0; b < batch; ++b) model_.Append(ids[b], l, rows.data() + b * kStride);
      rows_[l]->Upload(rows.data(), rows.size(), stream_);
      if (groups_.Leads(l)) {
        topk[l] = RandomTopK(ids, o.effective_max_batch(), l);
        topk_[l]->Upload(topk[l].data(), topk[l].size() * 4, stream_);
      } else {
        topk[l] = topk[l - 1];
      }
      slots_[l]->Fill(0xF9, stream_);  // poison
    }
    const std::string key = schedule_->choice().ToString() + "/" + std::to_string(batch);
    std::vector<Slice>* slices = nullptr;
    if (captured_) {
      slices = Replay(key);
      if (::testing::Test::HasFatalFailure()) return;
    } else {
      eager_slices_.clear();
      ASSERT_TRUE(RunPhase(&eager_slices_).ok());
      slices = &eager_slices_;
    }
    ASSERT_TRUE(manager_->backend().Synchronize(stream_).ok());
    std::vector<std::vector<int32_t>> attended(kLayers, std::vector<int32_t>(batch, 0));
    for (const Slice& slice : *slices) {
      const int32_t leader = groups_.Leader(slice.layer);
      const Bytes hot = slice.snapshot->Download(stream_);
      const std::vector<int32_t> slots = slots_[leader]->Download<int32_t>();
      for (int32_t b = slice.first; b < slice.first + slice.rows && b < batch; ++b) {
        ++attended[slice.layer][b];
        Check(ids[b], slice.layer, &topk[slice.layer][size_t(b) * kTopK], &slots[size_t(b) * kTopK],
              hot.data());
      }
    }
    for (int32_t l = 0; l < kLayers; ++l) {
      for (int32_t b = 0; b < batch; ++b) {
        ASSERT_EQ(attended[l][b], 1) << "layer " << l << " row " << b;
      }
    }
  }

  // A step of every request whose attention of `fail_layer` fails over its last slice. Then
  // either the step goes on (the later layers run and FinishStep ends it) or AbortStep ends it,
  // and the layers after fail_layer hold zero rows for the step's token. Eager only.
  void FailingStep(int32_t fail_layer, bool abort) {
    std::vector<RequestId> ids;
    for (RequestId id = 1; id <= kRequests; ++id) ids.push_back(id);
    std::shuffle(ids.begin(), ids.end(), rng_);
    const int32_t batch = kRequests;
    ASSERT_TRUE(schedule_->PlanStep(ids, stream_).ok());
    const CacheOptions& o = manager_->options();
    const Bytes zeros(kStride);
    for (int32_t l = 0; l < kLayers; ++l) {
      const Bytes rows = testing::RandomRows(rng_, o.effective_max_batch(), kStride);
      const bool stored = !abort || l <= fail_layer;
      for (int32_t b = 0; b < batch; ++b) {
        model_.Append(ids[b], l, stored ? rows.data() + b * kStride : zeros.data());
      }
      rows_[l]->Upload(rows.data(), rows.size(), stream_);
      if (groups_.Leads(l)) {
        const std::vector<int32_t> topk = RandomTopK(ids, o.effective_max_batch(), l);
        topk_[l]->Upload(topk.data(), topk.size() * 4, stream_);
      }
    }
    int32_t attended = 0;
    const AttendFn attend = [&](int32_t layer, int32_t first, int32_t n, StreamHandle) {
      if (layer == fail_layer && first + n == batch) return Unavailable("attention kernel failed");
      ++attended;
      return Status::Ok();
    };
    for (int32_t l = 0; l < kLayers; ++l) {
      const int32_t leader = groups_.Leader(l);
      const LayerWork work{rows_[l]->get(), nullptr, topk_[leader]->get<int32_t>(), 0,
                           slots_[leader]->get<int32_t>()};
      const Status s = schedule_->RunLayer(l, work, attend, stream_);
      if (l != fail_layer) {
        ASSERT_TRUE(s.ok()) << s.ToString();
        continue;
      }
      ASSERT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
      EXPECT_NE(s.message().find("attention of layer " + std::to_string(l)), std::string::npos)
          << s.ToString();
      if (abort) break;
    }
    if (abort) {
      if (fail_layer + 1 < kLayers) {
        // The manager's step is not complete: only AbortStep ends it.
        EXPECT_EQ(schedule_->FinishStep(stream_).code(), StatusCode::kFailedPrecondition);
      }
      const Status aborted = schedule_->AbortStep(stream_);
      ASSERT_TRUE(aborted.ok()) << aborted.ToString();
      EXPECT_EQ(schedule_->AbortStep(stream_).code(), StatusCode::kFailedPrecondition);
    } else {
      const Status finished = schedule_->FinishStep(stream_);
      ASSERT_TRUE(finished.ok()) << finished.ToString();
    }
    ASSERT_TRUE(manager_->backend().Synchronize(stream_).ok());
    if (!abort || fail_layer > 0) {
      EXPECT_GT(attended, 0);
    }
  }

  StepSchedule& schedule() { return *schedule_; }
  SparseKVCacheManager& manager() { return *manager_; }
  size_t graphs() const { return graphs_.size(); }

 private:
  using Buffer = testing::DeviceBuffer;
  // What one attention call read: layer, batch rows [first, first + rows), and the hot cache.
  struct Slice {
    int32_t layer, first, rows;
    Buffer* snapshot;
  };

  // The schedule's run phase, every layer and FinishStep, on stream_ (what a graph captures).
  Status RunPhase(std::vector<Slice>* slices) {
    Backend& b = manager_->backend();
    const size_t hot_bytes = size_t(manager_->HotLayerRows()) * kStride;
    for (int32_t l = 0; l < kLayers; ++l) {
      const int32_t leader = groups_.Leader(l);
      const LayerWork work{rows_[l]->get(), nullptr, topk_[leader]->get<int32_t>(), 0,
                           slots_[leader]->get<int32_t>()};
      SPARSEKV_RETURN_IF_ERROR(schedule_->RunLayer(
          l, work,
          [&](int32_t layer, int32_t first, int32_t n, StreamHandle stream) {
            Buffer* snapshot = snapshots_[size_t(layer) * snapshots_per_layer_ + first].get();
            slices->push_back({layer, first, n, snapshot});
            return b.CopyAsync(snapshot->get(), manager_->HotLayer(layer), hot_bytes, stream);
          },
          stream_));
    }
    return schedule_->FinishStep(stream_);
  }

  // Runs the planned step through the graph of `key` (captured now if there is none yet).
  std::vector<Slice>* Replay(const std::string& key) {
#if defined(SPARSEKV_WITH_CUDA)
    auto* stream = static_cast<cudaStream_t>(stream_);
    Graph& g = graphs_[key];
    if (g.graph.captured()) {
      const auto start = std::chrono::steady_clock::now();
      const Status launched = g.graph.Launch(stream);
      EXPECT_TRUE(launched.ok()) << launched.ToString();
      EXPECT_TRUE(manager_->backend().Synchronize(stream_).ok());
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const Status finished = schedule_->FinishReplayedStep(seconds);
      EXPECT_TRUE(finished.ok()) << finished.ToString();
      return &g.slices;
    }
    const Status captured = g.graph.CaptureAndLaunch(stream, [&] { return RunPhase(&g.slices); });
    EXPECT_TRUE(captured.ok()) << captured.ToString();
    return &g.slices;
#else
    ADD_FAILURE() << "captured steps need the CUDA backend (" << key << ")";
    return &eager_slices_;
#endif
  }

  // Positions of the request's history with padding, repeats and out-of-range entries.
  std::vector<int32_t> RandomTopK(const std::vector<RequestId>& ids, int32_t max_batch,
                                  int32_t layer) {
    std::vector<int32_t> topk(static_cast<size_t>(max_batch) * kTopK, -1);
    for (size_t b = 0; b < ids.size(); ++b) {
      const int32_t len = model_.Length(ids[b], layer);
      for (int32_t k = 0; k < kTopK; ++k) {
        const int32_t kind = std::uniform_int_distribution<int32_t>(0, 19)(rng_);
        int32_t p = std::uniform_int_distribution<int32_t>(0, len - 1)(rng_);
        if (kind == 0) p = -1;
        if (kind == 1) p = len + 3;
        if (kind == 2 && k > 0) p = topk[b * kTopK + k - 1];
        topk[b * kTopK + k] = p;
      }
    }
    return topk;
  }

  void Check(RequestId id, int32_t layer, const int32_t* topk, const int32_t* slots,
             const std::byte* hot) {
    const int32_t len = model_.Length(id, layer);
    std::set<int32_t> seen;
    for (int32_t k = 0; k < kTopK; ++k) {
      const int32_t p = topk[k];
      const bool valid = p >= 0 && p < len && seen.insert(p).second;
      if (!valid) {
        EXPECT_EQ(slots[k], -1) << "position " << p;
        continue;
      }
      ASSERT_GE(slots[k], 0) << "position " << p;
      ASSERT_LT(slots[k], manager_->HotLayerRows()) << "position " << p;
      EXPECT_EQ(std::memcmp(hot + int64_t{slots[k]} * kStride, model_.Row(id, layer, p), kStride),
                0)
          << "request " << id << " layer " << layer << " position " << p;
    }
  }

  std::mt19937_64 rng_;
  testing::DenseModel model_;
  IndexGroups groups_;
  bool captured_;
  std::unique_ptr<SparseKVCacheManager> manager_;
  std::unique_ptr<StepSchedule> schedule_;
  StreamHandle stream_ = nullptr;
  std::vector<std::unique_ptr<Buffer>> rows_, topk_, slots_;  // per layer
  // [layer * snapshots_per_layer_ + first]: what attention over a slice from `first` read.
  std::vector<std::unique_ptr<Buffer>> snapshots_;
  int32_t snapshots_per_layer_ = 0;
  std::vector<Slice> eager_slices_;
#if defined(SPARSEKV_WITH_CUDA)
  struct Graph {
    testing::CapturedGraph graph;
    std::vector<Slice> slices;
  };
  std::map<std::string, Graph> graphs_;  // choice/batch -> the captured step
#else
  std::map<std::string, int> graphs_;
#endif
};

TEST(StepScheduleTest, EveryChoiceReadsTheRowsWritten) {
  for (bool hybrid : {false, true}) {
    for (const Grouping& g : Groupings(hybrid)) {
      const CacheOptions& o = g.options;
      const std::vector<StepChoice> choices = AllowedChoices(o);
      // The planned copy is offered exactly where some index group has more than one layer.
      EXPECT_EQ(AnyPlanned(choices), IndexGroups(o).shared()) << g.name;
      for (const StepChoice& c : choices) {
        SCOPED_TRACE(c.ToString() + " " + g.name + (hybrid ? " hybrid" : ""));
        ScheduleOptions so;
        so.fixed = c;
        ScheduleWorkload w(o, so, 17 + o.layers_per_index);
        for (int32_t step = 0; step < 25; ++step) {
          w.Step();
          if (::testing::Test::HasFatalFailure()) return;
        }
        // A step whose requests are all resident runs `resident` instead.
        const ScheduleStats stats_by_choice = w.schedule().stats();
        EXPECT_EQ(StepsIn(stats_by_choice, c) + StepsIn(stats_by_choice, {.resident = true}), 25);
        const StatusOr<CacheStats> stats = w.manager().ReadStats(nullptr);
        ASSERT_TRUE(stats.ok());
        EXPECT_GT(stats->total.misses, 0u);
        if (c.crosslayer_prefetch) {
          EXPECT_GT(stats->prefetch_rows, 0u);
        }
      }
    }
  }
}

TEST(StepScheduleTest, AllowedChoicesFollowTheOptions) {
  CacheOptions o = Options(1, false);
  std::vector<std::string> names;
  for (const StepChoice& c : AllowedChoices(o)) names.push_back(c.ToString());
  EXPECT_EQ(names, (std::vector<std::string>{
                       "serial", "chunks1", "chunks2", "chunks4", "prefetch", "prefetch+chunks1",
                       "prefetch+chunks2", "prefetch+chunks4", "prefetch:16", "prefetch:16+chunks1",
                       "prefetch:16+chunks2", "prefetch:16+chunks4"}));
  // The options' grid is the bounded one already: no second grid.
  o.prefetch_copy_blocks = kBoundedPrefetchCopyBlocks;
  EXPECT_EQ(AllowedChoices(o).size(), 8u);
  o.copy_chunk_rows = 0;
  o.max_prefetch = 0;
  EXPECT_EQ(AllowedChoices(o), std::vector<StepChoice>{StepChoice{}});
  // Index groups of two layers: the planned copy, on the options' copy grid and the bounded one,
  // alone and with every prefetch, each with every chunk size, after the choices without it.
  o = Options(2, false);
  names.clear();
  for (const StepChoice& c : AllowedChoices(o)) names.push_back(c.ToString());
  ASSERT_EQ(names.size(), 36u);
  EXPECT_EQ(names[11], "prefetch:16+chunks4");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 12, names.begin() + 17),
            (std::vector<std::string>{"planned", "planned+chunks1", "planned+chunks2",
                                      "planned+chunks4", "prefetch+planned"}));
  EXPECT_EQ(names.back(), "prefetch:16+planned:16+chunks4");
  o.copy_chunk_rows = 0;
  o.max_prefetch = 0;
  names.clear();
  for (const StepChoice& c : AllowedChoices(o)) names.push_back(c.ToString());
  EXPECT_EQ(names, (std::vector<std::string>{"serial", "planned", "planned:16"}));
  // The options' copy grid is the bounded one already: the planned copy on it only.
  o.copy_blocks = kBoundedPrefetchCopyBlocks;
  EXPECT_EQ(AllowedChoices(o),
            (std::vector<StepChoice>{StepChoice{}, StepChoice{.planned_copy = true}}));
  // Named groups with one of several layers ({2-5}) offer it too.
  EXPECT_TRUE(AnyPlanned(AllowedChoices(NamedGroupOptions(false))));
}

TEST(StepScheduleTest, ParseStepChoiceReadsWhatToStringWrites) {
  for (const StepChoice& c : AllowedChoices(Options(1, false))) {
    const StatusOr<StepChoice> parsed = ParseStepChoice(c.ToString());
    ASSERT_TRUE(parsed.ok()) << c.ToString() << ": " << parsed.status().ToString();
    EXPECT_EQ(*parsed, c) << c.ToString();
  }
  EXPECT_EQ(*ParseStepChoice("prefetch+chunks48"), (StepChoice{true, 48}));
  EXPECT_EQ(*ParseStepChoice("prefetch:24+chunks8"), (StepChoice{true, 8, 24}));
  EXPECT_EQ(*ParseStepChoice("prefetch:24"), (StepChoice{true, 0, 24}));
  for (const StepChoice& c : AllowedChoices(Options(2, false))) {
    const StatusOr<StepChoice> parsed = ParseStepChoice(c.ToString());
    ASSERT_TRUE(parsed.ok()) << c.ToString() << ": " << parsed.status().ToString();
    EXPECT_EQ(*parsed, c) << c.ToString();
  }
  EXPECT_EQ(*ParseStepChoice("planned"), (StepChoice{.planned_copy = true}));
  EXPECT_EQ(*ParseStepChoice("planned:8+chunks4"),
            (StepChoice{.chunk_rows = 4, .planned_copy = true, .planned_copy_blocks = 8}));
  EXPECT_EQ(*ParseStepChoice("prefetch:4+planned:8+chunks2"), (StepChoice{true, 2, 4, true, 8}));
  EXPECT_EQ(*ParseStepChoice("prefetch+planned"), (StepChoice{true, 0, 0, true, 0}));
  for (const char* bad : {"",
                          "Serial",
                          "chunks",
                          "chunks0",
                          "chunks-8",
                          "chunks+8",
                          "chunks8x",
                          "prefetch+",
                          "prefetch+serial",
                          "prefetchchunks8",
                          "chunks8+prefetch",
                          "chunks99999999999",
                          "prefetch:",
                          "prefetch:0",
                          "prefetch:+chunks8",
                          "prefetch:16x",
                          "prefetch:-3",
                          "prefetch::16",
                          "serial:16",
                          "planned:",
                          "planned:0",
                          "plannedx",
                          "planned+",
                          "chunks2+planned",
                          "planned+prefetch",
                          "planned+planned",
                          "prefetch+prefetch",
                          "planned:8+planned",
                          "serial+planned",
                          "prefetch+planned+"}) {
    const StatusOr<StepChoice> parsed = ParseStepChoice(bad);
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
  EXPECT_NE(ParseStepChoice("chunk16").status().message().find("chunks<N>"), std::string::npos);
}

TEST(StepScheduleTest, TheTunerMeasuresEveryCandidateThenKeepsTheFastest) {
  const CacheOptions o = Options(1, false);
  ScheduleOptions so;
  so.trials = 2;
  so.candidates = {StepChoice{}, StepChoice{true, 0}, StepChoice{false, 2}};
  ScheduleWorkload w(o, so, 5);
  for (int32_t step = 0; step < 40; ++step) {
    w.Step();
    if (HasFatalFailure()) return;
  }
  const ScheduleStats stats = w.schedule().stats();
  EXPECT_EQ(stats.steps, 40);
  EXPECT_GT(stats.calibration_steps, 0);
  EXPECT_LT(stats.calibration_steps, 40);
  EXPECT_FALSE(stats.last_reason.empty());
}

TEST(ScheduleTunerTest, ResidentStepsRunSeriallyAtOnce) {
  ScheduleTuner tuner({StepChoice{}, StepChoice{true, 0}}, 3);
  const ScheduleDecision d = tuner.Choose(StepShape{32, 0});
  EXPECT_EQ(d.choice, StepChoice{});
  EXPECT_FALSE(d.calibrating);
  EXPECT_NE(d.reason.find("resident"), std::string::npos);
}

TEST(ScheduleTunerTest, CalibratesRoundRobinAndPicksTheLowestMedian) {
  const std::vector<StepChoice> c = {StepChoice{}, StepChoice{true, 0}, StepChoice{false, 16},
                                     StepChoice{true, 16}};
  ScheduleTuner tuner(c, 3);
  const StepShape shape{59, 20};
  const std::vector<double> seconds = {5e-3, 4e-3, 4.5e-3, 6e-3};
  for (int32_t t = 0; t < 3; ++t) {
    for (size_t k = 0; k < c.size(); ++k) {
      const size_t i = t % 2 == 0 ? k : c.size() - 1 - k;  // forward, backward, forward
      const ScheduleDecision d = tuner.Choose(shape);
      ASSERT_TRUE(d.calibrating);
      ASSERT_EQ(d.choice, c[i]) << "round " << t << " step " << k;
      // One slow outlier per candidate: the median ignores it.
      tuner.Observe(shape, d.choice, t == 1 ? 1.0 : seconds[i]);
    }
  }
  const ScheduleDecision d = tuner.Choose(shape);
  EXPECT_FALSE(d.calibrating);
  EXPECT_EQ(d.choice, (StepChoice{true, 0}));
  EXPECT_NE(d.reason.find("fastest of 4"), std::string::npos) << d.reason;
  // A shape of the same class (16-31 hot-cache requests) shares it; another class calibrates.
  EXPECT_EQ(tuner.Choose(StepShape{59, 31}).choice, (StepChoice{true, 0}));
  EXPECT_TRUE(tuner.Choose(StepShape{59, 40}).calibrating);
}

// A cache that warms up while the candidates are measured: every step is faster than the last.
// With two trials, each candidate's two steps sum to the same position in the sequence, so
// candidates that cost the same tie instead of the last-measured one winning.
TEST(ScheduleTunerTest, ADriftingWorkloadWeighsOnEveryCandidateAlike) {
  const std::vector<StepChoice> c = {StepChoice{}, StepChoice{false, 8}, StepChoice{false, 16},
                                     StepChoice{true, 0}};
  ScheduleTuner tuner(c, 2);
  const StepShape shape{59, 59};
  std::map<std::string, double> sum;
  for (int32_t step = 0; step < 8; ++step) {
    const ScheduleDecision d = tuner.Choose(shape);
    ASSERT_TRUE(d.calibrating);
    const double seconds = (64 - step) / 1024.0;  // the same cost for all, drifting down (exact)
    sum[d.choice.ToString()] += seconds;
    tuner.Observe(shape, d.choice, seconds);
  }
  for (const auto& [name, total] : sum) EXPECT_EQ(total, sum.begin()->second) << name;
  const ScheduleDecision d = tuner.Choose(shape);
  EXPECT_FALSE(d.calibrating);
  EXPECT_EQ(d.choice, StepChoice{}) << d.reason;  // a tie keeps the first: serial
}

TEST(ScheduleTunerTest, ChunksAsLargeAsTheBatchAreNotCandidates) {
  ScheduleTuner tuner({StepChoice{}, StepChoice{false, 16}}, 1);
  const ScheduleDecision d = tuner.Choose(StepShape{16, 4});
  EXPECT_EQ(d.choice, StepChoice{});
  EXPECT_FALSE(d.calibrating);
}

TEST(StepScheduleTest, RefusesChoicesTheOptionsDoNotAllow) {
  CacheOptions o = Options(1, false);
  o.max_prefetch = 0;
  auto m = SparseKVCacheManager::Create(o, CreateCpuBackend());
  ASSERT_TRUE(m.ok());
  ScheduleOptions so;
  so.fixed = StepChoice{true, 0};
  const auto s = StepSchedule::Create(**m, so);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("prefetch"), std::string::npos);
  so.fixed.reset();
  so.candidates = {StepChoice{false, 3}};
  EXPECT_EQ(StepSchedule::Create(**m, so).status().code(), StatusCode::kInvalidArgument);
  // The prefetch on a grid of its own is allowed where the prefetch is, on no negative grid; a
  // grid without the prefetch means nothing and is dropped.
  auto with_prefetch = SparseKVCacheManager::Create(Options(1, false), CreateCpuBackend());
  ASSERT_TRUE(with_prefetch.ok());
  so = ScheduleOptions{};
  so.fixed = StepChoice{true, 0, 40};
  EXPECT_TRUE(StepSchedule::Create(**with_prefetch, so).ok());
  so.fixed = StepChoice{true, 0, -1};
  EXPECT_EQ(StepSchedule::Create(**with_prefetch, so).status().code(),
            StatusCode::kInvalidArgument);
  so.fixed.reset();
  so.candidates = {StepChoice{true, 2, -1}};
  EXPECT_EQ(StepSchedule::Create(**with_prefetch, so).status().code(),
            StatusCode::kInvalidArgument);
  so.candidates = {StepChoice{true, 2, 40}, StepChoice{false, 2, 7}};
  EXPECT_TRUE(StepSchedule::Create(**with_prefetch, so).ok());
  so.candidates.clear();
  so.trials = 0;
  EXPECT_EQ(StepSchedule::Create(**m, so).status().code(), StatusCode::kInvalidArgument);
}

// The planned copy needs an index group of several layers; where one is, it takes any grid but a
// negative one, chunks, and the prefetch.
TEST(StepScheduleTest, RefusesThePlannedCopyWithoutASharedIndexGroup) {
  auto one = SparseKVCacheManager::Create(Options(1, false), CreateCpuBackend());
  ASSERT_TRUE(one.ok());
  ScheduleOptions so;
  so.fixed = StepChoice{.planned_copy = true};
  StatusOr<std::unique_ptr<StepSchedule>> s = StepSchedule::Create(**one, so);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("fixed choice planned is not one"), std::string::npos)
      << s.status().ToString();
  EXPECT_NE(s.status().message().find("needs an index group of more than one layer"),
            std::string::npos)
      << s.status().ToString();
  so.fixed.reset();
  so.candidates = {StepChoice{}, StepChoice{false, 2, 0, true, 16}};
  EXPECT_EQ(StepSchedule::Create(**one, so).status().code(), StatusCode::kInvalidArgument);

  auto four = SparseKVCacheManager::Create(Options(4, false), CreateCpuBackend());
  ASSERT_TRUE(four.ok());
  so = ScheduleOptions{};
  so.fixed = StepChoice{true, 6, 0, true, 40};  // chunks of the whole batch: one slice
  EXPECT_TRUE(StepSchedule::Create(**four, so).ok());
  so.fixed = StepChoice{false, 0, 0, true, -1};
  s = StepSchedule::Create(**four, so);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  so.fixed.reset();
  so.candidates = {StepChoice{false, 2, 0, true, 40}, StepChoice{false, 2, 0, false, 7}};
  EXPECT_TRUE(StepSchedule::Create(**four, so).ok());
}

// In the planned copy the group's first layer enqueues the copies of every layer of the group,
// ahead of them (the manager then refuses a second copy of a later layer), and each later layer
// still reads its own rows; an explicit grid reaches the manager's copies.
TEST(StepScheduleTest, ThePlannedCopyCopiesTheGroupAtItsFirstLayer) {
  for (const StepChoice& c : {StepChoice{.planned_copy = true}, StepChoice{false, 2, 0, true, 8}}) {
    SCOPED_TRACE(c.ToString());
    ScheduleOptions so;
    so.fixed = c;
    ScheduleWorkload w(Options(4, false), so, 23);
    w.Step();  // a checked step first: the hot cache holds rows
    if (HasFatalFailure()) return;
    StepSchedule& s = w.schedule();
    std::vector<int32_t> slots(kRequests * kTopK), topk(kRequests * kTopK);
    for (size_t i = 0; i < topk.size(); ++i) topk[i] = static_cast<int32_t>(i % 5);
    const Bytes rows(kRequests * kStride);
    const LayerWork work{rows.data(), nullptr, topk.data(), 0, slots.data()};
    std::vector<std::pair<int32_t, int32_t>> attended;
    const AttendFn attend = [&](int32_t layer, int32_t first, int32_t, StreamHandle) {
      attended.emplace_back(layer, first);
      return Status::Ok();
    };
    const std::vector<RequestId> batch = {1, 2, 3};
    ASSERT_TRUE(s.PlanStep(batch, nullptr).ok());
    // A negative grid is refused before anything is checked or copied.
    EXPECT_EQ(w.manager().CopyMisses(0, nullptr, -1).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(w.manager().CopyMissChunk(0, 0, nullptr, -1).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(s.RunLayer(0, work, attend, nullptr).ok());
    for (int32_t l = 1; l < 4; ++l) {
      EXPECT_EQ(w.manager().CopyMisses(l, nullptr).code(), StatusCode::kFailedPrecondition)
          << "layer " << l << " was not copied ahead";
    }
    for (int32_t l = 1; l < kLayers; ++l) {
      const Status ran = s.RunLayer(l, work, attend, nullptr);
      ASSERT_TRUE(ran.ok()) << ran.ToString();
    }
    ASSERT_TRUE(s.FinishStep(nullptr).ok());
    const size_t slices_per_layer = c.chunk_rows == 0 ? 1 : 2;  // 3 rows in chunks of 2
    EXPECT_EQ(attended.size(), kLayers * slices_per_layer);
  }
}

// Where the planned copy is offered, the tuner measures it among the other candidates.
TEST(StepScheduleTest, TheTunerMeasuresThePlannedCopyWhereOffered) {
  for (const Grouping& g : Groupings(false)) {
    SCOPED_TRACE(g.name);
    ScheduleOptions so;
    so.trials = 1;
    ScheduleWorkload w(g.options, so, 41);
    const size_t candidates = AllowedChoices(g.options).size();
    for (size_t step = 0; step < candidates + 4; ++step) {
      w.Step(kRequests);
      if (HasFatalFailure()) return;
    }
    const ScheduleStats stats = w.schedule().stats();
    int64_t planned = 0;
    for (const auto& [name, n] : stats.steps_by_choice) {
      if (name.find("planned") != std::string::npos) planned += n;
    }
    EXPECT_EQ(stats.steps_by_choice.size(), candidates);  // each measured
    EXPECT_EQ(planned > 0, IndexGroups(g.options).shared());
    EXPECT_NE(stats.last_reason.find("fastest of " + std::to_string(candidates)), std::string::npos)
        << stats.last_reason;
  }
}

TEST(StepScheduleTest, RefusesRunPhaseCallsOutOfOrderAndReportsAttentionErrors) {
  const CacheOptions o = Options(1, false);
  ScheduleOptions so;
  so.fixed = StepChoice{false, 2};
  ScheduleWorkload w(o, so, 9);
  StepSchedule& s = w.schedule();
  std::vector<int32_t> slots(kRequests * kTopK), topk(kRequests * kTopK, 0);
  const Bytes rows(kRequests * kStride);
  const LayerWork work{rows.data(), nullptr, topk.data(), 0, slots.data()};
  const AttendFn ok = [](int32_t, int32_t, int32_t, StreamHandle) { return Status::Ok(); };
  EXPECT_EQ(s.RunLayer(0, work, ok, nullptr).code(), StatusCode::kFailedPrecondition);
  const std::vector<RequestId> batch = {1, 2, 3};
  ASSERT_TRUE(s.PlanStep(batch, nullptr).ok());
  EXPECT_EQ(s.RunLayer(1, work, ok, nullptr).code(), StatusCode::kFailedPrecondition);
  LayerWork no_topk = work;
  no_topk.topk = nullptr;
  EXPECT_EQ(s.RunLayer(0, no_topk, ok, nullptr).code(), StatusCode::kInvalidArgument);
  const Status failed = s.RunLayer(
      0, work,
      [](int32_t, int32_t first, int32_t, StreamHandle) {
        return first == 2 ? Unavailable("attention kernel failed") : Status::Ok();
      },
      nullptr);
  EXPECT_EQ(failed.code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.message().find("layer 0 over rows [2, 3)"), std::string::npos)
      << failed.ToString();
  EXPECT_EQ(s.FinishStep(nullptr).code(), StatusCode::kFailedPrecondition);
  // The step is not lost: AbortStep ends it, and the next one plans.
  const Status aborted = s.AbortStep(nullptr);
  ASSERT_TRUE(aborted.ok()) << aborted.ToString();
  EXPECT_EQ(s.AbortStep(nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(s.PlanStep(batch, nullptr).ok());
}

// An attention callback that fails mid-step (in every choice, at the first, a middle and the last
// layer) leaves a step that goes on or aborts; the rows stored before it, and those the step
// appended before the failure, are intact: later steps read every row against the model (an
// aborted step's later layers hold zero rows).
TEST(StepScheduleTest, AFailedAttentionLeavesTheStepToFinishOrAbort) {
  for (const Grouping& g : Groupings(/*hybrid=*/false)) {
    const CacheOptions& o = g.options;
    for (const StepChoice& c : AllowedChoices(o)) {
      for (bool abort : {false, true}) {
        for (int32_t fail_layer : {0, 2, 3, kLayers - 1}) {
          SCOPED_TRACE(c.ToString() + " " + g.name + (abort ? " aborted" : " finished") +
                       " at layer " + std::to_string(fail_layer));
          ScheduleOptions so;
          so.fixed = c;
          ScheduleWorkload w(o, so, 5 + fail_layer);
          w.Step();
          w.FailingStep(fail_layer, abort);
          for (int32_t step = 0; step < 4 && !::testing::Test::HasFatalFailure(); ++step) {
            w.Step();
          }
          if (::testing::Test::HasFatalFailure()) return;
          EXPECT_EQ(w.schedule().stats().steps, 6);
        }
      }
    }
  }
}

// A step whose manager calls fail part-way through a layer (its append enqueued, its resolve
// refused) aborts from where it stopped.
TEST(StepScheduleTest, AbortStepCompletesALayerTheManagerStopped) {
  const CacheOptions o = Options(1, false);
  ScheduleOptions so;
  so.fixed = StepChoice{false, 2};
  ScheduleWorkload w(o, so, 3);
  StepSchedule& s = w.schedule();
  std::vector<int32_t> slots(kRequests * kTopK), topk(kRequests * kTopK, 0);
  const Bytes rows(kRequests * kStride);
  const LayerWork work{rows.data(), nullptr, topk.data(), 0, slots.data()};
  LayerWork narrow = work;
  narrow.topk_stride = 1;  // less than top_k: the resolve refuses it
  const AttendFn ok = [](int32_t, int32_t, int32_t, StreamHandle) { return Status::Ok(); };
  const std::vector<RequestId> batch = {2, 4};
  ASSERT_TRUE(s.PlanStep(batch, nullptr).ok());
  ASSERT_TRUE(s.RunLayer(0, work, ok, nullptr).ok());
  EXPECT_EQ(s.RunLayer(1, narrow, ok, nullptr).code(), StatusCode::kInvalidArgument);
  // The layer's append is done: running it again is refused by the manager.
  EXPECT_EQ(s.RunLayer(1, work, ok, nullptr).code(), StatusCode::kFailedPrecondition);
  const Status aborted = s.AbortStep(nullptr);
  ASSERT_TRUE(aborted.ok()) << aborted.ToString();
  const StatusOr<int32_t> len = w.manager().SequenceLength(2);
  ASSERT_TRUE(len.ok());
  EXPECT_TRUE(s.PlanStep(batch, nullptr).ok());
  EXPECT_EQ(*w.manager().SequenceLength(2), *len + 1);
}

// A device copy failing anywhere in a layer of a step with the cross-layer prefetch (the append's
// copies, the prefetch's copies) leaves a step that AbortStep ends, a prefetch resolved and not
// copied included; the step's requests are one token longer and the next step plans and runs.
TEST(StepScheduleTest, AbortStepEndsAStepWhoseCopiesFailedAnywhere) {
  const CacheOptions o = Options(1, false);
  ScheduleOptions so;
  so.fixed = StepChoice{.crosslayer_prefetch = true};
  std::vector<int32_t> slots(kRequests * kTopK), topk(kRequests * kTopK, 0);
  const Bytes rows(kRequests * kStride);
  const LayerWork work{rows.data(), nullptr, topk.data(), 0, slots.data()};
  const AttendFn ok = [](int32_t, int32_t, int32_t, StreamHandle) { return Status::Ok(); };
  const std::vector<RequestId> batch = {2, 4};
  for (int copies = 0;; ++copies) {
    SCOPED_TRACE("IndexCopy " + std::to_string(copies) + " fails");
    auto backend = std::make_shared<testing::FaultyBackend>();
    ScheduleWorkload w(o, so, 3, backend);
    StepSchedule& s = w.schedule();
    const int32_t len = *w.manager().SequenceLength(2);
    ASSERT_TRUE(s.PlanStep(batch, nullptr).ok());
    backend->FailIndexCopy(copies);
    Status failed = Status::Ok();
    for (int32_t l = 0; l < kLayers && failed.ok(); ++l) failed = s.RunLayer(l, work, ok, nullptr);
    backend->Disarm();
    if (failed.ok()) {
      ASSERT_TRUE(s.FinishStep(nullptr).ok());
      ASSERT_GT(copies, kLayers);  // every layer's copies were failed once
      break;
    }
    EXPECT_EQ(failed.code(), StatusCode::kInternal) << failed.ToString();
    const Status aborted = s.AbortStep(nullptr);
    ASSERT_TRUE(aborted.ok()) << aborted.ToString();
    EXPECT_EQ(*w.manager().SequenceLength(2), len + 1);
    ASSERT_TRUE(s.PlanStep(batch, nullptr).ok());
    for (int32_t l = 0; l < kLayers; ++l) ASSERT_TRUE(s.RunLayer(l, work, ok, nullptr).ok());
    ASSERT_TRUE(s.FinishStep(nullptr).ok());
  }
}

// On the GPU: every choice the options allow, eagerly and as one graph per choice replayed with
// new batches, top-k sets and rows, against the dense model.
TEST(StepScheduleCudaTest, EveryChoiceReadsTheRowsWrittenEagerlyAndReplayed) {
  SPARSEKV_REQUIRE_GPU(gpu);
  for (bool captured : {false, true}) {
    for (bool hybrid : {false, true}) {
      for (const Grouping& g : Groupings(hybrid)) {
        const CacheOptions& o = g.options;
        for (const StepChoice& c : AllowedChoices(o)) {
          SCOPED_TRACE(c.ToString() + " " + g.name + (hybrid ? " hybrid" : "") +
                       (captured ? " captured" : " eager"));
          ScheduleOptions so;
          so.fixed = c;
          ScheduleWorkload w(o, so, 31 + o.layers_per_index, gpu, captured);
          for (int32_t step = 0; step < 12; ++step) {
            // Captured: one batch size, so that every step after the first replays the graph.
            w.Step(captured ? 4 : 0);
            if (HasFatalFailure()) return;
          }
          const ScheduleStats by_choice = w.schedule().stats();
          const int64_t resident = StepsIn(by_choice, {.resident = true});
          EXPECT_EQ(StepsIn(by_choice, c) + resident, 12);
          if (captured) {
            // One graph per choice: the fixed one, and `resident` for steps that cannot miss.
            EXPECT_EQ(w.graphs(), resident > 0 ? 2u : 1u);
          }
          const StatusOr<CacheStats> stats = w.manager().ReadStats(nullptr);
          ASSERT_TRUE(stats.ok());
          EXPECT_GT(stats->total.misses, 0u);
          if (c.crosslayer_prefetch) {
            EXPECT_GT(stats->prefetch_rows, 0u);
          }
        }
      }
    }
  }
}

// `grouping` with a hot cache of pages for twice the requests the workload admits: the first
// ones admitted are resident, the later ones in hot-cache mode.
CacheOptions RoomierOptions(const CacheOptions& grouping) {
  CacheOptions o = grouping;
  o.max_requests = 2 * kRequests;
  return o;
}

// With a fixed choice that yields to `resident` and steps of one request each, resident or not:
// eagerly on the CPU both choices run, every row checked; on the GPU the same steps replay two
// graphs of batch size 1 alternately (resident/1 without miss copies, serial/1 with them), every
// row checked.
TEST(StepScheduleTest, AFixedChoiceThatYieldsRunsResidentStepsAsResident) {
  for (const Grouping& g : Groupings(/*hybrid=*/true)) {
    SCOPED_TRACE(g.name);
    ScheduleOptions so;
    so.fixed = StepChoice{};
    so.fixed_yields_to_resident = true;
    ScheduleWorkload w(RoomierOptions(g.options), so, 53);
    for (int32_t step = 0; step < 24; ++step) {
      w.Step(1);
      if (HasFatalFailure()) return;
    }
    const ScheduleStats stats = w.schedule().stats();
    EXPECT_GT(StepsIn(stats, {.resident = true}), 0);
    EXPECT_GT(StepsIn(stats, StepChoice{}), 0);
  }
}

TEST(StepScheduleCudaTest, ResidentAndHotCacheStepsReplayTheirOwnGraphs) {
  SPARSEKV_REQUIRE_GPU(gpu);
  for (const Grouping& g : Groupings(/*hybrid=*/true)) {
    SCOPED_TRACE(g.name);
    ScheduleOptions so;
    so.fixed = StepChoice{};
    so.fixed_yields_to_resident = true;
    ScheduleWorkload w(RoomierOptions(g.options), so, 53, gpu, /*captured=*/true);
    for (int32_t step = 0; step < 24; ++step) {
      w.Step(1);
      if (HasFatalFailure()) return;
    }
    const ScheduleStats stats = w.schedule().stats();
    EXPECT_GT(StepsIn(stats, {.resident = true}), 0);
    EXPECT_GT(StepsIn(stats, StepChoice{}), 0);
    EXPECT_EQ(w.graphs(), 2u);
  }
}

// On the GPU, the tuner's choice drives which graph replays: the calibration replays a graph per
// candidate (timed by the replay), then the kept one; every step is checked.
TEST(StepScheduleCudaTest, ReplayedGraphsFollowTheTunersChoice) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const CacheOptions o = Options(2, true);
  ScheduleOptions so;
  so.trials = 2;
  so.candidates = {StepChoice{},
                   StepChoice{true, 0},
                   StepChoice{false, 2},
                   StepChoice{true, 2},
                   StepChoice{false, 0, 0, true, 16},
                   StepChoice{true, 2, 16, true, 0}};
  ScheduleWorkload w(o, so, 77, gpu, /*captured=*/true);
  for (int32_t step = 0; step < 40; ++step) {
    w.Step(kRequests);
    if (HasFatalFailure()) return;
  }
  const ScheduleStats stats = w.schedule().stats();
  EXPECT_GT(stats.calibration_steps, 0);
  EXPECT_GE(w.graphs(), 2u);  // the choice changed between replays
  int64_t steps = 0;
  for (const auto& [choice, n] : stats.steps_by_choice) steps += n;
  EXPECT_EQ(steps, 40);
}

// On the GPU: AbortStep enqueues work of its own, so it is refused while the stream captures a
// graph, and ends the step once the capture is over.
TEST(StepScheduleCudaTest, AbortStepIsRefusedWhileCapturing) {
  SPARSEKV_REQUIRE_GPU(gpu);
#if defined(SPARSEKV_WITH_CUDA)
  ScheduleOptions so;
  so.fixed = StepChoice{};
  ScheduleWorkload w(Options(1, false), so, 11, gpu);
  StatusOr<StreamHandle> stream = gpu->CreateStream();
  ASSERT_TRUE(stream.ok());
  auto* s = static_cast<cudaStream_t>(*stream);
  const std::vector<RequestId> batch = {1, 2};
  ASSERT_TRUE(w.schedule().PlanStep(batch, *stream).ok());
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(w.schedule().AbortStep(*stream).code(), StatusCode::kFailedPrecondition);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphDestroy(graph);
  const Status aborted = w.schedule().AbortStep(*stream);
  EXPECT_TRUE(aborted.ok()) << aborted.ToString();
  EXPECT_TRUE(gpu->Synchronize(*stream).ok());
  gpu->DestroyStream(*stream);
#endif
}

// On two GPUs: a stream of the other device is refused before the step is planned, which then
// plans on a stream of the manager's device.
TEST(StepScheduleCudaTest, RefusesAStreamOfAnotherDevice) {
  SPARSEKV_REQUIRE_GPU(gpu);
#if defined(SPARSEKV_WITH_CUDA)
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) GTEST_SKIP() << "needs two GPUs";
  ScheduleWorkload w(Options(1, false), ScheduleOptions{}, 13, gpu);
  int current = 0;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(current), cudaSuccess);
  const std::vector<RequestId> batch = {1, 2};
  const Status refused = w.schedule().PlanStep(batch, other);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
  EXPECT_NE(refused.message().find("device 1"), std::string::npos) << refused.ToString();
  EXPECT_EQ(w.manager().batch_size(), 0);  // nothing planned
  ASSERT_TRUE(w.schedule().PlanStep(batch, nullptr).ok());
  EXPECT_EQ(w.schedule().AbortStep(other).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(w.schedule().AbortStep(nullptr).ok());
  cudaStreamDestroy(other);
#endif
}

}  // namespace
}  // namespace sparsekv
