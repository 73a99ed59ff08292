// Tests of the synthetic top-k generator: its four sources, per-layer reuse, miss-rate mode,
// locality mode and cross-layer overlap.
#include "sparsekv/topk_generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

namespace sparsekv {
namespace {

// Runs `steps` steps of one layer for one request whose history grows from `seq_len`.
std::vector<std::vector<int32_t>> Rows(const TopKGeneratorOptions& o, int32_t layer,
                                       int32_t seq_len, int32_t steps) {
  LayerTopKGenerator g(o, layer, 1);
  std::vector<std::vector<int32_t>> rows;
  for (int32_t s = 0; s < steps; ++s) {
    const int32_t len = seq_len + s;
    std::vector<int32_t> row(o.top_k);
    g.Next(std::span(&len, 1), row);
    rows.push_back(std::move(row));
  }
  return rows;
}

double Overlap(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const std::set<int32_t> sa(a.begin(), a.end());
  const auto shared = std::count_if(b.begin(), b.end(), [&](int32_t p) { return sa.contains(p); });
  return static_cast<double>(shared) / static_cast<double>(b.size());
}

TEST(TopKGeneratorTest, RowsAreDistinctPositionsInRange) {
  struct Case {
    int32_t top_k, seq_len, sinks;
    double reuse, recency;
  };
  // Includes K == seq_len (every position), sinks == K, and shares that cannot be met.
  for (const Case& c :
       {Case{64, 64, 4, 0.5, 0.3}, Case{64, 65, 0, 1.0, 0.0}, Case{100, 1000, 100, 0.4, 0.1},
        Case{256, 300, 8, 0.0, 1.0}, Case{512, 20000, 16, 0.45, 0.1}}) {
    TopKGeneratorOptions o;
    o.top_k = c.top_k;
    o.sinks = c.sinks;
    o.reuse = c.reuse;
    o.recency = c.recency;
    LayerTopKGenerator g(o, /*layer=*/3, /*batch=*/3);
    for (int32_t step = 0; step < 8; ++step) {
      // Requests of different lengths in one batch.
      const std::vector<int32_t> lens = {c.seq_len + step, c.seq_len + 2 * step, c.seq_len + 7};
      std::vector<int32_t> out(3 * c.top_k, -7);
      g.Next(lens, out);
      for (int32_t b = 0; b < 3; ++b) {
        const auto first = out.begin() + b * c.top_k;
        const std::set<int32_t> unique(first, first + c.top_k);
        ASSERT_EQ(unique.size(), static_cast<size_t>(c.top_k)) << "K " << c.top_k << " b " << b;
        EXPECT_GE(*unique.begin(), 0);
        EXPECT_LT(*unique.rbegin(), lens[b]);
        for (int32_t p = 0; p < std::min(c.sinks, c.top_k); ++p) EXPECT_TRUE(unique.contains(p));
      }
    }
  }
}

TEST(TopKGeneratorTest, ReuseFractionIsHonoured) {
  TopKGeneratorOptions o;
  o.top_k = 512;
  o.reuse = 0.4;
  o.recency = 0;
  o.sinks = 0;
  // Over 65536 positions a uniform draw repeats a previous position with probability < 1%.
  const auto rows = Rows(o, /*layer=*/10, 65536, 20);
  for (size_t s = 1; s < rows.size(); ++s) {
    EXPECT_NEAR(Overlap(rows[s - 1], rows[s]), 0.4, 0.02) << "step " << s;
  }
}

TEST(TopKGeneratorTest, FirstTwoLayersReuseAlmostNothing) {
  TopKGeneratorOptions o;
  o.top_k = 512;
  o.reuse = 0.5;
  o.sinks = 0;
  o.recency = 0;
  for (int32_t layer : {0, 1}) {
    const auto rows = Rows(o, layer, 65536, 5);
    for (size_t s = 1; s < rows.size(); ++s) EXPECT_LT(Overlap(rows[s - 1], rows[s]), 0.05);
  }
  EXPECT_NEAR(Overlap(Rows(o, 2, 65536, 2)[0], Rows(o, 2, 65536, 2)[1]), 0.5, 0.02);
}

TEST(TopKGeneratorTest, RecencyDrawsFromNewestTenthOfHistory) {
  TopKGeneratorOptions o;
  o.top_k = 1000;
  o.reuse = 0;
  o.recency = 0.5;
  o.sinks = 0;
  const int32_t len = 100000;
  const auto row = Rows(o, 5, len, 1)[0];
  const auto recent =
      std::count_if(row.begin(), row.end(), [&](int32_t p) { return p >= len - len / 10; });
  // 500 recent draws, plus ~10% of the 500 uniform ones.
  EXPECT_NEAR(static_cast<double>(recent) / o.top_k, 0.55, 0.04);
}

TEST(TopKGeneratorTest, SameSeedSameRows) {
  TopKGeneratorOptions o;
  o.top_k = 128;
  EXPECT_EQ(Rows(o, 4, 5000, 4), Rows(o, 4, 5000, 4));
  TopKGeneratorOptions other = o;
  other.seed = 2;
  EXPECT_NE(Rows(o, 4, 5000, 4), Rows(other, 4, 5000, 4));
  EXPECT_NE(Rows(o, 4, 5000, 1), Rows(o, 5, 5000, 1));  // layers draw independent streams
}

TEST(TopKGeneratorTest, MissRateModeReplacesExactlyTheTargetShare) {
  TopKGeneratorOptions o;
  o.top_k = 256;
  o.miss_rate = 0.2;
  o.fresh_range = 20000;
  const int32_t fresh = 51;  // round(0.2 * 256)
  const auto rows = Rows(o, /*layer=*/0, 20001, 30);
  for (size_t s = 0; s < rows.size(); ++s) {
    const std::set<int32_t> unique(rows[s].begin(), rows[s].end());
    ASSERT_EQ(unique.size(), 256u);
    EXPECT_EQ(rows[s][0], 20000 + static_cast<int32_t>(s));  // the newest position first
    EXPECT_LT(*std::next(unique.rbegin()), 20000);           // the rest from the fresh range
    if (s == 0) continue;
    // Everything but the newest position and the fresh ones is kept from the previous row.
    const std::set<int32_t> previous(rows[s - 1].begin() + 1, rows[s - 1].end());
    const auto kept = std::count_if(rows[s].begin() + 1, rows[s].end(),
                                    [&](int32_t p) { return previous.contains(p); });
    EXPECT_EQ(kept, 256 - 1 - fresh) << "step " << s;
  }
}

TEST(TopKGeneratorTest, MissRateModeRunsPartOfTheBatch) {
  TopKGeneratorOptions o;
  o.top_k = 64;
  o.miss_rate = 0.5;
  o.fresh_range = 1000;
  LayerTopKGenerator g(o, 0, /*batch=*/4);
  std::vector<int32_t> out(4 * 64, -7);
  const std::vector<int32_t> two = {1001, 1001};
  g.Next(two, out);  // requests 0 and 1 only
  EXPECT_EQ(out[2 * 64], -7);
  g.set_miss_rate(0.0);
  const std::vector<int32_t> next = {1002, 1002};
  std::vector<int32_t> again(2 * 64);
  g.Next(next, again);
  // Rate 0: everything but the newest position is kept.
  EXPECT_EQ(std::set<int32_t>(out.begin() + 1, out.begin() + 64),
            std::set<int32_t>(again.begin() + 1, again.begin() + 64));
}

// A least-recently-used cache of `slots` positions; the newest position of each row lives in the
// window and is neither looked up nor cached. Counts misses over steps >= warmup.
class Lru {
 public:
  explicit Lru(int32_t slots) : slots_(slots) {}
  void Step(const std::vector<int32_t>& row, int32_t newest, bool count) {
    for (int32_t p : row) {
      if (p == newest) continue;
      const auto it = where_.find(p);
      if (it != where_.end()) {
        order_.erase(it->second);
      } else {
        misses_ += count;
        if (static_cast<int32_t>(order_.size()) == slots_) {
          where_.erase(order_.back());
          order_.pop_back();
        }
      }
      order_.push_front(p);
      where_[p] = order_.begin();
      lookups_ += count;
    }
  }
  double miss_rate() const { return static_cast<double>(misses_) / std::max<int64_t>(1, lookups_); }

 private:
  int32_t slots_;
  std::list<int32_t> order_;
  std::unordered_map<int32_t, std::list<int32_t>::iterator> where_;
  int64_t misses_ = 0, lookups_ = 0;
};

double LruMissRate(const std::vector<std::vector<int32_t>>& rows, int32_t seq_len, int32_t slots,
                   int32_t warmup) {
  Lru lru(slots);
  for (size_t s = 0; s < rows.size(); ++s) {
    lru.Step(rows[s], seq_len + static_cast<int32_t>(s) - 1, static_cast<int32_t>(s) >= warmup);
  }
  return lru.miss_rate();
}

// Two adjacent layers: the lower one's rows are passed to the upper one's Next.
struct LayerPair {
  std::vector<std::vector<int32_t>> lower, upper;
};
LayerPair Pair(const TopKGeneratorOptions& o, int32_t seq_len, int32_t steps) {
  LayerTopKGenerator g0(o, 4, 1), g1(o, 5, 1);
  LayerPair p;
  for (int32_t s = 0; s < steps; ++s) {
    const int32_t len = seq_len + s;
    std::vector<int32_t> a(o.top_k), b(o.top_k);
    g0.Next(std::span(&len, 1), a);
    g1.Next(std::span(&len, 1), b, a);
    p.lower.push_back(std::move(a));
    p.upper.push_back(std::move(b));
  }
  return p;
}

TopKGeneratorOptions SmallLocality() {
  TopKGeneratorOptions o = *LocalityPreset("glm5-published");
  o.top_k = 128;
  o.recency_window = 64;
  return o;
}

TEST(TopKGeneratorTest, LocalityPresetsAreNamed) {
  for (std::string_view name : kLocalityPresets) {
    const auto o = LocalityPreset(name);
    ASSERT_TRUE(o.has_value()) << name;
    EXPECT_TRUE(o->locality);
    EXPECT_LT(o->miss_rate, 0);
    EXPECT_GE(o->cross_layer_overlap, 0.7);
    EXPECT_LE(o->cross_layer_overlap, 1.0);
  }
  EXPECT_FALSE(LocalityPreset("calibrated-ish").has_value());
}

TEST(TopKGeneratorTest, LocalityRowsAreDistinctPositionsInRange) {
  struct Case {
    int32_t top_k, seq_len, sinks;
    double overlap;
  };
  // Includes K == seq_len, K close to seq_len, sinks >= K and full overlap.
  for (const Case& c : {Case{64, 64, 4, 0.0}, Case{64, 70, 4, 0.85}, Case{16, 1000, 32, 0.5},
                        Case{128, 4096, 4, 1.0}, Case{256, 2048, 0, 0.3}}) {
    TopKGeneratorOptions o = SmallLocality();
    o.top_k = c.top_k;
    o.sinks = c.sinks;
    o.cross_layer_overlap = c.overlap;
    LayerTopKGenerator below(o, 0, 3), g(o, 1, 3);
    for (int32_t step = 0; step < 6; ++step) {
      const std::vector<int32_t> lens = {c.seq_len + step, c.seq_len + 2 * step, c.seq_len + 7};
      std::vector<int32_t> lower(3 * c.top_k), out(3 * c.top_k, -7);
      below.Next(lens, lower);
      g.Next(lens, out, lower);
      for (const std::vector<int32_t>* rows : {&lower, &out}) {
        for (int32_t b = 0; b < 3; ++b) {
          const auto first = rows->begin() + b * c.top_k;
          const std::set<int32_t> unique(first, first + c.top_k);
          ASSERT_EQ(unique.size(), static_cast<size_t>(c.top_k)) << "K " << c.top_k;
          EXPECT_GE(*unique.begin(), 0);
          EXPECT_LT(*unique.rbegin(), lens[b]);
          EXPECT_TRUE(unique.contains(lens[b] - 1));  // the newest position
        }
      }
    }
  }
}

TEST(TopKGeneratorTest, LocalityMissRateFallsWithCacheSize) {
  const TopKGeneratorOptions o = SmallLocality();
  const int32_t len = 4096;
  const auto rows = Rows(o, 3, len, 48);
  const double m1 = LruMissRate(rows, len, 128, 16);
  const double m2 = LruMissRate(rows, len, 256, 16);
  const double m4 = LruMissRate(rows, len, 512, 16);
  EXPECT_GT(m1, 0.15);
  EXPECT_LT(m2, 0.8 * m1);
  EXPECT_LT(m4, 0.8 * m2);
  EXPECT_GT(m4, 0.0);
}

TEST(TopKGeneratorTest, LocalityModeIsDeterministic) {
  const TopKGeneratorOptions o = SmallLocality();
  EXPECT_EQ(Rows(o, 2, 3000, 4), Rows(o, 2, 3000, 4));
  TopKGeneratorOptions other = o;
  other.seed = 9;
  EXPECT_NE(Rows(o, 2, 3000, 4), Rows(other, 2, 3000, 4));
}

TEST(TopKGeneratorTest, CrossLayerOverlapMatchesTheParameter) {
  const auto measure = [](double overlap) {
    TopKGeneratorOptions o = SmallLocality();
    o.top_k = 512;
    o.recency_window = 1024;
    o.cross_layer_overlap = overlap;
    const LayerPair p = Pair(o, 32768, 16);
    double mean = 0;
    for (size_t s = 0; s < p.lower.size(); ++s) mean += Overlap(p.lower[s], p.upper[s]);
    if (overlap == 1.0) {
      EXPECT_EQ(p.lower, p.upper);
    }
    return mean / static_cast<double>(p.lower.size());
  };
  // Uncorrelated layers still share the newest position, the sinks and a few recent positions.
  const double uncorrelated = measure(0);
  EXPECT_GE(uncorrelated, 5.0 / 512);
  EXPECT_LT(uncorrelated, 0.1);
  // Which positions are shared is a fixed pseudo-random draw: binomial noise of a few points.
  for (double overlap : {0.3, 0.7, 0.85, 1.0}) {
    EXPECT_NEAR(measure(overlap), overlap + (1 - overlap) * uncorrelated, 0.04)
        << "overlap " << overlap;
  }
}

TEST(TopKGeneratorTest, CrossLayerOverlapKeepsTheMissRateMode) {
  TopKGeneratorOptions o;
  o.top_k = 256;
  o.miss_rate = 0.2;
  o.fresh_range = 20000;
  o.cross_layer_overlap = 0.85;
  const LayerPair p = Pair(o, 20001, 40);
  EXPECT_NEAR(LruMissRate(p.lower, 20001, 512, 8), 0.2 * 255 / 256, 0.01);
  EXPECT_NEAR(LruMissRate(p.upper, 20001, 512, 8), 0.2, 0.03);
  double mean = 0;
  for (size_t s = 0; s < p.lower.size(); ++s) mean += Overlap(p.lower[s], p.upper[s]);
  EXPECT_NEAR(mean / static_cast<double>(p.lower.size()), 0.85, 0.04);
}

TEST(TopKGeneratorTest, CrossLayerOverlapKeepsTheLocalityCurve) {
  TopKGeneratorOptions o = SmallLocality();
  o.cross_layer_overlap = 0.85;
  const LayerPair p = Pair(o, 4096, 48);
  for (int32_t slots : {128, 256, 512}) {
    EXPECT_NEAR(LruMissRate(p.upper, 4096, slots, 16), LruMissRate(p.lower, 4096, slots, 16), 0.05)
        << slots;
  }
}

// NextChained's pipeline writes exactly the rows of calling Next layer after layer, for every
// thread count, in locality and miss-rate mode, with a batch whose histories differ.
TEST(TopKGeneratorTest, NextChainedMatchesLayerByLayer) {
  TopKGeneratorOptions locality = SmallLocality();
  locality.cross_layer_overlap = 0.85;
  TopKGeneratorOptions miss_rate;
  miss_rate.top_k = 64;
  miss_rate.miss_rate = 0.2;
  miss_rate.fresh_range = 1500;
  miss_rate.cross_layer_overlap = 0.6;
  for (const TopKGeneratorOptions& o : {locality, miss_rate}) {
    constexpr int32_t kLayers = 7, kBatch = 5, kSteps = 4;
    const size_t rows = size_t{kBatch} * o.top_k;
    auto layers = [&] {
      std::vector<LayerTopKGenerator> g;
      for (int32_t l = 0; l < kLayers; ++l) g.emplace_back(o, l, kBatch);
      return g;
    };
    std::vector<LayerTopKGenerator> serial = layers();
    std::vector<std::vector<LayerTopKGenerator>> chained;
    for (int32_t threads = 1; threads <= 8; threads += 3) chained.push_back(layers());
    std::vector<int32_t> seq_lens = {2000, 2100, 2003, 3000, 2500};
    for (int32_t step = 0; step < kSteps; ++step) {
      std::vector<std::vector<int32_t>> want(kLayers, std::vector<int32_t>(rows));
      for (int32_t l = 0; l < kLayers; ++l) {
        if (l == 0) {
          serial[l].Next(seq_lens, want[l]);
        } else {
          serial[l].Next(seq_lens, want[l], want[l - 1]);
        }
      }
      for (size_t c = 0; c < chained.size(); ++c) {
        const int32_t threads = 1 + 3 * static_cast<int32_t>(c);
        std::vector<std::vector<int32_t>> got(kLayers, std::vector<int32_t>(rows, -7));
        const std::vector<std::span<int32_t>> out(got.begin(), got.end());
        NextChained(chained[c], seq_lens, out, threads);
        EXPECT_EQ(got, want) << "step " << step << ", " << threads << " threads";
      }
      for (int32_t& len : seq_lens) ++len;
    }
  }
}

}  // namespace
}  // namespace sparsekv
