#include "tools/sparsekv/bench/arena_backend.h"

#include <algorithm>

namespace sparsekv::tools {
namespace {

constexpr size_t kAlign = size_t{2} << 20;  // 2 MB: the pool's huge-page granularity

size_t RoundUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

StatusOr<std::shared_ptr<ArenaBackend>> ArenaBackend::Create(std::shared_ptr<Backend> base,
                                                             size_t bytes,
                                                             const HostMemoryOptions& options) {
  if (base == nullptr) return InvalidArgument("ArenaBackend: base backend is null");
  const size_t rounded = RoundUp(std::max<size_t>(bytes, 1));
  SPARSEKV_ASSIGN_OR_RETURN(std::unique_ptr<HostMemory> memory,
                            HostMemory::Allocate(rounded, options, HostRegistrar::Of(*base)));
  return std::shared_ptr<ArenaBackend>(new ArenaBackend(std::move(base), std::move(memory)));
}

ArenaBackend::~ArenaBackend() = default;

StatusOr<void*> ArenaBackend::AllocateHost(size_t bytes) {
  const size_t size = RoundUp(std::max<size_t>(bytes, 1));
  if (size > bytes_ - used_) {
    return ResourceExhausted("ArenaBackend: " + std::to_string(bytes) + " bytes asked, " +
                             std::to_string(bytes_ - used_) + " of the " + std::to_string(bytes_) +
                             "-byte host arena left");
  }
  void* ptr = arena_ + used_;
  used_ += size;
  ++outstanding_;
  return ptr;
}

void ArenaBackend::FreeHost(void* ptr) {
  if (ptr == nullptr) return;
  if (--outstanding_ == 0) used_ = 0;
}

}  // namespace sparsekv::tools
