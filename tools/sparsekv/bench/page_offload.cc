#include "tools/sparsekv/bench/page_offload.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

namespace sparsekv::tools {
namespace {

constexpr int32_t kScalarBatch = 0;  // scalars_[0]: requests in the step (also the append count)
constexpr int32_t kScalarCacheMisses = 1;
constexpr int32_t kScalarStagingMisses = 2;

class CpuPageOffloadOps final : public PageOffloadOps {
 public:
  Status PageIds(const int32_t* topk, int32_t entries, int32_t page_tokens, int32_t* page_ids,
                 StreamHandle) override {
    for (int32_t i = 0; i < entries; ++i) page_ids[i] = topk[i] < 0 ? -1 : topk[i] / page_tokens;
    return Status::Ok();
  }
  Status Overflow(const int32_t* page_ids, const int32_t* cache_slots, int32_t entries,
                  int32_t* overflow, StreamHandle) override {
    for (int32_t i = 0; i < entries; ++i) {
      overflow[i] = page_ids[i] >= 0 && cache_slots[i] < 0 ? page_ids[i] : -1;
    }
    return Status::Ok();
  }
  Status Rows(const int32_t* topk, const int32_t* cache_slots, const int32_t* staging_slots,
              int32_t entries, int32_t page_tokens, int64_t first_cache_row,
              int64_t first_staging_row, int32_t* rows, StreamHandle) override {
    for (int32_t i = 0; i < entries; ++i) {
      const int32_t p = topk[i];
      int64_t row = -1;
      if (p >= 0 && cache_slots[i] >= 0) {
        row = first_cache_row + int64_t{cache_slots[i]} * page_tokens + p % page_tokens;
      } else if (p >= 0 && staging_slots[i] >= 0) {
        row = first_staging_row + int64_t{staging_slots[i]} * page_tokens + p % page_tokens;
      }
      rows[i] = static_cast<int32_t>(row);
    }
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<PageOffloadOps> CreateCpuPageOffloadOps() {
  return std::make_unique<CpuPageOffloadOps>();
}

void PageOffloadCache::Freer::operator()(void* p) const {
  if (p != nullptr) backend->FreeDevice(p);
}

PageOffloadCache::PageOffloadCache(const RequestShape& shape, int32_t max_batch,
                                   std::shared_ptr<Backend> backend,
                                   std::unique_ptr<PageOffloadOps> ops)
    : shape_(shape),
      max_batch_(max_batch),
      q_(shape.offload_page_tokens),
      pages_(OffloadPages(shape)),
      page_bytes_(int64_t{shape.offload_page_tokens} * shape.row_bytes),
      layer_cache_pages_(int64_t{max_batch} * (pages_.cached + 1)),
      backend_(std::move(backend)),
      ops_(std::move(ops)) {}

PageOffloadCache::~PageOffloadCache() {
  for (std::byte* p : host_) backend_->FreeHost(p);
}

StatusOr<std::unique_ptr<PageOffloadCache>> PageOffloadCache::Create(
    const RequestShape& shape, int32_t max_batch, std::shared_ptr<Backend> backend,
    std::unique_ptr<PageOffloadOps> ops) {
  if (backend == nullptr || ops == nullptr) {
    return InvalidArgument("PageOffloadCache: backend and ops are required");
  }
  if (max_batch < 1 || shape.layers < 1 || shape.top_k < 1 || shape.offload_page_tokens < 1 ||
      shape.row_bytes < 1 || shape.tokens < 1) {
    return InvalidArgument(
        "PageOffloadCache: max_batch, layers, top_k, page tokens, row bytes "
        "and tokens must be positive");
  }
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  const PageOffloadPages p = OffloadPages(shape);
  const int64_t q = shape.offload_page_tokens;
  // Row numbers of cache_rows() and of the host pool, page-sized rows and the index arrays are
  // int32.
  const int64_t device_rows =
      (int64_t{shape.layers} * max_batch * (p.cached + 1) + int64_t{max_batch} * p.staging) * q;
  if (device_rows > kInt32Max || int64_t{max_batch} * p.pages * q > kInt32Max ||
      q * shape.row_bytes > kInt32Max || int64_t{max_batch} * shape.top_k > kInt32Max) {
    return InvalidArgument("PageOffloadCache: " + std::to_string(max_batch) +
                           " requests of this shape overflow 32-bit row numbers");
  }
  std::unique_ptr<PageOffloadCache> c(
      new PageOffloadCache(shape, max_batch, std::move(backend), std::move(ops)));
  SPARSEKV_RETURN_IF_ERROR(c->Allocate());
  return c;
}

StatusOr<PageOffloadCache::Memory> PageOffloadCache::Device(size_t bytes) {
  SPARSEKV_ASSIGN_OR_RETURN(void* p, backend_->AllocateDevice(std::max<size_t>(bytes, 1)));
  return Memory(p, Freer{backend_.get()});
}

Status PageOffloadCache::Allocate() {
  const int64_t entries = int64_t{max_batch_} * shape_.top_k;
  const int64_t layers = shape_.layers;
  const int64_t cache_tables = layers * max_batch_ * pages_.cached;
  const int64_t tables = cache_tables + int64_t{max_batch_} * pages_.staging;
  const size_t i32 = sizeof(int32_t);
  for (int32_t l = 0; l < shape_.layers; ++l) {
    SPARSEKV_ASSIGN_OR_RETURN(
        void* h, backend_->AllocateHost(max_batch_ * request_rows() * size_t(shape_.row_bytes)));
    host_.push_back(static_cast<std::byte*>(h));
  }
  SPARSEKV_ASSIGN_OR_RETURN(
      cache_,
      Device((layers * layer_cache_pages_ + int64_t{max_batch_} * pages_.staging) * page_bytes_));
  SPARSEKV_ASSIGN_OR_RETURN(slot_token_, Device(tables * i32));
  SPARSEKV_ASSIGN_OR_RETURN(lru_order_, Device(tables * i32));
  SPARSEKV_ASSIGN_OR_RETURN(page_table_, Device(int64_t{max_batch_} * pages_.pages * i32));
  SPARSEKV_ASSIGN_OR_RETURN(batch_, Device(max_batch_ * sizeof(BatchEntry)));
  SPARSEKV_ASSIGN_OR_RETURN(scalars_, Device(3 * i32));
  SPARSEKV_ASSIGN_OR_RETURN(append_, Device(3 * max_batch_ * i32));
  for (Memory* m : {&page_ids_, &cache_slots_, &overflow_, &staging_slots_, &rows_}) {
    SPARSEKV_ASSIGN_OR_RETURN(*m, Device(entries * i32));
  }
  SPARSEKV_ASSIGN_OR_RETURN(miss_rows_, Device(2 * entries * i32));
  SPARSEKV_ASSIGN_OR_RETURN(miss_slots_, Device(2 * entries * i32));
  SPARSEKV_ASSIGN_OR_RETURN(counters_, Device(2 * sizeof(ResolveCounters)));

  // Empty slots; every block's LRU order 0, 1, ..., its slot count - 1; the identity page table;
  // the append's sources 0, 1, ..., max_batch - 1.
  const StreamHandle stream = nullptr;
  std::vector<int32_t> init(static_cast<size_t>(tables));
  for (int64_t i = 0; i < cache_tables; ++i) init[i] = static_cast<int32_t>(i % pages_.cached);
  for (int64_t i = cache_tables; i < tables; ++i) {
    init[i] = static_cast<int32_t>((i - cache_tables) % pages_.staging);
  }
  SPARSEKV_RETURN_IF_ERROR(
      backend_->CopyAsync(lru_order_.get(), init.data(), tables * i32, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(slot_token_.get(), 0xFF, tables * i32, stream));
  std::vector<int32_t> identity(static_cast<size_t>(int64_t{max_batch_} * pages_.pages));
  std::iota(identity.begin(), identity.end(), 0);
  SPARSEKV_RETURN_IF_ERROR(
      backend_->CopyAsync(page_table_.get(), identity.data(), identity.size() * i32, stream));
  SPARSEKV_RETURN_IF_ERROR(
      backend_->CopyAsync(append_.get(), identity.data(), max_batch_ * i32, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(scalars_.get(), 0, 3 * i32, stream));
  SPARSEKV_RETURN_IF_ERROR(ResetStats(stream));
  return backend_->Synchronize(stream);
}

Status PageOffloadCache::LoadPrompt(int32_t context, StreamHandle stream) {
  if (context < 0 || context > shape_.tokens) {
    return InvalidArgument("PageOffloadCache::LoadPrompt: context outside [0, tokens]");
  }
  const int32_t tail = context % q_;
  if (tail == 0) return Status::Ok();
  const int64_t row = shape_.row_bytes;
  for (int32_t l = 0; l < shape_.layers; ++l) {
    for (int32_t b = 0; b < max_batch_; ++b) {
      const int64_t newest_page =
          l * layer_cache_pages_ + int64_t{b} * (pages_.cached + 1) + pages_.cached;
      SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(
          static_cast<std::byte*>(cache_.get()) + newest_page * page_bytes_,
          host_[l] + (b * request_rows() + context - tail) * row, size_t(tail) * row, stream));
    }
  }
  return Status::Ok();
}

Status PageOffloadCache::Plan(std::span<const int32_t> positions, StreamHandle stream) {
  const int32_t batch = static_cast<int32_t>(positions.size());
  if (batch > max_batch_) return InvalidArgument("PageOffloadCache::Plan: batch > max_batch");
  batch_host_.assign(max_batch_, BatchEntry{-1, 0, 0});
  append_host_.assign(2 * size_t(max_batch_), -1);
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t p = positions[b];
    if (p < 0 || p >= shape_.tokens) {
      return InvalidArgument("PageOffloadCache::Plan: position outside [0, tokens)");
    }
    batch_host_[b] = BatchEntry{b, p / q_ + 1, b};
    append_host_[b] = static_cast<int32_t>(b * request_rows() + p);
    append_host_[max_batch_ + b] =
        static_cast<int32_t>((int64_t{b} * (pages_.cached + 1) + pages_.cached) * q_ + p % q_);
  }
  batch_size_host_ = batch;
  const size_t i32 = sizeof(int32_t);
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(batch_.get(), batch_host_.data(),
                                               batch_host_.size() * sizeof(BatchEntry), stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(Int32(append_) + max_batch_, append_host_.data(),
                                               append_host_.size() * i32, stream));
  return backend_->CopyAsync(Int32(scalars_) + kScalarBatch, &batch_size_host_, i32, stream);
}

ResolveView PageOffloadCache::View(int32_t layer, bool staging) const {
  const int64_t entries = int64_t{max_batch_} * shape_.top_k;
  const int64_t table = staging ? int64_t{shape_.layers} * max_batch_ * pages_.cached
                                : int64_t{layer} * max_batch_ * pages_.cached;
  ResolveView v{};
  v.batch_size = Int32(scalars_) + kScalarBatch;
  v.batch = static_cast<const BatchEntry*>(batch_.get());
  v.topk = staging ? Int32(overflow_) : Int32(page_ids_);
  v.top_k = shape_.top_k;
  v.topk_stride = shape_.top_k;
  v.slots_out = staging ? Int32(staging_slots_) : Int32(cache_slots_);
  v.slot_token = Int32(slot_token_) + table;
  v.lru_order = Int32(lru_order_) + table;
  v.hot_slots = staging ? pages_.staging : pages_.cached;
  // The newest page is the cache's window; the staging area never sees it (it is always a
  // window hit in the cache pass).
  v.window = staging ? 0 : 1;
  v.page_table = Int32(page_table_);
  v.pages_per_request = pages_.pages;
  v.page_tokens = 1;  // "positions" are page ids, host rows are host pages
  v.miss_host_row = Int32(miss_rows_) + (staging ? entries : 0);
  v.miss_slot = Int32(miss_slots_) + (staging ? entries : 0);
  v.miss_count = Int32(scalars_) + (staging ? kScalarStagingMisses : kScalarCacheMisses);
  v.miss_capacity = static_cast<int32_t>(entries);
  v.counters = static_cast<ResolveCounters*>(counters_.get()) + (staging ? 1 : 0);
  v.fill_mask = nullptr;
  v.sort_misses = true;
  v.sort_min_batch = 0;
  v.share_duplicates = true;
  return v;
}

IndexCopyView PageOffloadCache::PageCopy(int32_t layer, bool staging) const {
  const int64_t entries = int64_t{max_batch_} * shape_.top_k;
  std::byte* cache = static_cast<std::byte*>(cache_.get());
  IndexCopyView v{};
  v.src = host_[layer];
  v.dst = cache +
          (staging ? shape_.layers * layer_cache_pages_ : layer * layer_cache_pages_) * page_bytes_;
  v.src_index = Int32(miss_rows_) + (staging ? entries : 0);
  v.dst_index = Int32(miss_slots_) + (staging ? entries : 0);
  v.count = Int32(scalars_) + (staging ? kScalarStagingMisses : kScalarCacheMisses);
  v.capacity = static_cast<int32_t>(entries);
  v.row_bytes = static_cast<int32_t>(page_bytes_);
  v.src_stride = page_bytes_;
  v.dst_stride = page_bytes_;
  v.src_rows = int64_t{max_batch_} * pages_.pages;
  v.dst_rows = staging ? int64_t{max_batch_} * pages_.staging : layer_cache_pages_;
  v.invalid = nullptr;
  return v;
}

Status PageOffloadCache::RunLayer(int32_t layer, int32_t batch, const int32_t* topk,
                                  const std::byte* new_rows, StreamHandle stream) {
  const int64_t row = shape_.row_bytes;
  const int32_t entries = batch * shape_.top_k;
  const size_t i32 = sizeof(int32_t);
  // The new tokens: into the host pool, and into the newest page, before anything reads them.
  IndexCopyView append{};
  append.src = new_rows;
  append.src_index = Int32(append_);
  append.count = Int32(scalars_) + kScalarBatch;
  append.capacity = max_batch_;
  append.row_bytes = shape_.row_bytes;
  append.src_stride = row;
  append.dst_stride = row;
  append.src_rows = max_batch_;
  append.invalid = nullptr;
  append.dst = host_[layer];
  append.dst_index = Int32(append_) + max_batch_;
  append.dst_rows = max_batch_ * request_rows();
  SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopy(append, stream));
  append.dst = static_cast<std::byte*>(cache_.get()) + layer * layer_cache_pages_ * page_bytes_;
  append.dst_index = Int32(append_) + 2 * max_batch_;
  append.dst_rows = layer_cache_pages_ * q_;
  SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopy(append, stream));

  SPARSEKV_RETURN_IF_ERROR(ops_->PageIds(topk, entries, q_, Int32(page_ids_), stream));
  SPARSEKV_RETURN_IF_ERROR(
      backend_->MemsetAsync(Int32(scalars_) + kScalarCacheMisses, 0, 2 * i32, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->Resolve(View(layer, false), max_batch_, stream));
  SPARSEKV_RETURN_IF_ERROR(
      ops_->Overflow(Int32(page_ids_), Int32(cache_slots_), entries, Int32(overflow_), stream));
  // The staging area starts empty at every layer: its pages are fetched for this layer only.
  const int64_t staging_table = int64_t{shape_.layers} * max_batch_ * pages_.cached;
  SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(Int32(slot_token_) + staging_table, 0xFF,
                                                 int64_t{max_batch_} * pages_.staging * i32,
                                                 stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->Resolve(View(layer, true), max_batch_, stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopy(PageCopy(layer, false), stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->IndexCopy(PageCopy(layer, true), stream));
  return ops_->Rows(topk, Int32(cache_slots_), Int32(staging_slots_), entries, q_,
                    layer * layer_cache_pages_ * q_, shape_.layers * layer_cache_pages_ * q_,
                    Int32(rows_), stream);
}

Status PageOffloadCache::ResetStats(StreamHandle stream) {
  return backend_->MemsetAsync(counters_.get(), 0, 2 * sizeof(ResolveCounters), stream);
}

StatusOr<ResolveCounters> PageOffloadCache::ReadStats(StreamHandle stream) {
  ResolveCounters c{};
  SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(&c, counters_.get(), sizeof(c), stream));
  SPARSEKV_RETURN_IF_ERROR(backend_->Synchronize(stream));
  return c;
}

}  // namespace sparsekv::tools
