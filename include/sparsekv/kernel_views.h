// Plain, trivially copyable views that every backend's operators receive by value.
//
// A view names memory (device memory, or host memory the device can address) and shapes; it owns
// nothing. The same views drive the CPU reference backend (the oracle) and the CUDA backend, and
// their semantics are defined here, once. Scalars that a captured CUDA graph must read at run time
// (batch size, miss count) are pointers into device memory, never by-value fields.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define SPARSEKV_HD __host__ __device__
#else
#define SPARSEKV_HD
#endif

namespace sparsekv {

// A slot of the hot cache of one layer, counted over the whole layer buffer:
// request block * slots_per_request + slot within the block. kNullSlot = no slot.
inline constexpr int32_t kNullSlot = -1;
// A top-k entry of -1 is padding.
inline constexpr int32_t kPaddingPosition = -1;

// Device-side counters. All accumulate until the host reads and resets them.
struct ResolveCounters {
  unsigned long long hits;           // positions found in a hot LRU slot
  unsigned long long window_hits;    // positions served by the always-resident window
  unsigned long long misses;         // positions copied from the host pool this step
  unsigned long long padding;        // entries equal to -1
  unsigned long long duplicates;     // repeats of a position earlier in the same top-k row
  unsigned long long out_of_range;   // positions < -1 or >= seq_len; skipped
  unsigned long long resident_hits;  // positions of a fully resident request (no hot cache)
  // Prefetch accounting, counted only by launches with ResolveView::prefetch_mark set (see there).
  unsigned long long prefetch_useful;  // hits on a slot a prefetch filled and no launch hit since
  unsigned long long prefetch_wasted;  // such slots taken as victims before any hit
  unsigned long long prefetch_missed;  // misses of a launch with count_prefetch_misses
};

// A BatchEntry's `resident` for a request in hot-cache mode (or an unused row).
inline constexpr int32_t kNotResident = -1;

// One row of the step's batch table, written by the manager's plan phase. A row is in use if it
// names a hot-cache block (hot-cache mode) or a residency-table row (resident mode), not both.
struct BatchEntry {
  int32_t block;  // the request's hot-cache block; -1 = none
  // Entries with KV, the newest included (tokens at LayerShape::entry_tokens 1; the manager's
  // offloaded layers share one cadence); top-k positions are entry indices < seq_len.
  int32_t seq_len;
  int32_t page_table_row;           // the request's row in the host pool's page table
  int32_t resident = kNotResident;  // the request's row in the residency table; -1 = none

  SPARSEKV_HD bool in_use() const { return block >= 0 || resident >= 0; }
};

// The cadence rule (docs/deepseek-v4.md, "The step for a layer with cadence r"), written once for
// the plan phase, the backends and the tests. A layer of LayerShape::entry_tokens r gains entry c
// when token (c + 1) * r - 1 is appended: a request of n tokens (BatchEntry::seq_len) holds
// floor(n / r) entries, and the step that brings it to n tokens completes entry n / r - 1 exactly
// when n is a multiple of r. With r = 1 every token is an entry, as in a DSA model.
inline constexpr int32_t kNoEntry = -1;
struct LayerEntries {
  int32_t count;      // entries held: floor(tokens / r)
  int32_t completed;  // the entry completed by the step that reached `tokens`, or kNoEntry
};
// REQUIRES: tokens >= 0, entry_tokens >= 1.
SPARSEKV_HD inline LayerEntries EntriesAt(int32_t tokens, int32_t entry_tokens) {
  const int32_t count = tokens / entry_tokens;
  return {count, tokens > 0 && tokens % entry_tokens == 0 ? count - 1 : kNoEntry};
}
// The raw window's ring slot that the step reaching `tokens` writes: (tokens - 1) mod raw_window
// (CacheOptions::raw_window). REQUIRES: tokens >= 1, raw_window >= 1.
SPARSEKV_HD inline int32_t RawWindowSlot(int32_t tokens, int32_t raw_window) {
  return (tokens - 1) % raw_window;
}

// The resident entries and raw windows of DeepSeek-V4's layers (docs/deepseek-v4.md, "The step
// for a layer with cadence r"), held per request by the manager's DenseLayerStore
// (src/manager/dense_layer_store.h). A request has a row of two device tables: for each resident
// layer the address of each of its pages of page_rows entries, and for every layer the address of
// its ring of raw_window rows. A view names one layer's part of the tables and the step's batch:
// batch row b is the request of table row table_row[b] (-1: unused) with seq_len[b] tokens, the
// newest (this step's) included.

// Every entry of a resident layer, read in place by attention: batch row b (< *batch_size, with
// table_row[b] >= 0) holds Count(b) = floor(seq_len[b] / entry_tokens) entries, entry e at
// Entry(b, e).
struct DenseEntriesView {
  const int32_t* batch_size;  // device scalar: rows in use this step
  const int32_t* table_row;   // [max_batch] the request's row of `pages`, -1 = unused
  const int32_t* seq_len;     // [max_batch] tokens of the request, this step's included
  std::byte* const* pages;    // [table_rows, pages_per_row] address of each page of the layer
  int32_t pages_per_row;      // pages per table row (null past a request's reserved pages)
  int32_t page_rows;          // entries per page
  int32_t row_stride;         // bytes between the entries of a page
  int32_t entry_tokens;       // the layer's cadence r

  SPARSEKV_HD int32_t Count(int32_t b) const { return seq_len[b] / entry_tokens; }
  SPARSEKV_HD const std::byte* Entry(int32_t b, int32_t e) const {
    const std::byte* page =
        pages[static_cast<int64_t>(table_row[b]) * pages_per_row + e / page_rows];
    return page + static_cast<int64_t>(e % page_rows) * row_stride;
  }
};

// A layer's raw window: batch row b (< *batch_size, with table_row[b] >= 0) has
// Valid(b) = min(seq_len[b], raw_window) rows, Row(b, i) for i < Valid(b), oldest first: the row
// of token seq_len[b] - Valid(b) + i, which lies in ring slot (that token) mod raw_window
// (RawWindowSlot).
struct RawWindowView {
  const int32_t* batch_size;  // device scalar: rows in use this step
  const int32_t* table_row;   // [max_batch] the request's row of `rings`, -1 = unused
  const int32_t* seq_len;     // [max_batch] tokens of the request, this step's included
  std::byte* const* rings;    // [table_rows] address of the layer's ring of each request
  int32_t raw_window;         // rows per ring (>= 1)
  int32_t row_stride;         // bytes between the rows of a ring

  SPARSEKV_HD int32_t Valid(int32_t b) const {
    return seq_len[b] < raw_window ? seq_len[b] : raw_window;
  }
  SPARSEKV_HD const std::byte* Row(int32_t b, int32_t i) const {
    const int32_t token = seq_len[b] - Valid(b) + i;
    return rings[table_row[b]] + static_cast<int64_t>(token % raw_window) * row_stride;
  }
};

// One scope of an attention read in place from a DenseLayerStore's views (SparseEntryAttention's
// AttentionScope in its store form): request b of the attention's run is batch row
// r = first_row + b of the views. It attends Count(b) rows, Row(b, 0) .. Row(b, Count(b) - 1) in
// this order: every entry of a resident layer (DenseEntriesView::Count, Entry), or the raw
// window's valid rows oldest first (RawWindowView::Valid, Row). A batch row at or past the
// views' *batch_size, or with table_row < 0, has no rows. The addressing of both the CPU oracle
// and the CUDA kernel.
struct StoreScopeView {
  enum Source : int32_t {
    kNone = 0,          // not this form
    kDenseEntries = 1,  // `entries`; `window` is not read
    kRawWindow = 2,     // `window`; `entries` is not read
  };
  int32_t source;
  int32_t first_row;  // the views' batch row of the run's request 0, >= 0
  DenseEntriesView entries;
  RawWindowView window;

  SPARSEKV_HD int32_t Count(int32_t b) const {
    const int32_t r = first_row + b;
    if (source == kDenseEntries) {
      return r < *entries.batch_size && entries.table_row[r] >= 0 ? entries.Count(r) : 0;
    }
    if (source == kRawWindow) {
      return r < *window.batch_size && window.table_row[r] >= 0 ? window.Valid(r) : 0;
    }
    return 0;
  }
  // REQUIRES: 0 <= k < Count(b).
  SPARSEKV_HD const std::byte* Row(int32_t b, int32_t k) const {
    return source == kDenseEntries ? entries.Entry(first_row + b, k) : window.Row(first_row + b, k);
  }
};

// The step's append to one layer's resident entries and raw window. For every batch row
// b < min(*batch_size, max_batch) with t = table_row[b] >= 0 and n = seq_len[b] >= 1:
//   * if entry_rows is not null and the step completes entry c = EntriesAt(n, entry_tokens)
//     .completed (not kNoEntry), the row_bytes bytes at entry_rows + b * entry_stride go to
//     entry c of the request: pages[t * pages_per_row + c / page_rows] + (c % page_rows) *
//     row_stride; an entry past the request's pages (c / page_rows >= pages_per_row) or whose
//     page is null is skipped and counted in *invalid (if not null);
//   * if window_rows is not null, the row_bytes bytes at window_rows + b * window_stride go to
//     ring slot RawWindowSlot(n, raw_window): rings[t] + slot * row_stride (a null ring is
//     skipped and counted in *invalid).
// Rows with table_row < 0 or seq_len < 1, and rows at or past *batch_size, are not touched;
// entry_rows' rows for which no entry completes are not read. Distinct batch rows must name
// distinct table rows.
struct DenseAppendView {
  const int32_t* batch_size;     // device scalar: rows in use this step
  const int32_t* table_row;      // [max_batch] the request's table row, -1 = unused
  const int32_t* seq_len;        // [max_batch] tokens of the request, this step's included
  const std::byte* entry_rows;   // [max_batch, entry_stride] the entries; null: none (window-only)
  int64_t entry_stride;          // bytes between rows of entry_rows
  const std::byte* window_rows;  // [max_batch, window_stride] the window rows; null: no window
  int64_t window_stride;         // bytes between rows of window_rows
  std::byte* const* pages;       // [table_rows, pages_per_row] address of each page of the layer
  int32_t pages_per_row;         // pages per table row (null past a request's reserved pages)
  int32_t page_rows;             // entries per page
  std::byte* const* rings;       // [table_rows] address of the layer's ring of each request
  int32_t raw_window;            // rows per ring, >= 1 when window_rows is set
  int32_t entry_tokens;          // the layer's cadence r >= 1
  int32_t row_bytes;             // bytes copied per row
  int32_t row_stride;            // bytes between rows of a page or ring (>= row_bytes)
  unsigned long long* invalid;   // device scalar or nullptr; += skipped rows

  // The appends of batch row b, the semantics above written once for every backend. Where its
  // completed entry goes: null when it appends no entry this step (no entry rows, the row unused,
  // or no entry completes); *skipped is set when one completes but has no page.
  SPARSEKV_HD std::byte* EntryDestination(int32_t b, bool* skipped) const {
    *skipped = false;
    const int32_t t = table_row[b];
    const int32_t n = seq_len[b];
    if (entry_rows == nullptr || t < 0 || n < 1) return nullptr;
    const int32_t c = EntriesAt(n, entry_tokens).completed;
    if (c == kNoEntry) return nullptr;
    std::byte* page = c / page_rows < pages_per_row
                          ? pages[static_cast<int64_t>(t) * pages_per_row + c / page_rows]
                          : nullptr;
    if (page == nullptr) {
      *skipped = true;
      return nullptr;
    }
    return page + static_cast<int64_t>(c % page_rows) * row_stride;
  }
  // Where its window row goes: null when it appends none (no window rows, the row unused); *skipped
  // is set when its ring is null.
  SPARSEKV_HD std::byte* WindowDestination(int32_t b, bool* skipped) const {
    *skipped = false;
    const int32_t t = table_row[b];
    const int32_t n = seq_len[b];
    if (window_rows == nullptr || t < 0 || n < 1) return nullptr;
    std::byte* ring = rings[t];
    if (ring == nullptr) {
      *skipped = true;
      return nullptr;
    }
    return ring + static_cast<int64_t>(RawWindowSlot(n, raw_window)) * row_stride;
  }
};
// The shapes every backend's DenseAppend supports.
inline bool DenseAppendShapeOk(const DenseAppendView& v) {
  return v.entry_tokens >= 1 && v.page_rows >= 1 && v.pages_per_row >= 0 && v.row_bytes >= 1 &&
         v.row_stride >= v.row_bytes && (v.window_rows == nullptr || v.raw_window >= 1);
}

// How the CUDA IndexCopy moves its rows (performance only: every strategy writes the same bytes
// and counts the same invalid entries; docs/index-copy.md compares them). Other backends ignore it.
enum class CopyStrategy : int32_t {
  // Threads in fixed (row, 16-B chunk) lanes over the whole grid, 4 rows in flight per thread.
  kLattice = 0,
  // The same lattice with 8 rows in flight per thread (fewer threads per SM, as registers allow).
  kLatticeWide = 1,
  // Each warp copies a batch of up to 32 whole rows, its lanes over the batch's chunks in order,
  // 4 chunks in flight per lane.
  kWarpRows = 2,
  // Hopper's bulk copy engine (cp.async.bulk): each warp stages batches of rows in shared memory,
  // one batch loading while the previous one is stored. Needs compute capability 9.0, 16-B
  // aligned rows and row_bytes <= 4096; a launch that lacks any of them runs kLattice.
  kBulk = 3,
};

// dst[dst_index[i]] = src[src_index[i]] for i < min(*count, capacity), `row_bytes` bytes each.
// An entry whose source or destination index is outside [0, src_rows) / [0, dst_rows) is skipped
// and counted in *invalid (if not null). Distinct valid entries must not share a destination.
// src and dst may each be device memory or host memory the device can address.
struct IndexCopyView {
  const std::byte* src;      // [src_rows, src_stride]
  std::byte* dst;            // [dst_rows, dst_stride]
  const int32_t* src_index;  // [capacity]
  const int32_t* dst_index;  // [capacity]
  const int32_t* count;      // device scalar; entries to copy
  int32_t capacity;          // size of the index arrays
  int32_t row_bytes;         // bytes copied per row
  int64_t src_stride;        // bytes between source rows
  int64_t dst_stride;        // bytes between destination rows
  int64_t src_rows;
  int64_t dst_rows;
  unsigned long long* invalid;  // device scalar or nullptr; += skipped entries
  int32_t max_blocks;           // CUDA: largest grid, in blocks of 256 threads; 0 = as many as
                                // the device holds resident. Other backends ignore it.
  CopyStrategy strategy = CopyStrategy::kLattice;  // CUDA: see above. Other backends ignore it.
};

// Two IndexCopys as one operation (one CUDA kernel): a step's append of its new rows and of their
// indexer keys, which share the list of batch rows. The result is exactly IndexCopy(first)
// followed by IndexCopy(second), each view's invalid entries counted in its own `invalid`.
// REQUIRES (not checked): neither copy reads or writes a row the other writes (so that their order
// does not matter). Meant for short lists, a few entries per batch row: the CUDA kernel gives each
// entry index i a block for both views' entry i and reads neither max_blocks nor strategy.
struct IndexCopyPairView {
  IndexCopyView first;
  IndexCopyView second;
};

// Splits an index list by where each source row lives, so that the rows of each place are copied
// by an IndexCopy from that place's memory (the peer tier, peer_tier.h, reads this way the rows
// that another GPU also holds). Source rows are grouped in pages of page_rows rows; page q lives
// at place page_place[q] (0: the list's own source) from row page_row[q] on. For i <
// min(*count, capacity), entry (r = src_index[i], d = dst_index[i]) with q = r / page_rows goes to
//   * list t = page_place[q] as (page_row[q] + r % page_rows, d) if 0 <= r < pages * page_rows
//     and 1 <= t < places;
//   * list 0 unchanged otherwise (a row out of range is left for the copy to skip and count).
// List t is out_src[t * capacity + j], out_dst[t * capacity + j] for j < out_count[t]. Every
// out_count[t], t < places, is set; list entries past the counts are not touched. The order of
// a list's entries is unspecified (the CPU backend keeps the input's).
inline constexpr int32_t kMaxRoutePlaces = 8;
struct RouteRowsView {
  const int32_t* src_index;   // [capacity]
  const int32_t* dst_index;   // [capacity]
  const int32_t* count;       // device scalar; entries to route
  int32_t capacity;           // size of the index arrays and of each output list
  const int32_t* page_place;  // [pages] place of each source page, 0 = the list's own source
  const int32_t* page_row;    // [pages] row of the page's first row in its place
  int64_t pages;
  int32_t page_rows;
  int32_t places;                        // output lists, in [1, kMaxRoutePlaces]
  int32_t* out_src;                      // [places, capacity]
  int32_t* out_dst;                      // [places, capacity]
  int32_t* out_count;                    // [places] device scalars, set by the operator
  unsigned long long* routed = nullptr;  // device scalar or nullptr; += entries put in lists >= 1
};

// Resolve one layer's top-k for the whole batch against the hot cache.
//
// Resident rows. A row with e.resident >= 0 (its request's whole KV is in HBM) has no replacement
// state and no misses. Each entry p is padding, out_of_range or a duplicate exactly as below;
// otherwise it is a resident hit: out = resident_table[e.resident * resident_pages + p / R]
// + p % R with R = resident_page_rows (the first layer-wide slot of each page of R positions).
// fill_mask is 0; share_duplicates applies as below. Rows with neither a block nor a residency
// row are not touched.
//
// For every batch row b < *batch_size (rows at or past it are not touched), with entry e =
// batch[b], C = hot_slots, W = window, window_begin = max(0, e.seq_len - W), and the layer-wide
// slot of the block's slot s (in [0, C + W))
//   slot(s) = block_pages[e.block * pages_per_block + s / block_page_rows] + s % block_page_rows
// (or e.block * (C + W) + s when block_pages is null: every block one run of slots), each top-k
// entry p = topk[b * topk_stride + k] is:
//   * -1                                 -> padding:      out = -1
//   * p < -1 or p >= e.seq_len           -> out_of_range: out = -1
//   * an earlier entry of the row was p  -> duplicate:    out = -1, or with share_duplicates the
//                                           out of the first entry holding p (after the misses
//                                           below are placed)
//   * p >= window_begin                  -> window hit:   out = slot(C + p % W)
//   * slot_token[block][s] == p, s < C   -> hit:          out = slot(s)
//   * otherwise                          -> miss (the i-th miss of the row, in k order).
// Victims: walk lru_order[block][0..C) (least recently used first) and take the first n_miss
// slots not hit in this step; the i-th miss gets the i-th victim v_i: slot_token = p,
// out = slot(v_i), and the miss list gets (host row of p, slot(v_i)). The host row of p is
// page_table[e.page_table_row * pages_per_request + p / page_tokens] * page_tokens
//   + p % page_tokens.
// New LRU order: the slots neither hit nor filled keep their relative order at the front; the
// slots hit or filled follow, also in their previous relative order.
// Segmented LRU (lru_protected not null): the order is [probationary | protected], the protected
// part being its last q = lru_protected[block] entries (clamped into [0, C]). Victims are taken
// exactly as above (the probationary part's least recently used first). The new order is the
// concatenation, each group in its previous relative order, of: the untouched slots (neither hit
// nor filled) at old index < C - q; the filled slots; the untouched slots at old index >= C - q;
// the hit slots. The new q is min(protected_capacity, untouched slots at old index >= C - q + hit
// slots): hits are promoted, fills enter the probationary part, and the protected part's overflow
// (its least recently used entries) is demoted to the probationary part's most recent end, after
// the fills. With no slot filled, both policies give the same order.
// Clock (clock_uses not null; lru_order and lru_protected are then not read). The block's state is
// slot_token, a use count per slot (clock_uses, in [0, kClockMaxUses]), a hand (clock_hand) and
// the slot of each position (position_slot, -1: none), which replaces the walk over the C slots.
// A position p >= positions is out of range, as one at or past seq_len. Entry p (not padding, out
// of range, a duplicate or a window hit) is a hit iff s = position_slot[block][p] is in [0, C),
// and a miss otherwise. With H the slots hit, the victims are taken by a sweep from the hand (0 if
// it is outside [0, C)) over the slots in order, wrapping at C: a slot in H or already taken in
// this step is passed; a slot whose use count is positive has it decremented and is passed; a
// slot whose count is 0 is the next victim. The sweep stops right after the n_filled-th victim
// (the hand is then the slot after it; with no victim the hand stays). Miss i gets victim v_i: if
// slot_token[v_i] = q is in [0, positions), position_slot[q] = -1; then slot_token = p and
// position_slot[p] = v_i. Each hit slot's count becomes min(kClockMaxUses, count + 1); a filled
// slot's count is 0 (a victim's count is 0 already). A step costs O(top_k + the slots the hand
// passes), not O(C): a positive count is passed once per earlier hit that raised it, so the hand's
// passes are paid for by hits and fills; a step can still sweep up to 1 + kClockMaxUses laps when
// every count is high.
// Prefetch accounting (prefetch_mark not null; rows in hot-cache mode only). prefetch_mark holds a
// byte per slot of each block, like slot_token: nonzero = a prefetch launch filled the slot and no
// launch without prefetch_fills has hit it since. With mark = prefetch_mark[block]:
//   * a launch without prefetch_fills (a step's resolve), for each hit slot s (not a window hit):
//     if mark[s] != 0, ++prefetch_useful and mark[s] = 0; a launch with prefetch_fills leaves the
//     marks of its hit slots as they are;
//   * every launch, for each victim v it fills: if mark[v] != 0, ++prefetch_wasted; then
//     mark[v] = 1 with prefetch_fills, else 0;
//   * a launch without prefetch_fills whose count_prefetch_misses byte is nonzero adds its misses
//     (every miss, filled or not) to prefetch_missed too. The byte is read on the device when the
//     launch runs, so that a captured launch counts as its replay's prefetches say, not as they
//     were at capture.
// So every slot a prefetch launch fills is counted once, as useful or wasted, unless it is still
// marked, and the three counters are the same under every eviction policy given the same hits
// and victims. With prefetch_mark null none of this is done (no load, no store).
// Miss entries of all rows are appended at miss_count (atomically; with chunk_rows, to their
// chunk's part of the list and count); their order in the list is unspecified (the CUDA backend
// sorts each row's misses by host row). A launch with the fused miss
// copy (below) copies them instead.
// If fill_mask is not null, fill_mask[b * top_k + k] = 1 where out names a slot that this step's
// miss list fills (a miss given a victim, or with share_duplicates a repeat of one), else 0: the
// entries whose rows are not in the hot cache until the miss copy has run.
//
// Fused miss copy (copy_dst not null; performance only). In a launch whose *batch_size is at least
// fused_copy_min_batch, each hot-cache row copies its own filled misses instead of appending them:
// for every (host row r, slot s) that the row would append to the miss list,
//   copy_dst[s * copy_dst_stride + i] = copy_src[r * copy_src_stride + i] for i < copy_row_bytes
// if 0 <= r < copy_src_rows and 0 <= s < copy_dst_rows; otherwise that copy is skipped and counted
// in *copy_invalid (if not null). Such a launch appends nothing to the miss list and leaves
// *miss_count as it was, so that an IndexCopy of the list enqueued after it copies nothing; every
// other output (slots, fill_mask, slot_token, LRU state, counters) is as without the fused copy,
// and the copied rows are in place when the launch completes. A launch below the threshold, or with
// copy_dst null, ignores the copy fields and appends its misses as above. With sort_misses (and
// *batch_size >= sort_min_batch) each row copies its misses in host-row order. copy_src and
// copy_dst may each be device memory or host memory the device can address.
// REQUIRES (not checked): no slot the launch fills lies in memory that any copy reads.
// Supported (CUDA: checked, else an invalid-argument error): copy_row_bytes in
// [1, kMaxFusedCopyRowBytes], non-negative copy strides and row counts.
inline constexpr int32_t kMaxFusedCopyRowBytes = 1 << 24;
// The most hot slots per request and layer (hot_slots, C) that the resolve kernels support
// (CacheOptions::hot_slots is checked against it).
inline constexpr int32_t kMaxHotSlots = 65536;
// Clock: the largest use count of a slot (a hit adds one, the hand takes one away as it passes).
inline constexpr uint8_t kClockMaxUses = 3;
struct ResolveView {
  const int32_t* batch_size;   // device scalar: rows in use this step
  const BatchEntry* batch;     // [max_batch]
  const int32_t* topk;         // [max_batch, topk_stride] positions, -1 = padding
  int32_t top_k;               // entries per row
  int32_t topk_stride;         // elements between rows of topk (>= top_k)
  int32_t* slots_out;          // [max_batch, top_k] layer-wide slot, kNullSlot for skipped
  int32_t* slot_token;         // [num_blocks, hot_slots] this layer's slot -> position, -1 empty
  int32_t* lru_order;          // [num_blocks, hot_slots] this layer's slots, LRU first
  int32_t* lru_protected;      // [num_blocks] protected entries at lru_order's end; nullptr = LRU
  int32_t protected_capacity;  // segmented LRU: the most slots the protected part holds, <= C
  // Clock (see above); clock_uses null: the LRU order above.
  uint8_t* clock_uses = nullptr;     // [num_blocks, hot_slots] use count of each slot
  int32_t* clock_hand = nullptr;     // [num_blocks] the slot the next sweep starts at
  int32_t* position_slot = nullptr;  // [num_blocks, positions] slot of each position, -1 = none
  int32_t positions = 0;             // entries per block of position_slot (>= every seq_len)
  int32_t hot_slots;                 // C
  int32_t window;                    // W
  const int32_t* page_table;         // [max_requests, pages_per_request] host page of each page
  int32_t pages_per_request;
  int32_t page_tokens;
  int32_t* miss_host_row;  // [miss_capacity] source row in the host pool layer
  int32_t* miss_slot;      // [miss_capacity] destination layer-wide slot
  // Device scalar, zeroed before the launch; with chunk_rows, one per chunk.
  int32_t* miss_count;
  int32_t miss_capacity;  // >= max_batch * top_k (with chunk_rows: rounded up to whole chunks)
  // 0: one miss list. Otherwise row b's misses go to chunk c = b / chunk_rows: list entries from
  // c * chunk_entries() on, counted in miss_count[c] (so that the rows of a chunk can be
  // copied, and attended, before the others).
  int32_t chunk_rows = 0;
  // Entries of the list per chunk, >= chunk_rows * top_k; 0: chunk_rows * top_k. Larger where
  // one list serves layers of several top-k (the largest one's chunks).
  int32_t chunk_stride = 0;
  SPARSEKV_HD int64_t chunk_entries() const {
    return chunk_stride > 0 ? chunk_stride : int64_t{chunk_rows} * top_k;
  }
  ResolveCounters* counters;  // this layer's counters
  uint8_t* fill_mask;         // [max_batch, top_k] or nullptr; see above
  bool sort_misses;           // sort each row's misses by host row (performance only),
  int32_t sort_min_batch;     // in launches whose *batch_size is at least this
  // Repeats of a position share its slot (several query tokens' top-k in one row: MTP).
  bool share_duplicates;
  // Resident rows (see above); null when no request can be resident.
  const int32_t* resident_table;  // [residency rows, resident_pages] first slot of each page
  int32_t resident_pages;         // pages per residency row
  int32_t resident_page_rows;     // R: positions per page
  // Where each block's slots are (see slot(s) above); null: block b is slots
  // [b * (C + W), (b + 1) * (C + W)).
  const int32_t* block_pages = nullptr;  // [num_blocks, pages_per_block] first slot of each page
  int32_t pages_per_block = 0;
  int32_t block_page_rows = 0;  // slots per page
  // Fused miss copy (see above); copy_dst null: never.
  const std::byte* copy_src = nullptr;  // [copy_src_rows, copy_src_stride] the host pool's layer
  std::byte* copy_dst = nullptr;        // [copy_dst_rows, copy_dst_stride] the hot cache's layer
  int32_t copy_row_bytes = 0;           // bytes copied per row, >= 1 when copy_dst is set
  int64_t copy_src_stride = 0;          // bytes between source rows
  int64_t copy_dst_stride = 0;          // bytes between destination rows
  int64_t copy_src_rows = 0;
  int64_t copy_dst_rows = 0;
  unsigned long long* copy_invalid = nullptr;  // device scalar or nullptr; += skipped copies
  int32_t fused_copy_min_batch = 0;  // fused in launches whose *batch_size is at least this
  // Prefetch accounting (see above); null: none.
  uint8_t* prefetch_mark = nullptr;  // [num_blocks, hot_slots] 1 = filled by a prefetch, unused
  bool prefetch_fills = false;       // this launch is a prefetch's: its fills set the marks
  // Device byte or null (none); nonzero: misses also count in prefetch_missed (see above).
  const uint8_t* count_prefetch_misses = nullptr;
};

// The indexer keys of one layer that the manager keeps (CacheOptions::indexer_key_bytes), for an
// engine's indexer kernel: the key of position p (< seq_len) of the request in batch row b is the
// key_bytes bytes at Key(batch[b].page_table_row, p). Keys live in pages of the manager's device
// memory, keys_per_page of them packed from the start of each page.
struct IndexerKeyView {
  const int32_t* batch_size;  // device scalar: rows in use this step
  const BatchEntry* batch;    // [max_batch] the step's requests
  const std::byte* keys;      // the layer's device memory (SparseKVCacheManager::HotLayer)
  int64_t row_stride;         // bytes per slot of that memory
  const int32_t* page_table;  // [owners, pages_per_request] first slot of each key page
  int32_t pages_per_request;
  int32_t keys_per_page;
  int32_t key_bytes;

  SPARSEKV_HD const std::byte* Key(int32_t page_table_row, int32_t position) const {
    const int64_t page = page_table[static_cast<int64_t>(page_table_row) * pages_per_request +
                                    position / keys_per_page];
    return keys + page * row_stride + static_cast<int64_t>(position % keys_per_page) * key_bytes;
  }
};

// out[b, k] = hot[slots[b, k]] for b < *batch_size and k < top_k; a row whose slot is kNullSlot
// (or outside [0, hot_rows)) is zero-filled. Rows b >= *batch_size are not touched.
struct AssembleView {
  const int32_t* batch_size;  // device scalar
  const std::byte* hot;       // [hot_rows, stride] one layer of the hot cache
  int64_t hot_rows;
  const int32_t* slots;  // [max_batch, top_k]
  std::byte* out;        // [max_batch, top_k, stride]
  int32_t top_k;
  int32_t row_bytes;
  int64_t stride;
};

}  // namespace sparsekv
