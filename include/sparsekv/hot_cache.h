// HotCache: the manager's device memory (HBM) for KV rows, in pages, with the replacement state
// of the requests in hot-cache mode.
//
// Layer l's data is one buffer of [pages * R][row_stride(l)] bytes; a row is addressed layer-wide
// by its slot (what Resolve returns and attention kernels index with). A page is R = page_rows
// consecutive slots, the same in every layer, named by its first slot. Only offloaded layers
// (LayerKind::kOffloaded) have data and replacement state: a resident or window-only layer's
// layer_data() and state pointers are null (the manager's DenseLayerStore holds those layers), and
// its layer index stays the model's. Every page is free or holds
// one of:
//   * part of a block: a request in hot-cache mode holds one block, C = hot_slots LRU slots and
//     W = window slots for the newest tokens in every layer, spread over pages_per_block() =
//     ceil((C + W) / R) pages; the block's slot s (in [0, C + W)) is row s % R of its page
//     s / R (Slot()). At most max_blocks blocks exist at once, each with its replacement state;
//   * positions of a request whose whole KV is resident (hybrid residency: no replacement state,
//     never a miss), or other per-request data the manager keeps in HBM (AcquirePages).
// So memory moves freely between blocks and resident pages: any free page serves either, and
// nothing fragments. With R = C + W every block is one page and block b, when the blocks are
// taken and given back as a stack (lowest free first), is slots [b (C + W), (b + 1) (C + W)).
// Replacement state per index group of offloaded layers (layers that share one top-k; a group is
// one layer unless the model shares its indexer) and block (ResolveView in kernel_views.h defines
// each exactly): slot -> position (-1 = empty), and either the LRU order of the C slots and the
// size of the order's protected part (kLru, kSegmentedLru: O(C), nothing sized by context length)
// or the clock's use count per slot, its hand and the slot of each position (kClock: O(C +
// positions), about 1% of the rows it indexes with budget-sized caches, so that a step's resolve
// costs O(top_k) instead of a walk over the C slots).
//
// Thread safety: not thread-safe; the owning manager serialises calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/index_groups.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv {

// The device memory that `options` asks for (see CacheOptions::device_budget_bytes).
struct HotCacheShape {
  int32_t hot_slots = 0;  // C per block and layer (options.hot_slots, or chosen)
  int32_t blocks = 0;     // max_requests: a block for every request on the device
  int32_t page_rows = 0;  // R: resident_page_rows with hybrid residency or indexer keys, else C + W
  int64_t pages = 0;      // pages of R rows in every offloaded layer
  // Indexer keys a page holds per layer, floor(R * row_stride / indexer_key_bytes); 0 without
  // indexer keys (CacheOptions::indexer_key_bytes).
  int32_t keys_per_page = 0;
  int64_t block_bytes = 0;  // device bytes of one block: its pages' rows and its state
};
// Without a budget: options.hot_slots, and pages for max_requests blocks plus, with indexer keys,
// max_requests requests' keys of max_context positions. With one: the replacement state of
// max_requests blocks, then pages for the rest; hot_slots = 0 takes the largest C (at most
// kMaxHotSlots) with which those pages hold max_requests blocks (and their keys). InvalidArgument,
// naming the sizes, if the budget cannot hold max_requests blocks of top_k slots (or of
// hot_slots) and their keys, or the slots overflow 32-bit indices. A page costs R slots of the
// offloaded layers only (token_stride_bytes) and the state is that of the offloaded layers' index
// groups (offloaded_index_groups), so resident and window-only layers take none of the budget.
StatusOr<HotCacheShape> ChooseHotCacheShape(const CacheOptions& options);

// Which replacement state the blocks keep.
struct HotCacheReplacement {
  EvictionPolicy policy = EvictionPolicy::kLru;
  int32_t positions = 0;  // kClock: the positions a request may have (max_context), >= 1
};
HotCacheReplacement ReplacementOf(const CacheOptions& options);

class HotCache {
 public:
  // `backend` must outlive the cache. Layers [g * layers_per_state, (g + 1) * layers_per_state)
  // share replacement state g. InvalidArgument unless hot_slots, window, max_blocks and page_rows
  // are positive, pages >= 0, pages * page_rows fits 32-bit slots and some layer is offloaded.
  // ResourceExhausted, before any device memory is allocated, if the cache needs more than the
  // backend's device has free (capacity.h: the message names both sizes and hot_slots,
  // max_requests, device_budget_bytes). kClock needs replacement.positions >= 1 (InvalidArgument
  // otherwise).
  static StatusOr<std::unique_ptr<HotCache>> Create(const KVGeometry& geometry, int32_t hot_slots,
                                                    int32_t window, int32_t max_blocks,
                                                    int64_t pages, int32_t page_rows,
                                                    Backend* backend, int32_t layers_per_state = 1,
                                                    const HotCacheReplacement& replacement = {});
  // The same with a replacement state per group of `groups` (groups.layers() must be the
  // geometry's layer count; InvalidArgument otherwise).
  static StatusOr<std::unique_ptr<HotCache>> Create(const KVGeometry& geometry, int32_t hot_slots,
                                                    int32_t window, int32_t max_blocks,
                                                    int64_t pages, int32_t page_rows,
                                                    Backend* backend, const IndexGroups& groups,
                                                    const HotCacheReplacement& replacement = {});
  ~HotCache();
  HotCache(const HotCache&) = delete;
  HotCache& operator=(const HotCache&) = delete;

  // Takes a free block (lowest first) with pages_per_block() pages (lowest first), uploads its
  // page list and enqueues the reset of its state on `stream`: every slot empty, LRU order
  // 0..C-1, no protected entry (clock: every count 0, the hand at 0, no position in a slot).
  // ResourceExhausted if no block or too few pages are free.
  StatusOr<int32_t> Acquire(StreamHandle stream);
  // REQUIRES (not checked, asserted in debug builds; the manager is the only caller): block was
  // acquired and not yet released. Its pages are free again.
  void Release(int32_t block);
  // Acquire, with the block's replacement state seeded instead of reset: slot s < n holds
  // positions[s] (n = positions.size() <= C), the others are empty; the LRU order is the empty
  // slots, then slots 0..n-1 (so positions[0] is the least recently used); nothing protected
  // (clock: every count 0 and the hand at slot n mod C, so that the empty slots go first, then
  // positions[0], ...). The caller copies the rows in. InvalidArgument if n > C, or (clock) for
  // a position outside [0, positions) or repeated.
  StatusOr<int32_t> AcquireSeeded(std::span<const int32_t> positions, StreamHandle stream);
  // Bytes per slot that another part of the manager keeps beside the replacement state (the
  // prefetch's marks: [groups, max_blocks, C] over every index group, IndexGroups::count(), not
  // owned, device memory of the same backend): a block's bytes in the groups of offloaded layers
  // are zeroed with its state at every Acquire and AcquireSeeded, so that a new block starts
  // with none of them set. Null (the default): none. REQUIRES: `bytes` outlives the hot cache's
  // last Acquire.
  void AttachSlotBytes(uint8_t* bytes) { slot_bytes_ = bytes; }
  // Whether Acquire would succeed now.
  bool CanAcquire() const { return free_blocks() > 0 && free_pages() >= pages_per_block(); }

  // Takes `pages` pages (highest first), all or nothing (ResourceExhausted if fewer are free),
  // and returns their first slots.
  StatusOr<std::vector<int32_t>> AcquirePages(int64_t pages);
  // REQUIRES (not checked; the manager is the only caller): every entry was returned by
  // AcquirePages and not yet released.
  void ReleasePages(std::span<const int32_t> first_slots);
  int64_t free_pages() const { return static_cast<int64_t>(free_pages_.size()); }
  int64_t pages() const { return pages_; }
  int32_t page_rows() const { return page_rows_; }
  int32_t pages_per_block() const { return (slots_per_block() + page_rows_ - 1) / page_rows_; }

  int32_t hot_slots() const { return hot_slots_; }
  int32_t window() const { return window_; }
  int32_t slots_per_block() const { return hot_slots_ + window_; }
  int32_t max_blocks() const { return max_blocks_; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_blocks_.size()); }
  // Blocks in use (requests in hot-cache mode).
  int32_t used_blocks() const { return max_blocks_ - free_blocks(); }
  // Layer-wide slot of slot s (in [0, C + W)) of an acquired block.
  int32_t Slot(int32_t block, int32_t s) const {
    return block_pages_host_[static_cast<size_t>(block) * pages_per_block() + s / page_rows_] +
           s % page_rows_;
  }
  // Layer-wide slot of the window slot that holds `position`.
  int32_t WindowSlot(int32_t block, int32_t position) const {
    return Slot(block, hot_slots_ + position % window_);
  }
  // The block and the slot within it of a layer-wide slot, or {-1, -1} if its page belongs to no
  // block.
  struct BlockSlot {
    int32_t block;
    int32_t slot;
  };
  BlockSlot Locate(int32_t layer_slot) const;

  // [rows, stride]; null for a layer that is not offloaded.
  std::byte* layer_data(int32_t layer) const { return data_[layer]; }
  int64_t layer_rows() const { return pages_ * page_rows_; }
  // Every block's pages, [max_blocks, pages_per_block()] first slots (device memory; a free
  // block's entries are stale).
  const int32_t* block_pages() const { return block_pages_; }
  // The replacement state `layer` uses (shared by the layers of its group); null where the
  // policy keeps no such state, and for a layer that is not offloaded.
  int32_t* slot_token(int32_t layer) const {  // [blocks, C]
    return StateIndex(layer) < 0 ? nullptr : slot_token_ + Offset(layer);
  }
  int32_t* lru_order(int32_t layer) const {  // [blocks, C]
    return lru_order_ == nullptr || StateIndex(layer) < 0 ? nullptr : lru_order_ + Offset(layer);
  }
  // Entries at the end of each block's lru_order that are protected (segmented LRU).
  int32_t* lru_protected(int32_t layer) const {  // [blocks]
    return lru_protected_ == nullptr || StateIndex(layer) < 0
               ? nullptr
               : lru_protected_ + StateIndex(layer) * max_blocks_;
  }
  uint8_t* clock_uses(int32_t layer) const {  // [blocks, C]
    return clock_uses_ == nullptr || StateIndex(layer) < 0 ? nullptr : clock_uses_ + Offset(layer);
  }
  int32_t* clock_hand(int32_t layer) const {  // [blocks]
    return clock_hand_ == nullptr || StateIndex(layer) < 0
               ? nullptr
               : clock_hand_ + StateIndex(layer) * max_blocks_;
  }
  int32_t* position_slot(int32_t layer) const {  // [blocks, positions]
    return position_slot_ == nullptr || StateIndex(layer) < 0
               ? nullptr
               : position_slot_ + StateIndex(layer) * max_blocks_ * replacement_.positions;
  }
  // Replacement states per block: the index groups of offloaded layers.
  int32_t states() const { return states_; }
  const HotCacheReplacement& replacement() const { return replacement_; }
  // Device bytes held: data plus replacement state and page lists.
  int64_t device_bytes() const { return device_bytes_; }
  // Device bytes one block costs over the offloaded layers with one page per block: its C + W
  // rows and its replacement state (a state per layers_per_state offloaded layers).
  static int64_t BlockBytes(const KVGeometry& geometry, int32_t hot_slots, int32_t window,
                            int32_t layers_per_state = 1,
                            const HotCacheReplacement& replacement = {});
  // Device bytes of the replacement state of one block over the offloaded layers.
  static int64_t StateBytes(const KVGeometry& geometry, int32_t hot_slots,
                            int32_t layers_per_state = 1,
                            const HotCacheReplacement& replacement = {});
  // The same for `states` replacement states (one per index group).
  static int64_t StateBytesOf(int32_t states, int32_t hot_slots,
                              const HotCacheReplacement& replacement);

 private:
  HotCache(const KVGeometry& geometry, int32_t hot_slots, int32_t window, int32_t max_blocks,
           int64_t pages, int32_t page_rows, Backend* backend, const IndexGroups& groups,
           const HotCacheReplacement& replacement);
  bool clock() const { return replacement_.policy == EvictionPolicy::kClock; }
  // Enqueues the upload of seed_image_ as `block`'s state in every group: the C tokens, then
  // the C order entries (LRU) or the hand and the position map's span [first, first + n) (clock).
  Status WriteState(int32_t block, int32_t map_first, int32_t map_size, StreamHandle stream);
  // The state of `layer`'s group, -1 for a layer that is not offloaded.
  int64_t StateIndex(int32_t layer) const { return state_of_group_[groups_.Of(layer)]; }
  int64_t Offset(int32_t layer) const { return StateIndex(layer) * max_blocks_ * hot_slots_; }

  KVGeometry geometry_;
  int32_t hot_slots_;
  int32_t window_;
  int32_t max_blocks_;
  int64_t pages_;
  int32_t page_rows_;                    // R
  IndexGroups groups_;                   // a replacement state per group of offloaded layers
  std::vector<int32_t> state_of_group_;  // [groups] the group's state, -1: not offloaded
  int32_t states_ = 0;
  HotCacheReplacement replacement_;
  Backend* backend_;
  std::vector<std::byte*> data_;
  int32_t* slot_token_ = nullptr;     // [states, blocks, C], states over offloaded groups
  int32_t* lru_order_ = nullptr;      // [states, blocks, C]
  int32_t* lru_protected_ = nullptr;  // [states, blocks]
  uint8_t* clock_uses_ = nullptr;     // [states, blocks, C]
  int32_t* clock_hand_ = nullptr;     // [states, blocks]
  int32_t* position_slot_ = nullptr;  // [states, blocks, positions]
  int32_t* block_pages_ = nullptr;    // [blocks, pages_per_block]
  uint8_t* slot_bytes_ = nullptr;     // [groups, blocks, C], not owned (AttachSlotBytes)
  int64_t device_bytes_ = 0;
  std::set<int32_t> free_blocks_;
  std::set<int32_t> free_pages_;           // page indices (slot / R)
  std::vector<int32_t> block_pages_host_;  // host mirror of block_pages_
  std::vector<int32_t> page_block_;        // [pages] the block a page belongs to, or -1
  std::vector<int32_t> seed_image_;        // host: the state Acquire / AcquireSeeded upload
};

}  // namespace sparsekv
