// sparsekv._core: the Python binding of the manager, its options, statistics and backends.
//
// This file defines the module and its exception classes; each group of bound types has a file
// of its own with one Register function (declared in binding_util.h, which also states how
// tensors, streams and errors cross the boundary):
//   binding_options.cc  LayerShape, KVGeometry, EvictionPolicy, CacheOptions, HotCacheShape
//   binding_stats.cc    LayerStats, CacheStats
//   binding_manager.cc  Backend and its factories, HotLayer, SparseKVCacheManager
//   binding_node_pool.cc NodePool
//   binding_peer.cc     PeerRegion
//   binding_attention.cc SparseMLAAttention, WeightStreamProxy, LayerTopKGenerator
//   binding_util.cc     Status to exception, tensor views, stream arguments
#include <pybind11/pybind11.h>

#include <string>

#include "binding_util.h"
#include "sparsekv/status.h"

namespace sparsekv {

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
       "No hot-cache block, host page or pool owner is free (nothing changed), or a pool or "
       "hot cache needs more memory than the machine has (refused before allocating)."},
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
      {StatusCode::kUnimplemented, "UnimplementedError", PyExc_NotImplementedError,
       "Valid, but not served yet: e.g. a layer kind the manager does not hold yet."},
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

}  // namespace sparsekv

PYBIND11_MODULE(_core, m) {
  using namespace sparsekv;
  m.doc() = "sparsekv C++ library binding (see the sparsekv package for the documentation)";
  RegisterErrors(m);
  // In dependency order: pybind11 writes a signature with the Python names of the types
  // registered before it.
  RegisterOptions(m);
  RegisterStats(m);
  RegisterBackends(m);
  RegisterNodePool(m);
  RegisterPeerRegion(m);
  RegisterManager(m);
  RegisterSchedule(m);
  RegisterAttention(m);
}
