// SparseEntryAttention on CUDA: the arguments checked on the host, then one fused kernel
// (entry_attention_kernel.cu).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>
#include <utility>

#include "attention/cuda_status.h"
#include "attention/entry_attention_args.h"
#include "attention/entry_attention_kernel.h"
#include "sparsekv/attention.h"

namespace sparsekv {
namespace {

using mla_cuda::DeviceGuard;

mla_cuda::EntryScopeView ScopeView(const AttentionScope& scope) {
  return {scope.rows, scope.row_stride, scope.indices, scope.width, scope.store};
}

class CudaSparseEntryAttention final : public SparseEntryAttention {
 public:
  CudaSparseEntryAttention(const SparseEntryAttentionOptions& options, int device)
      : options_(options), device_(device) {}

  Status Run(int32_t batch, const void* q, const AttentionScope& selected,
             const AttentionScope& window, const float* sink, void* out,
             StreamHandle stream) override {
    SPARSEKV_RETURN_IF_ERROR(
        CheckSparseEntryAttentionArgs(options_, batch, q, selected, window, out));
    if (batch == 0) return Status::Ok();
    DeviceGuard guard(device_);
    mla_cuda::EntryAttentionView view;
    view.q = static_cast<const __nv_bfloat16*>(q);
    view.selected = ScopeView(selected);
    view.window = ScopeView(window);
    view.sink = sink;
    view.out = static_cast<__nv_bfloat16*>(out);
    view.batch = batch;
    view.heads = options_.heads;
    view.softmax_scale = options_.effective_softmax_scale();
    SPARSEKV_CUDA_RETURN_IF_ERROR(mla_cuda::LaunchEntryAttention(
        selected.format, window.format, view, static_cast<cudaStream_t>(stream)));
    return Status::Ok();
  }

  const SparseEntryAttentionOptions& options() const override { return options_; }

 private:
  const SparseEntryAttentionOptions options_;
  const int device_;
};

}  // namespace

StatusOr<std::unique_ptr<SparseEntryAttention>> SparseEntryAttention::Create(
    const SparseEntryAttentionOptions& options, int device) {
  SPARSEKV_RETURN_IF_ERROR(ValidateSparseEntryAttentionOptions(options));
  SPARSEKV_RETURN_IF_ERROR(mla_cuda::CheckDevice(device));
  return std::unique_ptr<SparseEntryAttention>(
      std::make_unique<CudaSparseEntryAttention>(options, device));
}

}  // namespace sparsekv
