#include "sparsekv/hot_cache.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <functional>
#include <numeric>
#include <string>

namespace sparsekv {

int64_t HotCache::BlockBytes(const KVGeometry& geometry, int32_t hot_slots, int32_t window,
                             int32_t layers_per_state) {
  const int64_t data = geometry.token_stride_bytes() * (hot_slots + window);
  const int64_t states = (geometry.num_layers() + layers_per_state - 1) / layers_per_state;
  const int64_t state = states * (hot_slots * 2 + 1) * sizeof(int32_t);
  return data + state;
}

StatusOr<HotCacheShape> ChooseHotCacheShape(const CacheOptions& o) {
  const int32_t lps = o.layers_per_index;
  auto bytes = [&](int32_t c) { return HotCache::BlockBytes(o.geometry, c, o.window, lps); };
  HotCacheShape shape{o.hot_slots, o.max_requests, 0};
  if (o.device_budget_bytes > 0) {
    const int64_t per_request = o.device_budget_bytes / o.max_requests;
    if (shape.hot_slots == 0) {
      // BlockBytes is affine in C: the largest C whose block fits, capped at the kernels' limit.
      const int64_t fixed = bytes(0);
      const int64_t per_slot = bytes(1) - fixed;
      shape.hot_slots = static_cast<int32_t>(
          std::clamp<int64_t>((per_request - fixed) / per_slot, 0, kMaxHotSlots));
    }
    const int32_t needed = std::max(shape.hot_slots, o.top_k);
    if (bytes(needed) > per_request) {
      return InvalidArgument(
          "CacheOptions: device_budget_bytes (" + std::to_string(o.device_budget_bytes) +
          ") cannot hold max_requests (" + std::to_string(o.max_requests) + ") blocks of " +
          std::to_string(needed) + " slots (" + std::to_string(bytes(needed)) + " bytes each)");
    }
    // As many blocks as fit, and as 32-bit slot indices can address.
    shape.blocks =
        static_cast<int32_t>(std::min<int64_t>(o.device_budget_bytes / bytes(shape.hot_slots),
                                               INT32_MAX / (shape.hot_slots + int64_t{o.window})));
  }
  if (int64_t{shape.blocks} * (shape.hot_slots + int64_t{o.window}) > INT32_MAX) {
    return InvalidArgument("CacheOptions: " + std::to_string(shape.blocks) + " blocks of " +
                           std::to_string(shape.hot_slots) +
                           " + window slots overflow 32-bit slot indices");
  }
  shape.block_bytes = bytes(shape.hot_slots);
  return shape;
}

StatusOr<std::unique_ptr<HotCache>> HotCache::Create(const KVGeometry& geometry, int32_t hot_slots,
                                                     int32_t window, int32_t max_blocks,
                                                     Backend* backend, int32_t layers_per_state,
                                                     int32_t resident_page_rows) {
  if (hot_slots <= 0 || window <= 0 || max_blocks <= 0 || geometry.layers.empty() ||
      layers_per_state < 1 || resident_page_rows < 0 || resident_page_rows > hot_slots + window) {
    return InvalidArgument("HotCache: invalid shape");
  }
  std::unique_ptr<HotCache> cache(new HotCache(geometry, hot_slots, window, max_blocks, backend,
                                               layers_per_state, resident_page_rows));
  const int64_t rows = cache->layer_rows();
  for (const LayerShape& layer : geometry.layers) {
    SPARSEKV_ASSIGN_OR_RETURN(void* p, backend->AllocateDevice(rows * layer.row_stride));
    cache->data_.push_back(static_cast<std::byte*>(p));
    // Defined contents (stride padding of copied rows is never written) on every backend.
    SPARSEKV_RETURN_IF_ERROR(backend->MemsetAsync(p, 0, rows * layer.row_stride, nullptr));
    cache->device_bytes_ += rows * layer.row_stride;
  }
  const int64_t state_bytes = int64_t{cache->states()} * max_blocks * hot_slots * sizeof(int32_t);
  SPARSEKV_ASSIGN_OR_RETURN(void* tokens, backend->AllocateDevice(state_bytes));
  cache->slot_token_ = static_cast<int32_t*>(tokens);
  SPARSEKV_ASSIGN_OR_RETURN(void* order, backend->AllocateDevice(state_bytes));
  cache->lru_order_ = static_cast<int32_t*>(order);
  const int64_t protected_bytes = int64_t{cache->states()} * max_blocks * sizeof(int32_t);
  SPARSEKV_ASSIGN_OR_RETURN(void* protected_counts, backend->AllocateDevice(protected_bytes));
  cache->lru_protected_ = static_cast<int32_t*>(protected_counts);
  cache->device_bytes_ += 2 * state_bytes + protected_bytes;
  return cache;
}

HotCache::HotCache(const KVGeometry& geometry, int32_t hot_slots, int32_t window,
                   int32_t max_blocks, Backend* backend, int32_t layers_per_state,
                   int32_t resident_page_rows)
    : geometry_(geometry),
      hot_slots_(hot_slots),
      window_(window),
      max_blocks_(max_blocks),
      layers_per_state_(layers_per_state),
      backend_(backend),
      page_rows_(resident_page_rows) {
  for (int32_t b = max_blocks - 1; b >= 0; --b) free_.push_back(b);
}

HotCache::~HotCache() {
  for (std::byte* p : data_) backend_->FreeDevice(p);
  if (slot_token_ != nullptr) backend_->FreeDevice(slot_token_);
  if (lru_order_ != nullptr) backend_->FreeDevice(lru_order_);
  if (lru_protected_ != nullptr) backend_->FreeDevice(lru_protected_);
}

Status HotCache::WriteState(int32_t block, const int32_t* image, StreamHandle stream) {
  const size_t bytes = static_cast<size_t>(hot_slots_) * sizeof(int32_t);
  for (int32_t l = 0; l < geometry_.num_layers(); l += layers_per_state_) {
    const int64_t at = int64_t{block} * hot_slots_;
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(slot_token(l) + at, image, bytes, stream));
    SPARSEKV_RETURN_IF_ERROR(
        backend_->CopyAsync(lru_order(l) + at, image + hot_slots_, bytes, stream));
    SPARSEKV_RETURN_IF_ERROR(
        backend_->MemsetAsync(lru_protected(l) + block, 0, sizeof(int32_t), stream));
  }
  return Status::Ok();
}

StatusOr<int32_t> HotCache::Acquire(StreamHandle stream) {
  return AcquireSeeded({}, stream);  // no seed: every slot empty, the order 0..C-1
}

StatusOr<int32_t> HotCache::AcquireSeeded(std::span<const int32_t> positions, StreamHandle stream) {
  const auto n = static_cast<int32_t>(positions.size());
  if (n > hot_slots_) {
    return InvalidArgument("HotCache: " + std::to_string(n) + " seed positions for " +
                           std::to_string(hot_slots_) + " slots");
  }
  if (free_.empty()) {
    return ResourceExhausted("HotCache: all " + std::to_string(max_blocks_) +
                             " blocks are in use (max_requests)");
  }
  seed_image_.assign(2 * static_cast<size_t>(hot_slots_), -1);
  std::copy(positions.begin(), positions.end(), seed_image_.begin());
  int32_t* order = seed_image_.data() + hot_slots_;
  std::iota(order, order + (hot_slots_ - n), n);  // the empty slots: victims first
  std::iota(order + (hot_slots_ - n), order + hot_slots_, 0);
  const int32_t block = free_.back();
  SPARSEKV_RETURN_IF_ERROR(WriteState(block, seed_image_.data(), stream));
  free_.pop_back();
  return block;
}

void HotCache::Release(int32_t block) {
  assert(block >= 0 && block < max_blocks_ &&
         std::find(free_.begin(), free_.end(), block) == free_.end());
  // Keep free_ sorted descending so that Acquire always takes the lowest free block.
  auto it = free_.begin();
  while (it != free_.end() && *it > block) ++it;
  free_.insert(it, block);
}

int64_t HotCache::free_pages() const {
  int64_t pages = int64_t{free_blocks()} * pages_per_block();
  for (const auto& [block, free] : split_) pages += static_cast<int64_t>(free.size());
  return pages;
}

StatusOr<std::vector<int32_t>> HotCache::AcquirePages(int32_t pages) {
  if (page_rows_ == 0) return FailedPrecondition("HotCache: no resident pages configured");
  if (pages < 0 || pages > free_pages()) {
    return ResourceExhausted("HotCache: " + std::to_string(pages) + " resident pages asked, " +
                             std::to_string(free_pages()) + " free");
  }
  std::vector<int32_t> first_slots;
  first_slots.reserve(static_cast<size_t>(pages));
  auto take = [&](int32_t block, std::vector<int32_t>& free) {
    while (!free.empty() && static_cast<int32_t>(first_slots.size()) < pages) {
      first_slots.push_back(block * slots_per_block() + free.back() * page_rows_);
      free.pop_back();
    }
  };
  for (auto& [block, free] : split_) take(block, free);
  while (static_cast<int32_t>(first_slots.size()) < pages) {
    // The highest free block (free_ is sorted descending).
    const int32_t block = free_.front();
    free_.erase(free_.begin());
    std::vector<int32_t>& free = split_[block];
    for (int32_t i = pages_per_block() - 1; i >= 0; --i) free.push_back(i);
    take(block, free);
  }
  return first_slots;
}

void HotCache::ReleasePages(std::span<const int32_t> first_slots) {
  for (int32_t slot : first_slots) {
    const int32_t block = slot / slots_per_block();
    std::vector<int32_t>& free = split_.at(block);
    const int32_t page = slot % slots_per_block() / page_rows_;
    free.insert(std::upper_bound(free.begin(), free.end(), page, std::greater<>()), page);
    if (static_cast<int32_t>(free.size()) == pages_per_block()) {
      split_.erase(block);
      Release(block);
    }
  }
}

}  // namespace sparsekv
