// ControlPlane when the library is built without hiredis (SPARSEKV_REDIS=OFF, or AUTO without
// libhiredis-dev): Connect fails, so no other call can be reached.
#include "sparsekv/control_plane.h"

namespace sparsekv {

namespace {

Status NotBuilt() {
  return Unavailable(
      "sparsekv was built without the Redis control plane (install libhiredis-dev and "
      "pkg-config, then reconfigure with SPARSEKV_REDIS=AUTO or ON)");
}

}  // namespace

struct ControlPlane::Connection {};

ControlPlane::ControlPlane(const ControlPlaneOptions& options) : options_(options) {}
ControlPlane::~ControlPlane() = default;

StatusOr<std::unique_ptr<ControlPlane>> ControlPlane::Connect(const ControlPlaneOptions&) {
  return NotBuilt();
}

StatusOr<uint64_t> ControlPlane::RegisterNode(const std::string&, const std::string&,
                                              std::chrono::milliseconds) {
  return NotBuilt();
}
Status ControlPlane::Rejoin(const std::string&, uint64_t, const std::string&,
                            std::chrono::milliseconds) {
  return NotBuilt();
}
Status ControlPlane::Heartbeat(const std::string&, uint64_t, std::chrono::milliseconds) {
  return NotBuilt();
}
Status ControlPlane::Deregister(const std::string&, uint64_t) { return NotBuilt(); }
StatusOr<std::vector<NodeInfo>> ControlPlane::ListNodes() { return NotBuilt(); }
StatusOr<NodeInfo> ControlPlane::GetNode(const std::string&) { return NotBuilt(); }
Status ControlPlane::PublishRegion(const std::string&, uint64_t, uint32_t, const std::string&) {
  return NotBuilt();
}
StatusOr<std::string> ControlPlane::GetRegion(const std::string&, uint32_t, uint64_t*) {
  return NotBuilt();
}
StatusOr<uint64_t> ControlPlane::Publish(const std::string&, const RequestLocation&) {
  return NotBuilt();
}
StatusOr<Binding> ControlPlane::Bind(const std::string&, const std::string&,
                                     std::chrono::milliseconds) {
  return NotBuilt();
}
Status ControlPlane::RenewBinding(const std::string&, const std::string&, uint64_t,
                                  std::chrono::milliseconds) {
  return NotBuilt();
}
Status ControlPlane::Done(const std::string&, const std::string&, uint64_t) { return NotBuilt(); }
Status ControlPlane::Release(const std::string&, uint64_t) { return NotBuilt(); }
StatusOr<Binding> ControlPlane::Lookup(const std::string&, int64_t*, int64_t*) {
  return NotBuilt();
}

}  // namespace sparsekv
