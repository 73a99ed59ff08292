// Chunked, parallel population and registration of large host ranges (sparsekv/host_memory.h).
//
// The range is cut into chunks (one registration each) and the chunks into slices of at most
// kSlice bytes (one unit of population work). Population threads take slices in address order;
// a chunk whose last slice is populated becomes ready, and the registration threads register
// ready chunks in chunk order. Invariant, under `mu`: registered chunks are a prefix of the ones
// taken for registration, every one of them populated; a failure stops both kinds of thread
// before they take more work, and the chunks registered so far are unregistered.
#include "sparsekv/host_memory.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/text.h"
#include "sparsekv/backend.h"

namespace sparsekv {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
// A slice of population work: small enough for progress and for the threads to share a chunk.
constexpr size_t kSlice = size_t{256} << 20;

using Clock = std::chrono::steady_clock;

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "re");
  if (file == nullptr) return std::nullopt;
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file)) > 0;) text.append(buffer, n);
  std::fclose(file);
  return text;
}

// The calls of libnuma this file uses, loaded at run time: the library needs no libnuma to build
// or to load, and runs unbound without it.
struct Libnuma {
  int (*available)() = nullptr;
  int (*max_node)() = nullptr;
  int (*run_on_node)(int) = nullptr;
  void (*set_preferred)(int) = nullptr;
};

const Libnuma* LoadLibnuma() {
  static const Libnuma* numa = []() -> const Libnuma* {
    void* handle = dlopen("libnuma.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) return nullptr;
    static Libnuma lib;
    lib.available = reinterpret_cast<int (*)()>(dlsym(handle, "numa_available"));
    lib.max_node = reinterpret_cast<int (*)()>(dlsym(handle, "numa_max_node"));
    lib.run_on_node = reinterpret_cast<int (*)(int)>(dlsym(handle, "numa_run_on_node"));
    lib.set_preferred = reinterpret_cast<void (*)(int)>(dlsym(handle, "numa_set_preferred"));
    if (lib.available == nullptr || lib.max_node == nullptr || lib.run_on_node == nullptr ||
        lib.set_preferred == nullptr || lib.available() < 0) {
      return nullptr;
    }
    return &lib;
  }();
  return numa;
}

// Binds the calling thread to `node`'s cores and prefers its memory for the pages it faults in;
// false (nothing changed) without libnuma or for a node that does not exist or has no cores.
bool BindThreadToNode(int32_t node) {
  const Libnuma* numa = LoadLibnuma();
  if (numa == nullptr || node < 0 || node > numa->max_node()) return false;
  if (numa->run_on_node(node) != 0) return false;
  numa->set_preferred(node);
  return true;
}

// Whether the calling thread could be bound to `node` (checked once on a scratch thread, so that
// the answer does not depend on which worker asks).
bool CanBindToNode(int32_t node) {
  bool bound = false;
  std::thread probe([&] { bound = BindThreadToNode(node); });
  probe.join();
  return bound;
}

// Faults in [p, p + bytes) writable without changing a byte; an error names what failed.
Status Populate(std::byte* p, size_t bytes) {
  // madvise wants a page-aligned start; the page holding `p` is mapped as `p` is.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t lead = reinterpret_cast<uintptr_t>(p) % page;
  if (madvise(p - lead, bytes + lead, MADV_POPULATE_WRITE) == 0) return Status::Ok();
  if (errno != EINVAL) {
    return ResourceExhausted(std::string("cannot populate host memory (madvise): ") +
                             std::strerror(errno));
  }
  // A kernel before 5.14: a write access per page that leaves the byte as it was, even if another
  // thread or process writes it at the same time.
  for (size_t offset = 0; offset < bytes; offset += page) {
    __atomic_fetch_or(reinterpret_cast<unsigned char*>(p + offset), 0, __ATOMIC_RELAXED);
  }
  return Status::Ok();
}

// Runs fn(i) for i in [0, n) on up to `threads` threads.
template <typename Fn>
void ParallelFor(size_t n, int32_t threads, Fn fn) {
  const size_t workers = std::min<size_t>(n, static_cast<size_t>(std::max(threads, 1)));
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  pool.reserve(workers);
  for (size_t w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  }
  for (std::thread& t : pool) t.join();
}

int32_t DefaultThreads(int32_t node) {
  const int32_t cores = node >= 0 ? NumaNodeCores(node) : 0;
  if (cores > 0) return cores;
  return static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
}

// Free reserved huge pages of the default size, if it is 2 MB; 0 otherwise.
size_t FreeHugeTlbBytes() {
  const std::optional<std::string> meminfo = ReadSmallFile("/proc/meminfo");
  if (!meminfo) return 0;
  auto field = [&](std::string_view key) -> int64_t {
    const size_t at = meminfo->find(std::string(key) + ":");
    if (at == std::string::npos) return 0;
    std::string_view line = std::string_view(*meminfo).substr(at + key.size() + 1);
    line = line.substr(0, line.find('\n'));
    const std::vector<std::string_view> words = text::Words(line);
    int64_t value = 0;
    return !words.empty() && text::ParseNumber(words[0], &value) ? value : 0;
  };
  if (field("Hugepagesize") != 2048) return 0;
  return static_cast<size_t>(field("HugePages_Free")) * kHugePage;
}

void UnmapInChunks(std::byte* base, size_t bytes, int32_t threads) {
  const std::vector<HostChunk> chunks =
      SplitHostRange(reinterpret_cast<uintptr_t>(base), bytes, size_t{16} << 30, kHugePage);
  ParallelFor(chunks.size(), threads,
              [&](size_t i) { munmap(base + chunks[i].offset, chunks[i].bytes); });
}

}  // namespace

std::vector<HostChunk> SplitHostRange(uintptr_t begin, size_t bytes, size_t chunk_bytes,
                                      size_t alignment) {
  std::vector<HostChunk> chunks;
  if (bytes == 0) return chunks;
  const size_t step = std::max(chunk_bytes / alignment * alignment, alignment);
  // Boundaries at aligned addresses: multiples of `step` from the aligned start below `begin`.
  const uintptr_t origin = begin / alignment * alignment;
  size_t offset = 0;
  for (uintptr_t boundary = origin + step; offset < bytes; boundary += step) {
    const size_t end = std::min(bytes, static_cast<size_t>(boundary - begin));
    chunks.push_back({offset, end - offset});
    offset = end;
  }
  return chunks;
}

HostRegistrar HostRegistrar::Of(Backend& backend) {
  return {[&backend](void* ptr, size_t bytes) { return backend.RegisterHost(ptr, bytes); },
          [&backend](void* ptr) { backend.UnregisterHost(ptr); }, backend.HostNumaNode()};
}

void HostRegistration::Release() {
  if (!registered_) return;
  registered_ = false;
  ParallelFor(chunks_.size(), threads_,
              [&](size_t i) { registrar_.unregister_chunk(base_ + chunks_[i].offset); });
}

StatusOr<std::unique_ptr<HostRegistration>> RegisterHostRange(void* ptr, size_t bytes,
                                                              const HostMemoryOptions& options,
                                                              HostRegistrar registrar) {
  if (ptr == nullptr || bytes == 0) return InvalidArgument("host range: empty");
  if (options.chunk_bytes < kHugePage) {
    return InvalidArgument("host range: chunk_bytes " + std::to_string(options.chunk_bytes) +
                           " is below 2 MB");
  }
  if (options.threads < 0 || options.register_threads < 1) {
    return InvalidArgument("host range: threads must be >= 0 and register_threads >= 1");
  }
  if (!registrar.register_chunk || !registrar.unregister_chunk) {
    return InvalidArgument("host range: the registrar has no functions");
  }
  const Clock::time_point start = Clock::now();
  auto* base = static_cast<std::byte*>(ptr);
  std::unique_ptr<HostRegistration> r(new HostRegistration());
  r->base_ = base;
  r->bytes_ = bytes;
  r->chunks_ =
      SplitHostRange(reinterpret_cast<uintptr_t>(base), bytes, options.chunk_bytes, kHugePage);
  const int32_t node =
      options.numa_node >= 0 ? options.numa_node : std::max<int32_t>(registrar.numa_node, -1);
  r->registrar_ = std::move(registrar);
  r->threads_ = options.threads > 0 ? options.threads : DefaultThreads(node);
  r->placement_ = {r->threads_, node, node >= 0 && CanBindToNode(node)};

  struct Slice {
    size_t chunk, offset, bytes;
  };
  std::vector<Slice> slices;
  std::vector<int32_t> unpopulated(r->chunks_.size(), 0);  // slices left per chunk
  for (size_t c = 0; c < r->chunks_.size(); ++c) {
    const HostChunk& chunk = r->chunks_[c];
    for (size_t at = 0; at < chunk.bytes; at += kSlice) {
      slices.push_back({c, chunk.offset + at, std::min(kSlice, chunk.bytes - at)});
      ++unpopulated[c];
    }
  }

  std::mutex mu;
  std::condition_variable changed;
  HostMemoryProgress progress{.total_bytes = static_cast<int64_t>(bytes),
                              .chunks = static_cast<int32_t>(r->chunks_.size())};
  Status failure;  // the first error
  std::vector<bool> registered(r->chunks_.size(), false);
  size_t next_slice = 0, next_register = 0;
  auto report = [&] {  // REQUIRES: mu held
    progress.elapsed_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (options.progress) options.progress(progress);
  };

  auto populate = [&] {
    if (r->placement_.bound_to_node) BindThreadToNode(node);
    for (;;) {
      Slice s;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure.ok() || next_slice == slices.size()) return;
        s = slices[next_slice++];
      }
      Status st = Populate(base + s.offset, s.bytes);
      std::lock_guard<std::mutex> lock(mu);
      if (!st.ok()) {
        if (failure.ok()) {
          failure = Status(st.code(), "populating chunk " + std::to_string(s.chunk + 1) + " of " +
                                          std::to_string(r->chunks_.size()) + ": " + st.message());
        }
        changed.notify_all();
        return;
      }
      progress.populated_bytes += static_cast<int64_t>(s.bytes);
      --unpopulated[s.chunk];
      report();
      if (unpopulated[s.chunk] == 0) changed.notify_all();
    }
  };
  auto register_chunks = [&] {
    for (;;) {
      size_t c;
      {
        std::unique_lock<std::mutex> lock(mu);
        changed.wait(lock, [&] {
          return !failure.ok() || next_register == r->chunks_.size() ||
                 unpopulated[next_register] == 0;
        });
        if (!failure.ok() || next_register == r->chunks_.size()) return;
        c = next_register++;
      }
      const HostChunk& chunk = r->chunks_[c];
      Status st = r->registrar_.register_chunk(base + chunk.offset, chunk.bytes);
      std::lock_guard<std::mutex> lock(mu);
      if (!st.ok()) {
        if (failure.ok()) {
          failure = Status(st.code(), "registering chunk " + std::to_string(c + 1) + " of " +
                                          std::to_string(r->chunks_.size()) + " (bytes " +
                                          std::to_string(chunk.offset) + " to " +
                                          std::to_string(chunk.offset + chunk.bytes) +
                                          "): " + st.message());
        }
        changed.notify_all();
        return;
      }
      registered[c] = true;
      progress.registered_bytes += static_cast<int64_t>(chunk.bytes);
      ++progress.registered_chunks;
      report();
    }
  };

  std::vector<std::thread> threads;
  const size_t populators = std::min<size_t>(slices.size(), static_cast<size_t>(r->threads_));
  for (size_t i = 0; i < populators; ++i) threads.emplace_back(populate);
  const size_t registrars =
      std::min<size_t>(r->chunks_.size(), static_cast<size_t>(options.register_threads));
  for (size_t i = 0; i < registrars; ++i) threads.emplace_back(register_chunks);
  for (std::thread& t : threads) t.join();

  if (!failure.ok()) {
    ParallelFor(r->chunks_.size(), r->threads_, [&](size_t c) {
      if (registered[c]) r->registrar_.unregister_chunk(base + r->chunks_[c].offset);
    });
    return failure;
  }
  r->registered_ = true;
  r->ready_seconds_ = progress.elapsed_seconds;
  return r;
}

StatusOr<std::unique_ptr<HostMemory>> HostMemory::Allocate(size_t bytes,
                                                           const HostMemoryOptions& options,
                                                           HostRegistrar registrar) {
  const size_t length = (std::max<size_t>(bytes, 1) + kHugePage - 1) / kHugePage * kHugePage;
  if (options.huge_pages && FreeHugeTlbBytes() >= length) {
    StatusOr<std::unique_ptr<HostMemory>> huge =
        Allocate(bytes, Pages::kHugeTlb, options, registrar);
    if (huge.ok()) return huge;
  }
  return Allocate(bytes, Pages::kOrdinary, options, std::move(registrar));
}

StatusOr<std::unique_ptr<HostMemory>> HostMemory::Allocate(size_t bytes, Pages pages,
                                                           const HostMemoryOptions& options,
                                                           HostRegistrar registrar) {
  const size_t length = (std::max<size_t>(bytes, 1) + kHugePage - 1) / kHugePage * kHugePage;
  std::byte* ptr = nullptr;
  if (pages == Pages::kHugeTlb) {
    // hugetlb mappings are 2 MB-aligned by construction.
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p == MAP_FAILED) {
      return ResourceExhausted(
          "cannot map " + std::to_string(length >> 20) +
          " MB of reserved huge pages (vm.nr_hugepages): " + std::strerror(errno));
    }
    ptr = static_cast<std::byte*>(p);
  } else {
    const size_t padded = length + kHugePage;
    void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      return ResourceExhausted("cannot map " + std::to_string(length) +
                               " bytes of anonymous memory: " + std::strerror(errno));
    }
    const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (begin + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > begin) munmap(raw, aligned - begin);
    const uintptr_t end = begin + padded;
    if (end > aligned + length) {
      munmap(reinterpret_cast<void*>(aligned + length), end - aligned - length);
    }
    ptr = reinterpret_cast<std::byte*>(aligned);
    // Advisory: without transparent huge pages the memory still works, with 4 KB pages.
    if (options.huge_pages) madvise(ptr, length, MADV_HUGEPAGE);
  }
  StatusOr<std::unique_ptr<HostRegistration>> registration =
      RegisterHostRange(ptr, length, options, std::move(registrar));
  if (!registration.ok()) {
    UnmapInChunks(ptr, length, options.threads > 0 ? options.threads : DefaultThreads(-1));
    return registration.status();
  }
  return std::unique_ptr<HostMemory>(new HostMemory(std::move(*registration), pages));
}

HostMemory::~HostMemory() {
  std::byte* base = registration_->data();
  const size_t bytes = registration_->bytes();
  const int32_t threads = registration_->placement().threads;
  registration_->Release();
  UnmapInChunks(base, bytes, threads);
}

int32_t NumaNodeCores(int32_t node) {
  if (node < 0) return 0;
  const std::optional<std::string> list =
      ReadSmallFile("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
  if (!list) return 0;
  // "0-15,32-47\n"
  int32_t cores = 0;
  std::string_view rest(*list);
  rest = rest.substr(0, rest.find('\n'));
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view range = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t dash = range.find('-');
    int64_t first = 0, last = 0;
    if (!text::ParseNumber(range.substr(0, dash), &first)) continue;
    last = first;
    if (dash != std::string_view::npos && !text::ParseNumber(range.substr(dash + 1), &last)) {
      continue;
    }
    if (last >= first) cores += static_cast<int32_t>(last - first + 1);
  }
  return cores;
}

int32_t NumaNodeOfPciDevice(const std::string& bus_id) {
  std::string id = bus_id;
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::optional<std::string> text =
      ReadSmallFile("/sys/bus/pci/devices/" + id + "/numa_node");
  int64_t node = -1;
  if (!text || !text::ParseNumber(std::string_view(*text).substr(0, text->find('\n')), &node) ||
      node < 0) {
    return -1;
  }
  return static_cast<int32_t>(node);
}

}  // namespace sparsekv
