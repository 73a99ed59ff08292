// copy_overlap_bench: how one layer's miss copy uses and shares the GPU (docs/overlap.md).
//
// The copy is IndexCopy of 656-B rows (--row_bytes) from a pinned region of --span_gib GiB (one
// layer's share of the pool in the standard scenario: 100 GB over 61 layers) into HBM, with
// --misses rows per request (20% of k = 2048), unsorted unless a table says otherwise. Two tables,
// each with its ceiling from the same run:
//   small    the copy of batch B's misses (B x --misses rows) with the default grid, sorted and
//            unsorted, against one cudaMemcpyAsync of the same bytes from contiguous pinned memory:
//            what PCIe latency and bandwidth allow a copy of that size at best;
//   beside   the same copy (unsorted) with its grid capped at each of --blocks blocks (0: the
//            default, as many as the GPU holds), alone, and on a second stream beside the
//            weight-streaming GEMM of one layer (WeightStreamProxy, --layer_gb GB of weights,
//            --gemm_batch rows), issued right before the GEMM and right after it:
//              hidden = (copy alone + gemm alone - both) / copy alone,
//            the share of the copy's time that disappears behind the GEMM (1: all of it). Which
//            kernel takes the SMs first decides much of it: the GEMM's blocks do not fit beside
//            a copy block on one SM.
// The JSON's "summary" holds small_copy_to_memcpy_b<B> (the unsorted copy's time over the memcpy's,
// B = 1 and 8) and copy_hidden_beside_gemm_b<B>_blocks16 (copy issued first, B = 8 and 64), for
// the batches and grids that were measured.
// Every copy's output is checked row by row against the pool's pattern (alone and beside the GEMM)
// before it is timed. Times are medians of --reps runs (CUDA events, after --warmup runs).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sparsekv/backend.h"
#include "sparsekv/model_proxy.h"

namespace sparsekv::bench {
namespace {

constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kCeilingBytes = 2 * kGiB;  // the memcpy ceiling's size, or the span if smaller

struct Options {
  double span_gib;
  int32_t row_bytes;
  int32_t misses;
  std::vector<int64_t> batches;
  std::vector<int64_t> beside_batches;
  std::vector<int64_t> blocks;
  double layer_gb;
  int32_t gemm_batch;
  int index_sets;
  int warmup;
  int reps;
  uint64_t seed;
  int device;
  std::string json;
};

class Bench {
 public:
  Bench(const Options& o, Backend* backend, cudaStream_t stream, cudaStream_t side)
      : o_(o), backend_(backend), stream_(stream), side_(side), rng_(o.seed) {}

  // Returns the number of wrong results found.
  int Run();

 private:
  IndexSets MakeIndexSets(int32_t n) {
    return bench::MakeIndexSets(*backend_, stream_, rng_, o_.index_sets, n, span_rows_);
  }
  void FreeIndexSets(IndexSets& sets) { bench::FreeIndexSets(*backend_, sets); }
  // Enqueues set `set` of `sets` (sorted or not) on `stream` with a grid of at most max_blocks.
  void Copy(const IndexSets& sets, bool sorted, int set, int max_blocks, cudaStream_t stream);
  // Poisons the destination, runs `launch` and checks set 0's rows; false if anything is wrong.
  bool Verify(const std::string& what, const IndexSets& sets, bool sorted,
              const std::function<void()>& launch);
  Json MeasureSmall(int32_t batch);
  Json MeasureBeside(int32_t batch, const Timing& gemm);

  const Options o_;
  Backend* backend_;
  cudaStream_t stream_;
  cudaStream_t side_;
  std::mt19937_64 rng_;
  std::byte* pool_ = nullptr;  // [span rows, row_bytes] pinned host, pattern-filled
  int64_t span_rows_ = 0;
  std::byte* dst_ = nullptr;  // [max rows, row_bytes] device
  int32_t* d_count_ = nullptr;
  unsigned long long* d_invalid_ = nullptr;
  std::vector<std::byte> host_dst_;
  std::unique_ptr<WeightStreamProxy> gemm_;
  double h2d_gbps_ = 0;
  Json summary_ = Json::Object();
  Errors errors_;
};

void Bench::Copy(const IndexSets& sets, bool sorted, int set, int max_blocks, cudaStream_t stream) {
  IndexCopyView v =
      SetGather(sets, sorted, set, pool_, span_rows_, dst_, o_.row_bytes, d_count_, d_invalid_);
  v.max_blocks = max_blocks;
  CheckOk(backend_->IndexCopy(v, stream), "IndexCopy");
}

bool Bench::Verify(const std::string& what, const IndexSets& sets, bool sorted,
                   const std::function<void()>& launch) {
  const GatherOutput out{dst_, size_t(sets.n) * o_.row_bytes, d_invalid_, &host_dst_};
  const std::string wrong =
      CheckGather(stream_, out, (sorted ? sets.sorted_src : sets.src).data(),
                  (sorted ? sets.sorted_dst : sets.dst).data(), sets.n, o_.row_bytes, launch);
  if (wrong.empty()) return true;
  errors_.Add(what + ": " + wrong);
  return false;
}

Json Bench::MeasureSmall(int32_t batch) {
  IndexSets sets = MakeIndexSets(batch * o_.misses);
  CopySync(d_count_, &sets.n, sizeof(sets.n), stream_);
  const std::string name = "small B=" + std::to_string(batch);
  const double bytes = double(sets.n) * o_.row_bytes;
  Json row = Json::Object()
                 .Add("batch", batch)
                 .Add("rows", sets.n)
                 .Add("bytes", bytes)
                 .Add("floor_us", bytes / (h2d_gbps_ * 1e3));
  const Timing memcpy_t = TimeOnStream(stream_, o_.warmup, o_.reps, [&](int) {
    BENCH_CUDA(cudaMemcpyAsync(dst_, pool_, size_t(bytes), cudaMemcpyHostToDevice, stream_));
  });
  row.Add("memcpy", TimingJson(memcpy_t));
  std::printf("%-6d %7d %10.1f %10.1f", batch, sets.n, bytes / (h2d_gbps_ * 1e3),
              memcpy_t.median_ms * 1e3);
  for (const bool sorted : {false, true}) {
    const char* kind = sorted ? "sorted" : "unsorted";
    const bool ok =
        Verify(name + " " + kind, sets, sorted, [&] { Copy(sets, sorted, 0, 0, stream_); });
    const Timing t = TimeOnStream(stream_, o_.warmup, o_.reps, [&](int rep) {
      Copy(sets, sorted, rep % sets.count, 0, stream_);
    });
    row.Add(kind, TimingJson(t)).Add(std::string(kind) + "_verified", ok);
    if (!sorted && (batch == 1 || batch == 8)) {
      summary_.Add("small_copy_to_memcpy_b" + std::to_string(batch),
                   t.median_ms / memcpy_t.median_ms);
    }
    std::printf(" %10.1f %7.1f %6.2f", t.median_ms * 1e3, bytes / (t.median_ms * 1e6),
                t.median_ms / memcpy_t.median_ms);
  }
  std::printf("\n");
  FreeIndexSets(sets);
  return row;
}

Json Bench::MeasureBeside(int32_t batch, const Timing& gemm) {
  IndexSets sets = MakeIndexSets(batch * o_.misses);
  CopySync(d_count_, &sets.n, sizeof(sets.n), stream_);
  cudaEvent_t fork, join;
  BENCH_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  BENCH_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  Json rows = Json::Array();
  for (const int64_t blocks : o_.blocks) {
    const int max_blocks = static_cast<int>(blocks);
    // The copy on the side stream and the GEMM on the main stream, both after the fork, in the
    // order asked for.
    auto both = [&](int rep, bool copy_first) {
      const auto copy = [&] { Copy(sets, false, rep % sets.count, max_blocks, side_); };
      BENCH_CUDA(cudaEventRecord(fork, stream_));
      if (copy_first) {
        BENCH_CUDA(cudaStreamWaitEvent(side_, fork));
        copy();
      }
      CheckOk(gemm_->Run(o_.gemm_batch, rep, stream_), "WeightStreamProxy::Run");
      if (!copy_first) {
        BENCH_CUDA(cudaStreamWaitEvent(side_, fork));
        copy();
      }
      BENCH_CUDA(cudaEventRecord(join, side_));
      BENCH_CUDA(cudaStreamWaitEvent(stream_, join));
    };
    const std::string name =
        "beside B=" + std::to_string(batch) + " blocks=" + std::to_string(blocks);
    const bool ok =
        Verify(name + " alone", sets, false, [&] { Copy(sets, false, 0, max_blocks, stream_); }) &&
        Verify(name + ", copy first", sets, false, [&] { both(0, true); }) &&
        Verify(name + ", GEMM first", sets, false, [&] { both(0, false); });
    const Timing alone = TimeOnStream(stream_, o_.warmup, o_.reps, [&](int rep) {
      Copy(sets, false, rep % sets.count, max_blocks, stream_);
    });
    const double bytes = double(sets.n) * o_.row_bytes;
    Json row = Json::Object()
                   .Add("batch", batch)
                   .Add("rows", sets.n)
                   .Add("max_blocks", max_blocks)
                   .Add("alone", TimingJson(alone))
                   .Add("alone_gbps", bytes / (alone.median_ms * 1e6))
                   .Add("verified", ok);
    std::printf("%-6d %7d %7d %10.1f %7.1f %10.1f", batch, sets.n, max_blocks,
                alone.median_ms * 1e3, bytes / (alone.median_ms * 1e6), gemm.median_ms * 1e3);
    for (const bool copy_first : {true, false}) {
      const Timing t =
          TimeOnStream(stream_, o_.warmup, o_.reps, [&](int rep) { both(rep, copy_first); });
      const double hidden = (alone.median_ms + gemm.median_ms - t.median_ms) / alone.median_ms;
      const std::string key = copy_first ? "copy_first" : "gemm_first";
      row.Add(key, TimingJson(t)).Add("hidden_" + key, hidden);
      if (copy_first && max_blocks == 16 && (batch == 8 || batch == 64)) {
        summary_.Add("copy_hidden_beside_gemm_b" + std::to_string(batch) + "_blocks16", hidden);
      }
      std::printf(" %10.1f %7.2f", t.median_ms * 1e3, hidden);
    }
    std::printf("\n");
    rows.Push(row);
  }
  BENCH_CUDA(cudaEventDestroy(fork));
  BENCH_CUDA(cudaEventDestroy(join));
  FreeIndexSets(sets);
  return rows;
}

int Bench::Run() {
  const size_t span_bytes = size_t(o_.span_gib * kGiB) & ~size_t{4095};
  span_rows_ = int64_t(span_bytes / o_.row_bytes);
  pool_ = static_cast<std::byte*>(ValueOrDie(backend_->AllocateHost(span_bytes), "pool"));
  FillPattern(pool_, span_bytes);
  int64_t max_batch = 0;
  for (const auto* list : {&o_.batches, &o_.beside_batches}) {
    for (int64_t b : *list) max_batch = std::max(max_batch, b);
  }
  const size_t dst_bytes = size_t(max_batch) * o_.misses * o_.row_bytes;
  dst_ = static_cast<std::byte*>(ValueOrDie(backend_->AllocateDevice(dst_bytes), "dst"));
  host_dst_.resize(dst_bytes);
  d_count_ = static_cast<int32_t*>(ValueOrDie(backend_->AllocateDevice(4), "count"));
  d_invalid_ = static_cast<unsigned long long*>(
      ValueOrDie(backend_->AllocateDevice(sizeof(unsigned long long)), "invalid"));
  BENCH_CUDA(cudaMemsetAsync(d_invalid_, 0, sizeof(unsigned long long), stream_));

  const size_t ceiling_bytes = std::min(kCeilingBytes, span_bytes);
  void* ceiling = ValueOrDie(backend_->AllocateDevice(ceiling_bytes), "ceiling buffer");
  h2d_gbps_ = MemcpyGBps(ceiling, pool_, ceiling_bytes, stream_, o_.warmup, o_.reps);
  backend_->FreeDevice(ceiling);
  std::printf(
      "device %s; pinned host->device memcpy of %.2f GiB: %.1f GB/s; span %.2f GiB, "
      "%d-B rows\n",
      DeviceName(o_.device).c_str(), double(ceiling_bytes) / kGiB, h2d_gbps_,
      double(span_bytes) / kGiB, o_.row_bytes);

  std::printf("\nsmall copies: one layer's misses at batch B, default grid\n");
  std::printf("%-6s %7s %10s %10s %10s %7s %6s %10s %7s %6s\n", "B", "rows", "floor us",
              "memcpy us", "unsort us", "GB/s", "/memcpy", "sorted us", "GB/s", "/memcpy");
  Json small = Json::Array();
  for (int64_t b : o_.batches) small.Push(MeasureSmall(static_cast<int32_t>(b)));

  gemm_ =
      ValueOrDie(WeightStreamProxy::Create(o_.gemm_batch, int64_t(o_.layer_gb * 1e9), 2, o_.device),
                 "WeightStreamProxy::Create");
  const Timing gemm = TimeOnStream(stream_, o_.warmup, o_.reps, [&](int rep) {
    CheckOk(gemm_->Run(o_.gemm_batch, rep, stream_), "WeightStreamProxy::Run");
  });
  const double gemm_gbps = double(gemm_->bytes_per_layer()) / (gemm.median_ms * 1e6);
  std::printf("\ncopies beside one layer's weight GEMM (%.2f GB, batch %d: %.1f us, %.0f GB/s)\n",
              gemm_->bytes_per_layer() / 1e9, o_.gemm_batch, gemm.median_ms * 1e3, gemm_gbps);
  std::printf("%-6s %7s %7s %10s %7s %10s %10s %7s %10s %7s\n", "B", "rows", "blocks", "copy us",
              "GB/s", "gemm us", "copy 1st", "hidden", "gemm 1st", "hidden");
  Json beside = Json::Array();
  for (int64_t b : o_.beside_batches) beside.Push(MeasureBeside(static_cast<int32_t>(b), gemm));

  Json root = Json::Object()
                  .Add("benchmark", "copy_overlap_bench")
                  .Add("device", DeviceName(o_.device))
                  .Add("row_bytes", o_.row_bytes)
                  .Add("span_bytes", double(span_bytes))
                  .Add("misses_per_request", o_.misses)
                  .Add("h2d_gbps", h2d_gbps_)
                  .Add("small", small)
                  .Add("gemm", Json::Object()
                                   .Add("bytes", double(gemm_->bytes_per_layer()))
                                   .Add("batch", o_.gemm_batch)
                                   .Add("timing", TimingJson(gemm))
                                   .Add("gbps", gemm_gbps))
                  .Add("beside", beside)
                  .Add("summary", summary_)
                  .Add("errors", ErrorsJson(errors_));
  if (!o_.json.empty()) WriteFile(o_.json, root.str() + "\n");
  gemm_.reset();
  backend_->FreeDevice(dst_);
  backend_->FreeDevice(d_count_);
  backend_->FreeDevice(d_invalid_);
  backend_->FreeHost(pool_);
  if (errors_.count() > 0) {
    for (const std::string& m : errors_.messages()) std::printf("WRONG: %s\n", m.c_str());
  }
  return errors_.count();
}

}  // namespace
}  // namespace sparsekv::bench

int main(int argc, char** argv) {
  using namespace sparsekv::bench;
  const Flags flags(argc, argv,
                    {{"span_gib", "1.6"},
                     {"row_bytes", "656"},
                     {"misses", "410"},
                     {"batches", "1,2,4,8,16,32,64"},
                     {"beside_batches", "1,8,64"},
                     {"blocks", "4,8,16,32,66,132,0"},
                     {"layer_gb", "1.38"},
                     {"gemm_batch", "64"},
                     {"index_sets", "4"},
                     {"warmup", "3"},
                     {"reps", "30"},
                     {"seed", "1"},
                     {"device", "0"},
                     {"json", ""}});
  Options o;
  o.span_gib = flags.Double("span_gib");
  o.row_bytes = static_cast<int32_t>(flags.Int("row_bytes"));
  o.misses = static_cast<int32_t>(flags.Int("misses"));
  o.batches = flags.IntList("batches");
  o.beside_batches = flags.IntList("beside_batches");
  o.blocks = flags.IntList("blocks");
  o.layer_gb = flags.Double("layer_gb");
  o.gemm_batch = static_cast<int32_t>(flags.Int("gemm_batch"));
  o.index_sets = static_cast<int>(flags.Int("index_sets"));
  o.warmup = static_cast<int>(flags.Int("warmup"));
  o.reps = static_cast<int>(flags.Int("reps"));
  o.seed = static_cast<uint64_t>(flags.Int("seed"));
  o.device = static_cast<int>(flags.Int("device"));
  o.json = flags.Str("json");
  if (o.row_bytes <= 0 || o.row_bytes % 16 != 0 || o.misses <= 0 || o.reps <= 0 || o.warmup < 0 ||
      o.index_sets <= 0 || o.gemm_batch <= 0 || o.layer_gb <= 0) {
    Fail(
        "--row_bytes (a multiple of 16), --misses, --reps, --index_sets, --gemm_batch and "
        "--layer_gb must be positive, --warmup >= 0");
  }
  for (int64_t b : o.blocks) {
    if (b < 0) Fail("--blocks: each entry must be >= 0 (0: the default grid)");
  }
  auto backend = ValueOrDie(sparsekv::CreateCudaBackend(o.device), "CreateCudaBackend");
  cudaStream_t stream, side;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  BENCH_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  const int wrong = Bench(o, backend.get(), stream, side).Run();
  BENCH_CUDA(cudaStreamDestroy(side));
  BENCH_CUDA(cudaStreamDestroy(stream));
  return wrong == 0 ? 0 : 1;
}
