#include "manager/prefetch_marks.h"

namespace sparsekv {

PrefetchMarks::PrefetchMarks(const CacheOptions& options, const IndexGroups& groups,
                             Backend& backend)
    : options_(options), groups_(groups), memory_(backend) {}

Status PrefetchMarks::Allocate(int32_t blocks, int32_t hot_slots) {
  if (options_.max_prefetch <= 0) return Status::Ok();
  const int32_t groups = groups_.count();
  group_bytes_ = int64_t{blocks} * hot_slots;
  SPARSEKV_ASSIGN_OR_RETURN(marks_, memory_.Allocate<uint8_t>(groups * (group_bytes_ + 1)));
  return Status::Ok();
}

void PrefetchMarks::Attach(ResolveView& view, int32_t layer, bool prefetch) {
  if (!enabled()) return;
  const int32_t group = groups_.Of(layer);
  view.prefetch_mark = marks_ + group * group_bytes_;
  view.prefetch_fills = prefetch;
  if (!prefetch) view.count_prefetch_misses = prefetched(group);
}

Status PrefetchMarks::AfterResolve(int32_t layer, bool prefetch, StreamHandle stream) {
  if (!enabled()) return Status::Ok();
  return memory_.backend().MemsetAsync(Flag(groups_.Of(layer)), prefetch ? 1 : 0, 1, stream);
}

Status PrefetchMarks::Reset(StreamHandle stream) {
  if (!enabled()) return Status::Ok();
  return memory_.backend().MemsetAsync(marks_, 0, groups_.count() * (group_bytes_ + 1), stream);
}

}  // namespace sparsekv
