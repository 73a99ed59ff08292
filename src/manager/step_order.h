// StepOrder: which calls of a decode step the manager accepts next.
//
// A host-only state machine over one step: whether a step is planned, which layers were appended
// and copied (whole, or per copy chunk), how many index groups were resolved, and which group's
// prefetch waits for its copy. Every order the API forbids (manager.h) is refused here: the
// manager calls a Check before a call's work, and the matching Mark once that work succeeded, so
// a refused call changes nothing. Refusals of order are FailedPrecondition; a layer or chunk out
// of range is InvalidArgument. The messages name the call, as the public API's errors do.
//
// The rules it keeps: index groups resolve in order, each layer is appended and copied once
// (a dense layer, Shape::dense, is only appended), and group g + 2 resolves (into the miss list
// group g copies from) only after every copy of group g.
//
// Not thread-safe; owned by the manager, whose calls are externally serialised.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "sparsekv/index_groups.h"
#include "sparsekv/status.h"

namespace sparsekv {

class StepOrder {
 public:
  struct Shape {
    int32_t layers = 1;
    int32_t layers_per_index = 1;  // layers sharing one top-k (uniform index groups)
    int32_t max_batch = 1;
    int32_t copy_chunk_rows = 0;  // batch rows per copy chunk; 0: one miss list, no chunks
    // Per layer (empty: none): layers without a top-k (resident, window-only), which are only
    // appended; each is a group of its own, skipped by the resolve order and never copied.
    std::vector<bool> dense;
  };
  // Uniform index groups of shape.layers_per_index layers.
  explicit StepOrder(const Shape& shape);
  // The index groups `groups` (over shape.layers layers; shape.layers_per_index is not read).
  StepOrder(const Shape& shape, const IndexGroups& groups);

  bool open() const { return open_; }
  // Copy chunks of a step's miss list: ceil(max_batch / copy_chunk_rows), or 1 without chunks.
  int32_t chunks() const { return chunks_; }
  int32_t groups() const { return groups_.count(); }

  // ---- Planning ----
  Status CheckPlan() const;              // PlanStep: no step may be open
  Status CheckInstallExtension() const;  // InstallExtension: no step may be open
  // Opens a step of `batch_size` requests: nothing appended, resolved or copied. A prefetch left
  // pending stays pending.
  void Open(int32_t batch_size);
  void Close() { open_ = false; }

  // ---- Run phase ----
  // A step is open and `layer` is in range; `op` names the call.
  Status CheckLayer(int32_t layer, const char* op) const {
    if (open_ && layer >= 0 && layer < shape_.layers) return Status::Ok();
    return RefuseLayer(layer, op);
  }
  Status CheckAppend(int32_t layer) const {
    if (!appended_[layer]) return Status::Ok();
    return RefuseAppend(layer);
  }
  void MarkAppended(int32_t layer) { appended_[layer] = true; }
  // ResolveLayer, in two parts around its argument checks: `layer` resolves for its index group
  // and was appended; then its group is the next to resolve and its miss list is free.
  Status CheckResolveLayer(int32_t layer) const;
  Status CheckResolveOrder(int32_t layer) const;
  void MarkResolved(int32_t layer) {
    groups_resolved_ = Group(layer) + 1;
    SkipDenseGroups();
  }
  Status CheckCopyMisses(int32_t layer) const;
  Status CheckCopyMissChunk(int32_t layer, int32_t chunk) const;
  // Records chunk `chunk` of `layer` as copied. True when this makes the layer copied: every
  // chunk holding a row of the batch is (the chunks past the batch may still follow, once each).
  bool MarkChunkCopied(int32_t layer, int32_t chunk);
  // Records `layer` as copied whole, every chunk included, with nothing enqueued (SkipMissCopy: a
  // step in which nothing can miss).
  void MarkCopiedWhole(int32_t layer) {
    copied_[layer] = true;
    std::fill(chunk_copied_[layer].begin(), chunk_copied_[layer].end(), true);
  }
  Status CheckAssemble(int32_t layer) const;
  // ResolvePrefetch, in two parts around its argument checks: `layer` is the first of its index
  // group; then the group's copies, if it was resolved, are done and no prefetch is pending.
  Status CheckPrefetchLayer(int32_t layer) const;
  Status CheckResolvePrefetch(int32_t layer) const;
  void MarkPrefetchResolved(int32_t layer) { prefetch_pending_ = Group(layer); }
  Status CheckCopyPrefetch(int32_t layer) const;
  void MarkPrefetchCopied() { prefetch_pending_ = -1; }

  // ---- End of the step ----
  // FinishStep: every layer appended and copied, every group resolved, no prefetch pending.
  Status CheckFinish() const;
  // FinishReplayedStep: the host called no AppendToken in the step, no prefetch is pending, and
  // `run_phase_recorded` (some earlier step completed a run phase whose bytes the replay counts).
  Status CheckFinishReplayed(bool run_phase_recorded) const;

  // What the open step has done (for the tests).
  bool appended(int32_t layer) const { return appended_[layer]; }
  bool copied(int32_t layer) const { return copied_[layer]; }
  bool chunk_copied(int32_t layer, int32_t chunk) const { return chunk_copied_[layer][chunk]; }
  int32_t groups_resolved() const { return groups_resolved_; }
  int32_t prefetch_pending() const { return prefetch_pending_; }

 private:
  int32_t Group(int32_t layer) const { return groups_.Of(layer); }
  // The first layer of `group` that has no CopyMisses in the open step, or -1.
  int32_t FirstUncopied(int32_t group) const;
  // "layer 3 (index group 1)": how the run-phase errors name a layer.
  std::string DescribeLayer(int32_t layer) const;
  Status RefuseLayer(int32_t layer, const char* op) const;
  Status RefuseAppend(int32_t layer) const;
  bool Dense(int32_t layer) const { return !shape_.dense.empty() && shape_.dense[layer]; }
  // Counts the dense groups next in the resolve order as resolved.
  void SkipDenseGroups();

  Shape shape_;
  IndexGroups groups_;
  int32_t chunks_;
  bool open_ = false;
  int32_t batch_chunks_ = 0;    // chunks holding a row of the open step's batch
  std::vector<bool> appended_;  // per layer
  std::vector<bool> copied_;    // per layer: CopyMisses ran (or every chunk of the batch)
  std::vector<std::vector<bool>> chunk_copied_;  // per layer and chunk: CopyMissChunk ran
  int32_t groups_resolved_ = 0;                  // index groups [0, groups_resolved_) were resolved
  int32_t prefetch_pending_ = -1;  // the group whose ResolvePrefetch has no CopyPrefetch; -1: none
};

}  // namespace sparsekv
