// peer_gather_bench: token-row gathers into HBM from another GPU's memory (the peer tier's path)
// against the same gathers from pinned host memory, in one run.
//
// The decode GPU is --device; the peer is --peer_device (default: device 1 if there are two,
// else the decode GPU itself, which is then a same-GPU stand-in, not a peer link, and is reported
// as such). Recorded first: how the GPUs are linked (peer access both ways, the driver's P2P
// performance rank, PCI bus ids) and the ceilings of the same run: one pinned host->device
// cudaMemcpy and one peer->device cudaMemcpy of --ceiling_gib GiB each.
//
// Gathers: --rows random rows of each --row_bytes size, with the library's IndexCopy, sorted by
// source row as the resolve sorts its miss lists (and unsorted), from
//   host  a pinned pool of --span_gib GiB (the CUDA backend's AllocateHost);
//   peer  a region of --span_gib GiB on the peer device, mapped into the decode device through
//         the backend's ExportDevice / ImportDevice (peer access), as the peer tier maps a region;
// rotating over --index_sets index sets. Every gather's output is checked row by row against the
// data pattern before it is timed. Rows/s and GB/s count useful bytes only; the summary's
// peer_gather_to_host_gather_<row> is rows/s from the peer over rows/s from the host (sorted);
// with the same-GPU stand-in, the keys end in _same_gpu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sparsekv/backend.h"

namespace sparsekv::bench {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

struct Options {
  int device = 0;
  int peer_device = -1;
  size_t span_bytes = 0;
  size_t ceiling_bytes = 0;
  int32_t rows = 0;
  std::vector<int64_t> row_bytes;
  int index_sets = 0;
  int warmup = 0;
  int reps = 0;
  uint64_t seed = 1;
  std::string json;
};

struct Link {
  int devices = 0;
  bool same_device = true;
  int can_access = 0;       // decode device reads the peer's memory
  int can_access_back = 0;  // and the other way
  int performance_rank = -1;
  int native_atomics = 0;
  std::string bus_id, peer_bus_id;
};

struct Gather {
  std::string source;  // "host" or "peer"
  std::string order;   // "sorted" or "unsorted"
  int32_t row_bytes;
  Timing timing;
  double rows_per_s;
  double gbps;
  bool verified;
};

std::string BusId(int device) {
  char id[32] = {};
  BENCH_CUDA(cudaDeviceGetPCIBusId(id, sizeof(id), device));
  return id;
}

Link DescribeLink(int device, int peer) {
  Link l;
  BENCH_CUDA(cudaGetDeviceCount(&l.devices));
  l.same_device = device == peer;
  l.bus_id = BusId(device);
  l.peer_bus_id = BusId(peer);
  if (!l.same_device) {
    BENCH_CUDA(cudaDeviceCanAccessPeer(&l.can_access, device, peer));
    BENCH_CUDA(cudaDeviceCanAccessPeer(&l.can_access_back, peer, device));
    BENCH_CUDA(cudaDeviceGetP2PAttribute(&l.performance_rank, cudaDevP2PAttrPerformanceRank, device,
                                         peer));
    BENCH_CUDA(cudaDeviceGetP2PAttribute(&l.native_atomics, cudaDevP2PAttrNativeAtomicSupported,
                                         device, peer));
  }
  return l;
}

int Run(const Options& o) {
  std::shared_ptr<Backend> backend = ValueOrDie(CreateCudaBackend(o.device), "CreateCudaBackend");
  std::shared_ptr<Backend> lender =
      o.peer_device == o.device ? backend
                                : ValueOrDie(CreateCudaBackend(o.peer_device), "peer backend");
  BENCH_CUDA(cudaSetDevice(o.device));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Link link = DescribeLink(o.device, o.peer_device);
  std::printf(
      "decode device %d (%s, %s), peer device %d (%s)%s\n", o.device, DeviceName(o.device).c_str(),
      link.bus_id.c_str(), o.peer_device, link.peer_bus_id.c_str(),
      link.same_device ? ": the same GPU, a stand-in for a peer (no peer link measured)" : "");
  if (!link.same_device) {
    std::printf("peer access %d -> %d: %d, back: %d; P2P performance rank %d, native atomics %d\n",
                o.device, o.peer_device, link.can_access, link.can_access_back,
                link.performance_rank, link.native_atomics);
    if (!link.can_access) Fail("the GPUs have no peer access: no peer tier between them");
  }

  // The host pool and the peer region hold the same pattern (by byte offset).
  std::printf("allocating %.1f GiB pinned host memory and %.1f GiB on device %d...\n",
              double(o.span_bytes) / kGiB, double(o.span_bytes) / kGiB, o.peer_device);
  std::fflush(stdout);
  auto* pool = static_cast<std::byte*>(ValueOrDie(backend->AllocateHost(o.span_bytes), "pool"));
  FillPattern(pool, o.span_bytes);
  void* lent = ValueOrDie(lender->AllocateDevice(o.span_bytes), "peer region");
  const std::string handle = ValueOrDie(lender->ExportDevice(lent), "ExportDevice");
  auto* region = static_cast<std::byte*>(ValueOrDie(backend->ImportDevice(handle), "ImportDevice"));
  for (size_t done = 0; done < o.span_bytes; done += kGiB) {
    BENCH_CUDA(cudaMemcpyAsync(region + done, pool + done, std::min(kGiB, o.span_bytes - done),
                               cudaMemcpyDefault, stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));

  // Ceilings of this run.
  const size_t ceiling = std::min(o.ceiling_bytes, o.span_bytes);
  void* sink = ValueOrDie(backend->AllocateDevice(ceiling), "ceiling buffer");
  Timing h2d_t, peer_t;
  const double h2d_gbps = MemcpyGBps(sink, pool, ceiling, stream, o.warmup, o.reps, &h2d_t);
  const double peer_gbps = MemcpyGBps(sink, region, ceiling, stream, o.warmup, o.reps, &peer_t);
  backend->FreeDevice(sink);
  std::printf("ceilings: pinned host->device %.1f GB/s, peer->device %.1f GB/s (%.2f x)\n",
              h2d_gbps, peer_gbps, peer_gbps / h2d_gbps);

  const int64_t max_row = *std::max_element(o.row_bytes.begin(), o.row_bytes.end());
  auto* dst = static_cast<std::byte*>(
      ValueOrDie(backend->AllocateDevice(size_t(o.rows) * max_row), "destination"));
  auto* d_count = static_cast<int32_t*>(ValueOrDie(backend->AllocateDevice(4), "count"));
  auto* d_invalid = static_cast<unsigned long long*>(
      ValueOrDie(backend->AllocateDevice(sizeof(unsigned long long)), "invalid"));
  BENCH_CUDA(cudaMemsetAsync(d_invalid, 0, sizeof(unsigned long long), stream));
  CopySync(d_count, &o.rows, sizeof(int32_t), stream);
  std::vector<std::byte> host_dst(size_t(o.rows) * max_row);
  std::mt19937_64 rng(o.seed);
  Errors errors;
  std::vector<Gather> gathers;

  for (const int64_t rb : o.row_bytes) {
    const auto row_bytes = static_cast<int32_t>(rb);
    if (row_bytes % 16 != 0) Fail("--row_bytes must be multiples of 16");
    const int64_t span_rows = std::min<int64_t>(int64_t(o.span_bytes) / row_bytes, INT32_MAX);
    if (span_rows < 2 * int64_t(o.rows)) Fail("--span_gib too small for --rows distinct rows");
    IndexSets sets = MakeIndexSets(*backend, stream, rng, o.index_sets, o.rows, span_rows);
    for (const char* source : {"host", "peer"}) {
      for (const bool sorted : {true, false}) {
        const std::byte* rows = std::string(source) == "host" ? pool : region;
        const auto launch = [&](int set) {
          CheckOk(backend->IndexCopy(SetGather(sets, sorted, set, rows, span_rows, dst, row_bytes,
                                               d_count, d_invalid),
                                     stream),
                  "IndexCopy");
        };
        const GatherOutput out{dst, size_t(o.rows) * row_bytes, d_invalid, &host_dst};
        const std::vector<int32_t>& src = sorted ? sets.sorted_src : sets.src;
        const std::vector<int32_t>& dsts = sorted ? sets.sorted_dst : sets.dst;
        const std::string wrong = CheckGather(stream, out, src.data(), dsts.data(), o.rows,
                                              row_bytes, [&] { launch(0); });
        if (!wrong.empty())
          errors.Add(std::string(source) + " " + std::to_string(rb) + ": " + wrong);
        const Timing t =
            TimeOnStream(stream, o.warmup, o.reps, [&](int rep) { launch(rep % sets.count); });
        const double rows_per_s = o.rows / (t.median_ms * 1e-3);
        gathers.push_back({source, sorted ? "sorted" : "unsorted", row_bytes, t, rows_per_s,
                           rows_per_s * row_bytes / 1e9, wrong.empty()});
      }
    }
    FreeIndexSets(*backend, sets);
  }

  auto ratio = [&](int32_t row_bytes) {
    double host = 0, peer = 0;
    for (const Gather& g : gathers) {
      if (g.row_bytes != row_bytes || g.order != "sorted" || !g.verified) continue;
      (g.source == "host" ? host : peer) = g.rows_per_s;
    }
    return host > 0 && peer > 0 ? peer / host : std::nan("");
  };
  std::printf("\nIndexCopy into HBM on %s, %d rows per gather, span %.1f GiB\n",
              backend->name().c_str(), o.rows, double(o.span_bytes) / kGiB);
  std::printf("%-6s %-9s %6s %10s %12s %8s %s\n", "source", "order", "row_B", "median_us",
              "Mrows/s", "GB/s", "check");
  for (const Gather& g : gathers) {
    std::printf("%-6s %-9s %6d %10.1f %12.2f %8.2f %s\n", g.source.c_str(), g.order.c_str(),
                g.row_bytes, g.timing.median_ms * 1e3, g.rows_per_s / 1e6, g.gbps,
                g.verified ? "ok" : "WRONG");
  }
  // A same-GPU stand-in measures no peer link: its keys say so, so that they are never read as
  // a peer's figures.
  const std::string suffix = link.same_device ? "_same_gpu" : "";
  Json summary = Json::Object();
  for (const int64_t rb : o.row_bytes) {
    summary.Add("peer_gather_to_host_gather_" + std::to_string(rb) + suffix, ratio(int32_t(rb)));
    std::printf("peer / host rows/s at %lld B: %.2f\n", static_cast<long long>(rb),
                ratio(int32_t(rb)));
  }
  summary.Add("peer_gather_same_device", link.same_device)
      .Add("peer_memcpy_gbps" + suffix, peer_gbps)
      .Add("peer_h2d_gbps", h2d_gbps)
      .Add("peer_gather_wrong_results", errors.count());
  Json rows = Json::Array();
  for (const Gather& g : gathers) {
    rows.Push(Json::Object()
                  .Add("source", g.source)
                  .Add("order", g.order)
                  .Add("row_bytes", g.row_bytes)
                  .Add("timing", TimingJson(g.timing))
                  .Add("rows_per_s", g.rows_per_s)
                  .Add("useful_gbps", g.gbps)
                  .Add("verified", g.verified));
  }
  Json root = Json::Object();
  root.Add("benchmark", "peer_gather_bench")
      .Add("device", backend->name())
      .Add("peer_device", lender->name())
      .Add("link", Json::Object()
                       .Add("devices", link.devices)
                       .Add("same_device", link.same_device)
                       .Add("bus_id", link.bus_id)
                       .Add("peer_bus_id", link.peer_bus_id)
                       .Add("can_access_peer", link.can_access)
                       .Add("can_access_back", link.can_access_back)
                       .Add("p2p_performance_rank", link.performance_rank)
                       .Add("p2p_native_atomics", link.native_atomics))
      .Add("config", Json::Object()
                         .Add("span_bytes", int64_t(o.span_bytes))
                         .Add("rows", o.rows)
                         .Add("index_sets", o.index_sets)
                         .Add("warmup", o.warmup)
                         .Add("reps", o.reps)
                         .Add("seed", int64_t(o.seed)))
      .Add("ceilings", Json::Object()
                           .Add("h2d_gbps", h2d_gbps)
                           .Add("peer_to_device_gbps", peer_gbps)
                           .Add("h2d", TimingJson(h2d_t))
                           .Add("peer_to_device", TimingJson(peer_t)))
      .Add("gathers", rows)
      .Add("wrong_results", ErrorsJson(errors))
      .Add("summary", summary);
  if (!o.json.empty()) WriteFile(o.json, root.str() + "\n");

  backend->FreeDevice(d_invalid);
  backend->FreeDevice(d_count);
  backend->FreeDevice(dst);
  backend->CloseImported(region);
  lender->FreeDevice(lent);
  backend->FreeHost(pool);
  BENCH_CUDA(cudaStreamDestroy(stream));
  if (errors.count() > 0) std::printf("WRONG RESULTS: %d\n", errors.count());
  return errors.count();
}

}  // namespace
}  // namespace sparsekv::bench

int main(int argc, char** argv) {
  using namespace sparsekv::bench;
  const Flags flags(argc, argv,
                    {{"device", "0"},
                     {"peer_device", "-1"},
                     {"span_gib", "16"},
                     {"ceiling_gib", "2"},
                     {"rows", "40960"},
                     {"row_bytes", "656,1152"},
                     {"index_sets", "4"},
                     {"warmup", "3"},
                     {"reps", "20"},
                     {"seed", "1"},
                     {"json", ""}});
  Options o;
  o.device = static_cast<int>(flags.Int("device"));
  o.peer_device = static_cast<int>(flags.Int("peer_device"));
  if (o.peer_device < 0) {
    int devices = 0;
    BENCH_CUDA(cudaGetDeviceCount(&devices));
    o.peer_device = devices > 1 ? (o.device == 0 ? 1 : 0) : o.device;
  }
  o.span_bytes = size_t(flags.Double("span_gib") * kGiB) & ~size_t{4095};
  o.ceiling_bytes = size_t(flags.Double("ceiling_gib") * kGiB) & ~size_t{4095};
  o.rows = static_cast<int32_t>(flags.Int("rows"));
  o.row_bytes = flags.IntList("row_bytes");
  o.index_sets = static_cast<int>(flags.Int("index_sets"));
  o.warmup = static_cast<int>(flags.Int("warmup"));
  o.reps = static_cast<int>(flags.Int("reps"));
  o.seed = static_cast<uint64_t>(flags.Int("seed"));
  o.json = flags.Str("json");
  if (o.rows <= 0 || o.reps <= 0 || o.warmup < 0 || o.index_sets <= 0 || o.row_bytes.empty() ||
      o.span_bytes == 0 || o.ceiling_bytes == 0) {
    Fail("--rows, --reps, --index_sets, --span_gib, --ceiling_gib must be positive, --warmup >= 0");
  }
  return Run(o) == 0 ? 0 : 1;
}
