// Whether a process that registered itself somewhere (a node pool's process slot, a peer region's
// descriptor) is still the one running: its pid and the kernel's start time of that pid, read from
// /proc. Processes must share a PID namespace.
#pragma once

#include <cstdint>

namespace sparsekv {

// The kernel's start time of this process (clock ticks after boot, /proc/self/stat), 0 if /proc
// cannot be read.
uint64_t OwnStartTime();
// Whether process `pid`, registered with `start_time` (OwnStartTime in that process), is still
// running: false if it does not exist, has exited (a zombie has) or the pid was reused (another
// start time). Conservative: true if the pid exists but /proc does not say more (e.g. hidepid).
bool ProcessAlive(int pid, uint64_t start_time);

}  // namespace sparsekv
