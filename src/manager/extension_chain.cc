#include "manager/extension_chain.h"

namespace sparsekv {

Status ExtensionChain::Install(const ExtensionFactory& make, ExtensionHost& host) {
  SPARSEKV_ASSIGN_OR_RETURN(std::unique_ptr<ManagerExtension> extension, make(host));
  extensions_.push_back(std::move(extension));
  return Status::Ok();
}

std::vector<ManagerExtension*> ExtensionChain::all() const {
  std::vector<ManagerExtension*> out;
  for (const auto& extension : extensions_) out.push_back(extension.get());
  return out;
}

void ExtensionChain::Clear() {
  active_.clear();
  while (!extensions_.empty()) extensions_.pop_back();
}

Status ExtensionChain::CheckFork(RequestId parent) const {
  for (const auto& extension : extensions_) SPARSEKV_RETURN_IF_ERROR(extension->CheckFork(parent));
  return Status::Ok();
}

void ExtensionChain::OnDrop(RequestId id) {
  for (const auto& extension : extensions_) extension->OnDrop(id);
}

}  // namespace sparsekv
