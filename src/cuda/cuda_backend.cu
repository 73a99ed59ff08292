// The CUDA backend: pinned, device-mapped host memory for the KV pool, HBM for the hot cache and
// the tables, and the kernels of kernels.h as operators.
//
// Every CUDA error becomes Status Internal naming the call; a shape the kernels do not cover
// becomes InvalidArgument. Operators only enqueue: they never allocate or synchronise, so a
// sequence of them can be captured into a CUDA graph.
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/text.h"
#include "cuda/kernels.h"
#include "cuda_common/cuda_check.h"
#include "sparsekv/backend.h"
#include "sparsekv/host_memory.h"

namespace sparsekv {
namespace {

// Host allocations at least this large are backed by 2 MB pages where the kernel allows, which
// keeps the GPU's translation of a large pool cheap (gathers at large spans are limited by
// address translation: docs/workload-shapes.md, docs/index-copy.md).
constexpr size_t kHugePage = size_t{2} << 20;

cudaStream_t ToCuda(StreamHandle stream) { return static_cast<cudaStream_t>(stream); }

using cuda_common::CudaError;
using cuda_common::DeviceGuard;

// The device allocations of every CUDA backend of the process, with their size and device: a
// handle of this process names its allocation by address, so one of freed memory is recognised
// here, on the host, and never read (the runtime would take an unknown address for host memory).
class DeviceAllocations {
 public:
  struct Allocation {
    size_t bytes = 0;  // 0: none
    int device = -1;
  };
  static DeviceAllocations& Get() {
    static DeviceAllocations* all = new DeviceAllocations();  // never destroyed: used at exit
    return *all;
  }
  void Add(const void* p, Allocation a) {
    std::lock_guard<std::mutex> lock(mu_);
    allocations_[p] = a;
  }
  void Remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    allocations_.erase(p);
  }
  Allocation Find(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(p);
    return it == allocations_.end() ? Allocation{} : it->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<const void*, Allocation> allocations_;
};

class CudaBackend final : public Backend {
 public:
  static StatusOr<std::shared_ptr<Backend>> Create(int device, HostMemoryKind host_memory,
                                                   const HostMemoryOptions& preparation) {
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaDeviceProp prop{};
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
    char bus_id[32] = {};
    const int32_t numa_node = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) == cudaSuccess
                                  ? NumaNodeOfPciDevice(bus_id)
                                  : -1;
    auto backend = std::shared_ptr<CudaBackend>(
        new CudaBackend(device, "cuda:" + std::to_string(device) + " " + prop.name, host_memory,
                        preparation, numa_node));
    SPARSEKV_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&backend->side_stream_, cudaStreamNonBlocking));
    SPARSEKV_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&backend->fork_event_, cudaEventDisableTiming));
    SPARSEKV_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&backend->join_event_, cudaEventDisableTiming));
    return std::shared_ptr<Backend>(std::move(backend));
  }

  ~CudaBackend() override {
    DeviceGuard guard(device_);
    if (join_event_ != nullptr) cudaEventDestroy(join_event_);
    if (fork_event_ != nullptr) cudaEventDestroy(fork_event_);
    if (side_stream_ != nullptr) cudaStreamDestroy(side_stream_);
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string name() const override { return name_; }

  // Large blocks: huge-page-backed anonymous memory, registered (pinned, mapped), as
  // host_memory_ asks (see HostMemoryKind). Small blocks: cudaHostAlloc.
  StatusOr<void*> AllocateHost(size_t bytes) override {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    HostBlock block{HostBlock::kHostAlloc, 0};
    const bool large = bytes >= kHugePage;
    const size_t length = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    const bool automatic = host_memory_ == HostMemoryKind::kAuto;
    std::shared_ptr<HostMemory> prepared;
    if (large && (automatic || host_memory_ == HostMemoryKind::kHugeTlb)) {
      StatusOr<std::unique_ptr<HostMemory>> huge = PrepareHost(length, HostMemory::Pages::kHugeTlb);
      if (huge.ok()) {
        prepared = std::move(*huge);
      } else if (!automatic) {
        return Status(
            huge.status().code(),
            "no " + std::to_string(length >> 20) +
                " MB of reserved huge pages (vm.nr_hugepages) to pin: " + huge.status().message());
      }
    }
    if (large && prepared == nullptr &&
        (automatic || host_memory_ == HostMemoryKind::kTransparentHugePages)) {
      StatusOr<std::unique_ptr<HostMemory>> thp = PrepareHost(length, HostMemory::Pages::kOrdinary);
      if (thp.ok()) {
        prepared = std::move(*thp);
      } else if (!automatic) {
        return Status(thp.status().code(),
                      "could not map and register " + std::to_string(length) +
                          " bytes of anonymous memory: " + thp.status().message());
      }
    }
    if (prepared != nullptr) ptr = prepared->data();
    if (large && host_memory_ == HostMemoryKind::kCudaVmm) {
      StatusOr<HostBlock> vmm = MapVmm(length, &ptr);
      if (!vmm.ok()) return vmm.status();
      block = *vmm;
    } else if (prepared != nullptr) {
      block = {HostBlock::kRegistered, length, 0, std::move(prepared)};
    } else {
      if (cudaError_t err = cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes,
                                          cudaHostAllocMapped | cudaHostAllocPortable);
          err != cudaSuccess) {
        cudaGetLastError();
        return ResourceExhausted("cudaHostAlloc of " + std::to_string(bytes) +
                                 " bytes: " + cudaGetErrorString(err));
      }
    }
    // The kernels address host memory by its host pointer (UVA); make sure that holds. (A VMM
    // mapping is one address for both by construction.)
    void* device_ptr = ptr;
    const cudaError_t err =
        block.kind == HostBlock::kVmm ? cudaSuccess : cudaHostGetDevicePointer(&device_ptr, ptr, 0);
    if (err != cudaSuccess || device_ptr != ptr) {
      Release(ptr, block);
      return err != cudaSuccess
                 ? CudaError(err, "cudaHostGetDevicePointer")
                 : Internal("host memory is mapped at a different device address (no UVA)");
    }
    std::lock_guard<std::mutex> lock(host_mu_);
    if (block.memory != nullptr) RememberChunks(block.memory->registration());
    host_blocks_.emplace(ptr, block);
    return ptr;
  }

  void FreeHost(void* ptr) override {
    if (ptr == nullptr) return;
    HostBlock block;
    {
      std::lock_guard<std::mutex> lock(host_mu_);
      auto it = host_blocks_.find(ptr);
      if (it == host_blocks_.end()) return;
      block = it->second;
      host_blocks_.erase(it);
      if (block.memory != nullptr) ForgetChunks(block.memory->registration());
    }
    DeviceGuard guard(device_);
    Release(ptr, block);
  }

  // In chunks of at most preparation_.chunk_bytes, populated in parallel (host_memory.h); each
  // call is one registration, undone by UnregisterHost of the same pointer.
  Status RegisterHost(void* ptr, size_t bytes) override {
    SPARSEKV_ASSIGN_OR_RETURN(std::unique_ptr<HostRegistration> registration,
                              RegisterHostRange(ptr, bytes, preparation_, ChunkRegistrar()));
    std::lock_guard<std::mutex> lock(host_mu_);
    RememberChunks(*registration);
    registrations_[ptr] = std::move(registration);
    return Status::Ok();
  }
  void UnregisterHost(void* ptr) override {
    std::unique_ptr<HostRegistration> registration;
    {
      std::lock_guard<std::mutex> lock(host_mu_);
      auto it = registrations_.find(ptr);
      if (it == registrations_.end()) return;
      registration = std::move(it->second);
      registrations_.erase(it);
      ForgetChunks(*registration);
    }
    registration->Release();  // every chunk, in parallel
  }
  int32_t HostNumaNode() const override { return numa_node_; }

  StatusOr<void*> AllocateDevice(size_t bytes) override {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    if (cudaError_t err = cudaMalloc(&ptr, bytes == 0 ? 1 : bytes); err != cudaSuccess) {
      cudaGetLastError();
      return ResourceExhausted("cudaMalloc of " + std::to_string(bytes) +
                               " bytes: " + cudaGetErrorString(err));
    }
    DeviceAllocations::Get().Add(ptr, {bytes == 0 ? 1 : bytes, device_});
    return ptr;
  }

  void FreeDevice(void* ptr) override {
    if (ptr == nullptr) return;
    DeviceAllocations::Get().Remove(ptr);
    DeviceGuard guard(device_);
    cudaFree(ptr);
  }

  StatusOr<int64_t> FreeDeviceBytes() override {
    DeviceGuard guard(device_);
    size_t free = 0, total = 0;
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free);
  }

  // One cudaMemcpyAsync may not cross from one registration into the next, so a copy that
  // crosses a chunk boundary of memory registered in chunks (on either side) is enqueued as one
  // copy per piece: to the caller it is one range, as for a kernel.
  Status CopyAsync(void* dst, const void* src, size_t bytes, StreamHandle stream) override {
    if (bytes == 0) return Status::Ok();
    DeviceGuard guard(device_);
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    while (bytes > 0) {
      const size_t n = std::min({bytes, ChunkRoom(s), ChunkRoom(d)});
      SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, s, n, cudaMemcpyDefault, ToCuda(stream)));
      d += n;
      s += n;
      bytes -= n;
    }
    return Status::Ok();
  }

  Status MemsetAsync(void* dst, int value, size_t bytes, StreamHandle stream) override {
    if (bytes == 0) return Status::Ok();
    DeviceGuard guard(device_);
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, value, bytes, ToCuda(stream)));
    return Status::Ok();
  }

  Status Synchronize(StreamHandle stream) override {
    DeviceGuard guard(device_);
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ToCuda(stream)));
    return Status::Ok();
  }

  StreamHandle SideStream() override { return side_stream_; }

  // The record/wait pairs share one event each, so concurrent Forks (or Joins) are serialised.
  Status Fork(StreamHandle main) override {
    DeviceGuard guard(device_);
    std::lock_guard<std::mutex> lock(fork_join_mu_);
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_event_, ToCuda(main)));
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_stream_, fork_event_, 0));
    return Status::Ok();
  }

  Status Join(StreamHandle main) override {
    DeviceGuard guard(device_);
    std::lock_guard<std::mutex> lock(fork_join_mu_);
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_event_, side_stream_));
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(ToCuda(main), join_event_, 0));
    return Status::Ok();
  }

  StatusOr<StreamHandle> CreateStream() override {
    DeviceGuard guard(device_);
    cudaStream_t stream = nullptr;
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return static_cast<StreamHandle>(stream);
  }
  void DestroyStream(StreamHandle stream) override {
    DeviceGuard guard(device_);
    cudaStreamDestroy(ToCuda(stream));
  }
  StatusOr<EventHandle> CreateEvent(bool timing) override {
    DeviceGuard guard(device_);
    cudaEvent_t event = nullptr;
    SPARSEKV_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
    return static_cast<EventHandle>(event);
  }
  void DestroyEvent(EventHandle event) override {
    DeviceGuard guard(device_);
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  Status RecordEvent(EventHandle event, StreamHandle stream) override {
    DeviceGuard guard(device_);
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(event), ToCuda(stream)));
    return Status::Ok();
  }
  Status WaitEvent(StreamHandle stream, EventHandle event) override {
    DeviceGuard guard(device_);
    SPARSEKV_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(ToCuda(stream), static_cast<cudaEvent_t>(event), 0));
    return Status::Ok();
  }
  StatusOr<double> ElapsedSeconds(EventHandle start, EventHandle end) override {
    DeviceGuard guard(device_);
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
    float ms = 0;
    SPARSEKV_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
    return ms * 1e-3;
  }
  StatusOr<bool> IsCapturing(StreamHandle stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(ToCuda(stream), &status));
    return status != cudaStreamCaptureStatusNone;
  }
  Status CheckStream(StreamHandle stream) override {
    if (stream == nullptr) return Status::Ok();
    int device = -1;
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(ToCuda(stream), &device));
    if (device != device_) {
      return InvalidArgument("a stream of device " + std::to_string(device) +
                             " for the CUDA backend of device " + std::to_string(device_));
    }
    return Status::Ok();
  }

  Status IndexCopy(const IndexCopyView& view, StreamHandle stream) override {
    DeviceGuard guard(device_);
    return LaunchStatus(LaunchIndexCopy(view, ToCuda(stream)), "LaunchIndexCopy", [&] {
      return "capacity=" + std::to_string(view.capacity) +
             " row_bytes=" + std::to_string(view.row_bytes) +
             " src_stride=" + std::to_string(view.src_stride) +
             " dst_stride=" + std::to_string(view.dst_stride);
    });
  }

  Status IndexCopyPair(const IndexCopyPairView& view, StreamHandle stream) override {
    DeviceGuard guard(device_);
    return LaunchStatus(LaunchIndexCopyPair(view, ToCuda(stream)), "LaunchIndexCopyPair", [&] {
      std::string shape;
      for (const IndexCopyView* v : {&view.first, &view.second}) {
        shape += std::string(shape.empty() ? "" : "; ") +
                 "capacity=" + std::to_string(v->capacity) +
                 " row_bytes=" + std::to_string(v->row_bytes) +
                 " src_stride=" + std::to_string(v->src_stride) +
                 " dst_stride=" + std::to_string(v->dst_stride);
      }
      return shape;
    });
  }

  Status Resolve(const ResolveView& view, int32_t max_batch, StreamHandle stream) override {
    DeviceGuard guard(device_);
    return LaunchStatus(LaunchResolve(view, max_batch, ToCuda(stream)), "LaunchResolve", [&] {
      return "top_k=" + std::to_string(view.top_k) + " (max " + std::to_string(kMaxResolveTopK) +
             ") hot_slots=" + std::to_string(view.hot_slots) + " (max " +
             std::to_string(kMaxResolveHotSlots) + ") window=" + std::to_string(view.window) +
             " topk_stride=" + std::to_string(view.topk_stride) +
             " page_tokens=" + std::to_string(view.page_tokens) +
             " max_batch=" + std::to_string(max_batch);
    });
  }

  Status Assemble(const AssembleView& view, int32_t max_batch, StreamHandle stream) override {
    DeviceGuard guard(device_);
    return LaunchStatus(LaunchAssemble(view, max_batch, ToCuda(stream)), "LaunchAssemble", [&] {
      return "top_k=" + std::to_string(view.top_k) +
             " row_bytes=" + std::to_string(view.row_bytes) +
             " stride=" + std::to_string(view.stride) + " max_batch=" + std::to_string(max_batch);
    });
  }

  Status DenseAppend(const DenseAppendView& view, int32_t max_batch, StreamHandle stream) override {
    DeviceGuard guard(device_);
    return LaunchStatus(LaunchDenseAppend(view, max_batch, ToCuda(stream)), "LaunchDenseAppend",
                        [&] {
                          return "entry_tokens=" + std::to_string(view.entry_tokens) +
                                 " page_rows=" + std::to_string(view.page_rows) +
                                 " pages_per_row=" + std::to_string(view.pages_per_row) +
                                 " raw_window=" + std::to_string(view.raw_window) +
                                 " row_bytes=" + std::to_string(view.row_bytes) +
                                 " row_stride=" + std::to_string(view.row_stride) +
                                 " max_batch=" + std::to_string(max_batch);
                        });
  }

  Status RouteRows(const RouteRowsView& view, StreamHandle stream) override {
    DeviceGuard guard(device_);
    return LaunchStatus(LaunchRouteRows(view, ToCuda(stream)), "LaunchRouteRows", [&] {
      return "places=" + std::to_string(view.places) + " (max " + std::to_string(kMaxRoutePlaces) +
             ") page_rows=" + std::to_string(view.page_rows) +
             " capacity=" + std::to_string(view.capacity) + " pages=" + std::to_string(view.pages);
    });
  }

  // A handle names the exporting process, its device and the allocation's address there (so that
  // the exporter's own process, which CUDA IPC cannot open, maps it directly), then the CUDA IPC
  // handle: "cuda <pid> <device> <address> <64 hex bytes>".
  StatusOr<std::string> ExportDevice(void* ptr) override {
    DeviceGuard guard(device_);
    cudaIpcMemHandle_t handle{};
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, ptr));
    std::string text = "cuda " + std::to_string(getpid()) + " " + std::to_string(device_) + " " +
                       std::to_string(reinterpret_cast<uintptr_t>(ptr)) + " ";
    static constexpr char kHex[] = "0123456789abcdef";
    for (char c : handle.reserved) {
      const auto byte = static_cast<unsigned char>(c);
      text += kHex[byte >> 4];
      text += kHex[byte & 15];
    }
    return text;
  }

  StatusOr<void*> ImportDevice(std::string_view handle) override {
    const std::vector<std::string_view> words = text::Words(handle);
    long pid = 0;
    int device = 0;
    uintptr_t address = 0;
    cudaIpcMemHandle_t ipc{};
    if (words.size() != 5 || words[0] != "cuda" || !text::ParseNumber(words[1], &pid) ||
        !text::ParseNumber(words[2], &device) || !text::ParseNumber(words[3], &address) ||
        words[4].size() != 2 * sizeof(ipc.reserved)) {
      return InvalidArgument("ImportDevice: not a handle of the cuda backend");
    }
    for (size_t i = 0; i < sizeof(ipc.reserved); ++i) {
      unsigned byte = 0;
      if (!text::ParseNumber(words[4].substr(2 * i, 2), &byte, 16)) {
        return InvalidArgument("ImportDevice: not a handle of the cuda backend");
      }
      ipc.reserved[i] = static_cast<char>(byte);
    }
    DeviceGuard guard(device_);
    if (pid == getpid()) {
      // This process's own allocation, on this or another of its devices: known on the host, or
      // gone (freed since the handle was written, or a forged address).
      void* own = reinterpret_cast<void*>(address);
      const DeviceAllocations::Allocation a = DeviceAllocations::Get().Find(own);
      if (a.bytes == 0) {
        return NotFound("ImportDevice: no device allocation of this process at " +
                        std::string(words[3]) + " (freed, or not a handle ExportDevice wrote)");
      }
      if (a.device != device) {
        return InvalidArgument("ImportDevice: the allocation at " + std::string(words[3]) +
                               " is on device " + std::to_string(a.device) + ", not " +
                               std::to_string(device));
      }
      if (device != device_) SPARSEKV_RETURN_IF_ERROR(EnablePeerAccess(device));
      return own;
    }
    void* ptr = nullptr;
    if (cudaError_t err = cudaIpcOpenMemHandle(&ptr, ipc, cudaIpcMemLazyEnablePeerAccess);
        err != cudaSuccess) {
      cudaGetLastError();
      return Unavailable(std::string("ImportDevice: cudaIpcOpenMemHandle: ") +
                         cudaGetErrorString(err));
    }
    // The mapping's extent, from the driver: what a reader of it may read.
    size_t bytes = 0;
    const auto range = LoadAddressRange();
    CUdeviceptr base = 0;
    if (range == nullptr ||
        range(&base, &bytes, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS ||
        base != reinterpret_cast<CUdeviceptr>(ptr)) {
      bytes = 0;
    }
    std::lock_guard<std::mutex> lock(host_mu_);
    Imported& imported = imported_[ptr];  // a handle opened again maps to the same address
    ++imported.refs;
    imported.bytes = bytes;
    return ptr;
  }

  StatusOr<size_t> ImportedBytes(const void* ptr) override {
    {
      std::lock_guard<std::mutex> lock(host_mu_);
      auto it = imported_.find(const_cast<void*>(ptr));
      if (it != imported_.end()) {
        if (it->second.bytes == 0) {
          return Unavailable("ImportedBytes: the driver does not say the mapping's size");
        }
        return it->second.bytes;
      }
    }
    const DeviceAllocations::Allocation a = DeviceAllocations::Get().Find(ptr);
    if (a.bytes == 0) return NotFound("ImportedBytes: no imported allocation at that address");
    return a.bytes;
  }

  void CloseImported(void* ptr) override {
    {
      std::lock_guard<std::mutex> lock(host_mu_);
      auto it = imported_.find(ptr);
      if (it == imported_.end()) return;  // this process's own memory: nothing was mapped
      if (--it->second.refs > 0) return;  // still imported by another caller
      imported_.erase(it);
    }
    DeviceGuard guard(device_);
    if (cudaIpcCloseMemHandle(ptr) != cudaSuccess) cudaGetLastError();
  }

 private:
  // Lets this device read `peer`'s memory (once per pair; already enabled is success).
  Status EnablePeerAccess(int peer) {
    int can = 0;
    SPARSEKV_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device_, peer));
    if (can == 0) {
      return Unavailable("ImportDevice: device " + std::to_string(device_) +
                         " has no peer access to device " + std::to_string(peer));
    }
    const cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
      return Status::Ok();
    }
    SPARSEKV_CUDA_RETURN_IF_ERROR(err);
    return Status::Ok();
  }

  struct HostBlock {
    enum Kind { kHostAlloc, kRegistered, kVmm } kind;
    size_t mapped_bytes;                      // kRegistered, kVmm: the length of the mapping
    CUmemGenericAllocationHandle handle = 0;  // kVmm
    std::shared_ptr<HostMemory> memory;       // kRegistered: mapped and registered in chunks
  };

  // The driver API calls of the VMM path, looked up through the runtime so that the library does
  // not link libcuda (absent on machines without a driver, where the library must still load).
  struct Vmm {
    decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
    decltype(&::cuMemAddressReserve) reserve = nullptr;
    decltype(&::cuMemAddressFree) free = nullptr;
    decltype(&::cuMemCreate) create = nullptr;
    decltype(&::cuMemRelease) release = nullptr;
    decltype(&::cuMemMap) map = nullptr;
    decltype(&::cuMemUnmap) unmap = nullptr;
    decltype(&::cuMemSetAccess) set_access = nullptr;
    decltype(&::cuGetErrorString) error_string = nullptr;
  };

  template <typename Fn>
  static bool LoadDriverCall(const char* name, Fn* fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || p == nullptr) {
      cudaGetLastError();
      return false;
    }
    *fn = reinterpret_cast<Fn>(p);
    return true;
  }

  // cuMemGetAddressRange, looked up as the VMM calls are; null if the driver lacks it.
  static decltype(&::cuMemGetAddressRange) LoadAddressRange() {
    static const decltype(&::cuMemGetAddressRange) range = [] {
      decltype(&::cuMemGetAddressRange) fn = nullptr;
      return LoadDriverCall("cuMemGetAddressRange", &fn) ? fn : nullptr;
    }();
    return range;
  }

  static const Vmm* LoadVmm() {
    static const Vmm* vmm = [] {
      static Vmm v;
      const bool ok =
          LoadDriverCall("cuMemGetAllocationGranularity", &v.granularity) &&
          LoadDriverCall("cuMemAddressReserve", &v.reserve) &&
          LoadDriverCall("cuMemAddressFree", &v.free) && LoadDriverCall("cuMemCreate", &v.create) &&
          LoadDriverCall("cuMemRelease", &v.release) && LoadDriverCall("cuMemMap", &v.map) &&
          LoadDriverCall("cuMemUnmap", &v.unmap) &&
          LoadDriverCall("cuMemSetAccess", &v.set_access) &&
          LoadDriverCall("cuGetErrorString", &v.error_string);
      return ok ? &v : nullptr;
    }();
    return vmm;
  }

  // Pinned host memory from the driver's virtual memory management: one physical allocation,
  // mapped at a reserved address range with read-write access for the device and the CPU.
  StatusOr<HostBlock> MapVmm(size_t length, void** ptr) const {
    const Vmm* d = LoadVmm();
    if (d == nullptr) return Unavailable("the driver's virtual memory management is unavailable");
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = 0;
    size_t granularity = 0;
    auto fail = [d](CUresult r, const char* call) {
      const char* text = nullptr;
      d->error_string(r, &text);
      return Internal(std::string(call) + ": " + (text != nullptr ? text : "unknown error"));
    };
    if (CUresult r = d->granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
        r != CUDA_SUCCESS) {
      return fail(r, "cuMemGetAllocationGranularity");
    }
    const size_t size = (length + granularity - 1) / granularity * granularity;
    HostBlock block{HostBlock::kVmm, size, 0};
    CUdeviceptr va = 0;
    if (CUresult r = d->reserve(&va, size, granularity, 0, 0); r != CUDA_SUCCESS) {
      return fail(r, "cuMemAddressReserve");
    }
    if (CUresult r = d->create(&block.handle, size, &prop, 0); r != CUDA_SUCCESS) {
      d->free(va, size);
      return fail(r, "cuMemCreate (host)");
    }
    CUmemAccessDesc access[2]{};
    access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[0].location.id = device_;
    access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    access[1].location.id = 0;
    access[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = d->map(va, size, 0, block.handle, 0);
    if (r == CUDA_SUCCESS) r = d->set_access(va, size, access, 2);
    if (r != CUDA_SUCCESS) {
      d->unmap(va, size);
      d->release(block.handle);
      d->free(va, size);
      return fail(r, "cuMemMap/cuMemSetAccess (host)");
    }
    *ptr = reinterpret_cast<void*>(va);
    return block;
  }

  CudaBackend(int device, std::string name, HostMemoryKind host_memory,
              const HostMemoryOptions& preparation, int32_t numa_node)
      : device_(device),
        name_(std::move(name)),
        host_memory_(host_memory),
        preparation_(preparation),
        numa_node_(numa_node) {}

  // The chunks of memory registered in chunks, by their first byte (host_mu_ held).
  void RememberChunks(const HostRegistration& registration) {
    for (const HostChunk& chunk : registration.chunks()) {
      const auto begin = reinterpret_cast<uintptr_t>(registration.data() + chunk.offset);
      chunk_ends_[begin] = begin + chunk.bytes;
    }
  }
  void ForgetChunks(const HostRegistration& registration) {
    for (const HostChunk& chunk : registration.chunks()) {
      chunk_ends_.erase(reinterpret_cast<uintptr_t>(registration.data() + chunk.offset));
    }
  }
  // Bytes from p to the end of the chunk that holds it, or the most a size can be if no chunk
  // does.
  size_t ChunkRoom(const void* p) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(host_mu_);
    auto it = chunk_ends_.upper_bound(at);
    if (it == chunk_ends_.begin()) return std::numeric_limits<size_t>::max();
    --it;
    return at < it->second ? it->second - at : std::numeric_limits<size_t>::max();
  }

  // One chunk's registration as the operators need it: pinned, mapped for the device at its host
  // address (UVA), portable to every context. Called from host_memory's worker threads, so each
  // call makes this backend's device current first.
  HostRegistrar ChunkRegistrar() const {
    const int device = device_;
    HostRegistrar registrar;
    registrar.register_chunk = [device](void* ptr, size_t bytes) -> Status {
      DeviceGuard guard(device);
      SPARSEKV_CUDA_RETURN_IF_ERROR(
          cudaHostRegister(ptr, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
      // The kernels address host memory by its host pointer (UVA): true of every chunk.
      void* device_ptr = nullptr;
      const cudaError_t err = cudaHostGetDevicePointer(&device_ptr, ptr, 0);
      if (err != cudaSuccess || device_ptr != ptr) {
        cudaGetLastError();
        cudaHostUnregister(ptr);
        return err != cudaSuccess
                   ? CudaError(err, "cudaHostGetDevicePointer")
                   : Internal("host memory is mapped at a different device address (no UVA)");
      }
      return Status::Ok();
    };
    registrar.unregister_chunk = [device](void* ptr) {
      DeviceGuard guard(device);
      if (cudaHostUnregister(ptr) != cudaSuccess) cudaGetLastError();
    };
    registrar.numa_node = numa_node_;
    return registrar;
  }

  // `length` bytes (a multiple of kHugePage) at a kHugePage-aligned address of the pages asked
  // for, populated and registered in chunks (host_memory.h).
  StatusOr<std::unique_ptr<HostMemory>> PrepareHost(size_t length, HostMemory::Pages pages) const {
    HostMemoryOptions options = preparation_;
    options.huge_pages = true;  // host_memory_ chose the pages; THP is asked for on ordinary ones
    return HostMemory::Allocate(length, pages, options, ChunkRegistrar());
  }

  static void Release(void* ptr, const HostBlock& block) {
    if (block.kind == HostBlock::kVmm) {
      const Vmm* d = LoadVmm();  // non-null: the block was made through it
      const auto va = reinterpret_cast<CUdeviceptr>(ptr);
      d->unmap(va, block.mapped_bytes);
      d->release(block.handle);
      d->free(va, block.mapped_bytes);
    } else if (block.kind == HostBlock::kRegistered) {
      // block.memory (shared with the caller's copy) unregisters and unmaps in parallel chunks
      // when its last reference goes.
    } else {
      cudaFreeHost(ptr);
    }
  }

  // kUnsupported -> InvalidArgument with the shape (from `describe`); other errors -> Internal.
  template <typename Describe>
  static Status LaunchStatus(cudaError_t err, const char* launcher, Describe describe) {
    if (err == cudaSuccess) return Status::Ok();
    if (err == kUnsupported) {
      return InvalidArgument(std::string(launcher) + ": unsupported shape: " + describe());
    }
    return CudaError(err, launcher);
  }

  const int device_;
  const std::string name_;
  const HostMemoryKind host_memory_;
  const HostMemoryOptions preparation_;
  const int32_t numa_node_;  // of the GPU's PCI device; -1 if the machine does not say
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t fork_event_ = nullptr;
  cudaEvent_t join_event_ = nullptr;
  std::mutex fork_join_mu_;
  std::mutex host_mu_;
  std::unordered_map<void*, HostBlock> host_blocks_;
  std::unordered_map<void*, std::unique_ptr<HostRegistration>> registrations_;  // RegisterHost
  std::map<uintptr_t, uintptr_t> chunk_ends_;  // chunk's first byte -> one past its last
  // ImportDevice's mappings of other processes' memory: the imports not yet closed, and the
  // mapping's size (0 if the driver did not say).
  struct Imported {
    int refs = 0;
    size_t bytes = 0;
  };
  std::unordered_map<void*, Imported> imported_;
};

}  // namespace

StatusOr<std::shared_ptr<Backend>> CreateCudaBackend(int device, HostMemoryKind host_memory) {
  return CreateCudaBackend(device, host_memory, HostMemoryOptions{});
}

StatusOr<std::shared_ptr<Backend>> CreateCudaBackend(int device, HostMemoryKind host_memory,
                                                     const HostMemoryOptions& preparation) {
  // Without a GPU the runtime reports either no device or, when no NVIDIA driver is installed
  // at all (driver version 0), an "insufficient" driver: both mean that there is no device.
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    cudaGetLastError();
    int driver = 0;
    if (err == cudaErrorNoDevice || (err == cudaErrorInsufficientDriver &&
                                     cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0)) {
      return Unavailable(
          std::string("no CUDA device is present (") +
          (err == cudaErrorNoDevice ? "the driver sees no GPU" : "no NVIDIA driver is installed") +
          "; use the CPU backend)");
    }
  }
  SPARSEKV_RETURN_IF_ERROR(cuda_common::CheckDevice(device));
  return CudaBackend::Create(device, host_memory, preparation);
}

bool CudaBackendCompiled() { return true; }

}  // namespace sparsekv
