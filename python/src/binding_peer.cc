// sparsekv._core: PeerRegion, device memory lent to the other processes of a machine for the peer
// tier (include/sparsekv/peer_tier.h). The decoder's side is SparseKVCacheManager's
// attach_peer_tier, import_peer_region, map_peer_rows, admit_from_peer (binding_manager.cc).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>

#include "binding_util.h"
#include "sparsekv/peer_tier.h"

namespace sparsekv {
namespace {

struct PyPeerRegion {
  std::unique_ptr<PeerRegion> region;
  PyBackend backend;
  KVGeometry geometry;
  StreamResolver streams{};
};

void WriteRows(PyPeerRegion& p, int32_t layer, int32_t first_row, const py::object& rows,
               int32_t tokens, const py::object& stream) {
  if (layer < 0 || layer >= p.geometry.num_layers()) {
    throw py::value_error("write_rows: layer " + std::to_string(layer) + " out of range [0, " +
                          std::to_string(p.geometry.num_layers()) + ")");
  }
  TensorRules r{"rows"};
  r.row_bytes = p.geometry.layers[layer].row_stride;
  r.exact_rows = tokens;
  r.host_ok_on_cuda = true;
  const TensorArg t = CheckTensor(rows, r, p.backend);
  Check(
      p.region->WriteRows(layer, first_row, t.data, tokens, p.streams.Resolve(stream, p.backend)));
}

}  // namespace

void RegisterPeerRegion(py::module_& m) {
  py::class_<PyPeerRegion>(
      m, "PeerRegion",
      "Device memory of this process lent to the other processes of the machine: the peer "
      "tier's lender side (include/sparsekv/peer_tier.h). It is laid out as the host pool is; "
      "a decoder imports it by its descriptor and reads the misses on the rows it maps from it. "
      "Keep it alive while any decoder maps it.")
      .def_static(
          "create",
          [](const KVGeometry& geometry, int32_t rows, const PyBackend& backend) {
            return PyPeerRegion{Check(PeerRegion::Create(geometry, rows, backend.backend)), backend,
                                geometry};
          },
          py::arg("geometry"), py::arg("rows"), py::arg("backend"),
          "A region of `rows` rows per layer of `geometry` in `backend`'s device memory "
          "(zeroed). UnavailableError if the backend cannot share device memory.")
      .def_property_readonly(
          "descriptor", [](const PyPeerRegion& p) { return p.region->descriptor().Serialize(); },
          "What a decoder passes to import_peer_region (e.g. through the control plane).")
      .def_property_readonly(
          "generation", [](const PyPeerRegion& p) { return p.region->descriptor().generation; },
          "The region's generation (a number no other region of the machine has).")
      .def_property_readonly(
          "rows", [](const PyPeerRegion& p) { return p.region->rows(); }, "Rows per layer.")
      .def("write_rows", &WriteRows, py::arg("layer"), py::arg("first_row"), py::arg("rows"),
           py::arg("tokens"), py::arg("stream") = py::none(),
           "Copies rows [tokens, row_stride] bytes (host, or the backend's device) of `layer` "
           "into rows [first_row, first_row + tokens) of the region. OutOfRangeError if they do "
           "not fit.");
}

}  // namespace sparsekv
