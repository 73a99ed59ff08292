#include "tools/sparsekv/bench/gpu_entry_variants.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "sparsekv/index_groups.h"
#include "sparsekv/manager.h"
#include "sparsekv/step_schedule.h"
#include "tools/sparsekv/bench/gpu_kernels.h"

namespace sparsekv::tools {
namespace {

constexpr const char* kFill = "FillKVRows";

size_t Int32s(int64_t n) { return static_cast<size_t>(n) * sizeof(int32_t); }

// What both variants derive from the setup: per layer its kind, cadence and entry capacity, and
// the widths of the scopes.
struct EntryLayout {
  std::vector<LayerKind> kind;
  std::vector<int32_t> cadence;
  std::vector<int32_t> entry_rows;  // per request: tokens / r (0 for window-only)
  // The HCA scope's width: the largest resident count at scope_tokens (>= every entry_rows).
  int32_t every_width = 0;
  int32_t csa_layers = 0;
  int32_t stride = 0;  // entries and raw rows
  int32_t window = 0;  // raw_window

  explicit EntryLayout(const VariantSetup& s) {
    stride = s.shape.row_bytes;
    window = s.raw_window;
    const int64_t scope_tokens = std::max(s.scope_tokens, s.shape.tokens);
    for (const LayerShape& l : s.geometry.layers) {
      kind.push_back(l.kind);
      cadence.push_back(l.kind == LayerKind::kWindowOnly ? 1 : l.entry_tokens);
      const bool entries = l.kind != LayerKind::kWindowOnly;
      entry_rows.push_back(entries ? static_cast<int32_t>(s.shape.tokens / cadence.back()) : 0);
      if (l.kind == LayerKind::kResident) {
        every_width = std::max(every_width, static_cast<int32_t>(scope_tokens / cadence.back()));
      }
      csa_layers += l.kind == LayerKind::kOffloaded;
    }
  }
  int32_t layers() const { return static_cast<int32_t>(kind.size()); }
};

// Rows [0, count) of request b's entries of `layer` (the prompt's), at dst rows from dst_row.
Status FillEntries(std::byte* dst, int64_t dst_row, int32_t count, const EntryLayout& e, int32_t b,
                   int32_t layer, uint64_t seed, cudaStream_t stream) {
  return CudaStatus(
      gpu::FillKVRows(dst, e.stride, dst_row, count, e.stride, b, layer, 0, seed, stream), kFill);
}

// The raw rows of tokens [first, first + count) of request b in `layer`, at dst rows from
// dst_row, in token order.
Status FillRawRows(std::byte* dst, int64_t dst_row, int32_t first, int32_t count,
                   const EntryLayout& e, int32_t b, int32_t layer, uint64_t seed,
                   cudaStream_t stream) {
  return CudaStatus(gpu::FillKVRows(dst, e.stride, dst_row, count, e.stride, b,
                                    kRawRowLayer + layer, first, seed, stream),
                    kFill);
}

// Every request's entries and raw windows in HBM (entry_scopes.h's layout).
class FullHbmEntryVariant final : public StepVariant {
 public:
  explicit FullHbmEntryVariant(const VariantSetup& s) : s_(s), e_(s) {}

  Status Init(cudaStream_t stream) {
    const int32_t w = e_.window;
    const int32_t valid = std::min(s_.context, w);
    const int32_t oldest = s_.context - valid;
    for (int32_t l = 0; l < e_.layers(); ++l) {
      DeviceBuffer entries;
      if (e_.entry_rows[l] > 0) {
        SPARSEKV_ASSIGN_OR_RETURN(
            entries, DeviceBuffer::Allocate(size_t(s_.max_batch) * e_.entry_rows[l] * e_.stride,
                                            kBenchMemory));
        for (int32_t b = 0; b < s_.max_batch; ++b) {
          SPARSEKV_RETURN_IF_ERROR(
              FillEntries(entries.get<std::byte>(), int64_t{b} * e_.entry_rows[l],
                          s_.context / e_.cadence[l], e_, b, l, s_.seed, stream));
        }
      }
      SPARSEKV_ASSIGN_OR_RETURN(
          DeviceBuffer ring,
          DeviceBuffer::Allocate(size_t(s_.max_batch) * w * e_.stride, kBenchMemory));
      // Token t in ring slot t mod w: at most two runs of consecutive slots.
      const int32_t slot = oldest % w;
      const int32_t first_run = std::min(valid, w - slot);
      for (int32_t b = 0; b < s_.max_batch && valid > 0; ++b) {
        SPARSEKV_RETURN_IF_ERROR(FillRawRows(ring.get<std::byte>(), int64_t{b} * w + slot, oldest,
                                             first_run, e_, b, l, s_.seed, stream));
        if (valid > first_run) {
          SPARSEKV_RETURN_IF_ERROR(FillRawRows(ring.get<std::byte>(), int64_t{b} * w,
                                               oldest + first_run, valid - first_run, e_, b, l,
                                               s_.seed, stream));
        }
      }
      entries_.push_back(std::move(entries));
      rings_.push_back(std::move(ring));
    }
    SPARSEKV_ASSIGN_OR_RETURN(
        csa_rows_,
        DeviceBuffer::Allocate(Int32s(int64_t{s_.max_batch} * s_.shape.top_k), kBenchMemory));
    SPARSEKV_ASSIGN_OR_RETURN(
        every_, DeviceBuffer::Allocate(Int32s(int64_t{s_.max_batch} * std::max(e_.every_width, 1)),
                                       kBenchMemory));
    SPARSEKV_ASSIGN_OR_RETURN(
        window_index_, DeviceBuffer::Allocate(Int32s(int64_t{s_.max_batch} * w), kBenchMemory));
    SPARSEKV_ASSIGN_OR_RETURN(positions_,
                              DeviceBuffer::Allocate(Int32s(s_.max_batch), kBenchMemory));
    return CudaStatus(cudaStreamSynchronize(stream), "full-hbm set-up");
  }

  KVVariant kind() const override { return KVVariant::kFullHbm; }
  Status Plan(std::span<const int32_t> positions, cudaStream_t stream) override {
    stats_.lookups += double(positions.size()) * e_.csa_layers * s_.shape.top_k;
    return CudaStatus(cudaMemcpyAsync(positions_.get(), positions.data(), positions.size_bytes(),
                                      cudaMemcpyHostToDevice, stream),
                      "upload of the new tokens' positions");
  }
  Status RunLayer(int32_t layer, int32_t batch, const int32_t* topk, const std::byte* new_rows,
                  cudaStream_t stream) override {
    const LayerKind kind = e_.kind[layer];
    const int32_t* positions = positions_.get<int32_t>();
    std::byte* entries =
        kind == LayerKind::kWindowOnly ? nullptr : entries_[layer].get<std::byte>();
    SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::AppendEntryRows(
        new_rows, batch, e_.stride, e_.stride, positions, e_.cadence[layer], e_.entry_rows[layer],
        entries, e_.window, rings_[layer].get<std::byte>(), stream));
    if (kind == LayerKind::kOffloaded) {
      SPARSEKV_CUDA_RETURN_IF_ERROR(
          gpu::PositionsToRows(topk, batch, s_.shape.top_k, e_.entry_rows[layer],
                               csa_rows_.get<int32_t>(), nullptr, stream));
    }
    const bool every = kind == LayerKind::kResident;
    SPARSEKV_CUDA_RETURN_IF_ERROR(gpu::EntryScopeIndices(
        positions, batch, every ? e_.every_width : 0, e_.cadence[layer], e_.entry_rows[layer],
        every ? every_.get<int32_t>() : nullptr, e_.window, window_index_.get<int32_t>(), stream));
    return Status::Ok();
  }
  StatusOr<EntryScopes> Scopes(int32_t layer, int32_t first) const override {
    EntryScopes s;
    s.selected.format = s_.format;  // width 0 for a window-only layer
    s.window = {rings_[layer].get<std::byte>(), e_.stride, s_.format,
                window_index_.get<int32_t>() + int64_t{first} * e_.window, e_.window};
    if (e_.kind[layer] == LayerKind::kOffloaded) {
      s.selected = {entries_[layer].get<std::byte>(), e_.stride, s_.format,
                    csa_rows_.get<int32_t>() + int64_t{first} * s_.shape.top_k, s_.shape.top_k};
    } else if (e_.kind[layer] == LayerKind::kResident) {
      s.selected = {entries_[layer].get<std::byte>(), e_.stride, s_.format,
                    every_.get<int32_t>() + int64_t{first} * e_.every_width, e_.every_width};
    }
    return s;
  }
  Status FinishStep(cudaStream_t) override { return Status::Ok(); }
  Status AfterReplay(double) override { return Status::Ok(); }
  const std::byte* Rows(int32_t) const override { return nullptr; }
  const int32_t* Indices() const override { return nullptr; }
  Status ResetStats(cudaStream_t) override {
    stats_ = {};
    return Status::Ok();
  }
  StatusOr<VariantStats> ReadStats(cudaStream_t) override { return stats_; }

 private:
  VariantSetup s_;
  EntryLayout e_;
  std::vector<DeviceBuffer> entries_;  // per layer: [max_batch * entry_rows, stride]; none for
                                       // window-only
  std::vector<DeviceBuffer> rings_;    // per layer: [max_batch * raw_window, stride]
  DeviceBuffer csa_rows_;              // [max_batch, top_k] rows of a CSA layer's entries
  DeviceBuffer every_;                 // [max_batch, every_width] an HCA layer's every entry
  DeviceBuffer window_index_;          // [max_batch, raw_window] the window's ring rows
  DeviceBuffer positions_;             // [max_batch] the new tokens' positions
  VariantStats stats_;
};

// The manager over the layer kinds, driven through its StepSchedule; attention reads the store's
// entries and windows in place (DenseEntriesScope, RawWindowScope), no copy.
class SparseKVEntryVariant final : public StepVariant {
 public:
  explicit SparseKVEntryVariant(const VariantSetup& s) : s_(s), e_(s) {}

  Status Init(std::shared_ptr<Backend> host, cudaStream_t stream) {
    const RequestShape& r = s_.shape;
    CacheOptions o = SparseKVManagerOptions(s_);
    o.geometry = s_.geometry;
    o.raw_window = s_.raw_window;
    // The host pool's pages hold page_tokens entries of the offloaded layers' cadence (as
    // BenchCacheOptions sizes the CPU run's).
    int64_t unit = r.page_tokens;
    for (int32_t l = 0; l < e_.layers(); ++l) {
      if (e_.kind[l] == LayerKind::kOffloaded) unit = int64_t{r.page_tokens} * e_.cadence[l];
    }
    o.host_capacity_tokens = (r.tokens + unit - 1) / unit * unit * s_.max_batch;
    o.layers_per_index = 1;
    o.indexer_key_bytes = 0;  // charged, not held (the engine's)
    SPARSEKV_ASSIGN_OR_RETURN(manager_, SparseKVCacheManager::Create(o, std::move(host)));
    ScheduleOptions so;
    if (!s_.auto_schedule) {
      so.fixed = StepChoice{s_.crosslayer_prefetch, s_.copy_chunk_rows, 0, false, 0};
    }
    so.trials = 2;
    SPARSEKV_ASSIGN_OR_RETURN(schedule_, StepSchedule::Create(*manager_, so));
    for (int32_t l = 0; l < e_.layers(); ++l) {
      SPARSEKV_ASSIGN_OR_RETURN(const RawWindowView w, manager_->RawWindow(l));
      window_views_.push_back(w);
      DenseEntriesView entries{};
      if (e_.kind[l] == LayerKind::kResident) {
        SPARSEKV_ASSIGN_OR_RETURN(entries, manager_->DenseEntries(l));
      }
      entry_views_.push_back(entries);
    }
    SPARSEKV_ASSIGN_OR_RETURN(
        slots_, DeviceBuffer::Allocate(Int32s(int64_t{s_.max_batch} * r.top_k), kBenchMemory));
    for (int32_t b = 0; b < s_.max_batch; ++b) ids_.push_back(RequestId(b + 1));
    return AdmitRequests(stream);
  }

  KVVariant kind() const override { return KVVariant::kSparseKV; }
  Status Plan(std::span<const int32_t> positions, cudaStream_t stream) override {
    const std::span<const RequestId> batch(ids_.data(), positions.size());
    return schedule_->PlanStep(batch, stream);
  }
  Status RunLayerAndAttend(int32_t layer, int32_t /*batch*/, const int32_t* topk,
                           const std::byte* new_rows, const AttendFn& attend,
                           cudaStream_t stream) override {
    LayerWork work;
    work.new_rows = e_.kind[layer] == LayerKind::kWindowOnly ? nullptr : new_rows;
    work.window_rows = new_rows;  // the token's raw row: the same bytes as its entry
    if (e_.kind[layer] == LayerKind::kOffloaded) {
      work.topk = topk;
      work.slots = slots_.get<int32_t>();
    }
    return schedule_->RunLayer(layer, work, attend, stream);
  }
  Status RunLayer(int32_t, int32_t, const int32_t*, const std::byte*, cudaStream_t) override {
    return FailedPrecondition(
        "sparsekv bench: sparsekv runs each layer with its attention through the step schedule "
        "(RunLayerAndAttend)");
  }
  StatusOr<EntryScopes> Scopes(int32_t layer, int32_t first) const override {
    EntryScopes s;
    s.selected.format = s_.format;  // width 0 for a window-only layer
    s.window = RawWindowScope(window_views_[layer], s_.format, first);
    if (e_.kind[layer] == LayerKind::kOffloaded) {
      s.selected = {manager_->HotLayer(layer), e_.stride, s_.format,
                    slots_.get<int32_t>() + int64_t{first} * s_.shape.top_k, s_.shape.top_k};
    } else if (e_.kind[layer] == LayerKind::kResident) {
      s.selected = DenseEntriesScope(entry_views_[layer], s_.format, first);
    }
    return s;
  }
  std::string GraphKey() const override { return schedule_->choice().ToString(); }
  Status FinishStep(cudaStream_t stream) override { return schedule_->FinishStep(stream); }
  Status AfterReplay(double seconds) override { return schedule_->FinishReplayedStep(seconds); }
  const std::byte* Rows(int32_t) const override { return nullptr; }
  const int32_t* Indices() const override { return nullptr; }
  Status ResetStats(cudaStream_t stream) override { return manager_->ResetStats(stream); }
  StatusOr<VariantStats> ReadStats(cudaStream_t stream) override {
    SPARSEKV_ASSIGN_OR_RETURN(const CacheStats stats, manager_->ReadStats(stream));
    const LayerStats& t = stats.total;
    VariantStats out;
    out.lookups = double(t.hits + t.window_hits + t.misses + t.resident_hits);
    out.misses = double(t.misses);
    out.prefetched = double(stats.prefetch_rows);  // one layer per index group
    out.schedule = schedule_->choice().ToString();
    out.schedule_reason = schedule_->reason();
    return out;
  }

 private:
  // Every request admitted, and its prompt ingested layer by layer from device buffers of its
  // FillKVRows content: the entries, and the newest raw rows oldest first.
  Status AdmitRequests(cudaStream_t stream) {
    const int32_t max_new = static_cast<int32_t>(s_.shape.tokens - s_.context);
    int32_t most_entries = 1;
    for (int32_t l = 0; l < e_.layers(); ++l) {
      if (e_.kind[l] != LayerKind::kWindowOnly) {
        most_entries = std::max(most_entries, s_.context / e_.cadence[l]);
      }
    }
    const int32_t valid = std::min(s_.context, e_.window);
    SPARSEKV_ASSIGN_OR_RETURN(
        DeviceBuffer entries,
        DeviceBuffer::Allocate(size_t(most_entries) * e_.stride, kBenchMemory));
    SPARSEKV_ASSIGN_OR_RETURN(
        DeviceBuffer raw,
        DeviceBuffer::Allocate(size_t(std::max(valid, 1)) * e_.stride, kBenchMemory));
    for (int32_t b = 0; b < s_.max_batch; ++b) {
      SPARSEKV_RETURN_IF_ERROR(manager_->Admit(ids_[b], s_.context, max_new, stream));
    }
    for (int32_t l = 0; l < e_.layers(); ++l) {
      const int32_t count = e_.kind[l] == LayerKind::kWindowOnly ? 0 : s_.context / e_.cadence[l];
      for (int32_t b = 0; b < s_.max_batch; ++b) {
        if (count > 0) {
          SPARSEKV_RETURN_IF_ERROR(
              FillEntries(entries.get<std::byte>(), 0, count, e_, b, l, s_.seed, stream));
        }
        SPARSEKV_RETURN_IF_ERROR(FillRawRows(raw.get<std::byte>(), 0, s_.context - valid, valid, e_,
                                             b, l, s_.seed, stream));
        const PromptRows rows{count > 0 ? entries.get() : nullptr, raw.get()};
        SPARSEKV_RETURN_IF_ERROR(manager_->IngestPrompt(ids_[b], l, rows, stream));
      }
    }
    return CudaStatus(cudaStreamSynchronize(stream), "ingest");
  }

  VariantSetup s_;
  EntryLayout e_;
  std::unique_ptr<SparseKVCacheManager> manager_;
  std::unique_ptr<StepSchedule> schedule_;
  std::vector<RequestId> ids_;
  std::vector<DenseEntriesView> entry_views_;  // per layer (resident layers only)
  std::vector<RawWindowView> window_views_;    // per layer
  DeviceBuffer slots_;                         // [max_batch, top_k] layer-wide hot-cache slots
};

}  // namespace

StatusOr<std::unique_ptr<StepVariant>> CreateEntryVariant(KVVariant kind, const VariantSetup& setup,
                                                          std::shared_ptr<Backend> host,
                                                          cudaStream_t stream) {
  if (setup.raw_window < 1) {
    return InvalidArgument("CreateEntryVariant: DeepSeek-V4's layers need raw_window >= 1");
  }
  if (kind == KVVariant::kFullHbm) {
    auto v = std::make_unique<FullHbmEntryVariant>(setup);
    SPARSEKV_RETURN_IF_ERROR(v->Init(stream));
    return std::unique_ptr<StepVariant>(std::move(v));
  }
  if (kind == KVVariant::kSparseKV) {
    auto v = std::make_unique<SparseKVEntryVariant>(setup);
    SPARSEKV_RETURN_IF_ERROR(v->Init(std::move(host), stream));
    return std::unique_ptr<StepVariant>(std::move(v));
  }
  return InvalidArgument(std::string("CreateEntryVariant: ") + std::string(VariantName(kind)) +
                         " is not defined for DeepSeek-V4's layer kinds (full-hbm and sparsekv)");
}

}  // namespace sparsekv::tools
