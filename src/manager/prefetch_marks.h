// PrefetchMarks: the state behind the prefetch's precision and recall (CacheStats::
// prefetch_useful_rows, prefetch_wasted_rows, prefetch_missed_rows).
//
// It owns a byte per hot-cache slot of every block and index group (ResolveView::prefetch_mark,
// whose semantics kernel_views.h defines for every backend): a prefetch's resolve sets the marks
// of the slots it fills, a step's resolve clears and counts the marks of the slots it hits, and
// any resolve counts the marked slots it takes as victims. It also keeps, per index group and in
// device memory, whether a prefetch of the group ran since the group's last step resolve: a byte
// set after each prefetch's resolve and cleared after each step's resolve, which reads it
// (ResolveView::count_prefetch_misses): that resolve's misses are the rows the prefetch did not
// bring (prefetch_missed), those of a group with no prefetch before it are not. On the device,
// not the host, so that a step replayed from a captured graph counts as its prefetches say: the
// host takes no part in a replay.
//
// The hot cache clears a block's marks when it acquires the block (HotCache::AttachSlotBytes):
// rows prefetched into a block whose request left before any hit count neither as useful nor as
// wasted, and a block seeded with a new request's rows starts with no mark.
//
// Without a prefetch (CacheOptions::max_prefetch 0) it holds nothing and leaves the views as they
// are (a null prefetch_mark: the resolve does no extra work).
//
// Not thread-safe; owned by the manager, driven by its thread.
#pragma once

#include <cstdint>

#include "manager/device_memory.h"
#include "sparsekv/backend.h"
#include "sparsekv/index_groups.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv {

class PrefetchMarks {
 public:
  // `options` and `groups` (the index groups of `options`) must outlive it.
  PrefetchMarks(const CacheOptions& options, const IndexGroups& groups, Backend& backend);
  PrefetchMarks(const PrefetchMarks&) = delete;
  PrefetchMarks& operator=(const PrefetchMarks&) = delete;

  // With options.max_prefetch > 0: zeroed marks for `blocks` blocks of `hot_slots` slots in
  // every index group, and a zeroed byte per group (zeroed on the null stream; the manager
  // synchronises before the first step). Without: nothing. REQUIRES: called once.
  Status Allocate(int32_t blocks, int32_t hot_slots);
  bool enabled() const { return marks_ != nullptr; }
  // [groups, blocks, hot_slots], the layout of the hot cache's replacement state, for
  // HotCache::AttachSlotBytes (a block's marks are cleared when it is acquired); null when not
  // enabled().
  uint8_t* marks() const { return marks_; }

  // Sets `view`'s prefetch accounting for a resolve of the group of `layer` (the group's first
  // layer): a prefetch's when `prefetch`, which the group's next step resolve will follow; else
  // the step's, which counts its misses as missed by the prefetch iff the group's byte says a
  // prefetch ran since the group's last step resolve. Leaves `view` as it is when not enabled().
  void Attach(ResolveView& view, int32_t layer, bool prefetch);
  // After the resolve Attach set up, on its stream: sets the group's byte after a prefetch's,
  // clears it after a step's (one memset; nothing when not enabled()).
  Status AfterResolve(int32_t layer, bool prefetch, StreamHandle stream);
  // The group's byte (null when not enabled()).
  const uint8_t* prefetched(int32_t group) const { return enabled() ? Flag(group) : nullptr; }

  // Clears every mark and every group's byte (on `stream`, not synchronised): rows prefetched
  // before count neither as useful, wasted nor missed.
  Status Reset(StreamHandle stream);

  int64_t device_bytes() const { return memory_.bytes(); }

 private:
  uint8_t* Flag(int32_t group) const { return marks_ + groups_.count() * group_bytes_ + group; }

  const CacheOptions& options_;
  const IndexGroups& groups_;
  DeviceMemory memory_;
  // [groups, blocks, hot_slots] marks, then [groups] bytes: 1 = a prefetch ran since the group's
  // last step resolve.
  uint8_t* marks_ = nullptr;
  int64_t group_bytes_ = 0;  // blocks * hot_slots
};

}  // namespace sparsekv
