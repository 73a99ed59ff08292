// Synthetic top-k selections with controllable temporal locality, for benchmarks.
//
// Real top-k sets come from a model's indexer; this generator stands in for it with the three
// properties that decide a hot cache's miss rate. One step's row for one request and layer holds
// K distinct positions in [0, seq_len), drawn from four sources in this order:
//   1. sinks:   positions 0 .. sinks-1 (attention sinks, selected at every step);
//   2. reuse:   round(reuse * K) positions of the same request's row at the previous step, drawn
//               without replacement (temporal locality; nothing at a request's first step);
//   3. recency: round(recency * K) positions from the newest 10% of the history;
//   4. uniform: the rest, uniformly over [0, seq_len).
// A source that cannot supply its share (too few positions left in its range) leaves the
// remainder to the next one; the uniform source always completes the row.
//
// Per-layer behaviour follows a published DeepSeek-V3.2 measurement (docs/workload-shapes.md):
// consecutive top-k sets overlap ~35-50% in the middle layers and almost not at all in the first
// two, so layers below `early_layers` use `early_layer_reuse` instead of `reuse`.
//
// Miss-rate mode (miss_rate >= 0) replaces the four sources, to make a hot cache's miss rate a
// parameter rather than an outcome. A row is:
//   1. the newest position, seq_len - 1 (always resident in a cache's window);
//   2. the previous row's other entries, all but F = round(miss_rate * K) of them, drawn at random
//      (at a request's first step: none, and F = K - 1);
//   3. F fresh positions from [0, fresh_range), taken in the order of a random permutation of that
//      range with one cursor per request, skipping positions already in the row.
// A fresh position was last taken fresh_range / F steps earlier, and a kept position was used at
// the previous step, so an LRU cache of C >= K slots per request misses exactly the F fresh
// positions once fresh_range >= C + F (unless a position survives as "kept" for a whole cycle of
// the permutation, which has probability (1 - miss_rate)^(fresh_range / F)): the miss rate is
// F / K. Every layer behaves the same in this mode.
//
// Locality mode (locality = true, miss_rate < 0) makes the miss rate an outcome that falls with
// the cache size, as a real indexer's does (docs/workload.md). With free = K - 1 - sinks, a row is:
//   1. the newest position, seq_len - 1, then the sinks 0 .. sinks-1;
//   2. kept:    round(reuse * free) entries of the previous row, at random (temporal reuse);
//   3. recent:  round(recency * free) positions of the newest recency_window, uniformly;
//   4. popular: the rest, drawn from a Zipf law of exponent zipf_exponent over a ranking of the
//               positions [0, R): P(rank r) ~ (r + 1)^-zipf_exponent, R = the shortest history of
//               the first call, the ranking a random permutation per layer rotated by a random
//               offset per request.
// Misses come from the recent and popular draws; a larger LRU cache holds more of the popular
// ranks, so its miss rate decays with the cache size. LocalityPreset() holds fitted parameters.
//
// Cross-layer overlap (Next with `lower`, in locality or miss-rate mode): adjacent layers of a DSA
// model share most of their top-k. A fixed pseudo-random share cross_layer_overlap of all
// positions is "shared" between this layer and the one below: this layer's row takes every shared
// position of the lower layer's row and fills the rest from its own process restricted to the
// other positions. Both parts keep their temporal locality (a fixed subset of a row evolves as the
// row does), so the per-layer miss rate stays that of the mode, while the measured overlap
// |row(L) ∩ row(L+1)| / K is c + (1 - c) * u, c = cross_layer_overlap and u that of uncorrelated
// layers (the newest position, the sinks, chance meetings in the recent window: ~0.01-0.05).
// 0 = uncorrelated layers, the worst case for cross-layer prediction.
//
// Deterministic: the same options, layer and sequence of calls give the same rows.
// Thread safety: one generator per layer; distinct generators may run on different threads
// (NextChained runs a model's layers that way).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <vector>

namespace sparsekv {

struct TopKGeneratorOptions {
  int32_t top_k = 2048;             // K: positions per row
  double reuse = 0.45;              // fraction of K taken from the previous step's row
  double early_layer_reuse = 0.02;  // the same for layers < early_layers (capped by reuse)
  int32_t early_layers = 2;
  double recency = 0.10;  // fraction of K drawn from the newest 10% of positions
  int32_t sinks = 4;      // positions 0 .. sinks-1 are always selected
  uint64_t seed = 1;
  double miss_rate = -1;    // >= 0: miss-rate mode (above); the four sources are then unused
  int32_t fresh_range = 0;  // miss-rate mode: fresh positions come from [0, fresh_range)
  // Locality mode (above): uses sinks, reuse and recency as shares of the free entries, and
  // these two. Every layer behaves the same in this mode (early_layers is unused).
  bool locality = false;
  double zipf_exponent = 1.0;     // popularity: P(rank r) ~ (r + 1)^-zipf_exponent
  int32_t recency_window = 1024;  // the recent source draws from the newest this many positions
  // Share of all positions shared with the layer below (above); applied when Next gets `lower`.
  double cross_layer_overlap = 0;
};

// Named parameter sets for locality mode, fitted as docs/workload.md describes (top_k and seed
// stay the caller's to set; cross_layer_overlap is the calibrated default):
//   "glm5-published": LRU misses of GLM-5.1 at K = 2048 as published (HiSparse, arXiv 2608.07009):
//                     ~30% / 13.4% / 6.7% with 2048 / 4096 / 8192 slots at 32K context;
//   "smollm2":        the LRU curve of the recorded SmolLM2-135M trace (top-64, 2K context).
// nullopt for another name.
std::optional<TopKGeneratorOptions> LocalityPreset(std::string_view name);
// The names LocalityPreset accepts.
inline constexpr std::string_view kLocalityPresets[] = {"glm5-published", "smollm2"};

// Generates the rows of one layer for a fixed batch of requests, step after step.
class LayerTopKGenerator {
 public:
  // REQUIRES (asserted in debug builds; the tools that use it validate their options):
  // options.top_k >= 1, batch >= 1, fractions in [0, 1]; in miss-rate mode also
  // top_k <= fresh_range + 1.
  LayerTopKGenerator(const TopKGeneratorOptions& options, int32_t layer, int32_t batch);

  // Writes one step's rows for requests [0, seq_lens.size()): out[b * top_k, (b + 1) * top_k)
  // for request b, whose history holds seq_lens[b] tokens. Each request's previous row (from the
  // last call that included it) is its reuse source; requests not included keep theirs.
  // REQUIRES (asserted in debug builds): seq_lens.size() <= batch, top_k <= seq_lens[b]
  // (miss-rate mode: fresh_range < seq_lens[b]), out.size() >= seq_lens.size() * top_k.
  void Next(std::span<const int32_t> seq_lens, std::span<int32_t> out);
  // The same, with the rows the layer below produced for the same requests at this step
  // (lower[b * top_k, (b + 1) * top_k) for request b), of which this layer's rows take the shared
  // positions (cross_layer_overlap, above). The legacy four-source mode ignores `lower`.
  // REQUIRES (asserted in debug builds): as Next, and lower.size() >= seq_lens.size() * top_k.
  void Next(std::span<const int32_t> seq_lens, std::span<int32_t> out,
            std::span<const int32_t> lower);

  // Switches to miss-rate mode with this rate (see the top of this file) from the next call on.
  // REQUIRES (asserted in debug builds): miss-rate mode (options.miss_rate >= 0) and
  // 0 <= miss_rate <= 1.
  void set_miss_rate(double miss_rate);

  // The reuse fraction this layer applies.
  double reuse() const { return reuse_; }

 private:
  friend void NextChained(std::span<LayerTopKGenerator> layers, std::span<const int32_t> seq_lens,
                          std::span<const std::span<int32_t>> out, int32_t threads);
  // Next in three parts, so that NextChained can run a layer one request at a time: BeginStep,
  // then Row for b = 0, 1, ... in order, then EndStep write what one Next call writes.
  void BeginStep(std::span<const int32_t> seq_lens, bool with_lower);
  // Request b's row into out[0, top_k); `below` is its row of the layer below (or empty).
  void Row(size_t b, int32_t seq_len, std::span<int32_t> out, std::span<const int32_t> below);
  void EndStep() { sharing_ = false; }
  // Appends positions to row_; each Take* returns how many it added (at most n).
  int32_t TakeSinks(int32_t n, int32_t seq_len);
  int32_t TakeFromPrevious(int32_t n, const std::vector<int32_t>& previous, int32_t seq_len);
  // n distinct positions of [lo, hi) not yet in the row, uniformly.
  int32_t TakeFromRange(int32_t lo, int32_t hi, int32_t n);
  // Miss-rate mode: builds row_ for request b (the newest position is already in it).
  void MissRateRow(size_t b);
  // Locality mode: builds row_ for request b (the newest position and the shared part are in it).
  void LocalityRow(size_t b, int32_t seq_len);
  // Adds the positions of `lower` that this layer shares with the layer below.
  void TakeShared(std::span<const int32_t> lower, int32_t seq_len);
  // Whether a position is shared with the layer below (always false without `lower`).
  bool SharedWithLower(int32_t position) const;
  // Whether a position may still be added by this layer's own process.
  bool Free(int32_t position) const { return !Selected(position) && !SharedWithLower(position); }
  int32_t PopularPosition(size_t b);
  void Add(int32_t position);
  bool Selected(int32_t position) const { return mark_[position] == row_stamp_; }

  TopKGeneratorOptions options_;
  double reuse_;
  std::mt19937_64 rng_;
  std::vector<std::vector<int32_t>> previous_;  // [batch][top_k]; empty before the first step
  std::vector<int32_t> row_;                    // the row being built
  std::vector<uint32_t> mark_;                  // position -> stamp of the row that selected it
  uint32_t row_stamp_ = 0;
  std::vector<int32_t> scratch_;
  // Miss-rate mode: a random permutation of [0, fresh_range) and each request's cursor in it.
  std::vector<int32_t> order_;
  std::vector<size_t> cursor_;
  // Locality mode: the popularity ranking (rank -> position) and each request's rotation of it.
  std::vector<int32_t> ranking_;
  std::vector<size_t> rotation_;
  double zipf_scale_ = 0;  // (R + 1)^(1 - zipf_exponent) - 1, or log(R + 1) for exponent 1
  // Cross-layer overlap: positions p with Mix(share_salt_ ^ p) < share_threshold_ are shared;
  // sharing_ is set for the duration of a Next call with `lower`.
  uint64_t share_salt_ = 0;
  uint64_t share_threshold_ = 0;
  bool share_all_ = false;
  bool sharing_ = false;
};

// One step of every layer of a model, layer l > 0 taking the shared positions of layer l - 1's rows
// (Next with `lower`): out[l] receives layer l's rows ([seq_lens.size()][top_k]). Runs on up to
// `threads` threads as a pipeline: layer l starts on request b as soon as layer l - 1 has finished
// it. The rows are exactly those of layers[0].Next(seq_lens, out[0]) followed by
// layers[l].Next(seq_lens, out[l], out[l - 1]) for l = 1, 2, ... in order, whatever `threads` is.
// REQUIRES: as Next for every layer, out.size() == layers.size(), threads >= 1.
void NextChained(std::span<LayerTopKGenerator> layers, std::span<const int32_t> seq_lens,
                 std::span<const std::span<int32_t>> out, int32_t threads);

}  // namespace sparsekv
