#include "tools/sparsekv/bench/topk_rows.h"

#include <algorithm>
#include <thread>
#include <utility>

namespace sparsekv::tools {

TopKRows::TopKRows(const TopKGeneratorOptions& options, IndexGroups groups, int32_t max_batch,
                   int32_t queries, int32_t entry_tokens)
    : top_k_(options.top_k),
      queries_(queries),
      entry_tokens_(entry_tokens),
      groups_(std::move(groups)),
      group_elems_(int64_t{max_batch} * queries * options.top_k),
      cross_layer_(options.cross_layer_overlap > 0 && queries == 1),
      host_(static_cast<size_t>(groups_.count() * group_elems_)) {
  for (int32_t g = 0; g < groups_.count(); ++g) {
    generators_.emplace_back(options, groups_.First(g), max_batch);
  }
}

void TopKRows::Generate(std::span<const int32_t> seq_lens, int32_t spare_cores) {
  if (entry_tokens_ > 1) {
    entries_.assign(seq_lens.begin(), seq_lens.end());
    for (int32_t& n : entries_) n /= entry_tokens_;
    seq_lens = entries_;
  }
  const int32_t count = groups_.count();
  const int32_t cores =
      std::max<int32_t>(1, static_cast<int32_t>(std::thread::hardware_concurrency()) - spare_cores);
  if (cross_layer_) {
    const size_t elems = seq_lens.size() * top_k_;
    std::vector<std::span<int32_t>> out;
    for (int32_t g = 0; g < count; ++g) out.emplace_back(host_.data() + g * group_elems_, elems);
    NextChained(generators_, seq_lens, out, cores);
    return;
  }
  auto run = [&](int32_t first, int32_t every) {
    std::vector<int32_t> rows(seq_lens.size() * top_k_);
    for (int32_t g = first; g < count; g += every) {
      int32_t* group = host_.data() + g * group_elems_;
      if (queries_ == 1) {
        generators_[g].Next(seq_lens, std::span(group, group_elems_));
        continue;
      }
      for (int32_t q = 0; q < queries_; ++q) {
        generators_[g].Next(seq_lens, rows);
        for (size_t b = 0; b < seq_lens.size(); ++b) {
          std::copy_n(rows.begin() + b * top_k_, top_k_, group + (b * queries_ + q) * top_k_);
        }
      }
    }
  };
  const int32_t threads = std::min(cores, count);
  std::vector<std::jthread> pool;
  for (int32_t t = 0; t < threads; ++t) pool.emplace_back(run, t, threads);
}

void TopKRows::SetMissRate(double rate) {
  for (LayerTopKGenerator& g : generators_) g.set_miss_rate(rate);
}

}  // namespace sparsekv::tools
