// Model-based randomized test of the manager on the CPU backend: thousands of random operations
// over several requests and layers, every delivered row checked byte for byte against a dense
// model of each request's history. Run one seed with SPARSEKV_TEST_SEED=<n>.
#include <gtest/gtest.h>

#include <algorithm>

#include "sparsekv/manager.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

TEST(ManagerModelTest, RandomOperationsMatchTheDenseModel) {
  int total_steps = 0;
  for (uint64_t seed : testing::TestSeeds(24)) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (rerun with SPARSEKV_TEST_SEED=" + std::to_string(seed) + ")");
    const CacheOptions options = testing::RandomSmallOptions(seed);
    auto m = SparseKVCacheManager::Create(options, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    testing::RandomWorkload w(options, seed, {m->get()});
    total_steps += w.Run(400);
    w.CheckStats();
    w.ReleaseAll();
    if (HasFailure()) break;
  }
  RecordProperty("steps", total_steps);
  EXPECT_GT(total_steps, 1000);
}

// The same with shared prefixes, continued turns, forks, retained conversations and eviction:
// every request still reads exactly its own history, shared pages never change while shared,
// and the pool is empty once everything is released and evicted.
TEST(ManagerModelTest, RandomSharingOperationsMatchTheDenseModel) {
  int total_steps = 0;
  uint64_t hits = 0, evictions = 0, copies = 0;
  for (uint64_t seed : testing::TestSeeds(24)) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (rerun with SPARSEKV_TEST_SEED=" + std::to_string(seed) + ")");
    const CacheOptions options = testing::RandomSmallOptions(seed);
    auto m = SparseKVCacheManager::Create(options, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    testing::WorkloadShape shape;
    shape.sharing = true;
    shape.vocabulary = 2 + static_cast<int32_t>(seed % 3);
    testing::RandomWorkload w(options, seed, {m->get()}, shape);
    total_steps += w.Run(400);
    w.CheckStats();
    const CacheStats s = *(*m)->ReadStats(nullptr);
    hits += s.prefix_hit_tokens;
    evictions += s.evictions;
    copies += s.copy_on_write_pages;
    w.ReleaseAll();
    if (HasFailure()) break;
  }
  RecordProperty("steps", total_steps);
  EXPECT_GT(total_steps, 1000);
  // The operations the test is about did happen.
  EXPECT_GT(hits, 0u);
  EXPECT_GT(evictions, 0u);
  EXPECT_GT(copies, 0u);
}

// The transfer-hiding paths (docs/overlap.md): index groups sharing one top-k (ResolveLayer on the
// group's first layer, CopyMisses on every layer), repeated positions sharing a slot (several
// query tokens per row), the split run (rows with fill 0 read before the miss copy must already
// be right) and prefetches before each resolve. Exactness as above, with sharing operations too.
TEST(ManagerModelTest, OverlapPathsMatchTheDenseModel) {
  int total_steps = 0;
  uint64_t prefetched = 0, grouped = 0, shared = 0;
  for (uint64_t seed : testing::TestSeeds(24)) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (rerun with SPARSEKV_TEST_SEED=" + std::to_string(seed) + ")");
    testing::WorkloadShape shape;
    shape.sharing = seed % 3 == 0;
    shape.run.split = seed % 2 == 0;
    shape.run.prefetch = seed % 4 < 2 ? 0 : 1 + static_cast<int32_t>(seed % 5);
    const CacheOptions options = testing::RandomOverlapOptions(seed, shape.run.prefetch);
    shape.run.prefetch = std::min(shape.run.prefetch, options.max_prefetch);
    auto m = SparseKVCacheManager::Create(options, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    testing::RandomWorkload w(options, seed, {m->get()}, shape);
    total_steps += w.Run(300);
    w.CheckStats();
    prefetched += (*m)->ReadStats(nullptr)->prefetch_rows;
    grouped += options.layers_per_index > 1;
    shared += options.share_repeated_positions;
    w.ReleaseAll();
    if (HasFailure()) break;
  }
  RecordProperty("steps", total_steps);
  EXPECT_GT(total_steps, 1000);
  EXPECT_GT(prefetched, 0u);
  EXPECT_GT(grouped, 0u);
  EXPECT_GT(shared, 0u);
}

// Hybrid residency: requests resident while the budget allows, demoted by admissions that need
// the room (mid-stream, between steps, also while their prompt is still being ingested), promoted
// back, retracted and resumed, mixed with hot-cache requests in every step; with and without
// sharing operations. Exactness as above.
TEST(ManagerModelTest, HybridResidencyMatchesTheDenseModel) {
  int total_steps = 0;
  uint64_t resident_hits = 0, demotions = 0, promotions = 0, mixed = 0;
  for (uint64_t seed : testing::TestSeeds(24)) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (rerun with SPARSEKV_TEST_SEED=" + std::to_string(seed) + ")");
    const CacheOptions options = testing::RandomHybridOptions(seed);
    auto m = SparseKVCacheManager::Create(options, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    testing::WorkloadShape shape;
    shape.sharing = seed % 2 == 0;
    shape.deferred_ingest = !shape.sharing;
    testing::RandomWorkload w(options, seed, {m->get()}, shape);
    total_steps += w.Run(400);
    w.CheckStats();
    const CacheStats s = *(*m)->ReadStats(nullptr);
    resident_hits += s.total.resident_hits;
    demotions += s.demotions;
    promotions += s.promotions;
    mixed += s.total.resident_hits > 0 && s.total.hits + s.total.misses > 0;
    w.ReleaseAll();
    if (HasFailure()) break;
  }
  RecordProperty("steps", total_steps);
  EXPECT_GT(total_steps, 1000);
  EXPECT_GT(resident_hits, 0u);
  EXPECT_GT(demotions, 0u);
  EXPECT_GT(promotions, 0u);
  EXPECT_GT(mixed, 0u);
}

// GLM-5.3's layers (testing::RandomGroupedOptions): explicit index groups of one and four layers,
// two top-k among them, indexer keys on the groups' first layers only, with hybrid residency,
// sharing operations (prefixes, forks, retained conversations), retract / resume, deferred
// ingestion, the split run, prefetches and copy chunks drawn per seed. Exactness as above, keys
// included.
TEST(ManagerModelTest, ExplicitIndexGroupsMatchTheDenseModel) {
  int total_steps = 0;
  uint64_t keyed = 0, resident_hits = 0, prefetched = 0, chunked = 0, shared = 0;
  for (uint64_t seed : testing::TestSeeds(24)) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (rerun with SPARSEKV_TEST_SEED=" + std::to_string(seed) + ")");
    testing::WorkloadShape shape;
    shape.sharing = seed % 4 < 2;
    shape.deferred_ingest = !shape.sharing;
    shape.run.split = seed % 5 < 2;
    shape.run.prefetch = seed % 3 == 1 ? 1 + static_cast<int32_t>(seed % 4) : 0;
    const CacheOptions options = testing::RandomGroupedOptions(seed, shape.run.prefetch);
    shape.run.prefetch = std::min(shape.run.prefetch, options.max_prefetch);
    ASSERT_EQ(options.index_groups(), options.geometry.num_layers() == 6 ? 3 : 4);
    auto m = SparseKVCacheManager::Create(options, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    testing::RandomWorkload w(options, seed, {m->get()}, shape);
    total_steps += w.Run(300);
    w.CheckStats();
    const CacheStats s = *(*m)->ReadStats(nullptr);
    keyed += options.indexer_key_bytes > 0;
    resident_hits += s.total.resident_hits;
    prefetched += s.prefetch_rows;
    chunked += options.copy_chunk_rows > 0;
    shared += s.prefix_hit_tokens > 0;
    w.ReleaseAll();
    if (HasFailure()) break;
  }
  RecordProperty("steps", total_steps);
  EXPECT_GT(total_steps, 1000);
  EXPECT_GT(keyed, 0u);
  EXPECT_GT(resident_hits, 0u);
  EXPECT_GT(prefetched, 0u);
  EXPECT_GT(chunked, 0u);
  EXPECT_GT(shared, 0u);
}

// An entry every 4 tokens in every layer (testing::RandomCadenceOptions: uniform or GLM-5.3's
// groups, keys, hybrid residency, split runs, prefetches, copy chunks): only the steps that
// complete an entry append, the top-k names entries, requests may hold none yet; with deferred
// ingestion, retract / resume and promotion. Exactness as above, keys (one per entry) included.
TEST(ManagerModelTest, EntriesEveryFourTokensMatchTheDenseModel) {
  int total_steps = 0;
  uint64_t appended = 0, keyed = 0, resident_hits = 0;
  for (uint64_t seed : testing::TestSeeds(24)) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (rerun with SPARSEKV_TEST_SEED=" + std::to_string(seed) + ")");
    testing::WorkloadShape shape;
    shape.deferred_ingest = seed % 3 != 0;
    shape.run.split = seed % 5 < 2;
    shape.run.prefetch = seed % 4 == 1 ? 1 + static_cast<int32_t>(seed % 3) : 0;
    const CacheOptions options = testing::RandomCadenceOptions(seed, shape.run.prefetch, 4);
    shape.run.prefetch = std::min(shape.run.prefetch, options.max_prefetch);
    auto m = SparseKVCacheManager::Create(options, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    testing::RandomWorkload w(options, seed, {m->get()}, shape);
    total_steps += w.Run(300);
    w.CheckStats();
    const CacheStats s = *(*m)->ReadStats(nullptr);
    appended += s.bytes_device_to_host;
    keyed += options.indexer_key_bytes > 0;
    resident_hits += s.total.resident_hits;
    w.ReleaseAll();
    if (HasFailure()) break;
  }
  RecordProperty("steps", total_steps);
  EXPECT_GT(total_steps, 1000);
  EXPECT_GT(appended, 0u);
  EXPECT_GT(keyed, 0u);
  EXPECT_GT(resident_hits, 0u);
}

// Sharing at an entry every 4 tokens (RandomCadenceOptions, as above): a host page of
// host_page_tokens entries covers 4 times as many tokens, which key it in the prefix index;
// prefix admission (cached is a whole number of such pages, the suffix's entries are ingested),
// conversations retained and continued, forks, release of retained conversations and eviction
// under the small pool. Exactness as above: every assembled row, every live history in the host
// pool, shared pages unchanged while shared, and an empty pool at the end.
TEST(ManagerModelTest, SharingEveryFourTokensMatchesTheDenseModel) {
  int total_steps = 0;
  uint64_t hits = 0, evictions = 0, copies = 0, retained = 0;
  for (uint64_t seed : testing::TestSeeds(24)) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (rerun with SPARSEKV_TEST_SEED=" + std::to_string(seed) + ")");
    testing::WorkloadShape shape;
    shape.sharing = true;
    shape.vocabulary = 2 + static_cast<int32_t>(seed % 2);
    shape.run.split = seed % 5 < 2;
    const CacheOptions options = testing::RandomCadenceOptions(seed, 0, 4);
    auto m = SparseKVCacheManager::Create(options, CreateCpuBackend());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    testing::RandomWorkload w(options, seed, {m->get()}, shape);
    total_steps += w.Run(400);
    w.CheckStats();
    const CacheStats s = *(*m)->ReadStats(nullptr);
    hits += s.prefix_hit_tokens;
    evictions += s.evictions;
    copies += s.copy_on_write_pages;
    retained += s.retained_conversations;
    w.ReleaseAll();
    if (HasFailure()) break;
  }
  RecordProperty("steps", total_steps);
  EXPECT_GT(total_steps, 1000);
  EXPECT_GT(hits, 0u);
  EXPECT_GT(evictions, 0u);
  EXPECT_GT(copies, 0u);
  EXPECT_GT(retained, 0u);
}

}  // namespace
}  // namespace sparsekv
