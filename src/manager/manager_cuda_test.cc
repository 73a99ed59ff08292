// The CUDA backend against the CPU oracle at the manager level: random operation sequences run in
// lockstep on both (slots and rows must be identical), realistic shapes, and a whole multi-layer
// decode step captured once as a CUDA graph and replayed with new top-k and batch composition.
// Every test skips cleanly without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <thread>
#include <utility>

#include "sparsekv/host_kv_pool.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/index_groups.h"
#include "sparsekv/manager.h"
#include "sparsekv/node_pool.h"
#include "testing/cuda_test_util.h"
#include "testing/layer_kinds_model.h"
#include "testing/workload.h"

#if defined(SPARSEKV_WITH_CUDA)
#include <cuda_runtime.h>
#include <unistd.h>
#endif

namespace sparsekv {
namespace {

std::unique_ptr<SparseKVCacheManager> MustCreate(const CacheOptions& o,
                                                 std::shared_ptr<Backend> backend) {
  auto m = SparseKVCacheManager::Create(o, std::move(backend));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// Runs the random workload on the CPU and the CUDA backend in lockstep for each test seed, with
// the options and shape `setup` gives for the seed; returns the decode steps run.
using LockstepSetup = std::function<std::pair<CacheOptions, testing::WorkloadShape>(uint64_t)>;
int RunLockstep(std::shared_ptr<Backend> gpu, const LockstepSetup& setup) {
  int steps = 0;
  for (uint64_t seed : testing::TestSeeds(12)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto [o, shape] = setup(seed);
    auto cpu = MustCreate(o, CreateCpuBackend());
    auto dev = MustCreate(o, gpu);
    if (!cpu || !dev) break;
    testing::RandomWorkload w(o, seed, {cpu.get(), dev.get()}, shape);
    steps += w.Run(250);
    w.CheckStats();
    w.ReleaseAll();
    if (::testing::Test::HasFailure()) break;
  }
  return steps;
}

// DeepSeek-V4's layer kinds (offloaded, resident and window-only layers, a raw window) through
// the CUDA backend, checked against the dense model after every step as on the CPU
// (manager_layer_kinds_test.cc).
TEST(ManagerCudaTest, LayerKindsMatchTheDenseModel) {
  SPARSEKV_REQUIRE_GPU(gpu);
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    testing::LayerKindsModel model(seed, /*hybrid=*/seed % 3 == 0, gpu);
    model.Run(400);
    if (::testing::Test::HasFailure()) return;
    EXPECT_GT(model.steps(), 50);
  }
}

// The same with prefix sharing and retained conversations: a prefix's resident entries restored
// from a retained conversation's host copy into device memory (manager_layer_kinds_test.cc).
TEST(ManagerCudaTest, LayerKindsWithSharingMatchTheDenseModel) {
  SPARSEKV_REQUIRE_GPU(gpu);
  int64_t hit_tokens = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    testing::LayerKindsModel model(seed, /*hybrid=*/seed % 3 == 0, gpu, /*sharing=*/true);
    model.Run(400);
    model.ReleaseAll();
    if (::testing::Test::HasFailure()) return;
    EXPECT_GT(model.steps(), 50);
    hit_tokens += model.hit_tokens();
  }
  EXPECT_GT(hit_tokens, 0);
}

TEST(ManagerCudaTest, RandomOperationsMatchTheCpuBackend) {
  SPARSEKV_REQUIRE_GPU(gpu);
  EXPECT_GT(RunLockstep(gpu,
                        [](uint64_t seed) {
                          return std::pair(testing::RandomSmallOptions(seed),
                                           testing::WorkloadShape());
                        }),
            500);
}

// Shared prefixes, forks (copy on write through CopyAsync host -> host on the stream), retained
// conversations and eviction, in lockstep: identical prefixes found, slots and rows delivered.
TEST(ManagerCudaTest, RandomSharingOperationsMatchTheCpuBackend) {
  SPARSEKV_REQUIRE_GPU(gpu);
  EXPECT_GT(RunLockstep(gpu,
                        [](uint64_t seed) {
                          testing::WorkloadShape shape;
                          shape.sharing = true;
                          return std::pair(testing::RandomSmallOptions(seed), shape);
                        }),
            500);
}

// The transfer-hiding paths (index groups, shared repeats, split runs with the fill mask,
// prefetch) in lockstep: identical slots, fill masks and rows.
TEST(ManagerCudaTest, OverlapPathsMatchTheCpuBackend) {
  SPARSEKV_REQUIRE_GPU(gpu);
  EXPECT_GT(
      RunLockstep(gpu,
                  [](uint64_t seed) {
                    testing::WorkloadShape shape;
                    shape.run.split = seed % 2 == 0;
                    shape.run.prefetch = seed % 3 == 0 ? 0 : 1 + static_cast<int32_t>(seed % 5);
                    const CacheOptions o = testing::RandomOverlapOptions(seed, shape.run.prefetch);
                    shape.run.prefetch = std::min(shape.run.prefetch, o.max_prefetch);
                    return std::pair(o, shape);
                  }),
      500);
}

// Hybrid residency in lockstep: resident rows mapped straight, demotions seeded from the pool,
// promotions, mixed steps; identical slots and rows, identical demotions.
TEST(ManagerCudaTest, HybridResidencyMatchesTheCpuBackend) {
  SPARSEKV_REQUIRE_GPU(gpu);
  EXPECT_GT(RunLockstep(gpu,
                        [](uint64_t seed) {
                          testing::WorkloadShape shape;
                          shape.sharing = seed % 2 == 0;
                          shape.deferred_ingest = !shape.sharing;
                          return std::pair(testing::RandomHybridOptions(seed), shape);
                        }),
            500);
}

// GLM-5.3's layers in lockstep (testing::RandomGroupedOptions): explicit index groups of one and
// four layers, two top-k, indexer keys on the groups' first layers, hybrid residency, sharing,
// split runs and prefetches; identical slots, fill masks, rows and keys.
TEST(ManagerCudaTest, ExplicitIndexGroupsMatchTheCpuBackend) {
  SPARSEKV_REQUIRE_GPU(gpu);
  EXPECT_GT(
      RunLockstep(gpu,
                  [](uint64_t seed) {
                    testing::WorkloadShape shape;
                    shape.sharing = seed % 4 < 2;
                    shape.deferred_ingest = !shape.sharing;
                    shape.run.split = seed % 5 < 2;
                    shape.run.prefetch = seed % 3 == 1 ? 1 + static_cast<int32_t>(seed % 4) : 0;
                    const CacheOptions o = testing::RandomGroupedOptions(seed, shape.run.prefetch);
                    shape.run.prefetch = std::min(shape.run.prefetch, o.max_prefetch);
                    return std::pair(o, shape);
                  }),
      500);
}

// An entry every 4 tokens in lockstep (testing::RandomCadenceOptions): the compact append list
// (its count on the device), resolves in entry units, requests without an entry yet; identical
// slots, fill masks, rows and keys.
TEST(ManagerCudaTest, EntriesEveryFourTokensMatchTheCpuBackend) {
  SPARSEKV_REQUIRE_GPU(gpu);
  EXPECT_GT(RunLockstep(gpu,
                        [](uint64_t seed) {
                          testing::WorkloadShape shape;
                          shape.deferred_ingest = seed % 3 != 0;
                          shape.run.split = seed % 5 < 2;
                          shape.run.prefetch =
                              seed % 4 == 1 ? 1 + static_cast<int32_t>(seed % 3) : 0;
                          const CacheOptions o =
                              testing::RandomCadenceOptions(seed, shape.run.prefetch, 4);
                          shape.run.prefetch = std::min(shape.run.prefetch, o.max_prefetch);
                          return std::pair(o, shape);
                        }),
            500);
}

// Sharing at an entry every 4 tokens in lockstep: pages keyed by the 4 * host_page_tokens tokens
// they cover, prefixes, continued and retained conversations, forks with copy on write and
// eviction; identical prefixes found, slots and rows delivered.
TEST(ManagerCudaTest, SharingEveryFourTokensMatchesTheCpuBackend) {
  SPARSEKV_REQUIRE_GPU(gpu);
  EXPECT_GT(RunLockstep(gpu,
                        [](uint64_t seed) {
                          testing::WorkloadShape shape;
                          shape.sharing = true;
                          shape.vocabulary = 2 + static_cast<int32_t>(seed % 2);
                          shape.run.split = seed % 5 < 2;
                          return std::pair(testing::RandomCadenceOptions(seed, 0, 4), shape);
                        }),
            500);
}

// Production shapes: K = 2048, C in {K, 2K}, 656-B and 1152-B rows, batches up to 8.
TEST(ManagerCudaTest, ProductionShapesMatchTheCpuBackend) {
  SPARSEKV_REQUIRE_GPU(gpu);
  for (int32_t c : {2048, 4096}) {
    SCOPED_TRACE("hot_slots " + std::to_string(c));
    CacheOptions o;
    o.geometry.layers = {{656, 656}, {1152, 1152}};
    o.top_k = 2048;
    o.hot_slots = c;
    o.window = 1;
    o.max_requests = 8;
    o.max_context = 12000;
    o.host_capacity_tokens = 8 * 12000;
    auto cpu = MustCreate(o, CreateCpuBackend());
    auto dev = MustCreate(o, gpu);
    ASSERT_TRUE(cpu && dev);
    testing::WorkloadShape shape;
    shape.max_prompt = 8000;
    shape.max_new = 40;
    testing::RandomWorkload w(o, c, {cpu.get(), dev.get()}, shape);
    w.Run(40);
    w.CheckStats();
    w.ReleaseAll();
  }
}

// Node-level sharing: two managers on two GPUs share one pinned, portable host pool (allocated
// through GPU 0's backend), each driven by its own thread and checked step by step against its own
// dense model; the pool is empty once both are destroyed.
TEST(ManagerCudaTest, TwoGpusShareOneHostPool) {
  SPARSEKV_REQUIRE_GPU(gpu0);
  int devices = 0;
#if defined(SPARSEKV_WITH_CUDA)
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
#endif
  if (devices < 2) {
    GTEST_SKIP() << "node-level sharing needs 2 CUDA devices; this machine has " << devices;
  }
  StatusOr<std::shared_ptr<Backend>> gpu1 = CreateCudaBackend(1);
  ASSERT_TRUE(gpu1.ok()) << gpu1.status().ToString();
  const std::shared_ptr<Backend> gpus[2] = {gpu0, *gpu1};
  for (uint64_t seed : testing::TestSeeds(4)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    CacheOptions o = testing::RandomSmallOptions(seed);
    // Room for both managers' largest demand, so that both make progress whatever the timing.
    o.host_capacity_tokens =
        int64_t{2} * o.effective_max_host_requests() * (o.max_context + o.host_page_tokens);
    auto pool = HostKVPool::CreateShared(o, 2 * o.effective_max_host_requests(), gpu0);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    std::vector<std::unique_ptr<SparseKVCacheManager>> managers;
    for (const std::shared_ptr<Backend>& gpu : gpus) {
      auto m = SparseKVCacheManager::Create(o, gpu, *pool);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      managers.push_back(std::move(*m));
    }
    int steps[2] = {0, 0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        testing::RandomWorkload w(o, seed * 100 + i, {managers[i].get()});
        steps[i] = w.Run(500);
        w.CheckStats();
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_GT(steps[0], 0);
    EXPECT_GT(steps[1], 0);
    managers.clear();
    EXPECT_EQ((*pool)->free_pages(), (*pool)->total_pages());
    EXPECT_EQ((*pool)->free_owners(), (*pool)->max_owners());
    if (HasFailure()) break;
  }
}

#if defined(SPARSEKV_WITH_CUDA)

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// A whole decode step (append + resolve + copy + assemble for every layer, write-back joined) is
// captured once and replayed for many steps whose batch composition and top-k change; every
// replay must equal the CPU backend running the same steps eagerly. `o` has three layers and
// room for 6 requests of up to 512 tokens; a step runs 1-4 of them. With `change_residency`
// (hybrid residency), requests are promoted, retracted and resumed between some replays. With
// `node_pool`, the CUDA manager's pool is a node pool (its rows registered with the GPU): a
// writer attached to the same segment writes and seals each prompt, the manager admits it from
// the sealed pages (AdmitFromNodePool), and the writer releases them after 30 steps.
void ReplayCapturedSteps(const std::shared_ptr<Backend>& gpu, const CacheOptions& o,
                         const testing::RunMode& mode, bool change_residency = false,
                         bool node_pool = false) {
  auto cpu = MustCreate(o, CreateCpuBackend());
  std::shared_ptr<HostKVPool> writer;
  std::unique_ptr<SparseKVCacheManager> dev;
  if (node_pool) {
    NodePoolOptions node;
    node.name = "sparsekv-cuda-test-" + std::to_string(getpid());
    auto created = CreateNodePool(o, 16, node, CreateCpuBackend());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    writer = *created;
    auto pool = OpenNodePool(writer->node_pool_path(), node, gpu);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    auto m = SparseKVCacheManager::Create(o, gpu, *pool);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    dev = std::move(*m);
  } else {
    dev = MustCreate(o, gpu);
  }
  ASSERT_TRUE(cpu && dev);
  std::vector<int32_t> written_owners;

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  testing::StepDriver cpu_driver(*cpu, nullptr, mode);
  testing::StepDriver dev_driver(*dev, stream, mode);
  testing::DenseModel model(o.geometry);
  std::mt19937_64 rng(2024);

  std::vector<RequestId> ids;
  for (RequestId id = 1; id <= 6; ++id) {
    const int32_t prompt = 100 + static_cast<int32_t>(rng() % 200);
    std::vector<testing::Bytes> rows;
    for (const LayerShape& l : o.geometry.layers) {
      rows.push_back(testing::RandomRows(rng, prompt, l.row_stride));
    }
    for (SparseKVCacheManager* m : {cpu.get(), dev.get()}) {
      if (m == dev.get() && node_pool) {
        StatusOr<int32_t> owner = writer->AcquireOwner();
        ASSERT_TRUE(owner.ok());
        ASSERT_TRUE(writer->Reserve(*owner, prompt).ok());
        for (int32_t l = 0; l < o.geometry.num_layers(); ++l) {
          ASSERT_TRUE(WritePromptLayer(*writer, *CreateCpuBackend(), *owner, l, rows[l].data(),
                                       prompt, nullptr)
                          .ok());
        }
        StatusOr<uint64_t> seal = writer->Seal(*owner, prompt);
        ASSERT_TRUE(seal.ok());
        const Status admitted = AdmitFromNodePool(*dev, id, {*owner, *seal}, 200, stream);
        ASSERT_TRUE(admitted.ok()) << admitted.ToString();
        written_owners.push_back(*owner);
        continue;
      }
      ASSERT_TRUE(m->Admit(id, prompt, 200, stream).ok());
      for (int32_t l = 0; l < o.geometry.num_layers(); ++l) {
        ASSERT_TRUE(m->IngestPrompt(id, l, rows[l].data(), stream).ok());
      }
    }
    model.Add(id, rows, prompt);
    ids.push_back(id);
  }
  ASSERT_TRUE(dev->backend().Synchronize(stream).ok());

  const IndexGroups groups(o);
  testing::CapturedRunPhase run_phase(*dev, dev_driver, stream);
  for (int step = 0; step < 60; ++step) {
    if (node_pool && step == 30) {
      // The writer lets go; the manager's references keep the pages its graph reads.
      for (int32_t owner : written_owners) {
        writer->Release(owner);
        writer->ReleaseOwner(owner);
      }
    }
    if (change_residency && step % 10 == 5) {
      // Between replays: the graph reads the batch table, so a request's mode may change.
      const RequestId promoted = ids[rng() % ids.size()];
      const RequestId moved = ids[rng() % ids.size()];
      const Status a = cpu->Promote(promoted, nullptr);
      const Status b = dev->Promote(promoted, stream);
      EXPECT_EQ(a.code(), b.code()) << a.ToString() << " / " << b.ToString();
      EXPECT_EQ(cpu->IsResident(promoted), dev->IsResident(promoted));
      for (SparseKVCacheManager* m : {cpu.get(), dev.get()}) {
        ASSERT_TRUE(m->Retract(moved).ok());
        ASSERT_TRUE(m->Resume(moved, m == dev.get() ? stream : nullptr).ok());
      }
      EXPECT_EQ(cpu->IsResident(moved), dev->IsResident(moved));
    }
    std::shuffle(ids.begin(), ids.end(), rng);
    const std::vector<RequestId> batch(ids.begin(), ids.begin() + 1 + rng() % 4);
    std::vector<testing::Bytes> new_rows;
    std::vector<std::vector<int32_t>> topk(o.geometry.num_layers());
    for (int32_t l = 0; l < o.geometry.num_layers(); ++l) {
      const int32_t stride = o.geometry.layers[l].row_stride;
      new_rows.push_back(testing::RandomRows(rng, static_cast<int64_t>(batch.size()), stride));
      for (size_t b = 0; b < batch.size(); ++b) {
        model.Append(batch[b], l, new_rows[l].data() + b * stride);
      }
      if (!groups.Leads(l)) {  // the layers of an index group share its first layer's top-k
        topk[l] = topk[groups.Leader(l)];
        continue;
      }
      for (size_t b = 0; b < batch.size(); ++b) {
        const int32_t len = model.Length(batch[b], l);
        for (int32_t k = 0; k < groups.LayerTopK(l); ++k) {
          // Mostly a slowly moving range (hits), some random history (misses), some bad input.
          const uint64_t r = rng() % 100;
          int32_t p = static_cast<int32_t>(std::max<int64_t>(0, len - 80) + rng() % 80);
          if (r < 20) p = static_cast<int32_t>(rng() % len);
          if (r >= 95) p = r % 2 ? -1 : len + 3;
          topk[l].push_back(std::min(p, len + 3));
        }
      }
    }
    auto want = cpu_driver.Step(batch, new_rows, topk);

    ASSERT_TRUE(dev->PlanStep(batch, stream).ok());
    std::vector<int32_t> seq_lens;  // as StepDriver::Step passes them (the prefetch draws)
    for (RequestId id : batch) seq_lens.push_back(*dev->SequenceLength(id) + 1);
    dev_driver.UploadInputs(static_cast<int32_t>(batch.size()), new_rows, topk, seq_lens);
    const Status ran = run_phase.Run();
    ASSERT_TRUE(ran.ok()) << ran.ToString();
    auto got = dev_driver.DownloadOutputs(static_cast<int32_t>(batch.size()));
    for (int32_t l = 0; l < o.geometry.num_layers(); ++l) {
      SCOPED_TRACE("step " + std::to_string(step) + " layer " + std::to_string(l));
      const int32_t top_k = groups.LayerTopK(l);
      EXPECT_TRUE(testing::SameRows(got[l], want[l], batch.size() * top_k, o.geometry.layers[l]));
      EXPECT_EQ(got[l].fill, want[l].fill);
      EXPECT_EQ(testing::CheckLayer(model, o.geometry, l, batch, topk[l], got[l], top_k,
                                    o.share_repeated_positions),
                0);
    }
    if (::testing::Test::HasFailure()) break;
  }
  auto a = cpu->ReadStats(nullptr);
  auto b = dev->ReadStats(stream);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->total.misses, b->total.misses);
  EXPECT_EQ(a->total.hits, b->total.hits);
  EXPECT_EQ(a->prefetch_lookups, b->prefetch_lookups);
  EXPECT_EQ(a->prefetch_rows, b->prefetch_rows);
  EXPECT_EQ(a->bytes_device_to_host, b->bytes_device_to_host);
  EXPECT_EQ(a->bytes_assembled, b->bytes_assembled);
  EXPECT_GT(b->total.misses, 0u);
  EXPECT_GT(b->total.hits, 0u);
  if (mode.prefetch > 0) {
    EXPECT_GT(b->prefetch_rows, 0u);
  }
  EXPECT_EQ(a->total.resident_hits, b->total.resident_hits);
  EXPECT_EQ(a->demotions, b->demotions);
  EXPECT_EQ(a->promotions, b->promotions);
  if (change_residency) {
    EXPECT_GT(b->total.resident_hits, 0u);
    EXPECT_GT(b->demotions + b->promotions, 0u);
  }
  if (node_pool) {
    // Copy on write of the partial last pages, shared with the writer at the first appends.
    EXPECT_GT(b->copy_on_write_pages, 0u);
    EXPECT_EQ(b->bytes_ingested, 0u);
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

CacheOptions ReplayOptions() {
  CacheOptions o;
  o.geometry.layers = {{656, 656}, {132, 132}, {24, 32}};
  o.top_k = 64;
  o.hot_slots = 96;
  o.window = 2;
  o.max_requests = 6;
  o.max_batch = 4;
  o.max_context = 512;
  o.host_page_tokens = 16;
  o.host_capacity_tokens = 6 * 512;
  return o;
}

TEST(ManagerCudaTest, CapturedStepReplaysExactly) {
  SPARSEKV_REQUIRE_GPU(gpu);
  ReplayCapturedSteps(gpu, ReplayOptions(), testing::RunMode());
}

// Requests whose prompts another process's writer sealed in a node pool (here a second attach to
// the segment), admitted without copying, in one captured graph: replays read their rows from the
// segment registered with the GPU like any pool row, before and after the writer releases them.
TEST(ManagerCudaTest, CapturedStepOverANodePoolReplaysExactly) {
  SPARSEKV_REQUIRE_GPU(gpu);
  CacheOptions o = ReplayOptions();
  o.host_capacity_tokens = 8 * 512;  // the writer's prompts and the manager's new tokens
  ReplayCapturedSteps(gpu, o, testing::RunMode(), /*change_residency=*/false, /*node_pool=*/true);
}

// The transfer-hiding paths in one captured step: split runs (fill masks), index groups, shared
// repeats, prefetches, a sorting threshold inside the batch range (1-4 requests), so that replays
// of the one graph take both the sorted and the unsorted miss list, and copies on a 2-block grid.
TEST(ManagerCudaTest, CapturedOverlapStepReplaysExactly) {
  SPARSEKV_REQUIRE_GPU(gpu);
  CacheOptions o = ReplayOptions();
  o.layers_per_index = 2;
  o.share_repeated_positions = true;
  o.max_prefetch = 4;
  o.sort_misses_min_batch = 3;
  o.copy_blocks = 2;
  testing::RunMode mode;
  mode.split = true;
  mode.prefetch = 3;
  mode.seed = 7;
  ReplayCapturedSteps(gpu, o, mode);
}

// Hybrid residency under one captured graph: resident and hot-cache requests in the same replays,
// demotions at admission, promotions and resumes between replays.
TEST(ManagerCudaTest, CapturedHybridStepReplaysExactly) {
  SPARSEKV_REQUIRE_GPU(gpu);
  CacheOptions o = ReplayOptions();
  o.hybrid_residency = true;
  o.resident_page_rows = 16;
  o.device_budget_bytes = 12 * HotCache::BlockBytes(o.geometry, o.hot_slots, o.window,
                                                    o.layers_per_index, ReplacementOf(o));
  ReplayCapturedSteps(gpu, o, testing::RunMode(), /*change_residency=*/true);
}

// GLM-5.3's groups under one captured graph: layers {0}, {1}, {2-5}, the middle group with its
// own top-k and chunked copies, split runs and prefetches, so that the chunks of a group of the
// smaller top-k lie where the larger one's would.
TEST(ManagerCudaTest, CapturedExplicitGroupsStepReplaysExactly) {
  SPARSEKV_REQUIRE_GPU(gpu);
  CacheOptions o = ReplayOptions();
  o.geometry.layers.assign(6, LayerShape{656, 656});
  for (int32_t l = 0; l < 6; ++l) o.geometry.layers[l].index_group = l <= 2 ? l : 2;
  o.geometry.layers[1].top_k = 40;
  o.max_prefetch = 4;
  o.copy_chunk_rows = 2;
  testing::RunMode mode;
  mode.split = true;
  mode.prefetch = 3;
  mode.seed = 11;
  ReplayCapturedSteps(gpu, o, mode);
}

#endif  // SPARSEKV_WITH_CUDA

}  // namespace
}  // namespace sparsekv
