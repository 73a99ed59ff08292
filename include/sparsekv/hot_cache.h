// HotCache: the per-request cache of KV rows in device memory (HBM), with its replacement state.
//
// Each admitted request holds one block; a block has, in every layer, C = hot_slots LRU slots
// followed by W = window slots for the newest tokens. Layer l's data is one buffer of
// [max_requests * (C + W)][row_stride(l)] bytes; a slot is addressed layer-wide as
// block * (C + W) + slot, which is what Resolve returns and attention kernels index with.
// Replacement state per index group (layers that share one top-k; a group is one layer unless
// the model shares its indexer) and block is O(C): slot -> position (-1 = empty), the LRU
// order of the C slots, and the size of the order's protected part (segmented LRU). Nothing is
// sized by context length.
//
// Resident pages. With resident_page_rows R > 0, a free block may instead be split into
// floor((C + W) / R) pages of R rows each, which hold the positions of requests whose whole KV is
// resident in HBM (hybrid residency: such a request needs no replacement state and never misses).
// A page is named by its first layer-wide slot. Blocks are taken for hot-cache mode from the low
// end and for pages from the high end, so that pages and blocks compete for memory only when it
// runs short; a block whose pages are all free again is free again.
//
// Thread safety: not thread-safe; the owning manager serialises calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv {

// The hot cache that `options` asks for (see CacheOptions::device_budget_bytes).
struct HotCacheShape {
  int32_t hot_slots = 0;    // C per block and layer (options.hot_slots, or chosen)
  int32_t blocks = 0;       // >= options.max_requests
  int64_t block_bytes = 0;  // HotCache::BlockBytes of one block
};
// Without a budget: options.hot_slots and max_requests blocks. With one: hot_slots = 0 takes the
// largest C (at most kMaxHotSlots) with which max_requests blocks fit in the budget, and the
// blocks are as many as fit. InvalidArgument, naming the sizes, if the budget cannot hold
// max_requests blocks of top_k slots (or of hot_slots), or the slots overflow 32-bit indices.
StatusOr<HotCacheShape> ChooseHotCacheShape(const CacheOptions& options);

class HotCache {
 public:
  // `backend` must outlive the cache. Layers [g * layers_per_state, (g + 1) * layers_per_state)
  // share replacement state g.
  static StatusOr<std::unique_ptr<HotCache>> Create(const KVGeometry& geometry, int32_t hot_slots,
                                                    int32_t window, int32_t max_blocks,
                                                    Backend* backend, int32_t layers_per_state = 1,
                                                    int32_t resident_page_rows = 0);
  ~HotCache();
  HotCache(const HotCache&) = delete;
  HotCache& operator=(const HotCache&) = delete;

  // Takes a free block (lowest first) and enqueues the reset of its state on `stream`: every
  // slot empty, LRU order 0..C-1, no protected entry. ResourceExhausted if all blocks are taken.
  StatusOr<int32_t> Acquire(StreamHandle stream);
  // REQUIRES (not checked, asserted in debug builds; the manager is the only caller): block was
  // acquired and not yet released.
  void Release(int32_t block);
  // Acquire, with the block's replacement state seeded instead of reset: slot s < n holds
  // positions[s] (n = positions.size() <= C), the others are empty; the LRU order is the empty
  // slots, then slots 0..n-1 (so positions[0] is the least recently used); nothing protected.
  // The caller copies the rows in. InvalidArgument if n > C.
  StatusOr<int32_t> AcquireSeeded(std::span<const int32_t> positions, StreamHandle stream);

  // Takes `pages` resident pages, all or nothing (ResourceExhausted if fewer are free), and
  // returns their first slots. Pages of blocks already split are taken first.
  StatusOr<std::vector<int32_t>> AcquirePages(int32_t pages);
  // REQUIRES (not checked; the manager is the only caller): every entry was returned by
  // AcquirePages and not yet released.
  void ReleasePages(std::span<const int32_t> first_slots);
  int32_t resident_page_rows() const { return page_rows_; }
  int32_t pages_per_block() const { return page_rows_ > 0 ? slots_per_block() / page_rows_ : 0; }
  // Pages AcquirePages can take now: free pages of split blocks and those of free blocks.
  int64_t free_pages() const;
  // Blocks neither in hot-cache mode nor split into pages.
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()); }

  int32_t hot_slots() const { return hot_slots_; }
  int32_t window() const { return window_; }
  int32_t slots_per_block() const { return hot_slots_ + window_; }
  int32_t max_blocks() const { return max_blocks_; }
  // Blocks in hot-cache mode.
  int32_t used_blocks() const { return max_blocks_ - free_blocks() - split_blocks(); }
  // Blocks split into resident pages (some of them in use).
  int32_t split_blocks() const { return static_cast<int32_t>(split_.size()); }
  // Layer-wide slot of the window slot that holds `position`.
  int32_t WindowSlot(int32_t block, int32_t position) const {
    return block * slots_per_block() + hot_slots_ + position % window_;
  }

  std::byte* layer_data(int32_t layer) const { return data_[layer]; }  // [rows, stride]
  int64_t layer_rows() const { return int64_t{max_blocks_} * slots_per_block(); }
  // The replacement state `layer` uses (shared by the layers of its group).
  int32_t* slot_token(int32_t layer) const { return slot_token_ + Offset(layer); }  // [blocks, C]
  int32_t* lru_order(int32_t layer) const { return lru_order_ + Offset(layer); }    // [blocks, C]
  // Entries at the end of each block's lru_order that are protected (segmented LRU).
  int32_t* lru_protected(int32_t layer) const {  // [blocks]
    return lru_protected_ + int64_t{layer / layers_per_state_} * max_blocks_;
  }
  // Device bytes held: data plus replacement state.
  int64_t device_bytes() const { return device_bytes_; }
  // Device bytes one block costs over all layers.
  static int64_t BlockBytes(const KVGeometry& geometry, int32_t hot_slots, int32_t window,
                            int32_t layers_per_state = 1);

 private:
  HotCache(const KVGeometry& geometry, int32_t hot_slots, int32_t window, int32_t max_blocks,
           Backend* backend, int32_t layers_per_state, int32_t resident_page_rows);
  // Enqueues the upload of `image` (C tokens then C order entries) as `block`'s state.
  Status WriteState(int32_t block, const int32_t* image, StreamHandle stream);
  int32_t states() const {
    return (geometry_.num_layers() + layers_per_state_ - 1) / layers_per_state_;
  }
  int64_t Offset(int32_t layer) const {
    return int64_t{layer / layers_per_state_} * max_blocks_ * hot_slots_;
  }

  KVGeometry geometry_;
  int32_t hot_slots_;
  int32_t window_;
  int32_t max_blocks_;
  int32_t layers_per_state_;
  Backend* backend_;
  std::vector<std::byte*> data_;
  int32_t* slot_token_ = nullptr;     // [states, blocks, C]
  int32_t* lru_order_ = nullptr;      // [states, blocks, C]
  int32_t* lru_protected_ = nullptr;  // [states, blocks]
  int64_t device_bytes_ = 0;
  std::vector<int32_t> free_;  // free blocks, highest first (Acquire pops the lowest)
  int32_t page_rows_;          // R; 0 = no resident pages
  // Split blocks -> their free pages (indices within the block, highest first).
  std::map<int32_t, std::vector<int32_t>> split_;
  std::vector<int32_t> seed_image_;  // host: the state Acquire / AcquireSeeded upload
};

}  // namespace sparsekv
