#include "cpu/reference_ops.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace sparsekv::reference {

void IndexCopy(const IndexCopyView& v) {
  const int32_t n = std::clamp(*v.count, 0, v.capacity);
  for (int32_t i = 0; i < n; ++i) {
    const int64_t s = v.src_index[i];
    const int64_t d = v.dst_index[i];
    if (s < 0 || s >= v.src_rows || d < 0 || d >= v.dst_rows) {
      if (v.invalid != nullptr) ++*v.invalid;
      continue;
    }
    std::memcpy(v.dst + d * v.dst_stride, v.src + s * v.src_stride, v.row_bytes);
  }
}

void IndexCopyPair(const IndexCopyPairView& v) {
  IndexCopy(v.first);
  IndexCopy(v.second);
}

namespace {

// Resolves one row of a resident request: a direct position -> slot mapping.
void ResolveResidentRow(const ResolveView& v, int32_t b) {
  const BatchEntry e = v.batch[b];
  const int32_t* topk = v.topk + static_cast<int64_t>(b) * v.topk_stride;
  int32_t* out = v.slots_out + static_cast<int64_t>(b) * v.top_k;
  const int32_t* pages = v.resident_table + static_cast<int64_t>(e.resident) * v.resident_pages;
  uint8_t* fill = v.fill_mask == nullptr ? nullptr : v.fill_mask + int64_t{b} * v.top_k;
  ResolveCounters& n = *v.counters;
  std::unordered_map<int32_t, int32_t> seen;  // position -> first entry holding it
  for (int32_t k = 0; k < v.top_k; ++k) {
    const int32_t p = topk[k];
    out[k] = kNullSlot;
    if (fill != nullptr) fill[k] = 0;
    if (p == kPaddingPosition) {
      ++n.padding;
    } else if (p < 0 || p >= e.seq_len) {
      ++n.out_of_range;
    } else if (auto [first, fresh] = seen.emplace(p, k); !fresh) {
      ++n.duplicates;
      if (v.share_duplicates) out[k] = out[first->second];
    } else {
      ++n.resident_hits;
      out[k] = pages[p / v.resident_page_rows] + p % v.resident_page_rows;
    }
  }
}

// Copies one filled miss in place (the fused miss copy): the IndexCopy of that single entry.
void CopyMiss(const ResolveView& v, int64_t host_row, int64_t slot) {
  if (host_row < 0 || host_row >= v.copy_src_rows || slot < 0 || slot >= v.copy_dst_rows) {
    if (v.copy_invalid != nullptr) ++*v.copy_invalid;
    return;
  }
  std::memcpy(v.copy_dst + slot * v.copy_dst_stride, v.copy_src + host_row * v.copy_src_stride,
              v.copy_row_bytes);
}

// Resolves one batch row; with `fused`, copies its filled misses instead of appending them.
// Invariant kept: slot_token (and, with the clock, position_slot) of the block describe exactly the
// positions resident in its C slots, and lru_order is a permutation of [0, C).
void ResolveRow(const ResolveView& v, int32_t b, bool fused, std::vector<int32_t>& misses) {
  const BatchEntry e = v.batch[b];
  const int32_t c = v.hot_slots;
  const int32_t w = v.window;
  // The layer-wide slot of the block's slot s.
  const auto slot = [&](int32_t s) {
    if (v.block_pages == nullptr) return e.block * (c + w) + s;
    const int32_t r = v.block_page_rows;
    return v.block_pages[static_cast<int64_t>(e.block) * v.pages_per_block + s / r] + s % r;
  };
  const int32_t window_begin = std::max(0, e.seq_len - w);
  const int32_t* topk = v.topk + static_cast<int64_t>(b) * v.topk_stride;
  int32_t* out = v.slots_out + static_cast<int64_t>(b) * v.top_k;
  int32_t* slot_token = v.slot_token + static_cast<int64_t>(e.block) * c;
  const bool clock = v.clock_uses != nullptr;
  int32_t* lru = clock ? nullptr : v.lru_order + static_cast<int64_t>(e.block) * c;
  ResolveCounters& n = *v.counters;
  uint8_t* mark =
      v.prefetch_mark == nullptr ? nullptr : v.prefetch_mark + static_cast<int64_t>(e.block) * c;

  int32_t* position_slot =
      clock ? v.position_slot + static_cast<int64_t>(e.block) * v.positions : nullptr;
  // Position -> slot: the clock's map (in range only), else from the C slots.
  std::unordered_map<int32_t, int32_t> slot_of;
  if (!clock) {
    for (int32_t s = 0; s < c; ++s) {
      if (slot_token[s] >= 0) slot_of.emplace(slot_token[s], s);
    }
  }
  const auto find_slot = [&](int32_t p) {
    if (clock) {
      const int32_t s = position_slot[p];
      return s >= 0 && s < c ? s : -1;
    }
    const auto it = slot_of.find(p);
    return it == slot_of.end() ? -1 : it->second;
  };
  std::unordered_map<int32_t, int32_t> seen;  // position -> first entry holding it
  std::vector<char> touched(c, 0);
  std::vector<int32_t> repeats;  // entries repeating an earlier one
  uint8_t* fill = v.fill_mask == nullptr ? nullptr : v.fill_mask + int64_t{b} * v.top_k;
  misses.clear();
  for (int32_t k = 0; k < v.top_k; ++k) {
    const int32_t p = topk[k];
    out[k] = kNullSlot;
    if (fill != nullptr) fill[k] = 0;
    if (p == kPaddingPosition) {
      ++n.padding;
    } else if (p < 0 || p >= e.seq_len || (clock && p >= v.positions)) {
      ++n.out_of_range;
    } else if (!seen.emplace(p, k).second) {
      ++n.duplicates;
      repeats.push_back(k);
    } else if (p >= window_begin) {
      ++n.window_hits;
      out[k] = slot(c + p % w);
    } else if (const int32_t s = find_slot(p); s >= 0) {
      ++n.hits;
      out[k] = slot(s);
      touched[s] = 1;
      if (mark != nullptr && !v.prefetch_fills && mark[s] != 0) {
        ++n.prefetch_useful;
        mark[s] = 0;
      }
    } else {
      misses.push_back(k);
    }
  }
  // Hit slots (touched before any victim is taken); the rest of `touched` become victims.
  const std::vector<char> hit = touched;
  const int32_t n_hit = static_cast<int32_t>(std::count(hit.begin(), hit.end(), 1));
  const size_t n_filled = std::min<size_t>(misses.size(), c - n_hit);
  // Victims: the least recently used slots that no hit touched, or the clock's sweep.
  std::vector<int32_t> victims;
  if (clock) {
    uint8_t* uses = v.clock_uses + static_cast<int64_t>(e.block) * c;
    int32_t& hand = v.clock_hand[e.block];
    if (hand < 0 || hand >= c) hand = 0;
    while (victims.size() < n_filled) {
      const int32_t s = hand;
      hand = s + 1 == c ? 0 : s + 1;
      if (touched[s]) continue;
      if (uses[s] > 0) {
        --uses[s];
      } else {
        victims.push_back(s);
        touched[s] = 1;
      }
    }
    for (int32_t s = 0; s < c; ++s) {
      if (hit[s]) uses[s] = static_cast<uint8_t>(std::min<int32_t>(kClockMaxUses, uses[s] + 1));
    }
  } else {
    for (int32_t i = 0; i < c && victims.size() < n_filled; ++i) {
      if (!touched[lru[i]]) victims.push_back(lru[i]);
    }
  }
  for (size_t i = 0; i < n_filled; ++i) {
    const int32_t s = victims[i];
    const int32_t k = misses[i];
    const int32_t p = topk[k];
    touched[s] = 1;
    if (clock) {
      const int32_t q = slot_token[s];
      if (q >= 0 && q < v.positions) position_slot[q] = -1;
      position_slot[p] = s;
    }
    slot_token[s] = p;
    if (mark != nullptr) {
      n.prefetch_wasted += mark[s] != 0;
      mark[s] = v.prefetch_fills ? 1 : 0;
    }
    out[k] = slot(s);
    if (fill != nullptr) fill[k] = 1;
    const int32_t page = v.page_table[static_cast<int64_t>(e.page_table_row) * v.pages_per_request +
                                      p / v.page_tokens];
    const int32_t host_row = page * v.page_tokens + p % v.page_tokens;
    if (fused) {
      CopyMiss(v, host_row, out[k]);
      continue;
    }
    const int32_t chunk = v.chunk_rows > 0 ? b / v.chunk_rows : 0;
    const int64_t slot_index = chunk * v.chunk_entries() + v.miss_count[chunk]++;
    v.miss_host_row[slot_index] = host_row;
    v.miss_slot[slot_index] = out[k];
  }
  n.misses += misses.size();
  if (mark != nullptr && v.count_prefetch_misses != nullptr && *v.count_prefetch_misses != 0 &&
      !v.prefetch_fills) {
    n.prefetch_missed += misses.size();
  }
  if (v.share_duplicates) {
    for (const int32_t k : repeats) {
      const int32_t first = seen.at(topk[k]);
      out[k] = out[first];
      if (fill != nullptr) fill[k] = fill[first];
    }
  }
  if (clock) return;
  if (v.lru_protected == nullptr) {
    // Untouched slots first, then touched ones, each in their previous order.
    std::stable_partition(lru, lru + c, [&](int32_t s) { return !touched[s]; });
    return;
  }
  // Segmented: [untouched probationary][filled][untouched protected][hit], each in order.
  int32_t& protected_count = v.lru_protected[e.block];
  const int32_t first_protected = c - std::clamp(protected_count, 0, c);
  std::vector<int32_t> group(c, 0);
  int32_t promoted = 0;
  for (int32_t i = 0; i < c; ++i) {
    const int32_t s = lru[i];
    group[s] = hit[s] ? 3 : touched[s] ? 1 : i >= first_protected ? 2 : 0;
    promoted += group[s] >= 2;
  }
  std::stable_sort(lru, lru + c, [&](int32_t a, int32_t b) { return group[a] < group[b]; });
  protected_count = std::min(v.protected_capacity, promoted);
}

}  // namespace

void Resolve(const ResolveView& v) {
  const bool fused = v.copy_dst != nullptr && *v.batch_size >= v.fused_copy_min_batch;
  std::vector<int32_t> misses;
  for (int32_t b = 0; b < *v.batch_size; ++b) {
    if (v.batch[b].resident >= 0) {
      ResolveResidentRow(v, b);
    } else if (v.batch[b].block >= 0) {
      ResolveRow(v, b, fused, misses);
    }
  }
}

void Assemble(const AssembleView& v) {
  for (int32_t b = 0; b < *v.batch_size; ++b) {
    for (int32_t k = 0; k < v.top_k; ++k) {
      const int64_t row = static_cast<int64_t>(b) * v.top_k + k;
      const int32_t s = v.slots[row];
      std::byte* out = v.out + row * v.stride;
      if (s < 0 || s >= v.hot_rows) {
        std::memset(out, 0, v.row_bytes);
      } else {
        std::memcpy(out, v.hot + s * v.stride, v.row_bytes);
      }
    }
  }
}

void DenseAppend(const DenseAppendView& v, int32_t max_batch) {
  const int32_t rows = std::clamp(*v.batch_size, 0, max_batch);
  for (int32_t b = 0; b < rows; ++b) {
    bool skipped = false;
    if (std::byte* dst = v.EntryDestination(b, &skipped)) {
      std::memcpy(dst, v.entry_rows + b * v.entry_stride, v.row_bytes);
    }
    if (skipped && v.invalid != nullptr) ++*v.invalid;
    if (std::byte* dst = v.WindowDestination(b, &skipped)) {
      std::memcpy(dst, v.window_rows + b * v.window_stride, v.row_bytes);
    }
    if (skipped && v.invalid != nullptr) ++*v.invalid;
  }
}

void RouteRows(const RouteRowsView& v) {
  std::fill_n(v.out_count, v.places, 0);
  const int32_t n = std::clamp(*v.count, 0, v.capacity);
  for (int32_t i = 0; i < n; ++i) {
    int64_t r = v.src_index[i];
    int32_t place = 0;
    if (r >= 0 && r < v.pages * v.page_rows) {
      const int64_t q = r / v.page_rows;
      if (v.page_place[q] >= 1 && v.page_place[q] < v.places) {
        place = v.page_place[q];
        r = v.page_row[q] + r % v.page_rows;
      }
    }
    if (place > 0 && v.routed != nullptr) ++*v.routed;
    const int64_t j = int64_t{place} * v.capacity + v.out_count[place]++;
    v.out_src[j] = static_cast<int32_t>(r);
    v.out_dst[j] = v.dst_index[i];
  }
}

}  // namespace sparsekv::reference
