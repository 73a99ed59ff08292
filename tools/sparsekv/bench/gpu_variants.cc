#include "tools/sparsekv/bench/gpu_variants.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "sparsekv/index_groups.h"
#include "sparsekv/manager.h"
#include "sparsekv/peer_tier.h"
#include "tools/sparsekv/bench/gpu_entry_variants.h"
#include "tools/sparsekv/bench/gpu_kernels.h"
#include "tools/sparsekv/bench/page_offload_variant.h"

namespace sparsekv::tools {

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
          DeviceBuffer kv,
          DeviceBuffer::Allocate(size_t(s_.max_batch) * r.tokens * r.row_bytes, kBenchMemory));
      for (int32_t b = 0; b < s_.max_batch; ++b) {
        SPARSEKV_RETURN_IF_ERROR(
            CudaStatus(gpu::FillKVRows(kv.get<std::byte>(), r.row_bytes, int64_t{b} * r.tokens,
                                       s_.context, r.row_bytes, b, l, 0, s_.seed, stream),
                       kFill));
      }
      kv_.push_back(std::move(kv));
    }
    SPARSEKV_ASSIGN_OR_RETURN(
        rows_, DeviceBuffer::Allocate(Int32s(int64_t{s_.max_batch} * r.top_k), kBenchMemory));
    SPARSEKV_ASSIGN_OR_RETURN(positions_,
                              DeviceBuffer::Allocate(Int32s(s_.max_batch), kBenchMemory));
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
    SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::AppendRows(new_rows, batch, r.row_bytes, r.row_bytes,
                                                  positions_.get<int32_t>(), r.tokens,
                                                  kv_[layer].get<std::byte>(), stream));
    SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::PositionsToRows(topk, batch, r.top_k, r.tokens,
                                                       rows_.get<int32_t>(), nullptr, stream));
    return Status::Ok();
  }
  Status FinishStep(cudaStream_t) override { return Status::Ok(); }
  Status AfterReplay(double) override { return Status::Ok(); }
  const std::byte* Rows(int32_t layer) const override { return kv_[layer].get<std::byte>(); }
  const int32_t* Indices() const override { return rows_.get<int32_t>(); }
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

  Status Init(std::shared_ptr<Backend> host, cudaStream_t stream) {
    const RequestShape& r = s_.shape;
    CacheOptions o = SparseKVManagerOptions(s_);
    o.geometry =
        s_.geometry.layers.empty() ? KVGeometry::Uniform(r.layers, r.row_bytes) : s_.geometry;
    const int64_t pages = (r.tokens + r.page_tokens - 1) / r.page_tokens;
    o.host_capacity_tokens = pages * r.page_tokens * s_.max_batch;
    o.layers_per_index = s_.layers_per_index;
    o.share_repeated_positions = s_.queries > 1;
    o.hybrid_residency = s_.hybrid;
    o.device_budget_bytes = s_.device_budget_bytes;
    // With hybrid residency the manager keeps the indexer keys too, so that the memory of the
    // requests that are not running is not tied up in their keys.
    o.indexer_key_bytes = s_.hybrid ? r.indexer_key_bytes : 0;
    SPARSEKV_ASSIGN_OR_RETURN(manager_, SparseKVCacheManager::Create(o, std::move(host)));
    ScheduleOptions so;
    if (!s_.auto_schedule) {
      so.fixed = StepChoice{s_.crosslayer_prefetch, s_.copy_chunk_rows, 0, s_.planned_copy >= 0,
                            std::max(s_.planned_copy, 0)};
      // Its graphs are keyed by choice (GraphKey): an all-resident step may skip its miss copies.
      so.fixed_yields_to_resident = true;
    }
    // 12 candidates with one layer per index group: 24 steps, within the calibrated run's 26
    // warm-up steps; with index groups of several layers the planned copy triples them (72 steps).
    so.trials = 2;
    if (s_.auto_schedule && s_.queries > 1) {
      // Attention over a slice of requests does not split their query rows.
      for (const StepChoice& c : AllowedChoices(manager_->options())) {
        if (c.chunk_rows == 0) so.candidates.push_back(c);
      }
    }
    SPARSEKV_ASSIGN_OR_RETURN(schedule_, StepSchedule::Create(*manager_, so));
    if (s_.peer_device >= 0) {
      // Every request's prompt rows are also lent by a region on the peer device, at rows
      // [b * context, (b + 1) * context) for request b (AdmitRequests).
      SPARSEKV_RETURN_IF_ERROR(AttachPeerTier(*manager_));
      int device = 0;
      SPARSEKV_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
      SPARSEKV_ASSIGN_OR_RETURN(peer_backend_, CreateCudaBackend(s_.peer_device));
      SPARSEKV_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
      SPARSEKV_ASSIGN_OR_RETURN(
          region_, PeerRegion::Create(o.geometry, s_.max_batch * s_.context, peer_backend_));
      SPARSEKV_ASSIGN_OR_RETURN(
          region_index_, ImportPeerRegion(*manager_, region_->descriptor().Serialize(), stream));
    }
    SPARSEKV_ASSIGN_OR_RETURN(
        slots_, DeviceBuffer::Allocate(Int32s(int64_t{s_.max_batch} * r.top_k), kBenchMemory));
    if (o.indexer_key_bytes > 0) {
      // The new tokens' keys (their content is not read by the benchmark).
      SPARSEKV_ASSIGN_OR_RETURN(
          new_keys_, DeviceBuffer::Allocate(size_t(s_.max_batch) * o.indexer_key_bytes * r.layers,
                                            kBenchMemory));
      SPARSEKV_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(new_keys_.get(), 0x3c, new_keys_.bytes(), stream));
    }
    for (int32_t b = 0; b < s_.max_batch; ++b) ids_.push_back(RequestId(b + 1));
    // With hybrid residency requests are admitted as the batch grows (SetLiveBatch), as an engine
    // admits them; otherwise all at once.
    return s_.hybrid ? Status::Ok() : AdmitRequests(s_.max_batch, stream);
  }

  // Admits and ingests requests [admitted_, n): the prompt goes through the manager's own
  // ingestion, one (request, layer) at a time from a device buffer holding its FillKVRows
  // content (and, with indexer keys, some of its bytes as the keys).
  Status AdmitRequests(int32_t n, cudaStream_t stream) {
    if (n <= admitted_) return Status::Ok();
    const RequestShape& r = s_.shape;
    SPARSEKV_ASSIGN_OR_RETURN(
        DeviceBuffer prompt,
        DeviceBuffer::Allocate(size_t(s_.context) * r.row_bytes, kBenchMemory));
    const int32_t max_new = static_cast<int32_t>(r.tokens - s_.context);
    const CacheOptions& o = manager_->options();
    const bool keys = o.indexer_key_bytes > 0;
    for (int32_t b = admitted_; b < n; ++b) {
      SPARSEKV_RETURN_IF_ERROR(manager_->Admit(ids_[b], s_.context, max_new, stream));
    }
    for (int32_t l = 0; l < r.layers; ++l) {
      for (int32_t b = admitted_; b < n; ++b) {
        SPARSEKV_RETURN_IF_ERROR(
            CudaStatus(gpu::FillKVRows(prompt.get<std::byte>(), r.row_bytes, 0, s_.context,
                                       r.row_bytes, b, l, 0, s_.seed, stream),
                       kFill));
        SPARSEKV_RETURN_IF_ERROR(manager_->IngestPrompt(ids_[b], l, prompt.get(), stream));
        if (region_ != nullptr) {
          SPARSEKV_RETURN_IF_ERROR(
              manager_->backend().CopyAsync(region_->row(l, b * s_.context), prompt.get(),
                                            size_t(s_.context) * r.row_bytes, stream));
        }
        if (keys && o.geometry.layers[l].indexer_keys) {  // only where the layer has keys
          SPARSEKV_RETURN_IF_ERROR(manager_->IngestIndexerKeys(ids_[b], l, prompt.get(), stream));
        }
      }
    }
    for (int32_t b = admitted_; region_ != nullptr && b < n; ++b) {
      SPARSEKV_RETURN_IF_ERROR(
          MapPeerRows(*manager_, ids_[b], region_index_, b * s_.context, s_.context, stream));
    }
    admitted_ = n;
    return CudaStatus(cudaStreamSynchronize(stream), "ingest");
  }

  KVVariant kind() const override { return KVVariant::kSparseKV; }
  Status Plan(std::span<const int32_t> positions, cudaStream_t stream) override {
    const std::span<const RequestId> batch(ids_.data(), positions.size());
    return schedule_->PlanStep(batch, stream);
  }
  // Through the schedule: it appends, resolves, prefetches, copies and calls `attend` as the
  // rows come in.
  Status RunLayerAndAttend(int32_t layer, int32_t /*batch*/, const int32_t* topk,
                           const std::byte* new_rows, const AttendFn& attend,
                           cudaStream_t stream) override {
    const LayerWork work{new_rows, NewKeys(layer), topk, 0, slots_.get<int32_t>()};
    return schedule_->RunLayer(layer, work, attend, stream);
  }
  std::string GraphKey() const override { return schedule_->choice().ToString(); }
  // The schedule runs a layer together with its attention (RunLayerAndAttend): a layer without
  // one is not a step an engine takes.
  Status RunLayer(int32_t /*layer*/, int32_t /*batch*/, const int32_t* /*topk*/,
                  const std::byte* /*new_rows*/, cudaStream_t /*stream*/) override {
    return FailedPrecondition(
        "sparsekv bench: sparsekv runs each layer with its attention through the step schedule "
        "(RunLayerAndAttend)");
  }
  Status FinishStep(cudaStream_t stream) override { return schedule_->FinishStep(stream); }
  Status AfterReplay(double seconds) override { return schedule_->FinishReplayedStep(seconds); }
  const std::byte* Rows(int32_t layer) const override { return manager_->HotLayer(layer); }
  const int32_t* Indices() const override { return slots_.get<int32_t>(); }
  Status SetLiveBatch(int32_t batch, cudaStream_t stream) override {
    if (!s_.hybrid) return Status::Ok();
    // Requests past the batch end (released, as finished requests are); when the batch grows,
    // new ones are admitted (the bench starts them at the context length again).
    for (int32_t b = batch; b < admitted_; ++b)
      SPARSEKV_RETURN_IF_ERROR(manager_->Release(ids_[b]));
    admitted_ = std::min(admitted_, batch);
    SPARSEKV_RETURN_IF_ERROR(AdmitRequests(batch, stream));
    // Resumed requests are resident where their pages fit; earlier ones may be promoted now
    // that idle ones gave their blocks back.
    for (int32_t b = 0; b < batch; ++b) {
      if (manager_->IsResident(ids_[b])) continue;
      const Status promoted = manager_->Promote(ids_[b], stream);
      if (promoted.code() == StatusCode::kResourceExhausted) break;
      SPARSEKV_RETURN_IF_ERROR(promoted);
    }
    return CudaStatus(cudaStreamSynchronize(stream), "residency");
  }
  Status ResetStats(cudaStream_t stream) override { return manager_->ResetStats(stream); }
  StatusOr<VariantStats> ReadStats(cudaStream_t stream) override {
    SPARSEKV_ASSIGN_OR_RETURN(const CacheStats stats, manager_->ReadStats(stream));
    const LayerStats& t = stats.total;
    // Prefetched rows are counted once per index group and copied into each of its layers: the
    // mean group size (exact when the groups are equal).
    const IndexGroups groups(manager_->options());
    VariantStats out;
    out.lookups = double(t.hits + t.window_hits + t.misses + t.resident_hits);
    out.misses = double(t.misses);
    out.prefetched = double(stats.prefetch_rows) * groups.layers() / groups.count();
    out.resident_requests = stats.resident_requests;
    out.schedule = schedule_->choice().ToString();
    out.schedule_reason = schedule_->reason();
    return out;
  }

 private:
  VariantSetup s_;
  // The peer tier (peer_device >= 0): the lender's backend and region, destroyed after the
  // manager (members are destroyed in reverse order).
  std::shared_ptr<Backend> peer_backend_;
  std::unique_ptr<PeerRegion> region_;
  int32_t region_index_ = -1;
  std::unique_ptr<SparseKVCacheManager> manager_;
  std::vector<RequestId> ids_;
  int32_t admitted_ = 0;    // requests [0, admitted_) were admitted and ingested
  std::vector<bool> live_;  // per admitted request: on the device (not retracted)
  DeviceBuffer new_keys_;   // with indexer keys: [layers, max_batch, indexer_key_bytes]
  DeviceBuffer slots_;      // [max_batch, top_k] layer-wide hot-cache slots
  std::unique_ptr<StepSchedule> schedule_;
  // The new tokens' keys of `layer`; null where the manager keeps none or the layer has none.
  const std::byte* NewKeys(int32_t layer) const {
    if (new_keys_.get() == nullptr || !manager_->options().geometry.layers[layer].indexer_keys) {
      return nullptr;
    }
    return new_keys_.get<std::byte>() +
           size_t(layer) * s_.max_batch * manager_->options().indexer_key_bytes;
  }
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
    SPARSEKV_ASSIGN_OR_RETURN(staging_,
                              DeviceBuffer::Allocate(size_t(entries) * r.row_bytes, kBenchMemory));
    SPARSEKV_ASSIGN_OR_RETURN(host_rows_, DeviceBuffer::Allocate(Int32s(entries), kBenchMemory));
    SPARSEKV_ASSIGN_OR_RETURN(staging_index_,
                              DeviceBuffer::Allocate(Int32s(entries), kBenchMemory));
    SPARSEKV_ASSIGN_OR_RETURN(identity_, DeviceBuffer::Allocate(Int32s(entries), kBenchMemory));
    SPARSEKV_ASSIGN_OR_RETURN(count_, DeviceBuffer::Allocate(sizeof(int32_t), kBenchMemory));
    SPARSEKV_ASSIGN_OR_RETURN(positions_,
                              DeviceBuffer::Allocate(Int32s(s_.max_batch), kBenchMemory));
    std::vector<int32_t> identity(entries);
    std::iota(identity.begin(), identity.end(), 0);
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(identity_.get(), identity.data(), Int32s(entries),
                                                  cudaMemcpyHostToDevice, stream));
    return CudaStatus(cudaStreamSynchronize(stream), "no-cache set-up");
  }

  KVVariant kind() const override { return KVVariant::kNoCache; }
  Status Plan(std::span<const int32_t> positions, cudaStream_t stream) override {
    const double lookups = double(positions.size()) * s_.shape.layers * s_.shape.top_k;
    stats_.lookups += lookups;
    stats_.misses += lookups;
    count_host_ = static_cast<int32_t>(positions.size()) * s_.shape.top_k;
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(count_.get(), &count_host_, sizeof(int32_t),
                                                  cudaMemcpyHostToDevice, stream));
    return UploadPositions(positions_, positions, stream);
  }
  Status RunLayer(int32_t layer, int32_t batch, const int32_t* topk, const std::byte* new_rows,
                  cudaStream_t stream) override {
    const RequestShape& r = s_.shape;
    // The new token is written back first, so that a top-k entry naming it reads it back.
    SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::AppendRows(new_rows, batch, r.row_bytes, r.row_bytes,
                                                  positions_.get<int32_t>(), r.tokens, pool_[layer],
                                                  stream));
    SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::PositionsToRows(topk, batch, r.top_k, r.tokens,
                                                       host_rows_.get<int32_t>(),
                                                       staging_index_.get<int32_t>(), stream));
    IndexCopyView v{};
    v.src = pool_[layer];
    v.dst = staging_.get<std::byte>();
    v.src_index = host_rows_.get<int32_t>();
    v.dst_index = identity_.get<int32_t>();
    v.count = count_.get<int32_t>();
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
  Status AfterReplay(double) override { return Status::Ok(); }
  const std::byte* Rows(int32_t) const override { return staging_.get<std::byte>(); }
  const int32_t* Indices() const override { return staging_index_.get<int32_t>(); }
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

// With --schedule auto and no --copy-chunk-rows: the chunks the schedule may copy by.
constexpr int32_t kAutoChunkRows = 8;

CacheOptions SparseKVManagerOptions(const VariantSetup& s) {
  const RequestShape& r = s.shape;
  CacheOptions o = s.cache_base;
  o.top_k = r.top_k;
  o.hot_slots = r.hot_slots;
  o.window = r.window;
  o.host_page_tokens = r.page_tokens;
  o.max_requests = s.max_batch;
  o.max_host_requests = 0;
  o.max_batch = 0;
  o.max_context = static_cast<int32_t>(r.tokens);
  o.sort_misses = s.sort_misses;
  o.sort_misses_min_batch = s.sort_misses_min_batch;
  o.copy_blocks = s.copy_blocks;
  o.fused_copy_min_batch = s.fused_copy_min_batch;
  o.prefetch_copy_blocks = s.prefetch_copy_blocks;
  // Every step runs through the library's StepSchedule, as an engine's would.
  o.copy_chunk_rows =
      s.copy_chunk_rows > 0 || !s.auto_schedule ? s.copy_chunk_rows : kAutoChunkRows;
  o.copy_strategy = s.copy_strategy;
  o.max_prefetch = s.crosslayer_prefetch || s.auto_schedule ? r.top_k : 0;
  return o;
}

StatusOr<std::unique_ptr<StepVariant>> CreateVariant(KVVariant kind, const VariantSetup& setup,
                                                     std::shared_ptr<Backend> host,
                                                     cudaStream_t stream) {
  const bool entry_layers =
      setup.raw_window > 0 ||
      std::any_of(setup.geometry.layers.begin(), setup.geometry.layers.end(),
                  [](const LayerShape& l) { return l.kind != LayerKind::kOffloaded; });
  if (entry_layers) return CreateEntryVariant(kind, setup, std::move(host), stream);
  switch (kind) {
    case KVVariant::kFullHbm: {
      auto v = std::make_unique<FullHbmVariant>(setup);
      SPARSEKV_RETURN_IF_ERROR(v->Init(stream));
      SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
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
