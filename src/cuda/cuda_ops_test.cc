// Differential tests of the CUDA operators against the reference (src/cpu/reference_ops.h).
//
// Compiled by the host compiler against the Backend interface only (plus, where CUDA is built, the
// runtime's graph calls for the captured-replay tests), so that it builds without CUDA; every test
// skips where no device is present. Inputs are random with fixed seeds and include the bad cases
// the contract names (padding, duplicates, out-of-range indices). Output buffers are poisoned
// identically on both sides and compared whole, so a write outside what the contract allows shows
// up as a difference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu/reference_ops.h"
#include "sparsekv/backend.h"
#include "testing/cuda_test_util.h"
#include "testing/harness.h"

#if defined(SPARSEKV_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace sparsekv {
namespace {

constexpr int kPoison = 0xA5;

void ExpectOk(const Status& status) { EXPECT_TRUE(status.ok()) << status.ToString(); }

using Buffer = testing::DeviceBuffer;
using Where = Buffer::Where;

std::vector<std::byte> RandomBytes(std::mt19937_64& rng, size_t bytes) {
  std::vector<std::byte> out(bytes);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// Fills `bytes` bytes at p with random bytes, eight per draw (for buffers of many megabytes).
void FillRandom(std::mt19937_64& rng, std::byte* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t word = rng();
    std::memcpy(p + i, &word, std::min<size_t>(8, bytes - i));
  }
}

constexpr CopyStrategy kAllStrategies[] = {CopyStrategy::kLattice, CopyStrategy::kLatticeWide,
                                           CopyStrategy::kWarpRows, CopyStrategy::kBulk};

std::string StrategyName(CopyStrategy strategy) {
  switch (strategy) {
    case CopyStrategy::kLattice:
      return "lattice";
    case CopyStrategy::kLatticeWide:
      return "lattice-wide";
    case CopyStrategy::kWarpRows:
      return "warp-rows";
    case CopyStrategy::kBulk:
      return "bulk";
  }
  return "?";
}

template <typename T>
std::vector<T> Poisoned(size_t n) {
  std::vector<T> out(n);
  std::memset(out.data(), kPoison, n * sizeof(T));
  return out;
}

TEST(CudaBackendTest, NameAndKind) {
  SPARSEKV_REQUIRE_GPU(gpu);
  EXPECT_EQ(gpu->kind(), BackendKind::kCuda);
  EXPECT_EQ(gpu->name().rfind("cuda:0 ", 0), 0u) << gpu->name();
  EXPECT_TRUE(CudaBackendCompiled());
}

TEST(CudaBackendTest, ForkJoinOrdersTheSideStream) {
  SPARSEKV_REQUIRE_GPU(gpu);
  constexpr size_t kBytes = 64 << 20;
  Buffer a(*gpu, kBytes);
  Buffer b(*gpu, kBytes);
  ExpectOk(gpu->MemsetAsync(a.get(), 7, kBytes, nullptr));
  ExpectOk(gpu->Fork(nullptr));
  ExpectOk(gpu->CopyAsync(b.get(), a.get(), kBytes, gpu->SideStream()));
  ExpectOk(gpu->Join(nullptr));
  ExpectOk(gpu->MemsetAsync(a.get(), 9, kBytes, nullptr));
  ExpectOk(gpu->Synchronize(nullptr));
  const std::vector<uint8_t> copied = b.Download<uint8_t>();
  EXPECT_TRUE(std::all_of(copied.begin(), copied.end(), [](uint8_t x) { return x == 7; }));
}

// ---------------------------------------------------------------------------------------------
// IndexCopy

struct IndexCopyCase {
  Where src_where;
  Where dst_where;
  int32_t row_bytes;
  int32_t stride_pad;      // stride = row_bytes + pad (8: forces 8-byte or narrower accesses)
  int32_t count;           // > capacity: clamped; < 0: nothing
  int32_t max_blocks = 0;  // IndexCopyView::max_blocks
  CopyStrategy strategy = CopyStrategy::kLattice;
};

std::string CaseName(const IndexCopyCase& c) {
  const auto where = [](Where w) { return w == Where::kHost ? "host" : "device"; };
  return std::string(where(c.src_where)) + "->" + where(c.dst_where) +
         " row_bytes=" + std::to_string(c.row_bytes) + " pad=" + std::to_string(c.stride_pad) +
         " count=" + std::to_string(c.count) + " max_blocks=" + std::to_string(c.max_blocks) +
         " strategy=" + StrategyName(c.strategy);
}

void RunIndexCopyCase(Backend& gpu, const IndexCopyCase& c, uint64_t seed) {
  SCOPED_TRACE(CaseName(c));
  constexpr int32_t kCapacity = 4096;
  constexpr int64_t kSrcRows = 5000;
  constexpr int64_t kDstRows = 4500;
  std::mt19937_64 rng(seed);
  const int64_t stride = c.row_bytes + c.stride_pad;

  // Distinct destinations (a permutation prefix); about 1 in 16 entries gets a bad index on one
  // side: negative, just past the end, or far past it.
  std::vector<int32_t> dst_index(kDstRows);
  std::iota(dst_index.begin(), dst_index.end(), 0);
  std::shuffle(dst_index.begin(), dst_index.end(), rng);
  dst_index.resize(kCapacity);
  std::vector<int32_t> src_index(kCapacity);
  for (auto& s : src_index) s = static_cast<int32_t>(rng() % kSrcRows);
  const auto bad = [&](int64_t rows) {
    switch (rng() % 4) {
      case 0:
        return int32_t{-1};
      case 1:
        return -static_cast<int32_t>(rng() % 1000) - 2;
      case 2:
        return static_cast<int32_t>(rows);
      default:
        return static_cast<int32_t>(rows + rng() % 100000);
    }
  };
  for (int32_t i = 0; i < kCapacity; ++i) {
    if (rng() % 16 == 0) {
      if (rng() % 2 == 0) {
        src_index[i] = bad(kSrcRows);
      } else {
        dst_index[i] = bad(kDstRows);
      }
    }
  }

  const std::vector<std::byte> src = RandomBytes(rng, kSrcRows * stride);
  std::vector<std::byte> want_dst = Poisoned<std::byte>(kDstRows * stride);
  unsigned long long want_invalid = 3;  // counters accumulate: start from a nonzero value
  const int32_t count = c.count;
  reference::IndexCopy({src.data(), want_dst.data(), src_index.data(), dst_index.data(), &count,
                        kCapacity, c.row_bytes, stride, stride, kSrcRows, kDstRows, &want_invalid,
                        c.max_blocks});

  Buffer gpu_src(gpu, src.size(), c.src_where);
  Buffer gpu_dst(gpu, want_dst.size(), c.dst_where);
  Buffer gpu_src_index(gpu, kCapacity * sizeof(int32_t));
  Buffer gpu_dst_index(gpu, kCapacity * sizeof(int32_t));
  Buffer gpu_count(gpu, sizeof(int32_t));
  Buffer gpu_invalid(gpu, sizeof(unsigned long long));
  gpu_src.Upload(src);
  gpu_dst.Fill(kPoison);
  gpu_src_index.Upload(src_index);
  gpu_dst_index.Upload(dst_index);
  gpu_count.Upload(std::vector<int32_t>{count});
  gpu_invalid.Upload(std::vector<unsigned long long>{3});
  ExpectOk(gpu.IndexCopy(
      {gpu_src.get(), gpu_dst.get(), gpu_src_index.get<int32_t>(), gpu_dst_index.get<int32_t>(),
       gpu_count.get<int32_t>(), kCapacity, c.row_bytes, stride, stride, kSrcRows, kDstRows,
       gpu_invalid.get<unsigned long long>(), c.max_blocks, c.strategy},
      nullptr));
  ExpectOk(gpu.Synchronize(nullptr));

  const std::vector<std::byte> got_dst = gpu_dst.Download<std::byte>();
  ASSERT_EQ(got_dst.size(), want_dst.size());
  for (int64_t row = 0; row < kDstRows; ++row) {
    ASSERT_EQ(std::memcmp(got_dst.data() + row * stride, want_dst.data() + row * stride, stride), 0)
        << "destination row " << row;
  }
  EXPECT_EQ(gpu_invalid.Download<unsigned long long>()[0], want_invalid);
}

TEST(CudaIndexCopyTest, MatchesReferenceInEveryDirection) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const std::pair<Where, Where> directions[] = {{Where::kHost, Where::kDevice},
                                                {Where::kDevice, Where::kHost},
                                                {Where::kDevice, Where::kDevice}};
  uint64_t seed = 1;
  for (const auto& [from, to] : directions) {
    for (int32_t row_bytes : {1, 3, 132, 656, 704, 1152}) {
      for (int32_t pad : {0, 8}) {
        RunIndexCopyCase(*gpu, {from, to, row_bytes, pad, 3001}, seed++);
      }
    }
  }
}

// A capped grid (max_blocks) walks many rows per thread; 1 block leaves a single lattice.
TEST(CudaIndexCopyTest, SmallGridMatchesReference) {
  SPARSEKV_REQUIRE_GPU(gpu);
  uint64_t seed = 300;
  for (int32_t max_blocks : {1, 3, 16}) {
    for (int32_t row_bytes : {3, 656, 1152}) {
      RunIndexCopyCase(*gpu, {Where::kHost, Where::kDevice, row_bytes, 0, 3001, max_blocks},
                       seed++);
    }
  }
  RunIndexCopyCase(*gpu, {Where::kDevice, Where::kHost, 656, 8, 4096, 2}, seed++);
}

// Every strategy, in every direction, at the access widths 1, 8 and 16, with rows past the bulk
// copy's limit (4112 B: its fallback) and grids capped to a few blocks.
TEST(CudaIndexCopyTest, EveryStrategyMatchesReference) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const std::pair<Where, Where> directions[] = {{Where::kHost, Where::kDevice},
                                                {Where::kDevice, Where::kHost},
                                                {Where::kDevice, Where::kDevice}};
  uint64_t seed = 500;
  for (const CopyStrategy strategy : kAllStrategies) {
    for (const auto& [from, to] : directions) {
      for (int32_t row_bytes : {3, 656, 1152}) {
        for (int32_t pad : {0, 8}) {
          RunIndexCopyCase(*gpu, {from, to, row_bytes, pad, 3001, 0, strategy}, seed++);
        }
      }
    }
    for (int32_t row_bytes : {16, 4096, 4112}) {
      RunIndexCopyCase(*gpu, {Where::kHost, Where::kDevice, row_bytes, 0, 4096, 0, strategy},
                       seed++);
    }
    for (int32_t max_blocks : {1, 3}) {
      RunIndexCopyCase(*gpu, {Where::kHost, Where::kDevice, 656, 0, 3001, max_blocks, strategy},
                       seed++);
    }
    RunIndexCopyCase(*gpu, {Where::kHost, Where::kDevice, 656, 0, 0, 0, strategy}, seed++);
    RunIndexCopyCase(*gpu, {Where::kHost, Where::kDevice, 1152, 0, 1 << 30, 0, strategy}, seed++);
    RunIndexCopyCase(*gpu, {Where::kHost, Where::kDevice, 656, 0, 5, 0, strategy}, seed++);
  }
}

// A step's append as one IndexCopyPair: `rows` rows of `row_bytes` (stride row_bytes + pad) into
// slots of a layer, and keys of `key_bytes` into its 4-byte words, one list of `capacity` batch
// rows (about 1 in 16 invalid on one side), `count` of them read. The GPU's pair against the
// reference's two copies, the layer compared whole; the layer in device or host memory.
void RunIndexCopyPairCase(Backend& gpu, Where where, int32_t row_bytes, int32_t pad,
                          int32_t key_bytes, int32_t capacity, int32_t count, uint64_t seed) {
  SCOPED_TRACE("row_bytes=" + std::to_string(row_bytes) + " pad=" + std::to_string(pad) +
               " key_bytes=" + std::to_string(key_bytes) + " capacity=" + std::to_string(capacity) +
               " count=" + std::to_string(count) + (where == Where::kHost ? " host" : " device"));
  std::mt19937_64 rng(seed);
  const int64_t stride = row_bytes + pad;
  // Slots in the layer's first half, key words (distinct, non-overlapping keys) in its second.
  const int64_t slots = int64_t{capacity} + 17;
  const int64_t key_rows = (int64_t{capacity} * key_bytes + stride - 1) / stride + 1;
  const int64_t layer_rows = slots + key_rows;
  const int64_t words = (layer_rows * stride - key_bytes) / 4 + 1;
  const int64_t key_word_stride = (key_bytes + 3) / 4;
  std::vector<int32_t> src(capacity), slot(slots), word(capacity);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng);
  slot.resize(capacity);
  std::vector<int32_t> key_order(capacity);
  std::iota(key_order.begin(), key_order.end(), 0);
  std::shuffle(key_order.begin(), key_order.end(), rng);
  const int64_t first_key_word = (slots * stride + 3) / 4;
  for (int32_t i = 0; i < capacity; ++i) {
    src[i] = i;
    word[i] = static_cast<int32_t>(first_key_word + key_order[i] * key_word_stride);
    if (rng() % 16 == 0) {
      switch (rng() % 3) {
        case 0:
          src[i] = static_cast<int32_t>(capacity + rng() % 5);
          break;
        case 1:
          slot[i] = static_cast<int32_t>(layer_rows + rng() % 5);
          break;
        default:
          word[i] = -1;
          break;
      }
    }
  }
  std::shuffle(src.begin(), src.end(), rng);
  const std::vector<std::byte> rows = RandomBytes(rng, size_t(capacity) * stride);
  const std::vector<std::byte> keys = RandomBytes(rng, size_t(capacity) * key_bytes);
  const auto views = [&](const std::byte* r, const std::byte* k, std::byte* layer, const int32_t* s,
                         const int32_t* d, const int32_t* w, const int32_t* n,
                         unsigned long long* invalid_rows, unsigned long long* invalid_keys) {
    const IndexCopyView to_slots{r,          layer,        s,      d,      n,
                                 capacity,   row_bytes,    stride, stride, capacity,
                                 layer_rows, invalid_rows, 0};
    const IndexCopyView to_keys{
        k, layer, s, w, n, capacity, key_bytes, key_bytes, 4, capacity, words, invalid_keys, 0};
    return IndexCopyPairView{to_slots, to_keys};
  };
  std::vector<std::byte> want = Poisoned<std::byte>(size_t(layer_rows) * stride);
  unsigned long long want_rows = 3, want_keys = 5;
  const IndexCopyPairView ref = views(rows.data(), keys.data(), want.data(), src.data(),
                                      slot.data(), word.data(), &count, &want_rows, &want_keys);
  reference::IndexCopy(ref.first);
  reference::IndexCopy(ref.second);

  Buffer gpu_rows(gpu, rows.size()), gpu_keys(gpu, keys.size());
  Buffer gpu_layer(gpu, want.size(), where);
  Buffer gpu_src(gpu, src.size() * 4), gpu_slot(gpu, slot.size() * 4),
      gpu_word(gpu, word.size() * 4);
  Buffer gpu_count(gpu, sizeof(int32_t)), gpu_invalid(gpu, 2 * sizeof(unsigned long long));
  gpu_rows.Upload(rows);
  gpu_keys.Upload(keys);
  gpu_layer.Fill(kPoison);
  gpu_src.Upload(src);
  gpu_slot.Upload(slot);
  gpu_word.Upload(word);
  gpu_count.Upload(std::vector<int32_t>{count});
  gpu_invalid.Upload(std::vector<unsigned long long>{3, 5});
  auto* invalid = gpu_invalid.get<unsigned long long>();
  ExpectOk(gpu.IndexCopyPair(
      views(gpu_rows.get(), gpu_keys.get(), gpu_layer.get(), gpu_src.get<int32_t>(),
            gpu_slot.get<int32_t>(), gpu_word.get<int32_t>(), gpu_count.get<int32_t>(), invalid,
            invalid + 1),
      nullptr));
  ExpectOk(gpu.Synchronize(nullptr));
  const std::vector<std::byte> got = gpu_layer.Download<std::byte>();
  ASSERT_EQ(got.size(), want.size());
  for (int64_t row = 0; row < layer_rows; ++row) {
    ASSERT_EQ(std::memcmp(got.data() + row * stride, want.data() + row * stride, stride), 0)
        << "layer row " << row;
  }
  EXPECT_EQ(gpu_invalid.Download<unsigned long long>(),
            (std::vector<unsigned long long>{want_rows, want_keys}));
}

// The fused append of rows and keys writes what the two copies write, byte for byte: DeepSeek's
// 656-B rows with 132-B keys, 16-B rows with 8-B keys, odd rows, counts below, at and above the
// capacity (clamped), none, and more entries than the kernel's grid (a grid-stride loop).
// A valid one-row copy view over 4 rows of 16 bytes in device memory, for the refusal tests.
struct OneRowCopy {
  explicit OneRowCopy(Backend& gpu)
      : rows(gpu, 4 * 16), index(gpu, sizeof(int32_t)), count(gpu, sizeof(int32_t)) {
    view.src = rows.get();
    view.dst = rows.get();
    view.src_index = view.dst_index = index.get<int32_t>();
    view.count = count.get<int32_t>();
    view.capacity = 1;
    view.row_bytes = 16;
    view.src_stride = view.dst_stride = 16;
    view.src_rows = view.dst_rows = 4;
  }
  Buffer rows, index, count;
  IndexCopyView view{};
};

TEST(CudaIndexCopyPairTest, MatchesTheTwoReferenceCopies) {
  SPARSEKV_REQUIRE_GPU(gpu);
  uint64_t seed = 900;
  for (const Where where : {Where::kDevice, Where::kHost}) {
    RunIndexCopyPairCase(*gpu, where, 656, 0, 132, 64, 61, seed++);
    RunIndexCopyPairCase(*gpu, where, 656, 0, 132, 1, 1, seed++);
    RunIndexCopyPairCase(*gpu, where, 16, 0, 8, 128, 128, seed++);
    RunIndexCopyPairCase(*gpu, where, 3, 5, 4, 32, 1 << 30, seed++);
    RunIndexCopyPairCase(*gpu, where, 1152, 8, 132, 2500, 2400, seed++);
    RunIndexCopyPairCase(*gpu, where, 656, 0, 132, 64, 0, seed++);
    RunIndexCopyPairCase(*gpu, where, 656, 0, 132, 64, -3, seed++);
  }
}

TEST(CudaIndexCopyPairTest, AViewIndexCopyRefusesIsInvalidArgument) {
  SPARSEKV_REQUIRE_GPU(gpu);
  OneRowCopy copy(*gpu);
  const IndexCopyView v = copy.view;
  IndexCopyView bad = v;
  bad.row_bytes = 0;
  EXPECT_EQ(gpu->IndexCopyPair({v, bad}, nullptr).code(), StatusCode::kInvalidArgument);
  bad = v;
  bad.dst_stride = -16;
  EXPECT_EQ(gpu->IndexCopyPair({bad, v}, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(CudaIndexCopyTest, NegativeMaxBlocksIsInvalidArgument) {
  SPARSEKV_REQUIRE_GPU(gpu);
  OneRowCopy copy(*gpu);
  IndexCopyView v = copy.view;
  v.max_blocks = -1;
  EXPECT_EQ(gpu->IndexCopy(v, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(CudaIndexCopyTest, CountIsClampedToCapacity) {
  SPARSEKV_REQUIRE_GPU(gpu);
  RunIndexCopyCase(*gpu, {Where::kHost, Where::kDevice, 656, 0, 1 << 30}, 100);
  RunIndexCopyCase(*gpu, {Where::kDevice, Where::kDevice, 3, 0, 4097}, 101);
}

TEST(CudaIndexCopyTest, ZeroOrNegativeCountCopiesNothing) {
  SPARSEKV_REQUIRE_GPU(gpu);
  RunIndexCopyCase(*gpu, {Where::kHost, Where::kDevice, 656, 0, 0}, 200);
  RunIndexCopyCase(*gpu, {Where::kDevice, Where::kHost, 1152, 0, -5}, 201);
}

TEST(CudaIndexCopyTest, NullInvalidCounterIsAllowed) {
  SPARSEKV_REQUIRE_GPU(gpu);
  Buffer src(*gpu, 4 * 16);
  Buffer dst(*gpu, 4 * 16);
  Buffer index(*gpu, 4 * sizeof(int32_t));
  Buffer count(*gpu, sizeof(int32_t));
  src.Fill(1);
  dst.Fill(0);
  index.Upload(std::vector<int32_t>{0, 9, 2, -1});
  count.Upload(std::vector<int32_t>{4});
  ExpectOk(gpu->IndexCopy({src.get(), dst.get(), index.get<int32_t>(), index.get<int32_t>(),
                           count.get<int32_t>(), 4, 16, 16, 16, 4, 4, nullptr, 0},
                          nullptr));
  ExpectOk(gpu->Synchronize(nullptr));
  std::vector<uint8_t> want(4 * 16, 0);
  std::fill(want.begin(), want.begin() + 16, 1);
  std::fill(want.begin() + 32, want.begin() + 48, 1);
  EXPECT_EQ(dst.Download<uint8_t>(), want);
}

// ---------------------------------------------------------------------------------------------
// Resolve

struct ResolveShape {
  int32_t max_batch;
  int32_t top_k;
  int32_t hot_slots;
  int32_t window;
  int32_t steps;
  int32_t protected_capacity = -1;  // >= 0: segmented LRU with this capacity; -1: LRU
  // The clock's state instead of the LRU order (protected_capacity is then ignored); kShortMap:
  // a position map that later steps' histories outgrow (their newest positions out of range).
  enum Clock { kNoClock, kClock, kShortMap } clock = kNoClock;
  // Prefetch accounting (ResolveView::prefetch_mark), starting from random marks; steps take
  // turns as a prefetch's launch, a step's that counts its misses, and a step's that does not.
  bool marks = false;
};

std::string ShapeName(const ResolveShape& s) {
  return "B=" + std::to_string(s.max_batch) + " K=" + std::to_string(s.top_k) +
         " C=" + std::to_string(s.hot_slots) + " W=" + std::to_string(s.window) +
         (s.protected_capacity >= 0 ? " P=" + std::to_string(s.protected_capacity) : "") +
         (s.clock == ResolveShape::kClock      ? " clock"
          : s.clock == ResolveShape::kShortMap ? " clock (short map)"
                                               : "") +
         (s.marks ? " marks" : "");
}

// The fused miss copy of a ResolveHarness (ResolveView's copy fields).
struct FusedCopyShape {
  int32_t row_bytes = 0;   // 0: no fused copy and no rows (the resolve state alone)
  int32_t stride_pad = 0;  // row stride = row_bytes + stride_pad
  int32_t min_batch = 0;   // fused_copy_min_batch
};

// One layer's resolve state and inputs, held twice: in host vectors for the reference and in the
// backend's device memory for the GPU, and stepped in lockstep. With a FusedCopyShape the layer
// also has rows: a pool in pinned host memory (read by both sides; some of its pages unmapped or
// cut off, so that some copies are invalid) and a hot cache on each side, filled by the fused copy
// and by an IndexCopy of the miss list after each Resolve (as a step enqueues them), and compared
// whole after every step.
class ResolveHarness {
 public:
  static constexpr int32_t kPageTokens = 64;
  static constexpr int32_t kResidentRows = 48;   // R of the resident rows
  static constexpr int32_t kBlockPageRows = 40;  // odd seeds: blocks in pages of this many slots

  ResolveHarness(Backend& gpu, const ResolveShape& shape, uint64_t seed,
                 const FusedCopyShape& fused = {})
      : gpu_(gpu),
        s_(shape),
        fused_(fused),
        rng_(seed),
        topk_stride_(shape.top_k + 3),
        num_blocks_(shape.max_batch + 5),
        // Each step grows a row by at most top_k + window + 64 tokens.
        pages_per_request_(
            (InitialSeqLen() + shape.steps * (shape.top_k + shape.window + 64)) / kPageTokens + 2),
        resident_pages_(pages_per_request_ * kPageTokens / kResidentRows + 1),
        slot_token_(static_cast<size_t>(num_blocks_) * shape.hot_slots, -1),
        lru_order_(static_cast<size_t>(num_blocks_) * shape.hot_slots),
        lru_protected_(num_blocks_, 0),
        positions_(shape.clock == ResolveShape::kShortMap ? InitialSeqLen() + 64
                                                          : pages_per_request_ * kPageTokens),
        clock_uses_(shape.clock != ResolveShape::kNoClock
                        ? static_cast<size_t>(num_blocks_) * shape.hot_slots
                        : 0,
                    0),
        clock_hand_(num_blocks_, 0),
        position_slot_(shape.clock != ResolveShape::kNoClock
                           ? static_cast<size_t>(num_blocks_) * positions_
                           : 0,
                       -1),
        batch_(shape.max_batch),
        topk_(static_cast<size_t>(shape.max_batch) * topk_stride_, kPaddingPosition),
        page_table_(static_cast<size_t>(shape.max_batch) * pages_per_request_),
        resident_table_(static_cast<size_t>(shape.max_batch) * resident_pages_),
        paged_(seed % 2 == 1),
        pages_per_block_((shape.hot_slots + shape.window + kBlockPageRows - 1) / kBlockPageRows),
        block_pages_(static_cast<size_t>(num_blocks_) * pages_per_block_),
        // The marks, then the byte a counting launch reads (ResolveView::count_prefetch_misses).
        marks_(shape.marks ? static_cast<size_t>(num_blocks_) * shape.hot_slots + 1 : 0),
        g_batch_size_(gpu, sizeof(int32_t)),
        g_batch_(gpu, batch_.size() * sizeof(BatchEntry)),
        g_topk_(gpu, topk_.size() * sizeof(int32_t)),
        g_slots_out_(gpu, MissCapacity() * sizeof(int32_t)),
        g_slot_token_(gpu, slot_token_.size() * sizeof(int32_t)),
        g_lru_order_(gpu, lru_order_.size() * sizeof(int32_t)),
        g_lru_protected_(gpu, lru_protected_.size() * sizeof(int32_t)),
        g_clock_uses_(gpu, std::max<size_t>(clock_uses_.size(), 1)),
        g_clock_hand_(gpu, clock_hand_.size() * sizeof(int32_t)),
        g_position_slot_(gpu, std::max<size_t>(position_slot_.size(), 1) * sizeof(int32_t)),
        g_page_table_(gpu, page_table_.size() * sizeof(int32_t)),
        g_resident_table_(gpu, resident_table_.size() * sizeof(int32_t)),
        g_block_pages_(gpu, block_pages_.size() * sizeof(int32_t)),
        g_miss_host_row_(gpu, MissCapacity() * sizeof(int32_t)),
        g_miss_slot_(gpu, MissCapacity() * sizeof(int32_t)),
        g_miss_count_(gpu, sizeof(int32_t)),
        g_counters_(gpu, sizeof(ResolveCounters)),
        g_fill_mask_(gpu, MissCapacity()),
        g_marks_(gpu, std::max<size_t>(marks_.size(), 1)) {
    for (int32_t block = 0; block < num_blocks_; ++block) {
      std::iota(lru_order_.begin() + static_cast<int64_t>(block) * s_.hot_slots,
                lru_order_.begin() + static_cast<int64_t>(block + 1) * s_.hot_slots, 0);
    }
    // Distinct blocks and page-table rows; every 7th row unused, every 5th (from row 3) resident
    // (residency row b); one very short request.
    std::vector<int32_t> blocks(num_blocks_);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng_);
    for (int32_t b = 0; b < s_.max_batch; ++b) {
      const int32_t row = s_.max_batch - 1 - b;
      const bool resident = b % 5 == 3;
      batch_[b] = {b % 7 == 6 || resident ? -1 : blocks[b], b == 1 ? 1 : InitialSeqLen(), row,
                   resident ? b : kNotResident};
    }
    // Host pages: a permutation, so that host rows are distinct across requests.
    std::iota(page_table_.begin(), page_table_.end(), 0);
    std::shuffle(page_table_.begin(), page_table_.end(), rng_);
    g_slot_token_.Upload(slot_token_);
    g_lru_order_.Upload(lru_order_);
    g_lru_protected_.Upload(lru_protected_);
    if (clock()) {
      // Random hands, so that sweeps start anywhere and wrap.
      for (int32_t& hand : clock_hand_) hand = static_cast<int32_t>(rng_() % s_.hot_slots);
      g_clock_uses_.Upload(clock_uses_);
      g_position_slot_.Upload(position_slot_);
    }
    g_clock_hand_.Upload(clock_hand_);
    for (uint8_t& mark : marks_) mark = static_cast<uint8_t>(rng_() % 2);
    if (s_.marks) {
      marks_.back() = 1;
      g_marks_.Upload(marks_);
    }
    g_page_table_.Upload(page_table_);
    if (fused_.row_bytes > 0) InitRows();
    // Any slots will do: the mapping is checked, not the rows.
    for (int32_t& first_slot : resident_table_) first_slot = static_cast<int32_t>(rng_() % 1000000);
    g_resident_table_.Upload(resident_table_);
    // Paged blocks: the pages of all blocks in a random order (the slots they name hold no rows
    // here either).
    std::iota(block_pages_.begin(), block_pages_.end(), 0);
    std::shuffle(block_pages_.begin(), block_pages_.end(), rng_);
    for (int32_t& first_slot : block_pages_) first_slot *= kBlockPageRows;
    g_block_pages_.Upload(block_pages_);
    g_counters_.Fill(0);
    last_topk_ = topk_;
  }

  enum class Mode { kMixed, kRepeat, kFresh };
  struct Flags {
    bool sort_misses;
    bool share_duplicates;
    bool fill_mask;  // ask for the fill mask
  };

  // Builds the next step's inputs, runs both sides, and compares everything.
  void Step(Mode mode, int32_t batch_size, Flags flags) {
    SCOPED_TRACE(ShapeName(s_) + " step " + std::to_string(step_) + " batch_size=" +
                 std::to_string(batch_size) + " sort=" + std::to_string(flags.sort_misses) +
                 " share=" + std::to_string(flags.share_duplicates) +
                 " fill_mask=" + std::to_string(flags.fill_mask));
    ++step_;
    for (int32_t b = 0; b < s_.max_batch; ++b) MakeRow(b, mode);

    // Reference.
    std::vector<int32_t> want_out = Poisoned<int32_t>(MissCapacity());
    std::vector<int32_t> want_miss_row = Poisoned<int32_t>(MissCapacity());
    std::vector<int32_t> want_miss_slot = Poisoned<int32_t>(MissCapacity());
    std::vector<uint8_t> want_fill = Poisoned<uint8_t>(MissCapacity());
    int32_t want_miss_count = 0;
    const ResolveView want_view =
        View(&batch_size, batch_.data(), topk_.data(), want_out.data(), slot_token_.data(),
             lru_order_.data(), lru_protected_.data(), page_table_.data(), resident_table_.data(),
             block_pages_.data(), want_miss_row.data(), want_miss_slot.data(), &want_miss_count,
             &counters_, flags.fill_mask ? want_fill.data() : nullptr, flags, hot_.data(),
             &copy_invalid_);
    reference::Resolve(WithMarks(
        WithClock(want_view, clock_uses_.data(), clock_hand_.data(), position_slot_.data()),
        marks_.data()));
    if (fused_.row_bytes > 0) reference::IndexCopy(ListCopy(want_view));

    // GPU.
    g_batch_size_.Upload(std::vector<int32_t>{batch_size});
    g_batch_.Upload(batch_);
    g_topk_.Upload(topk_);
    g_slots_out_.Fill(kPoison);
    g_miss_host_row_.Fill(kPoison);
    g_miss_slot_.Fill(kPoison);
    g_miss_count_.Fill(0);
    g_fill_mask_.Fill(kPoison);
    RunGpu(flags);
    if (::testing::Test::HasFatalFailure()) return;

    EXPECT_EQ(g_slots_out_.Download<int32_t>(), want_out);
    EXPECT_EQ(g_fill_mask_.Download<uint8_t>(),
              flags.fill_mask ? want_fill : Poisoned<uint8_t>(MissCapacity()));
    EXPECT_EQ(g_slot_token_.Download<int32_t>(), slot_token_);
    EXPECT_EQ(g_lru_order_.Download<int32_t>(), lru_order_);
    EXPECT_EQ(g_lru_protected_.Download<int32_t>(), lru_protected_);
    if (clock()) {
      EXPECT_EQ(g_clock_uses_.Download<uint8_t>(), clock_uses_);
      EXPECT_EQ(g_clock_hand_.Download<int32_t>(), clock_hand_);
      EXPECT_EQ(g_position_slot_.Download<int32_t>(), position_slot_);
    }
    const ResolveCounters got = g_counters_.Download<ResolveCounters>()[0];
    EXPECT_EQ(got.hits, counters_.hits);
    EXPECT_EQ(got.window_hits, counters_.window_hits);
    EXPECT_EQ(got.misses, counters_.misses);
    EXPECT_EQ(got.padding, counters_.padding);
    EXPECT_EQ(got.duplicates, counters_.duplicates);
    EXPECT_EQ(got.out_of_range, counters_.out_of_range);
    EXPECT_EQ(got.resident_hits, counters_.resident_hits);
    EXPECT_EQ(got.prefetch_useful, counters_.prefetch_useful);
    EXPECT_EQ(got.prefetch_wasted, counters_.prefetch_wasted);
    EXPECT_EQ(got.prefetch_missed, counters_.prefetch_missed);
    if (s_.marks) {
      EXPECT_EQ(g_marks_.Download<uint8_t>(), marks_);
    }

    const int32_t got_miss_count = g_miss_count_.Download<int32_t>()[0];
    ASSERT_EQ(got_miss_count, want_miss_count);
    const std::vector<int32_t> got_miss_row = g_miss_host_row_.Download<int32_t>();
    const std::vector<int32_t> got_miss_slot = g_miss_slot_.Download<int32_t>();
    std::vector<std::pair<int32_t, int32_t>> got_misses;
    std::vector<std::pair<int32_t, int32_t>> want_misses;
    for (int32_t i = 0; i < want_miss_count; ++i) {
      got_misses.emplace_back(got_miss_row[i], got_miss_slot[i]);
      want_misses.emplace_back(want_miss_row[i], want_miss_slot[i]);
    }
    // Entries past the list stay poisoned.
    EXPECT_TRUE(std::equal(got_miss_row.begin() + want_miss_count, got_miss_row.end(),
                           want_miss_row.begin() + want_miss_count));
    if (flags.sort_misses) ExpectSortedRuns(got_misses);
    std::sort(got_misses.begin(), got_misses.end());
    std::sort(want_misses.begin(), want_misses.end());
    EXPECT_EQ(got_misses, want_misses);

    if (fused_.row_bytes > 0) {
      const std::vector<std::byte> got_hot = g_hot_->Download<std::byte>();
      ASSERT_EQ(got_hot.size(), hot_.size());
      for (int64_t row = 0; row < HotRows(); ++row) {
        ASSERT_EQ(std::memcmp(got_hot.data() + row * RowStride(), hot_.data() + row * RowStride(),
                              RowStride()),
                  0)
            << "hot row " << row;
      }
      EXPECT_EQ(g_copy_invalid_->Download<unsigned long long>()[0], copy_invalid_);
    }
    last_topk_ = topk_;
  }

  // Misses and invalid copies so far (the reference's counts, which the GPU's matched).
  uint64_t misses() const { return counters_.misses; }
  // The reference's prefetch counters so far (which the GPU's matched).
  const ResolveCounters& counters() const { return counters_; }
  uint64_t copy_invalid() const { return copy_invalid_ - kInvalidStart; }

  // From now on the GPU side runs one CUDA graph, captured at the next Step, on `stream`: Resolve
  // and (with a fused copy) the IndexCopy of the miss list. Every later Step must pass the same
  // flags (the views are captured by value); batch size and inputs change freely.
  void ReplayCapturedOn(StreamHandle stream) { stream_ = stream; }

  ~ResolveHarness() {
#if defined(SPARSEKV_WITH_CUDA)
    if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
#endif
  }

 private:
  static int32_t InitialSeqLen() { return 3000; }
  bool clock() const { return s_.clock != ResolveShape::kNoClock; }
  int64_t MissCapacity() const { return static_cast<int64_t>(s_.max_batch) * s_.top_k; }
  int64_t RowStride() const { return fused_.row_bytes + fused_.stride_pad; }
  // Paged blocks name the slots of num_blocks * pages_per_block pages.
  int64_t HotRows() const {
    return paged_ ? int64_t{num_blocks_} * pages_per_block_ * kBlockPageRows
                  : int64_t{num_blocks_} * (s_.hot_slots + s_.window);
  }
  int64_t PoolRows() const { return int64_t{s_.max_batch} * pages_per_request_ * kPageTokens; }
  // The pool's rows the copies may read: the last two pages and a few rows are cut off.
  int64_t ValidPoolRows() const { return PoolRows() - 2 * kPageTokens - 5; }

  // The rows of a harness with a fused copy; every 17th host page unmapped (-1).
  void InitRows() {
    for (size_t p = 0; p < page_table_.size(); p += 17) page_table_[p] = -1;
    g_page_table_.Upload(page_table_);
    g_pool_ = std::make_unique<Buffer>(gpu_, PoolRows() * RowStride(), Where::kHost);
    FillRandom(rng_, g_pool_->get(), PoolRows() * RowStride());
    hot_.assign(HotRows() * RowStride(), std::byte{kPoison});
    g_hot_ = std::make_unique<Buffer>(gpu_, hot_.size());
    g_hot_->Fill(kPoison);
    g_copy_invalid_ = std::make_unique<Buffer>(gpu_, sizeof(unsigned long long));
    g_copy_invalid_->Upload(std::vector<unsigned long long>{copy_invalid_});
  }

  // The IndexCopy of a resolve view's miss list into its copy destination (strategies in turn).
  IndexCopyView ListCopy(const ResolveView& v) const {
    return {v.copy_src,        v.copy_dst,
            v.miss_host_row,   v.miss_slot,
            v.miss_count,      v.miss_capacity,
            v.copy_row_bytes,  v.copy_src_stride,
            v.copy_dst_stride, v.copy_src_rows,
            v.copy_dst_rows,   v.copy_invalid,
            /*max_blocks=*/0,  kAllStrategies[step_ % std::size(kAllStrategies)]};
  }

  ResolveView GpuView(Flags flags) const {
    return View(
        g_batch_size_.get<int32_t>(), g_batch_.get<BatchEntry>(), g_topk_.get<int32_t>(),
        g_slots_out_.get<int32_t>(), g_slot_token_.get<int32_t>(), g_lru_order_.get<int32_t>(),
        g_lru_protected_.get<int32_t>(), g_page_table_.get<int32_t>(),
        g_resident_table_.get<int32_t>(), g_block_pages_.get<int32_t>(),
        g_miss_host_row_.get<int32_t>(), g_miss_slot_.get<int32_t>(), g_miss_count_.get<int32_t>(),
        g_counters_.get<ResolveCounters>(), flags.fill_mask ? g_fill_mask_.get<uint8_t>() : nullptr,
        flags, g_hot_ ? g_hot_->get() : nullptr,
        g_copy_invalid_ ? g_copy_invalid_->get<unsigned long long>() : nullptr);
  }

  // `v` with the clock's state (when the shape has it) instead of the LRU order.
  ResolveView WithClock(ResolveView v, uint8_t* uses, int32_t* hands, int32_t* map) const {
    if (!clock()) return v;
    v.lru_order = nullptr;
    v.lru_protected = nullptr;
    v.clock_uses = uses;
    v.clock_hand = hands;
    v.position_slot = map;
    v.positions = positions_;
    return v;
  }

  // `v` with the prefetch marks (when the shape has them); step_ picks the launch's role.
  ResolveView WithMarks(ResolveView v, uint8_t* marks) const {
    if (!s_.marks) return v;
    v.prefetch_mark = marks;
    v.prefetch_fills = step_ % 3 == 1;
    v.count_prefetch_misses = step_ % 3 == 2 ? marks + marks_.size() - 1 : nullptr;
    return v;
  }

  // Enqueues the GPU side's Resolve and (with a fused copy) IndexCopy on `stream`.
  void EnqueueGpu(Flags flags, StreamHandle stream) {
    const ResolveView v =
        WithMarks(WithClock(GpuView(flags), g_clock_uses_.get<uint8_t>(),
                            g_clock_hand_.get<int32_t>(), g_position_slot_.get<int32_t>()),
                  g_marks_.get<uint8_t>());
    ExpectOk(gpu_.Resolve(v, s_.max_batch, stream));
    if (fused_.row_bytes > 0) ExpectOk(gpu_.IndexCopy(ListCopy(v), stream));
  }

  // Runs the GPU side: directly, or by replaying the captured graph (capturing it first).
  void RunGpu(Flags flags) {
    if (stream_ == nullptr) {
      EnqueueGpu(flags, nullptr);
      ExpectOk(gpu_.Synchronize(nullptr));
      return;
    }
#if defined(SPARSEKV_WITH_CUDA)
    const cudaStream_t stream = static_cast<cudaStream_t>(stream_);
    if (exec_ == nullptr) {
      captured_flags_ = flags;
      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      EnqueueGpu(flags, stream_);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      cudaGraphDestroy(graph);
      exec_ = exec;
    }
    ASSERT_FALSE(s_.marks) << "the marks' roles change from step to step; a graph captures one";
    ASSERT_TRUE(flags.sort_misses == captured_flags_.sort_misses &&
                flags.share_duplicates == captured_flags_.share_duplicates &&
                flags.fill_mask == captured_flags_.fill_mask)
        << "a captured harness steps with the flags it was captured with";
    ASSERT_EQ(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream), cudaSuccess);
    ExpectOk(gpu_.Synchronize(stream_));
#else
    FAIL() << "graph replay needs the CUDA runtime";
#endif
  }

  ResolveView View(const int32_t* batch_size, const BatchEntry* batch, const int32_t* topk,
                   int32_t* slots_out, int32_t* slot_token, int32_t* lru_order,
                   int32_t* lru_protected, const int32_t* page_table, const int32_t* resident_table,
                   const int32_t* block_pages, int32_t* miss_host_row, int32_t* miss_slot,
                   int32_t* miss_count, ResolveCounters* counters, uint8_t* fill_mask, Flags flags,
                   std::byte* hot, unsigned long long* copy_invalid) const {
    const bool fused = fused_.row_bytes > 0;
    return {.batch_size = batch_size,
            .batch = batch,
            .topk = topk,
            .top_k = s_.top_k,
            .topk_stride = topk_stride_,
            .slots_out = slots_out,
            .slot_token = slot_token,
            .lru_order = lru_order,
            .lru_protected = s_.protected_capacity >= 0 ? lru_protected : nullptr,
            .protected_capacity = s_.protected_capacity,
            .hot_slots = s_.hot_slots,
            .window = s_.window,
            .page_table = page_table,
            .pages_per_request = pages_per_request_,
            .page_tokens = kPageTokens,
            .miss_host_row = miss_host_row,
            .miss_slot = miss_slot,
            .miss_count = miss_count,
            .miss_capacity = static_cast<int32_t>(MissCapacity()),
            .counters = counters,
            .fill_mask = fill_mask,
            .sort_misses = flags.sort_misses,
            .sort_min_batch = 0,
            .share_duplicates = flags.share_duplicates,
            .resident_table = resident_table,
            .resident_pages = resident_pages_,
            .resident_page_rows = kResidentRows,
            .block_pages = paged_ ? block_pages : nullptr,
            .pages_per_block = pages_per_block_,
            .block_page_rows = kBlockPageRows,
            .copy_src = fused ? g_pool_->get() : nullptr,
            .copy_dst = fused ? hot : nullptr,
            .copy_row_bytes = fused_.row_bytes,
            .copy_src_stride = RowStride(),
            .copy_dst_stride = RowStride(),
            .copy_src_rows = fused ? ValidPoolRows() : 0,
            .copy_dst_rows = fused ? HotRows() : 0,
            .copy_invalid = copy_invalid,
            .fused_copy_min_batch = fused_.min_batch};
  }

  // The next top-k of row b. kMixed: about half from the row's last top-k, the rest anywhere in
  // [0, seq_len), with padding, duplicates and out-of-range entries sprinkled in. kRepeat: the last
  // top-k again. kFresh: seq_len jumps past every position seen so far and all positions are new.
  void MakeRow(int32_t b, Mode mode) {
    BatchEntry& e = batch_[b];
    int32_t* row = topk_.data() + static_cast<int64_t>(b) * topk_stride_;
    const int32_t* last = last_topk_.data() + static_cast<int64_t>(b) * topk_stride_;
    const int32_t k = s_.top_k;
    if (mode == Mode::kRepeat) {
      std::copy(last, last + topk_stride_, row);
      return;
    }
    const int32_t old_len = e.seq_len;
    if (b != 1) e.seq_len += mode == Mode::kFresh ? k + s_.window + 1 : 1 + rng_() % 40;
    for (int32_t i = 0; i < k; ++i) {
      int32_t p;
      if (mode == Mode::kFresh) {
        p = b == 1 ? 0 : old_len + i;
      } else {
        switch (rng_() % 16) {
          case 0:
            p = kPaddingPosition;
            break;
          case 1:
            p = rng_() % 2 == 0 ? e.seq_len + static_cast<int32_t>(rng_() % 5)
                                : -2 - static_cast<int32_t>(rng_() % 5);
            break;
          case 2:
            p = i > 0 ? row[rng_() % i] : kPaddingPosition;
            break;
          case 3:
          case 4:
          case 5:
          case 6:
          case 7:
          case 8:
            p = last[rng_() % k];
            if (p < 0 || p >= e.seq_len) p = static_cast<int32_t>(rng_() % e.seq_len);
            break;
          default:
            p = static_cast<int32_t>(rng_() % e.seq_len);
            break;
        }
      }
      row[i] = p;
    }
    // Entries between top_k and the stride are never read; make them look like positions.
    for (int32_t i = k; i < topk_stride_; ++i) row[i] = i % std::max(e.seq_len, 1);
  }

  // The block a slot belongs to: slot / (C + W), or, with paged blocks, the block whose page
  // list names the slot's page.
  int32_t BlockOf(int32_t slot) const {
    if (!paged_) return slot / (s_.hot_slots + s_.window);
    const int32_t first = slot - slot % kBlockPageRows;
    const auto it = std::find(block_pages_.begin(), block_pages_.end(), first);
    return static_cast<int32_t>((it - block_pages_.begin()) / pages_per_block_);
  }

  // With sort_misses, each row's misses are contiguous and ascending by host row. A row is
  // recognised by its block.
  void ExpectSortedRuns(const std::vector<std::pair<int32_t, int32_t>>& misses) const {
    std::vector<int32_t> seen_blocks;
    for (size_t i = 0; i < misses.size(); ++i) {
      const int32_t block = BlockOf(misses[i].second);
      if (i > 0 && BlockOf(misses[i - 1].second) == block) {
        // Ties: rows of unmapped pages (negative host rows, skipped by the copy) may repeat.
        EXPECT_LE(misses[i - 1].first, misses[i].first) << "miss " << i;
      } else {
        EXPECT_EQ(std::count(seen_blocks.begin(), seen_blocks.end(), block), 0)
            << "block " << block << " appears in two runs";
        seen_blocks.push_back(block);
      }
    }
  }

  Backend& gpu_;
  const ResolveShape s_;
  const FusedCopyShape fused_;
  std::mt19937_64 rng_;
  const int32_t topk_stride_;
  const int32_t num_blocks_;
  const int32_t pages_per_request_;
  int step_ = 0;
  const int32_t resident_pages_;

  // The reference's state and inputs.
  std::vector<int32_t> slot_token_;
  std::vector<int32_t> lru_order_;
  std::vector<int32_t> lru_protected_;  // [blocks]; stays 0 for LRU
  const int32_t positions_;             // clock: entries per block of the position map
  std::vector<uint8_t> clock_uses_;     // clock: [blocks, C]
  std::vector<int32_t> clock_hand_;     // clock: [blocks]
  std::vector<int32_t> position_slot_;  // clock: [blocks, positions_]
  std::vector<BatchEntry> batch_;
  std::vector<int32_t> topk_;
  std::vector<int32_t> last_topk_;
  std::vector<int32_t> page_table_;
  std::vector<int32_t> resident_table_;  // [max_batch, resident_pages_]
  const bool paged_;                     // the view names block_pages_
  const int32_t pages_per_block_;
  std::vector<int32_t> block_pages_;  // [num_blocks, pages_per_block_]
  std::vector<uint8_t> marks_;        // with shape.marks: [blocks, C], then the counting byte
  ResolveCounters counters_{};

  // The GPU's.
  Buffer g_batch_size_;
  Buffer g_batch_;
  Buffer g_topk_;
  Buffer g_slots_out_;
  Buffer g_slot_token_;
  Buffer g_lru_order_;
  Buffer g_lru_protected_;
  Buffer g_clock_uses_;
  Buffer g_clock_hand_;
  Buffer g_position_slot_;
  Buffer g_page_table_;
  Buffer g_resident_table_;
  Buffer g_block_pages_;
  Buffer g_miss_host_row_;
  Buffer g_miss_slot_;
  Buffer g_miss_count_;
  Buffer g_counters_;
  Buffer g_fill_mask_;
  Buffer g_marks_;

  // The rows (with a fused copy): the pool, read by both sides; each side's hot cache and count
  // of invalid copies.
  std::unique_ptr<Buffer> g_pool_;
  std::vector<std::byte> hot_;
  std::unique_ptr<Buffer> g_hot_;
  static constexpr unsigned long long kInvalidStart = 2;  // counters accumulate: start nonzero
  unsigned long long copy_invalid_ = kInvalidStart;
  std::unique_ptr<Buffer> g_copy_invalid_;

  // Graph replay (ReplayCapturedOn).
  StreamHandle stream_ = nullptr;
  void* exec_ = nullptr;  // cudaGraphExec_t
  Flags captured_flags_{};
};

// A fixed schedule of steps: cold start, mixed, full hit, full miss, shrinking and growing batch.
void RunResolveSchedule(ResolveHarness& h, const ResolveShape& shape) {
  using Mode = ResolveHarness::Mode;
  const int32_t b = shape.max_batch;
  // Flags: sort misses, share duplicates, fill mask.
  const std::tuple<Mode, int32_t, ResolveHarness::Flags> schedule[] = {
      {Mode::kMixed, b, {true, false, true}},
      {Mode::kMixed, b, {false, true, true}},
      {Mode::kRepeat, b, {true, true, false}},
      {Mode::kFresh, b, {true, false, true}},
      {Mode::kMixed, std::max(1, b / 2), {true, true, true}},
      {Mode::kRepeat, std::max(1, b - 3), {false, false, false}},
      {Mode::kMixed, b, {true, true, false}},
      {Mode::kFresh, std::max(1, b - 1), {false, true, true}},
      {Mode::kMixed, b, {true, false, true}},
      {Mode::kMixed, 0, {true, true, true}},
  };
  for (int i = 0; i < std::min<int>(shape.steps, std::size(schedule)); ++i) {
    const auto& [mode, batch_size, flags] = schedule[i];
    h.Step(mode, batch_size, flags);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

void RunResolveSchedule(Backend& gpu, const ResolveShape& shape, uint64_t seed) {
  ResolveHarness h(gpu, shape, seed);
  RunResolveSchedule(h, shape);
}

struct FusedCase {
  ResolveShape shape;
  FusedCopyShape copy;
};

// Runs the schedule with a fused copy for each case; returns the invalid copies and misses seen.
std::pair<uint64_t, uint64_t> RunFusedCases(Backend& gpu, const std::vector<FusedCase>& cases,
                                            uint64_t seed) {
  uint64_t invalid = 0;
  uint64_t misses = 0;
  for (const FusedCase& c : cases) {
    SCOPED_TRACE(ShapeName(c.shape) + " row_bytes=" + std::to_string(c.copy.row_bytes) +
                 " pad=" + std::to_string(c.copy.stride_pad) +
                 " fused_copy_min_batch=" + std::to_string(c.copy.min_batch));
    ResolveHarness h(gpu, c.shape, seed++, c.copy);
    RunResolveSchedule(h, c.shape);
    if (::testing::Test::HasFatalFailure()) break;
    invalid += h.copy_invalid();
    misses += h.misses();
  }
  return {invalid, misses};
}

TEST(CudaResolveTest, CountsThePrefetchOutcomeAsTheReferenceUnderEveryPolicy) {
  SPARSEKV_REQUIRE_GPU(gpu);
  uint64_t seed = 4000;
  uint64_t useful = 0, wasted = 0, missed = 0;
  for (int32_t k : {7, 64, 600}) {
    for (const ResolveShape::Clock clock : {ResolveShape::kNoClock, ResolveShape::kClock}) {
      for (const int32_t protected_capacity : {-1, k}) {
        if (clock != ResolveShape::kNoClock && protected_capacity >= 0) continue;
        ResolveShape shape{32, k, 2 * k, 1, 10, protected_capacity, clock};
        shape.marks = true;
        ResolveHarness h(*gpu, shape, seed++);
        RunResolveSchedule(h, shape);
        if (::testing::Test::HasFatalFailure()) return;
        useful += h.counters().prefetch_useful;
        wasted += h.counters().prefetch_wasted;
        missed += h.counters().prefetch_missed;
      }
    }
  }
  // The schedule exercised every counter.
  EXPECT_GT(useful, 0u);
  EXPECT_GT(wasted, 0u);
  EXPECT_GT(missed, 0u);
  // With a fused copy, whose victims are sorted after the marks are counted.
  ResolveShape shape{16, 64, 128, 1, 10};
  shape.marks = true;
  ResolveHarness h(*gpu, shape, seed++, {.row_bytes = 24, .stride_pad = 8, .min_batch = 1});
  RunResolveSchedule(h, shape);
}

TEST(CudaResolveTest, MatchesReferenceOverManySteps) {
  SPARSEKV_REQUIRE_GPU(gpu);
  uint64_t seed = 1000;
  for (int32_t k : {1, 7, 64, 600, 2048}) {
    for (int32_t c : {k, 2 * k, 4096}) {
      for (int32_t w : {1, 4}) {
        const int32_t max_batch = k >= 2048 ? 24 : 64;
        RunResolveSchedule(*gpu, {max_batch, k, c, w, 10}, seed++);
      }
    }
  }
}

// Segmented LRU: protected parts from empty to the whole cache, one round (C <= 4096) and several.
TEST(CudaResolveTest, SegmentedLruMatchesReference) {
  SPARSEKV_REQUIRE_GPU(gpu);
  uint64_t seed = 4000;
  for (int32_t k : {7, 64, 600, 2048}) {
    for (int32_t c : {k, 2 * k, 4096, 6000}) {
      if (c < k) continue;
      for (int32_t p : {0, c / 2, c * 8 / 10, c}) {
        const int32_t max_batch = k >= 2048 ? 24 : 48;
        RunResolveSchedule(*gpu, {max_batch, k, c, 1 + static_cast<int32_t>(seed % 3), 10, p},
                           seed++);
      }
    }
  }
}

// The clock: one round of its sweep (C <= 4096) and several, the 128K budget-sized cache, a map
// that the histories outgrow.
TEST(CudaResolveTest, ClockMatchesReference) {
  SPARSEKV_REQUIRE_GPU(gpu);
  uint64_t seed = 5000;
  for (int32_t k : {1, 7, 64, 600, 2048}) {
    for (int32_t c : {k, 2 * k, 4096, 6000}) {
      if (c < k) continue;
      const int32_t max_batch = k >= 2048 ? 24 : 48;
      RunResolveSchedule(
          *gpu, {max_batch, k, c, 1 + static_cast<int32_t>(seed % 3), 10, -1, ResolveShape::kClock},
          seed++);
    }
  }
  RunResolveSchedule(*gpu, {6, 2048, 54527, 1, 10, -1, ResolveShape::kClock}, seed++);
  RunResolveSchedule(*gpu, {16, 600, 1200, 2, 10, -1, ResolveShape::kShortMap}, seed++);
}

// Small clock shapes, sweeps of several rounds and a fused copy, quick enough for racecheck
// (scripts/gpu-check.sh runs it there).
TEST(CudaResolveTest, ClockSmallShapes) {
  SPARSEKV_REQUIRE_GPU(gpu);
  RunResolveSchedule(*gpu, {4, 7, 7, 1, 10, -1, ResolveShape::kClock}, 5100);
  RunResolveSchedule(*gpu, {5, 64, 128, 2, 10, -1, ResolveShape::kShortMap}, 5101);
  const auto [invalid, misses] =
      RunFusedCases(*gpu, {{{3, 300, 5000, 1, 10, -1, ResolveShape::kClock}, {48, 16, 2}}}, 5102);
  EXPECT_GT(misses, 100u);
  (void)invalid;
}

TEST(CudaResolveTest, ZeroWindow) {
  SPARSEKV_REQUIRE_GPU(gpu);
  RunResolveSchedule(*gpu, {16, 64, 128, 0, 10}, 2000);
}

TEST(CudaResolveTest, LargestShapes) {
  SPARSEKV_REQUIRE_GPU(gpu);
  RunResolveSchedule(*gpu, {4, 4096, 65536, 1, 6}, 3000);
  RunResolveSchedule(*gpu, {4, 3000, 3000, 2, 6}, 3001);
  RunResolveSchedule(*gpu, {4, 1500, 50000, 1, 6}, 3002);
}

// The fused miss copy against the reference: rows copied by their own CTA in launches of at least
// fused_copy_min_batch rows (the schedule's batch sizes fall on both sides of it), by the IndexCopy
// of the miss list otherwise; access widths 16 (656, 1152 B), 8 (stride pad 8), 4 and 1; sorted and
// unsorted, LRU and segmented LRU, invalid copies (unmapped and cut-off pool pages) included.
TEST(CudaResolveTest, FusedCopyMatchesReference) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const auto [invalid, misses] =
      RunFusedCases(*gpu,
                    {{{6, 2048, 4096, 1, 10}, {656, 0, 5}},
                     {{6, 2048, 2048, 1, 10}, {656, 8, 1}},
                     {{16, 600, 1200, 4, 10}, {20, 0, 15}},
                     {{24, 64, 4096, 1, 10}, {3, 2, 20}},
                     {{12, 600, 4096, 1, 10, 3276}, {1152, 0, 11}},
                     {{6, 2048, 6000, 1, 10, -1, ResolveShape::kClock}, {656, 0, 4}},
                     {{16, 600, 1200, 2, 10, -1, ResolveShape::kClock}, {20, 4, 9}}},
                    6000);
  EXPECT_GT(invalid, 10u);
  EXPECT_GT(misses, 10000u);
}

// Small fused shapes, quick enough for racecheck (scripts/gpu-check.sh runs it there).
TEST(CudaResolveTest, FusedCopySmallShapes) {
  SPARSEKV_REQUIRE_GPU(gpu);
  const auto [invalid, misses] = RunFusedCases(*gpu,
                                               {{{4, 7, 7, 1, 10}, {64, 0, 0}},
                                                {{5, 64, 128, 2, 10}, {656, 0, 4}},
                                                {{3, 300, 600, 1, 10, 300}, {48, 16, 2}}},
                                               6100);
  EXPECT_GT(misses, 100u);
  (void)invalid;  // few pages: an unmapped one is not certain to be hit
}

#if defined(SPARSEKV_WITH_CUDA)
// Resolve with a fused copy and the IndexCopy of its miss list, captured once into a CUDA graph
// and replayed with new inputs at batch sizes above and below fused_copy_min_batch (8), with the
// LRU order and with the clock: each replay matches the reference.
TEST(CudaResolveTest, CapturedFusedCopyReplaysAtEveryBatchSize) {
  SPARSEKV_REQUIRE_GPU(gpu);
  using Mode = ResolveHarness::Mode;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const auto clock : {ResolveShape::kNoClock, ResolveShape::kClock}) {
    for (const bool sort : {true, false}) {
      SCOPED_TRACE(sort ? "sorted" : "unsorted");
      const ResolveShape shape{12, 600, 1200, 1, 9, -1, clock};
      ResolveHarness h(*gpu, shape, (sort ? 7000 : 7001) + 2 * clock, {656, 0, 8});
      h.ReplayCapturedOn(stream);
      const ResolveHarness::Flags flags{sort, false, true};
      const std::pair<Mode, int32_t> steps[] = {
          {Mode::kMixed, 12}, {Mode::kMixed, 4},  {Mode::kFresh, 12},
          {Mode::kMixed, 8},  {Mode::kRepeat, 7}, {Mode::kMixed, 10},
          {Mode::kFresh, 3},  {Mode::kMixed, 0},  {Mode::kMixed, 12}};
      for (const auto& [mode, batch_size] : steps) {
        h.Step(mode, batch_size, flags);
        if (HasFatalFailure()) break;
      }
      EXPECT_GT(h.misses(), 1000u);
    }
  }
  cudaStreamDestroy(stream);
}
#endif

TEST(CudaResolveTest, UnsupportedFusedCopyIsInvalidArgument) {
  SPARSEKV_REQUIRE_GPU(gpu);
  Buffer rows(*gpu, 64);
  ResolveView view{};
  view.top_k = 8;
  view.topk_stride = 8;
  view.hot_slots = 16;
  view.window = 1;
  view.page_tokens = 64;
  view.copy_src = rows.get();
  view.copy_dst = rows.get();
  view.copy_src_stride = view.copy_dst_stride = 16;
  for (const int32_t row_bytes : {0, kMaxFusedCopyRowBytes + 1}) {
    view.copy_row_bytes = row_bytes;
    const Status status = gpu->Resolve(view, 1, nullptr);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << row_bytes;
  }
  view.copy_row_bytes = 16;
  view.copy_src_rows = -1;
  EXPECT_EQ(gpu->Resolve(view, 1, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST(CudaResolveTest, UnsupportedShapeIsInvalidArgument) {
  SPARSEKV_REQUIRE_GPU(gpu);
  ResolveView view{};
  view.top_k = 5000;
  view.topk_stride = 5000;
  view.hot_slots = 8192;
  view.window = 1;
  view.page_tokens = 64;
  const Status status = gpu->Resolve(view, 1, nullptr);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
}

// ---------------------------------------------------------------------------------------------
// Assemble

void RunAssembleCase(Backend& gpu, int32_t row_bytes, int32_t stride, uint64_t seed) {
  SCOPED_TRACE("row_bytes=" + std::to_string(row_bytes) + " stride=" + std::to_string(stride));
  constexpr int32_t kMaxBatch = 9;
  constexpr int32_t kTopK = 301;
  constexpr int64_t kHotRows = 2000;
  constexpr int32_t kBatchSize = 6;
  std::mt19937_64 rng(seed);
  const std::vector<std::byte> hot = RandomBytes(rng, kHotRows * stride);
  std::vector<int32_t> slots(kMaxBatch * kTopK);
  for (auto& s : slots) {
    switch (rng() % 10) {
      case 0:
        s = kNullSlot;
        break;
      case 1:
        s = rng() % 2 == 0 ? static_cast<int32_t>(kHotRows + rng() % 50) : -3;
        break;
      default:
        s = static_cast<int32_t>(rng() % kHotRows);
        break;
    }
  }
  const size_t out_bytes = static_cast<size_t>(kMaxBatch) * kTopK * stride;
  std::vector<std::byte> want = Poisoned<std::byte>(out_bytes);
  const int32_t batch_size = kBatchSize;
  reference::Assemble(
      {&batch_size, hot.data(), kHotRows, slots.data(), want.data(), kTopK, row_bytes, stride});

  Buffer g_hot(gpu, hot.size());
  Buffer g_slots(gpu, slots.size() * sizeof(int32_t));
  Buffer g_out(gpu, out_bytes);
  Buffer g_batch_size(gpu, sizeof(int32_t));
  g_hot.Upload(hot);
  g_slots.Upload(slots);
  g_out.Fill(kPoison);
  g_batch_size.Upload(std::vector<int32_t>{batch_size});
  ExpectOk(gpu.Assemble({g_batch_size.get<int32_t>(), g_hot.get(), kHotRows, g_slots.get<int32_t>(),
                         g_out.get(), kTopK, row_bytes, stride},
                        kMaxBatch, nullptr));
  ExpectOk(gpu.Synchronize(nullptr));
  EXPECT_TRUE(g_out.Download<std::byte>() == want);
}

TEST(CudaAssembleTest, MatchesReferenceWithNullAndOutOfRangeSlots) {
  SPARSEKV_REQUIRE_GPU(gpu);
  uint64_t seed = 4000;
  for (const auto& [row_bytes, stride] : std::vector<std::pair<int32_t, int32_t>>{
           {656, 656}, {656, 704}, {1152, 1152}, {1152, 1160}, {132, 132}, {3, 5}, {1, 1}}) {
    RunAssembleCase(*gpu, row_bytes, stride, seed++);
  }
}

}  // namespace
}  // namespace sparsekv
