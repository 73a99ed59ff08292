// StepPlan: what the plan phase of a decode step writes for its run phase, and where.
//
// It owns the plan region (a host mirror and its device copy, uploaded with one copy per step),
// the step's batch, the two step miss lists that index groups alternate between, the prefetch
// list, and the arithmetic over them: copy chunks, and the lanes an extension may key its own
// lists by (ExtensionHost::miss_list_lanes). It knows no request: PlanStep fills the rows Begin
// hands it.
//
// The plan region, uploaded with one copy per step:
//   [batch_size: int32, append_count: int32, padded to 16 B][batch: BatchEntry x max_batch]
//   [append_src: int32 x max_batch]   the append list: the batch rows whose step completes an
//                                     entry (every row at entry_tokens 1), as rows of the
//                                     caller's new_rows, compacted; append_count of them
//   [append_slot: int32 x max_batch]  window slot of each appended entry
//   [append_row: int32 x max_batch]   host row of each appended entry
//   [append_key: int32 x max_batch]   with indexer keys: where each appended entry's key goes, in
//                                     4-byte words of a layer's device memory
// The append kernels are launched for max_batch entries and read append_count on the device, so
// a captured graph stays valid whichever rows complete an entry.
//   [miss_count: int32 x index groups x chunks] each group's miss count (per copy chunk), 0
//                                     until its resolve (so that no resolve needs a memset)
//
// Not thread-safe; owned by the manager.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "manager/device_memory.h"
#include "sparsekv/backend.h"
#include "sparsekv/index_groups.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/manager_extension.h"
#include "sparsekv/options.h"
#include "sparsekv/types.h"

namespace sparsekv {

class StepPlan {
 public:
  // Byte offsets of the plan region's parts (above).
  struct Layout {
    Layout(int32_t max_batch, int32_t counts)
        : batch(16),
          append_src(batch + sizeof(BatchEntry) * max_batch),
          append_slot(append_src + sizeof(int32_t) * max_batch),
          append_row(append_slot + sizeof(int32_t) * max_batch),
          append_key(append_row + sizeof(int32_t) * max_batch),
          miss_count(append_key + sizeof(int32_t) * max_batch),
          bytes(miss_count + sizeof(int32_t) * counts) {}
    size_t batch_size = 0;
    size_t append_count = sizeof(int32_t);
    size_t batch;
    size_t append_src;
    size_t append_slot;
    size_t append_row;
    size_t append_key;
    size_t miss_count;
    size_t bytes;
  };
  // The host mirror's per-row parts, [max_batch] each, for PlanStep to fill: the batch table
  // by batch row; the append list (its entries in list order) through Append.
  struct Rows {
    BatchEntry* entries;
    int32_t* append_slot;
    int32_t* append_row;
    int32_t* append_key;
  };

  StepPlan(const CacheOptions& options, Backend& backend);
  StepPlan(const StepPlan&) = delete;
  StepPlan& operator=(const StepPlan&) = delete;
  // The plan region's device copy and the miss lists (zeroed on the null stream).
  Status Allocate();

  // ---- Plan phase ----
  // Starts the host mirror of a step of `batch_size` rows: its size, an empty append list, and
  // every miss count 0.
  Rows Begin(int32_t batch_size) {
    std::byte* plan = host_.data();
    *At<int32_t>(plan, layout_.batch_size) = batch_size;
    *At<int32_t>(plan, layout_.append_count) = 0;
    std::fill_n(At<int32_t>(plan, layout_.miss_count), miss_counts_, 0);
    return Rows{At<BatchEntry>(plan, layout_.batch), At<int32_t>(plan, layout_.append_slot),
                At<int32_t>(plan, layout_.append_row), At<int32_t>(plan, layout_.append_key)};
  }
  // Adds batch row b, whose step completes an entry, to the append list: its entry goes to
  // `slot` (device), `row` (host pool) and, with keys, key word `key` (-1: none).
  void Append(int32_t b, int32_t slot, int32_t row, int32_t key) {
    std::byte* plan = host_.data();
    int32_t& count = *At<int32_t>(plan, layout_.append_count);
    At<int32_t>(plan, layout_.append_src)[count] = b;
    At<int32_t>(plan, layout_.append_slot)[count] = slot;
    At<int32_t>(plan, layout_.append_row)[count] = row;
    At<int32_t>(plan, layout_.append_key)[count] = key;
    ++count;
  }
  // Entries in the append list of the planned step (the host mirror's).
  int32_t append_count() const {
    return *At<int32_t>(const_cast<std::byte*>(host_.data()), layout_.append_count);
  }
  void SetBatch(std::span<const RequestId> batch) { batch_.assign(batch.begin(), batch.end()); }
  // Whether the planned step's resolves can find a miss: false only when every request of its
  // batch is resident and no extension is active in it (SparseKVCacheManager::StepCanMiss).
  void SetCanMiss(bool can_miss) { can_miss_ = can_miss; }
  bool can_miss() const { return can_miss_; }
  // Copies the host mirror to the device copy on `stream`.
  Status Upload(StreamHandle stream) {
    return backend_->CopyAsync(device_, host_.data(), layout_.bytes, stream);
  }

  // The last planned batch.
  std::span<const RequestId> batch() const { return batch_; }
  int32_t batch_size() const { return static_cast<int32_t>(batch_.size()); }
  bool Contains(RequestId id) const {
    return std::find(batch_.begin(), batch_.end(), id) != batch_.end();
  }

  // ---- The device copy, for the run phase's views ----
  int32_t* batch_size_device() const { return At<int32_t>(device_, layout_.batch_size); }
  int32_t* append_count_device() const { return At<int32_t>(device_, layout_.append_count); }
  BatchEntry* batch_device() const { return At<BatchEntry>(device_, layout_.batch); }
  int32_t* append_src_device() const { return At<int32_t>(device_, layout_.append_src); }
  int32_t* append_slot_device() const { return At<int32_t>(device_, layout_.append_slot); }
  int32_t* append_row_device() const { return At<int32_t>(device_, layout_.append_row); }
  int32_t* append_key_device() const { return At<int32_t>(device_, layout_.append_key); }

  // ---- Miss lists ----
  // The miss list of `layer`'s index group: groups alternate between two lists, and each group's
  // counts (one per chunk) are its own, in the plan region.
  MissList StepMissList(int32_t layer) const {
    const int32_t group = groups_.Of(layer);
    MissList list = lists_[group % 2];
    list.count = At<int32_t>(device_, layout_.miss_count) + group * chunks_;
    return list;
  }
  // Copy chunks of a step list: ceil(max_batch / copy_chunk_rows), or 1 without chunks; the
  // entries of one (the whole list without chunks; rows of the largest top-k of any group), and
  // of a whole step list.
  int32_t chunks() const { return chunks_; }
  int32_t chunk_entries() const { return chunk_entries_; }
  int32_t step_list_capacity() const { return chunks_ * chunk_entries_; }
  // The part of a step list chunk c holds.
  MissList Chunk(const MissList& list, int32_t c) const {
    const int64_t first = int64_t{c} * chunk_entries_;
    return MissList{list.host_row + first, list.slot + first, list.count + c};
  }
  // Lanes: the chunks of the two step lists, then the prefetch list; the lane of `list` (a chunk
  // of a step list, or any other list: the prefetch lane), and the most entries one holds.
  int32_t lanes() const { return 2 * chunks_ + 1; }
  int32_t Lane(const MissList& list) const;
  int32_t lane_capacity() const { return std::max(chunk_entries_, max_batch_ * max_prefetch_); }

  // ---- Prefetch ----
  // [max_batch * max_prefetch] entries (none without max_prefetch), with a count of its own; the
  // slots its resolve writes (discarded); the capacity of the pending prefetch's list.
  const MissList& prefetch_list() const { return prefetch_list_; }
  int32_t* prefetch_slots() const { return prefetch_slots_; }
  int32_t prefetch_capacity() const { return prefetch_capacity_; }
  // A prefetch of `count` positions per row was resolved into the list.
  void SetPrefetchCount(int32_t count) { prefetch_capacity_ = max_batch_ * count; }

  const Layout& layout() const { return layout_; }
  const std::byte* host() const { return host_.data(); }
  int64_t device_bytes() const { return memory_.bytes(); }

 private:
  template <typename T>
  static T* At(std::byte* base, size_t offset) {
    return reinterpret_cast<T*>(base + offset);
  }

  const int32_t max_batch_;
  const IndexGroups groups_;
  const int32_t max_prefetch_;
  const int32_t chunks_;
  const int32_t chunk_entries_;
  const int32_t miss_counts_;  // index groups x chunks
  const Layout layout_;
  Backend* backend_;
  DeviceMemory memory_;
  std::vector<std::byte> host_;  // the host mirror
  std::byte* device_ = nullptr;  // the device copy
  std::vector<RequestId> batch_;
  bool can_miss_ = true;
  MissList lists_[2];  // [chunks * chunk_entries] each; null counts (StepMissList)
  MissList prefetch_list_;
  int32_t* prefetch_slots_ = nullptr;
  int32_t prefetch_capacity_ = 0;
};

}  // namespace sparsekv
