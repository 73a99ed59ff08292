// CreateUcxTransport when the library is built without UCX (libucx-dev not found).
#include "sparsekv/transport.h"

namespace sparsekv {

StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const UcxTransportOptions&) {
  return Unavailable("sparsekv was built without UCX (install libucx-dev and rebuild)");
}

}  // namespace sparsekv
