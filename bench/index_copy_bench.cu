// index_copy_bench: token-row gathers from a large pinned host pool into HBM, against the PCIe
// ceiling and the obvious alternatives, in one run (docs/workload-shapes.md has the reference
// figures and the method; docs/index-copy.md the results).
//
// Measured, each with CUDA events, warm-up and the median of --reps runs:
//   ceilings   pinned cudaMemcpy host->device and device->host (2 GiB), device->device copy
//              (bytes read + written);
//   gathers    --rows random rows of each --row_bytes size from a pool of --pool_gib GiB
//              allocated by the CUDA backend's AllocateHost (row stride = row bytes), into a device
//              buffer of --rows rows, rotating over --index_sets different random index sets:
//                sorted     sparsekv IndexCopy, entries sorted by host row;
//                unsorted   sparsekv IndexCopy, the same entries in random order;
//                naive      one warp per row, 16-byte loads, unsorted (bench_util.h);
//                memcpy     one cudaMemcpyAsync per row, --per_row_copies rows;
//                batch      one cudaMemcpyBatchAsync of --per_row_copies rows (CUDA >= 13);
//   span sweep sorted / unsorted / naive 656-B gathers with the rows drawn from the first
//              --span_gib GiB of the pool only (translation reach vs. span).
// Bandwidth counts useful bytes only: row_bytes * rows / time; "ratio" divides it by the pinned
// host->device memcpy bandwidth of the same run. Every variant's output is checked row by row
// against the pool's pattern before it is timed.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sparsekv/backend.h"

namespace sparsekv::bench {
namespace {

constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kMinPoolBytes = 4 * kGiB;

struct Options {
  size_t pool_bytes;
  int32_t rows;
  std::vector<int64_t> row_bytes;
  std::vector<double> span_gib;
  int32_t sweep_row_bytes;
  int index_sets;
  int per_row_copies;
  int warmup;
  int reps;
  uint64_t seed;
  int device;
  std::string json;
};

class Bench {
 public:
  Bench(const Options& o, Backend* backend, cudaStream_t stream)
      : o_(o), backend_(backend), stream_(stream), rng_(o.seed) {}

  // Returns the number of wrong results found.
  int Run();

 private:
  struct Variant {
    std::string name;
    int32_t row_bytes;
    int64_t span_bytes;
    int32_t rows;
    Timing timing;
    double gbps;
    bool verified;  // the output matched the pool before timing
  };

  void Setup();
  void MeasureCeilings();
  IndexSets MakeIndexSets(int64_t span_rows, int count) {
    return bench::MakeIndexSets(*backend_, stream_, rng_, count, o_.rows, span_rows);
  }
  void FreeIndexSets(IndexSets& sets) { bench::FreeIndexSets(*backend_, sets); }
  // Times sorted / unsorted / naive gathers of row_bytes-byte rows over the first span_bytes of
  // the pool and appends them to `out`.
  void MeasureGathers(int32_t row_bytes, int64_t span_bytes, std::vector<Variant>& out);
  // Times one cudaMemcpyAsync per row and one cudaMemcpyBatchAsync over the full pool.
  void MeasureCopyEngine(int32_t row_bytes, std::vector<Variant>& out);
  // Poisons the destination, runs `launch` once and checks the first n entries of set 0; false
  // (and an entry in errors_) if anything is wrong.
  bool Verify(const std::string& what, int32_t row_bytes, const int32_t* src, const int32_t* dst,
              int32_t n, const std::function<void()>& launch);
  void Report();

  const Options o_;
  Backend* backend_;
  cudaStream_t stream_;
  std::mt19937_64 rng_;

  std::byte* pool_ = nullptr;   // [pool_bytes_] host, pattern-filled
  size_t pool_bytes_ = 0;       // o_.pool_bytes, or less if that much could not be pinned
  std::byte* dst_ = nullptr;    // [rows, max row_bytes] device
  int32_t* d_count_ = nullptr;  // device scalar for IndexCopyView::count
  unsigned long long* d_invalid_ = nullptr;
  std::vector<std::byte> host_dst_;

  double h2d_gbps_ = 0, d2h_gbps_ = 0, d2d_gbps_ = 0;
  Timing h2d_t_, d2h_t_, d2d_t_;
  std::vector<Variant> main_, sweep_;
  Errors errors_;
};

void Bench::Setup() {
  // The pool size is what the run is about; if the machine cannot pin that much, step down rather
  // than lose the whole run, and say so loudly (the JSON records both sizes).
  using Clock = std::chrono::steady_clock;
  for (size_t bytes = o_.pool_bytes; pool_ == nullptr; bytes /= 2) {
    if (bytes < kMinPoolBytes) Fail("could not allocate a pinned pool of any useful size");
    std::printf("allocating %.1f GiB of pinned host memory through the backend...\n",
                double(bytes) / kGiB);
    std::fflush(stdout);
    const auto t0 = Clock::now();
    StatusOr<void*> pool = backend_->AllocateHost(bytes);
    if (!pool.ok()) {
      std::printf("WARNING: AllocateHost(%zu) failed: %s\n", bytes,
                  pool.status().ToString().c_str());
      continue;
    }
    pool_ = static_cast<std::byte*>(*pool);
    pool_bytes_ = bytes;
    const auto t1 = Clock::now();
    FillPattern(pool_, pool_bytes_);
    std::printf("pinned in %.1f s, filled in %.1f s\n",
                std::chrono::duration<double>(t1 - t0).count(),
                std::chrono::duration<double>(Clock::now() - t1).count());
  }
  if (pool_bytes_ != o_.pool_bytes) {
    std::printf("WARNING: pool reduced to %.1f GiB: results are NOT for the requested span\n",
                double(pool_bytes_) / kGiB);
  }
  const int64_t max_row = *std::max_element(o_.row_bytes.begin(), o_.row_bytes.end());
  const size_t dst_bytes = size_t(o_.rows) * std::max<int64_t>(max_row, o_.sweep_row_bytes);
  dst_ = static_cast<std::byte*>(ValueOrDie(backend_->AllocateDevice(dst_bytes), "dst"));
  host_dst_.resize(dst_bytes);
  d_count_ = static_cast<int32_t*>(ValueOrDie(backend_->AllocateDevice(4), "count"));
  d_invalid_ = static_cast<unsigned long long*>(
      ValueOrDie(backend_->AllocateDevice(sizeof(unsigned long long)), "invalid"));
  BENCH_CUDA(cudaMemsetAsync(d_invalid_, 0, sizeof(unsigned long long), stream_));
}

void Bench::MeasureCeilings() {
  const size_t bytes = std::min<size_t>(2 * kGiB, pool_bytes_);
  void* a = ValueOrDie(backend_->AllocateDevice(bytes), "ceiling buffer a");
  void* b = ValueOrDie(backend_->AllocateDevice(bytes), "ceiling buffer b");
  BENCH_CUDA(cudaMemsetAsync(b, 0x5A, bytes, stream_));
  h2d_gbps_ = MemcpyGBps(a, pool_, bytes, stream_, o_.warmup, o_.reps, &h2d_t_);
  // The device->host copy writes into the pool: restore the pattern afterwards.
  d2h_gbps_ = MemcpyGBps(pool_, b, bytes, stream_, o_.warmup, o_.reps, &d2h_t_);
  BENCH_CUDA(cudaStreamSynchronize(stream_));
  FillPattern(pool_, bytes);
  d2d_gbps_ = 2 * MemcpyGBps(b, a, bytes, stream_, o_.warmup, o_.reps, &d2d_t_);
  backend_->FreeDevice(a);
  backend_->FreeDevice(b);
  std::printf("ceilings: H2D %.1f GB/s, D2H %.1f GB/s, D2D %.0f GB/s (read + write)\n", h2d_gbps_,
              d2h_gbps_, d2d_gbps_);
}

bool Bench::Verify(const std::string& what, int32_t row_bytes, const int32_t* src,
                   const int32_t* dst, int32_t n, const std::function<void()>& launch) {
  const GatherOutput out{dst_, size_t(o_.rows) * row_bytes, d_invalid_, &host_dst_};
  const std::string wrong = CheckGather(stream_, out, src, dst, n, row_bytes, launch);
  if (wrong.empty()) return true;
  errors_.Add(what + " " + std::to_string(row_bytes) + " B: " + wrong);
  return false;
}

void Bench::MeasureGathers(int32_t row_bytes, int64_t span_bytes, std::vector<Variant>& out) {
  if (row_bytes % 16 != 0) Fail("row bytes must be a multiple of 16: " + std::to_string(row_bytes));
  const int64_t span_rows = span_bytes / row_bytes;
  if (span_rows < 2 * int64_t(o_.rows)) Fail("span too small for --rows distinct rows");
  if (span_rows > INT32_MAX)
    Fail("span has more than 2^31 rows: use larger rows or a smaller pool");
  IndexSets sets = MakeIndexSets(span_rows, o_.index_sets);
  const int32_t n = o_.rows;
  CopySync(d_count_, &n, sizeof(n), stream_);

  auto index_copy = [&](bool sorted, int set) {
    CheckOk(backend_->IndexCopy(SetGather(sets, sorted, set, pool_, span_rows, dst_, row_bytes,
                                          d_count_, d_invalid_),
                                stream_),
            "IndexCopy");
  };
  auto naive = [&](int set) {
    LaunchWarpPerRowGather(pool_, row_bytes, dst_, row_bytes, sets.d_src + size_t(set) * n,
                           sets.d_dst + size_t(set) * n, n, row_bytes, stream_);
  };
  struct Case {
    const char* name;
    std::function<void(int)> launch;
    const std::vector<int32_t>* src;
    const std::vector<int32_t>* dst;
  };
  const Case cases[] = {
      {"sorted", [&](int s) { index_copy(true, s); }, &sets.sorted_src, &sets.sorted_dst},
      {"unsorted", [&](int s) { index_copy(false, s); }, &sets.src, &sets.dst},
      {"naive", naive, &sets.src, &sets.dst},
  };
  for (const Case& c : cases) {
    const bool ok =
        Verify(c.name, row_bytes, c.src->data(), c.dst->data(), n, [&] { c.launch(0); });
    const Timing t =
        TimeOnStream(stream_, o_.warmup, o_.reps, [&](int rep) { c.launch(rep % sets.count); });
    out.push_back(
        {c.name, row_bytes, span_bytes, n, t, double(row_bytes) * n / (t.median_ms * 1e6), ok});
  }
  FreeIndexSets(sets);
}

void Bench::MeasureCopyEngine(int32_t row_bytes, std::vector<Variant>& out) {
  const int64_t span_rows = std::min<int64_t>(int64_t(pool_bytes_) / row_bytes, INT32_MAX);
  const int32_t n = std::min(o_.per_row_copies, o_.rows);
  // Distinct random host rows, distinct destination rows: the first n pairs of one unsorted set.
  IndexSets sets = MakeIndexSets(span_rows, 1);
  std::vector<void*> dsts(n);
  std::vector<const void*> srcs(n);
  std::vector<size_t> sizes(n, row_bytes);
  for (int32_t i = 0; i < n; ++i) {
    srcs[i] = pool_ + int64_t(sets.src[i]) * row_bytes;
    dsts[i] = dst_ + int64_t(sets.dst[i]) * row_bytes;
  }
  auto per_row = [&] {
    for (int32_t i = 0; i < n; ++i) {
      BENCH_CUDA(cudaMemcpyAsync(dsts[i], srcs[i], row_bytes, cudaMemcpyHostToDevice, stream_));
    }
  };
  auto record = [&](const char* name, auto&& launch) {
    const bool ok = Verify(name, row_bytes, sets.src.data(), sets.dst.data(), n, launch);
    const Timing t = TimeOnStream(stream_, o_.warmup, o_.reps, [&](int) { launch(); });
    out.push_back({name, row_bytes, int64_t(pool_bytes_), n, t,
                   double(row_bytes) * n / (t.median_ms * 1e6), ok});
  };
  record("memcpy_per_row", per_row);
#if CUDART_VERSION >= 13000
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attr_index = 0;
  auto batch = [&] {
    return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), n, &attr, &attr_index, 1,
                                stream_);
  };
  // An optional baseline: if the driver refuses it, report that instead of failing the run.
  if (const cudaError_t err = batch(); err != cudaSuccess) {
    (void)cudaGetLastError();
    std::printf("cudaMemcpyBatchAsync: skipped, it returned %s\n", cudaGetErrorName(err));
  } else {
    BENCH_CUDA(cudaStreamSynchronize(stream_));
    record("memcpy_batch", [&] { BENCH_CUDA(batch()); });
  }
#else
  std::printf("cudaMemcpyBatchAsync: skipped (needs CUDA >= 13.0 for this signature)\n");
#endif
  FreeIndexSets(sets);
}

int Bench::Run() {
  Setup();
  MeasureCeilings();
  for (const int64_t rb : o_.row_bytes) {
    MeasureGathers(static_cast<int32_t>(rb), int64_t(pool_bytes_), main_);
    MeasureCopyEngine(static_cast<int32_t>(rb), main_);
    std::printf("row %lld B: done\n", static_cast<long long>(rb));
    std::fflush(stdout);
  }
  for (const double gib : o_.span_gib) {
    const int64_t span = int64_t(gib * kGiB);
    if (span < int64_t(pool_bytes_)) MeasureGathers(o_.sweep_row_bytes, span, sweep_);
  }
  // The full-pool point of the sweep was measured in the main table.
  for (const Variant& v : main_) {
    if (v.row_bytes == o_.sweep_row_bytes && v.span_bytes == int64_t(pool_bytes_) &&
        (v.name == "sorted" || v.name == "unsorted" || v.name == "naive")) {
      sweep_.push_back(v);
    }
  }
  Report();
  backend_->FreeDevice(d_invalid_);
  backend_->FreeDevice(d_count_);
  backend_->FreeDevice(dst_);
  backend_->FreeHost(pool_);
  return errors_.count();
}

void Bench::Report() {
  auto variants_json = [&](const std::vector<Variant>& vs) {
    Json a = Json::Array();
    for (const Variant& v : vs) {
      a.Push(Json::Object()
                 .Add("variant", v.name)
                 .Add("row_bytes", v.row_bytes)
                 .Add("span_bytes", v.span_bytes)
                 .Add("rows", v.rows)
                 .Add("timing", TimingJson(v.timing))
                 .Add("useful_gbps", v.gbps)
                 .Add("ratio_to_h2d", v.gbps / h2d_gbps_)
                 .Add("verified", v.verified));
    }
    return a;
  };
  auto find = [&](const char* name, int32_t row_bytes) {
    for (const Variant& v : main_) {
      if (v.name == name && v.row_bytes == row_bytes && v.verified) return v.gbps / h2d_gbps_;
    }
    return std::nan("");
  };
  Json summary = Json::Object()
                     .Add("index_copy_ratio_656", find("sorted", 656))
                     .Add("index_copy_ratio_1152", find("sorted", 1152))
                     .Add("index_copy_h2d_gbps", h2d_gbps_)
                     .Add("index_copy_pool_gib", double(pool_bytes_) / kGiB)
                     .Add("index_copy_wrong_results", errors_.count());
  Json root = Json::Object();
  root.Add("benchmark", "index_copy_bench")
      .Add("device", backend_->name())
      .Add("config", Json::Object()
                         .Add("pool_bytes_requested", int64_t(o_.pool_bytes))
                         .Add("pool_bytes", int64_t(pool_bytes_))
                         .Add("rows", o_.rows)
                         .Add("index_sets", o_.index_sets)
                         .Add("warmup", o_.warmup)
                         .Add("reps", o_.reps)
                         .Add("seed", int64_t(o_.seed))
                         .Add("cudart_version", CUDART_VERSION))
      .Add("ceilings", Json::Object()
                           .Add("h2d_gbps", h2d_gbps_)
                           .Add("d2h_gbps", d2h_gbps_)
                           .Add("d2d_gbps_read_plus_write", d2d_gbps_)
                           .Add("h2d", TimingJson(h2d_t_))
                           .Add("d2h", TimingJson(d2h_t_))
                           .Add("d2d", TimingJson(d2d_t_)))
      .Add("gathers", variants_json(main_))
      .Add("span_sweep", variants_json(sweep_))
      .Add("wrong_results", ErrorsJson(errors_))
      .Add("summary", summary);
  if (!o_.json.empty()) WriteFile(o_.json, root.str() + "\n");

  std::printf(
      "\nIndexCopy host->HBM on %s; pool %.0f GiB pinned; useful GB/s (ratio to H2D %.1f)\n",
      backend_->name().c_str(), double(pool_bytes_) / kGiB, h2d_gbps_);
  std::printf("%-15s %6s %9s %8s %10s %8s %7s %s\n", "variant", "row_B", "span_GiB", "rows",
              "median_us", "GB/s", "ratio", "check");
  auto print = [&](const std::vector<Variant>& vs) {
    for (const Variant& v : vs) {
      std::printf("%-15s %6d %9.1f %8d %10.1f %8.2f %7.3f %s\n", v.name.c_str(), v.row_bytes,
                  double(v.span_bytes) / kGiB, v.rows, v.timing.median_ms * 1e3, v.gbps,
                  v.gbps / h2d_gbps_, v.verified ? "ok" : "WRONG");
    }
  };
  print(main_);
  std::printf("-- span sweep --\n");
  print(sweep_);
  std::printf("ceilings: H2D %.1f  D2H %.1f  D2D %.0f GB/s\n", h2d_gbps_, d2h_gbps_, d2d_gbps_);
  if (errors_.count() > 0) std::printf("WRONG RESULTS: %d (see above)\n", errors_.count());
}

}  // namespace
}  // namespace sparsekv::bench

int main(int argc, char** argv) {
  using namespace sparsekv::bench;
  const Flags flags(argc, argv,
                    {{"pool_gib", "32"},
                     {"rows", "131072"},
                     {"row_bytes", "656,704,1152"},
                     {"span_gib", "2,8"},
                     {"sweep_row_bytes", "656"},
                     {"index_sets", "4"},
                     {"per_row_copies", "2048"},
                     {"warmup", "3"},
                     {"reps", "20"},
                     {"seed", "1"},
                     {"device", "0"},
                     {"host_memory", "auto"},
                     {"json", ""}});
  Options o;
  o.pool_bytes = size_t(flags.Double("pool_gib") * kGiB) & ~size_t{4095};
  o.rows = static_cast<int32_t>(flags.Int("rows"));
  o.row_bytes = flags.IntList("row_bytes");
  o.span_gib = flags.DoubleList("span_gib");
  o.sweep_row_bytes = static_cast<int32_t>(flags.Int("sweep_row_bytes"));
  o.index_sets = static_cast<int>(flags.Int("index_sets"));
  o.per_row_copies = static_cast<int>(flags.Int("per_row_copies"));
  o.warmup = static_cast<int>(flags.Int("warmup"));
  o.reps = static_cast<int>(flags.Int("reps"));
  o.seed = static_cast<uint64_t>(flags.Int("seed"));
  o.device = static_cast<int>(flags.Int("device"));
  o.json = flags.Str("json");
  if (o.rows <= 0 || o.reps <= 0 || o.warmup < 0 || o.index_sets <= 0 || o.row_bytes.empty()) {
    Fail("--rows, --reps, --index_sets must be positive, --warmup >= 0, --row_bytes non-empty");
  }

  // How the pool is backed: auto | hugetlb | thp | hostalloc | vmm (see sparsekv::HostMemoryKind).
  const std::string host_memory = flags.Str("host_memory");
  const std::map<std::string, sparsekv::HostMemoryKind> kinds = {
      {"auto", sparsekv::HostMemoryKind::kAuto},
      {"hugetlb", sparsekv::HostMemoryKind::kHugeTlb},
      {"thp", sparsekv::HostMemoryKind::kTransparentHugePages},
      {"hostalloc", sparsekv::HostMemoryKind::kCudaHostAlloc},
      {"vmm", sparsekv::HostMemoryKind::kCudaVmm}};
  if (kinds.count(host_memory) == 0) Fail("--host_memory: auto, hugetlb, thp, hostalloc or vmm");
  std::printf("host memory: %s\n", host_memory.c_str());
  auto backend =
      ValueOrDie(sparsekv::CreateCudaBackend(o.device, kinds.at(host_memory)), "CreateCudaBackend");
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int wrong = Bench(o, backend.get(), stream).Run();
  BENCH_CUDA(cudaStreamDestroy(stream));
  return wrong == 0 ? 0 : 1;
}
