// The argument checks of SparseEntryAttention::Run (and the store scopes' of the oracle), on the
// host: kept apart from the CUDA code so that they are tested where no GPU is.
#pragma once

#include <cstdint>
#include <string>

#include "sparsekv/attention.h"

namespace sparsekv {

// OK if a store scope's view is in shape for its format (AttentionScope's store form);
// InvalidArgument, prefixed by `at` (the scope's name), otherwise. Reads no memory the view names.
// REQUIRES: scope.in_store(), and scope.format is a KVRowFormat.
Status CheckStoreScope(const AttentionScope& scope, const std::string& at);

// OK if SparseEntryAttention::Run may enqueue these arguments (its contract in attention.h);
// InvalidArgument naming the argument otherwise.
Status CheckSparseEntryAttentionArgs(const SparseEntryAttentionOptions& options, int32_t batch,
                                     const void* q, const AttentionScope& selected,
                                     const AttentionScope& window, const void* out);

}  // namespace sparsekv
