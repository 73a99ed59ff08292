// Small value types shared by the public headers.
#pragma once

#include <cstdint>

namespace sparsekv {

// The engine's id of a request (a sequence being decoded) or of a retained conversation.
using RequestId = uint64_t;

}  // namespace sparsekv
