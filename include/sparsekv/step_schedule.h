// StepSchedule: the run phase of a decode step, driven for the engine on streams and events the
// schedule owns, in the schedule it chooses.
//
// An engine plans each step through the schedule and then hands it, layer by layer, its work: the
// new token's rows, the layer's top-k (from its indexer), and a callback that enqueues attention
// over a range of the batch's rows. The schedule appends, resolves, copies the misses and calls
// the engine's attention as soon as the rows it reads are in, in one of these shapes (StepChoice):
//   * serial: each layer's misses copied on the engine's stream before its attention;
//   * cross-layer prefetch: right after index group g's resolve, its top-k is resolved against
//     group g + 1's hot cache and those rows are copied on a side stream, beside group g's copy,
//     attention and the rest of the model (top-k sets of adjacent layers overlap, so group g + 1
//     then misses less);
//   * chunked: each layer's misses copied on a side stream in slices of chunk_rows batch rows,
//     and attention over a slice starts as soon as its rows are in;
//   * planned copy (models whose index groups have several layers, a shared indexer): right after
//     a group's resolve, the miss copies of every layer of the group are enqueued on a side
//     stream, ahead of their layers, and a layer's attention waits only for its own copy, so the
//     copies of a group's later layers run beside the attention and the rest of the layers
//     before them;
//   * the prefetch with either of the others, or all three (the planned copy in chunks: each
//     layer's attention slices wait for that layer's chunks).
// A prefetch's copies, and the planned copies, may also run on a bounded grid of thread blocks
// (prefetch_copy_blocks, planned_copy_blocks), which leaves SMs to the attention and the rest of
// the model beside them.
// Which one pays depends on the batch, how many requests are in hot-cache mode, how much they
// miss, and the machine (docs/schedule.md): the schedule measures. For each step shape (the batch
// and how many of its requests are in hot-cache mode) it times each candidate for a few steps,
// then keeps the fastest; a step in which nothing can miss (every request resident,
// SparseKVCacheManager::StepCanMiss) runs in StepChoice::resident at once: no copy is enqueued.
// ScheduleOptions::fixed forces one choice instead (for every step, unless
// ScheduleOptions::fixed_yields_to_resident).
//
// Graphs. Everything between PlanStep and FinishStep only enqueues, so an engine captures it into
// a CUDA graph as it would the manager's own run phase (manager.h), with its kernels on its
// stream. A captured step replays its choice and its attention ranges: capture one graph per
// batch size and choice (choice() says which the planned step needs; a step that cannot miss
// needs a graph of its own, since its choice, resident, enqueues no miss copy), and after each
// replay call FinishReplayedStep with the replay's time, which is how the schedule measures graph
// steps. Eager steps (not captured) are timed by the schedule itself.
//
// Extensions (the node pool, peer and remote tiers) work under it unchanged: the schedule calls
// only the manager's public run-phase calls.
//
// Thread safety: not thread-safe; one thread drives a schedule and its manager.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/index_groups.h"
#include "sparsekv/manager.h"
#include "sparsekv/status.h"
#include "sparsekv/types.h"

namespace sparsekv {

// How one step runs (see the file comment).
struct StepChoice {
  bool crosslayer_prefetch = false;
  // 0: each layer copied whole before its attention; else attention in slices of this many batch
  // rows, a multiple of CacheOptions::copy_chunk_rows.
  int32_t chunk_rows = 0;
  // With the prefetch: the thread blocks of its copies (SparseKVCacheManager::CopyPrefetch);
  // 0: CacheOptions::prefetch_copy_blocks'. Ignored without the prefetch.
  int32_t prefetch_copy_blocks = 0;
  // Planned copy: every layer of an index group copied on a side stream right after the group's
  // resolve; needs an index group of more than one layer (IndexGroups::shared).
  bool planned_copy = false;
  // With the planned copy: the thread blocks of its copies (SparseKVCacheManager::CopyMisses,
  // CopyMissChunk); 0: CacheOptions::copy_blocks'. Ignored without the planned copy.
  int32_t planned_copy_blocks = 0;
  // Every request of the step is resident (SparseKVCacheManager::StepCanMiss is false): each
  // layer is appended, resolved and attended on the engine's stream, and no miss copy, prefetch
  // or chunk is enqueued (SkipMissCopy). The schedule takes it for such steps, and only for them,
  // whatever it measures (and with ScheduleOptions::fixed_yields_to_resident whatever is fixed); a
  // graph captured in it must not replay a step of another choice (keyed by choice, as above, it
  // never does). The other fields are then unset.
  bool resident = false;

  bool operator==(const StepChoice&) const = default;
  // "serial", "prefetch", "prefetch:16" (16 copy blocks), "chunks16", "prefetch:16+chunks16",
  // "planned", "planned:16+chunks16", "prefetch:16+planned:16+chunks16": the prefetch, the
  // planned copy and the chunks, in that order, each with its grid; "resident".
  std::string ToString() const;
};

// The choice that ToString names ("serial", "prefetch:16+chunks16", ...), for
// engines that take the schedule from a configuration string; InvalidArgument for other text.
// Whether the manager allows it is StepSchedule::Create's to check.
StatusOr<StepChoice> ParseStepChoice(std::string_view text);

struct ScheduleOptions {
  // ---- Behaviour ----
  // Runs every step in this choice (the manual override), so that one captured graph per batch
  // size serves every step; it must be one the manager allows
  // (AllowedChoices, with the prefetch and the planned copy on any grid, or chunks of any
  // multiple of copy_chunk_rows), InvalidArgument otherwise.
  std::optional<StepChoice> fixed;
  // The choices the schedule measures; empty: every choice the manager allows. Each must be
  // allowed, its prefetch and planned copy on any grid (InvalidArgument otherwise). Neither this
  // nor `fixed` may be StepChoice::resident, which the schedule takes by itself.
  std::vector<StepChoice> candidates;
  // With `fixed`: a step in which nothing can miss runs in StepChoice::resident instead of the
  // fixed choice (no empty miss copy). An engine that sets it keys its captured graphs by
  // choice(), as it must without `fixed`, where the schedule always does this.
  bool fixed_yields_to_resident = false;

  // ---- Performance ----
  // Timed steps per candidate and step shape before the schedule keeps the fastest (the median of
  // its steps), in [1, 64].
  int32_t trials = 3;
};

// The choices a manager's options allow: cross-layer prefetch needs more than one index group of
// offloaded layers (the groups the manager resolves) and
// max_prefetch >= top_k, and comes on the options' copy grid and on kBoundedPrefetchCopyBlocks
// (unless the options' grid is that already); the planned copy needs an index group of more than
// one layer, and comes on the options' copy_blocks and on kBoundedPrefetchCopyBlocks (unless
// copy_blocks is that already), alone and with each prefetch; chunks are multiples 1, 2, 4, ...
// of copy_chunk_rows below max_batch (none without copy_chunk_rows), with each of the others.
// Serial first, then the choices without the planned copy in the order they had before it.
std::vector<StepChoice> AllowedChoices(const CacheOptions& options);
// The bounded grid AllowedChoices offers the prefetch's and the planned copy's copies: on an H200
// (132 SMs) 16 blocks carry a prefetch at the rate it needs while attention and the GEMMs keep the
// rest, and the copies ahead of a shared indexer's layers hid most of the transfer on it
// (docs/schedule.md, docs/overlap.md).
inline constexpr int32_t kBoundedPrefetchCopyBlocks = 16;

// One layer's work from the engine. Pointers are device memory of the manager's backend and must
// stay valid until the stream reaches the work (for a captured step, for every replay).
struct LayerWork {
  const void* new_rows = nullptr;  // [max_batch, row_stride(layer)], as AppendToken
  const void* new_keys = nullptr;  // [max_batch, indexer_key_bytes] with indexer keys, else null
  // [max_batch, topk_stride] positions, -1 = padding: read for the first layer of an index group
  // (ResolveLayer), ignored for the others. topk_stride 0 means top_k; cross-layer prefetch
  // needs topk_stride = top_k.
  const int32_t* topk = nullptr;
  int32_t topk_stride = 0;
  // [max_batch, top_k]: the group's first layer writes the layer-wide slots (manager.h), which
  // every layer of the group reads.
  int32_t* slots = nullptr;
  // [max_batch, row_stride(layer)]: the step's raw-window rows (StepRows::window), required with
  // CacheOptions::raw_window > 0, else not read.
  const void* window_rows = nullptr;
};

// Enqueues the engine's attention of `layer` over batch rows [first, first + rows) on `stream`;
// the rows of their slots are in the hot cache once `stream` reaches the work. An error ends the
// layer's attention with that error (RunLayer returns it; the step stays open, see AbortStep).
using AttendFn =
    std::function<Status(int32_t layer, int32_t first, int32_t rows, StreamHandle stream)>;

// What the schedule did since it was created.
struct ScheduleStats {
  int64_t steps = 0;                               // steps planned
  int64_t calibration_steps = 0;                   // of those, steps that measured a candidate
  std::map<std::string, int64_t> steps_by_choice;  // StepChoice::ToString -> steps
  StepChoice last_choice;
  std::string last_reason;  // why the last planned step runs in last_choice
};

class ScheduleTuner;

class StepSchedule {
 public:
  // A schedule over `manager`, which must outlive it. Creates its streams and events on the
  // manager's backend. InvalidArgument for options that ScheduleOptions refuses.
  static StatusOr<std::unique_ptr<StepSchedule>> Create(SparseKVCacheManager& manager,
                                                        const ScheduleOptions& options = {});
  ~StepSchedule();
  StepSchedule(const StepSchedule&) = delete;
  StepSchedule& operator=(const StepSchedule&) = delete;

  // ---- Plan (host side, between steps) ----

  // SparseKVCacheManager::PlanStep, with its errors, then the choice for the step. Reads the
  // time of the previous eager step first (waiting for it if it is still running).
  // InvalidArgument, before anything else, for a stream of another device than the manager's
  // backend (Backend::CheckStream); the step's other calls take streams of that device too.
  Status PlanStep(std::span<const RequestId> batch, StreamHandle stream);
  Status PlanStep(std::span<const RequestId> batch, std::span<const int32_t> token_ids,
                  StreamHandle stream);
  // The planned step's choice, and why it was made.
  const StepChoice& choice() const { return choice_; }
  const std::string& reason() const { return reason_; }

  // ---- Run (device side; graph-capturable) ----

  // Layer `layer`'s run phase: AppendToken, the group's ResolveLayer (first layer of a group),
  // the choice's prefetch and copies, and `attend` over the batch's rows. Layers in order, each
  // once, every call on the engine's `stream`. Errors: FailedPrecondition outside a step or out
  // of order; InvalidArgument for missing work pointers or a topk_stride that the choice's
  // prefetch cannot read; the manager's and `attend`'s errors.
  // An error from `attend` stops the layer's attention (later slices are not attended) once the
  // layer's own work is enqueued (append, resolve, copies): the layer counts as run and the step
  // stays open, so the engine may go on with the next layer and FinishStep, or end the step with
  // AbortStep. After any other error the layer is not run; AbortStep ends the step.
  // Layers the manager does not resolve (LayerKind::kResident and kWindowOnly, DeepSeek-V4's) are
  // appended with StepRows (new_rows as the entries, not read for window-only; window_rows) and
  // attended once over the whole batch: topk and slots are not read for them, they take no
  // choice's copies, and the cross-layer prefetch goes from one resolving group to the next
  // resolving group past them. With a raw window every layer is appended with StepRows.
  Status RunLayer(int32_t layer, const LayerWork& work, const AttendFn& attend,
                  StreamHandle stream);
  // Joins the schedule's streams into `stream` and ends the manager's step (FinishStep).
  Status FinishStep(StreamHandle stream);
  // Ends the open step without the engine, typically after a RunLayer error: the manager's
  // remaining run-phase calls for the step (append, resolve, copies of every layer RunLayer did
  // not complete, and the copy of a cross-layer prefetch RunLayer resolved but did not copy) with
  // zero rows (and zero indexer keys) and an all-padding top-k, on `stream`, then FinishStep. No
  // attention is called. Nothing stored before the step changes. The step's token stays in the
  // history of each of its requests (the manager takes no planned token back): its rows are the
  // engine's in the layers RunLayer appended and zero in the others, so an engine that drops the
  // step's output releases those requests (or retracts and re-ingests them). An aborted step is not
  // timed. Allocates its zero rows and top-k on the first call. Errors: FailedPrecondition outside
  // a step or while `stream` is capturing (end the capture first); InvalidArgument for a stream of
  // another device; the manager's errors.
  Status AbortStep(StreamHandle stream);
  // After a replay of a step captured through this schedule (in the planned step's choice):
  // SparseKVCacheManager::FinishReplayedStep, and `seconds`, the replay's time (< 0: not
  // measured), counts for the choice.
  Status FinishReplayedStep(double seconds);

  ScheduleStats stats() const { return stats_; }

 private:
  StepSchedule(SparseKVCacheManager& manager, std::unique_ptr<ScheduleTuner> tuner,
               std::optional<StepChoice> fixed, bool fixed_yields_to_resident);
  Status Allocate();
  Status Choose();
  // Reads the previous eager step's time and hands it to the tuner.
  Status ObservePendingTime();
  // Backend::CheckStream, its error prefixed with the call's name.
  Status CheckStream(StreamHandle stream, const char* call);
  Status CopyAndAttend(int32_t layer, const AttendFn& attend, StreamHandle stream);
  // The planned copy: every layer of `leader`'s group copied on the copy stream, after the
  // group's resolve on `stream`; planned_copied_ marks each layer's slices.
  Status CopyGroup(int32_t leader, StreamHandle stream);
  // Layer `layer`'s copy, whole or in the chunks of the choice's slices, on `stream` (on a grid
  // of `blocks`), recording `slice_events[s]` after slice s (none if null, whole copies only);
  // copied_whole_ and chunks_copied_ track what is enqueued.
  Status CopyLayer(int32_t layer, int32_t blocks, const EventHandle* slice_events,
                   StreamHandle stream);
  Status Prefetch(int32_t layer, const int32_t* topk, StreamHandle stream);
  // The device buffers AbortStep reads (zero rows and keys, an all-padding top-k) and the slots
  // it writes, allocated once.
  Status AllocateAbortWork(StreamHandle stream);
  // The current layer's copies that are not enqueued yet, on `stream` (AbortStep).
  Status CopyRemaining(int32_t layer, StreamHandle stream);

  // How far RunLayer got with layer next_layer_, for AbortStep to complete it.
  enum class LayerStage { kNone, kAppended, kResolved, kCopied };

  SparseKVCacheManager& manager_;
  const IndexGroups groups_;  // the manager's
  Backend& backend_;
  std::unique_ptr<ScheduleTuner> tuner_;
  std::optional<StepChoice> fixed_;
  bool fixed_yields_to_resident_;

  StreamHandle copy_stream_ = nullptr;      // chunked copies
  StreamHandle prefetch_stream_ = nullptr;  // cross-layer prefetch copies
  EventHandle resolved_ = nullptr;          // the layer's resolve (and append) are enqueued
  std::vector<EventHandle> slice_copied_;   // per attention slice: its chunks are copied
  // [layer of the group - its leader][slice]: the planned copy of that layer's slice is done
  // (slices_per_layer_ per layer: one without chunks).
  std::vector<EventHandle> planned_copied_;
  int32_t slices_per_layer_ = 1;
  EventHandle prefetch_resolved_ = nullptr;  // the next group's prefetch is resolved
  EventHandle prefetched_ = nullptr;         // the last prefetch copy is done
  // The layer whose prefetch the manager resolved and has not copied (a RunLayer error between
  // the two), which AbortStep copies; -1: none.
  int32_t prefetch_pending_ = -1;
  EventHandle step_start_ = nullptr;  // timing of eager steps
  EventHandle step_end_ = nullptr;
  void* abort_rows_ = nullptr;   // [max_batch, largest row_stride] zeros
  void* abort_keys_ = nullptr;   // [max_batch, indexer_key_bytes] zeros, with indexer keys
  void* abort_topk_ = nullptr;   // [max_batch, top_k] kPaddingPosition
  void* abort_slots_ = nullptr;  // [max_batch, top_k] written by AbortStep's resolves

  // The planned step.
  std::vector<RequestId> batch_;
  StepChoice choice_;
  std::string reason_;
  bool step_open_ = false;
  int32_t next_layer_ = 0;
  LayerStage stage_ = LayerStage::kNone;  // of layer next_layer_
  // Per layer, in the step: the copy enqueued whole, or how many of its chunks are (a planned
  // copy enqueues a group's later layers ahead of them).
  std::vector<bool> copied_whole_;
  std::vector<int32_t> chunks_copied_;
  bool attention_failed_ = false;  // an attend callback failed in the step: not timed
  bool prefetch_used_ = false;     // a prefetch copy was enqueued in the step
  bool timing_ = false;            // the step's start was recorded (eager)
  bool time_pending_ = false;      // an eager step ended and its time is not read yet
  int32_t pending_batch_ = 0, pending_hot_ = 0;
  StepChoice pending_choice_;
  int32_t hot_requests_ = 0;  // of the planned batch, in hot-cache mode
  ScheduleStats stats_;
};

}  // namespace sparsekv
