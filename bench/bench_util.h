// Shared helpers of the CUDA microbenchmarks: error checks, timing, a data pattern that lets any
// copied row be verified without a reference copy, and a baseline gather kernel. Fatal errors,
// flags and the JSON writer are host-only, in bench_flags.h.
//
// Every failure is fatal: a benchmark prints what failed and exits non-zero, so a script that runs
// it never mistakes a broken run for a result.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "bench_flags.h"
#include "sparsekv/backend.h"
#include "sparsekv/status.h"

namespace sparsekv::bench {

// ---- Errors -------------------------------------------------------------------------------

inline void CheckCuda(cudaError_t err, const char* expr, const char* file, int line) {
  if (err != cudaSuccess) {
    Fail(std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " +
         cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}
#define BENCH_CUDA(expr) ::sparsekv::bench::CheckCuda((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: launch errors now, asynchronous errors at the next synchronisation.
#define BENCH_LAUNCHED() BENCH_CUDA(cudaGetLastError())

inline void CheckOk(const Status& status, const char* what) {
  if (!status.ok()) Fail(std::string(what) + ": " + status.ToString());
}
template <typename T>
T ValueOrDie(StatusOr<T> result, const char* what) {
  CheckOk(result.status(), what);
  return std::move(result).value();
}

// Wrong results found while benchmarking. They are printed and recorded, and the run goes on, so
// that one bad configuration does not cost the numbers of all the others; main() turns them into
// a non-zero exit status and the JSON lists them.
class Errors {
 public:
  void Add(const std::string& message) {
    if (messages_.size() < kKept) {
      std::fprintf(stderr, "WRONG RESULT: %s\n", message.c_str());
      messages_.push_back(message);
    }
    ++count_;
  }
  int count() const { return count_; }
  const std::vector<std::string>& messages() const { return messages_; }  // the first kKept

 private:
  static constexpr size_t kKept = 20;
  std::vector<std::string> messages_;
  int count_ = 0;
};

// ---- Data pattern ----------------------------------------------------------------------------

// The 8-byte word stored at byte offset `offset` of a pattern-filled buffer: distinct for every
// offset (an odd multiplier is a bijection mod 2^64) and never the 0xFF.. poison of destinations.
inline uint64_t PatternWord(uint64_t offset) { return (offset + 1) * 0x9E3779B97F4A7C15ull; }

// Writes the pattern over [base, base + bytes) with all hardware threads; this also touches every
// page once, so the memory is resident before anything is timed. REQUIRES: bytes % 8 == 0.
inline void FillPattern(std::byte* base, size_t bytes) {
  const size_t words = bytes / 8;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      auto* w = reinterpret_cast<uint64_t*>(base);
      const size_t begin = words * t / threads;
      const size_t end = words * (t + 1) / threads;
      for (size_t i = begin; i < end; ++i) w[i] = PatternWord(i * 8);
    });
  }
  for (std::thread& t : pool) t.join();
}

// True if `row` holds the pattern of the source bytes at `src_offset`. REQUIRES: 8-B multiples.
inline bool RowMatchesPattern(const std::byte* row, uint64_t src_offset, int row_bytes) {
  const auto* w = reinterpret_cast<const uint64_t*>(row);
  for (int j = 0; j < row_bytes / 8; ++j) {
    if (w[j] != PatternWord(src_offset + 8ull * j)) return false;
  }
  return true;
}

// ---- Kernels ---------------------------------------------------------------------------------

// The naive baseline gather: one warp per row, 16-byte loads and stores, indices in the order
// given. dst row dst_index[i] = src row src_index[i] for i < n. REQUIRES: row_bytes, both
// strides and both bases 16-byte aligned.
__global__ void WarpPerRowGather(const std::byte* __restrict__ src, int64_t src_stride,
                                 std::byte* __restrict__ dst, int64_t dst_stride,
                                 const int32_t* __restrict__ src_index,
                                 const int32_t* __restrict__ dst_index, int32_t n,
                                 int32_t row_bytes) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;
  const auto* s = reinterpret_cast<const uint4*>(src + src_index[row] * src_stride);
  auto* d = reinterpret_cast<uint4*>(dst + dst_index[row] * dst_stride);
  for (int v = lane; v < row_bytes / 16; v += 32) d[v] = s[v];
}

inline void LaunchWarpPerRowGather(const std::byte* src, int64_t src_stride, std::byte* dst,
                                   int64_t dst_stride, const int32_t* src_index,
                                   const int32_t* dst_index, int32_t n, int32_t row_bytes,
                                   cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = (static_cast<int64_t>(n) * 32 + kThreads - 1) / kThreads;
  if (blocks == 0) return;
  WarpPerRowGather<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      src, src_stride, dst, dst_stride, src_index, dst_index, n, row_bytes);
  BENCH_LAUNCHED();
}

// Busy-waits on the device for `ns` nanoseconds. Enqueued before a timed region, it lets the host
// queue the whole region before the device reaches the start event, so that microsecond-scale
// timings do not include host launch latency.
__global__ void SpinKernel(uint64_t ns) {
  uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (uint64_t now = start; now - start < ns;) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  }
}

// ---- Copies ---------------------------------------------------------------------------------

// A blocking copy ordered on `stream`. The benchmarks' streams are non-blocking, so a plain
// cudaMemcpy on the legacy default stream would not be ordered against their kernels.
inline void CopySync(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
}

// ---- Index sets -----------------------------------------------------------------------------

// `count` random sets of n (host row -> destination row) pairs, set after set, on the host and on
// the device: distinct host rows below span_rows, destinations a permutation of [0, n); sorted_*
// hold each set ordered by host row (the order of Resolve's sorted miss lists).
struct IndexSets {
  int count = 0;
  int32_t n = 0;
  std::vector<int32_t> src, dst, sorted_src, sorted_dst;  // [count, n] each, on the host
  int32_t* d_src = nullptr;                               // device copies, same shapes
  int32_t* d_dst = nullptr;
  int32_t* d_sorted_src = nullptr;
  int32_t* d_sorted_dst = nullptr;
};

inline IndexSets MakeIndexSets(Backend& backend, cudaStream_t stream, std::mt19937_64& rng,
                               int count, int32_t n, int64_t span_rows) {
  IndexSets s;
  s.count = count;
  s.n = n;
  const size_t total = size_t(count) * n;
  for (auto* v : {&s.src, &s.dst, &s.sorted_src, &s.sorted_dst}) v->resize(total);
  std::uniform_int_distribution<int64_t> pick(0, span_rows - 1);
  std::vector<int32_t> order(n);
  for (int set = 0; set < count; ++set) {
    int32_t* src = s.src.data() + size_t(set) * n;
    int32_t* dst = s.dst.data() + size_t(set) * n;
    std::unordered_set<int64_t> used;
    used.reserve(2 * size_t(n));
    for (int32_t i = 0; i < n; ++i) {
      int64_t r;
      do r = pick(rng);
      while (!used.insert(r).second);
      src[i] = static_cast<int32_t>(r);
    }
    std::iota(dst, dst + n, 0);
    std::shuffle(dst, dst + n, rng);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return src[a] < src[b]; });
    for (int32_t i = 0; i < n; ++i) {
      s.sorted_src[size_t(set) * n + i] = src[order[i]];
      s.sorted_dst[size_t(set) * n + i] = dst[order[i]];
    }
  }
  const size_t bytes = total * sizeof(int32_t);
  auto upload = [&](const std::vector<int32_t>& h, int32_t** d) {
    *d = static_cast<int32_t*>(ValueOrDie(backend.AllocateDevice(bytes), "index set"));
    CopySync(*d, h.data(), bytes, stream);
  };
  upload(s.src, &s.d_src);
  upload(s.dst, &s.d_dst);
  upload(s.sorted_src, &s.d_sorted_src);
  upload(s.sorted_dst, &s.d_sorted_dst);
  return s;
}

inline void FreeIndexSets(Backend& backend, IndexSets& s) {
  for (int32_t* p : {s.d_src, s.d_dst, s.d_sorted_src, s.d_sorted_dst}) backend.FreeDevice(p);
  s = IndexSets{};
}

// The IndexCopy of index set `set` of `sets` (in the order sorted by source row, or as drawn):
// rows of row_bytes packed at row_bytes, from `src` (span_rows rows) into `dst` (sets.n rows).
inline IndexCopyView SetGather(const IndexSets& sets, bool sorted, int set, const std::byte* src,
                               int64_t span_rows, std::byte* dst, int32_t row_bytes,
                               const int32_t* d_count, unsigned long long* d_invalid) {
  const size_t offset = size_t(set) * sets.n;
  IndexCopyView v{};
  v.src = src;
  v.dst = dst;
  v.src_index = (sorted ? sets.d_sorted_src : sets.d_src) + offset;
  v.dst_index = (sorted ? sets.d_sorted_dst : sets.d_dst) + offset;
  v.count = d_count;
  v.capacity = sets.n;
  v.row_bytes = row_bytes;
  v.src_stride = v.dst_stride = row_bytes;
  v.src_rows = span_rows;
  v.dst_rows = sets.n;
  v.invalid = d_invalid;
  return v;
}

// ---- Checking a gather ------------------------------------------------------------------------

// Where a gather under check writes, on the device, and what the check needs beside it.
struct GatherOutput {
  std::byte* dst;                 // device rows, packed at row_bytes
  size_t bytes;                   // of dst that the check poisons and reads back
  unsigned long long* d_invalid;  // IndexCopy's invalid counter: must stay 0 (reset if not)
  std::vector<std::byte>* host;   // at least `bytes`, to read dst back into
};

// Poisons out.dst, runs `launch` (which enqueues the gather on `stream`), reads the result back
// and checks that destination row dst_index[i] holds the pattern of source row src_index[i] for
// i < n. Returns "" when everything is right, else what is wrong.
inline std::string CheckGather(cudaStream_t stream, const GatherOutput& out,
                               const int32_t* src_index, const int32_t* dst_index, int32_t n,
                               int32_t row_bytes, const std::function<void()>& launch) {
  BENCH_CUDA(cudaMemsetAsync(out.dst, 0xFF, out.bytes, stream));
  launch();
  BENCH_CUDA(cudaMemcpyAsync(out.host->data(), out.dst, out.bytes, cudaMemcpyDeviceToHost, stream));
  unsigned long long invalid = 0;
  BENCH_CUDA(
      cudaMemcpyAsync(&invalid, out.d_invalid, sizeof(invalid), cudaMemcpyDeviceToHost, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  if (invalid != 0) {
    BENCH_CUDA(cudaMemsetAsync(out.d_invalid, 0, sizeof(invalid), stream));
    return "IndexCopy counted " + std::to_string(invalid) + " invalid entries";
  }
  for (int32_t i = 0; i < n; ++i) {
    const std::byte* row = out.host->data() + size_t(dst_index[i]) * row_bytes;
    if (!RowMatchesPattern(row, uint64_t(src_index[i]) * row_bytes, row_bytes)) {
      return "entry " + std::to_string(i) + " (host row " + std::to_string(src_index[i]) +
             " -> row " + std::to_string(dst_index[i]) + ") was not copied correctly";
    }
  }
  return "";
}

// ---- Timing ----------------------------------------------------------------------------------

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
  int reps = 0;
};

// Times `body(rep)` with CUDA events on `stream`: `warmup` untimed runs, then `reps` timed ones.
// Before each run, `setup(rep)` enqueues untimed work (state restore, input rotation) after a short
// device-side delay; `check(rep)` runs on the host after each run has completed. rep counts from 0
// over warm-up and timed runs together.
template <typename Setup, typename Body, typename Check>
Timing TimeOnStream(cudaStream_t stream, int warmup, int reps, Setup&& setup, Body&& body,
                    Check&& check) {
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int rep = 0; rep < warmup + reps; ++rep) {
    SpinKernel<<<1, 1, 0, stream>>>(100'000);
    BENCH_LAUNCHED();
    setup(rep);
    BENCH_CUDA(cudaEventRecord(start, stream));
    body(rep);
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    check(rep);
    float elapsed = 0;
    BENCH_CUDA(cudaEventElapsedTime(&elapsed, start, stop));
    if (rep >= warmup) ms.push_back(elapsed);
  }
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.reps = reps;
  if (!ms.empty()) {
    const size_t n = ms.size();
    t.median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    t.min_ms = ms.front();
    t.max_ms = ms.back();
  }
  return t;
}

template <typename Body>
Timing TimeOnStream(cudaStream_t stream, int warmup, int reps, Body&& body) {
  return TimeOnStream(
      stream, warmup, reps, [](int) {}, body, [](int) {});
}

inline Json ErrorsJson(const Errors& errors) {
  Json messages = Json::Array();
  for (const std::string& m : errors.messages()) messages.Push(m);
  return Json::Object().Add("count", errors.count()).Add("first", messages);
}

inline Json TimingJson(const Timing& t) {
  return Json::Object()
      .Add("median_ms", t.median_ms)
      .Add("min_ms", t.min_ms)
      .Add("max_ms", t.max_ms)
      .Add("reps", t.reps);
}

// Bandwidth of one cudaMemcpyAsync of `bytes` (GB/s = 1e9 B/s), counting the bytes once.
inline double MemcpyGBps(void* dst, const void* src, size_t bytes, cudaStream_t stream, int warmup,
                         int reps, Timing* timing = nullptr) {
  const Timing t = TimeOnStream(stream, warmup, reps, [&](int) {
    BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  });
  if (timing != nullptr) *timing = t;
  return bytes / (t.median_ms * 1e6);
}

inline std::string DeviceName(int device) {
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

}  // namespace sparsekv::bench
