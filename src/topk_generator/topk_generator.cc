#include "sparsekv/topk_generator.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace sparsekv {
namespace {

// SplitMix64: decorrelates the per-layer streams of one seed.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int32_t Share(double fraction, int32_t top_k) {
  return static_cast<int32_t>(std::llround(fraction * top_k));
}

}  // namespace

LayerTopKGenerator::LayerTopKGenerator(const TopKGeneratorOptions& options, int32_t layer,
                                       int32_t batch)
    : options_(options),
      reuse_(layer < options.early_layers ? std::min(options.early_layer_reuse, options.reuse)
                                          : options.reuse),
      rng_(Mix(options.seed ^ Mix(static_cast<uint64_t>(layer)))),
      previous_(batch) {
  assert(options.top_k >= 1 && batch >= 1);
  row_.reserve(options.top_k);
  if (options_.miss_rate >= 0) {
    assert(options_.fresh_range >= 1 && options_.top_k <= options_.fresh_range + 1);
    order_.resize(options_.fresh_range);
    for (int32_t p = 0; p < options_.fresh_range; ++p) order_[p] = p;
    std::shuffle(order_.begin(), order_.end(), rng_);
    // Requests start at independent points of the permutation.
    for (int32_t b = 0; b < batch; ++b) cursor_.push_back(rng_() % order_.size());
  }
}

void LayerTopKGenerator::set_miss_rate(double miss_rate) {
  assert(options_.miss_rate >= 0 && miss_rate >= 0 && miss_rate <= 1);
  options_.miss_rate = miss_rate;
}

void LayerTopKGenerator::Add(int32_t position) {
  mark_[position] = row_stamp_;
  row_.push_back(position);
}

int32_t LayerTopKGenerator::TakeSinks(int32_t n, int32_t seq_len) {
  const int32_t end = std::min({n, seq_len, options_.sinks});
  for (int32_t p = 0; p < end; ++p) Add(p);
  return end;
}

int32_t LayerTopKGenerator::TakeFromPrevious(int32_t n, const std::vector<int32_t>& previous,
                                             int32_t seq_len) {
  // Partial Fisher-Yates over a copy of the previous row, skipping what is already selected.
  scratch_ = previous;
  const int32_t size = static_cast<int32_t>(scratch_.size());
  int32_t added = 0;
  for (int32_t i = 0; i < size && added < n; ++i) {
    const int32_t j = std::uniform_int_distribution<int32_t>(i, size - 1)(rng_);
    std::swap(scratch_[i], scratch_[j]);
    const int32_t p = scratch_[i];
    if (p < seq_len && !Selected(p)) {
      Add(p);
      ++added;
    }
  }
  return added;
}

int32_t LayerTopKGenerator::TakeFromRange(int32_t lo, int32_t hi, int32_t n) {
  if (n <= 0 || lo >= hi) return 0;
  const auto in_range =
      std::count_if(row_.begin(), row_.end(), [&](int32_t p) { return p >= lo && p < hi; });
  const int64_t free = int64_t{hi} - lo - in_range;
  if (free <= 0) return 0;
  if (2 * int64_t{n} <= free) {
    // Sparse: rejection sampling needs at most two draws per position on average.
    std::uniform_int_distribution<int32_t> draw(lo, hi - 1);
    for (int32_t added = 0; added < n;) {
      const int32_t p = draw(rng_);
      if (!Selected(p)) {
        Add(p);
        ++added;
      }
    }
    return n;
  }
  // Dense: list the free positions (at most 2n + K of them) and take a random subset.
  scratch_.clear();
  for (int32_t p = lo; p < hi; ++p) {
    if (!Selected(p)) scratch_.push_back(p);
  }
  const int32_t take = static_cast<int32_t>(std::min<int64_t>(n, free));
  for (int32_t i = 0; i < take; ++i) {
    const int32_t j =
        std::uniform_int_distribution<int32_t>(i, static_cast<int32_t>(scratch_.size()) - 1)(rng_);
    std::swap(scratch_[i], scratch_[j]);
    Add(scratch_[i]);
  }
  return take;
}

void LayerTopKGenerator::MissRateRow(size_t b) {
  const int32_t k = options_.top_k;
  const std::vector<int32_t>& previous = previous_[b];
  int32_t fresh = k - 1;
  if (!previous.empty()) {
    fresh = std::min(k - 1, Share(options_.miss_rate, k));
    // Keep k - 1 - fresh of the previous row's entries, its newest position (entry 0) excluded:
    // that one has left the window since.
    scratch_.assign(previous.begin() + 1, previous.end());
    const int32_t keep = k - 1 - fresh;
    for (int32_t i = 0; i < keep; ++i) {
      const int32_t j = std::uniform_int_distribution<int32_t>(
          i, static_cast<int32_t>(scratch_.size()) - 1)(rng_);
      std::swap(scratch_[i], scratch_[j]);
      Add(scratch_[i]);
    }
  }
  size_t& cursor = cursor_[b];
  while (static_cast<int32_t>(row_.size()) < k) {
    const int32_t p = order_[cursor];
    cursor = cursor + 1 == order_.size() ? 0 : cursor + 1;
    if (!Selected(p)) Add(p);
  }
}

void LayerTopKGenerator::Next(std::span<const int32_t> seq_lens, std::span<int32_t> out) {
  const int32_t k = options_.top_k;
  assert(seq_lens.size() <= previous_.size());
  assert(out.size() >= seq_lens.size() * static_cast<size_t>(k));
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    const int32_t seq_len = seq_lens[b];
    assert(seq_len >= k);
    if (mark_.size() < static_cast<size_t>(seq_len)) mark_.resize(seq_len, 0);
    if (++row_stamp_ == 0) {  // the stamp wrapped: forget every old mark
      std::fill(mark_.begin(), mark_.end(), 0);
      row_stamp_ = 1;
    }
    row_.clear();

    if (options_.miss_rate >= 0) {
      assert(options_.fresh_range < seq_len);
      Add(seq_len - 1);
      MissRateRow(b);
    } else {
      int32_t left = k - TakeSinks(k, seq_len);
      if (!previous_[b].empty()) {
        left -= TakeFromPrevious(std::min(left, Share(reuse_, k)), previous_[b], seq_len);
      }
      const int32_t recent_begin = seq_len - std::max(1, seq_len / 10);
      left -= TakeFromRange(recent_begin, seq_len, std::min(left, Share(options_.recency, k)));
      left -= TakeFromRange(0, seq_len, left);
      assert(left == 0);
    }
    assert(static_cast<int32_t>(row_.size()) == k);
    std::copy(row_.begin(), row_.end(), out.begin() + b * k);
    previous_[b].assign(row_.begin(), row_.end());
  }
}

}  // namespace sparsekv
