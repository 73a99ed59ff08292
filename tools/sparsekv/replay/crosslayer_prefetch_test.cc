#include "tools/sparsekv/replay/crosslayer_prefetch.h"

#include <gtest/gtest.h>

#include <random>

#include "sparsekv/backend.h"
#include "sparsekv/manager.h"

namespace sparsekv::tools {
namespace {

// rows[step][layer] of `top_k` entries at a constant history length.
Trace MakeTrace(const std::vector<std::vector<std::vector<int32_t>>>& rows, int32_t top_k,
                int32_t seq_len) {
  Trace t;
  const int32_t steps = static_cast<int32_t>(rows.size());
  const int32_t layers = static_cast<int32_t>(rows[0].size());
  t.Resize(layers, top_k, steps);
  for (int32_t s = 0; s < steps; ++s) {
    for (int32_t l = 0; l < layers; ++l) {
      const size_t record = static_cast<size_t>(s) * layers + l;
      t.seq_len[record] = seq_len;
      std::copy(rows[s][l].begin(), rows[s][l].end(), t.positions.begin() + record * top_k);
    }
  }
  return t;
}

// Two slots for a top-2, so that every victim is forced. Layer 1, with and without the prefetch
// of layer 0's row (LRU order: least recent first):
//   step 0: prefetch {10,11} fills 2; own {10,20}: 10 useful, 20 misses (baseline: 2 misses);
//   step 1: prefetch {12,13} fills 2; own {12,21}: 12 useful, 21 misses (baseline: 2);
//   step 2: prefetch {12,14}: 12 resident, 14 fills 1; own {14,12}: 14 useful, 12 a hit of a
//           row already there (baseline: 14 misses, 12 hits);
//   step 3: prefetch {30,31} fills 2, evicting 12 and 14; own {12,14}: both miss, where the
//           baseline hits both: two induced misses.
// prefetched 7, useful 3, misses 4, baseline 5, covered 3 (10, 12, 14), induced 2.
TEST(CrossLayerPrefetchTest, CountsOfATinyCaseMatchTheHandComputation) {
  const Trace trace = MakeTrace(
      {{{10, 11}, {10, 20}}, {{12, 13}, {12, 21}}, {{12, 14}, {14, 12}}, {{30, 31}, {12, 14}}},
      /*top_k=*/2, /*seq_len=*/100);
  CrossLayerOptions o;
  o.hot_slots = {2};
  o.warmup_steps = 0;
  o.row_bytes = 1;
  StatusOr<std::vector<CrossLayerResult>> runs = ReplayCrossLayerPrefetch(trace, o);
  ASSERT_TRUE(runs.ok()) << runs.status().ToString();
  ASSERT_EQ(runs->size(), 1u);
  const CrossLayerResult& r = runs->front();
  EXPECT_EQ(r.policy, "lru");
  EXPECT_EQ(r.lookups, 8u);
  EXPECT_EQ(r.prefetched, 7u);
  EXPECT_EQ(r.useful, 3u);
  EXPECT_EQ(r.wasted, 4u);
  EXPECT_EQ(r.misses, 4u);
  EXPECT_EQ(r.baseline_misses, 5u);
  EXPECT_EQ(r.covered, 3u);
  EXPECT_EQ(r.induced_misses, 2u);
  EXPECT_DOUBLE_EQ(r.precision, 3.0 / 7);
  EXPECT_DOUBLE_EQ(r.recall, 3.0 / 5);
  EXPECT_DOUBLE_EQ(r.hidden_fraction, 3.0 / 7);
  // Layer 0 (never prefetched) misses 2 + 2 + 1 + 2 in both runs.
  EXPECT_DOUBLE_EQ(r.baseline_bytes, 7 + 5);
  EXPECT_DOUBLE_EQ(r.critical_bytes, 7 + 4);
  EXPECT_DOUBLE_EQ(r.bytes, 7 + 4 + 7);
  ASSERT_EQ(r.layer_recall.size(), 2u);
  EXPECT_DOUBLE_EQ(r.layer_recall[0], 0);
  EXPECT_DOUBLE_EQ(r.layer_recall[1], 3.0 / 5);
}

TEST(CrossLayerPrefetchTest, WarmupStepsAreNotCounted) {
  const Trace trace = MakeTrace(
      {{{10, 11}, {10, 20}}, {{12, 13}, {12, 21}}, {{12, 14}, {14, 12}}, {{30, 31}, {12, 14}}}, 2,
      100);
  CrossLayerOptions o;
  o.hot_slots = {2};
  o.warmup_steps = 3;  // only step 3: two prefetched rows, none used, two induced misses
  const CrossLayerResult r = ReplayCrossLayerPrefetch(trace, o)->front();
  EXPECT_EQ(r.prefetched, 2u);
  EXPECT_EQ(r.useful, 0u);
  EXPECT_EQ(r.baseline_misses, 0u);
  EXPECT_EQ(r.induced_misses, 2u);
  EXPECT_DOUBLE_EQ(r.precision, 0);
  EXPECT_DOUBLE_EQ(r.recall, 0);
}

// The same row in every layer: from layer 1 on, every baseline miss is prefetched and nothing is
// wasted.
TEST(CrossLayerPrefetchTest, IdenticalLayersArePredictedCompletely) {
  std::vector<std::vector<std::vector<int32_t>>> rows;
  for (int32_t s = 0; s < 12; ++s) {
    const std::vector<int32_t> row = {s % 5, 10 + s, 20 + (s * 7) % 9, -1};
    rows.push_back({row, row, row});
  }
  CrossLayerOptions o;
  o.hot_slots = {4, 6};
  o.policies = {PolicyKind::kLru, PolicyKind::kSlru};
  o.warmup_steps = 2;
  const std::vector<CrossLayerResult> runs = *ReplayCrossLayerPrefetch(MakeTrace(rows, 4, 64), o);
  ASSERT_EQ(runs.size(), 4u);
  for (const CrossLayerResult& r : runs) {
    SCOPED_TRACE(r.policy + " " + std::to_string(r.hot_slots));
    EXPECT_GT(r.baseline_misses, 0u);
    EXPECT_EQ(r.misses, 0u);
    EXPECT_EQ(r.induced_misses, 0u);
    EXPECT_DOUBLE_EQ(r.precision, 1);
    EXPECT_DOUBLE_EQ(r.recall, 1);
    EXPECT_DOUBLE_EQ(r.hidden_fraction, 1);
    EXPECT_DOUBLE_EQ(r.bytes, r.baseline_bytes);
  }
}

TEST(CrossLayerPrefetchTest, RejectsPoliciesTheManagerDoesNotRun) {
  const Trace trace = MakeTrace({{{1, 2}, {1, 2}}, {{1, 3}, {2, 3}}}, 2, 10);
  CrossLayerOptions o;
  o.hot_slots = {2};
  o.warmup_steps = 0;
  o.policies = {PolicyKind::kLfuDecay};
  EXPECT_EQ(ReplayCrossLayerPrefetch(trace, o).status().code(), StatusCode::kInvalidArgument);
  o.policies = {PolicyKind::kClock};
  EXPECT_TRUE(ReplayCrossLayerPrefetch(trace, o).ok());
  o.policies = {PolicyKind::kLru};
  o.hot_slots = {1};
  EXPECT_EQ(ReplayCrossLayerPrefetch(trace, o).status().code(), StatusCode::kInvalidArgument);
}

// The replay's prefetch is the manager's, under each of its policies: a CPU-backend manager
// driven in the order the e2e benchmark uses (ResolveLayer(L), then PrefetchLayer(L + 1, top-k of
// L, top_k), then layer L + 1's resolve) counts the same misses per layer and the same prefetched
// rows.
TEST(CrossLayerPrefetchTest, MatchesTheManagersPrefetchLayer) {
  constexpr int32_t kLayers = 4, kTopK = 8, kSteps = 24, kPrompt = 64;
  for (EvictionPolicy eviction :
       {EvictionPolicy::kLru, EvictionPolicy::kSegmentedLru, EvictionPolicy::kClock}) {
    CacheOptions options;
    options.geometry = KVGeometry::Uniform(kLayers, 16);
    options.top_k = kTopK;
    options.hot_slots = 12;
    options.eviction = eviction;
    options.max_requests = 1;
    options.max_context = kPrompt + kSteps;
    options.host_page_tokens = 16;
    options.host_capacity_tokens = 2 * (kPrompt + kSteps);
    options.max_prefetch = kTopK;
    auto created = SparseKVCacheManager::Create(options, CreateCpuBackend());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    SparseKVCacheManager& m = **created;
    const RequestId id = 1;
    ASSERT_TRUE(m.Admit(id, kPrompt, kSteps, nullptr).ok());
    const std::vector<std::byte> prompt(static_cast<size_t>(kPrompt) * 16);
    for (int32_t l = 0; l < kLayers; ++l)
      ASSERT_TRUE(m.IngestPrompt(id, l, prompt.data(), nullptr).ok());

    // Rows that share about half their entries with the layer below, with repeats and padding.
    std::mt19937 rng(7);
    Trace trace;
    trace.Resize(kLayers, kTopK, kSteps);
    for (int32_t s = 0; s < kSteps; ++s) {
      for (int32_t l = 0; l < kLayers; ++l) {
        const size_t record = static_cast<size_t>(s) * kLayers + l;
        trace.seq_len[record] = kPrompt + s + 1;
        for (int32_t i = 0; i < kTopK; ++i) {
          int32_t& p = trace.positions[record * kTopK + i];
          p = l > 0 && rng() % 2 == 0 ? trace.positions[(record - 1) * kTopK + i]
                                      : static_cast<int32_t>(rng() % 40);
          if (rng() % 16 == 0) p = -1;
        }
      }
    }

    const std::vector<std::byte> new_row(16);
    std::vector<int32_t> slots(kTopK);
    for (int32_t s = 0; s < kSteps; ++s) {
      ASSERT_TRUE(m.PlanStep(std::span(&id, 1), nullptr).ok());
      for (int32_t l = 0; l < kLayers; ++l) {
        ASSERT_TRUE(m.AppendToken(l, new_row.data(), nullptr).ok());
        ASSERT_TRUE(m.ResolveLayer(l, trace.row(s, l).data(), slots.data(), nullptr, nullptr).ok());
        ASSERT_TRUE(m.CopyMisses(l, nullptr).ok());
        if (l + 1 < kLayers) {
          ASSERT_TRUE(m.PrefetchLayer(l + 1, trace.row(s, l).data(), kTopK, nullptr).ok());
        }
      }
      ASSERT_TRUE(m.FinishStep(nullptr).ok());
    }
    const CacheStats stats = *m.ReadStats(nullptr);

    CrossLayerOptions o;
    o.hot_slots = {options.hot_slots};
    o.policies = {eviction == EvictionPolicy::kLru            ? PolicyKind::kLru
                  : eviction == EvictionPolicy::kSegmentedLru ? PolicyKind::kSlru
                                                              : PolicyKind::kClock};
    o.protected_percent = options.protected_percent;
    o.warmup_steps = 0;
    o.row_bytes = 1;
    const CrossLayerResult r = ReplayCrossLayerPrefetch(trace, o)->front();
    uint64_t misses = 0;
    for (int32_t l = 1; l < kLayers; ++l) misses += stats.layers[l].misses;
    SCOPED_TRACE(r.policy);
    EXPECT_GT(r.useful, 0u);
    EXPECT_EQ(r.misses, misses);
    EXPECT_EQ(r.prefetched, stats.prefetch_rows);
    EXPECT_DOUBLE_EQ(r.critical_bytes, static_cast<double>(misses + stats.layers[0].misses));
    // The manager's own count of the outcome: every layer from 1 on follows a prefetch, so its
    // misses are the prefetch's missed rows; a row the replay finds useful (hit in the step that
    // prefetched it) is useful to the manager too, which also counts rows hit a later step.
    EXPECT_EQ(stats.prefetch_missed_rows, misses);
    EXPECT_GE(stats.prefetch_useful_rows, r.useful);
    EXPECT_LE(stats.prefetch_useful_rows + stats.prefetch_wasted_rows, stats.prefetch_rows);
  }
}

}  // namespace
}  // namespace sparsekv::tools
