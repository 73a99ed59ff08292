// The reference operators: plain loops with the semantics of kernel_views.h. The CPU backend runs
// them; tests use them as the oracle for every other backend.
#pragma once

#include "sparsekv/kernel_views.h"

namespace sparsekv::reference {

void IndexCopy(const IndexCopyView& view);
void IndexCopyPair(const IndexCopyPairView& view);
void Resolve(const ResolveView& view);
void Assemble(const AssembleView& view);
void RouteRows(const RouteRowsView& view);
void DenseAppend(const DenseAppendView& view, int32_t max_batch);

}  // namespace sparsekv::reference
