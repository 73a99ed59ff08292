// The shared parts of the sparsekv._core binding: errors, tensor views and stream arguments.
#include "binding_util.h"

#include <cstdint>
#include <string>
#include <vector>

#include "sparsekv/manager.h"

#if defined(SPARSEKV_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace sparsekv {

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

namespace {

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

using namespace dlpack;  // NOLINT: the ABI's own names

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

}  // namespace

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

// See the file comment of binding_util.h for the rules.
StreamHandle StreamResolver::Resolve(const py::object& stream, const PyBackend& backend) {
  return Resolve(stream, backend.is_cuda() ? backend.device : -1);
}

StreamHandle StreamResolver::Resolve(const py::object& stream, int cuda_device) {
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
  if (cuda_device < 0) return nullptr;
  if (!torch_current_stream_.has_value()) {
    // Looked up once: a failed import is not retried at every call.
    try {
      torch_current_stream_ = py::module_::import("torch").attr("cuda").attr("current_stream");
    } catch (const py::error_already_set&) {
      torch_current_stream_ = py::none();
    }
  }
  if (torch_current_stream_->is_none()) return nullptr;
  const py::object current = (*torch_current_stream_)(cuda_device);
  return reinterpret_cast<StreamHandle>(current.attr("cuda_stream").cast<uintptr_t>());
}

py::capsule ExportDLPack(const void* data, std::vector<int64_t> shape, int32_t device_type,
                         int32_t device_id, py::object owner) {
  // The managed tensor owns its shape and a reference to `owner`, dropped by its deleter (which
  // the consumer calls when it is done, or the capsule's destructor if it never consumed it).
  struct Context {
    std::vector<int64_t> shape;
    py::object owner;
  };
  auto* context = new Context{std::move(shape), std::move(owner)};
  auto* managed = new DLManagedTensor{};
  managed->dl_tensor.data = const_cast<void*>(data);
  managed->dl_tensor.device = {device_type, device_id};
  managed->dl_tensor.ndim = static_cast<int32_t>(context->shape.size());
  managed->dl_tensor.dtype = {1, 8, 1};  // uint8
  managed->dl_tensor.shape = context->shape.data();
  managed->dl_tensor.strides = nullptr;  // C-contiguous
  managed->dl_tensor.byte_offset = 0;
  managed->manager_ctx = context;
  managed->deleter = [](DLManagedTensor* self) {
    py::gil_scoped_acquire gil;  // consumers may call it from any thread
    delete static_cast<Context*>(self->manager_ctx);
    delete self;
  };
  return py::capsule(managed, "dltensor", [](PyObject* capsule) {
    // Renamed "used_dltensor" by a consumer that took it over; else still ours to free.
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      if (m != nullptr && m->deleter != nullptr) m->deleter(m);
    }
  });
}

// ---- A step's arguments ----

std::vector<RequestId> RequestIds(const std::vector<PyRequestId>& batch) {
  std::vector<RequestId> ids;
  ids.reserve(batch.size());
  for (const PyRequestId& id : batch) ids.push_back(id.value);
  return ids;
}

int32_t RowStride(const CacheOptions& o, int32_t layer, const char* op) {
  if (layer < 0 || layer >= o.geometry.num_layers()) {
    Raise(InvalidArgument(std::string(op) + ": layer " + std::to_string(layer) +
                          " out of range [0, " + std::to_string(o.geometry.num_layers()) + ")"));
  }
  return o.geometry.layers[layer].row_stride;
}

TensorArg CheckNewRows(const py::handle& rows, const SparseKVCacheManager& m, int32_t layer,
                       const char* op, const PyBackend& backend) {
  TensorRules r{"new_rows"};
  r.row_bytes = RowStride(m.options(), layer, op);
  r.min_rows = m.batch_size();
  return CheckTensor(rows, r, backend);
}

const void* CheckNewKeys(const py::handle& keys, const SparseKVCacheManager& m,
                         const PyBackend& backend) {
  if (keys.is_none() || m.options().indexer_key_bytes == 0) return nullptr;
  TensorRules r{"new_keys"};
  r.row_bytes = m.options().indexer_key_bytes;
  r.min_rows = m.batch_size();
  return CheckTensor(keys, r, backend).data;
}

TensorArg CheckTopK(const py::handle& topk, const char* name, int32_t top_k,
                    const SparseKVCacheManager& m, const PyBackend& backend) {
  TensorRules r{name};
  r.int32 = true;
  r.min_rows = m.batch_size();
  r.min_second = top_k;
  return CheckTensor(topk, r, backend);
}

TensorArg CheckSlots(const py::handle& slots, const char* name, const SparseKVCacheManager& m,
                     const PyBackend& backend) {
  TensorRules r{name};
  r.int32 = true;
  r.min_rows = m.batch_size();
  r.second_dim = m.options().top_k;
  r.output = true;
  return CheckTensor(slots, r, backend);
}

}  // namespace sparsekv
