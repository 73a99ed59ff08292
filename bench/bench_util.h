// Shared helpers of the CUDA microbenchmarks: error checks, flags, timing, a data pattern that
// lets any copied row be verified without a reference copy, a baseline gather kernel, and a tiny
// JSON writer (the GPU machine has no JSON library).
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
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sparsekv/status.h"

namespace sparsekv::bench {

// ---- Errors -------------------------------------------------------------------------------

[[noreturn]] inline void Fail(const std::string& message) {
  std::fprintf(stderr, "FATAL: %s\n", message.c_str());
  std::exit(1);
}

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

// ---- Flags: --name=value or --name value ----------------------------------------------------

class Flags {
 public:
  // `defaults` names every accepted flag and its default; anything else is an error.
  Flags(int argc, char** argv, std::map<std::string, std::string> defaults)
      : values_(std::move(defaults)) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        std::printf("flags (default):\n");
        for (const auto& [k, v] : values_) std::printf("  --%s (%s)\n", k.c_str(), v.c_str());
        std::exit(0);
      }
      if (arg.rfind("--", 0) != 0) Fail("unexpected argument '" + arg + "'");
      std::string name = arg.substr(2);
      std::string value;
      if (const size_t eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        Fail("flag --" + name + " needs a value");
      }
      if (values_.count(name) == 0) Fail("unknown flag --" + name + " (try --help)");
      values_[name] = value;
    }
  }

  const std::string& Str(const std::string& name) const { return values_.at(name); }
  int64_t Int(const std::string& name) const { return ParseInt(name, Str(name)); }
  double Double(const std::string& name) const { return ParseDouble(name, Str(name)); }
  std::vector<int64_t> IntList(const std::string& name) const {
    std::vector<int64_t> out;
    for (const std::string& item : Split(Str(name))) out.push_back(ParseInt(name, item));
    return out;
  }
  std::vector<double> DoubleList(const std::string& name) const {
    std::vector<double> out;
    for (const std::string& item : Split(Str(name))) out.push_back(ParseDouble(name, item));
    return out;
  }

 private:
  static std::vector<std::string> Split(const std::string& list) {
    std::vector<std::string> out;
    std::stringstream in(list);
    for (std::string item; std::getline(in, item, ',');) {
      if (!item.empty()) out.push_back(item);
    }
    return out;
  }
  static int64_t ParseInt(const std::string& name, const std::string& text) {
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0') Fail("--" + name + ": '" + text + "' is not an integer");
    return v;
  }
  static double ParseDouble(const std::string& name, const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0') Fail("--" + name + ": '" + text + "' is not a number");
    return v;
  }

  std::map<std::string, std::string> values_;
};

// ---- JSON (write-only) ------------------------------------------------------------------------

// Builds one JSON object or array as text. Non-finite numbers become null.
class Json {
 public:
  static Json Object() { return Json('{', '}'); }
  static Json Array() { return Json('[', ']'); }

  Json& Add(const std::string& key, double v) { return Raw(key, Number(v)); }
  Json& Add(const std::string& key, int64_t v) { return Raw(key, std::to_string(v)); }
  Json& Add(const std::string& key, int v) { return Add(key, static_cast<int64_t>(v)); }
  Json& Add(const std::string& key, bool v) { return Raw(key, v ? "true" : "false"); }
  Json& Add(const std::string& key, const std::string& v) { return Raw(key, Quote(v)); }
  Json& Add(const std::string& key, const char* v) { return Add(key, std::string(v)); }
  Json& Add(const std::string& key, const Json& v) { return Raw(key, v.str()); }
  Json& Push(const Json& v) { return Raw("", v.str()); }
  Json& Push(const std::string& v) { return Raw("", Quote(v)); }

  std::string str() const { return text_ + close_; }

  static std::string Number(double v) {
    if (!std::isfinite(v)) return "null";
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    return buf;
  }

 private:
  Json(char open, char close) : text_(1, open), close_(1, close) {}
  Json& Raw(const std::string& key, const std::string& value) {
    if (!first_) text_ += ",\n";
    first_ = false;
    if (close_ == "}") text_ += Quote(key) + ": ";
    text_ += value;
    return *this;
  }
  static std::string Quote(const std::string& s) {
    std::string out = "\"";
    for (const char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out += buf;
      } else {
        out += c;
      }
    }
    return out + "\"";
  }

  std::string text_;
  std::string close_;
  bool first_ = true;
};

inline void WriteFile(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) Fail("cannot open " + path + " for writing");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) Fail("cannot write " + path);
}

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
  return TimeOnStream(stream, warmup, reps, [](int) {}, body, [](int) {});
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
