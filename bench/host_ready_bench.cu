// host_ready_bench: the time to a ready host pool (mapped, populated, pinned and mapped for the
// device) of ordinary pages, the library's way against one plain cudaHostRegister of the same
// memory, in the same run:
//   plain    mmap(anonymous), then one cudaHostRegister(Mapped | Portable) of all of it: the
//            driver populates and pins every page itself;
//   library  mmap(anonymous), then Backend::RegisterHost (CreateCudaBackend's preparation,
//            host_memory.h): populated by one thread per core of the GPU's NUMA node, registered
//            in chunks of --chunk_gib (default: the library's chunk_bytes) as they become
//            populated.
//   allocate the library allocating the pool itself (Backend::AllocateHost, as a host pool does):
//            transparent huge pages asked for, populated and registered the same way.
// Each side is timed from the mmap (or AllocateHost) to the call's return, then checked by copying
// its first and last MB to the device and back, then unregistered and unmapped before the other
// side runs (the machine need hold only one pool). --order says which runs first. Writes --json.
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sparsekv/backend.h"
#include "sparsekv/host_memory.h"

namespace sparsekv::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::byte* MapAnonymous(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Fail("mmap of " + std::to_string(bytes) + " bytes failed");
  return static_cast<std::byte*>(p);
}

// Copies the first and last MB of the pool to the device and back; false if a byte differs.
bool CheckPool(std::byte* pool, size_t bytes) {
  constexpr size_t kMB = size_t{1} << 20;
  void* device = nullptr;
  BENCH_CUDA(cudaMalloc(&device, kMB));
  std::vector<std::byte> back(kMB);
  bool ok = true;
  for (const size_t at : {size_t{0}, bytes - kMB}) {
    for (size_t i = 0; i < kMB; ++i) pool[at + i] = std::byte((at / kMB + i) * 131 % 251);
    BENCH_CUDA(cudaMemcpy(device, pool + at, kMB, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(back.data(), device, kMB, cudaMemcpyDeviceToHost));
    ok = ok && std::memcmp(back.data(), pool + at, kMB) == 0;
  }
  BENCH_CUDA(cudaFree(device));
  return ok;
}

struct Side {
  std::string name;
  double ready_s = 0;
  bool ok = false;
};

Side Plain(size_t bytes) {
  Side s{"plain"};
  const Clock::time_point start = Clock::now();
  std::byte* pool = MapAnonymous(bytes);
  BENCH_CUDA(cudaHostRegister(pool, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  s.ready_s = Seconds(start);
  s.ok = CheckPool(pool, bytes);
  BENCH_CUDA(cudaHostUnregister(pool));
  munmap(pool, bytes);
  return s;
}

Side Library(size_t bytes, const HostMemoryOptions& options) {
  Side s{"library"};
  auto backend =
      ValueOrDie(CreateCudaBackend(0, HostMemoryKind::kAuto, options), "CreateCudaBackend");
  const Clock::time_point start = Clock::now();
  std::byte* pool = MapAnonymous(bytes);
  CheckOk(backend->RegisterHost(pool, bytes), "RegisterHost");
  s.ready_s = Seconds(start);
  s.ok = CheckPool(pool, bytes);
  backend->UnregisterHost(pool);
  munmap(pool, bytes);
  return s;
}

// The library's own allocation of a pool (Backend::AllocateHost under HostMemoryKind::kAuto, as
// the benchmark's arena and a host pool allocate): anonymous memory with transparent huge pages
// asked for (reserved huge pages where enough are free), populated and registered as above.
Side Allocate(size_t bytes, const HostMemoryOptions& options) {
  Side s{"allocate"};
  auto backend =
      ValueOrDie(CreateCudaBackend(0, HostMemoryKind::kAuto, options), "CreateCudaBackend");
  const Clock::time_point start = Clock::now();
  auto* pool = static_cast<std::byte*>(ValueOrDie(backend->AllocateHost(bytes), "AllocateHost"));
  s.ready_s = Seconds(start);
  s.ok = CheckPool(pool, bytes);
  backend->FreeHost(pool);
  return s;
}

}  // namespace
}  // namespace sparsekv::bench

int main(int argc, char** argv) {
  using namespace sparsekv::bench;
  const Flags flags(argc, argv,
                    {{"gib", "100"},
                     {"chunk_gib", std::to_string(sparsekv::HostMemoryOptions{}.chunk_bytes >> 30)},
                     {"order", "plain,library"},
                     {"json", ""}});
  const double gib = flags.Double("gib");
  const size_t bytes = static_cast<size_t>(gib * double(size_t{1} << 30)) / (2 << 20) * (2 << 20);
  sparsekv::HostMemoryOptions options;
  options.chunk_bytes = static_cast<size_t>(flags.Double("chunk_gib") * double(size_t{1} << 30));
  BENCH_CUDA(cudaFree(nullptr));  // the context first: not part of either side's time
  std::vector<Side> sides;
  for (const std::string& name : flags.StrList("order")) {
    if (name == "plain") {
      sides.push_back(Plain(bytes));
    } else if (name == "library") {
      sides.push_back(Library(bytes, options));
    } else if (name == "allocate") {
      sides.push_back(Allocate(bytes, options));
    } else {
      Fail("--order: of plain, library, allocate");
    }
    std::printf("%-8s %.1f GB ready in %.2f s (%.2f GB/s) %s\n", sides.back().name.c_str(),
                bytes / 1e9, sides.back().ready_s, bytes / 1e9 / sides.back().ready_s,
                sides.back().ok ? "ok" : "WRONG");
    std::fflush(stdout);
  }
  Json summary = Json::Object();
  // Against the plain registration: the library registering the caller's memory, and the
  // library allocating its own (the "_allocated" keys).
  double plain_s = 0;
  for (const Side& s : sides) {
    if (s.name == "plain") plain_s = s.ready_s;
  }
  const std::string size = std::to_string(static_cast<int64_t>(gib + 0.5)) + "gb";
  if (plain_s > 0) summary.Add("host_pool_ready_plain_gb_per_s", bytes / 1e9 / plain_s);
  for (const Side& s : sides) {
    if (s.name == "plain" || plain_s <= 0) continue;
    const std::string suffix = s.name == "allocate" ? "_allocated" : "";
    summary.Add("host_pool_ready_speedup_" + size + suffix, plain_s / s.ready_s)
        .Add("host_pool_ready_gb_per_s" + suffix, bytes / 1e9 / s.ready_s);
  }
  Json results = Json::Array();
  for (const Side& s : sides) {
    results.Push(Json::Object().Add("side", s.name).Add("ready_s", s.ready_s).Add("ok", s.ok));
  }
  Json root = Json::Object();
  root.Add("benchmark", "host_ready_bench")
      .Add("bytes", static_cast<int64_t>(bytes))
      .Add("chunk_bytes", static_cast<int64_t>(options.chunk_bytes))
      .Add("results", results)
      .Add("summary", summary);
  const std::string json = flags.Str("json");
  if (!json.empty()) WriteFile(json, root.str() + "\n");
  for (const Side& s : sides) {
    if (!s.ok) return 1;
  }
  return 0;
}
