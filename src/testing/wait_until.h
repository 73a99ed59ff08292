// Test helper: wait for a condition that another process (or a lease on a server's clock) makes
// true, with a deadline, instead of sleeping a fixed time and hoping.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace sparsekv::testing {

// Evaluates `condition` until it returns true (then returns true) or `deadline` passes (then
// returns false). Between evaluations it pauses `interval` (default 5 ms), so that polling a
// server does not take the shared CPUs away from the processes under test.
template <typename Condition>
bool WaitUntil(Condition condition, std::chrono::milliseconds deadline,
               std::chrono::milliseconds interval = std::chrono::milliseconds(5)) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!condition()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= end) return false;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(end - now, interval));
  }
  return true;
}

}  // namespace sparsekv::testing
