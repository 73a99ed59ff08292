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
#include <vector>

#include "sparsekv/backend.h"
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
  };
  const Spec specs[] = {
      {StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {StatusCode::kNotFound, "NotFoundError", PyExc_LookupError},
      {StatusCode::kAlreadyExists, "AlreadyExistsError", PyExc_ValueError},
      {StatusCode::kResourceExhausted, "ResourceExhaustedError", PyExc_RuntimeError},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError", PyExc_RuntimeError},
      {StatusCode::kOutOfRange, "OutOfRangeError", PyExc_ValueError},
      {StatusCode::kUnavailable, "UnavailableError", PyExc_RuntimeError},
      {StatusCode::kDeadlineExceeded, "DeadlineExceededError", PyExc_TimeoutError},
      {StatusCode::kInternal, "InternalError", PyExc_RuntimeError},
  };
  for (const Spec& s : specs) {
    const std::string qualified = std::string("sparsekv.") + s.name;
    py::tuple bases = py::make_tuple(e.base, py::handle(s.builtin));
    py::object cls = py::reinterpret_steal<py::object>(
        PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr));
    m.attr(s.name) = cls;
    e.by_code[static_cast<size_t>(s.code)] = cls;
  }
  // kOk never raises; map it to the base so that the table has no hole.
  e.by_code[static_cast<size_t>(StatusCode::kOk)] = e.base;
}

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

  void Admit(RequestId id, int32_t prompt_len, int32_t max_new_tokens, const py::object& stream) {
    Check(manager_->Admit(id, prompt_len, max_new_tokens, Stream(stream)));
  }

  void IngestPrompt(RequestId id, int32_t layer, const py::object& rows, const py::object& stream) {
    TensorRules r{"rows"};
    r.row_bytes = RowStride(options(), layer, "ingest_prompt");
    const StatusOr<int32_t> prompt_len = manager_->SequenceLength(id);
    if (!prompt_len.ok()) {
      Raise(NotFound("IngestPrompt: request " + std::to_string(id) + " is unknown or released"));
    }
    r.exact_rows = *prompt_len;
    r.host_ok_on_cuda = true;
    const TensorArg t = CheckTensor(rows, r, backend_);
    Check(manager_->IngestPrompt(id, layer, t.data, Stream(stream)));
  }

  void Release(RequestId id) { Check(manager_->Release(id)); }
  void Retract(RequestId id) { Check(manager_->Retract(id)); }
  void Resume(RequestId id, const py::object& stream) {
    Check(manager_->Resume(id, Stream(stream)));
  }

  void PlanStep(const std::vector<RequestId>& batch, const py::object& stream) {
    Check(manager_->PlanStep(batch, Stream(stream)));
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
  int32_t SequenceLength(RequestId id) const { return Check(manager_->SequenceLength(id)); }

  HotLayerView HotLayer(int32_t layer) const {
    const int32_t stride = RowStride(options(), layer, "hot_layer");
    return HotLayerView{manager_->HotLayer(layer),
                        int64_t{options().max_requests} * options().slots_per_request(), stride,
                        backend_.is_cuda()};
  }

  int32_t batch_size() const { return manager_->batch_size(); }
  const CacheOptions& options() const { return manager_->options(); }
  const PyBackend& backend() const { return backend_; }

 private:
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
};

py::dict LayerStatsDict(const LayerStats& s) {
  py::dict d;
  d["hits"] = s.hits;
  d["window_hits"] = s.window_hits;
  d["misses"] = s.misses;
  d["padding"] = s.padding;
  d["duplicates"] = s.duplicates;
  d["out_of_range"] = s.out_of_range;
  d["hit_rate"] = s.hit_rate();
  return d;
}

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
      .def_readwrite("row_bytes", &LayerShape::row_bytes)
      .def_readwrite("row_stride", &LayerShape::row_stride)
      .def("__repr__", [](const LayerShape& s) {
        return "LayerShape(row_bytes=" + std::to_string(s.row_bytes) +
               ", row_stride=" + std::to_string(s.row_stride) + ")";
      });

  py::class_<KVGeometry>(m, "KVGeometry", "Shape of the KV cache: one LayerShape per layer.")
      .def(py::init([](std::vector<LayerShape> layers) { return KVGeometry{std::move(layers)}; }),
           py::arg("layers"))
      .def_static("uniform", &KVGeometry::Uniform, py::arg("num_layers"), py::arg("row_bytes"),
                  py::arg("row_stride") = 0,
                  "Every layer has the same row; row_stride 0 means row_bytes.")
      .def_readwrite("layers", &KVGeometry::layers)
      .def_property_readonly("num_layers", &KVGeometry::num_layers)
      .def_property_readonly("token_bytes", &KVGeometry::token_bytes)
      .def_property_readonly("token_stride_bytes", &KVGeometry::token_stride_bytes);

  py::enum_<EvictionPolicy>(m, "EvictionPolicy", "Replacement of the hot slots (options.h).")
      .value("LRU", EvictionPolicy::kLru)
      .value("SEGMENTED_LRU", EvictionPolicy::kSegmentedLru);

  const CacheOptions defaults;
  py::class_<CacheOptions>(m, "CacheOptions",
                           "Options of a manager; fields and defaults as in "
                           "include/sparsekv/options.h.")
      .def(py::init([](KVGeometry geometry, int32_t top_k, int32_t hot_slots, int32_t window,
                       int64_t host_capacity_tokens, int32_t max_requests,
                       int32_t max_host_requests, int32_t max_batch, int32_t max_context,
                       int32_t host_page_tokens, bool sort_misses,
                       int32_t sort_misses_min_batch, EvictionPolicy eviction,
                       int32_t protected_percent, int32_t layers_per_index,
                       bool share_repeated_positions, int32_t max_prefetch,
                       int32_t copy_blocks) {
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
           py::arg("copy_blocks") = defaults.copy_blocks)
      .def_readwrite("geometry", &CacheOptions::geometry)
      .def_readwrite("top_k", &CacheOptions::top_k)
      .def_readwrite("hot_slots", &CacheOptions::hot_slots)
      .def_readwrite("window", &CacheOptions::window)
      .def_readwrite("host_capacity_tokens", &CacheOptions::host_capacity_tokens)
      .def_readwrite("max_requests", &CacheOptions::max_requests)
      .def_readwrite("max_host_requests", &CacheOptions::max_host_requests)
      .def_readwrite("max_batch", &CacheOptions::max_batch)
      .def_readwrite("max_context", &CacheOptions::max_context)
      .def_readwrite("host_page_tokens", &CacheOptions::host_page_tokens)
      .def_readwrite("sort_misses", &CacheOptions::sort_misses)
      .def_readwrite("sort_misses_min_batch", &CacheOptions::sort_misses_min_batch)
      .def_readwrite("eviction", &CacheOptions::eviction)
      .def_readwrite("protected_percent", &CacheOptions::protected_percent)
      .def_readwrite("layers_per_index", &CacheOptions::layers_per_index)
      .def_readwrite("share_repeated_positions", &CacheOptions::share_repeated_positions)
      .def_readwrite("max_prefetch", &CacheOptions::max_prefetch)
      .def_readwrite("copy_blocks", &CacheOptions::copy_blocks)
      .def_property_readonly("protected_capacity", &CacheOptions::protected_capacity)
      .def_property_readonly("effective_max_batch", &CacheOptions::effective_max_batch)
      .def_property_readonly("slots_per_request", &CacheOptions::slots_per_request)
      .def(
          "validate", [](const CacheOptions& o) { Check(ValidateOptions(o)); },
          "Raises InvalidArgumentError naming the field and the rule that fails.");

  py::class_<LayerStats>(m, "LayerStats", "Resolve counters of one layer (or of all layers).")
      .def_readonly("hits", &LayerStats::hits)
      .def_readonly("window_hits", &LayerStats::window_hits)
      .def_readonly("misses", &LayerStats::misses)
      .def_readonly("padding", &LayerStats::padding)
      .def_readonly("duplicates", &LayerStats::duplicates)
      .def_readonly("out_of_range", &LayerStats::out_of_range)
      .def_property_readonly("hit_rate", &LayerStats::hit_rate,
                             "(hits + window_hits) / (hits + window_hits + misses); 0 if none.")
      .def("to_dict", &LayerStatsDict);

  py::class_<CacheStats>(m, "CacheStats", "Statistics; formulas in include/sparsekv/manager.h.")
      .def_readonly("layers", &CacheStats::layers)
      .def_readonly("total", &CacheStats::total)
      .def_readonly("bytes_host_to_device", &CacheStats::bytes_host_to_device)
      .def_readonly("bytes_device_to_host", &CacheStats::bytes_device_to_host)
      .def_readonly("bytes_assembled", &CacheStats::bytes_assembled)
      .def_readonly("bytes_ingested", &CacheStats::bytes_ingested)
      .def_readonly("invalid_copy_entries", &CacheStats::invalid_copy_entries)
      .def_readonly("host_pages_used", &CacheStats::host_pages_used)
      .def_readonly("host_pages_total", &CacheStats::host_pages_total)
      .def_readonly("hot_blocks_used", &CacheStats::hot_blocks_used)
      .def_readonly("device_bytes", &CacheStats::device_bytes)
      .def_readonly("prefetch_lookups", &CacheStats::prefetch_lookups)
      .def_readonly("prefetch_rows", &CacheStats::prefetch_rows)
      .def("to_dict", [](const CacheStats& s) {
        py::dict d;
        py::list layers;
        for (const LayerStats& l : s.layers) layers.append(LayerStatsDict(l));
        d["layers"] = layers;
        d["total"] = LayerStatsDict(s.total);
        d["bytes_host_to_device"] = s.bytes_host_to_device;
        d["bytes_device_to_host"] = s.bytes_device_to_host;
        d["bytes_assembled"] = s.bytes_assembled;
        d["bytes_ingested"] = s.bytes_ingested;
        d["invalid_copy_entries"] = s.invalid_copy_entries;
        d["prefetch_lookups"] = s.prefetch_lookups;
        d["prefetch_rows"] = s.prefetch_rows;
        d["host_pages_used"] = s.host_pages_used;
        d["host_pages_total"] = s.host_pages_total;
        d["hot_blocks_used"] = s.hot_blocks_used;
        d["device_bytes"] = s.device_bytes;
        return d;
      });

  py::class_<PyBackend>(m, "Backend", "Where a manager's memory lives and its operators run.")
      .def_property_readonly("kind",
                             [](const PyBackend& b) { return b.is_cuda() ? "cuda" : "cpu"; })
      .def_property_readonly("name", [](const PyBackend& b) { return b.backend->name(); })
      .def_property_readonly(
          "device", [](const PyBackend& b) { return b.device; },
          "CUDA device ordinal; -1 for the CPU backend.")
      .def("__repr__",
           [](const PyBackend& b) { return "<sparsekv.Backend " + b.backend->name() + ">"; });

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
      .def_readonly("rows", &HotLayerView::rows)
      .def_readonly("row_stride", &HotLayerView::row_stride)
      .def_property_readonly(
          "data_ptr", [](const HotLayerView& v) { return reinterpret_cast<uintptr_t>(v.data); })
      .def_property_readonly("__cuda_array_interface__",
                             [](const HotLayerView& v) {
                               if (!v.cuda) throw py::attribute_error("host memory");
                               return v.Interface();
                             })
      .def_property_readonly("__array_interface__", [](const HotLayerView& v) {
        if (v.cuda) throw py::attribute_error("device memory");
        return v.Interface();
      });

  const py::arg_v no_stream = py::arg("stream") = py::none();
  py::class_<PyManager>(m, "SparseKVCacheManager",
                        "The request lifecycle and per-step entry points "
                        "(include/sparsekv/manager.h).")
      .def(py::init<const CacheOptions&, PyBackend>(), py::arg("options"), py::arg("backend"))
      .def("admit", &PyManager::Admit, py::arg("request_id"), py::arg("prompt_len"),
           py::arg("max_new_tokens"), no_stream)
      .def("ingest_prompt", &PyManager::IngestPrompt, py::arg("request_id"), py::arg("layer"),
           py::arg("rows"), no_stream)
      .def("release", &PyManager::Release, py::arg("request_id"))
      .def("retract", &PyManager::Retract, py::arg("request_id"))
      .def("resume", &PyManager::Resume, py::arg("request_id"), no_stream)
      .def("plan_step", &PyManager::PlanStep, py::arg("batch"), no_stream)
      .def("append_token", &PyManager::AppendToken, py::arg("layer"), py::arg("new_rows"),
           no_stream)
      .def("run_layer", &PyManager::RunLayer, py::arg("layer"), py::arg("topk"), py::arg("slots"),
           py::arg("assembled") = py::none(), no_stream)
      .def("resolve_layer", &PyManager::ResolveLayer, py::arg("layer"), py::arg("topk"),
           py::arg("slots"), py::arg("fill_mask") = py::none(), no_stream)
      .def("copy_misses", &PyManager::CopyMisses, py::arg("layer"), no_stream)
      .def("assemble_layer", &PyManager::AssembleLayer, py::arg("layer"), py::arg("slots"),
           py::arg("assembled"), no_stream)
      .def("prefetch_layer", &PyManager::PrefetchLayer, py::arg("layer"), py::arg("positions"),
           no_stream)
      .def("finish_step", &PyManager::FinishStep, no_stream)
      .def("finish_replayed_step", &PyManager::FinishReplayedStep)
      .def("read_stats", &PyManager::ReadStats, no_stream)
      .def("reset_stats", &PyManager::ResetStats, no_stream)
      .def("sequence_length", &PyManager::SequenceLength, py::arg("request_id"))
      .def("hot_layer", &PyManager::HotLayer, py::arg("layer"), py::keep_alive<0, 1>())
      .def_property_readonly("batch_size", &PyManager::batch_size)
      .def_property_readonly("options", &PyManager::options)
      .def_property_readonly("backend", &PyManager::backend);
}
