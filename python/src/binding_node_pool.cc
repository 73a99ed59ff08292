// sparsekv._core: NodePool, a host KV pool shared by the processes of a machine
// (include/sparsekv/node_pool.h): create or open one, write and seal a prompt in it, and let a
// manager over it admit the prompt without copying (SparseKVCacheManager.admit_from_node_pool).
//
// Thread safety: the pool's calls are thread-safe in the library; here they hold the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "binding_util.h"
#include "sparsekv/node_pool.h"

namespace sparsekv {
namespace {

class PyNodePoolMethods {
 public:
  static PyNodePool Create(const CacheOptions& options, int32_t max_owners, const std::string& name,
                           const PyBackend& backend, const std::string& directory,
                           int32_t max_processes, bool huge_pages) {
    NodePoolOptions node;
    node.name = name;
    node.directory = directory;
    node.max_processes = max_processes;
    node.huge_pages = huge_pages;
    return {Check(CreateNodePool(options, max_owners, node, backend.backend)), backend};
  }
  static PyNodePool Open(const std::string& path, const PyBackend& backend, bool huge_pages) {
    NodePoolOptions node;
    node.huge_pages = huge_pages;
    return {Check(OpenNodePool(path, node, backend.backend)), backend};
  }

  static void WritePromptLayer(PyNodePool& p, int32_t owner, int32_t layer, const py::object& rows,
                               int32_t tokens, const py::object& stream) {
    const KVGeometry& geometry = p.pool->geometry();
    if (layer < 0 || layer >= geometry.num_layers()) {
      throw py::value_error("write_prompt_layer: layer " + std::to_string(layer) +
                            " out of range [0, " + std::to_string(geometry.num_layers()) + ")");
    }
    TensorRules r{"rows"};
    r.row_bytes = geometry.layers[layer].row_stride;
    r.exact_rows = tokens;
    r.host_ok_on_cuda = true;
    const TensorArg t = CheckTensor(rows, r, p.backend);
    Check(sparsekv::WritePromptLayer(*p.pool, *p.backend.backend, owner, layer, t.data, tokens,
                                     p.streams.Resolve(stream, p.backend)));
  }
};

}  // namespace

void RegisterNodePool(py::module_& m) {
  const py::arg_v no_stream = py::arg("stream") = py::none();
  py::class_<PyNodePool>(
      m, "NodePool",
      "A host KV pool in a shared-memory segment that the processes of a machine attach to "
      "(include/sparsekv/node_pool.h). A writer reserves pages for an owner, writes a prompt's "
      "rows, seals them; a SparseKVCacheManager created over the pool (in this or another "
      "process) admits the prompt from the sealed pages without copying it.")
      .def_static("create", &PyNodePoolMethods::Create, py::arg("options"), py::arg("max_owners"),
                  py::arg("name"), py::arg("backend"), py::arg("directory") = "/dev/shm",
                  py::arg("max_processes") = 16, py::arg("huge_pages") = true,
                  "Creates the segment directory/name for options' geometry, "
                  "host_capacity_tokens, host_page_tokens and max_context with max_owners "
                  "page-table rows, and attaches this process. AlreadyExistsError if a live pool "
                  "has that name (a stale one, whose processes all exited, is replaced).")
      .def_static("open", &PyNodePoolMethods::Open, py::arg("path"), py::arg("backend"),
                  py::arg("huge_pages") = true,
                  "Attaches this process to the node pool at `path` (its rows registered with "
                  "`backend`). NotFoundError if there is none.")
      .def_property_readonly(
          "path", [](const PyNodePool& p) { return p.pool->node_pool_path(); },
          "The segment's file.")
      .def_property_readonly(
          "id", [](const PyNodePool& p) { return p.pool->node_pool_id(); },
          "The segment's id (a segment created again under the path has another).")
      .def_property_readonly(
          "descriptor", [](const PyNodePool& p) { return DescribeNodePool(*p.pool).Serialize(); },
          "What another process needs to open it, as the control plane carries it.")
      .def_property_readonly(
          "total_pages", [](const PyNodePool& p) { return p.pool->total_pages(); },
          "Pages of the pool.")
      .def_property_readonly(
          "free_pages", [](const PyNodePool& p) { return p.pool->free_pages(); },
          "Pages no process references (now).")
      .def_property_readonly(
          "free_owners", [](const PyNodePool& p) { return p.pool->free_owners(); },
          "Page-table rows no process holds (now).")
      .def_property_readonly(
          "live_processes", [](const PyNodePool& p) { return p.pool->live_processes(); },
          "Processes attached and not known to have exited (now).")
      .def_property_readonly(
          "max_owners", [](const PyNodePool& p) { return p.pool->max_owners(); },
          "Page-table rows of the pool (live requests and prompts of every process).")
      .def_property_readonly(
          "bytes", [](const PyNodePool& p) { return p.pool->bytes(); },
          "Bytes of rows: total_pages * host_page_tokens * token_stride_bytes.")
      .def(
          "with_shape",
          [](const PyNodePool& p, CacheOptions options) {
            UseNodePoolShape(*p.pool, options);
            return options;
          },
          py::arg("options"),
          "A copy of `options` with the pool's geometry, host_capacity_tokens, host_page_tokens "
          "and max_context, as a manager over this pool must have them.")
      .def(
          "acquire_owner", [](PyNodePool& p) { return Check(p.pool->AcquireOwner()); },
          "A free owner (page-table row), held by this process until release_owner.")
      .def(
          "reserve",
          [](PyNodePool& p, int32_t owner, int32_t tokens) {
            Check(p.pool->Reserve(owner, tokens));
          },
          py::arg("owner"), py::arg("tokens"),
          "Gives `owner` pages for `tokens` positions (ResourceExhaustedError if too few are "
          "free).")
      .def("write_prompt_layer", &PyNodePoolMethods::WritePromptLayer, py::arg("owner"),
           py::arg("layer"), py::arg("rows"), py::arg("tokens"), no_stream,
           "Writes rows [tokens, row_stride] bytes (host, or the backend's device) of `layer` "
           "into the owner's pages.")
      .def(
          "seal",
          [](PyNodePool& p, int32_t owner, int32_t tokens) {
            return Check(p.pool->Seal(owner, tokens));
          },
          py::arg("owner"), py::arg("tokens"),
          "Seals the owner's positions [0, tokens) for readers and returns the seal (an int "
          ">= 1); the pages must not be written again.")
      .def(
          "release",
          [](PyNodePool& p, int32_t owner) {
            if (owner < 0 || owner >= p.pool->max_owners()) {
              throw py::value_error("release: owner " + std::to_string(owner) + " out of range");
            }
            p.pool->Release(owner);
          },
          py::arg("owner"),
          "Drops the owner's page references (its seal ends; readers keep theirs).")
      .def(
          "release_owner",
          [](PyNodePool& p, int32_t owner) {
            if (owner < 0 || owner >= p.pool->max_owners() || p.pool->ReservedTokens(owner) != 0) {
              throw py::value_error("release_owner: owner " + std::to_string(owner) +
                                    " is out of range or holds pages (release it first)");
            }
            p.pool->ReleaseOwner(owner);
          },
          py::arg("owner"), "Gives the owner back (after release).")
      .def(
          "reclaim_dead_processes", [](PyNodePool& p) { return p.pool->ReclaimDeadProcesses(); },
          "Drops the page references and owners of attached processes that exited; returns how "
          "many processes it reclaimed.");
}

}  // namespace sparsekv
