// The reference predictor: the semantics of sparsekv/prefetch.h as plain loops.
#include <algorithm>
#include <unordered_set>
#include <vector>

#include "sparsekv/prefetch.h"

namespace sparsekv {
namespace {

void PredictRow(const PrefetchView& v, int32_t b, std::vector<int32_t>& misses) {
  int32_t* out = v.predicted + int64_t{b} * v.budget;
  std::fill(out, out + v.budget, -1);
  const BatchEntry e = v.batch[b];
  if (e.block < 0) return;
  const int32_t* row = v.topk + int64_t{b} * v.topk_stride;
  const uint8_t* fill = v.fill_mask + int64_t{b} * v.top_k;
  const int32_t exit_begin = std::max(0, e.seq_len - v.window);
  const int32_t limit = std::clamp(e.seq_len + 1 - v.window, 0, std::max(0, e.seq_len));

  std::unordered_set<int32_t> in_row;
  std::unordered_set<int32_t> missed;
  misses.clear();  // in the order of their first flagged entry
  for (int32_t k = 0; k < v.top_k; ++k) {
    const int32_t p = row[k];
    if (p < 0 || p >= e.seq_len) continue;
    in_row.insert(p);
    if (fill[k] != 0 && missed.insert(p).second) misses.push_back(p);
  }
  std::unordered_set<int32_t> taken;
  int32_t n = 0;
  const auto offer = [&](int64_t c) {
    if (n == v.budget || c < 0 || c >= limit) return;
    const int32_t p = static_cast<int32_t>(c);
    if (p < exit_begin && in_row.count(p) != 0) return;
    if (taken.insert(p).second) out[n++] = p;
  };
  offer(exit_begin);  // the position leaving the window, if below limit
  for (int32_t d : {1, 2}) {
    for (int32_t m : misses) {
      offer(int64_t{m} + d);
      offer(int64_t{m} - d);
    }
  }
}

}  // namespace

void PredictPrefetchReference(const PrefetchView& v) {
  std::vector<int32_t> misses;
  for (int32_t b = 0; b < *v.batch_size; ++b) PredictRow(v, b, misses);
}

}  // namespace sparsekv
