// The CPU reference backend: ordinary memory stands for both host and device memory, and every
// operation completes before it returns.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/text.h"
#include "cpu/reference_ops.h"
#include "sparsekv/backend.h"
#include "sparsekv/capacity.h"

namespace sparsekv {
namespace {

using Clock = std::chrono::steady_clock;

// The "device" allocations of every CPU backend of the process and their sizes: what ImportDevice
// may map. A handle is an address, so one of freed memory is recognised here, never read.
class DeviceAllocations {
 public:
  static DeviceAllocations& Get() {
    static DeviceAllocations* all = new DeviceAllocations();  // never destroyed: used at exit
    return *all;
  }
  void Add(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_[p] = bytes;
  }
  void Remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_.erase(p);
  }
  // 0 if `p` is not the start of a live allocation.
  size_t Bytes(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = bytes_.find(p);
    return it == bytes_.end() ? 0 : it->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<const void*, size_t> bytes_;
};

class CpuBackend final : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string name() const override { return "cpu"; }

  StatusOr<void*> AllocateHost(size_t bytes) override { return Allocate(bytes); }
  void FreeHost(void* ptr) override { std::free(ptr); }
  Status RegisterHost(void*, size_t) override { return Status::Ok(); }
  void UnregisterHost(void*) override {}
  StatusOr<void*> AllocateDevice(size_t bytes) override {
    SPARSEKV_ASSIGN_OR_RETURN(void* p, Allocate(bytes));
    DeviceAllocations::Get().Add(p, bytes == 0 ? 1 : bytes);
    return p;
  }
  void FreeDevice(void* ptr) override {
    DeviceAllocations::Get().Remove(ptr);
    std::free(ptr);
  }
  // Its device memory is host memory.
  StatusOr<int64_t> FreeDeviceBytes() override { return SystemCapacity().AvailableHostBytes(); }

  Status CopyAsync(void* dst, const void* src, size_t bytes, StreamHandle) override {
    if (bytes != 0) std::memmove(dst, src, bytes);
    return Status::Ok();
  }
  Status MemsetAsync(void* dst, int value, size_t bytes, StreamHandle) override {
    if (bytes != 0) std::memset(dst, value, bytes);
    return Status::Ok();
  }
  Status Synchronize(StreamHandle) override { return Status::Ok(); }

  StreamHandle SideStream() override { return nullptr; }
  Status Fork(StreamHandle) override { return Status::Ok(); }
  Status Join(StreamHandle) override { return Status::Ok(); }

  // Every operation completes before it returns: a stream is only a distinct handle, and an
  // event the host's clock at its last record.
  StatusOr<StreamHandle> CreateStream() override { return new char; }
  void DestroyStream(StreamHandle stream) override { delete static_cast<char*>(stream); }
  StatusOr<EventHandle> CreateEvent(bool) override { return new Clock::time_point(); }
  void DestroyEvent(EventHandle event) override { delete static_cast<Clock::time_point*>(event); }
  Status RecordEvent(EventHandle event, StreamHandle) override {
    *static_cast<Clock::time_point*>(event) = Clock::now();
    return Status::Ok();
  }
  Status WaitEvent(StreamHandle, EventHandle) override { return Status::Ok(); }
  StatusOr<double> ElapsedSeconds(EventHandle start, EventHandle end) override {
    return std::chrono::duration<double>(*static_cast<Clock::time_point*>(end) -
                                         *static_cast<Clock::time_point*>(start))
        .count();
  }
  StatusOr<bool> IsCapturing(StreamHandle) override { return false; }

  Status IndexCopy(const IndexCopyView& view, StreamHandle) override {
    reference::IndexCopy(view);
    return Status::Ok();
  }
  Status IndexCopyPair(const IndexCopyPairView& view, StreamHandle) override {
    reference::IndexCopyPair(view);
    return Status::Ok();
  }
  Status Resolve(const ResolveView& view, int32_t, StreamHandle) override {
    reference::Resolve(view);
    return Status::Ok();
  }
  Status Assemble(const AssembleView& view, int32_t, StreamHandle) override {
    reference::Assemble(view);
    return Status::Ok();
  }
  Status RouteRows(const RouteRowsView& view, StreamHandle) override {
    if (view.places < 1 || view.places > kMaxRoutePlaces || view.page_rows < 1) {
      return InvalidArgument("RouteRows: places outside [1, kMaxRoutePlaces] or page_rows < 1");
    }
    reference::RouteRows(view);
    return Status::Ok();
  }
  Status DenseAppend(const DenseAppendView& view, int32_t max_batch, StreamHandle) override {
    if (!DenseAppendShapeOk(view)) {
      return InvalidArgument(
          "DenseAppend: entry_tokens < 1, page_rows < 1, pages_per_row < 0, row_bytes < 1, "
          "row_stride < row_bytes, or window rows with raw_window < 1");
    }
    reference::DenseAppend(view, max_batch);
    return Status::Ok();
  }

  // "Device" memory is ordinary memory of this process: its handle is its address, and only this
  // process may import it.
  StatusOr<std::string> ExportDevice(void* ptr) override {
    return "cpu " + std::to_string(getpid()) + " " +
           std::to_string(reinterpret_cast<uintptr_t>(ptr));
  }
  StatusOr<void*> ImportDevice(std::string_view handle) override {
    const std::vector<std::string_view> words = text::Words(handle);
    long pid = 0;
    uintptr_t address = 0;
    if (words.size() != 3 || words[0] != "cpu" || !text::ParseNumber(words[1], &pid) ||
        !text::ParseNumber(words[2], &address)) {
      return InvalidArgument("ImportDevice: not a handle of the cpu backend");
    }
    if (pid != getpid()) {
      return Unavailable("ImportDevice: the cpu backend shares device memory within one process");
    }
    void* ptr = reinterpret_cast<void*>(address);
    if (DeviceAllocations::Get().Bytes(ptr) == 0) {
      return NotFound("ImportDevice: no device allocation of this process at " +
                      std::string(words[2]) + " (freed, or not a handle ExportDevice wrote)");
    }
    return ptr;
  }
  StatusOr<size_t> ImportedBytes(const void* ptr) override {
    const size_t bytes = DeviceAllocations::Get().Bytes(ptr);
    if (bytes == 0) return NotFound("ImportedBytes: no device allocation at that address");
    return bytes;
  }
  void CloseImported(void*) override {}

 private:
  static StatusOr<void*> Allocate(size_t bytes) {
    // 64-byte alignment, like device allocations, so that row offsets keep their alignment.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) return ResourceExhausted("cpu backend: out of memory");
    return p;
  }
};

}  // namespace

std::shared_ptr<Backend> CreateCpuBackend() { return std::make_shared<CpuBackend>(); }

}  // namespace sparsekv
