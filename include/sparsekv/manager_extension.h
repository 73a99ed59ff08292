// ManagerExtension: where a SparseKVCacheManager's miss rows may come from besides its host pool.
//
// The manager copies a step's misses from its host pool into the hot cache. An extension may
// stand in for some rows: before a miss copy it may rewrite the miss list (drop entries, fill host
// rows) or hand the manager another list to copy from the pool, and copy rows of its own after it;
// after a resolve or a copy it may blank the slots of requests it failed. It also hears when a
// request is dropped and may refuse to fork one. The remote tier (remote_tier.h: rows read over a
// transport) and the peer tier (peer_tier.h: rows read from another GPU's memory) are extensions.
//
// Several extensions. A manager may have several (the remote tier's and the peer tier's, say);
// each hook runs for each of them in installation order. Before a copy, each one's BeforeCopy gets
// the list the one before it returned (the first gets the manager's), and the manager copies
// from its pool the list the last one returned; the AfterCopy hooks then run in the same order.
//
// Cost. The manager asks BeginStep once per PlanStep whether an extension is active for the
// batch; its per-layer hooks are called only in active steps, so a step without requests the
// extensions care about makes no virtual call and stays graph-capturable.
//
// Lifetime and threads: the manager owns its extensions (SparseKVCacheManager::InstallExtension)
// and destroys them, the last installed first, after releasing its requests and retained
// conversations, while the pool, the hot cache and the backend still exist. Hooks run on the
// thread that drives the manager.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "sparsekv/backend.h"
#include "sparsekv/host_kv_pool.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"
#include "sparsekv/types.h"

namespace sparsekv {

// A miss list in device memory: (host row, layer-wide slot) pairs and their count.
struct MissList {
  int32_t* host_row = nullptr;  // [capacity]
  int32_t* slot = nullptr;      // [capacity]
  int32_t* count = nullptr;     // scalar
};

// What the manager offers its extension: read access to its parts and the few lifecycle steps an
// extension's own admission needs. Implemented by the manager; valid while the extension lives.
class ExtensionHost {
 public:
  virtual const CacheOptions& options() const = 0;
  virtual Backend& backend() const = 0;
  virtual HostKVPool& pool() const = 0;
  virtual const HotCache& hot_cache() const = 0;
  // The open (or last planned) step's batch, in plan order.
  virtual std::span<const RequestId> batch() const = 0;
  // The hot-cache block of a live request (-1 while retracted). REQUIRES (not checked: no error
  // to return; IsLive says): `id` is live.
  virtual int32_t BlockOf(RequestId id) const = 0;
  // The host pool owner (page-table row) of a live request. REQUIRES (not checked): `id` is live.
  virtual int32_t OwnerOf(RequestId id) const = 0;
  // The positions a live request has KV for (its sequence length, the open step's token
  // included). REQUIRES (not checked): `id` is live.
  virtual int32_t LengthOf(RequestId id) const = 0;
  virtual bool IsLive(RequestId id) const = 0;
  // The device counter of IndexCopy entries skipped as out of bounds (CacheStats).
  virtual unsigned long long* invalid_copy_counter() const = 0;
  // Every copy BeforeCopy hears of belongs to one of miss_list_lanes() lanes, its list at most
  // miss_list_lane_capacity() entries; copies that may run at once (on different streams: the
  // chunks of a layer, a cross-layer prefetch) never share a lane, so that an extension can keep
  // a buffer per lane.
  virtual int32_t miss_list_lanes() const = 0;
  virtual int32_t miss_list_lane_capacity() const = 0;

  // Admits `id` as SparseKVCacheManager::Admit does (same errors), with page-table entries
  // [0, shared.size()) set to `shared` (each gains a reference; the caller holds one): positions
  // [0, shared.size() * host_page_tokens) are never ingested nor written. The extension then
  // brings the other prompt rows into the pool and completes every layer with CompleteLayer.
  virtual Status AdmitWithPages(RequestId id, int32_t prompt_len, int32_t max_new_tokens,
                                std::span<const int32_t> shared, StreamHandle stream) = 0;
  // Marks `layer` of `id` ingested, its prompt rows being in the pool, and loads its window into
  // the hot cache on `stream`. Errors: NotFound unless `id` is live; InvalidArgument for a bad
  // layer; AlreadyExists for a complete layer; FailedPrecondition for a retracted request.
  // REQUIRES (not checked): `id` was admitted by AdmitWithPages.
  virtual Status CompleteLayer(RequestId id, int32_t layer, StreamHandle stream) = 0;
  // Frees what a live request holds, as Release does. REQUIRES (not checked: no error to return;
  // the extension calls it for requests it failed): `id` is live and not in the open step;
  // nothing enqueued still reads its pages.
  virtual void Drop(RequestId id) = 0;

 protected:
  ~ExtensionHost() = default;
};

class ManagerExtension {
 public:
  virtual ~ManagerExtension() = default;

  // PlanStep, after the batch is fixed: whether the per-layer hooks below run in this step. May
  // enqueue work on `stream` (PlanStep's), before the step's; cannot fail the step (an error is
  // for the extension to report from a later hook).
  virtual bool BeginStep(std::span<const RequestId> batch, StreamHandle stream) = 0;

  // ---- Called only in active steps ----

  // Before the copy of `list` (`capacity` entries; written by the resolve enqueued on `stream`,
  // or handed on by the extension before this one) into `layer`, in lane `lane`: may rewrite the
  // list and stage rows for AfterCopy, and returns the list to copy from the host pool (`list`,
  // or one of the extension's with at most `capacity` entries, valid until AfterCopy). May
  // synchronise `stream`.
  virtual StatusOr<MissList> BeforeCopy(int32_t layer, const MissList& list, int32_t capacity,
                                        int32_t lane, StreamHandle stream) = 0;
  // After that copy, on `stream`.
  virtual Status AfterCopy(int32_t layer, StreamHandle stream) = 0;
  // After ResolveLayer(layer) wrote `slots` ([max_batch, top_k] device memory, valid until the
  // group's next resolve): e.g. blanks the slots of failed requests.
  virtual Status AfterResolve(int32_t layer, int32_t* slots, StreamHandle stream) = 0;
  // At the end of CopyMisses(layer), after AfterCopy: e.g. blanks, in the slots of the group's
  // resolve, those of requests the copy failed.
  virtual Status AfterMissCopy(int32_t layer, StreamHandle stream) = 0;

  // ---- Called whenever ----

  // A live request is released or retained (its pages are about to be dropped).
  virtual void OnDrop(RequestId id) = 0;
  // OK, or why Fork must refuse `parent` as a parent.
  virtual Status CheckFork(RequestId parent) const = 0;
};

// Makes a manager's extension from the host the manager offers it
// (SparseKVCacheManager::InstallExtension).
using ExtensionFactory =
    std::function<StatusOr<std::unique_ptr<ManagerExtension>>(ExtensionHost& host)>;

}  // namespace sparsekv
