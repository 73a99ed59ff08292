// CreateUcxTransport when the library is built without UCX (SPARSEKV_UCX=OFF, or AUTO without
// libucx-dev).
#include "sparsekv/transport.h"

namespace sparsekv {

StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const UcxTransportOptions&) {
  return Unavailable(
      "sparsekv was built without UCX (install libucx-dev and pkg-config, then reconfigure with "
      "SPARSEKV_UCX=AUTO or ON)");
}

}  // namespace sparsekv
