// Capacity checks: before a large allocation, what it needs against what the machine has.
//
// The host pool (HostKVPool::Create), the node pool (CreateNodePool) and the hot cache
// (HotCache::Create, and so SparseKVCacheManager::Create) check their memory here before they
// allocate any of it, and refuse at once with ResourceExhausted naming both numbers and the option
// to change, instead of growing toward the machine's memory and failing late (or being killed).
// A tool that sizes these from its own flags (`sparsekv bench`, `sparsekv pool`) calls the same
// checks first with its flags' names.
//
// What the machine has comes from a MachineCapacity: SystemCapacity() reads Linux's accounting;
// tests pass their own numbers. A figure that cannot be read (no /proc, a backend that cannot
// tell) is Unavailable, and the check that needs it passes: the checks refuse what is known not
// to fit, never what might.
//
// Thread safety: the checks and SystemCapacity() may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sparsekv/status.h"

namespace sparsekv {

class Backend;

class MachineCapacity {
 public:
  virtual ~MachineCapacity() = default;
  // Host memory a new allocation can have without swapping or being killed: MemAvailable of
  // /proc/meminfo plus the free huge pages (HugePages_Free x Hugepagesize, which MemAvailable
  // leaves out and the CUDA backend's huge-page pools take), at most what the process's cgroup
  // (v2 memory.max less memory.current) still allows.
  virtual StatusOr<int64_t> AvailableHostBytes() const = 0;
  // Address space the process may still map: RLIMIT_AS (ulimit -v) less what is mapped (VmSize
  // of /proc/self/status); INT64_MAX when unlimited.
  virtual StatusOr<int64_t> AvailableAddressSpace() const = 0;
  // Bytes an unprivileged process may still write to the file system holding `directory`
  // (statvfs: f_bavail x f_frsize): room in /dev/shm for a node pool, or free huge pages of a
  // hugetlbfs mount.
  virtual StatusOr<int64_t> FreeFileSystemBytes(const std::string& directory) const = 0;
  // Free memory of the backend's device (Backend::FreeDeviceBytes: the GPU's free HBM under
  // CUDA; host memory for the CPU backend, whose device memory is host memory).
  virtual StatusOr<int64_t> FreeDeviceBytes(Backend& backend) const = 0;
};

// The machine's own figures. Never destroyed.
const MachineCapacity& SystemCapacity();

// An allocation to check, in the words its refusal uses:
//   "<what>: <sizing> needs <bytes> of <memory>, <available> is <free|available>; <remedy>"
// e.g. what = "host pool", sizing = "host_capacity_tokens = 1048576 (61 layers x 656 B rows)",
// remedy = "lower host_capacity_tokens".
struct AllocationNeed {
  std::string_view what;
  std::string_view sizing;
  int64_t bytes = 0;
  std::string_view remedy;
};

// Needs below this pass without asking the machine (a check reads a few /proc files): only a
// large allocation can be known not to fit.
inline constexpr int64_t kCapacityCheckedBytes = int64_t{64} << 20;

// ResourceExhausted if `need` is more host memory, or more address space, than the machine has
// (AvailableHostBytes, AvailableAddressSpace).
Status CheckHostMemory(const AllocationNeed& need,
                       const MachineCapacity& machine = SystemCapacity());
// The same for an allocation through backend.AllocateHost: against the host memory the backend
// reserved (Backend::ReservedHostBytes) if it reserved any, else as above.
Status CheckHostMemory(const AllocationNeed& need, Backend& backend,
                       const MachineCapacity& machine = SystemCapacity());
// ResourceExhausted if `need` does not fit in the file system of `directory` (a node pool's
// segment: every byte is written there when it is created), or, the segment being resident in
// memory, in the host memory and address space CheckHostMemory counts.
Status CheckSharedMemory(const AllocationNeed& need, const std::string& directory,
                         const MachineCapacity& machine = SystemCapacity());
// ResourceExhausted if `need` is more than the free memory of `backend`'s device.
Status CheckDeviceMemory(const AllocationNeed& need, Backend& backend,
                         const MachineCapacity& machine = SystemCapacity());

// Decimal units with three significant digits or more, as the refusals print sizes:
// 41964011520 -> "41.96 GB", 512 -> "512 B".
std::string FormatBytes(int64_t bytes);

}  // namespace sparsekv
