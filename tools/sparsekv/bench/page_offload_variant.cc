#include "tools/sparsekv/bench/page_offload_variant.h"

#include <utility>

#include "tools/sparsekv/bench/gpu_kernels.h"
#include "tools/sparsekv/bench/page_offload.h"

namespace sparsekv::tools {
namespace {

cudaStream_t Cuda(StreamHandle stream) { return static_cast<cudaStream_t>(stream); }

class CudaPageOffloadOps final : public PageOffloadOps {
 public:
  Status PageIds(const int32_t* topk, int32_t entries, int32_t page_tokens, int32_t* page_ids,
                 StreamHandle stream) override {
    return CudaStatus(gpu::PageIds(topk, entries, page_tokens, page_ids, Cuda(stream)),
                      "gpu::PageIds");
  }
  Status Overflow(const int32_t* page_ids, const int32_t* cache_slots, int32_t entries,
                  int32_t* overflow, StreamHandle stream) override {
    return CudaStatus(gpu::PageOverflow(page_ids, cache_slots, entries, overflow, Cuda(stream)),
                      "gpu::PageOverflow");
  }
  Status Rows(const int32_t* topk, const int32_t* cache_slots, const int32_t* staging_slots,
              int32_t entries, int32_t page_tokens, int64_t first_cache_row,
              int64_t first_staging_row, int32_t* rows, StreamHandle stream) override {
    return CudaStatus(gpu::PageRows(topk, cache_slots, staging_slots, entries, page_tokens,
                                    first_cache_row, first_staging_row, rows, Cuda(stream)),
                      "gpu::PageRows");
  }
};

class PageOffloadVariant final : public StepVariant {
 public:
  explicit PageOffloadVariant(const VariantSetup& s) : s_(s) {}

  Status Init(std::shared_ptr<Backend> host, cudaStream_t stream) {
    const RequestShape& r = s_.shape;
    SPARSEKV_ASSIGN_OR_RETURN(cache_,
                              PageOffloadCache::Create(r, s_.max_batch, std::move(host),
                                                       std::make_unique<CudaPageOffloadOps>()));
    for (int32_t l = 0; l < r.layers; ++l) {
      for (int32_t b = 0; b < s_.max_batch; ++b) {
        SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::FillKVRows(cache_->host_layer(l), r.row_bytes,
                                                      b * cache_->request_rows(), s_.context,
                                                      r.row_bytes, b, l, 0, s_.seed, stream));
      }
    }
    SPARSEKV_RETURN_IF_ERROR(cache_->LoadPrompt(s_.context, stream));
    return CudaStatus(cudaStreamSynchronize(stream), "page-offload set-up");
  }

  KVVariant kind() const override { return KVVariant::kPageOffload; }
  Status Plan(std::span<const int32_t> positions, cudaStream_t stream) override {
    return cache_->Plan(positions, stream);
  }
  Status RunLayer(int32_t layer, int32_t batch, const int32_t* topk, const std::byte* new_rows,
                  cudaStream_t stream) override {
    return cache_->RunLayer(layer, batch, topk, new_rows, stream);
  }
  Status FinishStep(cudaStream_t) override { return Status::Ok(); }
  Status AfterReplay(double) override { return Status::Ok(); }
  const std::byte* Rows(int32_t) const override { return cache_->cache_rows(); }
  const int32_t* Indices() const override { return cache_->Indices(); }
  Status ResetStats(cudaStream_t stream) override { return cache_->ResetStats(stream); }
  // In pages: the distinct pages of the top-k rows looked up, and those copied from the host.
  StatusOr<VariantStats> ReadStats(cudaStream_t stream) override {
    SPARSEKV_ASSIGN_OR_RETURN(const ResolveCounters c, cache_->ReadStats(stream));
    VariantStats out;
    out.lookups = double(c.hits + c.window_hits + c.misses);
    out.misses = double(c.misses);
    return out;
  }

 private:
  VariantSetup s_;
  std::unique_ptr<PageOffloadCache> cache_;
};

}  // namespace

StatusOr<std::unique_ptr<StepVariant>> CreatePageOffloadVariant(const VariantSetup& setup,
                                                                std::shared_ptr<Backend> host,
                                                                cudaStream_t stream) {
  auto v = std::make_unique<PageOffloadVariant>(setup);
  SPARSEKV_RETURN_IF_ERROR(v->Init(std::move(host), stream));
  return std::unique_ptr<StepVariant>(std::move(v));
}

}  // namespace sparsekv::tools
