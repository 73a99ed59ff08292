#include "manager/step_plan.h"

#include <numeric>

namespace sparsekv {
namespace {

int32_t ChunksOf(const CacheOptions& o) {
  const int32_t rows = o.copy_chunk_rows;
  return rows > 0 ? (o.effective_max_batch() + rows - 1) / rows : 1;
}

}  // namespace

StepPlan::StepPlan(const CacheOptions& options, Backend& backend)
    : max_batch_(options.effective_max_batch()),
      groups_(options),
      max_prefetch_(options.max_prefetch),
      chunks_(ChunksOf(options)),
      chunk_entries_((options.copy_chunk_rows > 0 ? options.copy_chunk_rows : max_batch_) *
                     groups_.max_top_k()),
      miss_counts_(groups_.count() * chunks_),
      layout_(max_batch_, miss_counts_),
      backend_(&backend),
      memory_(backend) {}

Status StepPlan::Allocate() {
  host_.assign(layout_.bytes, std::byte{0});
  int32_t* append_src = At<int32_t>(host_.data(), layout_.append_src);
  std::iota(append_src, append_src + max_batch_, 0);
  SPARSEKV_ASSIGN_OR_RETURN(device_, memory_.Allocate<std::byte>(layout_.bytes));
  for (MissList& list : lists_) {  // their counts are the plan's
    SPARSEKV_ASSIGN_OR_RETURN(
        list, memory_.AllocateMissList(static_cast<size_t>(step_list_capacity()), false));
  }
  if (max_prefetch_ > 0) {
    const size_t entries = static_cast<size_t>(max_batch_) * max_prefetch_;
    SPARSEKV_ASSIGN_OR_RETURN(prefetch_list_, memory_.AllocateMissList(entries, true));
    SPARSEKV_ASSIGN_OR_RETURN(prefetch_slots_, memory_.Allocate<int32_t>(entries));
  }
  return Status::Ok();
}

int32_t StepPlan::Lane(const MissList& list) const {
  for (int32_t i = 0; i < 2; ++i) {
    // Compared as addresses: the list may lie in another allocation.
    const int64_t offset = (static_cast<int64_t>(reinterpret_cast<uintptr_t>(list.host_row)) -
                            static_cast<int64_t>(reinterpret_cast<uintptr_t>(lists_[i].host_row))) /
                           static_cast<int64_t>(sizeof(int32_t));
    if (offset >= 0 && offset < int64_t{chunks_} * chunk_entries_) {
      return i * chunks_ + static_cast<int32_t>(offset / chunk_entries_);
    }
  }
  return 2 * chunks_;
}

}  // namespace sparsekv
