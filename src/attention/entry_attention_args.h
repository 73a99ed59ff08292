// The argument checks of SparseEntryAttention::Run, on the host: kept apart from the CUDA code so
// that they are tested where no GPU is.
#pragma once

#include <cstdint>

#include "sparsekv/attention.h"

namespace sparsekv {

// OK if SparseEntryAttention::Run may enqueue these arguments (its contract in attention.h);
// InvalidArgument naming the argument otherwise.
Status CheckSparseEntryAttentionArgs(const SparseEntryAttentionOptions& options, int32_t batch,
                                     const void* q, const AttentionScope& selected,
                                     const AttentionScope& window, const void* out);

}  // namespace sparsekv
