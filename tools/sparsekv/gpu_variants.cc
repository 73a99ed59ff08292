#include "tools/sparsekv/gpu_variants.h"

#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "sparsekv/manager.h"
#include "tools/sparsekv/gpu_kernels.h"
#include "tools/sparsekv/page_offload_variant.h"

namespace sparsekv::tools {

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Internal(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ")");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = other.bytes_;
  }
  return *this;
}

StatusOr<DeviceBuffer> DeviceBuffer::Create(size_t bytes) {
  DeviceBuffer b;
  void* p = nullptr;
  if (cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1)); err != cudaSuccess) {
    cudaGetLastError();
    return ResourceExhausted("cudaMalloc of " + std::to_string(bytes) +
                             " bytes: " + cudaGetErrorString(err));
  }
  b.ptr_ = static_cast<std::byte*>(p);
  b.bytes_ = bytes;
  return b;
}

namespace {

constexpr const char* kFill = "FillKVRows";

size_t Int32s(int64_t n) { return static_cast<size_t>(n) * sizeof(int32_t); }

Status UploadPositions(const DeviceBuffer& device, std::span<const int32_t> positions,
                       cudaStream_t stream) {
  return CudaStatus(cudaMemcpyAsync(device.get(), positions.data(), positions.size_bytes(),
                                    cudaMemcpyHostToDevice, stream),
                    "upload of the new tokens' positions");
}

// Every request's KV in HBM: layer l is one buffer of [max_batch * tokens] rows, request b's
// position p at row b * tokens + p.
class FullHbmVariant final : public StepVariant {
 public:
  explicit FullHbmVariant(const VariantSetup& s) : s_(s) {}

  Status Init(cudaStream_t stream) {
    const RequestShape& r = s_.shape;
    for (int32_t l = 0; l < r.layers; ++l) {
      SPARSEKV_ASSIGN_OR_RETURN(
          DeviceBuffer kv, DeviceBuffer::Create(size_t(s_.max_batch) * r.tokens * r.row_bytes));
      for (int32_t b = 0; b < s_.max_batch; ++b) {
        SPARSEKV_RETURN_IF_ERROR(
            CudaStatus(gpu::FillKVRows(kv.get(), r.row_bytes, int64_t{b} * r.tokens, s_.context,
                                       r.row_bytes, b, l, 0, s_.seed, stream),
                       kFill));
      }
      kv_.push_back(std::move(kv));
    }
    SPARSEKV_ASSIGN_OR_RETURN(rows_, DeviceBuffer::Create(Int32s(int64_t{s_.max_batch} * r.top_k)));
    SPARSEKV_ASSIGN_OR_RETURN(positions_, DeviceBuffer::Create(Int32s(s_.max_batch)));
    return Status::Ok();
  }

  KVVariant kind() const override { return KVVariant::kFullHbm; }
  Status Plan(std::span<const int32_t> positions, cudaStream_t stream) override {
    stats_.lookups += double(positions.size()) * s_.shape.layers * s_.shape.top_k;
    return UploadPositions(positions_, positions, stream);
  }
  Status RunLayer(int32_t layer, int32_t batch, const int32_t* topk, const std::byte* new_rows,
                  cudaStream_t stream) override {
    const RequestShape& r = s_.shape;
    TOOLS_CUDA_RETURN(gpu::AppendRows(new_rows, batch, r.row_bytes, r.row_bytes,
                                      positions_.as<int32_t>(), r.tokens, kv_[layer].get(),
                                      stream));
    TOOLS_CUDA_RETURN(
        gpu::PositionsToRows(topk, batch, r.top_k, r.tokens, rows_.as<int32_t>(), nullptr, stream));
    return Status::Ok();
  }
  Status FinishStep(cudaStream_t) override { return Status::Ok(); }
  Status AfterReplay() override { return Status::Ok(); }
  const std::byte* Rows(int32_t layer) const override { return kv_[layer].get(); }
  const int32_t* Indices() const override { return rows_.as<int32_t>(); }
  Status ResetStats(cudaStream_t) override {
    stats_ = {};
    return Status::Ok();
  }
  StatusOr<VariantStats> ReadStats(cudaStream_t) override { return stats_; }

 private:
  VariantSetup s_;
  std::vector<DeviceBuffer> kv_;
  DeviceBuffer rows_;       // [max_batch, top_k] rows of kv_[layer]
  DeviceBuffer positions_;  // [max_batch] the new tokens' positions
  VariantStats stats_;
};

// The manager: host pool (in the arena) + hot cache in HBM.
class SparseKVVariant final : public StepVariant {
 public:
  explicit SparseKVVariant(const VariantSetup& s) : s_(s) {}
  ~SparseKVVariant() override {
    for (cudaEvent_t e : resolved_) cudaEventDestroy(e);
    for (cudaEvent_t e : copied_) cudaEventDestroy(e);
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  }

  Status Init(std::shared_ptr<Backend> host, cudaStream_t stream) {
    const RequestShape& r = s_.shape;
    CacheOptions o;
    o.geometry = KVGeometry::Uniform(r.layers, r.row_bytes);
    o.top_k = r.top_k;
    o.hot_slots = r.hot_slots;
    o.window = r.window;
    o.host_page_tokens = r.page_tokens;
    const int64_t pages = (r.tokens + r.page_tokens - 1) / r.page_tokens;
    o.host_capacity_tokens = pages * r.page_tokens * s_.max_batch;
    o.max_requests = s_.max_batch;
    o.max_context = static_cast<int32_t>(r.tokens);
    o.layers_per_index = s_.layers_per_index;
    o.sort_misses = s_.sort_misses;
    SPARSEKV_ASSIGN_OR_RETURN(manager_, SparseKVCacheManager::Create(o, std::move(host)));
    SPARSEKV_ASSIGN_OR_RETURN(slots_,
                              DeviceBuffer::Create(Int32s(int64_t{s_.max_batch} * r.top_k)));
    if (s_.overlap) {
      SPARSEKV_ASSIGN_OR_RETURN(fill_, DeviceBuffer::Create(size_t(s_.max_batch) * r.top_k));
      TOOLS_CUDA_RETURN(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
      resolved_.resize(o.index_groups());
      copied_.resize(r.layers);
      for (auto* events : {&resolved_, &copied_}) {
        for (cudaEvent_t& e : *events) {
          TOOLS_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        }
      }
    }
    // The prompt goes through the manager's own ingestion, one (request, layer) at a time from
    // a device buffer holding its FillKVRows content.
    SPARSEKV_ASSIGN_OR_RETURN(DeviceBuffer prompt,
                              DeviceBuffer::Create(size_t(s_.context) * r.row_bytes));
    const int32_t max_new = static_cast<int32_t>(r.tokens - s_.context);
    for (int32_t b = 0; b < s_.max_batch; ++b) {
      ids_.push_back(RequestId(b + 1));
      SPARSEKV_RETURN_IF_ERROR(manager_->Admit(ids_[b], s_.context, max_new, stream));
    }
    for (int32_t l = 0; l < r.layers; ++l) {
      for (int32_t b = 0; b < s_.max_batch; ++b) {
        SPARSEKV_RETURN_IF_ERROR(
            CudaStatus(gpu::FillKVRows(prompt.get(), r.row_bytes, 0, s_.context, r.row_bytes, b, l,
                                       0, s_.seed, stream),
                       kFill));
        SPARSEKV_RETURN_IF_ERROR(manager_->IngestPrompt(ids_[b], l, prompt.get(), stream));
      }
    }
    return CudaStatus(cudaStreamSynchronize(stream), "ingest");
  }

  KVVariant kind() const override { return KVVariant::kSparseKV; }
  Status Plan(std::span<const int32_t> positions, cudaStream_t stream) override {
    return manager_->PlanStep(std::span(ids_.data(), positions.size()), stream);
  }
  Status RunLayer(int32_t layer, int32_t, const int32_t* topk, const std::byte* new_rows,
                  cudaStream_t stream) override {
    SPARSEKV_RETURN_IF_ERROR(manager_->AppendToken(layer, new_rows, stream));
    const int32_t n = s_.layers_per_index;
    const bool leader = layer % n == 0;
    if (!s_.overlap) {
      if (leader) {
        SPARSEKV_RETURN_IF_ERROR(
            manager_->ResolveLayer(layer, topk, slots_.as<int32_t>(), nullptr, stream));
      }
      return manager_->CopyMisses(layer, stream);
    }
    if (!leader) return Status::Ok();  // its copy was issued with the group's resolve
    // Resolve on the main stream; every layer of the group copies on the side stream at once,
    // each copy recording when its layer's rows are complete.
    const int32_t group = layer / n;
    SPARSEKV_RETURN_IF_ERROR(manager_->ResolveLayer(layer, topk, slots_.as<int32_t>(),
                                                    fill_.as<uint8_t>(), stream));
    TOOLS_CUDA_RETURN(cudaEventRecord(resolved_[group], stream));
    TOOLS_CUDA_RETURN(cudaStreamWaitEvent(copy_stream_, resolved_[group]));
    for (int32_t l = layer; l < std::min(layer + n, s_.shape.layers); ++l) {
      SPARSEKV_RETURN_IF_ERROR(manager_->CopyMisses(l, copy_stream_));
      TOOLS_CUDA_RETURN(cudaEventRecord(copied_[l], copy_stream_));
    }
    return Status::Ok();
  }
  const uint8_t* FillMask() const override { return s_.overlap ? fill_.as<uint8_t>() : nullptr; }
  Status WaitForRows(int32_t layer, cudaStream_t stream) override {
    if (!s_.overlap) return Status::Ok();
    return CudaStatus(cudaStreamWaitEvent(stream, copied_[layer]), "wait for the miss copy");
  }
  Status FinishStep(cudaStream_t stream) override { return manager_->FinishStep(stream); }
  Status AfterReplay() override { return manager_->FinishReplayedStep(); }
  const std::byte* Rows(int32_t layer) const override { return manager_->HotLayer(layer); }
  const int32_t* Indices() const override { return slots_.as<int32_t>(); }
  Status ResetStats(cudaStream_t stream) override { return manager_->ResetStats(stream); }
  StatusOr<VariantStats> ReadStats(cudaStream_t stream) override {
    SPARSEKV_ASSIGN_OR_RETURN(const CacheStats stats, manager_->ReadStats(stream));
    const LayerStats& t = stats.total;
    return VariantStats{double(t.hits + t.window_hits + t.misses), double(t.misses)};
  }

 private:
  VariantSetup s_;
  std::unique_ptr<SparseKVCacheManager> manager_;
  std::vector<RequestId> ids_;
  DeviceBuffer slots_;  // [max_batch, top_k] layer-wide hot-cache slots
  // Overlap only.
  DeviceBuffer fill_;                    // [max_batch, top_k] ResolveLayer's fill mask
  cudaStream_t copy_stream_ = nullptr;   // the miss copies
  std::vector<cudaEvent_t> resolved_;    // per index group: its resolve is done
  std::vector<cudaEvent_t> copied_;      // per layer: its miss copy is done
};

// No cache: every top-k row of every layer gathered from the host pool into a staging buffer at
// every step. The pool is layer-major, request b's rows contiguous at b * tokens (the layout a
// device copy of a page table would give with whole-request pages).
class NoCacheVariant final : public StepVariant {
 public:
  NoCacheVariant(const VariantSetup& s, std::shared_ptr<Backend> host)
      : s_(s), host_(std::move(host)) {}
  ~NoCacheVariant() override {
    for (std::byte* p : pool_) host_->FreeHost(p);
  }

  Status Init(cudaStream_t stream) {
    const RequestShape& r = s_.shape;
    const int64_t entries = int64_t{s_.max_batch} * r.top_k;
    for (int32_t l = 0; l < r.layers; ++l) {
      SPARSEKV_ASSIGN_OR_RETURN(void* p,
                                host_->AllocateHost(size_t(s_.max_batch) * r.tokens * r.row_bytes));
      pool_.push_back(static_cast<std::byte*>(p));
      for (int32_t b = 0; b < s_.max_batch; ++b) {
        SPARSEKV_RETURN_IF_ERROR(
            CudaStatus(gpu::FillKVRows(pool_[l], r.row_bytes, int64_t{b} * r.tokens, s_.context,
                                       r.row_bytes, b, l, 0, s_.seed, stream),
                       kFill));
      }
    }
    SPARSEKV_ASSIGN_OR_RETURN(staging_, DeviceBuffer::Create(size_t(entries) * r.row_bytes));
    SPARSEKV_ASSIGN_OR_RETURN(host_rows_, DeviceBuffer::Create(Int32s(entries)));
    SPARSEKV_ASSIGN_OR_RETURN(staging_index_, DeviceBuffer::Create(Int32s(entries)));
    SPARSEKV_ASSIGN_OR_RETURN(identity_, DeviceBuffer::Create(Int32s(entries)));
    SPARSEKV_ASSIGN_OR_RETURN(count_, DeviceBuffer::Create(sizeof(int32_t)));
    SPARSEKV_ASSIGN_OR_RETURN(positions_, DeviceBuffer::Create(Int32s(s_.max_batch)));
    std::vector<int32_t> identity(entries);
    std::iota(identity.begin(), identity.end(), 0);
    TOOLS_CUDA_RETURN(cudaMemcpyAsync(identity_.get(), identity.data(), Int32s(entries),
                                      cudaMemcpyHostToDevice, stream));
    return CudaStatus(cudaStreamSynchronize(stream), "no-cache set-up");
  }

  KVVariant kind() const override { return KVVariant::kNoCache; }
  Status Plan(std::span<const int32_t> positions, cudaStream_t stream) override {
    const double lookups = double(positions.size()) * s_.shape.layers * s_.shape.top_k;
    stats_.lookups += lookups;
    stats_.misses += lookups;
    count_host_ = static_cast<int32_t>(positions.size()) * s_.shape.top_k;
    TOOLS_CUDA_RETURN(cudaMemcpyAsync(count_.get(), &count_host_, sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream));
    return UploadPositions(positions_, positions, stream);
  }
  Status RunLayer(int32_t layer, int32_t batch, const int32_t* topk, const std::byte* new_rows,
                  cudaStream_t stream) override {
    const RequestShape& r = s_.shape;
    // The new token is written back first, so that a top-k entry naming it reads it back.
    TOOLS_CUDA_RETURN(gpu::AppendRows(new_rows, batch, r.row_bytes, r.row_bytes,
                                      positions_.as<int32_t>(), r.tokens, pool_[layer], stream));
    TOOLS_CUDA_RETURN(gpu::PositionsToRows(topk, batch, r.top_k, r.tokens, host_rows_.as<int32_t>(),
                                           staging_index_.as<int32_t>(), stream));
    IndexCopyView v{};
    v.src = pool_[layer];
    v.dst = staging_.get();
    v.src_index = host_rows_.as<int32_t>();
    v.dst_index = identity_.as<int32_t>();
    v.count = count_.as<int32_t>();
    v.capacity = s_.max_batch * r.top_k;
    v.row_bytes = r.row_bytes;
    v.src_stride = r.row_bytes;
    v.dst_stride = r.row_bytes;
    v.src_rows = int64_t{s_.max_batch} * r.tokens;
    v.dst_rows = int64_t{s_.max_batch} * r.top_k;
    v.invalid = nullptr;
    return host_->IndexCopy(v, stream);
  }
  Status FinishStep(cudaStream_t) override { return Status::Ok(); }
  Status AfterReplay() override { return Status::Ok(); }
  const std::byte* Rows(int32_t) const override { return staging_.get(); }
  const int32_t* Indices() const override { return staging_index_.as<int32_t>(); }
  Status ResetStats(cudaStream_t) override {
    stats_ = {};
    return Status::Ok();
  }
  StatusOr<VariantStats> ReadStats(cudaStream_t) override { return stats_; }

 private:
  VariantSetup s_;
  std::shared_ptr<Backend> host_;
  std::vector<std::byte*> pool_;  // [layers] of [max_batch * tokens, row] in mapped host memory
  DeviceBuffer staging_;          // [max_batch * top_k, row] one layer's gathered rows
  DeviceBuffer host_rows_;        // [max_batch * top_k] source rows, -1 = padding
  DeviceBuffer staging_index_;    // [max_batch * top_k] attention's indices into staging_
  DeviceBuffer identity_;         // [max_batch * top_k] 0, 1, 2, ...: the copy's destinations
  DeviceBuffer count_;            // device scalar: batch * top_k, entries to copy
  DeviceBuffer positions_;        // [max_batch]
  int32_t count_host_ = 0;        // source of the count upload; outlives the async copy
  VariantStats stats_;
};

}  // namespace

StatusOr<std::unique_ptr<StepVariant>> CreateVariant(KVVariant kind, const VariantSetup& setup,
                                                     std::shared_ptr<Backend> host,
                                                     cudaStream_t stream) {
  switch (kind) {
    case KVVariant::kFullHbm: {
      auto v = std::make_unique<FullHbmVariant>(setup);
      SPARSEKV_RETURN_IF_ERROR(v->Init(stream));
      TOOLS_CUDA_RETURN(cudaStreamSynchronize(stream));
      return std::unique_ptr<StepVariant>(std::move(v));
    }
    case KVVariant::kSparseKV: {
      auto v = std::make_unique<SparseKVVariant>(setup);
      SPARSEKV_RETURN_IF_ERROR(v->Init(std::move(host), stream));
      return std::unique_ptr<StepVariant>(std::move(v));
    }
    case KVVariant::kNoCache: {
      auto v = std::make_unique<NoCacheVariant>(setup, std::move(host));
      SPARSEKV_RETURN_IF_ERROR(v->Init(stream));
      return std::unique_ptr<StepVariant>(std::move(v));
    }
    case KVVariant::kPageOffload:
      return CreatePageOffloadVariant(setup, std::move(host), stream);
  }
  return InvalidArgument("CreateVariant: unknown variant");
}

}  // namespace sparsekv::tools
