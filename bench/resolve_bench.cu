// resolve_bench: one layer's decode-step work through the Backend interface, Resolve alone and
// Resolve + IndexCopy of the misses, against the PCIe floor measured in the same run.
//
// For every context (--contexts), batch size (--batches), miss rate (--miss_rates), row size
// (--row_bytes) and copy strategy (--strategies), with K = --top_k, C = --hot_slots, W = --window:
//   state   each request b owns block b of the hot cache; its C LRU slots hold C distinct random
//           positions of [0, ctx - W) (slot_token written directly, hot rows filled from the pool
//           with IndexCopy) in a random LRU order; seq_len = ctx. --eviction slru: segmented
//           LRU, its protected part full (the last C * --protected_percent / 100 entries);
//           --eviction clock (the library's default, CacheOptions::eviction): the same slots with
//           use counts drawn uniformly from [0, kClockMaxUses] (--clock_free_percent P >= 0:
//           0 with probability P%, else uniform in [1, kClockMaxUses]), a random hand and the
//           position map of ctx entries per request.
//   host    one layer of the pool: ctx * B rows of row_bytes (stride = row bytes), pattern-filled,
//           in pages of --page_tokens tokens. The pages are a random permutation of the layer dealt
//           to the requests, as in a long-running pool whose free list has been shuffled by churn:
//           a request's rows are scattered over the whole layer (the layout IndexCopy must cope
//           with; sorting the misses by host row is the remedy being measured).
//           --span_gib S > 0: instead, the layer is S GiB at every point (S GiB / row_bytes rows)
//           and the requests' pages are a random sample of its pages, drawn afresh per row size:
//           every point gathers over the same span, as a pool sized for its largest point does
//           (address translation, not PCIe, grows with the span; docs/index-copy.md).
//   top-k   per request, K distinct positions in random order: round(rate * K) of them not
//           resident (uniform over the rest of [0, ctx - W)), the others resident. The window is
//           never selected, so every position is a hit or a miss. Each run (warm-up and timed)
//           gets its own top-k set, so no run re-reads host rows an earlier run left in L2.
//   timing  Resolve alone, and Resolve + IndexCopy on one stream, each captured into a CUDA graph
//           (as in production) and timed over graph replays with CUDA events. Before each run,
//           untimed: the saved slot_token / LRU state is restored (Resolve turns misses into
//           residents), the run's top-k set is copied into the fixed top-k buffer, and the miss
//           count and counters are zeroed (--clean_l2 1: then a read of 192 MB, so that the
//           restore's writes are not dirty in the L2 when the run starts). After each run the
//           counters are read back: every run
//           must see exactly the intended hits and misses.
//   floor   miss bytes / the pinned cudaMemcpy host->device bandwidth of this run.
//   sort    misses sorted by host row as the library does by default (CacheOptions: sort_misses,
//           from batch sort_misses_min_batch = 32); --sort_misses and --sort_min_batch change it.
//   copy    --strategies, each timed as its own captured graph of Resolve + IndexCopy:
//             library    as the library runs it by default: fused (below) from
//                        CacheOptions::fused_copy_min_batch, else separate;
//             separate   IndexCopy's default gather (kLattice);
//             separate8  IndexCopyView::strategy = kLatticeWide;
//             warp       kWarpRows;
//             bulk       kBulk;
//             fused      Resolve copies each row's misses itself (ResolveView's fused copy) in
//                        launches of at least --fused_min_batch rows; below that it appends them
//                        and the IndexCopy (kLattice) copies them;
//           a "_nosort" suffix (e.g. fused_nosort) never sorts. "resolve" is always the plain
//           Resolve alone (no copy, sorted as above); "resolve_copy" is the strategy's graph.
// Before timing, one eager step per configuration and strategy is checked against the CPU
// reference (slots, LRU state, counters, miss list, which a fused launch leaves empty) and a sample
// of delivered rows against the pool.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cpu/reference_ops.h"
#include "sparsekv/backend.h"
#include "sparsekv/options.h"

namespace sparsekv::bench {
namespace {

constexpr double kGiB = double(size_t{1} << 30);

// --eviction's name of CacheOptions' default policy.
std::string DefaultEviction() {
  switch (CacheOptions{}.eviction) {
    case EvictionPolicy::kLru:
      return "lru";
    case EvictionPolicy::kSegmentedLru:
      return "slru";
    case EvictionPolicy::kClock:
      return "clock";
  }
  return "lru";
}

// How a step copies its misses (--strategies).
struct Strategy {
  std::string name;
  CopyStrategy copy;  // IndexCopyView::strategy
  bool fused;         // ResolveView's fused copy
  bool sort;          // false: never sort the misses (a "_nosort" name)
  // Fused: in launches of at least this many rows ("library": CacheOptions' default, "fused":
  // --fused_min_batch).
  int32_t fused_min_batch = 0;
};

struct Options {
  std::vector<int64_t> batches, contexts, row_bytes;
  std::vector<double> miss_rates;
  std::vector<Strategy> strategies;
  int32_t top_k, hot_slots, window, page_tokens;
  int warmup, reps, verify_samples;
  bool sort_misses;
  int32_t sort_min_batch;      // sort in steps of at least this many requests
  int32_t fused_min_batch;     // fused strategies: ResolveView::fused_copy_min_batch
  bool segmented;              // --eviction slru
  bool clock;                  // --eviction clock
  int32_t clock_free_percent;  // --clock_free_percent
  bool clean_l2;               // --clean_l2
  int32_t protected_percent;   // segmented: the protected part's capacity, % of C
  std::string eviction;        // --eviction: lru, slru or clock
  double max_pool_gib;
  double span_gib;  // --span_gib: 0 = each point's own ctx * B rows
  uint64_t seed;
  int device;
  std::string json;
};

struct Result {
  std::string strategy;
  int32_t context, batch, row_bytes;
  double miss_rate;         // intended
  double actual_miss_rate;  // misses / (batch * top_k), over all timed runs
  int64_t misses_per_step;
  Timing resolve, resolve_copy;
  double floor_us, to_floor, effective_gbps;
  bool verified;  // reference check and every run's counters were right
};

// n elements of device memory (at least one), from the backend. The benchmark allocates everything
// once, for its largest configuration, and leaves the freeing to process exit.
template <typename T>
T* DeviceArray(Backend& backend, size_t n, const char* what) {
  return static_cast<T*>(
      ValueOrDie(backend.AllocateDevice(std::max<size_t>(n, 1) * sizeof(T)), what));
}

// Reads n words and writes nothing unless their sum is the impossible `never`: after it the L2
// holds clean lines of `p`, and whatever was dirty in it (a state restore's writes) has been
// written back.
__global__ void ReadThrough(const uint4* p, size_t n, uint32_t never, uint32_t* sink) {
  uint32_t sum = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = p[i];
    sum += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (sum == never) *sink = sum;
}

class Bench {
 public:
  Bench(const Options& o, Backend* backend, cudaStream_t stream)
      : o_(o), backend_(backend), stream_(stream), rng_(o.seed) {}
  // Returns the number of wrong results found.
  int Run();

 private:
  // The state of one (context, batch) pair, on the host; uploaded to the device by BuildState.
  struct State {
    int32_t ctx = 0, batch = 0, pages_per_request = 0;
    std::vector<int32_t> slot_token;  // [batch, C] resident position of each LRU slot
    std::vector<int32_t> lru;         // [batch, C] a random permutation of [0, C) per request
    // [batch] segmented LRU: the size of the protected part, full
    std::vector<int32_t> lru_protected;
    std::vector<int32_t> page_table;  // [batch, pages_per_request]
    int64_t source_rows = 0;          // rows of the layer the page table addresses
    std::vector<BatchEntry> entries;  // [batch]
    // Clock: [batch, C] use counts, [batch] hands, [batch, ctx] slot of each position.
    std::vector<uint8_t> uses;
    std::vector<int32_t> hands;
    std::vector<int32_t> position_slot;
  };

  void Allocate();
  void MeasureCeiling();
  void BuildState(int32_t ctx, int32_t batch);
  // [runs, batch, K] top-k sets with `misses` non-resident positions per row.
  void MakeTopK(int32_t misses, int runs);
  void FillHotCache(int32_t row_bytes);
  // --span_gib: deals the requests a random sample of the span's pages for `row_bytes`, the same
  // sample for every strategy and miss rate of the point, and uploads the page table. Without a
  // span the table BuildState dealt stays.
  void DealSpanPages(int32_t row_bytes);
  size_t SpanBytes() const { return size_t(o_.span_gib * kGiB) & ~size_t{4095}; }
  // The plain Resolve (no fused copy, sorted as the options say); with a strategy, its Resolve.
  ResolveView View() const;
  ResolveView View(const Strategy& strategy, int32_t row_bytes) const;
  IndexCopyView CopyView(int32_t row_bytes, CopyStrategy strategy = CopyStrategy::kLattice) const;
  // Whether the strategy's Resolve copies the misses itself at the current batch size.
  bool FusedNow(const Strategy& strategy) const {
    return strategy.fused && state_.batch >= strategy.fused_min_batch;
  }
  // Enqueues the untimed per-run preparation: state restore, top-k set `set`, zeroed counters.
  void Prepare(int set);
  // Each check records what it finds wrong in errors_.
  void VerifyAgainstReference(int32_t row_bytes, int32_t misses, const Strategy& strategy);
  void VerifyRows(int32_t row_bytes);
  // Checks that the last step saw exactly `misses` misses per request and no other outcome than
  // hits, and a miss list of `listed` entries; returns the misses counted.
  uint64_t CheckCounters(int32_t misses, int64_t listed, const char* what);
  // "context C batch B miss R row N: ", the prefix of error messages.
  std::string Where(int32_t row_bytes, int32_t misses) const;
  // Resolve alone (strategy null), or the strategy's Resolve + IndexCopy, as one graph.
  cudaGraphExec_t Capture(const Strategy* strategy, int32_t row_bytes);
  int32_t HostRowOf(int32_t b, int32_t p) const {
    return state_.page_table[size_t(b) * state_.pages_per_request + p / o_.page_tokens] *
               o_.page_tokens +
           p % o_.page_tokens;
  }
  void Report();
  // Whether the misses are sorted as CacheOptions sorts them by default.
  bool LibraryDefaults() const {
    const CacheOptions defaults;
    return o_.sort_misses == defaults.sort_misses &&
           o_.sort_min_batch == defaults.sort_misses_min_batch;
  }
  std::string StrategyNames() const {
    std::string names;
    for (const Strategy& s : o_.strategies) names += (names.empty() ? "" : ",") + s.name;
    return names;
  }

  const Options o_;
  Backend* backend_;
  cudaStream_t stream_;
  std::mt19937_64 rng_;
  int32_t max_batch_ = 0, max_ctx_ = 0, max_row_ = 0, runs_ = 0;
  int32_t c_ = 0, k_ = 0;  // hot slots C and top-k K
  // Segmented LRU's protected capacity, as CacheOptions::protected_capacity() computes it.
  int32_t ProtectedCapacity() const {
    return static_cast<int32_t>(int64_t{c_} * o_.protected_percent / 100);
  }

  State state_;
  std::vector<int32_t> topk_;  // [runs, batch, K] host copy of the current top-k sets

  std::byte* pool_ = nullptr;  // [max_ctx * max_batch, max_row] host, pattern-filled
  std::byte* hot_ = nullptr;   // [max_batch * (C + W), max_row] one layer of the hot cache
  int32_t *d_slot_token_ = nullptr, *d_lru_ = nullptr;    // live state [max_batch, C]
  int32_t *d_slot_token0_ = nullptr, *d_lru0_ = nullptr;  // saved initial state
  // [max_batch] segmented LRU's protected counts, live and saved.
  int32_t *d_lru_protected_ = nullptr, *d_lru_protected0_ = nullptr;
  // Clock: use counts [max_batch, C], hands [max_batch], position maps [max_batch, max_ctx];
  // live and saved.
  uint8_t *d_uses_ = nullptr, *d_uses0_ = nullptr;
  int32_t *d_hands_ = nullptr, *d_hands0_ = nullptr;
  int32_t *d_map_ = nullptr, *d_map0_ = nullptr;
  // --clean_l2: a buffer larger than the L2 that Prepare reads after the restore.
  uint4* d_l2_ = nullptr;
  size_t l2_words_ = 0;
  uint32_t* d_sink_ = nullptr;
  int32_t *d_topk_ = nullptr, *d_topk_sets_ = nullptr;  // [max_batch, K], [runs, max_batch, K]
  int32_t* d_slots_out_ = nullptr;                      // [max_batch, K]
  int32_t* d_page_table_ = nullptr;                     // [max_batch, max_ctx / page_tokens]
  BatchEntry* d_batch_ = nullptr;                       // [max_batch]
  int32_t* d_batch_size_ = nullptr;
  int32_t *d_miss_row_ = nullptr, *d_miss_slot_ = nullptr, *d_miss_count_ = nullptr;
  ResolveCounters* d_counters_ = nullptr;
  unsigned long long* d_invalid_ = nullptr;
  int32_t *d_fill_src_ = nullptr, *d_fill_dst_ = nullptr, *d_fill_count_ = nullptr;
  int32_t *d_sample_src_ = nullptr, *d_sample_dst_ = nullptr;
  std::byte* d_sample_rows_ = nullptr;  // [verify_samples, max_row]

  double h2d_gbps_ = 0;
  Timing h2d_t_;
  std::vector<Result> results_;
  Errors errors_;
};

void Bench::Allocate() {
  c_ = o_.hot_slots;
  k_ = o_.top_k;
  max_batch_ = static_cast<int32_t>(*std::max_element(o_.batches.begin(), o_.batches.end()));
  max_ctx_ = static_cast<int32_t>(*std::max_element(o_.contexts.begin(), o_.contexts.end()));
  max_row_ = static_cast<int32_t>(*std::max_element(o_.row_bytes.begin(), o_.row_bytes.end()));
  runs_ = o_.warmup + o_.reps;
  const size_t own_bytes = size_t(max_ctx_) * max_batch_ * max_row_;
  if (SpanBytes() > 0 && SpanBytes() < own_bytes) {
    Fail("--span_gib " + std::to_string(o_.span_gib) + " is smaller than the largest point's " +
         std::to_string(own_bytes / kGiB) + " GiB (max context x max batch x max row bytes)");
  }
  const size_t pool_bytes = SpanBytes() > 0 ? SpanBytes() : own_bytes;
  if (pool_bytes > o_.max_pool_gib * kGiB) {
    Fail("the host pool would take " + std::to_string(pool_bytes / kGiB) +
         " GiB, over --max_pool_gib");
  }
  std::printf("allocating %.1f GiB of pinned host memory through the backend...\n",
              pool_bytes / kGiB);
  std::fflush(stdout);
  pool_ = static_cast<std::byte*>(ValueOrDie(backend_->AllocateHost(pool_bytes), "AllocateHost"));
  FillPattern(pool_, pool_bytes);

  const size_t bk = size_t(max_batch_) * k_;
  const size_t bc = size_t(max_batch_) * c_;
  Backend& be = *backend_;
  hot_ = DeviceArray<std::byte>(be, size_t(max_batch_) * (c_ + o_.window) * max_row_, "hot");
  d_slot_token_ = DeviceArray<int32_t>(be, bc, "slot_token");
  d_lru_ = DeviceArray<int32_t>(be, bc, "lru_order");
  d_slot_token0_ = DeviceArray<int32_t>(be, bc, "saved slot_token");
  d_lru0_ = DeviceArray<int32_t>(be, bc, "saved lru_order");
  d_lru_protected_ = DeviceArray<int32_t>(be, max_batch_, "lru_protected");
  d_lru_protected0_ = DeviceArray<int32_t>(be, max_batch_, "saved lru_protected");
  if (o_.clean_l2) {
    l2_words_ = (size_t{192} << 20) / sizeof(uint4);
    d_l2_ = DeviceArray<uint4>(be, l2_words_, "L2 read-through buffer");
    d_sink_ = DeviceArray<uint32_t>(be, 1, "sink");
    BENCH_CUDA(cudaMemsetAsync(d_l2_, 0, l2_words_ * sizeof(uint4), stream_));
  }
  if (o_.clock) {
    d_uses_ = DeviceArray<uint8_t>(be, bc, "clock uses");
    d_uses0_ = DeviceArray<uint8_t>(be, bc, "saved clock uses");
    d_hands_ = DeviceArray<int32_t>(be, max_batch_, "clock hands");
    d_hands0_ = DeviceArray<int32_t>(be, max_batch_, "saved clock hands");
    d_map_ = DeviceArray<int32_t>(be, size_t(max_batch_) * max_ctx_, "position map");
    d_map0_ = DeviceArray<int32_t>(be, size_t(max_batch_) * max_ctx_, "saved position map");
  }
  d_topk_ = DeviceArray<int32_t>(be, bk, "topk");
  d_topk_sets_ = DeviceArray<int32_t>(be, bk * runs_, "topk sets");
  d_slots_out_ = DeviceArray<int32_t>(be, bk, "slots_out");
  d_page_table_ =
      DeviceArray<int32_t>(be, size_t(max_batch_) * (max_ctx_ / o_.page_tokens), "page table");
  d_batch_ = DeviceArray<BatchEntry>(be, max_batch_, "batch table");
  d_batch_size_ = DeviceArray<int32_t>(be, 1, "batch size");
  d_miss_row_ = DeviceArray<int32_t>(be, bk, "miss rows");
  d_miss_slot_ = DeviceArray<int32_t>(be, bk, "miss slots");
  d_miss_count_ = DeviceArray<int32_t>(be, 1, "miss count");
  d_counters_ = DeviceArray<ResolveCounters>(be, 1, "counters");
  d_invalid_ = DeviceArray<unsigned long long>(be, 1, "invalid");
  d_fill_src_ = DeviceArray<int32_t>(be, bc, "fill src");
  d_fill_dst_ = DeviceArray<int32_t>(be, bc, "fill dst");
  d_fill_count_ = DeviceArray<int32_t>(be, 1, "fill count");
  d_sample_src_ = DeviceArray<int32_t>(be, o_.verify_samples, "sample src");
  d_sample_dst_ = DeviceArray<int32_t>(be, o_.verify_samples, "sample dst");
  d_sample_rows_ = DeviceArray<std::byte>(be, size_t(o_.verify_samples) * max_row_, "samples");
  std::vector<int32_t> iota(o_.verify_samples);
  std::iota(iota.begin(), iota.end(), 0);
  CopySync(d_sample_dst_, iota.data(), iota.size() * 4, stream_);
  BENCH_CUDA(cudaMemsetAsync(d_invalid_, 0, sizeof(unsigned long long), stream_));
}

void Bench::MeasureCeiling() {
  const size_t bytes = std::min<size_t>(size_t{2} << 30, size_t(max_ctx_) * max_batch_ * max_row_);
  void* d = ValueOrDie(backend_->AllocateDevice(bytes), "ceiling buffer");
  h2d_gbps_ = MemcpyGBps(d, pool_, bytes, stream_, o_.warmup, o_.reps, &h2d_t_);
  backend_->FreeDevice(d);
  std::printf("ceiling: pinned H2D %.1f GB/s\n", h2d_gbps_);
}

void Bench::BuildState(int32_t ctx, int32_t batch) {
  if (ctx % o_.page_tokens != 0) Fail("contexts must be multiples of --page_tokens");
  if (ctx - o_.window < c_ + k_) Fail("context too short for C resident + K distinct positions");
  State& s = state_;
  s.ctx = ctx;
  s.batch = batch;
  s.pages_per_request = ctx / o_.page_tokens;
  s.slot_token.resize(size_t(batch) * c_);
  s.lru.resize(size_t(batch) * c_);
  s.lru_protected.assign(batch, ProtectedCapacity());
  s.page_table.resize(size_t(batch) * s.pages_per_request);
  s.entries.assign(batch, BatchEntry{});

  std::iota(s.page_table.begin(), s.page_table.end(), 0);
  std::shuffle(s.page_table.begin(), s.page_table.end(), rng_);
  s.source_rows = int64_t(ctx) * batch;
  std::vector<int32_t> positions(ctx - o_.window);
  std::vector<int32_t> fill_src(size_t(batch) * c_), fill_dst(size_t(batch) * c_);
  for (int32_t b = 0; b < batch; ++b) {
    s.entries[b] = BatchEntry{b, ctx, b};
    // C distinct resident positions: a partial Fisher-Yates shuffle of [0, ctx - W).
    std::iota(positions.begin(), positions.end(), 0);
    for (int32_t i = 0; i < c_; ++i) {
      std::uniform_int_distribution<int32_t> pick(i, int32_t(positions.size()) - 1);
      std::swap(positions[i], positions[pick(rng_)]);
    }
    int32_t* tokens = s.slot_token.data() + size_t(b) * c_;
    int32_t* lru = s.lru.data() + size_t(b) * c_;
    std::copy_n(positions.begin(), c_, tokens);
    std::iota(lru, lru + c_, 0);
    std::shuffle(lru, lru + c_, rng_);
    for (int32_t i = 0; i < c_; ++i) {
      fill_src[size_t(b) * c_ + i] = HostRowOf(b, tokens[i]);
      fill_dst[size_t(b) * c_ + i] = b * (c_ + o_.window) + i;
    }
  }
  if (o_.clock) {
    // A slot's count is 0 with probability --clock_free_percent, else uniform in
    // [1, kClockMaxUses]; -1: every count uniform in [0, kClockMaxUses].
    std::uniform_int_distribution<int32_t> use(o_.clock_free_percent < 0 ? 0 : 1, kClockMaxUses);
    std::uniform_int_distribution<int32_t> percent(0, 99);
    std::uniform_int_distribution<int32_t> hand(0, c_ - 1);
    s.uses.resize(size_t(batch) * c_);
    for (uint8_t& u : s.uses) {
      const bool free = o_.clock_free_percent >= 0 && percent(rng_) < o_.clock_free_percent;
      u = free ? 0 : static_cast<uint8_t>(use(rng_));
    }
    s.hands.resize(batch);
    for (int32_t& h : s.hands) h = hand(rng_);
    s.position_slot.assign(size_t(batch) * ctx, -1);
    for (int32_t b = 0; b < batch; ++b) {
      for (int32_t i = 0; i < c_; ++i) {
        s.position_slot[size_t(b) * ctx + s.slot_token[size_t(b) * c_ + i]] = i;
      }
    }
  }
  const int32_t fill_count = batch * c_;
  auto up = [&](void* d, const void* h, size_t bytes) { CopySync(d, h, bytes, stream_); };
  if (o_.clock) {
    up(d_uses0_, s.uses.data(), s.uses.size());
    up(d_hands0_, s.hands.data(), s.hands.size() * 4);
    up(d_map0_, s.position_slot.data(), s.position_slot.size() * 4);
  }
  up(d_slot_token0_, s.slot_token.data(), s.slot_token.size() * 4);
  up(d_lru0_, s.lru.data(), s.lru.size() * 4);
  up(d_lru_protected0_, s.lru_protected.data(), s.lru_protected.size() * 4);
  up(d_page_table_, s.page_table.data(), s.page_table.size() * 4);
  up(d_batch_, s.entries.data(), s.entries.size() * sizeof(BatchEntry));
  up(d_batch_size_, &batch, 4);
  up(d_fill_src_, fill_src.data(), fill_src.size() * 4);
  up(d_fill_dst_, fill_dst.data(), fill_dst.size() * 4);
  up(d_fill_count_, &fill_count, 4);
}

void Bench::MakeTopK(int32_t misses, int runs) {
  const State& s = state_;
  const size_t row_elems = size_t(s.batch) * k_;
  topk_.resize(row_elems * runs);
  // mark[p]: 1 if p is resident for the request being generated, 2 if already chosen as a miss.
  std::vector<uint8_t> mark(s.ctx, 0);
  std::vector<int32_t> resident(c_);
  std::uniform_int_distribution<int32_t> any_position(0, s.ctx - o_.window - 1);
  for (int32_t b = 0; b < s.batch; ++b) {
    const int32_t* tokens = s.slot_token.data() + size_t(b) * c_;
    for (int32_t i = 0; i < c_; ++i) mark[tokens[i]] = 1;
    for (int run = 0; run < runs; ++run) {
      int32_t* row = topk_.data() + run * row_elems + size_t(b) * k_;
      // K - misses distinct residents: a partial Fisher-Yates shuffle of the resident set.
      std::copy_n(tokens, c_, resident.begin());
      for (int32_t i = 0; i < k_ - misses; ++i) {
        std::uniform_int_distribution<int32_t> pick(i, c_ - 1);
        std::swap(resident[i], resident[pick(rng_)]);
        row[i] = resident[i];
      }
      // `misses` distinct non-resident positions, by rejection (at most ~20% of draws rejected).
      for (int32_t i = k_ - misses; i < k_; ++i) {
        int32_t p;
        do p = any_position(rng_);
        while (mark[p] != 0);
        mark[p] = 2;
        row[i] = p;
      }
      for (int32_t i = k_ - misses; i < k_; ++i) mark[row[i]] = 0;
      std::shuffle(row, row + k_, rng_);
    }
    for (int32_t i = 0; i < c_; ++i) mark[tokens[i]] = 0;
  }
  // Every run's set sits at stride max_batch * K on the device, like the fixed top-k buffer.
  for (int run = 0; run < runs; ++run) {
    BENCH_CUDA(cudaMemcpyAsync(d_topk_sets_ + size_t(run) * max_batch_ * k_,
                               topk_.data() + run * row_elems, row_elems * 4,
                               cudaMemcpyHostToDevice, stream_));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream_));
}

ResolveView Bench::View() const {
  ResolveView v{};
  v.batch_size = d_batch_size_;
  v.batch = d_batch_;
  v.topk = d_topk_;
  v.top_k = k_;
  v.topk_stride = k_;
  v.slots_out = d_slots_out_;
  v.slot_token = d_slot_token_;
  v.lru_order = d_lru_;
  v.lru_protected = o_.segmented ? d_lru_protected_ : nullptr;
  v.protected_capacity = ProtectedCapacity();
  if (o_.clock) {
    v.lru_order = nullptr;
    v.clock_uses = d_uses_;
    v.clock_hand = d_hands_;
    v.position_slot = d_map_;
    v.positions = state_.ctx;
  }
  v.hot_slots = c_;
  v.window = o_.window;
  v.page_table = d_page_table_;
  v.pages_per_request = state_.pages_per_request;
  v.page_tokens = o_.page_tokens;
  v.miss_host_row = d_miss_row_;
  v.miss_slot = d_miss_slot_;
  v.miss_count = d_miss_count_;
  v.miss_capacity = state_.batch * k_;
  v.counters = d_counters_;
  v.sort_misses = o_.sort_misses;
  v.sort_min_batch = o_.sort_min_batch;
  return v;
}

ResolveView Bench::View(const Strategy& strategy, int32_t row_bytes) const {
  ResolveView v = View();
  v.sort_misses = o_.sort_misses && strategy.sort;
  if (strategy.fused) {
    v.copy_src = pool_;
    v.copy_dst = hot_;
    v.copy_row_bytes = row_bytes;
    v.copy_src_stride = row_bytes;
    v.copy_dst_stride = row_bytes;
    v.copy_src_rows = state_.source_rows;
    v.copy_dst_rows = int64_t(state_.batch) * (c_ + o_.window);
    v.copy_invalid = d_invalid_;
    v.fused_copy_min_batch = strategy.fused_min_batch;
  }
  return v;
}

IndexCopyView Bench::CopyView(int32_t row_bytes, CopyStrategy strategy) const {
  IndexCopyView v{};
  v.strategy = strategy;
  v.src = pool_;
  v.dst = hot_;
  v.src_index = d_miss_row_;
  v.dst_index = d_miss_slot_;
  v.count = d_miss_count_;
  v.capacity = state_.batch * k_;
  v.row_bytes = row_bytes;
  v.src_stride = row_bytes;
  v.dst_stride = row_bytes;
  v.src_rows = state_.source_rows;
  v.dst_rows = int64_t(state_.batch) * (c_ + o_.window);
  v.invalid = d_invalid_;
  return v;
}

void Bench::DealSpanPages(int32_t row_bytes) {
  if (SpanBytes() == 0) return;
  State& s = state_;
  const int64_t span_pages = int64_t(SpanBytes() / row_bytes) / o_.page_tokens;
  const size_t dealt = s.page_table.size();
  // A partial Fisher-Yates shuffle of the span's pages, from a generator of its own so that the
  // top-k sets and hot state (drawn from rng_) are those of a run without a span.
  std::mt19937_64 rng(o_.seed ^ (uint64_t(s.ctx) << 40) ^ (uint64_t(s.batch) << 20) ^
                      uint64_t(row_bytes));
  std::vector<int32_t> pages(span_pages);
  std::iota(pages.begin(), pages.end(), 0);
  for (size_t i = 0; i < dealt; ++i) {
    std::uniform_int_distribution<int64_t> pick(int64_t(i), span_pages - 1);
    std::swap(pages[i], pages[pick(rng)]);
  }
  std::copy(pages.begin(), pages.begin() + dealt, s.page_table.begin());
  s.source_rows = span_pages * o_.page_tokens;
  CopySync(d_page_table_, s.page_table.data(), dealt * 4, stream_);
}

void Bench::FillHotCache(int32_t row_bytes) {
  IndexCopyView v = CopyView(row_bytes);
  v.src_index = d_fill_src_;
  v.dst_index = d_fill_dst_;
  v.count = d_fill_count_;
  v.capacity = state_.batch * c_;
  CheckOk(backend_->IndexCopy(v, stream_), "IndexCopy (hot-cache fill)");
}

void Bench::Prepare(int set) {
  const size_t bc = size_t(state_.batch) * c_ * 4;
  BENCH_CUDA(cudaMemcpyAsync(d_slot_token_, d_slot_token0_, bc, cudaMemcpyDeviceToDevice, stream_));
  BENCH_CUDA(cudaMemcpyAsync(d_lru_, d_lru0_, bc, cudaMemcpyDeviceToDevice, stream_));
  BENCH_CUDA(cudaMemcpyAsync(d_lru_protected_, d_lru_protected0_, size_t(state_.batch) * 4,
                             cudaMemcpyDeviceToDevice, stream_));
  if (o_.clock) {
    BENCH_CUDA(cudaMemcpyAsync(d_uses_, d_uses0_, size_t(state_.batch) * c_,
                               cudaMemcpyDeviceToDevice, stream_));
    BENCH_CUDA(cudaMemcpyAsync(d_hands_, d_hands0_, size_t(state_.batch) * 4,
                               cudaMemcpyDeviceToDevice, stream_));
    BENCH_CUDA(cudaMemcpyAsync(d_map_, d_map0_, size_t(state_.batch) * state_.ctx * 4,
                               cudaMemcpyDeviceToDevice, stream_));
  }
  BENCH_CUDA(cudaMemcpyAsync(d_topk_, d_topk_sets_ + size_t(set) * max_batch_ * k_,
                             size_t(state_.batch) * k_ * 4, cudaMemcpyDeviceToDevice, stream_));
  BENCH_CUDA(cudaMemsetAsync(d_miss_count_, 0, 4, stream_));
  BENCH_CUDA(cudaMemsetAsync(d_counters_, 0, sizeof(ResolveCounters), stream_));
  if (o_.clean_l2) {
    ReadThrough<<<264, 1024, 0, stream_>>>(d_l2_, l2_words_, 0xFFFFFFFFu, d_sink_);
    BENCH_LAUNCHED();
  }
}

std::string Bench::Where(int32_t row_bytes, int32_t misses) const {
  return "context " + std::to_string(state_.ctx) + " batch " + std::to_string(state_.batch) +
         " misses/row " + std::to_string(misses) + " row " + std::to_string(row_bytes) + " B: ";
}

uint64_t Bench::CheckCounters(int32_t misses, int64_t listed, const char* what) {
  ResolveCounters c{};
  int32_t miss_count = 0;
  unsigned long long invalid = 0;
  BENCH_CUDA(cudaMemcpyAsync(&c, d_counters_, sizeof(c), cudaMemcpyDeviceToHost, stream_));
  BENCH_CUDA(cudaMemcpyAsync(&miss_count, d_miss_count_, 4, cudaMemcpyDeviceToHost, stream_));
  BENCH_CUDA(
      cudaMemcpyAsync(&invalid, d_invalid_, sizeof(invalid), cudaMemcpyDeviceToHost, stream_));
  BENCH_CUDA(cudaStreamSynchronize(stream_));
  const uint64_t want_misses = uint64_t(state_.batch) * misses;
  const uint64_t want_hits = uint64_t(state_.batch) * (k_ - misses);
  if (c.misses != want_misses || miss_count != listed || c.hits != want_hits ||
      c.window_hits != 0 || c.padding != 0 || c.duplicates != 0 || c.out_of_range != 0 ||
      invalid != 0) {
    errors_.Add(
        std::string(what) + ": counters hits=" + std::to_string(c.hits) +
        " misses=" + std::to_string(c.misses) + " miss_count=" + std::to_string(miss_count) +
        " window=" + std::to_string(c.window_hits) + " padding=" + std::to_string(c.padding) +
        " dup=" + std::to_string(c.duplicates) + " oor=" + std::to_string(c.out_of_range) +
        " invalid=" + std::to_string(invalid) + "; expected hits=" + std::to_string(want_hits) +
        " misses=" + std::to_string(want_misses) + " miss_count=" + std::to_string(listed));
    BENCH_CUDA(cudaMemsetAsync(d_invalid_, 0, sizeof(invalid), stream_));
  }
  return c.misses;
}

void Bench::VerifyAgainstReference(int32_t row_bytes, int32_t misses, const Strategy& strategy) {
  const State& s = state_;
  const size_t bk = size_t(s.batch) * k_;
  const bool fused = FusedNow(strategy);
  // Device: one eager step on a fresh state with top-k set 0.
  Prepare(0);
  CheckOk(backend_->Resolve(View(strategy, row_bytes), s.batch, stream_), "Resolve");
  CheckOk(backend_->IndexCopy(CopyView(row_bytes, strategy.copy), stream_), "IndexCopy");
  CheckCounters(misses, fused ? 0 : int64_t(s.batch) * misses,
                (Where(row_bytes, misses) + strategy.name + " eager step").c_str());
  std::vector<int32_t> slots(bk), tokens(s.slot_token.size()), lru(s.lru.size());
  std::vector<int32_t> lru_protected(s.lru_protected.size());
  std::vector<int32_t> miss_row(size_t(s.batch) * misses), miss_slot(miss_row.size());
  auto down = [&](std::vector<int32_t>& h, const int32_t* d) {
    CopySync(h.data(), d, h.size() * 4, stream_);
  };
  down(slots, d_slots_out_);
  down(tokens, d_slot_token_);
  down(lru, d_lru_);
  down(lru_protected, d_lru_protected_);
  down(miss_row, d_miss_row_);
  down(miss_slot, d_miss_slot_);
  std::vector<uint8_t> uses(s.uses.size());
  std::vector<int32_t> hands(s.hands.size()), map(s.position_slot.size());
  if (o_.clock) {
    CopySync(uses.data(), d_uses_, uses.size(), stream_);
    down(hands, d_hands_);
    down(map, d_map_);
  }

  // Reference: the same step on host copies of the initial state, without the fused copy (whose
  // rows VerifyRows checks); a fused launch leaves the miss list empty.
  std::vector<int32_t> ref_slots(bk), ref_tokens = s.slot_token, ref_lru = s.lru;
  std::vector<int32_t> ref_lru_protected = s.lru_protected;
  std::vector<int32_t> ref_miss_row(bk), ref_miss_slot(bk);
  int32_t ref_miss_count = 0;
  ResolveCounters ref_counters{};
  ResolveView v = View();
  v.sort_misses = false;  // the order of the list is not compared
  v.batch_size = &s.batch;
  v.batch = s.entries.data();
  v.topk = topk_.data();
  v.slots_out = ref_slots.data();
  v.slot_token = ref_tokens.data();
  v.lru_order = ref_lru.data();
  if (o_.segmented) v.lru_protected = ref_lru_protected.data();
  std::vector<uint8_t> ref_uses = s.uses;
  std::vector<int32_t> ref_hands = s.hands, ref_map = s.position_slot;
  if (o_.clock) {
    v.lru_order = nullptr;
    v.clock_uses = ref_uses.data();
    v.clock_hand = ref_hands.data();
    v.position_slot = ref_map.data();
  }
  v.page_table = s.page_table.data();
  v.miss_host_row = ref_miss_row.data();
  v.miss_slot = ref_miss_slot.data();
  v.miss_count = &ref_miss_count;
  v.counters = &ref_counters;
  reference::Resolve(v);

  const std::string where = Where(row_bytes, misses) + strategy.name + ": ";
  if (slots != ref_slots) errors_.Add(where + "slots_out differs from the CPU reference");
  if (tokens != ref_tokens) errors_.Add(where + "slot_token differs from the CPU reference");
  if (!o_.clock && lru != ref_lru) errors_.Add(where + "lru_order differs from the CPU reference");
  if (o_.clock && (uses != ref_uses || hands != ref_hands || map != ref_map)) {
    errors_.Add(where + "the clock's state differs from the CPU reference");
  }
  if (lru_protected != ref_lru_protected) {
    errors_.Add(where + "lru_protected differs from the CPU reference");
  }
  // The miss list's order is unspecified: compare it as a set of (host row, slot) pairs. A fused
  // launch copied them instead (its count was checked above).
  if (!fused) {
    std::vector<std::pair<int32_t, int32_t>> got, want;
    for (size_t i = 0; i < miss_row.size(); ++i) got.emplace_back(miss_row[i], miss_slot[i]);
    for (int32_t i = 0; i < ref_miss_count; ++i) {
      want.emplace_back(ref_miss_row[i], ref_miss_slot[i]);
    }
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    if (got != want) errors_.Add(where + "the miss list differs from the CPU reference");
  }
  VerifyRows(row_bytes);
}

void Bench::VerifyRows(int32_t row_bytes) {
  // Gathers a sample of the delivered slots (all of them if few) into a compact buffer and checks
  // each row against the pool row of its position: hits and copied misses alike.
  const State& s = state_;
  const int64_t bk = int64_t(s.batch) * k_;
  const int32_t n = static_cast<int32_t>(std::min<int64_t>(o_.verify_samples, bk));
  std::vector<int32_t> slots(bk);
  CopySync(slots.data(), d_slots_out_, bk * 4, stream_);
  std::vector<int64_t> entry(n);
  std::uniform_int_distribution<int64_t> pick(0, bk - 1);
  std::vector<int32_t> sample_slots(n);
  for (int32_t i = 0; i < n; ++i) {
    entry[i] = n == bk ? i : pick(rng_);
    sample_slots[i] = slots[entry[i]];
  }
  CopySync(d_sample_src_, sample_slots.data(), n * 4, stream_);
  LaunchWarpPerRowGather(hot_, row_bytes, d_sample_rows_, row_bytes, d_sample_src_, d_sample_dst_,
                         n, row_bytes, stream_);
  std::vector<std::byte> rows(size_t(n) * row_bytes);
  BENCH_CUDA(
      cudaMemcpyAsync(rows.data(), d_sample_rows_, rows.size(), cudaMemcpyDeviceToHost, stream_));
  BENCH_CUDA(cudaStreamSynchronize(stream_));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = static_cast<int32_t>(entry[i] / k_);
    const int32_t p = topk_[entry[i]];
    if (!RowMatchesPattern(rows.data() + size_t(i) * row_bytes,
                           uint64_t(HostRowOf(b, p)) * row_bytes, row_bytes)) {
      errors_.Add("context " + std::to_string(s.ctx) + " batch " + std::to_string(s.batch) +
                  " row " + std::to_string(row_bytes) + " B: request " + std::to_string(b) +
                  " position " + std::to_string(p) + " (slot " + std::to_string(sample_slots[i]) +
                  "): the hot row does not hold the pool row");
      return;
    }
  }
}

cudaGraphExec_t Bench::Capture(const Strategy* strategy, int32_t row_bytes) {
  cudaGraph_t graph;
  BENCH_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  if (strategy == nullptr) {
    CheckOk(backend_->Resolve(View(), state_.batch, stream_), "Resolve (capture)");
  } else {
    CheckOk(backend_->Resolve(View(*strategy, row_bytes), state_.batch, stream_),
            "Resolve (capture)");
    CheckOk(backend_->IndexCopy(CopyView(row_bytes, strategy->copy), stream_),
            "IndexCopy (capture)");
  }
  BENCH_CUDA(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CUDA(cudaGraphDestroy(graph));
  BENCH_CUDA(cudaGraphUpload(exec, stream_));
  return exec;
}

int Bench::Run() {
  Allocate();
  MeasureCeiling();
  for (const int64_t ctx : o_.contexts) {
    for (const int64_t batch : o_.batches) {
      BuildState(static_cast<int32_t>(ctx), static_cast<int32_t>(batch));
      for (const double rate : o_.miss_rates) {
        const int32_t misses = static_cast<int32_t>(std::lround(rate * k_));
        MakeTopK(misses, runs_);
        Timing resolve_only;
        for (size_t r = 0; r < o_.row_bytes.size(); ++r) {
          const int errors_at_row = errors_.count();  // the first strategy owns the resolve's
          const int32_t row_bytes = static_cast<int32_t>(o_.row_bytes[r]);
          const std::string timed_run = Where(row_bytes, misses) + "timed run";
          DealSpanPages(row_bytes);
          // Resolve alone does not depend on the row size: time it with the first one.
          if (r == 0) {
            cudaGraphExec_t g = Capture(nullptr, row_bytes);
            const int64_t listed = int64_t(batch) * misses;
            resolve_only = TimeOnStream(
                stream_, o_.warmup, o_.reps, [&](int rep) { Prepare(rep % runs_); },
                [&](int) { BENCH_CUDA(cudaGraphLaunch(g, stream_)); },
                [&](int) { CheckCounters(misses, listed, timed_run.c_str()); });
            BENCH_CUDA(cudaGraphExecDestroy(g));
          }
          for (const Strategy& strategy : o_.strategies) {
            const int errors_before =
                &strategy == &o_.strategies.front() ? errors_at_row : errors_.count();
            // Every strategy starts from the same hot rows: earlier runs overwrote victims' rows.
            FillHotCache(row_bytes);
            VerifyAgainstReference(row_bytes, misses, strategy);
            const int64_t listed = FusedNow(strategy) ? 0 : int64_t(batch) * misses;
            uint64_t total_misses = 0;
            cudaGraphExec_t g = Capture(&strategy, row_bytes);
            const Timing rc = TimeOnStream(
                stream_, o_.warmup, o_.reps, [&](int rep) { Prepare(rep % runs_); },
                [&](int) { BENCH_CUDA(cudaGraphLaunch(g, stream_)); },
                [&](int rep) {
                  const uint64_t counted =
                      CheckCounters(misses, listed, (strategy.name + " " + timed_run).c_str());
                  if (rep >= o_.warmup) total_misses += counted;
                });
            BENCH_CUDA(cudaGraphExecDestroy(g));

            Result res;
            res.strategy = strategy.name;
            res.context = static_cast<int32_t>(ctx);
            res.batch = static_cast<int32_t>(batch);
            res.row_bytes = row_bytes;
            res.miss_rate = rate;
            res.actual_miss_rate = double(total_misses) / (double(batch) * k_ * o_.reps);
            res.misses_per_step = int64_t(batch) * misses;
            res.resolve = resolve_only;
            res.resolve_copy = rc;
            const double miss_bytes = double(res.misses_per_step) * row_bytes;
            res.floor_us = miss_bytes / (h2d_gbps_ * 1e3);
            res.to_floor = misses > 0 ? rc.median_ms * 1e3 / res.floor_us : std::nan("");
            res.effective_gbps = miss_bytes / (rc.median_ms * 1e6);
            res.verified = errors_.count() == errors_before;
            results_.push_back(res);
          }
        }
      }
      std::printf("context %lld batch %lld: done\n", static_cast<long long>(ctx),
                  static_cast<long long>(batch));
      std::fflush(stdout);
    }
  }
  Report();
  return errors_.count();
}

void Bench::Report() {
  auto find = [&](const std::string& strategy, int32_t ctx, int32_t batch, double rate,
                  int32_t row) -> const Result* {
    for (const Result& r : results_) {
      if (r.strategy == strategy && r.context == ctx && r.batch == batch &&
          std::abs(r.miss_rate - rate) < 1e-9 && (row == 0 || r.row_bytes == row) && r.verified) {
        return &r;
      }
    }
    return nullptr;
  };
  const auto nan = std::nan("");
  // The keys without a suffix measure the library's path ("library": its defaults, unless flags
  // changed the sort); every other strategy gets the copy keys with "_<strategy>" appended.
  Json summary = Json::Object();
  for (const Strategy& strategy : o_.strategies) {
    const bool library = strategy.name == "library";
    const std::string suffix = library ? "" : "_" + strategy.name;
    const Result* b100_656 = find(strategy.name, 32768, 100, 0.2, 656);
    const Result* b100_1152 = find(strategy.name, 32768, 100, 0.2, 1152);
    const Result* b64_656_128k = find(strategy.name, 131072, 64, 0.2, 656);
    const Result* b1 = find(strategy.name, 32768, 1, 0.2, 656);
    summary.Add("resolve_copy_to_floor_b100_m20_656" + suffix, b100_656 ? b100_656->to_floor : nan)
        .Add("resolve_copy_to_floor_b100_m20_1152" + suffix, b100_1152 ? b100_1152->to_floor : nan)
        .Add("resolve_copy_to_floor_b64_m20_656_128k" + suffix,
             b64_656_128k ? b64_656_128k->to_floor : nan)
        .Add("resolve_copy_us_b1_m20" + suffix, b1 ? b1->resolve_copy.median_ms * 1e3 : nan);
    if (library) {
      // Suffixed by the cache size and eviction where they are not the standard sweep's (4096
      // slots, the library's default eviction), so that runs of several sizes merge.
      const Result* hits64 = find(strategy.name, 32768, 64, 0.0, 0);
      const std::string shape = (c_ == 4096 ? "" : "_c" + std::to_string(c_)) +
                                (o_.eviction == DefaultEviction() ? "" : "_" + o_.eviction);
      summary.Add("resolve_hits_only_us_b64" + shape,
                  hits64 ? hits64->resolve.median_ms * 1e3 : nan);
    }
  }
  summary.Add("resolve_h2d_gbps", h2d_gbps_).Add("resolve_wrong_results", errors_.count());

  Json results = Json::Array();
  for (const Result& r : results_) {
    results.Push(Json::Object()
                     .Add("strategy", r.strategy)
                     .Add("context", r.context)
                     .Add("batch", r.batch)
                     .Add("row_bytes", r.row_bytes)
                     .Add("miss_rate", r.miss_rate)
                     .Add("actual_miss_rate", r.actual_miss_rate)
                     .Add("misses_per_step", r.misses_per_step)
                     .Add("resolve", TimingJson(r.resolve))
                     .Add("resolve_copy", TimingJson(r.resolve_copy))
                     .Add("floor_us", r.floor_us)
                     .Add("time_to_floor", r.to_floor)
                     .Add("effective_gbps", r.effective_gbps)
                     .Add("verified", r.verified));
  }
  Json root = Json::Object();
  root.Add("benchmark", "resolve_bench")
      .Add("device", backend_->name())
      .Add("config", Json::Object()
                         .Add("top_k", k_)
                         .Add("hot_slots", c_)
                         .Add("window", o_.window)
                         .Add("page_tokens", o_.page_tokens)
                         .Add("span_bytes", int64_t(SpanBytes()))
                         .Add("sort_misses", o_.sort_misses)
                         .Add("sort_min_batch", o_.sort_min_batch)
                         .Add("library_defaults", LibraryDefaults())
                         .Add("strategies", StrategyNames())
                         .Add("fused_min_batch", o_.fused_min_batch)
                         .Add("eviction", o_.eviction)
                         .Add("protected_percent", o_.protected_percent)
                         .Add("warmup", o_.warmup)
                         .Add("reps", o_.reps)
                         .Add("seed", int64_t(o_.seed))
                         .Add("timing", "CUDA graph replay, CUDA events, median"))
      .Add("ceilings", Json::Object().Add("h2d_gbps", h2d_gbps_).Add("h2d", TimingJson(h2d_t_)))
      .Add("results", results)
      .Add("wrong_results", ErrorsJson(errors_))
      .Add("summary", summary);
  if (!o_.json.empty()) WriteFile(o_.json, root.str() + "\n");

  std::printf(
      "\nResolve (+ copy) per layer on %s, K=%d C=%d W=%d, graph replay medians; "
      "floor = miss bytes / H2D %.1f GB/s\nsort: sort_misses=%d from batch %d (%s)\n",
      backend_->name().c_str(), k_, c_, o_.window, h2d_gbps_, o_.sort_misses ? 1 : 0,
      o_.sort_min_batch,
      LibraryDefaults() ? "the library's defaults" : "not the library's defaults");
  std::printf("%-13s %7s %4s %5s %5s %7s %10s %10s %9s %7s %7s %s\n", "strategy", "context", "B",
              "miss", "row_B", "misses", "resolve_us", "r+copy_us", "floor_us", "x_floor", "GB/s",
              "check");
  for (const Result& r : results_) {
    std::printf("%-13s %7d %4d %5.3f %5d %7lld %10.1f %10.1f %9.1f %7.2f %7.1f %s\n",
                r.strategy.c_str(), r.context, r.batch, r.actual_miss_rate, r.row_bytes,
                static_cast<long long>(r.misses_per_step), r.resolve.median_ms * 1e3,
                r.resolve_copy.median_ms * 1e3, r.floor_us, r.to_floor, r.effective_gbps,
                r.verified ? "ok" : "WRONG");
  }
  if (errors_.count() > 0) std::printf("WRONG RESULTS: %d (see above)\n", errors_.count());
}

}  // namespace
}  // namespace sparsekv::bench

int main(int argc, char** argv) {
  using namespace sparsekv::bench;
  const Flags flags(
      argc, argv,
      {{"batches", "1,8,64,100"},
       {"contexts", "32768,131072"},
       {"miss_rates", "0,0.01,0.05,0.2,0.4"},
       {"row_bytes", "656,1152"},
       {"top_k", "2048"},
       {"hot_slots", "4096"},
       {"window", "1"},
       {"page_tokens", "64"},
       {"sort_misses", sparsekv::CacheOptions{}.sort_misses ? "1" : "0"},
       {"sort_min_batch", std::to_string(sparsekv::CacheOptions{}.sort_misses_min_batch)},
       {"strategies", "library"},
       {"fused_min_batch", "1"},
       {"eviction", DefaultEviction()},
       {"protected_percent", "80"},
       {"clock_free_percent", "-1"},
       {"clean_l2", "0"},
       {"warmup", "3"},
       {"reps", "20"},
       {"verify_samples", "8192"},
       {"max_pool_gib", "40"},
       {"span_gib", "0"},
       {"seed", "1"},
       {"device", "0"},
       {"json", ""}});
  Options o;
  o.batches = flags.IntList("batches");
  o.contexts = flags.IntList("contexts");
  o.miss_rates = flags.DoubleList("miss_rates");
  o.row_bytes = flags.IntList("row_bytes");
  o.top_k = static_cast<int32_t>(flags.Int("top_k"));
  o.hot_slots = static_cast<int32_t>(flags.Int("hot_slots"));
  o.window = static_cast<int32_t>(flags.Int("window"));
  o.page_tokens = static_cast<int32_t>(flags.Int("page_tokens"));
  o.sort_misses = flags.Int("sort_misses") != 0;
  o.sort_min_batch = static_cast<int32_t>(flags.Int("sort_min_batch"));
  o.fused_min_batch = static_cast<int32_t>(flags.Int("fused_min_batch"));
  for (const std::string& name : flags.StrList("strategies")) {
    const std::string kNoSort = "_nosort";
    const bool no_sort = name.size() > kNoSort.size() &&
                         name.compare(name.size() - kNoSort.size(), kNoSort.size(), kNoSort) == 0;
    const std::string base = no_sort ? name.substr(0, name.size() - kNoSort.size()) : name;
    Strategy strategy{name, sparsekv::CopyStrategy::kLattice, false, !no_sort};
    if (base == "library") {
      // The library's defaults (CacheOptions): fused from its threshold, else separate.
      strategy.copy = sparsekv::CacheOptions{}.copy_strategy;
      strategy.fused_min_batch = sparsekv::CacheOptions{}.fused_copy_min_batch;
      strategy.fused = strategy.fused_min_batch > 0;
    } else if (base == "separate8") {
      strategy.copy = sparsekv::CopyStrategy::kLatticeWide;
    } else if (base == "warp") {
      strategy.copy = sparsekv::CopyStrategy::kWarpRows;
    } else if (base == "bulk") {
      strategy.copy = sparsekv::CopyStrategy::kBulk;
    } else if (base == "fused") {
      strategy.fused = true;
      strategy.fused_min_batch = static_cast<int32_t>(flags.Int("fused_min_batch"));
    } else if (base != "separate") {
      Fail("--strategies: unknown strategy '" + name +
           "' (library, separate, separate8, warp, bulk, fused, each optionally with _nosort)");
    }
    o.strategies.push_back(strategy);
  }
  o.eviction = flags.Str("eviction");
  if (o.eviction != "lru" && o.eviction != "slru" && o.eviction != "clock") {
    Fail("--eviction must be lru, slru or clock");
  }
  o.segmented = o.eviction == "slru";
  o.clock = o.eviction == "clock";
  o.clock_free_percent = static_cast<int32_t>(flags.Int("clock_free_percent"));
  o.clean_l2 = flags.Int("clean_l2") != 0;
  o.protected_percent = static_cast<int32_t>(flags.Int("protected_percent"));
  if (o.protected_percent < 0 || o.protected_percent > 100) {
    Fail("--protected_percent must lie in [0, 100]");
  }
  o.warmup = static_cast<int>(flags.Int("warmup"));
  o.reps = static_cast<int>(flags.Int("reps"));
  o.verify_samples = static_cast<int>(flags.Int("verify_samples"));
  o.max_pool_gib = flags.Double("max_pool_gib");
  o.span_gib = flags.Double("span_gib");
  if (!(o.span_gib >= 0)) Fail("--span_gib must be >= 0 (0: each point's own span)");
  o.seed = static_cast<uint64_t>(flags.Int("seed"));
  o.device = static_cast<int>(flags.Int("device"));
  o.json = flags.Str("json");
  if (o.batches.empty() || o.contexts.empty() || o.miss_rates.empty() || o.row_bytes.empty() ||
      o.strategies.empty()) {
    Fail("--batches, --contexts, --miss_rates, --row_bytes and --strategies must be non-empty");
  }
  for (const int64_t rb : o.row_bytes) {
    if (rb <= 0 || rb % 16 != 0) Fail("--row_bytes must be positive multiples of 16");
  }
  for (const double r : o.miss_rates) {
    if (r < 0 || r > 1) Fail("--miss_rates must lie in [0, 1]");
  }
  if (o.top_k <= 0 || o.hot_slots < o.top_k || o.window < 0 || o.page_tokens <= 0 || o.reps <= 0 ||
      o.warmup < 0 || o.verify_samples <= 0) {
    Fail("need top_k > 0, hot_slots >= top_k, window >= 0, page_tokens > 0, reps > 0");
  }

  auto backend = ValueOrDie(sparsekv::CreateCudaBackend(o.device), "CreateCudaBackend");
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int wrong = Bench(o, backend.get(), stream).Run();
  BENCH_CUDA(cudaStreamDestroy(stream));
  return wrong == 0 ? 0 : 1;
}
