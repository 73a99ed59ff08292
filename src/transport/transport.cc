// The transport-independent parts of sparsekv/transport.h.
#include "sparsekv/transport.h"

#include <algorithm>

namespace sparsekv {

std::vector<CopyRange> MergeAdjacentRanges(std::span<const CopyRange> ranges) {
  std::vector<CopyRange> sorted(ranges.begin(), ranges.end());
  std::sort(sorted.begin(), sorted.end(), [](const CopyRange& a, const CopyRange& b) {
    return a.remote_offset < b.remote_offset;
  });
  std::vector<CopyRange> merged;
  merged.reserve(sorted.size());
  for (const CopyRange& r : sorted) {
    if (r.length == 0) continue;
    if (!merged.empty()) {
      CopyRange& last = merged.back();
      if (last.remote_offset + last.length == r.remote_offset &&
          last.local_offset + last.length == r.local_offset) {
        last.length += r.length;
        continue;
      }
    }
    merged.push_back(r);
  }
  return merged;
}

}  // namespace sparsekv
