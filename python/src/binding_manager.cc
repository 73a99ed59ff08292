// sparsekv._core: Backend and its factories, HotLayer and SparseKVCacheManager.
//
// Thread safety: a manager is not thread-safe; its methods hold the GIL, which serialises calls.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "binding_util.h"
#include "sparsekv/backend.h"
#include "sparsekv/manager.h"
#include "sparsekv/options.h"
#include "sparsekv/peer_tier.h"

namespace sparsekv {
namespace {

// ---- The hot-cache layer as an array ----

// One layer of the hot cache, [rows, row_stride] bytes, exposed through __cuda_array_interface__
// (CUDA backend) or __array_interface__ (CPU backend), and through DLPack (__dlpack__,
// __dlpack_device__) on both, so that torch.as_tensor, torch.from_dlpack, numpy.asarray and
// cupy.asarray wrap it without a copy. Keeps its manager alive.
struct HotLayerView {
  const std::byte* data;
  int64_t rows;
  int64_t row_stride;
  bool cuda;
  int32_t device;  // the CUDA device; 0 on the CPU

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

// ---- Resident entries and raw windows (DeepSeek-V4's layer kinds) ----

// A layer's resident entries (DenseEntriesView) or raw window (RawWindowView) in the planned
// step, with the backend it lives on: the device pointers for a kernel, and on the CPU backend
// the rows of a batch row copied out as a numpy array. Keeps its manager alive; valid until the
// next plan_step.
template <typename View>
struct LayerKindView {
  View view;
  bool cuda;

  // Returns b if batch row b can be read on the host: CPU backend (else ValueError: the view's
  // tables are in device memory), b < *batch_size and in use (else IndexError).
  int32_t CheckRow(int32_t b, const char* op) const {
    if (cuda) {
      throw py::value_error(std::string(op) +
                            ": device memory (CUDA backend); read it with a kernel through the "
                            "pointers");
    }
    if (b < 0 || b >= *view.batch_size) {
      throw py::index_error(std::string(op) + ": batch row " + std::to_string(b) +
                            " out of range [0, " + std::to_string(*view.batch_size) + ")");
    }
    if (view.table_row[b] < 0) {
      throw py::index_error(std::string(op) + ": batch row " + std::to_string(b) + " is unused");
    }
    return b;
  }
};
using PyDenseEntries = LayerKindView<DenseEntriesView>;
using PyRawWindow = LayerKindView<RawWindowView>;

// Copies `count` rows of `stride` bytes, row i from row(i), into a [count, stride] uint8 array.
template <typename RowFn>
py::array_t<uint8_t> CopyRows(int32_t count, int32_t stride, RowFn row) {
  py::array_t<uint8_t> out({static_cast<py::ssize_t>(count), static_cast<py::ssize_t>(stride)});
  uint8_t* dst = out.mutable_data();
  for (int32_t i = 0; i < count; ++i) {
    std::memcpy(dst + static_cast<int64_t>(i) * stride, row(i), static_cast<size_t>(stride));
  }
  return out;
}

// ---- The manager ----

// InvalidArgumentError (a ValueError) for a layer out of range, as the library says it.
class PyManager {
 public:
  PyManager(const CacheOptions& options, PyBackend backend, const PyNodePool* pool)
      : backend_(std::move(backend)) {
    manager_ = Check(pool == nullptr
                         ? SparseKVCacheManager::Create(options, backend_.backend)
                         : SparseKVCacheManager::Create(options, backend_.backend, pool->pool));
  }

  void AdmitFromNodePool(PyRequestId id, int32_t owner, uint64_t seal, int32_t max_new_tokens,
                         const py::object& stream) {
    Check(manager_->AdmitSealedPrompt(id.value, owner, seal, max_new_tokens, Stream(stream)));
    cached_.erase(id.value);
  }

  // ---- The peer tier (peer_tier.h) ----
  void AttachPeerTier(int32_t max_regions) {
    PeerTierOptions options;
    options.max_regions = max_regions;
    Check(sparsekv::AttachPeerTier(*manager_, options));
  }
  int32_t ImportPeerRegion(const std::string& descriptor, const py::object& stream) {
    return Check(sparsekv::ImportPeerRegion(*manager_, descriptor, Stream(stream)));
  }
  void DetachPeerRegion(int32_t region, const py::object& stream) {
    Check(sparsekv::DetachPeerRegion(*manager_, region, Stream(stream)));
  }
  void CheckPeerRegion(int32_t region) const {
    Check(sparsekv::PeerRegionStatus(*manager_, region));
  }
  void MapPeerRows(PyRequestId id, int32_t region, int32_t first_row, int32_t tokens,
                   const py::object& stream) {
    Check(sparsekv::MapPeerRows(*manager_, id.value, region, first_row, tokens, Stream(stream)));
  }
  void AdmitFromPeer(PyRequestId id, int32_t region, int32_t first_row, int32_t prompt_len,
                     int32_t max_new_tokens, const py::object& stream) {
    Check(sparsekv::AdmitFromPeer(*manager_, id.value, region, first_row, prompt_len,
                                  max_new_tokens, Stream(stream)));
    cached_.erase(id.value);
  }
  uint64_t PeerRowsRead(const py::object& stream) {
    return Check(sparsekv::PeerRowsRead(*manager_, Stream(stream)));
  }

  void Admit(PyRequestId id, int32_t prompt_len, int32_t max_new_tokens, const py::object& stream) {
    Check(manager_->Admit(id.value, prompt_len, max_new_tokens, Stream(stream)));
    cached_.erase(id.value);
  }

  void IngestPrompt(PyRequestId id, int32_t layer, const py::object& rows, const py::object& window,
                    const py::object& stream) {
    IngestWithWindow(id.value, layer, rows, window, /*suffix=*/false, stream);
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
                          const py::object& window, const py::object& stream) {
    IngestWithWindow(id.value, layer, rows, window, /*suffix=*/true, stream);
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
    const std::vector<RequestId> ids = RequestIds(batch);
    if (token_ids.has_value()) {
      Check(manager_->PlanStep(ids, *token_ids, Stream(stream)));
    } else {
      Check(manager_->PlanStep(ids, Stream(stream)));
    }
  }

  // The pointer form for an offloaded layer without a raw window (its callers' form); StepRows
  // otherwise, or whenever `window` is given.
  void AppendToken(int32_t layer, const py::object& new_rows, const py::object& new_keys,
                   const py::object& window, const py::object& stream) {
    const int32_t stride = RowStride(options(), layer, "append_token");
    const LayerShape& shape = options().geometry.layers[layer];
    if (window.is_none() && shape.kind == LayerKind::kOffloaded && options().raw_window == 0) {
      const TensorArg t = CheckNewRows(new_rows, *manager_, layer, "append_token", backend_);
      const void* keys = CheckNewKeys(new_keys, *manager_, backend_);
      Check(manager_->AppendToken(layer, t.data, keys, Stream(stream)));
      return;
    }
    StepRows step;
    if (!new_rows.is_none() && shape.kind != LayerKind::kWindowOnly) {
      step.entries = CheckNewRows(new_rows, *manager_, layer, "append_token", backend_).data;
    }
    step.keys = CheckNewKeys(new_keys, *manager_, backend_);
    if (!window.is_none()) {
      TensorRules w{"window"};
      w.row_bytes = stride;
      w.min_rows = manager_->batch_size();
      step.window = CheckTensor(window, w, backend_).data;
    }
    Check(manager_->AppendToken(layer, step, Stream(stream)));
  }

  PyDenseEntries DenseEntries(int32_t layer) const {
    RowStride(options(), layer, "dense_entries");
    return PyDenseEntries{Check(manager_->DenseEntries(layer)), backend_.is_cuda()};
  }
  PyRawWindow RawWindow(int32_t layer) const {
    RowStride(options(), layer, "raw_window");
    return PyRawWindow{Check(manager_->RawWindow(layer)), backend_.is_cuda()};
  }

  void IngestIndexerKeys(PyRequestId id, int32_t layer, const py::object& keys,
                         const py::object& stream) {
    RowStride(options(), layer, "ingest_indexer_keys");
    TensorRules r{"keys"};
    r.row_bytes = options().indexer_key_bytes;
    const StatusOr<int32_t> prompt_len = manager_->SequenceLength(id.value);
    if (!prompt_len.ok() || r.row_bytes == 0) {
      Check(manager_->IngestIndexerKeys(id.value, layer, nullptr, Stream(stream)));
    }
    r.exact_rows = *prompt_len;
    r.host_ok_on_cuda = true;
    const TensorArg t = CheckTensor(keys, r, backend_);
    Check(manager_->IngestIndexerKeys(id.value, layer, t.data, Stream(stream)));
  }

  IndexerKeyView IndexerKeys(int32_t layer) const {
    RowStride(options(), layer, "indexer_keys");
    return manager_->IndexerKeys(layer);
  }

  TensorArg TopK(const py::object& topk, const char* name, int32_t top_k) const {
    return CheckTopK(topk, name, top_k, *manager_, backend_);
  }
  TensorArg Slots(const py::object& slots, const char* name) const {
    return CheckSlots(slots, name, *manager_, backend_);
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

  void CopyMissChunk(int32_t layer, int32_t chunk, const py::object& stream) {
    Check(manager_->CopyMissChunk(layer, chunk, Stream(stream)));
  }

  bool StepCanMiss() const { return manager_->StepCanMiss(); }

  void SkipMissCopy(int32_t layer) { Check(manager_->SkipMissCopy(layer)); }

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
    const TensorArg t = Positions(positions);
    Check(manager_->PrefetchLayer(layer, static_cast<const int32_t*>(t.data),
                                  static_cast<int32_t>(t.shape[1]), Stream(stream)));
  }
  void ResolvePrefetch(int32_t layer, const py::object& positions, const py::object& stream) {
    const TensorArg t = Positions(positions);
    Check(manager_->ResolvePrefetch(layer, static_cast<const int32_t*>(t.data),
                                    static_cast<int32_t>(t.shape[1]), Stream(stream)));
  }
  void CopyPrefetch(int32_t layer, const py::object& stream) {
    Check(manager_->CopyPrefetch(layer, Stream(stream)));
  }
  // positions: int32 [>= batch, count].
  TensorArg Positions(const py::object& positions) const {
    TensorRules pr{"positions"};
    pr.int32 = true;
    pr.min_rows = manager_->batch_size();
    const TensorArg t = CheckTensor(positions, pr, backend_);
    if (t.shape.size() != 2) throw py::value_error("positions: must be [batch, count]");
    return t;
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
    if (!options().geometry.offloaded(layer)) {
      Raise(InvalidArgument("hot_layer: layer " + std::to_string(layer) + " is " +
                            LayerKindName(options().geometry.layers[layer].kind) +
                            ", which has no rows in the hot cache (dense_entries and raw_window "
                            "read it)"));
    }
    return HotLayerView{manager_->HotLayer(layer), manager_->HotLayerRows(), stride,
                        backend_.is_cuda(), backend_.is_cuda() ? backend_.device : 0};
  }

  int32_t batch_size() const { return manager_->batch_size(); }
  const CacheOptions& options() const { return manager_->options(); }
  const PyBackend& backend() const { return backend_; }
  ManagerRef Ref() { return ManagerRef{manager_.get(), &backend_, &streams_}; }

 private:
  // The single-pointer form for an offloaded layer without a raw window (its callers' form);
  // PromptRows otherwise, or whenever `window` is given. With `suffix`, the rows past the cached
  // prefix (IngestPromptSuffix): a resident layer of cadence r takes its entries
  // [floor(cached / r), floor(prompt_len / r)).
  void IngestWithWindow(RequestId id, int32_t layer, const py::object& rows,
                        const py::object& window, bool suffix, const py::object& stream) {
    const char* op = suffix ? "ingest_prompt_suffix" : "ingest_prompt";
    const int32_t stride = RowStride(options(), layer, op);
    const LayerShape& shape = options().geometry.layers[layer];
    auto it = cached_.find(id);
    const int32_t cached = suffix && it != cached_.end() ? it->second : 0;
    if (window.is_none() && shape.kind == LayerKind::kOffloaded && options().raw_window == 0) {
      Ingest(id, layer, rows, cached, op, stream);
      return;
    }
    const StatusOr<int32_t> prompt_len = manager_->SequenceLength(id);
    if (!prompt_len.ok()) {
      Raise(NotFound(std::string(op) + ": request " + std::to_string(id) +
                     " is unknown or released"));
    }
    PromptRows p;
    if (!rows.is_none() && shape.kind != LayerKind::kWindowOnly) {
      TensorRules r{"rows"};
      r.row_bytes = stride;
      r.exact_rows = *prompt_len / shape.entry_tokens - cached / shape.entry_tokens;
      r.host_ok_on_cuda = true;
      p.entries = CheckTensor(rows, r, backend_).data;
    }
    if (!window.is_none()) {
      TensorRules w{"window"};
      w.row_bytes = stride;
      w.exact_rows = std::min(*prompt_len, options().raw_window);
      w.host_ok_on_cuda = true;
      p.window = CheckTensor(window, w, backend_).data;
    }
    Check(suffix ? manager_->IngestPromptSuffix(id, layer, p, Stream(stream))
                 : manager_->IngestPrompt(id, layer, p, Stream(stream)));
  }

  // IngestPrompt (rows_first 0: the prompt's entries, floor(prompt_len / entry_tokens) rows) or
  // IngestPromptSuffix (rows_first = cached tokens, a whole number of entries: the entries past
  // them). The row count is checked here, since the library reads that many rows from the
  // pointer.
  void Ingest(RequestId id, int32_t layer, const py::object& rows, int32_t rows_first,
              const char* op, const py::object& stream) {
    TensorRules r{"rows"};
    r.row_bytes = RowStride(options(), layer, op);
    const StatusOr<int32_t> prompt_len = manager_->SequenceLength(id);
    if (!prompt_len.ok()) {
      Raise(NotFound(std::string(op) + ": request " + std::to_string(id) +
                     " is unknown or released"));
    }
    const int32_t entry_tokens = options().geometry.layers[layer].entry_tokens;
    r.exact_rows = (*prompt_len - rows_first) / entry_tokens;
    r.host_ok_on_cuda = true;
    // None: no rows (the manager refuses it where there are rows to give).
    const void* data = rows.is_none() ? nullptr : CheckTensor(rows, r, backend_).data;
    if (rows_first == 0) {
      Check(manager_->IngestPrompt(id, layer, data, Stream(stream)));
    } else {
      Check(manager_->IngestPromptSuffix(id, layer, data, Stream(stream)));
    }
  }

  // See binding_util.h for the rules.
  StreamHandle Stream(const py::object& stream) { return streams_.Resolve(stream, backend_); }

  PyBackend backend_;
  std::unique_ptr<SparseKVCacheManager> manager_;
  StreamResolver streams_;
  // The `cached` AdmitWithPrefix returned, per request admitted so (until it is released,
  // retained or admitted again): the rows ingest_prompt_suffix must be given.
  std::unordered_map<RequestId, int32_t> cached_;
};

void RegisterIndexerKeys(py::module_& m) {
  py::class_<IndexerKeyView>(m, "IndexerKeys",
                             "Where a layer's indexer keys live (device memory under CUDA): the "
                             "key of position p of the request in batch row b is key_bytes bytes "
                             "at keys_ptr + page_table[batch[b].page_table_row * "
                             "pages_per_request + p // keys_per_page] * row_stride + "
                             "(p % keys_per_page) * key_bytes. Addresses are valid for the "
                             "manager's lifetime.")
      .def_property_readonly(
          "keys_ptr", [](const IndexerKeyView& v) { return reinterpret_cast<uintptr_t>(v.keys); },
          "The layer's device memory (hot_layer's data_ptr).")
      .def_readonly("row_stride", &IndexerKeyView::row_stride, "Bytes per slot of that memory.")
      .def_property_readonly(
          "page_table_ptr",
          [](const IndexerKeyView& v) { return reinterpret_cast<uintptr_t>(v.page_table); },
          "int32 [owners, pages_per_request]: first slot of each key page.")
      .def_readonly("pages_per_request", &IndexerKeyView::pages_per_request,
                    "Key pages per page-table row.")
      .def_readonly("keys_per_page", &IndexerKeyView::keys_per_page, "Keys a page holds.")
      .def_readonly("key_bytes", &IndexerKeyView::key_bytes, "indexer_key_bytes.")
      .def_property_readonly(
          "batch_ptr", [](const IndexerKeyView& v) { return reinterpret_cast<uintptr_t>(v.batch); },
          "BatchEntry [max_batch] of the planned step: int32 block, seq_len, page_table_row, "
          "resident.")
      .def_property_readonly(
          "batch_size_ptr",
          [](const IndexerKeyView& v) { return reinterpret_cast<uintptr_t>(v.batch_size); },
          "int32 scalar: rows of the planned step.");
}

void RegisterLayerKindViews(py::module_& m) {
  auto ptr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  py::class_<PyDenseEntries>(
      m, "DenseEntries",
      "A resident layer's entries in the planned step (DenseEntriesView in "
      "include/sparsekv/kernel_views.h): batch row b has floor(seq_len[b] / entry_tokens) "
      "entries, entry e at pages[table_row[b] * pages_per_row + e // page_rows] + "
      "(e % page_rows) * row_stride. Valid until the next plan_step; keeps the manager alive.")
      .def_property_readonly(
          "batch_size_ptr", [ptr](const PyDenseEntries& v) { return ptr(v.view.batch_size); },
          "int32 scalar: rows of the planned step.")
      .def_property_readonly(
          "table_row_ptr", [ptr](const PyDenseEntries& v) { return ptr(v.view.table_row); },
          "int32 [max_batch]: the request's row of pages, -1 = unused.")
      .def_property_readonly(
          "seq_len_ptr", [ptr](const PyDenseEntries& v) { return ptr(v.view.seq_len); },
          "int32 [max_batch]: tokens of the request, this step's included.")
      .def_property_readonly(
          "pages_ptr", [ptr](const PyDenseEntries& v) { return ptr(v.view.pages); },
          "Pointer [table_rows, pages_per_row]: address of each page of the layer.")
      .def_property_readonly(
          "pages_per_row", [](const PyDenseEntries& v) { return v.view.pages_per_row; },
          "Pages per table row.")
      .def_property_readonly(
          "page_rows", [](const PyDenseEntries& v) { return v.view.page_rows; },
          "Entries per page.")
      .def_property_readonly(
          "row_stride", [](const PyDenseEntries& v) { return v.view.row_stride; },
          "Bytes between the entries of a page.")
      .def_property_readonly(
          "entry_tokens", [](const PyDenseEntries& v) { return v.view.entry_tokens; },
          "The layer's cadence r.")
      .def(
          "count",
          [](const PyDenseEntries& v, int32_t b) {
            return v.view.Count(v.CheckRow(b, "DenseEntries.count"));
          },
          py::arg("b"), "Entries of batch row b (CPU backend).")
      .def(
          "entries",
          [](const PyDenseEntries& v, int32_t b) {
            v.CheckRow(b, "DenseEntries.entries");
            return CopyRows(v.view.Count(b), v.view.row_stride,
                            [&](int32_t e) { return v.view.Entry(b, e); });
          },
          py::arg("b"),
          "Batch row b's entries, oldest first, copied into a uint8 numpy array [count(b), "
          "row_stride] (CPU backend; ValueError under CUDA, IndexError for a row not in use).");

  py::class_<PyRawWindow>(
      m, "RawWindow",
      "A layer's raw window in the planned step (RawWindowView in "
      "include/sparsekv/kernel_views.h): batch row b has min(seq_len[b], raw_window) rows, "
      "the row of token t in ring slot t % raw_window at rings[table_row[b]] + slot * "
      "row_stride. Valid until the next plan_step; keeps the manager alive.")
      .def_property_readonly(
          "batch_size_ptr", [ptr](const PyRawWindow& v) { return ptr(v.view.batch_size); },
          "int32 scalar: rows of the planned step.")
      .def_property_readonly(
          "table_row_ptr", [ptr](const PyRawWindow& v) { return ptr(v.view.table_row); },
          "int32 [max_batch]: the request's ring, -1 = unused.")
      .def_property_readonly(
          "seq_len_ptr", [ptr](const PyRawWindow& v) { return ptr(v.view.seq_len); },
          "int32 [max_batch]: tokens of the request, this step's included.")
      .def_property_readonly(
          "rings_ptr", [ptr](const PyRawWindow& v) { return ptr(v.view.rings); },
          "Pointer [table_rows]: address of the layer's ring of each request.")
      .def_property_readonly(
          "raw_window", [](const PyRawWindow& v) { return v.view.raw_window; }, "Rows per ring.")
      .def_property_readonly(
          "row_stride", [](const PyRawWindow& v) { return v.view.row_stride; },
          "Bytes between the rows of a ring.")
      .def(
          "valid",
          [](const PyRawWindow& v, int32_t b) {
            return v.view.Valid(v.CheckRow(b, "RawWindow.valid"));
          },
          py::arg("b"), "Window rows of batch row b (CPU backend).")
      .def(
          "rows",
          [](const PyRawWindow& v, int32_t b) {
            v.CheckRow(b, "RawWindow.rows");
            return CopyRows(v.view.Valid(b), v.view.row_stride,
                            [&](int32_t i) { return v.view.Row(b, i); });
          },
          py::arg("b"),
          "Batch row b's window rows, oldest first, copied into a uint8 numpy array [valid(b), "
          "row_stride] (CPU backend; ValueError under CUDA, IndexError for a row not in use).");
}

void RegisterHotLayer(py::module_& m) {
  py::class_<HotLayerView>(m, "HotLayer",
                           "One layer of the hot cache, [rows, row_stride] uint8, wrapped "
                           "without a copy by torch.from_dlpack / torch.as_tensor / "
                           "numpy.asarray / cupy.asarray.")
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
          "The numpy array interface (CPU backend only).")
      .def(
          "__dlpack__",
          [](py::object self, const py::object& stream, const py::object& max_version,
             const py::object& dl_device, const py::object& copy) {
            const auto& v = self.cast<const HotLayerView&>();
            const int32_t type = v.cuda ? dlpack::kDLCUDA : dlpack::kDLCPU;
            if (!dl_device.is_none()) {
              const auto wanted = dl_device.cast<py::tuple>();
              if (wanted[0].cast<int32_t>() != type || wanted[1].cast<int32_t>() != v.device) {
                throw py::buffer_error("HotLayer: the layer cannot be exported to another device");
              }
            }
            if (!copy.is_none() && copy.cast<bool>()) {
              throw py::buffer_error("HotLayer: exported without a copy only (copy=True asked)");
            }
            (void)stream;       // nothing is pending on a stream of ours: the caller orders it
            (void)max_version;  // the legacy capsule, which every consumer accepts
            return ExportDLPack(v.data, {v.rows, v.row_stride}, type, v.device, self);
          },
          py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
          "A DLPack capsule of the layer ([rows, row_stride] uint8, no copy), keeping the manager "
          "alive while the consumer's tensor lives. `stream` is accepted and ignored: the layer's "
          "contents are ordered on the caller's own stream.")
      .def(
          "__dlpack_device__",
          [](const HotLayerView& v) {
            return py::make_tuple(v.cuda ? dlpack::kDLCUDA : dlpack::kDLCPU, v.device);
          },
          "(device type, device id): (1, 0) on the CPU, (2, device) under CUDA.");
}

}  // namespace

void RegisterBackends(py::module_& m) {
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
}

ManagerRef ManagerOf(const py::handle& manager) {
  if (!py::isinstance<PyManager>(manager)) {
    throw py::type_error("expected a sparsekv.SparseKVCacheManager, got an object of type " +
                         std::string(py::str(py::type::handle_of(manager).attr("__name__"))));
  }
  return manager.cast<PyManager&>().Ref();
}

void RegisterManager(py::module_& m) {
  RegisterHotLayer(m);
  RegisterLayerKindViews(m);
  RegisterIndexerKeys(m);

  const py::arg_v no_stream = py::arg("stream") = py::none();
  py::class_<PyManager>(m, "SparseKVCacheManager",
                        "The request lifecycle and per-step entry points "
                        "(include/sparsekv/manager.h). Request ids are ints in [0, 2**64).")
      .def(py::init<const CacheOptions&, PyBackend, const PyNodePool*>(), py::arg("options"),
           py::arg("backend"), py::arg("pool") = py::none(),
           "Validates `options` and allocates the host pool (or uses `pool`, a NodePool whose "
           "shape options must have: NodePool.with_shape), the hot cache and the device buffers "
           "of the run phase on `backend`.")
      // ---- Lifecycle ----
      .def("admit", &PyManager::Admit, py::arg("request_id"), py::arg("prompt_len"),
           py::arg("max_new_tokens"), no_stream,
           "Reserves host pages for prompt_len + max_new_tokens positions and a hot-cache "
           "block. AlreadyExistsError for a known id (live or retained), OutOfRangeError past "
           "max_context, ResourceExhaustedError when full even after evicting every retained "
           "conversation.")
      .def("ingest_prompt", &PyManager::IngestPrompt, py::arg("request_id"), py::arg("layer"),
           py::arg("rows") = py::none(), py::arg("window") = py::none(), no_stream,
           "Writes the prompt KV of one layer, rows [prompt_len // entry_tokens, row_stride] "
           "bytes (the prompt's entries; host or device), into the host pool and its newest "
           "CacheOptions.window entries into the hot cache. Rows of positions admit_with_prefix "
           "found are skipped. Every layer must be ingested before "
           "the request joins a step. With a raw window or a resident or window-only layer, rows "
           "may be None (no entries, or a window-only layer) and window its newest raw rows "
           "[min(prompt_len, raw_window), "
           "row_stride], oldest first (required with a raw window).")
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
           "tokens [0, cached) were found (a multiple of host_page_tokens * entry_tokens, less "
           "than the prompt length, 0 on a miss); ingest only the entries of [cached, "
           "prompt_len) with ingest_prompt_suffix. With resident layers, only a retained "
           "conversation's prefix is shared (its resident entries are restored from its host "
           "copy). Errors as admit(); nothing changes on error.")
      .def("admit_from_node_pool", &PyManager::AdmitFromNodePool, py::arg("request_id"),
           py::arg("owner"), py::arg("seal"), py::arg("max_new_tokens"), no_stream,
           "Admits the prompt `owner` sealed as `seal` in the manager's node pool (by this or "
           "another process), with room for max_new_tokens more: its pages are shared, nothing "
           "is ingested or copied but the window. NotFoundError if the seal has ended (released, "
           "or its writer died): recompute the request.")
      // ---- The peer tier ----
      .def("attach_peer_tier", &PyManager::AttachPeerTier, py::arg("max_regions") = 1,
           "Installs the peer tier: misses on host pages that a peer region also holds are read "
           "from that region (another GPU's memory) instead of host memory. "
           "FailedPreconditionError if the manager has an extension (a tier) already.")
      .def("import_peer_region", &PyManager::ImportPeerRegion, py::arg("descriptor"), no_stream,
           "Maps the region a PeerRegion.descriptor names and returns its index. NotFoundError "
           "if its lender is gone or the region no longer exists; ResourceExhaustedError if "
           "max_regions are imported. Capture a step graph again after importing.")
      .def("detach_peer_region", &PyManager::DetachPeerRegion, py::arg("region"), no_stream,
           "Sends the region's pages back to the host pool and unmaps it (synchronises the "
           "stream).")
      .def("check_peer_region", &PyManager::CheckPeerRegion, py::arg("region"),
           "Returns if the region is imported and its lender alive; UnavailableError once the "
           "lender was found gone (its rows are read from the host pool since), NotFoundError "
           "for an index not imported.")
      .def("map_peer_rows", &PyManager::MapPeerRows, py::arg("request_id"), py::arg("region"),
           py::arg("first_row"), py::arg("tokens"), no_stream,
           "Declares that rows [first_row, first_row + tokens) of the region hold the request's "
           "positions [0, tokens) in every layer: misses on its whole pages among them are read "
           "from the region until the request is released or the region detached.")
      .def("admit_from_peer", &PyManager::AdmitFromPeer, py::arg("request_id"), py::arg("region"),
           py::arg("first_row"), py::arg("prompt_len"), py::arg("max_new_tokens"), no_stream,
           "admit() with the prompt in rows [first_row, first_row + prompt_len) of the region: "
           "ingested into the host pool from there, then mapped (map_peer_rows). Nothing is "
           "left admitted on error.")
      .def("peer_rows_read", &PyManager::PeerRowsRead, no_stream,
           "Rows copied from peer regions since attach_peer_tier (synchronises the stream).")
      .def("ingest_prompt_suffix", &PyManager::IngestPromptSuffix, py::arg("request_id"),
           py::arg("layer"), py::arg("rows") = py::none(), py::arg("window") = py::none(),
           no_stream,
           "ingest_prompt() for a request admitted with admit_with_prefix: rows is "
           "[(prompt_len - cached) // entry_tokens, row_stride], the entries of tokens "
           "[cached, prompt_len) (None if there are none; of a resident layer, its entries "
           "[cached // entry_tokens, prompt_len // entry_tokens), the earlier ones restored at "
           "admission); window is the prompt's newest min(prompt_len, raw_window) raw rows, as "
           "for ingest_prompt (required with a raw window).")
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
      .def("append_token", &PyManager::AppendToken, py::arg("layer"),
           py::arg("new_rows") = py::none(), py::arg("new_keys") = py::none(),
           py::arg("window") = py::none(), no_stream,
           "Stores the newest token's KV of `layer` for every request of the step: new_rows is "
           "[>= batch, row_stride] bytes, row b for the b-th request (the entry the token "
           "completes: read only for rows that complete one; not read for a window-only layer); "
           "with indexer keys, new_keys ([>= batch, indexer_key_bytes] bytes) their keys; with "
           "a raw window, window ([>= batch, row_stride] bytes) the token's raw rows (required "
           "then). A resident layer's entries go to dense_entries, the window rows to "
           "raw_window. Precedes the layer's run_layer.")
      .def("dense_entries", &PyManager::DenseEntries, py::arg("layer"), py::keep_alive<0, 1>(),
           "A resident layer's entries in the planned step (DenseEntries). FailedPreconditionError "
           "without resident layers; InvalidArgumentError for a layer that is not resident.")
      .def("raw_window", &PyManager::RawWindow, py::arg("layer"), py::keep_alive<0, 1>(),
           "A layer's raw window in the planned step (RawWindow). FailedPreconditionError "
           "without a raw window.")
      .def("ingest_indexer_keys", &PyManager::IngestIndexerKeys, py::arg("request_id"),
           py::arg("layer"), py::arg("keys"), no_stream,
           "Writes the prompt's indexer keys of `layer` ([prompt_len, indexer_key_bytes] bytes, "
           "every prompt position) into the manager's device memory.")
      .def("indexer_keys", &PyManager::IndexerKeys, py::arg("layer"),
           "Where an indexer kernel reads the keys of `layer` (IndexerKeys).")
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
      .def("copy_miss_chunk", &PyManager::CopyMissChunk, py::arg("layer"), py::arg("chunk"),
           no_stream,
           "With copy_chunk_rows = R: copies only the misses of batch rows [chunk R, (chunk + 1) "
           "R), so that attention over them may start before the other chunks are in. A layer is "
           "copied whole or by chunks, each once.")
      .def("step_can_miss", &PyManager::StepCanMiss,
           "Whether the planned step's resolves can find a miss: False when every request of its "
           "batch is resident and no extension is active in it. Host side, from plan_step on.")
      .def("skip_miss_copy", &PyManager::SkipMissCopy, py::arg("layer"),
           "In a step that cannot miss (step_can_miss() False): counts `layer` as copied, as "
           "copy_misses would, enqueuing nothing. A graph captured with it replays correctly only "
           "for steps that cannot miss either. FailedPreconditionError in a step that can miss "
           "(nothing is marked); errors otherwise as copy_misses.")
      .def("assemble_layer", &PyManager::AssembleLayer, py::arg("layer"), py::arg("slots"),
           py::arg("assembled"), no_stream,
           "Gathers the rows of slots (as resolve_layer wrote them) of `layer` into assembled "
           "([>= batch, top_k, row_stride] bytes; skipped entries are zero rows).")
      .def("prefetch_layer", &PyManager::PrefetchLayer, py::arg("layer"), py::arg("positions"),
           no_stream,
           "Brings positions (int32 [>= batch, count], -1 = padding, count <= max_prefetch) into "
           "the hot cache of `layer`'s index group for a later step.")
      .def("resolve_prefetch", &PyManager::ResolvePrefetch, py::arg("layer"), py::arg("positions"),
           no_stream,
           "The first part of prefetch_layer: decides where the positions go (on `stream`).")
      .def("copy_prefetch", &PyManager::CopyPrefetch, py::arg("layer"), no_stream,
           "The second part: copies the rows resolve_prefetch chose (on its own stream, ordered "
           "after the resolve; the group's reads and miss copies after it).")
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

}  // namespace sparsekv
