#include "sparsekv/hot_cache.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <limits>
#include <numeric>
#include <string>

#include "sparsekv/capacity.h"

namespace sparsekv {

HotCacheReplacement ReplacementOf(const CacheOptions& options) {
  return {.policy = options.eviction,
          .positions = options.eviction == EvictionPolicy::kClock ? options.max_context : 0};
}

namespace {

// Bytes of one block's replacement state in one group: slot_token, then the LRU order and the
// protected count, or the use counts, the hand and the position map.
int64_t GroupStateBytes(int32_t hot_slots, const HotCacheReplacement& replacement) {
  const int64_t tokens = int64_t{hot_slots} * sizeof(int32_t);
  if (replacement.policy == EvictionPolicy::kClock) {
    return tokens + int64_t{hot_slots} * sizeof(uint8_t) + sizeof(int32_t) +
           int64_t{replacement.positions} * sizeof(int32_t);
  }
  return tokens + int64_t{hot_slots} * sizeof(int32_t) + sizeof(int32_t);
}

}  // namespace

int64_t HotCache::StateBytes(const KVGeometry& geometry, int32_t hot_slots,
                             int32_t layers_per_state, const HotCacheReplacement& replacement) {
  int32_t offloaded = 0;
  for (int32_t l = 0; l < geometry.num_layers(); ++l) offloaded += geometry.offloaded(l);
  const int32_t states = (offloaded + layers_per_state - 1) / layers_per_state;
  return StateBytesOf(states, hot_slots, replacement);
}

int64_t HotCache::StateBytesOf(int32_t states, int32_t hot_slots,
                               const HotCacheReplacement& replacement) {
  return int64_t{states} * GroupStateBytes(hot_slots, replacement);
}

int64_t HotCache::BlockBytes(const KVGeometry& geometry, int32_t hot_slots, int32_t window,
                             int32_t layers_per_state, const HotCacheReplacement& replacement) {
  return geometry.token_stride_bytes() * (hot_slots + window) +
         StateBytes(geometry, hot_slots, layers_per_state, replacement);
}

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The paging of a given C: page rows, pages per block and per request's indexer keys, the bytes
// of a page and of the blocks' state, and the pages max_requests requests need.
struct Paging {
  int32_t page_rows;
  int32_t keys_per_page;
  int64_t page_bytes;
  int64_t state_bytes;  // of every block
  int64_t pages_needed;

  Paging(const CacheOptions& o, int32_t c) {
    const bool paged = o.hybrid_residency || o.indexer_key_bytes > 0;
    page_rows = paged ? o.resident_page_rows : c + o.window;
    // The keys fill pages of the offloaded layers, whose one stride ValidateOptions checks.
    keys_per_page =
        o.indexer_key_bytes > 0
            ? static_cast<int32_t>(int64_t{page_rows} * o.geometry.offloaded_row_stride() /
                                   o.indexer_key_bytes)
            : 0;
    // A page is R slots of every offloaded layer; the other layers have no slots.
    page_bytes = o.geometry.token_stride_bytes() * page_rows;
    state_bytes = int64_t{o.max_requests} *
                  (HotCache::StateBytesOf(o.offloaded_index_groups(), c, ReplacementOf(o)) +
                   CeilDiv(c + o.window, page_rows) * int64_t{sizeof(int32_t)});
    const int64_t key_pages = keys_per_page > 0 ? CeilDiv(o.max_context, keys_per_page) : 0;
    pages_needed = int64_t{o.max_requests} * (CeilDiv(c + o.window, page_rows) + key_pages);
  }
  int64_t bytes_needed() const { return pages_needed * page_bytes + state_bytes; }
};

}  // namespace

StatusOr<HotCacheShape> ChooseHotCacheShape(const CacheOptions& o) {
  HotCacheShape shape;
  shape.hot_slots = o.hot_slots;
  shape.blocks = o.max_requests;
  if (o.device_budget_bytes > 0 && shape.hot_slots == 0) {
    // The bytes needed grow with C: the largest C that fits, capped at the kernels' limit.
    int32_t lo = 0, hi = kMaxHotSlots;
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo + 1) / 2;
      if (Paging(o, mid).bytes_needed() <= o.device_budget_bytes) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    shape.hot_slots = lo;
  }
  const int32_t needed_slots = std::max(shape.hot_slots, IndexGroups(o).max_top_k());
  const Paging needed(o, needed_slots);
  if (o.device_budget_bytes > 0 && needed.bytes_needed() > o.device_budget_bytes) {
    return InvalidArgument(
        "CacheOptions: device_budget_bytes (" + std::to_string(o.device_budget_bytes) +
        ") cannot hold max_requests (" + std::to_string(o.max_requests) + ") blocks of " +
        std::to_string(needed_slots) + " slots" +
        (o.indexer_key_bytes > 0 ? " and their indexer keys of max_context positions" : "") + " (" +
        std::to_string(needed.bytes_needed()) + " bytes)");
  }
  const Paging paging(o, shape.hot_slots);
  shape.page_rows = paging.page_rows;
  shape.keys_per_page = paging.keys_per_page;
  // With a budget, as many pages as it holds and as 32-bit slot indices can address.
  shape.pages = o.device_budget_bytes > 0
                    ? std::min((o.device_budget_bytes - paging.state_bytes) / paging.page_bytes,
                               std::max(paging.pages_needed, INT32_MAX / int64_t{shape.page_rows}))
                    : paging.pages_needed;
  if (shape.pages * shape.page_rows > INT32_MAX) {
    return InvalidArgument("CacheOptions: " + std::to_string(shape.pages) + " pages of " +
                           std::to_string(shape.page_rows) + " rows overflow 32-bit slot indices");
  }
  shape.block_bytes = CeilDiv(shape.hot_slots + o.window, shape.page_rows) * paging.page_bytes +
                      paging.state_bytes / o.max_requests;
  return shape;
}

StatusOr<std::unique_ptr<HotCache>> HotCache::Create(const KVGeometry& geometry, int32_t hot_slots,
                                                     int32_t window, int32_t max_blocks,
                                                     int64_t pages, int32_t page_rows,
                                                     Backend* backend, int32_t layers_per_state,
                                                     const HotCacheReplacement& replacement) {
  if (layers_per_state < 1 || geometry.layers.empty()) {
    return InvalidArgument("HotCache: invalid shape");
  }
  return Create(geometry, hot_slots, window, max_blocks, pages, page_rows, backend,
                IndexGroups::Uniform(geometry.num_layers(), layers_per_state, hot_slots),
                replacement);
}

StatusOr<std::unique_ptr<HotCache>> HotCache::Create(const KVGeometry& geometry, int32_t hot_slots,
                                                     int32_t window, int32_t max_blocks,
                                                     int64_t pages, int32_t page_rows,
                                                     Backend* backend, const IndexGroups& groups,
                                                     const HotCacheReplacement& replacement) {
  if (hot_slots <= 0 || window <= 0 || max_blocks <= 0 || geometry.layers.empty() ||
      groups.layers() != geometry.num_layers() || page_rows < 1 || pages < 0 ||
      pages * page_rows > std::numeric_limits<int32_t>::max() ||
      (replacement.policy == EvictionPolicy::kClock && replacement.positions < 1)) {
    return InvalidArgument("HotCache: invalid shape");
  }
  std::unique_ptr<HotCache> cache(new HotCache(geometry, hot_slots, window, max_blocks, pages,
                                               page_rows, backend, groups, replacement));
  if (cache->states() == 0) return InvalidArgument("HotCache: the geometry has no offloaded layer");
  const int64_t rows = cache->layer_rows();
  const int64_t state_bytes =
      int64_t{max_blocks} * StateBytesOf(cache->states(), hot_slots, replacement);
  int32_t offloaded = 0;
  for (int32_t l = 0; l < geometry.num_layers(); ++l) offloaded += geometry.offloaded(l);
  const int64_t page_list_bytes = int64_t{max_blocks} * cache->pages_per_block() * sizeof(int32_t);
  // Against the device's free memory, before any of it is allocated.
  const std::string sizing = "hot_slots = " + std::to_string(hot_slots) +
                             " + window = " + std::to_string(window) + " for " +
                             std::to_string(max_blocks) + " requests (" + std::to_string(rows) +
                             " rows x " + std::to_string(geometry.token_stride_bytes()) +
                             " B over " + std::to_string(offloaded) + " offloaded layers)";
  SPARSEKV_RETURN_IF_ERROR(CheckDeviceMemory(
      {.what = "hot cache",
       .sizing = sizing,
       .bytes = rows * geometry.token_stride_bytes() + state_bytes + page_list_bytes,
       .remedy = "lower hot_slots, max_requests or device_budget_bytes"},
      *backend));
  // Rows for the offloaded layers only; a resident or window-only layer's data stays null.
  cache->data_.assign(geometry.layers.size(), nullptr);
  for (int32_t l = 0; l < geometry.num_layers(); ++l) {
    if (!geometry.offloaded(l)) continue;
    const LayerShape& layer = geometry.layers[l];
    SPARSEKV_ASSIGN_OR_RETURN(
        void* p, backend->AllocateDevice(std::max<int64_t>(rows, 1) * layer.row_stride));
    cache->data_[l] = static_cast<std::byte*>(p);
    // Defined contents (stride padding of copied rows is never written) on every backend.
    SPARSEKV_RETURN_IF_ERROR(backend->MemsetAsync(p, 0, rows * layer.row_stride, nullptr));
    cache->device_bytes_ += rows * layer.row_stride;
  }
  // Per group and block: `per_block` elements of `size` bytes.
  const int64_t group_blocks = int64_t{cache->states()} * max_blocks;
  const auto allocate = [&](int64_t per_block, int64_t size) -> StatusOr<void*> {
    return backend->AllocateDevice(std::max<int64_t>(group_blocks * per_block * size, 1));
  };
  SPARSEKV_ASSIGN_OR_RETURN(void* tokens, allocate(hot_slots, sizeof(int32_t)));
  cache->slot_token_ = static_cast<int32_t*>(tokens);
  if (cache->clock()) {
    SPARSEKV_ASSIGN_OR_RETURN(void* uses, allocate(hot_slots, sizeof(uint8_t)));
    cache->clock_uses_ = static_cast<uint8_t*>(uses);
    SPARSEKV_ASSIGN_OR_RETURN(void* hands, allocate(1, sizeof(int32_t)));
    cache->clock_hand_ = static_cast<int32_t*>(hands);
    SPARSEKV_ASSIGN_OR_RETURN(void* map, allocate(replacement.positions, sizeof(int32_t)));
    cache->position_slot_ = static_cast<int32_t*>(map);
  } else {
    SPARSEKV_ASSIGN_OR_RETURN(void* order, allocate(hot_slots, sizeof(int32_t)));
    cache->lru_order_ = static_cast<int32_t*>(order);
    SPARSEKV_ASSIGN_OR_RETURN(void* protected_counts, allocate(1, sizeof(int32_t)));
    cache->lru_protected_ = static_cast<int32_t*>(protected_counts);
  }
  SPARSEKV_ASSIGN_OR_RETURN(void* page_lists, backend->AllocateDevice(page_list_bytes));
  cache->block_pages_ = static_cast<int32_t*>(page_lists);
  SPARSEKV_RETURN_IF_ERROR(backend->MemsetAsync(page_lists, 0xff, page_list_bytes, nullptr));
  cache->device_bytes_ += state_bytes + page_list_bytes;
  return cache;
}

HotCache::HotCache(const KVGeometry& geometry, int32_t hot_slots, int32_t window,
                   int32_t max_blocks, int64_t pages, int32_t page_rows, Backend* backend,
                   const IndexGroups& groups, const HotCacheReplacement& replacement)
    : geometry_(geometry),
      hot_slots_(hot_slots),
      window_(window),
      max_blocks_(max_blocks),
      pages_(pages),
      page_rows_(page_rows),
      groups_(groups),
      replacement_(replacement),
      backend_(backend),
      block_pages_host_(static_cast<size_t>(max_blocks) * pages_per_block(), -1),
      page_block_(static_cast<size_t>(pages), -1) {
  for (int32_t b = 0; b < max_blocks; ++b) free_blocks_.insert(b);
  for (int32_t p = 0; p < pages; ++p) free_pages_.insert(free_pages_.end(), p);
  state_of_group_.assign(groups.count(), -1);
  for (int32_t g = 0; g < groups.count(); ++g) {
    if (geometry.offloaded(groups.First(g))) state_of_group_[g] = states_++;
  }
}

HotCache::~HotCache() {
  for (std::byte* p : data_) {
    if (p != nullptr) backend_->FreeDevice(p);
  }
  for (void* p : std::initializer_list<void*>{slot_token_, lru_order_, lru_protected_, clock_uses_,
                                              clock_hand_, position_slot_, block_pages_}) {
    if (p != nullptr) backend_->FreeDevice(p);
  }
}

Status HotCache::WriteState(int32_t block, int32_t map_first, int32_t map_size,
                            StreamHandle stream) {
  const size_t bytes = static_cast<size_t>(hot_slots_) * sizeof(int32_t);
  const int32_t* image = seed_image_.data();
  for (int32_t g = 0; g < groups_.count(); ++g) {
    if (state_of_group_[g] < 0) continue;  // resident or window-only layers: no state
    const int32_t l = groups_.First(g);
    const int64_t at = int64_t{block} * hot_slots_;
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(slot_token(l) + at, image, bytes, stream));
    if (slot_bytes_ != nullptr) {
      SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(
          slot_bytes_ + int64_t{g} * max_blocks_ * hot_slots_ + at, 0, hot_slots_, stream));
    }
    if (!clock()) {
      SPARSEKV_RETURN_IF_ERROR(
          backend_->CopyAsync(lru_order(l) + at, image + hot_slots_, bytes, stream));
      SPARSEKV_RETURN_IF_ERROR(
          backend_->MemsetAsync(lru_protected(l) + block, 0, sizeof(int32_t), stream));
      continue;
    }
    SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(clock_uses(l) + at, 0, hot_slots_, stream));
    SPARSEKV_RETURN_IF_ERROR(
        backend_->CopyAsync(clock_hand(l) + block, image + hot_slots_, sizeof(int32_t), stream));
    int32_t* map = position_slot(l) + int64_t{block} * replacement_.positions;
    SPARSEKV_RETURN_IF_ERROR(backend_->MemsetAsync(
        map, 0xff, static_cast<size_t>(replacement_.positions) * sizeof(int32_t), stream));
    if (map_size > 0) {
      SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(map + map_first, image + hot_slots_ + 1,
                                                   map_size * sizeof(int32_t), stream));
    }
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
  if (free_blocks_.empty()) {
    return ResourceExhausted("HotCache: all " + std::to_string(max_blocks_) +
                             " blocks are in use (max_requests)");
  }
  if (free_pages() < pages_per_block()) {
    return ResourceExhausted("HotCache: a block needs " + std::to_string(pages_per_block()) +
                             " pages, " + std::to_string(free_pages()) + " are free");
  }
  // The image WriteState uploads: C tokens, then the order (LRU) or the hand and the position
  // map over the seeded positions' span (clock).
  int32_t map_first = 0;
  int32_t map_size = 0;
  if (clock()) {
    for (const int32_t p : positions) {
      if (p < 0 || p >= replacement_.positions) {
        return InvalidArgument("HotCache: seed position " + std::to_string(p) + " outside [0, " +
                               std::to_string(replacement_.positions) + ")");
      }
    }
    if (n > 0) {
      const auto [lo, hi] = std::minmax_element(positions.begin(), positions.end());
      map_first = *lo;
      map_size = *hi - *lo + 1;
    }
    seed_image_.assign(static_cast<size_t>(hot_slots_) + 1 + map_size, -1);
    seed_image_[hot_slots_] = n % hot_slots_;  // the hand: the empty slots first
    for (int32_t s = 0; s < n; ++s) {
      int32_t& cell = seed_image_[hot_slots_ + 1 + (positions[s] - map_first)];
      if (cell >= 0) {
        return InvalidArgument("HotCache: seed position " + std::to_string(positions[s]) +
                               " repeated");
      }
      cell = s;
    }
  } else {
    seed_image_.assign(2 * static_cast<size_t>(hot_slots_), -1);
    int32_t* order = seed_image_.data() + hot_slots_;
    std::iota(order, order + (hot_slots_ - n), n);  // the empty slots: victims first
    std::iota(order + (hot_slots_ - n), order + hot_slots_, 0);
  }
  std::copy(positions.begin(), positions.end(), seed_image_.begin());
  const int32_t block = *free_blocks_.begin();
  SPARSEKV_RETURN_IF_ERROR(WriteState(block, map_first, map_size, stream));
  // The lowest free pages, in order.
  int32_t* pages = block_pages_host_.data() + static_cast<size_t>(block) * pages_per_block();
  for (int32_t i = 0; i < pages_per_block(); ++i) {
    const int32_t page = *free_pages_.begin();
    free_pages_.erase(free_pages_.begin());
    page_block_[page] = block;
    pages[i] = page * page_rows_;
  }
  SPARSEKV_RETURN_IF_ERROR(
      backend_->CopyAsync(block_pages_ + static_cast<size_t>(block) * pages_per_block(), pages,
                          sizeof(int32_t) * pages_per_block(), stream));
  free_blocks_.erase(free_blocks_.begin());
  return block;
}

void HotCache::Release(int32_t block) {
  assert(block >= 0 && block < max_blocks_ && !free_blocks_.contains(block));
  const int32_t* pages = block_pages_host_.data() + static_cast<size_t>(block) * pages_per_block();
  for (int32_t i = 0; i < pages_per_block(); ++i) {
    page_block_[pages[i] / page_rows_] = -1;
    free_pages_.insert(pages[i] / page_rows_);
  }
  free_blocks_.insert(block);
}

HotCache::BlockSlot HotCache::Locate(int32_t layer_slot) const {
  const int64_t page = layer_slot / page_rows_;
  if (layer_slot < 0 || page >= pages_ || page_block_[page] < 0) return {-1, -1};
  const int32_t block = page_block_[page];
  const int32_t* pages = block_pages_host_.data() + static_cast<size_t>(block) * pages_per_block();
  const int32_t index =
      static_cast<int32_t>(std::find(pages, pages + pages_per_block(), page * page_rows_) - pages);
  return {block, index * page_rows_ + layer_slot % page_rows_};
}

StatusOr<std::vector<int32_t>> HotCache::AcquirePages(int64_t pages) {
  if (pages < 0 || pages > free_pages()) {
    return ResourceExhausted("HotCache: " + std::to_string(pages) + " pages asked, " +
                             std::to_string(free_pages()) + " free");
  }
  std::vector<int32_t> first_slots;
  first_slots.reserve(static_cast<size_t>(pages));
  for (int64_t i = 0; i < pages; ++i) {
    auto highest = std::prev(free_pages_.end());
    first_slots.push_back(*highest * page_rows_);
    free_pages_.erase(highest);
  }
  return first_slots;
}

void HotCache::ReleasePages(std::span<const int32_t> first_slots) {
  for (int32_t slot : first_slots) {
    assert(slot % page_rows_ == 0 && !free_pages_.contains(slot / page_rows_));
    free_pages_.insert(slot / page_rows_);
  }
}

}  // namespace sparsekv
