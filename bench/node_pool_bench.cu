// node_pool_bench: random row gathers by the GPU from another process's node pool
// (sparsekv/node_pool.h), against the same gathers from this process's own pinned pool, in one
// run (docs/scale-out.md, "Node pool").
//
// A child process (this binary with --fill) creates a node pool of --span-gib of --row-bytes rows
// (one layer), fills it with the data pattern of bench_util.h and reports its path; this process
// attaches to it with the CUDA backend (the rows registered as mapped, portable pinned memory),
// allocates its own pool of the same size through Backend::AllocateHost (what a manager's pool
// uses: huge pages where the system has them) and fills it with the same pattern. Then, for each
// --rows n, the library's IndexCopy gathers n random distinct rows (sorted by host row, as a
// large batch's miss list, and unsorted, as a small batch's) from each pool into device memory;
// every gather is checked against the pattern before it is timed (CUDA events, medians of --reps
// after --warmup, index sets rotated).
//
// Output: a table on stdout; --json PATH writes every figure, the segment's backing (the file
// system and its transparent huge page setting) and a "summary" object with
// node_remote_gather_ratio_656 = rows/s from the node pool / rows/s from the own pool, for the
// unsorted gather of --key-rows rows of 656 B (scripts/merge_summary.py merges it).
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "node_pool_bench_pool.h"

namespace sparsekv::bench {
namespace {

constexpr double kGiB = double(size_t{1} << 30);

struct Result {
  std::string pool;   // "own" or "node"
  std::string order;  // "sorted" or "unsorted"
  int32_t rows = 0;
  Timing timing;
  double rows_per_s = 0;
  bool verified = false;
};

}  // namespace
}  // namespace sparsekv::bench

int main(int argc, char** argv) {
  using namespace sparsekv;
  using namespace sparsekv::bench;
  Flags flags(argc, argv,
              {{"span-gib", "4"},
               {"row-bytes", "656"},
               {"rows", "2048,16384,131072"},
               {"key-rows", "16384"},
               {"index-sets", "8"},
               {"warmup", "5"},
               {"reps", "50"},
               {"seed", "1"},
               {"device", "0"},
               {"segment-dir", "/dev/shm"},
               {"json", ""},
               {"fill", ""}});
  const int32_t row_bytes = static_cast<int32_t>(flags.Int("row-bytes"));
  if (row_bytes % 16 != 0) Fail("--row-bytes must be a multiple of 16");
  const int64_t span_rows =
      static_cast<int64_t>(flags.Double("span-gib") * kGiB) / row_bytes / 64 * 64;
  if (!flags.Str("fill").empty()) {
    return RunNodePoolFill(flags.Str("fill"), flags.Str("segment-dir"), span_rows, row_bytes,
                           FillPattern);
  }
  const std::vector<int64_t> sizes = flags.IntList("rows");
  const int warmup = static_cast<int>(flags.Int("warmup"));
  const int reps = static_cast<int>(flags.Int("reps"));
  const int device = static_cast<int>(flags.Int("device"));
  using Clock = std::chrono::steady_clock;

  // The node pool, filled by another process.
  const std::string name = "sparsekv-node-pool-bench-" + std::to_string(getpid());
  const auto t0 = Clock::now();
  std::shared_ptr<Backend> cuda = ValueOrDie(CreateCudaBackend(device), "CUDA backend");
  std::unique_ptr<RemoteNodePool> node = RemoteNodePool::Start(
      "/proc/self/exe",
      {"--fill", name, "--segment-dir", flags.Str("segment-dir"), "--span-gib",
       flags.Str("span-gib"), "--row-bytes", flags.Str("row-bytes")},
      cuda);
  const std::string backing = SegmentBacking(flags.Str("segment-dir"));
  std::printf("node pool %s: %.1f GiB, filled by pid %d and registered here in %.1f s (%s)\n",
              node->path().c_str(), double(node->bytes()) / kGiB, int(node->child()),
              std::chrono::duration<double>(Clock::now() - t0).count(), backing.c_str());

  // This process's own pool, as a manager's pool allocates it.
  const size_t bytes = size_t(node->row_count()) * row_bytes;
  const auto t1 = Clock::now();
  auto* own = static_cast<std::byte*>(ValueOrDie(cuda->AllocateHost(bytes), "own pool"));
  FillPattern(own, bytes);
  std::printf("own pool: %.1f GiB pinned and filled in %.1f s\n", double(bytes) / kGiB,
              std::chrono::duration<double>(Clock::now() - t1).count());

  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int32_t max_rows = static_cast<int32_t>(*std::max_element(sizes.begin(), sizes.end()));
  auto* dst = static_cast<std::byte*>(
      ValueOrDie(cuda->AllocateDevice(size_t(max_rows) * row_bytes), "destination"));
  auto* d_count = static_cast<int32_t*>(ValueOrDie(cuda->AllocateDevice(4), "count"));
  auto* d_invalid = static_cast<unsigned long long*>(
      ValueOrDie(cuda->AllocateDevice(sizeof(unsigned long long)), "invalid"));
  BENCH_CUDA(cudaMemsetAsync(d_invalid, 0, sizeof(unsigned long long), stream));
  std::vector<std::byte> host_dst(size_t(max_rows) * row_bytes);
  std::mt19937_64 rng(static_cast<uint64_t>(flags.Int("seed")));
  Errors errors;
  std::vector<Result> results;
  const std::byte* pools[2] = {own, node->rows()};
  const char* pool_names[2] = {"own", "node"};
  for (int64_t n64 : sizes) {
    const int32_t n = static_cast<int32_t>(n64);
    if (2 * n64 > span_rows) Fail("--rows " + std::to_string(n) + " is too many for the span");
    IndexSets sets =
        MakeIndexSets(*cuda, stream, rng, static_cast<int>(flags.Int("index-sets")), n, span_rows);
    CopySync(d_count, &n, sizeof(n), stream);
    for (const bool sorted : {false, true}) {
      // Own and node pool alternate within each size, so that both see the same machine state.
      for (int p = 0; p < 2; ++p) {
        auto launch = [&](int set) {
          CheckOk(cuda->IndexCopy(SetGather(sets, sorted, set, pools[p], span_rows, dst, row_bytes,
                                            d_count, d_invalid),
                                  stream),
                  "IndexCopy");
        };
        const std::vector<int32_t>& src = sorted ? sets.sorted_src : sets.src;
        const std::vector<int32_t>& dsts = sorted ? sets.sorted_dst : sets.dst;
        const GatherOutput out{dst, size_t(n) * row_bytes, d_invalid, &host_dst};
        const std::string wrong =
            CheckGather(stream, out, src.data(), dsts.data(), n, row_bytes, [&] { launch(0); });
        if (!wrong.empty()) errors.Add(std::string(pool_names[p]) + " pool: " + wrong);
        const Timing t =
            TimeOnStream(stream, warmup, reps, [&](int rep) { launch(rep % sets.count); });
        results.push_back({pool_names[p], sorted ? "sorted" : "unsorted", n, t,
                           n / (t.median_ms * 1e-3), wrong.empty()});
      }
    }
    FreeIndexSets(*cuda, sets);
  }

  std::printf("\n%-6s %-9s %8s %12s %10s %8s\n", "pool", "order", "rows", "rows/s", "GB/s",
              "node/own");
  double key = 0;
  Json table = Json::Array();
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const double own_rate = r.pool == "node" ? results[i - 1].rows_per_s : r.rows_per_s;
    const double ratio = r.rows_per_s / own_rate;
    std::printf("%-6s %-9s %8d %12.3g %10.2f %8.3f\n", r.pool.c_str(), r.order.c_str(), r.rows,
                r.rows_per_s, r.rows_per_s * row_bytes / 1e9, ratio);
    if (r.pool == "node" && r.order == "unsorted" && r.rows == flags.Int("key-rows")) key = ratio;
    table.Push(Json::Object()
                   .Add("pool", r.pool)
                   .Add("order", r.order)
                   .Add("rows", static_cast<int64_t>(r.rows))
                   .Add("rows_per_s", r.rows_per_s)
                   .Add("gbps", r.rows_per_s * row_bytes / 1e9)
                   .Add("ratio_to_own", ratio)
                   .Add("verified", r.verified)
                   .Add("timing", TimingJson(r.timing)));
  }
  std::printf("\nnode_remote_gather_ratio_%d = %.3f (unsorted, %lld rows; target >= 0.9)\n",
              row_bytes, key, static_cast<long long>(flags.Int("key-rows")));

  if (!flags.Str("json").empty()) {
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    Json summary = Json::Object();
    summary.Add("node_remote_gather_ratio_" + std::to_string(row_bytes), key);
    const Json doc = Json::Object()
                         .Add("command", command)
                         .Add("device", DeviceName(device))
                         .Add("row_bytes", static_cast<int64_t>(row_bytes))
                         .Add("span_bytes", static_cast<int64_t>(bytes))
                         .Add("segment", node->path())
                         .Add("segment_backing", backing)
                         .Add("results", table)
                         .Add("errors", ErrorsJson(errors))
                         .Add("summary", summary);
    WriteFile(flags.Str("json"), doc.str() + "\n");
  }

  BENCH_CUDA(cudaStreamSynchronize(stream));
  for (void* p :
       {static_cast<void*>(dst), static_cast<void*>(d_count), static_cast<void*>(d_invalid)}) {
    cuda->FreeDevice(p);
  }
  cuda->FreeHost(own);
  node.reset();  // detaches; the child exits and removes the file
  return errors.count() > 0 ? 1 : 0;
}
