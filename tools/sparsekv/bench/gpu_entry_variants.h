// The end-to-end benchmark's variants over DeepSeek-V4's layer kinds (docs/benchmark.md,
// "DeepSeek-V4"), behind StepVariant:
//   full-hbm: every layer's entries and raw window in HBM, one buffer each (entry_scopes.h); its
//     step appends the token's entry and raw row and writes the index rows of its scopes;
//   sparsekv: the manager through its StepSchedule (CSA layers resolved against the hot cache,
//     HCA and window-only layers appended to its store with StepRows), the store's entries and
//     windows read in place by the attention (store scopes: DenseEntriesScope, RawWindowScope).
// Both hold the same content (FillKVRows: entry e of (request, layer) at position e, the raw row
// of token t at layer kRawRowLayer + layer, position t), read in the same order (full-hbm's index
// rows list a request's entries, then -1 padding, in the views' order), and expose their scopes
// through StepVariant::Scopes for SparseEntryAttention, whose kernel gives an indexed scope with
// trailing padding the bytes of its store form: the attention outputs compare byte for byte.
// Compiled; not yet run on a GPU.
#pragma once

#include <memory>

#include "tools/sparsekv/bench/gpu_variants.h"

namespace sparsekv::tools {

// The `layer` argument of FillKVRows that names a layer's raw rows (its entries use the layer).
inline constexpr int32_t kRawRowLayer = 1 << 12;

// kFullHbm or kSparseKV over setup.geometry's layer kinds (BenchGeometry of a DeepSeek-V4 preset)
// and setup.raw_window; every request's prompt filled (synchronising `stream`). InvalidArgument
// for another kind.
StatusOr<std::unique_ptr<StepVariant>> CreateEntryVariant(KVVariant kind, const VariantSetup& setup,
                                                          std::shared_ptr<Backend> host,
                                                          cudaStream_t stream);

}  // namespace sparsekv::tools
