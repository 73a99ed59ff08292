// What the files of the sparsekv._core binding share: Status to exception, request ids, backends,
// tensor views and stream arguments, and the registration function of each file.
//
// Tensors cross the boundary by pointer and shape, never copied. An argument may be any object
// that exposes __array_interface__ (numpy), __dlpack__ (torch on CPU or CUDA, numpy, CuPy) or
// __cuda_array_interface__ (torch, CuPy, Numba), tried in that order. Every tensor is checked
// before it reaches the library: dtype (TypeError), shape, C-contiguity and device (ValueError).
// A non-OK Status becomes the sparsekv.SparseKVError subclass of its code, with its message.
//
// Streams: every call that enqueues work takes `stream`: None, an int (a cudaStream_t) or an
// object with a .cuda_stream attribute (torch.cuda.Stream). None means torch's current stream on
// the backend's device when the backend is CUDA and torch is importable, else the default stream.
#ifndef SPARSEKV_PYTHON_SRC_BINDING_UTIL_H_
#define SPARSEKV_PYTHON_SRC_BINDING_UTIL_H_

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/status.h"
#include "sparsekv/types.h"

namespace py = pybind11;

namespace sparsekv {

// ---- DLPack ----

// The DLPack ABI (v0.x, the "dltensor" capsule every producer hands out by default).
namespace dlpack {
struct DLDevice {
  int32_t device_type;  // 1 CPU, 2 CUDA, 3 CUDA pinned host, 13 CUDA managed
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;
}  // namespace dlpack

// A "dltensor" capsule of C-contiguous uint8 `shape` at `data` on DLPack device
// (`device_type`, `device_id`): what an object's __dlpack__ returns. The consumer's tensor keeps
// `owner` alive (a reference held until the consumer's deleter runs).
py::capsule ExportDLPack(const void* data, std::vector<int64_t> shape, int32_t device_type,
                         int32_t device_id, py::object owner);

// ---- Registration, one function per file, called in this order by the module ----

void RegisterErrors(py::module_& m);      // binding.cc
void RegisterOptions(py::module_& m);     // binding_options.cc
void RegisterStats(py::module_& m);       // binding_stats.cc
void RegisterBackends(py::module_& m);    // binding_manager.cc: Backend, the backend factories
void RegisterNodePool(py::module_& m);    // binding_node_pool.cc: NodePool
void RegisterPeerRegion(py::module_& m);  // binding_peer.cc: PeerRegion
void RegisterManager(py::module_& m);     // binding_manager.cc: HotLayer, SparseKVCacheManager
void RegisterSchedule(py::module_& m);    // binding_schedule.cc: StepChoice, StepSchedule
// binding_attention.cc: SparseMLAAttention, WeightStreamProxy, LayerTopKGenerator
void RegisterAttention(py::module_& m);

// ---- Errors ----

// One Python exception class per StatusCode, all subclasses of sparsekv.SparseKVError; each also
// derives from the builtin a caller would expect (ValueError for bad arguments, ...). Filled by
// RegisterErrors.
struct ErrorClasses {
  py::object base;
  std::array<py::object, static_cast<size_t>(StatusCode::kUnimplemented) + 1> by_code;
};

ErrorClasses& Errors();

// Raises the exception class of status.code() with status.message().
[[noreturn]] void Raise(const Status& status);

[[noreturn]] void RaiseInvalidRequestId(const std::string& got);

inline void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Check(StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return std::move(value).value();
}

// ---- Request ids ----

// A RequestId argument: any Python int (or object with __index__) in [0, 2**64). Anything else
// raises an error that says so, instead of pybind11's list of overloads.
struct PyRequestId {
  RequestId value = 0;
};

}  // namespace sparsekv

namespace pybind11::detail {
template <>
struct type_caster<sparsekv::PyRequestId> {
  PYBIND11_TYPE_CASTER(sparsekv::PyRequestId, const_name("int"));

  bool load(handle src, bool /*convert*/) {
    if (!src) return false;
    if (PyBool_Check(src.ptr()) || !PyIndex_Check(src.ptr())) {
      throw type_error("request ids are unsigned 64-bit integers, got an object of type " +
                       std::string(str(type::handle_of(src).attr("__name__"))));
    }
    const object index = reinterpret_steal<object>(PyNumber_Index(src.ptr()));
    if (!index) throw error_already_set();
    const unsigned long long id = PyLong_AsUnsignedLongLong(index.ptr());
    if (id == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      sparsekv::RaiseInvalidRequestId(std::string(str(index)));
    }
    value.value = id;
    return true;
  }

  static handle cast(const sparsekv::PyRequestId& id, return_value_policy, handle) {
    return PyLong_FromUnsignedLongLong(id.value);
  }
};
}  // namespace pybind11::detail

namespace sparsekv {

// ---- Backends ----

// A backend and the CUDA device it drives (-1 for the CPU backend).
struct PyBackend {
  std::shared_ptr<Backend> backend;
  int device = -1;
  bool is_cuda() const { return backend->kind() == BackendKind::kCuda; }
};

// ---- Tensors ----

// Where a tensor's memory is: host memory (CPU backend, or a source of IngestPrompt) or the
// memory of one CUDA device.
enum class Memory { kHost, kCuda };

// A borrowed view of a caller's tensor. The caller's object owns the memory and must outlive the
// work enqueued on it.
struct TensorArg {
  void* data = nullptr;
  std::vector<int64_t> shape;
  char kind = 'V';  // numpy-style: 'i' signed, 'u' unsigned, 'f' float, 'b' bool, 'c', 'V' other
  int64_t itemsize = 0;
  Memory memory = Memory::kHost;
  int device = -1;  // CUDA device ordinal, -1 for host memory
  bool contiguous = true;
  bool readonly = false;

  std::string ShapeString() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

// What an argument must be. Rows: shape[0] >= min_rows (or == exact_rows when set).
struct TensorRules {
  const char* name;
  bool int32 = false;       // int32 elements; else any dtype, rows measured in bytes
  int64_t row_bytes = 0;    // bytes of shape[row_dims...] per row when !int32
  int row_dims = 1;         // leading dimensions that count rows: 1 ([rows, ...]) or 2
  int64_t second_dim = -1;  // required shape[1] (row_dims == 2 or int32 columns), -1 = any
  int64_t min_second = 0;   // shape[1] >= min_second when second_dim == -1
  int64_t min_rows = 0;
  int64_t exact_rows = -1;
  bool host_ok_on_cuda = false;  // IngestPrompt: host sources are fine for the CUDA backend
  bool output = false;           // written by the library: must not be read-only
};

// Views `obj` as a tensor (by the rules of the file comment), unchecked; TypeError naming `name`
// for an object that is none.
TensorArg ParseTensor(const py::handle& obj, const char* name);
// "host memory" or "cuda:N".
std::string DeviceString(const TensorArg& t);

// Views `obj` as a tensor and checks it against `r` and the memory `backend` works on; raises
// TypeError or ValueError naming r.name otherwise.
TensorArg CheckTensor(const py::handle& obj, const TensorRules& r, const PyBackend& backend);

// ---- Streams ----

// Turns `stream` arguments into StreamHandles by the rules of the file comment above. Remembers
// torch.cuda.current_stream (or that torch is absent) after the first None on a CUDA backend.
class StreamResolver {
 public:
  StreamHandle Resolve(const py::object& stream, const PyBackend& backend);
  // The same for work on CUDA device `cuda_device` (-1: none, as the CPU backend).
  StreamHandle Resolve(const py::object& stream, int cuda_device);

 private:
  std::optional<py::object> torch_current_stream_;  // torch.cuda.current_stream, or None
};

// ---- Managers ----

class SparseKVCacheManager;

// What another file's binding reaches of a sparsekv.SparseKVCacheManager object: the manager, its
// backend and the stream rules of its calls. Valid while the object lives.
struct ManagerRef {
  SparseKVCacheManager* manager = nullptr;
  const PyBackend* backend = nullptr;
  StreamResolver* streams = nullptr;
};

// ManagerRef of `manager` (binding_manager.cc); TypeError if it is not a SparseKVCacheManager.
ManagerRef ManagerOf(const py::handle& manager);

// ---- A step's arguments, as the manager's and the schedule's calls take them ----

struct CacheOptions;

// The ids of a batch.
std::vector<RequestId> RequestIds(const std::vector<PyRequestId>& batch);
// row_stride of `layer`; InvalidArgumentError naming `op` for a layer out of range.
int32_t RowStride(const CacheOptions& o, int32_t layer, const char* op);
// The newest token's rows of `layer`: [>= batch, row_stride] bytes.
TensorArg CheckNewRows(const py::handle& rows, const SparseKVCacheManager& m, int32_t layer,
                       const char* op, const PyBackend& backend);
// Their indexer keys, [>= batch, indexer_key_bytes] bytes; null for None or a manager that keeps
// no keys (which ignores them, as in C++).
const void* CheckNewKeys(const py::handle& keys, const SparseKVCacheManager& m,
                         const PyBackend& backend);
// A top-k: int32 [>= batch, >= top_k].
TensorArg CheckTopK(const py::handle& topk, const char* name, int32_t top_k,
                    const SparseKVCacheManager& m, const PyBackend& backend);
// Slots: int32 [>= batch, top_k], written.
TensorArg CheckSlots(const py::handle& slots, const char* name, const SparseKVCacheManager& m,
                     const PyBackend& backend);

// ---- Node pools ----

// A node pool attached by this process, the backend its rows are registered with, and the stream
// rules of its calls.
struct PyNodePool {
  std::shared_ptr<HostKVPool> pool;
  PyBackend backend;
  StreamResolver streams{};
};

}  // namespace sparsekv

#endif  // SPARSEKV_PYTHON_SRC_BINDING_UTIL_H_
