// A manager over a node pool on the CPU backend: prompts sealed by a writer attached to the same
// segment (a second HostKVPool over it, as a prefill process would hold) are admitted without
// copying and decode exactly against the dense model, before and after the writer lets go; a
// seal that has ended is refused and changes nothing; and the random workload (prefix sharing,
// forks, copy on write, retained conversations) runs on a node pool as on a private one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "sparsekv/manager.h"
#include "sparsekv/node_pool.h"
#include "testing/harness.h"
#include "testing/workload.h"

namespace sparsekv {
namespace {

using testing::Bytes;

std::string UniqueName() {
  static int counter = 0;
  return "sparsekv-manager-test-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
}

class NodePoolManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_.name = UniqueName();
    CacheOptions shape;
    shape.geometry.layers = {{24, 32}, {8, 8}, {40, 40}};
    shape.top_k = 6;
    shape.hot_slots = 10;
    shape.max_requests = 4;
    shape.max_context = 160;
    shape.host_page_tokens = 16;
    shape.host_capacity_tokens = 1024;  // 64 pages
    auto writer = CreateNodePool(shape, 16, node_, CreateCpuBackend());
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    writer_ = *writer;
    auto reader = OpenNodePool(writer_->node_pool_path(), node_, CreateCpuBackend());
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    reader_ = *reader;
    options_.top_k = 6;
    options_.hot_slots = 10;
    options_.window = 3;
    options_.max_requests = 4;
    UseNodePoolShape(*reader_, options_);
    auto manager = SparseKVCacheManager::Create(options_, CreateCpuBackend(), reader_);
    ASSERT_TRUE(manager.ok()) << manager.status().ToString();
    manager_ = std::move(*manager);
  }
  void TearDown() override {
    manager_.reset();
    reader_.reset();
    writer_.reset();
    std::error_code ignored;
    EXPECT_FALSE(std::filesystem::exists(node_.directory + "/" + node_.name, ignored));
  }

  // The writer's prompt of `len` tokens (random rows per layer), sealed.
  NodePoolPrompt Write(int32_t len, std::vector<Bytes>& rows) {
    StatusOr<int32_t> owner = writer_->AcquireOwner();
    EXPECT_TRUE(owner.ok());
    EXPECT_TRUE(writer_->Reserve(*owner, len).ok());
    rows.clear();
    for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
      rows.push_back(testing::RandomRows(rng_, len, options_.geometry.layers[l].row_stride));
      EXPECT_TRUE(
          WritePromptLayer(*writer_, backend_, *owner, l, rows[l].data(), len, nullptr).ok());
    }
    StatusOr<uint64_t> seal = writer_->Seal(*owner, len);
    EXPECT_TRUE(seal.ok());
    return {*owner, *seal};
  }

  // One step of `batch`: a new random row per request and layer, top-k over the whole history
  // (prompt, generated, padding, out of range), every entry checked against the model.
  void Step(testing::StepDriver& driver, const std::vector<RequestId>& batch) {
    std::vector<Bytes> new_rows;
    std::vector<std::vector<int32_t>> topk(options_.geometry.num_layers());
    for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
      const int32_t stride = options_.geometry.layers[l].row_stride;
      new_rows.push_back(testing::RandomRows(rng_, static_cast<int64_t>(batch.size()), stride));
      for (size_t b = 0; b < batch.size(); ++b) {
        model_.Append(batch[b], l, new_rows[l].data() + b * stride);
        const int32_t len = model_.Length(batch[b], l);
        for (int32_t k = 0; k < options_.top_k; ++k) {
          const uint64_t r = rng_() % 20;
          topk[l].push_back(r == 0 ? -1 : r == 1 ? len + 2 : static_cast<int32_t>(rng_() % len));
        }
      }
    }
    const std::vector<testing::LayerResult> got = driver.Step(batch, new_rows, topk);
    for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
      EXPECT_EQ(
          testing::CheckLayer(model_, options_.geometry, l, batch, topk[l], got[l], options_.top_k),
          0)
          << "layer " << l;
    }
  }

  std::shared_ptr<Backend> backend_storage_ = CreateCpuBackend();
  Backend& backend_ = *backend_storage_;
  NodePoolOptions node_;
  CacheOptions options_;
  std::shared_ptr<HostKVPool> writer_, reader_;
  std::unique_ptr<SparseKVCacheManager> manager_;
  testing::DenseModel model_{KVGeometry{}};
  std::mt19937_64 rng_{7};
};

TEST_F(NodePoolManagerTest, SealedPromptsDecodeExactlyBeforeAndAfterTheWriterLetsGo) {
  model_ = testing::DenseModel(options_.geometry);
  // Partial last pages (copy on write at the first append while the writer holds them), a whole
  // page, and a prompt shorter than the window.
  const std::vector<int32_t> lengths = {37, 48, 2, 100};
  std::vector<NodePoolPrompt> prompts;
  std::vector<RequestId> ids;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<Bytes> rows;
    prompts.push_back(Write(lengths[i], rows));
    const RequestId id = static_cast<RequestId>(i + 1);
    const int32_t free_before = reader_->free_pages();
    ASSERT_TRUE(AdmitFromNodePool(*manager_, id, prompts.back(), 160 - lengths[i], nullptr).ok());
    // Nothing of the prompt is stored again: the new pages are for the generated tokens (and
    // the copy-on-write spare).
    const int32_t prompt_pages = (lengths[i] + 15) / 16;
    const int32_t reserved_pages = 10;
    EXPECT_EQ(free_before - reader_->free_pages(),
              reserved_pages - prompt_pages + (lengths[i] % 16 != 0 ? 1 : 0));
    // Its first pages are the writer's.
    const std::vector<int32_t> pages = *manager_->HostPages(id);
    const std::span<const int32_t> written = writer_->page_table_row(prompts.back().owner);
    EXPECT_TRUE(std::equal(written.begin(), written.begin() + prompt_pages, pages.begin()));
    model_.Add(id, rows, lengths[i]);
    ids.push_back(id);
    EXPECT_EQ(*manager_->SequenceLength(id), lengths[i]);
  }
  testing::StepDriver driver(*manager_);
  for (int step = 0; step < 12; ++step) {
    std::shuffle(ids.begin(), ids.end(), rng_);
    Step(driver, std::vector<RequestId>(ids.begin(), ids.begin() + 1 + step % 4));
  }
  // The writer releases its prompts (as after the control plane's Done): the readers' pages stay.
  for (const NodePoolPrompt& p : prompts) {
    writer_->Release(p.owner);
    writer_->ReleaseOwner(p.owner);
  }
  for (int step = 0; step < 12; ++step) Step(driver, ids);
  StatusOr<CacheStats> stats = manager_->ReadStats(nullptr);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->copy_on_write_pages, 3u);  // the three partial pages, shared at first append
  EXPECT_EQ(stats->bytes_ingested, 0u);
  EXPECT_GT(stats->total.misses, 0u);
  // The pool by use: a node pool's, whole, adding up.
  EXPECT_TRUE(stats->host_memory.node_pool);
  EXPECT_EQ(stats->host_memory.sum(), stats->host_memory.total);
  EXPECT_EQ(stats->host_memory.total, int64_t{reader_->total_pages()} * reader_->page_bytes());
  for (RequestId id : ids) ASSERT_TRUE(manager_->Release(id).ok());
  EXPECT_EQ(reader_->free_pages(), reader_->total_pages());
  EXPECT_EQ(writer_->free_owners(), writer_->max_owners());
}

TEST_F(NodePoolManagerTest, AnEndedSealOrABadAdmissionChangesNothing) {
  model_ = testing::DenseModel(options_.geometry);
  std::vector<Bytes> rows;
  const NodePoolPrompt prompt = Write(40, rows);
  const int32_t free_pages = reader_->free_pages();
  const auto unchanged = [&] {
    EXPECT_EQ(reader_->free_pages(), free_pages);
    for (int32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(reader_->RefCount(writer_->page_table_row(prompt.owner)[i]), 1);
    }
  };
  EXPECT_EQ(AdmitFromNodePool(*manager_, 1, {prompt.owner, prompt.seal + 1}, 8, nullptr).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(AdmitFromNodePool(*manager_, 1, prompt, -1, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(AdmitFromNodePool(*manager_, 1, {99, prompt.seal}, 8, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(AdmitFromNodePool(*manager_, 1, prompt, 200, nullptr).code(), StatusCode::kOutOfRange);
  unchanged();
  // Every hot-cache block taken: ResourceExhausted, and the shared pages keep one reference.
  for (RequestId id = 10; id < 14; ++id) ASSERT_TRUE(manager_->Admit(id, 4, 0, nullptr).ok());
  const int32_t with_others = reader_->free_pages();
  EXPECT_EQ(AdmitFromNodePool(*manager_, 1, prompt, 8, nullptr).code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(reader_->free_pages(), with_others);
  for (RequestId id = 10; id < 14; ++id) ASSERT_TRUE(manager_->Release(id).ok());
  unchanged();
  ASSERT_TRUE(AdmitFromNodePool(*manager_, 1, prompt, 8, nullptr).ok());
  EXPECT_EQ(AdmitFromNodePool(*manager_, 1, prompt, 8, nullptr).code(), StatusCode::kAlreadyExists);
  // The writer lets go: its seal has ended for new readers.
  writer_->Release(prompt.owner);
  writer_->ReleaseOwner(prompt.owner);
  EXPECT_EQ(AdmitFromNodePool(*manager_, 2, prompt, 8, nullptr).code(), StatusCode::kNotFound);
  ASSERT_TRUE(manager_->Release(1).ok());
  EXPECT_EQ(reader_->free_pages(), reader_->total_pages());
}

// Runs the random workload on a manager whose pool is a node pool: every
// reference it takes is counted for its process, and the pool is empty when it is done.
void RunWorkloadOnANodePool(const CacheOptions& o, uint64_t seed, testing::WorkloadShape shape) {
  NodePoolOptions node;
  node.name = UniqueName();
  auto pool = CreateNodePool(o, o.effective_max_host_requests(), node, CreateCpuBackend());
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  auto manager = SparseKVCacheManager::Create(o, CreateCpuBackend(), *pool);
  ASSERT_TRUE(manager.ok()) << manager.status().ToString();
  {
    testing::RandomWorkload w(o, seed, {manager->get()}, shape);
    EXPECT_GT(w.Run(600), 0);
    w.CheckStats();
    w.ReleaseAll();
  }
  manager->reset();
  EXPECT_EQ((*pool)->free_pages(), (*pool)->total_pages());
  EXPECT_EQ((*pool)->free_owners(), (*pool)->max_owners());
}

TEST(NodePoolWorkloadTest, RandomSharingWorkloadOnANodePool) {
  for (uint64_t seed : testing::TestSeeds(3)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    testing::WorkloadShape shape;
    shape.sharing = true;
    RunWorkloadOnANodePool(testing::RandomSmallOptions(seed), seed, shape);
  }
}

// Hybrid residency (resident requests, demotions, deferred ingestion) over a node pool.
TEST(NodePoolWorkloadTest, RandomHybridWorkloadOnANodePool) {
  for (uint64_t seed : testing::TestSeeds(3)) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    testing::WorkloadShape shape;
    shape.deferred_ingest = true;
    RunWorkloadOnANodePool(testing::RandomHybridOptions(seed), seed, shape);
  }
}

}  // namespace
}  // namespace sparsekv
