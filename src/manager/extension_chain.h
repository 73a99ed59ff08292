// ExtensionChain: the manager's installed extensions (manager_extension.h), in installation
// order, and the ones active in the open step.
//
// The per-layer hooks run only on the extensions that said at BeginStep that the step concerns
// them, in installation order; BeforeCopy hands each the list the one before it returned. The
// hooks for any step (OnDrop, CheckFork) run on every extension. Clear (and the destructor)
// destroys them last installed first; the manager clears the chain while its pool, hot cache
// and backend still exist.
//
// Not thread-safe; owned by the manager.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "sparsekv/manager_extension.h"
#include "sparsekv/status.h"
#include "sparsekv/types.h"

namespace sparsekv {

class ExtensionChain {
 public:
  ExtensionChain() = default;
  ~ExtensionChain() { Clear(); }
  ExtensionChain(const ExtensionChain&) = delete;
  ExtensionChain& operator=(const ExtensionChain&) = delete;

  // Makes an extension with `make(host)` and appends it; the factory's error otherwise.
  Status Install(const ExtensionFactory& make, ExtensionHost& host);
  // Every installed extension, in installation order.
  std::vector<ManagerExtension*> all() const;
  // Destroys the extensions, the last installed first.
  void Clear();

  // ---- Any time ----
  // The first extension's refusal of `parent` as a parent, or OK.
  Status CheckFork(RequestId parent) const;
  void OnDrop(RequestId id);

  // ---- A step ----
  // Asks every extension whether the step of `batch` concerns it; those that say so are active
  // until the next BeginStep.
  void BeginStep(std::span<const RequestId> batch, StreamHandle stream) {
    active_.clear();
    for (const auto& extension : extensions_) {
      if (extension->BeginStep(batch, stream)) active_.push_back(extension.get());
    }
  }
  // Whether any extension is active in the step.
  bool active() const { return !active_.empty(); }
  Status AfterResolve(int32_t layer, int32_t* slots, StreamHandle stream) {
    for (ManagerExtension* extension : active_) {
      SPARSEKV_RETURN_IF_ERROR(extension->AfterResolve(layer, slots, stream));
    }
    return Status::Ok();
  }
  // The list to copy from the host pool: `list` as every active extension in turn rewrote it.
  StatusOr<MissList> BeforeCopy(int32_t layer, const MissList& list, int32_t capacity, int32_t lane,
                                StreamHandle stream) {
    MissList from_pool = list;
    for (ManagerExtension* extension : active_) {
      SPARSEKV_ASSIGN_OR_RETURN(from_pool,
                                extension->BeforeCopy(layer, from_pool, capacity, lane, stream));
    }
    return from_pool;
  }
  Status AfterCopy(int32_t layer, StreamHandle stream) {
    for (ManagerExtension* extension : active_) {
      SPARSEKV_RETURN_IF_ERROR(extension->AfterCopy(layer, stream));
    }
    return Status::Ok();
  }
  Status AfterMissCopy(int32_t layer, StreamHandle stream) {
    for (ManagerExtension* extension : active_) {
      SPARSEKV_RETURN_IF_ERROR(extension->AfterMissCopy(layer, stream));
    }
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<ManagerExtension>> extensions_;  // in installation order
  std::vector<ManagerExtension*> active_;                      // in installation order
};

}  // namespace sparsekv
