// Sparse MLA decode attention over selected KV rows, and the CPU reference it is tested against.
//
// Shape (DeepSeek-V3.2 / GLM-5 MLA in "absorbed" form): for every request b of a batch, H query
// heads of kMLAQKDim = 576 dims attend to K = top_k selected KV rows. A row holds a 576-dim key;
// its first kMLAValueDim = 512 dims are also the value:
//
//   s[h, k]   = softmax_scale * dot(q[b, h, :], key(row(b, k)))      for unmasked k
//   out[b, h] = sum_k softmax_k(s[h, :]) * key(row(b, k))[0:512]
//
// Row k of request b is row indices[b, k] of one layer's buffer: kv_rows + indices[b, k] *
// row_stride. That covers the hot cache (the manager's layer-wide slots index
// HotCache::layer_data(layer)) and a full-HBM KV buffer (global row numbers) alike. An index < 0
// (kNullSlot / padding) is masked: its weight is zero; a request whose entries are all masked gets
// an output of zeros. Duplicate indices are not special: each occurrence is one softmax entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "sparsekv/backend.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/kv_format.h"
#include "sparsekv/status.h"

namespace sparsekv {

inline constexpr int32_t kMLAQKDim = 576;     // query and key dims per head: 512 latent + 64 rope
inline constexpr int32_t kMLAValueDim = 512;  // value dims: the first 512 of a key

struct SparseMLAOptions {
  // ---- Behaviour ----
  // Largest batch a Run accepts; the work buffers are sized for it. Required (>= 1).
  int32_t max_batch = 0;
  // Query heads per request (128 for the whole model, 16 per GPU under tensor parallelism 8).
  int32_t heads = 128;
  // Selected rows per request (entries of each indices row).
  int32_t top_k = 2048;
  KVRowFormat format = KVRowFormat::kFp8Row656;
  // Multiplies q . k before the softmax. 0 means 1 / sqrt(576).
  float softmax_scale = 0;

  // ---- Performance ----
  // How RunHits / RunFillsAndMerge divide the work (see there).
  enum class Split {
    // RunHits only gathers and dequantises the resident rows; RunFillsAndMerge gathers the rest
    // and runs the whole attention once: bit-identical to Run, nothing computed twice.
    kGatherFirst,
    // RunHits runs the whole attention over the resident rows; RunFillsAndMerge over the others,
    // then merges the two by their log-sum-exp: more of the work before the rows arrive, but the
    // GEMMs and the softmax run twice over all top_k columns (masked).
    kMergeHalves,
  };
  Split split = Split::kGatherFirst;

  float effective_softmax_scale() const;
};

// InvalidArgument unless every field is in range, and the shapes keep the kernels' 32-bit index
// arithmetic in range (max_batch * top_k * 72 < 2^31, max_batch * heads < 2^31).
Status ValidateSparseMLAOptions(const SparseMLAOptions& options);

// The attention operator on one GPU: a gather that dequantises the selected rows into a compact
// bf16 buffer [batch, top_k, 576] (zero rows where masked), then on tensor cores (cuBLAS, bf16
// inputs, fp32 accumulation) S = Q K^T per request into fp32, a masked softmax into bf16 P, and
// O = P V into the bf16 output.
//
// Graph safety: all work memory (workspace_bytes()) is allocated by Create; Run only enqueues
// kernels and cuBLAS calls on the caller's stream, never allocates or synchronises, so it may be
// captured into a CUDA graph. The batch size is a launch parameter: capture one graph per batch.
//
// Thread safety: Run calls share the work buffers. Calls on one stream may follow each other
// freely; runs on different streams must not overlap in time.
class SparseMLAAttention {
 public:
  // Unavailable if the library was built without CUDA or `device` does not exist; InvalidArgument
  // for bad options; Internal for a failing CUDA or cuBLAS call.
  static StatusOr<std::unique_ptr<SparseMLAAttention>> Create(const SparseMLAOptions& options,
                                                              int device = 0);
  virtual ~SparseMLAAttention() = default;

  // Enqueues out = attention(q, rows) for requests [0, batch) on `stream` (semantics at the top of
  // this file). All pointers are device memory of the object's device:
  //   q        [batch, heads, 576] bf16
  //   kv_rows  one layer's row buffer, 16-B aligned; row_stride: bytes between its rows, a
  //            multiple of 16 and >= KVRowBytes(format)
  //   indices  [batch, top_k] int32; < 0 = masked
  //   out      [batch, heads, 512] bf16
  // REQUIRES: every index >= 0 names a row of the buffer (not checked on the device), and the
  // buffers stay valid until the stream reaches the run. InvalidArgument for batch outside
  // [0, max_batch], a null pointer or a misaligned row buffer; batch 0 enqueues nothing.
  virtual Status Run(int32_t batch, const void* q, const std::byte* kv_rows, int64_t row_stride,
                     const int32_t* indices, void* out, StreamHandle stream) = 0;

  // Split attention, to start before every selected row is in place (transfer hiding): the same
  // function as Run, in two halves over the entries of `fill` ([batch, top_k] uint8, device
  // memory; SparseKVCacheManager::ResolveLayer's fill mask). RunHits reads only the rows of the
  // entries with fill 0; RunFillsAndMerge, once the rows of the entries with fill 1 are in place,
  // reads those and writes `out`. With Split::kGatherFirst, RunHits gathers its rows and
  // RunFillsAndMerge gathers the others and attends once: `out` is bit-identical to Run's. With
  // Split::kMergeHalves, RunHits attends over its entries and keeps the partial result (output
  // and log-sum-exp per head) in the work buffers, RunFillsAndMerge attends over the others and
  // merges both exactly (log-sum-exp weights): equal to Run's up to rounding (partials in fp32).
  // REQUIRES (not checked: the stream order and the contents of device buffers): RunFillsAndMerge
  // follows RunHits with the same batch, q, kv_rows, indices and fill, on a stream ordered after
  // it, with no other run of this object in between.
  virtual Status RunHits(int32_t batch, const void* q, const std::byte* kv_rows, int64_t row_stride,
                         const int32_t* indices, const uint8_t* fill, StreamHandle stream) = 0;
  virtual Status RunFillsAndMerge(int32_t batch, const void* q, const std::byte* kv_rows,
                                  int64_t row_stride, const int32_t* indices, const uint8_t* fill,
                                  void* out, StreamHandle stream) = 0;

  // The SMs cuBLAS plans this object's GEMMs for (cublasSetSmCountTarget), so that kernels
  // running beside them (a miss copy on a side stream) keep the others; 0: all. Takes effect for
  // later runs (and captures). InvalidArgument for sms < 0; Internal if cuBLAS refuses.
  virtual Status SetSmCountTarget(int32_t sms) = 0;

  // Device bytes held for the work buffers (compact keys, scores, probabilities, cuBLAS).
  virtual int64_t workspace_bytes() const = 0;
  virtual const SparseMLAOptions& options() const = 0;
};

// The same function as SparseMLAAttention::Run, computed in float64 on the CPU over host memory:
// the oracle for the tests. Inputs are exact (bf16 and e4m3 decoded exactly, scales as stored);
// nothing is rounded to bf16 along the way.
//   q        [batch, heads, 576] bf16 (as uint16 bit patterns)
//   kv_rows  the row buffer; row_stride >= KVRowBytes(format), any alignment
//   indices  [batch, top_k]; < 0 = masked
//   out      [batch, heads, 512] float64
// REQUIRES (not checked: the buffer's length is not passed): every index >= 0 names a row of
// the buffer. InvalidArgument for bad options, batch outside [0, max_batch], a null pointer or a
// short row stride.
Status ReferenceSparseMLA(const SparseMLAOptions& options, int32_t batch, const uint16_t* q,
                          const std::byte* kv_rows, int64_t row_stride, const int32_t* indices,
                          double* out);

// The exact decodings it uses (DecodeBf16, DecodeFp8E4M3, DecodeKVRow) are in kv_format.h.

// ---- Two scopes and a sink: the float64 oracle of DeepSeek-V4's decode attention ----
//
// Per request b and head h, over the unmasked entries k of two scopes (the selected entries: a
// top-k row, or every entry of a resident layer; and the raw window, the newest tokens' rows):
//
//   s_k  = scale * dot(q[b, h, :], key_k)
//   lse  = log sum_k exp(s_k)
//   out  = sum_k exp(s_k - lse) * value_k,  then with an attention sink sigma_h:
//   out *= 1 / (1 + exp(sigma_h - lse))
//
// A request whose entries are all masked gets zeros (with or without a sink). Keys have
// FormatShape(format).key_dims dims (576 for the DSA rows, 512 for kFp8Entry584), values are the
// key's first value_dims (512). This is what FlashMLA's V4 decode computes (its tests/ref.py);
// with one scope and no sink it is ReferenceSparseMLA.

// One scope, in one of two forms.
//   Indexed (store.source == kNone, e.g. a CSA layer's top-k over the hot cache): entry k of
//   request b is row indices[b * width + k] of `rows`; an index < 0 is masked. Duplicates are not
//   special: each occurrence is one softmax entry.
//   Store (store.source set; made by DenseEntriesScope or RawWindowScope): request b's entries
//   are read in place from a DenseLayerStore's views, store.Count(b) of them in the order of
//   StoreScopeView (kernel_views.h); rows, row_stride, indices and width are not read. The same
//   entries as an indexed scope of store.Count(b) gathered rows followed by any padding.
// All pointers, those inside the views included: host memory for the oracle, device memory for
// SparseEntryAttention.
struct AttentionScope {
  const std::byte* rows = nullptr;                 // the scope's row buffer
  int64_t row_stride = 0;                          // bytes between rows, >= KVRowBytes(format)
  KVRowFormat format = KVRowFormat::kFp8Entry584;  // both forms
  const int32_t* indices = nullptr;                // [batch, width]; < 0 = masked
  int32_t width = 0;  // entries per request; 0: the scope is empty (indexed form)
  StoreScopeView store = {StoreScopeView::kNone, 0, {}, {}};

  bool in_store() const { return store.source != StoreScopeView::kNone; }
  // No entries for any request: an indexed scope of width 0.
  bool empty() const { return !in_store() && width == 0; }
};

// A store scope of every entry of one resident layer (SparseKVCacheManager::DenseEntries) in
// `format`; request b of the run is the view's batch row first_row + b.
inline AttentionScope DenseEntriesScope(const DenseEntriesView& view, KVRowFormat format,
                                        int32_t first_row = 0) {
  AttentionScope scope;
  scope.format = format;
  scope.store = {StoreScopeView::kDenseEntries, first_row, view, {}};
  return scope;
}

// A store scope of one layer's raw window (SparseKVCacheManager::RawWindow), oldest row first.
inline AttentionScope RawWindowScope(const RawWindowView& view, KVRowFormat format,
                                     int32_t first_row = 0) {
  AttentionScope scope;
  scope.format = format;
  scope.store = {StoreScopeView::kRawWindow, first_row, {}, view};
  return scope;
}

struct ReferenceAttentionInputs {
  int32_t batch = 0;
  int32_t heads = 0;
  // Multiplies q . k; 0 means 1 / sqrt(key dims).
  double softmax_scale = 0;
  const uint16_t* q = nullptr;  // [batch, heads, key dims] bf16 (as uint16 bit patterns)
  AttentionScope selected;      // top-k entries, or a resident layer's entries
  AttentionScope window;        // the raw window's rows; width 0: none
  const float* sink = nullptr;  // [heads] sigma_h, or null: no sink
};

// Computes out [batch, heads, value dims] in float64 from exactly decoded inputs.
// REQUIRES (not checked: the buffers' lengths are not passed): every index >= 0 names a row of
// its scope's buffer; a store scope's views name batch rows [first_row, first_row + batch) and
// every entry they count. InvalidArgument for batch < 0, heads < 1, a negative width, a null
// pointer where the shapes need one, a stride shorter than its format's row, a format that is
// none of KVRowFormat's, a store scope's view out of shape (negative first_row, a cadence, page
// rows or raw window < 1), scopes whose keys differ in dims, or a scale that is negative or not
// finite.
Status ReferenceSparseAttention(const ReferenceAttentionInputs& inputs, double* out);

// ---- The same function on one GPU, for DeepSeek-V4's entries ----

struct SparseEntryAttentionOptions {
  // ---- Behaviour ----
  // Largest batch a Run accepts. Required, in [1, 65535].
  int32_t max_batch = 0;
  // Query heads per request: 64 (DeepSeek-V4-Flash), 128 (V4-Pro), or one GPU's share of them
  // under tensor parallelism. In [1, 1024].
  int32_t heads = 64;
  // Multiplies q . k before the softmax. 0 means 1 / sqrt(512).
  float softmax_scale = 0;

  float effective_softmax_scale() const;
};

// InvalidArgument naming the field unless every field is in range.
Status ValidateSparseEntryAttentionOptions(const SparseEntryAttentionOptions& options);

// The two-scope attention with a sink above (ReferenceSparseAttention's function) over
// DeepSeek-V4 entries (KVRowFormat::kFp8Entry584 or kMxfp4Entry368; one KV head, key = value =
// the entry's 512 dims), on one GPU: one kernel that decodes the entries of both scopes exactly
// (as DecodeKVRow does) into fp32 in shared memory and runs an online softmax over them in fp32
// per head, writing bf16. The entries' order changes the result only in its last fp32 bits:
// the kernel reads each scope in tiles of 16 entries, the selected scope's and then the window's,
// and skips masked entries, so an indexed scope whose padding follows its entries gives the
// bytes its store form gives.
//
// Graph safety: Run enqueues one kernel on the caller's stream and neither allocates nor
// synchronises, so it may be captured into a CUDA graph; the batch, the scopes' widths and the
// pointers are baked into a captured launch.
//
// Thread safety: the object holds no work memory; Run may be called from any thread.
class SparseEntryAttention {
 public:
  // Unavailable if the library was built without CUDA or `device` does not exist; InvalidArgument
  // for bad options.
  static StatusOr<std::unique_ptr<SparseEntryAttention>> Create(
      const SparseEntryAttentionOptions& options, int device = 0);
  virtual ~SparseEntryAttention() = default;

  // Enqueues out = attention(q, selected, window, sink) for requests [0, batch) on `stream`. All
  // pointers are device memory of the object's device:
  //   q        [batch, heads, 512] bf16
  //   selected a scope of width top-k (or a resident layer's largest entry count, padded with
  //            -1): rows, row_stride >= KVRowBytes(format), format, indices [batch, width]; or
  //            a resident layer's entries read in place (DenseEntriesScope)
  //   window   the raw window's scope, width 0 for none (its rows may then be null); or the
  //            window read in place (RawWindowScope)
  //   sink     [heads] fp32 sigma_h, or null for none
  //   out      [batch, heads, 512] bf16; a request whose entries are all masked gets zeros
  // A store scope's counts are read on the device when the kernel runs, so a captured graph
  // replays the step's current entries (its view pointers, not their contents, are baked in).
  // REQUIRES: every index >= 0 names a row of its scope's buffer, a store scope's views name
  // batch rows [first_row, first_row + batch) and every entry they count (not checked on the
  // device), and the buffers stay valid until the stream reaches the run. InvalidArgument for
  // batch outside [0, max_batch], both scopes empty, a negative width, a null pointer where the
  // shapes need one, a format other than the two entry formats, a stride shorter than its
  // format's row, or a store scope's view out of shape; batch 0 enqueues nothing.
  virtual Status Run(int32_t batch, const void* q, const AttentionScope& selected,
                     const AttentionScope& window, const float* sink, void* out,
                     StreamHandle stream) = 0;

  virtual const SparseEntryAttentionOptions& options() const = 0;
};

}  // namespace sparsekv
