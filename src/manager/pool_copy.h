// PoolToHotCopy: the IndexCopy that moves rows from the host pool into a layer's hot rows, as
// the miss copies, the prefetch copies and the residency loads all do.
#pragma once

#include <cstdint>

#include "sparsekv/backend.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/manager_extension.h"
#include "sparsekv/options.h"

namespace sparsekv {

// The copy of `list` ([capacity] host rows -> layer-wide slots) from `pool` into `layer`'s rows
// of `hot` (of shape `shape`), on the whole grid; entries out of range count in `invalid`.
inline IndexCopyView PoolToHotCopy(const HostKVPool& pool, const HotCache& hot,
                                   const LayerShape& shape, int32_t layer, const MissList& list,
                                   int32_t capacity, unsigned long long* invalid) {
  IndexCopyView copy{};
  copy.src = pool.layer_base(layer);
  copy.dst = hot.layer_data(layer);
  copy.src_index = list.host_row;
  copy.dst_index = list.slot;
  copy.count = list.count;
  copy.capacity = capacity;
  copy.row_bytes = shape.row_bytes;
  copy.src_stride = copy.dst_stride = shape.row_stride;
  copy.src_rows = pool.rows();
  copy.dst_rows = hot.layer_rows();
  copy.invalid = invalid;
  return copy;
}

}  // namespace sparsekv
