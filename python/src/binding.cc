// sparsekv._core: the Python binding of the manager, its options, statistics and backends.
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
//
// Thread safety: a manager is not thread-safe; its methods hold the GIL, which serialises calls.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/manager.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"

#if defined(SPARSEKV_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace py = pybind11;

namespace sparsekv {
namespace {

// ---- Errors ----

// One Python exception class per StatusCode, all subclasses of sparsekv.SparseKVError; each also
// derives from the builtin a caller would expect (ValueError for bad arguments, ...).
struct ErrorClasses {
  py::object base;
  std::array<py::object, static_cast<size_t>(StatusCode::kInternal) + 1> by_code;
};

ErrorClasses& Errors() {
  static ErrorClasses* errors = new ErrorClasses();  // lives as long as the interpreter
  return *errors;
}

[[noreturn]] void Raise(const Status& status) {
  const py::object& cls = Errors().by_code[static_cast<size_t>(status.code())];
  PyErr_SetString(cls.ptr(), status.message().c_str());
  throw py::error_already_set();
}

[[noreturn]] void RaiseInvalidRequestId(const std::string& got) {
  Raise(InvalidArgument("request ids are unsigned 64-bit integers (0 to 2**64 - 1), got " + got));
}

void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Check(StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return std::move(value).value();
}

void RegisterErrors(py::module_& m) {
  ErrorClasses& e = Errors();
  e.base = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "sparsekv.SparseKVError", "Base class of the errors the sparsekv library returns.",
      PyExc_Exception, nullptr));
  m.attr("SparseKVError") = e.base;
  struct Spec {
    StatusCode code;
    const char* name;
    PyObject* builtin;
    const char* doc;
  };
  const Spec specs[] = {
      {StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError,
       "An argument is invalid whatever the state: a bad option, id, layer or shape."},
      {StatusCode::kNotFound, "NotFoundError", PyExc_LookupError,
       "The request (or retained conversation) is unknown or was released."},
      {StatusCode::kAlreadyExists, "AlreadyExistsError", PyExc_ValueError,
       "The id is in use, or the layer was ingested already."},
      {StatusCode::kResourceExhausted, "ResourceExhaustedError", PyExc_RuntimeError,
       "No hot-cache block, host page or pool owner is free (nothing changed)."},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError", PyExc_RuntimeError,
       "The call is valid but not now: a step is open, a request is retracted, ..."},
      {StatusCode::kOutOfRange, "OutOfRangeError", PyExc_ValueError,
       "A length exceeds max_context or the request's reserved length."},
      {StatusCode::kUnavailable, "UnavailableError", PyExc_RuntimeError,
       "A backend, device or peer is not available (e.g. no CUDA device is present)."},
      {StatusCode::kDeadlineExceeded, "DeadlineExceededError", PyExc_TimeoutError,
       "A remote operation did not complete before its deadline."},
      {StatusCode::kInternal, "InternalError", PyExc_RuntimeError,
       "A bug or a failed device call inside the library."},
  };
  for (const Spec& s : specs) {
    const std::string qualified = std::string("sparsekv.") + s.name;
    py::tuple bases = py::make_tuple(e.base, py::handle(s.builtin));
    py::object cls = py::reinterpret_steal<py::object>(
        PyErr_NewExceptionWithDoc(qualified.c_str(), s.doc, bases.ptr(), nullptr));
    m.attr(s.name) = cls;
    e.by_code[static_cast<size_t>(s.code)] = cls;
  }
  // kOk never raises; map it to the base so that the table has no hole.
  e.by_code[static_cast<size_t>(StatusCode::kOk)] = e.base;
}

}  // namespace
}  // namespace sparsekv

// ---- Request ids ----

namespace sparsekv {
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
namespace {

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

// True if `strides` (in bytes; empty = contiguous) describe a C-contiguous layout of `shape`.
bool IsCContiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                   int64_t itemsize) {
  if (strides.empty()) return true;
  int64_t expected = itemsize;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return true;
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

// Parses a numpy typestr such as "<i4" or "|u1" into kind and itemsize.
void ParseTypestr(const std::string& typestr, const char* name, TensorArg& t) {
  if (typestr.size() < 3 || typestr[0] == '>') {
    throw py::type_error(std::string(name) + ": unsupported dtype '" + typestr +
                         "' (native byte order required)");
  }
  t.kind = typestr[1];
  t.itemsize = std::stoll(typestr.substr(2));
}

std::vector<int64_t> ToInt64Vector(const py::handle& seq) {
  std::vector<int64_t> out;
  for (py::handle v : seq) out.push_back(v.cast<int64_t>());
  return out;
}

// __array_interface__ / __cuda_array_interface__ (version 2 or 3).
TensorArg FromArrayInterface(const py::dict& iface, Memory memory, const char* name) {
  TensorArg t;
  t.memory = memory;
  t.shape = ToInt64Vector(iface["shape"]);
  ParseTypestr(iface["typestr"].cast<std::string>(), name, t);
  const py::tuple data = iface["data"].cast<py::tuple>();
  t.data = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  t.readonly = data[1].cast<bool>();
  std::vector<int64_t> strides;
  if (iface.contains("strides") && !iface["strides"].is_none()) {
    strides = ToInt64Vector(iface["strides"]);
  }
  t.contiguous = IsCContiguous(t.shape, strides, t.itemsize);
  return t;
}

// The DLPack ABI (v0.x, the "dltensor" capsule every producer hands out by default).
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

TensorArg FromDLPack(const py::handle& obj, const char* name) {
  const py::tuple device = obj.attr("__dlpack_device__")().cast<py::tuple>();
  const auto device_type = device[0].cast<int32_t>();
  const bool cuda = device_type == kDLCUDA || device_type == kDLCUDAManaged;
  // stream=-1: the producer must not synchronise (the caller orders its own stream; an event
  // recorded here would also break CUDA graph capture). CPU producers take no stream.
  const py::object capsule =
      cuda ? obj.attr("__dlpack__")(py::arg("stream") = -1) : obj.attr("__dlpack__")();
  // Not renamed to "used_dltensor": the capsule's destructor frees the DLManagedTensor, while
  // the caller's object keeps the memory alive.
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  const DLTensor& dl = managed->dl_tensor;
  TensorArg t;
  t.data = static_cast<char*>(dl.data) + dl.byte_offset;
  t.shape.assign(dl.shape, dl.shape + dl.ndim);
  static constexpr char kKinds[] = {'i', 'u', 'f', 'V', 'f', 'c', 'b'};
  t.kind = dl.dtype.code < sizeof(kKinds) ? kKinds[dl.dtype.code] : 'V';
  t.itemsize = int64_t{dl.dtype.bits} * dl.dtype.lanes / 8;
  std::vector<int64_t> strides;
  if (dl.strides != nullptr) {
    for (int32_t i = 0; i < dl.ndim; ++i) strides.push_back(dl.strides[i] * t.itemsize);
  }
  t.contiguous = IsCContiguous(t.shape, strides, t.itemsize);
  if (cuda) {
    t.memory = Memory::kCuda;
    t.device = dl.device.device_id;
  } else if (device_type == kDLCPU || device_type == kDLCUDAHost) {
    t.memory = Memory::kHost;
  } else {
    throw py::value_error(std::string(name) + ": unsupported DLPack device type " +
                          std::to_string(device_type));
  }
  return t;
}

TensorArg FromCudaArrayInterface(const py::handle& obj, const char* name) {
  TensorArg t = FromArrayInterface(obj.attr("__cuda_array_interface__").cast<py::dict>(),
                                   Memory::kCuda, name);
#if defined(SPARSEKV_WITH_CUDA)
  // The interface does not name the device: ask the runtime.
  cudaPointerAttributes attributes{};
  if (t.data != nullptr && cudaPointerGetAttributes(&attributes, t.data) == cudaSuccess) {
    if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) {
      t.device = attributes.device;
    } else {
      t.memory = Memory::kHost;
    }
  }
  cudaGetLastError();  // a failed query must not leave its error to the next runtime call
#endif
  return t;
}

TensorArg ParseTensor(const py::handle& obj, const char* name) {
  if (py::hasattr(obj, "__array_interface__")) {
    return FromArrayInterface(obj.attr("__array_interface__").cast<py::dict>(), Memory::kHost,
                              name);
  }
  if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) {
    return FromDLPack(obj, name);
  }
  if (py::hasattr(obj, "__cuda_array_interface__")) return FromCudaArrayInterface(obj, name);
  throw py::type_error(std::string(name) +
                       ": expected a tensor (an object with __array_interface__, __dlpack__ or "
                       "__cuda_array_interface__), got " +
                       std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
}

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

std::string DeviceString(const TensorArg& t) {
  return t.memory == Memory::kHost ? "host memory" : "cuda:" + std::to_string(t.device);
}

TensorArg CheckTensor(const py::handle& obj, const TensorRules& r, const PyBackend& backend) {
  TensorArg t = ParseTensor(obj, r.name);
  const std::string n = r.name;
  if (r.int32 && !(t.kind == 'i' && t.itemsize == 4)) {
    throw py::type_error(n + ": dtype must be int32");
  }
  if (!t.contiguous) throw py::value_error(n + ": tensor must be C-contiguous");
  if (r.output && t.readonly) throw py::value_error(n + ": tensor is read-only");
  if (backend.is_cuda()) {
    const bool on_device = t.memory == Memory::kCuda && t.device == backend.device;
    if (!on_device && !(r.host_ok_on_cuda && t.memory == Memory::kHost)) {
      throw py::value_error(n + ": the CUDA backend needs a tensor on cuda:" +
                            std::to_string(backend.device) + ", got " + DeviceString(t));
    }
  } else if (t.memory != Memory::kHost) {
    throw py::value_error(n + ": the CPU backend needs a host tensor, got " + DeviceString(t));
  }
  const int dims = static_cast<int>(t.shape.size());
  const int min_dims = r.int32 ? 2 : r.row_dims + 1;
  if (dims < min_dims || (r.int32 && dims != 2)) {
    throw py::value_error(n + ": expected " +
                          (r.int32 ? "2" : "at least " + std::to_string(min_dims)) +
                          " dimensions, got shape " + t.ShapeString());
  }
  if (r.exact_rows >= 0 && t.shape[0] != r.exact_rows) {
    throw py::value_error(n + ": expected " + std::to_string(r.exact_rows) + " rows, got shape " +
                          t.ShapeString());
  }
  if (t.shape[0] < r.min_rows) {
    throw py::value_error(n + ": expected at least " + std::to_string(r.min_rows) +
                          " rows (the planned batch), got shape " + t.ShapeString());
  }
  if (r.second_dim >= 0 && t.shape[1] != r.second_dim) {
    throw py::value_error(n + ": expected shape[1] == " + std::to_string(r.second_dim) +
                          ", got shape " + t.ShapeString());
  }
  if (t.shape[1] < r.min_second) {
    throw py::value_error(n + ": expected shape[1] >= " + std::to_string(r.min_second) +
                          ", got shape " + t.ShapeString());
  }
  if (!r.int32) {
    int64_t bytes = t.itemsize;
    for (int i = r.row_dims; i < dims; ++i) bytes *= t.shape[i];
    if (bytes != r.row_bytes) {
      throw py::value_error(n + ": each row must hold row_stride = " + std::to_string(r.row_bytes) +
                            " bytes, got " + std::to_string(bytes) + " (shape " + t.ShapeString() +
                            ", itemsize " + std::to_string(t.itemsize) + ")");
    }
  }
  return t;
}

// ---- The hot-cache layer as an array ----

// One layer of the hot cache, [rows, row_stride] bytes, exposed through __cuda_array_interface__
// (CUDA backend) or __array_interface__ (CPU backend), so that torch.as_tensor, numpy.asarray
// and cupy.asarray wrap it without a copy. Keeps its manager alive.
struct HotLayerView {
  const std::byte* data;
  int64_t rows;
  int64_t row_stride;
  bool cuda;

  py::dict Interface() const {
    py::dict d;
    d["shape"] = py::make_tuple(rows, row_stride);
    d["typestr"] = "|u1";
    d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(data), false);
    d["strides"] = py::none();
    d["version"] = 3;
    return d;
  }
};

// ---- The manager ----

int32_t RowStride(const CacheOptions& o, int32_t layer, const char* op) {
  if (layer < 0 || layer >= o.geometry.num_layers()) {
    throw py::value_error(std::string(op) + ": layer " + std::to_string(layer) +
                          " out of range [0, " + std::to_string(o.geometry.num_layers()) + ")");
  }
  return o.geometry.layers[layer].row_stride;
}

class PyManager {
 public:
  PyManager(const CacheOptions& options, PyBackend backend) : backend_(std::move(backend)) {
    manager_ = Check(SparseKVCacheManager::Create(options, backend_.backend));
  }

  void Admit(PyRequestId id, int32_t prompt_len, int32_t max_new_tokens, const py::object& stream) {
    Check(manager_->Admit(id.value, prompt_len, max_new_tokens, Stream(stream)));
    cached_.erase(id.value);
  }

  void IngestPrompt(PyRequestId id, int32_t layer, const py::object& rows,
                    const py::object& stream) {
    Ingest(id.value, layer, rows, /*rows_first=*/0, "ingest_prompt", stream);
  }

  void Release(PyRequestId id) {
    Check(manager_->Release(id.value));
    cached_.erase(id.value);
  }
  void Retract(PyRequestId id) { Check(manager_->Retract(id.value)); }
  void Promote(PyRequestId id, const py::object& stream) {
    Check(manager_->Promote(id.value, Stream(stream)));
  }
  bool IsResident(PyRequestId id) const { return manager_->IsResident(id.value); }
  void Resume(PyRequestId id, const py::object& stream) {
    Check(manager_->Resume(id.value, Stream(stream)));
  }

  int32_t AdmitWithPrefix(PyRequestId id, const std::vector<int32_t>& token_ids,
                          int32_t max_new_tokens, const py::object& stream) {
    const int32_t cached =
        Check(manager_->AdmitWithPrefix(id.value, token_ids, max_new_tokens, Stream(stream)));
    cached_[id.value] = cached;
    return cached;
  }

  void IngestPromptSuffix(PyRequestId id, int32_t layer, const py::object& rows,
                          const py::object& stream) {
    auto it = cached_.find(id.value);
    Ingest(id.value, layer, rows, it == cached_.end() ? 0 : it->second, "ingest_prompt_suffix",
           stream);
  }

  void Fork(PyRequestId parent, PyRequestId child, int32_t max_new_tokens,
            const py::object& stream) {
    Check(manager_->Fork(parent.value, child.value, max_new_tokens, Stream(stream)));
    cached_.erase(child.value);
  }

  int32_t Retain(PyRequestId id) {
    const int32_t retained = Check(manager_->Retain(id.value));
    cached_.erase(id.value);
    return retained;
  }
  int32_t EvictRetained() { return manager_->EvictRetained(); }
  bool IsRetained(PyRequestId id) const { return manager_->IsRetained(id.value); }
  std::vector<int32_t> HostPages(PyRequestId id) const {
    return Check(manager_->HostPages(id.value));
  }

  void PlanStep(const std::vector<PyRequestId>& batch,
                const std::optional<std::vector<int32_t>>& token_ids, const py::object& stream) {
    std::vector<RequestId> ids;
    ids.reserve(batch.size());
    for (const PyRequestId& id : batch) ids.push_back(id.value);
    if (token_ids.has_value()) {
      Check(manager_->PlanStep(ids, *token_ids, Stream(stream)));
    } else {
      Check(manager_->PlanStep(ids, Stream(stream)));
    }
  }

  void AppendToken(int32_t layer, const py::object& new_rows, const py::object& stream) {
    TensorRules r{"new_rows"};
    r.row_bytes = RowStride(options(), layer, "append_token");
    r.min_rows = manager_->batch_size();
    const TensorArg t = CheckTensor(new_rows, r, backend_);
    Check(manager_->AppendToken(layer, t.data, Stream(stream)));
  }

  // topk: int32 [>= batch, >= top_k]; slots: int32 [>= batch, top_k], written.
  TensorArg TopK(const py::object& topk, const char* name, int32_t top_k) const {
    TensorRules tr{name};
    tr.int32 = true;
    tr.min_rows = manager_->batch_size();
    tr.min_second = top_k;
    return CheckTensor(topk, tr, backend_);
  }
  TensorArg Slots(const py::object& slots, const char* name) const {
    TensorRules sr{name};
    sr.int32 = true;
    sr.min_rows = manager_->batch_size();
    sr.second_dim = options().top_k;
    sr.output = true;
    return CheckTensor(slots, sr, backend_);
  }

  void RunLayer(int32_t layer, const py::object& topk, const py::object& slots,
                const py::object& assembled, const py::object& stream) {
    const int32_t row_stride = RowStride(options(), layer, "run_layer");
    const int32_t top_k = options().top_k;
    const TensorArg t = TopK(topk, "topk", top_k);
    const TensorArg s = Slots(slots, "slots");
    void* out = nullptr;
    if (!assembled.is_none()) {
      TensorRules ar{"assembled"};
      ar.row_dims = 2;
      ar.row_bytes = row_stride;
      ar.min_rows = manager_->batch_size();
      ar.second_dim = top_k;
      ar.output = true;
      out = CheckTensor(assembled, ar, backend_).data;
    }
    Check(manager_->RunLayer(layer, static_cast<const int32_t*>(t.data),
                             static_cast<int32_t*>(s.data), out, Stream(stream),
                             static_cast<int32_t>(t.shape[1])));
  }

  void ResolveLayer(int32_t layer, const py::object& topk, const py::object& slots,
                    const py::object& fill_mask, const py::object& stream) {
    const TensorArg t = TopK(topk, "topk", options().top_k);
    const TensorArg s = Slots(slots, "slots");
    uint8_t* fill = nullptr;
    if (!fill_mask.is_none()) {
      TensorRules fr{"fill_mask"};  // [>= batch, top_k] of 1-byte elements (uint8 or bool)
      fr.row_bytes = options().top_k;
      fr.min_rows = manager_->batch_size();
      fr.second_dim = options().top_k;
      fr.output = true;
      fill = static_cast<uint8_t*>(CheckTensor(fill_mask, fr, backend_).data);
    }
    Check(manager_->ResolveLayer(layer, static_cast<const int32_t*>(t.data),
                                 static_cast<int32_t*>(s.data), fill, Stream(stream),
                                 static_cast<int32_t>(t.shape[1])));
  }

  void CopyMisses(int32_t layer, const py::object& stream) {
    Check(manager_->CopyMisses(layer, Stream(stream)));
  }

  void AssembleLayer(int32_t layer, const py::object& slots, const py::object& assembled,
                     const py::object& stream) {
    TensorRules sr{"slots"};
    sr.int32 = true;
    sr.min_rows = manager_->batch_size();
    sr.second_dim = options().top_k;
    const TensorArg s = CheckTensor(slots, sr, backend_);
    TensorRules ar{"assembled"};
    ar.row_dims = 2;
    ar.row_bytes = RowStride(options(), layer, "assemble_layer");
    ar.min_rows = manager_->batch_size();
    ar.second_dim = options().top_k;
    ar.output = true;
    const TensorArg a = CheckTensor(assembled, ar, backend_);
    Check(manager_->AssembleLayer(layer, static_cast<const int32_t*>(s.data), a.data,
                                  Stream(stream)));
  }

  void PrefetchLayer(int32_t layer, const py::object& positions, const py::object& stream) {
    TensorRules pr{"positions"};
    pr.int32 = true;
    pr.min_rows = manager_->batch_size();
    const TensorArg t = CheckTensor(positions, pr, backend_);
    if (t.shape.size() != 2) throw py::value_error("positions: must be [batch, count]");
    Check(manager_->PrefetchLayer(layer, static_cast<const int32_t*>(t.data),
                                  static_cast<int32_t>(t.shape[1]), Stream(stream)));
  }

  void FinishStep(const py::object& stream) { Check(manager_->FinishStep(Stream(stream))); }
  void FinishReplayedStep() { Check(manager_->FinishReplayedStep()); }

  CacheStats ReadStats(const py::object& stream) {
    return Check(manager_->ReadStats(Stream(stream)));
  }
  void ResetStats(const py::object& stream) { Check(manager_->ResetStats(Stream(stream))); }
  int32_t SequenceLength(PyRequestId id) const { return Check(manager_->SequenceLength(id.value)); }

  HotLayerView HotLayer(int32_t layer) const {
    const int32_t stride = RowStride(options(), layer, "hot_layer");
    return HotLayerView{manager_->HotLayer(layer),
                        manager_->HotLayerRows(), stride,
                        backend_.is_cuda()};
  }

  int32_t batch_size() const { return manager_->batch_size(); }
  const CacheOptions& options() const { return manager_->options(); }
  const PyBackend& backend() const { return backend_; }

 private:
  // IngestPrompt (rows_first 0: rows of every prompt position) or IngestPromptSuffix (rows_first
  // = cached: rows of positions [cached, prompt_len)). The row count is checked here, since the
  // library reads that many rows from the pointer.
  void Ingest(RequestId id, int32_t layer, const py::object& rows, int32_t rows_first,
              const char* op, const py::object& stream) {
    TensorRules r{"rows"};
    r.row_bytes = RowStride(options(), layer, op);
    const StatusOr<int32_t> prompt_len = manager_->SequenceLength(id);
    if (!prompt_len.ok()) {
      Raise(NotFound(std::string(op) + ": request " + std::to_string(id) +
                     " is unknown or released"));
    }
    r.exact_rows = *prompt_len - rows_first;
    r.host_ok_on_cuda = true;
    const TensorArg t = CheckTensor(rows, r, backend_);
    if (rows_first == 0) {
      Check(manager_->IngestPrompt(id, layer, t.data, Stream(stream)));
    } else {
      Check(manager_->IngestPromptSuffix(id, layer, t.data, Stream(stream)));
    }
  }

  // See the file comment for the rules.
  StreamHandle Stream(const py::object& stream) {
    if (py::isinstance<py::int_>(stream)) {
      return reinterpret_cast<StreamHandle>(stream.cast<uintptr_t>());
    }
    if (!stream.is_none()) {
      if (py::hasattr(stream, "cuda_stream")) {
        return reinterpret_cast<StreamHandle>(stream.attr("cuda_stream").cast<uintptr_t>());
      }
      throw py::type_error(
          "stream must be None, an int (cudaStream_t) or an object with "
          ".cuda_stream");
    }
    if (!backend_.is_cuda()) return nullptr;
    if (!torch_current_stream_.has_value()) {
      // Looked up once: a failed import is not retried at every call.
      try {
        torch_current_stream_ = py::module_::import("torch").attr("cuda").attr("current_stream");
      } catch (const py::error_already_set&) {
        torch_current_stream_ = py::none();
      }
    }
    if (torch_current_stream_->is_none()) return nullptr;
    const py::object current = (*torch_current_stream_)(backend_.device);
    return reinterpret_cast<StreamHandle>(current.attr("cuda_stream").cast<uintptr_t>());
  }

  PyBackend backend_;
  std::unique_ptr<SparseKVCacheManager> manager_;
  std::optional<py::object> torch_current_stream_;  // torch.cuda.current_stream, or None
  // The `cached` AdmitWithPrefix returned, per request admitted so (until it is released,
  // retained or admitted again): the rows ingest_prompt_suffix must be given.
  std::unordered_map<RequestId, int32_t> cached_;
};

py::dict LayerStatsDict(const LayerStats& s) {
  py::dict d;
  d["hits"] = s.hits;
  d["window_hits"] = s.window_hits;
  d["misses"] = s.misses;
  d["padding"] = s.padding;
  d["duplicates"] = s.duplicates;
  d["out_of_range"] = s.out_of_range;
  d["resident_hits"] = s.resident_hits;
  d["hit_rate"] = s.hit_rate();
  return d;
}

// Binds read-only scalar fields of CacheStats and remembers their names, so that to_dict lists
// every field bound, in order.
struct StatsFields {
  py::class_<CacheStats>& cls;
  std::vector<const char*>& names;

  template <typename C, typename T>
  StatsFields& operator()(const char* name, T C::*field, const char* doc) {
    cls.def_readonly(name, field, doc);
    names.push_back(name);
    return *this;
  }
};

}  // namespace
}  // namespace sparsekv

PYBIND11_MODULE(_core, m) {
  using namespace sparsekv;
  m.doc() = "sparsekv C++ library binding (see the sparsekv package for the documentation)";
  RegisterErrors(m);

  py::class_<LayerShape>(m, "LayerShape", "Bytes one token contributes to one layer.")
      .def(py::init([](int32_t row_bytes, int32_t row_stride) {
             return LayerShape{row_bytes, row_stride > 0 ? row_stride : row_bytes};
           }),
           py::arg("row_bytes"), py::arg("row_stride") = 0,
           "row_stride 0 means row_stride = row_bytes.")
      .def_readwrite("row_bytes", &LayerShape::row_bytes,
                     "Meaningful bytes per row (DeepSeek-V3.2 fp8: 656; bf16: 1152).")
      .def_readwrite("row_stride", &LayerShape::row_stride,
                     "Bytes between consecutive rows, >= row_bytes.")
      .def(
          "__repr__",
          [](const LayerShape& s) {
            return "LayerShape(row_bytes=" + std::to_string(s.row_bytes) +
                   ", row_stride=" + std::to_string(s.row_stride) + ")";
          },
          "LayerShape(row_bytes=..., row_stride=...).");

  py::class_<KVGeometry>(m, "KVGeometry", "Shape of the KV cache: one LayerShape per layer.")
      .def(py::init([](std::vector<LayerShape> layers) { return KVGeometry{std::move(layers)}; }),
           py::arg("layers"), "One LayerShape per attention layer, in order.")
      .def_static("uniform", &KVGeometry::Uniform, py::arg("num_layers"), py::arg("row_bytes"),
                  py::arg("row_stride") = 0,
                  "Every layer has the same row; row_stride 0 means row_bytes.")
      .def_readwrite("layers", &KVGeometry::layers, "One LayerShape per attention layer.")
      .def_property_readonly("num_layers", &KVGeometry::num_layers, "len(layers).")
      .def_property_readonly(
          "token_bytes", &KVGeometry::token_bytes,
          "Sum of row_bytes over all layers: the meaningful KV bytes of a token.")
      .def_property_readonly("token_stride_bytes", &KVGeometry::token_stride_bytes,
                             "Sum of row_stride over all layers: the bytes one token occupies in "
                             "the host pool.");

  py::enum_<EvictionPolicy>(m, "EvictionPolicy", "Replacement of the hot slots.")
      .value("LRU", EvictionPolicy::kLru, "Least recently used slot first.")
      .value("SEGMENTED_LRU", EvictionPolicy::kSegmentedLru,
             "Segmented LRU: slots hit again are protected; new fills are evicted first.");

  const CacheOptions defaults;
  py::class_<CacheOptions>(m, "CacheOptions",
                           "Options of a manager; fields and defaults as in "
                           "include/sparsekv/options.h.")
      .def(py::init([](KVGeometry geometry, int32_t top_k, int32_t hot_slots, int32_t window,
                       int64_t host_capacity_tokens, int32_t max_requests,
                       int32_t max_host_requests, int32_t max_batch, int32_t max_context,
                       int32_t host_page_tokens, bool sort_misses, int32_t sort_misses_min_batch,
                       EvictionPolicy eviction, int32_t protected_percent, int32_t layers_per_index,
                       bool share_repeated_positions, int32_t max_prefetch, int32_t copy_blocks,
                       bool hybrid_residency, int64_t device_budget_bytes,
                       int32_t resident_page_rows) {
             CacheOptions o;
             o.geometry = std::move(geometry);
             o.top_k = top_k;
             o.hot_slots = hot_slots;
             o.window = window;
             o.host_capacity_tokens = host_capacity_tokens;
             o.max_requests = max_requests;
             o.max_host_requests = max_host_requests;
             o.max_batch = max_batch;
             o.max_context = max_context;
             o.host_page_tokens = host_page_tokens;
             o.sort_misses = sort_misses;
             o.sort_misses_min_batch = sort_misses_min_batch;
             o.eviction = eviction;
             o.protected_percent = protected_percent;
             o.layers_per_index = layers_per_index;
             o.share_repeated_positions = share_repeated_positions;
             o.max_prefetch = max_prefetch;
             o.copy_blocks = copy_blocks;
             o.hybrid_residency = hybrid_residency;
             o.device_budget_bytes = device_budget_bytes;
             o.resident_page_rows = resident_page_rows;
             return o;
           }),
           py::kw_only(), py::arg("geometry"), py::arg("top_k") = defaults.top_k,
           py::arg("hot_slots") = defaults.hot_slots, py::arg("window") = defaults.window,
           py::arg("host_capacity_tokens"), py::arg("max_requests"),
           py::arg("max_host_requests") = defaults.max_host_requests,
           py::arg("max_batch") = defaults.max_batch, py::arg("max_context"),
           py::arg("host_page_tokens") = defaults.host_page_tokens,
           py::arg("sort_misses") = defaults.sort_misses,
           py::arg("sort_misses_min_batch") = defaults.sort_misses_min_batch,
           py::arg("eviction") = defaults.eviction,
           py::arg("protected_percent") = defaults.protected_percent,
           py::arg("layers_per_index") = defaults.layers_per_index,
           py::arg("share_repeated_positions") = defaults.share_repeated_positions,
           py::arg("max_prefetch") = defaults.max_prefetch,
           py::arg("copy_blocks") = defaults.copy_blocks,
           py::arg("hybrid_residency") = defaults.hybrid_residency,
           py::arg("device_budget_bytes") = defaults.device_budget_bytes,
           py::arg("resident_page_rows") = defaults.resident_page_rows,
           "Keyword arguments only; geometry, host_capacity_tokens, max_requests and max_context "
           "are required. Checked when a manager is created (or by validate()).")
      .def_readwrite("geometry", &CacheOptions::geometry, "The KV rows of every layer.")
      .def_readwrite("top_k", &CacheOptions::top_k,
                     "Positions selected per request and layer at every decode step.")
      .def_readwrite("hot_slots", &CacheOptions::hot_slots,
                     "Least-recently-used hot slots per request and layer, >= top_k.")
      .def_readwrite("window", &CacheOptions::window,
                     "The newest `window` tokens of each request are always resident, in extra "
                     "slots.")
      .def_readwrite("host_capacity_tokens", &CacheOptions::host_capacity_tokens,
                     "Host pool size in tokens (a row of every layer each). Required.")
      .def_readwrite("max_requests", &CacheOptions::max_requests,
                     "Requests that may hold a hot-cache block at once. Required.")
      .def_readwrite("max_host_requests", &CacheOptions::max_host_requests,
                     "Requests that may hold host pages at once (retracted ones included); 0 "
                     "means max_requests.")
      .def_readwrite("max_batch", &CacheOptions::max_batch,
                     "Largest batch of one decode step; 0 means max_requests.")
      .def_readwrite("max_context", &CacheOptions::max_context,
                     "Largest prompt + generated length of one request. Required.")
      .def_readwrite("host_page_tokens", &CacheOptions::host_page_tokens,
                     "Host rows are given to requests (and shared) in pages of this many tokens.")
      .def_readwrite("sort_misses", &CacheOptions::sort_misses,
                     "Sort each request's misses by host address before copying.")
      .def_readwrite("sort_misses_min_batch", &CacheOptions::sort_misses_min_batch,
                     "Sort only in steps of at least this many requests (0: every step).")
      .def_readwrite("eviction", &CacheOptions::eviction,
                     "Replacement of the hot slots (EvictionPolicy).")
      .def_readwrite("protected_percent", &CacheOptions::protected_percent,
                     "SEGMENTED_LRU: the protected part's share of hot_slots, in [0, 100].")
      .def_readwrite("layers_per_index", &CacheOptions::layers_per_index,
                     "Consecutive layers that share one top-k (an index group).")
      .def_readwrite("share_repeated_positions", &CacheOptions::share_repeated_positions,
                     "Repeated positions in a top-k row share one slot instead of being skipped.")
      .def_readwrite("max_prefetch", &CacheOptions::max_prefetch,
                     "Positions per request and layer one prefetch_layer call may take; 0: none.")
      .def_readwrite("copy_blocks", &CacheOptions::copy_blocks,
                     "Largest grid of the CUDA miss copy in blocks of 256 threads; 0: as many as "
                     "the GPU holds resident.")
      .def_readwrite("hybrid_residency", &CacheOptions::hybrid_residency,
                     "Requests keep their whole KV in HBM while the hot cache has room; "
                     "admissions that need it demote them to hot-cache mode.")
      .def_readwrite("device_budget_bytes", &CacheOptions::device_budget_bytes,
                     "HBM for the hot cache; 0: max_requests blocks. With hot_slots = 0 the "
                     "library chooses the slots from it.")
      .def_readwrite("resident_page_rows", &CacheOptions::resident_page_rows,
                     "Hybrid residency: positions per resident page.")
      .def_property_readonly("protected_capacity", &CacheOptions::protected_capacity,
                             "SEGMENTED_LRU: the protected part's capacity in slots.")
      .def_property_readonly("effective_max_batch", &CacheOptions::effective_max_batch,
                             "max_batch, or max_requests when max_batch is 0.")
      .def_property_readonly("effective_max_host_requests",
                             &CacheOptions::effective_max_host_requests,
                             "max_host_requests, or max_requests when it is 0.")
      .def_property_readonly("slots_per_request", &CacheOptions::slots_per_request,
                             "hot_slots + window: slots per request and layer.")
      .def_property_readonly("index_groups", &CacheOptions::index_groups,
                             "Index groups: ceil(num_layers / layers_per_index).")
      .def(
          "validate", [](const CacheOptions& o) { Check(ValidateOptions(o)); },
          "Raises InvalidArgumentError naming the field and the rule that fails.");

  py::class_<LayerStats>(m, "LayerStats", "Resolve counters of one layer (or of all layers).")
      .def_readonly("hits", &LayerStats::hits, "Top-k positions found in an LRU slot.")
      .def_readonly("window_hits", &LayerStats::window_hits,
                    "Top-k positions served by the newest-token window.")
      .def_readonly("misses", &LayerStats::misses, "Top-k positions copied from the host pool.")
      .def_readonly("padding", &LayerStats::padding, "-1 entries.")
      .def_readonly("duplicates", &LayerStats::duplicates,
                    "Repeated positions within one top-k row (skipped).")
      .def_readonly("resident_hits", &LayerStats::resident_hits,
                    "Top-k positions of resident requests (hybrid residency).")
      .def_readonly("out_of_range", &LayerStats::out_of_range,
                    "Positions outside [0, seq_len) (skipped).")
      .def_property_readonly("hit_rate", &LayerStats::hit_rate,
                             "(hits + window_hits + resident_hits) / (that + misses); 0 if none.")
      .def("to_dict", &LayerStatsDict, "The counters and hit_rate as a dict.");

  py::class_<HotCacheShape>(m, "HotCacheShape", "The hot cache CacheOptions ask for.")
      .def_readonly("hot_slots", &HotCacheShape::hot_slots,
                    "Slots per block and layer (options.hot_slots, or chosen from the budget).")
      .def_readonly("blocks", &HotCacheShape::blocks, "Blocks: max_requests, or as many as fit.")
      .def_readonly("block_bytes", &HotCacheShape::block_bytes, "Device bytes of one block.");
  m.def(
      "choose_hot_cache_shape",
      [](const CacheOptions& o) {
        Check(ValidateOptions(o));
        StatusOr<HotCacheShape> shape = ChooseHotCacheShape(o);
        Check(shape.status());
        return *shape;
      },
      py::arg("options"),
      "The hot cache a manager with these options would allocate: with device_budget_bytes and "
      "hot_slots = 0, the slots the library chooses.");

  py::class_<CacheStats> stats(m, "CacheStats",
                               "Statistics since creation or the last reset_stats(); fields "
                               "marked 'now' are gauges.");
  stats.def_readonly("layers", &CacheStats::layers, "A LayerStats per layer.")
      .def_readonly("total", &CacheStats::total, "The sum of layers.");
  static std::vector<const char*>& stats_names = *new std::vector<const char*>();
  StatsFields{stats, stats_names}(
      "bytes_host_to_device", &CacheStats::bytes_host_to_device,
      "Misses and prefetched rows * row_bytes, plus window rows loaded at ingest and resume.")(
      "bytes_device_to_host", &CacheStats::bytes_device_to_host,
      "Appended tokens * row_bytes (write-back of the newest token).")(
      "bytes_assembled", &CacheStats::bytes_assembled,
      "Assembled rows * row_bytes (device to device).")(
      "bytes_ingested", &CacheStats::bytes_ingested,
      "Prompt rows * row_bytes written into the host pool.")(
      "prefix_lookup_tokens", &CacheStats::prefix_lookup_tokens,
      "Prompt tokens of successful admit_with_prefix calls.")(
      "prefix_hit_tokens", &CacheStats::prefix_hit_tokens,
      "Of those, tokens found in the pool (not ingested).")(
      "copy_on_write_pages", &CacheStats::copy_on_write_pages,
      "Shared, partially filled pages copied before an append.")(
      "evictions", &CacheStats::evictions,
      "Retained conversations evicted (least recently used first) to make room for an "
      "admission.")("evicted_pages", &CacheStats::evicted_pages,
                    "Pages those evictions freed (not those another holder still references).")(
      "invalid_copy_entries", &CacheStats::invalid_copy_entries,
      "Copy entries skipped as out of bounds (0 unless something is wrong).")(
      "host_pages_used", &CacheStats::host_pages_used,
      "Now: host pages in use, of the whole pool.")(
      "host_pages_total", &CacheStats::host_pages_total, "Host pages of the pool.")(
      "hot_blocks_used", &CacheStats::hot_blocks_used, "Now: hot-cache blocks in use.")(
      "device_bytes", &CacheStats::device_bytes,
      "Device memory the manager holds: hot cache, replacement state, page table, plan "
      "buffers.")("pages_shared", &CacheStats::pages_shared,
                  "Now: host pages with more than one holder (whole pool).")(
      "bytes_saved", &CacheStats::bytes_saved,
      "Now: sum over pages of (holders - 1) * page_tokens * token_stride_bytes.")(
      "retained_conversations", &CacheStats::retained_conversations,
      "Now: retained conversations in the pool.")(
      "prefetch_lookups", &CacheStats::prefetch_lookups,
      "Positions prefetch_layer looked up, once per index group.")(
      "prefetch_rows", &CacheStats::prefetch_rows, "Of those, rows fetched (not resident).")(
      "demotions", &CacheStats::demotions,
      "Resident requests demoted to hot-cache mode to make room for an admission.")(
      "promotions", &CacheStats::promotions, "Hot-cache requests made resident by promote().")(
      "resident_requests", &CacheStats::resident_requests, "Now: requests resident in HBM.");
  stats.def(
      "to_dict",
      [](const py::object& self) {
        const auto& s = self.cast<const CacheStats&>();
        py::dict d;
        py::list layers;
        for (const LayerStats& l : s.layers) layers.append(LayerStatsDict(l));
        d["layers"] = layers;
        d["total"] = LayerStatsDict(s.total);
        for (const char* name : stats_names) d[name] = self.attr(name);
        return d;
      },
      "Every field as a dict (layers and total as dicts of their counters).");

  py::class_<PyBackend>(m, "Backend", "Where a manager's memory lives and its operators run.")
      .def_property_readonly(
          "kind", [](const PyBackend& b) { return b.is_cuda() ? "cuda" : "cpu"; },
          "'cpu' or 'cuda'.")
      .def_property_readonly(
          "name", [](const PyBackend& b) { return b.backend->name(); },
          "e.g. 'cpu' or 'cuda:0 NVIDIA H200'.")
      .def_property_readonly(
          "device", [](const PyBackend& b) { return b.device; },
          "CUDA device ordinal; -1 for the CPU backend.")
      .def(
          "__repr__",
          [](const PyBackend& b) { return "<sparsekv.Backend " + b.backend->name() + ">"; },
          "<sparsekv.Backend name>.");

  m.def(
      "cpu_backend",
      [] {
        return PyBackend{CreateCpuBackend(), -1};
      },
      "The CPU reference backend: ordinary memory, plain loops; never fails.");
  m.def(
      "cuda_backend",
      [](int device) {
        return PyBackend{Check(CreateCudaBackend(device)), device};
      },
      py::arg("device") = 0,
      "The CUDA backend on `device`; raises UnavailableError if the library was built "
      "without CUDA or the device is absent.");
  m.def("cuda_compiled", &CudaBackendCompiled,
        "True if the library was built with the CUDA backend (a GPU may still be absent).");

  py::class_<HotLayerView>(m, "HotLayer",
                           "One layer of the hot cache, [rows, row_stride] uint8, wrapped "
                           "without a copy by torch.as_tensor / numpy.asarray / cupy.asarray.")
      .def_readonly("rows", &HotLayerView::rows, "max_requests * slots_per_request.")
      .def_readonly("row_stride", &HotLayerView::row_stride, "The layer's row_stride in bytes.")
      .def_property_readonly(
          "data_ptr", [](const HotLayerView& v) { return reinterpret_cast<uintptr_t>(v.data); },
          "Address of row 0 (device memory under CUDA).")
      .def_property_readonly(
          "__cuda_array_interface__",
          [](const HotLayerView& v) {
            if (!v.cuda) throw py::attribute_error("host memory");
            return v.Interface();
          },
          "The CUDA array interface (CUDA backend only).")
      .def_property_readonly(
          "__array_interface__",
          [](const HotLayerView& v) {
            if (v.cuda) throw py::attribute_error("device memory");
            return v.Interface();
          },
          "The numpy array interface (CPU backend only).");

  const py::arg_v no_stream = py::arg("stream") = py::none();
  py::class_<PyManager>(m, "SparseKVCacheManager",
                        "The request lifecycle and per-step entry points "
                        "(include/sparsekv/manager.h). Request ids are ints in [0, 2**64).")
      .def(py::init<const CacheOptions&, PyBackend>(), py::arg("options"), py::arg("backend"),
           "Validates `options` and allocates the host pool, the hot cache and the device "
           "buffers of the run phase on `backend`.")
      // ---- Lifecycle ----
      .def("admit", &PyManager::Admit, py::arg("request_id"), py::arg("prompt_len"),
           py::arg("max_new_tokens"), no_stream,
           "Reserves host pages for prompt_len + max_new_tokens positions and a hot-cache "
           "block. AlreadyExistsError for a known id (live or retained), OutOfRangeError past "
           "max_context, ResourceExhaustedError when full even after evicting every retained "
           "conversation.")
      .def("ingest_prompt", &PyManager::IngestPrompt, py::arg("request_id"), py::arg("layer"),
           py::arg("rows"), no_stream,
           "Writes the prompt KV of one layer, rows [prompt_len, row_stride] bytes (host or "
           "device), into the host pool and its newest `window` rows into the hot cache. Rows of "
           "positions admit_with_prefix found are skipped. Every layer must be ingested before "
           "the request joins a step.")
      .def("release", &PyManager::Release, py::arg("request_id"),
           "Frees the request's host pages (drops its references to shared ones) and hot-cache "
           "block, or drops the retained conversation `request_id`.")
      .def("promote", &PyManager::Promote, py::arg("request_id"), no_stream,
           "Hybrid residency: makes a hot-cache request resident again, loading its whole "
           "history from the host pool (ResourceExhaustedError if its pages are not free).")
      .def("is_resident", &PyManager::IsResident, py::arg("request_id"),
           "Whether the request is live and resident in HBM.")
      .def("retract", &PyManager::Retract, py::arg("request_id"),
           "Gives back the request's hot-cache block and keeps its history in the host pool; "
           "it cannot join a step until resume().")
      .def("resume", &PyManager::Resume, py::arg("request_id"), no_stream,
           "Takes a hot-cache block again (ResourceExhaustedError if none is free) and reloads "
           "the window.")
      // ---- Shared prefixes and retained conversations ----
      .def("admit_with_prefix", &PyManager::AdmitWithPrefix, py::arg("request_id"),
           py::arg("token_ids"), py::arg("max_new_tokens"), no_stream,
           "admit() for a prompt of len(token_ids) tokens (int32 ids) whose longest prefix of "
           "full pages already in the pool is shared, not stored again. Returns `cached`: "
           "positions [0, cached) were found (a multiple of host_page_tokens, less than the "
           "prompt length, 0 on a miss); ingest only [cached, prompt_len) with "
           "ingest_prompt_suffix. Errors as admit(); nothing changes on error.")
      .def("ingest_prompt_suffix", &PyManager::IngestPromptSuffix, py::arg("request_id"),
           py::arg("layer"), py::arg("rows"), no_stream,
           "ingest_prompt() for a request admitted with admit_with_prefix: rows is "
           "[prompt_len - cached, row_stride], the KV of positions [cached, prompt_len).")
      .def("fork", &PyManager::Fork, py::arg("parent"), py::arg("child"), py::arg("max_new_tokens"),
           no_stream,
           "Admits `child` with all of `parent`'s history shared and room for max_new_tokens "
           "more (an agent branch); it gets its own hot-cache block and can join a step at "
           "once.")
      .def("retain", &PyManager::Retain, py::arg("request_id"),
           "Ends the request like release(), but keeps the full pages of its history whose token "
           "ids are known as the retained conversation `request_id`, for a later "
           "admit_with_prefix (the next turn). Returns the tokens retained (0: none, as for "
           "release). release(request_id) drops it; eviction may drop it at any time.")
      .def("evict_retained", &PyManager::EvictRetained,
           "Evicts every retained conversation; returns how many there were.")
      .def("is_retained", &PyManager::IsRetained, py::arg("request_id"),
           "True if `request_id` is a retained conversation.")
      .def("host_pages", &PyManager::HostPages, py::arg("request_id"),
           "The host pages of a live request or retained conversation, in position order (page "
           "i holds positions [i * host_page_tokens, (i + 1) * host_page_tokens)).")
      // ---- Plan ----
      .def("plan_step", &PyManager::PlanStep, py::arg("batch"), py::arg("token_ids") = py::none(),
           no_stream,
           "Fixes the next step's batch (request ids); each request gains one token. With "
           "token_ids, token_ids[b] is the id of the token batch[b] appends, so that the pages "
           "of requests whose ids are known (admit_with_prefix, fork) can be shared once full; "
           "a step planned without ids ends that for the requests of its batch.")
      // ---- Run ----
      .def("append_token", &PyManager::AppendToken, py::arg("layer"), py::arg("new_rows"),
           no_stream,
           "Stores the newest token's KV of `layer` for every request of the step: new_rows is "
           "[>= batch, row_stride] bytes, row b for the b-th request. Precedes the layer's "
           "run_layer.")
      .def("run_layer", &PyManager::RunLayer, py::arg("layer"), py::arg("topk"), py::arg("slots"),
           py::arg("assembled") = py::none(), no_stream,
           "Resolves topk (int32 [>= batch, >= top_k] positions, -1 = padding) against the hot "
           "cache of `layer`, copies the misses in and writes slots (int32 [>= batch, top_k], "
           "-1 = skipped). If assembled ([>= batch, top_k, row_stride] bytes) is given, also "
           "gathers the selected rows into it (skipped entries are zero rows).")
      .def("resolve_layer", &PyManager::ResolveLayer, py::arg("layer"), py::arg("topk"),
           py::arg("slots"), py::arg("fill_mask") = py::none(), no_stream,
           "The resolve of run_layer for `layer`'s index group; fill_mask (uint8 [>= batch, "
           "top_k]) gets 1 where the slot's row arrives with the group's copy_misses.")
      .def("copy_misses", &PyManager::CopyMisses, py::arg("layer"), no_stream,
           "Copies the misses of the last resolve_layer of `layer`'s group into `layer`'s "
           "rows; once per layer and step.")
      .def("assemble_layer", &PyManager::AssembleLayer, py::arg("layer"), py::arg("slots"),
           py::arg("assembled"), no_stream,
           "Gathers the rows of slots (as resolve_layer wrote them) of `layer` into assembled "
           "([>= batch, top_k, row_stride] bytes; skipped entries are zero rows).")
      .def("prefetch_layer", &PyManager::PrefetchLayer, py::arg("layer"), py::arg("positions"),
           no_stream,
           "Brings positions (int32 [>= batch, count], -1 = padding, count <= max_prefetch) into "
           "the hot cache of `layer`'s index group for a later step.")
      .def("finish_step", &PyManager::FinishStep, no_stream,
           "Ends the step: joins the write-back side stream into `stream`.")
      .def("finish_replayed_step", &PyManager::FinishReplayedStep,
           "After replaying a captured run phase: closes the step as the captured calls did at "
           "capture time.")
      // ---- Introspection ----
      .def("read_stats", &PyManager::ReadStats, no_stream,
           "Synchronises `stream` and returns the CacheStats.")
      .def("reset_stats", &PyManager::ResetStats, no_stream,
           "Synchronises `stream` and zeroes every counter.")
      .def("sequence_length", &PyManager::SequenceLength, py::arg("request_id"),
           "Tokens with KV of a live request (NotFoundError otherwise).")
      .def("hot_layer", &PyManager::HotLayer, py::arg("layer"), py::keep_alive<0, 1>(),
           "Layer `layer` of the hot cache as a zero-copy HotLayer: what the slots index.")
      .def_property_readonly("batch_size", &PyManager::batch_size,
                             "Requests of the planned step (0 before the first).")
      .def_property_readonly("options", &PyManager::options, "The manager's CacheOptions.")
      .def_property_readonly("backend", &PyManager::backend, "The manager's Backend.");
}
