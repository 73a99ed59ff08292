// RemoteRowSource: the remote tier's ManagerExtension (see "Remote tier" in
// sparsekv/remote_tier.h).
//
// It owns the placeholder host page that stands for remote prompt pages in page tables and the
// staging area remote rows are read into. In a step whose batch holds a remote-backed request,
// before each miss copy it reads the list, fetches the remote rows it names (into their host rows,
// or into the staging area for the staged copy after the direct one) and drops the entries of
// failed requests; after a resolve and a miss copy it blanks failed requests' slots.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sparsekv/manager_extension.h"
#include "sparsekv/remote_tier.h"

namespace sparsekv {

class RemoteRowSource final : public ManagerExtension {
 public:
  // Takes the placeholder page from the host pool, allocates the staging area
  // ([max_batch * max(top_k, max_prefetch)] rows of the largest stride, host memory) and registers
  // both with `tier`'s transport. `tier` must outlive the source.
  static StatusOr<std::unique_ptr<RemoteRowSource>> Create(ExtensionHost& host, RemoteTier* tier);
  // Detaches the host pool and the staging area from the tier, frees the buffers and gives the
  // placeholder page back.
  ~RemoteRowSource() override;

  // AdmitRemote and RemoteStatus (remote_tier.h) for the manager this source extends.
  Status Admit(RequestId id, uint32_t region, const RemotePromptLayout& layout,
               int32_t max_new_tokens, StreamHandle stream);
  Status RequestStatus(RequestId id) const;

  bool BeginStep(std::span<const RequestId> batch, StreamHandle stream) override;
  StatusOr<MissList> BeforeCopy(int32_t layer, const MissList& list, int32_t capacity, int32_t lane,
                                StreamHandle stream) override;
  Status AfterCopy(int32_t layer, StreamHandle stream) override;
  Status AfterResolve(int32_t layer, int32_t* slots, StreamHandle stream) override;
  Status AfterMissCopy(int32_t layer, StreamHandle stream) override;
  void OnDrop(RequestId id) override { tier_->Unbind(id); }
  Status CheckFork(RequestId parent) const override;

 private:
  RemoteRowSource(ExtensionHost& host, RemoteTier* tier) : host_(host), tier_(tier) {}
  // Sets the slots of failed requests of the group's last resolve to -1.
  Status BlankFailedSlots(int32_t layer, StreamHandle stream);

  ExtensionHost& host_;
  RemoteTier* tier_;
  bool attached_ = false;  // the tier has the pool and staging area registered
  // A host page of the pool that every remote-backed request's remote prompt pages point at
  // (one reference per page-table entry, plus this source's own). Its rows are never read: misses
  // in it are read from the remote region into `rows_` instead.
  int32_t placeholder_page_ = -1;
  std::byte* rows_ = nullptr;     // [capacity_, stride_], host memory of the backend (pinned)
  int32_t capacity_ = 0;          // rows: the largest miss list
  int32_t stride_ = 0;            // the largest row stride of the geometry
  int32_t* src_index_ = nullptr;  // [capacity_] device: staging row of each staged entry
  int32_t* dst_index_ = nullptr;  // [capacity_] device: its hot-cache slot
  int32_t* count_ = nullptr;      // device scalar
  int32_t staged_ = 0;            // entries of the pending staged copy (host mirror of *count_)
  int32_t* slots_[2] = {};        // slots of the last ResolveLayer per miss list
};

}  // namespace sparsekv
