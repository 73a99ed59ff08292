// DenseLayerStore: the entries of resident layers and the raw windows of every layer, per request,
// in device memory (docs/deepseek-v4.md, "Sizing": DeepSeek-V4's HCA layers and the raw window).
//
// What a request holds, reserved at admission for its reserved tokens T (as the host pool
// reserves):
//   * for each layer of LayerKind::kResident with cadence r: ceil(floor(T / r) / page_rows) pages
//     of page_rows entries of the layer's row_stride bytes;
//   * for every layer, when raw_window > 0: a ring of raw_window rows of the layer's row_stride.
// All of it is one allocation of the backend's device memory, zeroed at admission; a row never
// appended reads as zeros. The request has a row of two device tables (the address of each page
// of each resident layer, and of each layer's ring), which the views of kernel_views.h
// (DenseEntriesView, RawWindowView, DenseAppendView) read, so that a kernel finds every entry in
// place and nothing is copied per step.
//
// Device memory is charged against budget_bytes: the tables, allocated at Create, and each held
// request's allocation. A request that does not fit is refused (ResourceExhausted, naming the
// bytes it needs and what is left); the manager gives the store its share of
// CacheOptions::device_budget_bytes and reads MemoryByUse for CacheStats::device_memory.
//
// A decode step: PlanStep (the batch; each request gains one token), then Append for each layer,
// then attention reads DenseEntries / RawWindow. The step table the views read is written by
// PlanStep into device memory, so a captured graph of Append stays valid for any later batch of
// at most max_batch rows.
//
// Not thread-safe. The Backend must outlive the store. Every call that enqueues work does so on
// the stream it is given; the caller orders streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "manager/device_memory.h"
#include "sparsekv/backend.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/options.h"
#include "sparsekv/status.h"
#include "sparsekv/types.h"

namespace sparsekv {

struct DenseLayerStoreOptions {
  KVGeometry geometry;             // the model's layers: kinds, cadences, row sizes
  int32_t raw_window = 0;          // rows per ring (CacheOptions::raw_window); 0: no ring
  int32_t page_rows = 64;          // entries per page of a resident layer (resident_page_rows)
  int32_t max_requests = 0;        // requests held on the device at once (table rows), >= 1
  int32_t max_batch = 0;           // rows of one step, in [1, max_requests]
  int32_t max_request_tokens = 0;  // the most tokens one request may reserve, >= 1
  int64_t budget_bytes = 0;        // device memory the store may hold, tables included
};

// The store's device memory by use, in bytes; sum() is bytes().
struct DenseMemoryUse {
  int64_t resident_entries = 0;  // the pages of resident layers of the requests held
  int64_t windows = 0;           // the rings of the requests held
  int64_t tables = 0;            // the page, ring and step tables (fixed, from Create)
  int64_t sum() const { return resident_entries + windows + tables; }
};

class DenseLayerStore {
 public:
  // InvalidArgument naming the option for a bad shape; ResourceExhausted if the tables alone
  // exceed budget_bytes; the backend's error if the tables cannot be allocated.
  static StatusOr<std::unique_ptr<DenseLayerStore>> Create(const DenseLayerStoreOptions& options,
                                                           std::shared_ptr<Backend> backend);
  // Frees every request's memory. REQUIRES: nothing enqueued still uses it.
  ~DenseLayerStore();
  DenseLayerStore(const DenseLayerStore&) = delete;
  DenseLayerStore& operator=(const DenseLayerStore&) = delete;

  // The device bytes a request reserving `reserved_tokens` holds, by use (tables 0).
  DenseMemoryUse RequestBytes(int64_t reserved_tokens) const;
  // The same for a store of `options`, before one is made; and the bytes of its fixed tables
  // (MemoryByUse().tables once created). REQUIRES: options that Create accepts.
  static DenseMemoryUse RequestBytes(const DenseLayerStoreOptions& options,
                                     int64_t reserved_tokens);
  static int64_t TableBytes(const DenseLayerStoreOptions& options);

  // ---- Lifecycle ----

  // Holds `id` with `prompt_tokens` tokens (whose rows IngestPrompt writes; until then they read
  // as zeros), reserving for `reserved_tokens`. InvalidArgument if reserved_tokens is outside
  // [1, max_request_tokens] or prompt_tokens outside [0, reserved_tokens]; AlreadyExists if `id`
  // is held (or retracted); ResourceExhausted if no table row is free or its bytes exceed what is
  // left of the budget.
  Status Admit(RequestId id, int32_t prompt_tokens, int64_t reserved_tokens, StreamHandle stream);
  // Writes `layer`'s rows for the request's tokens n now: for a resident layer of cadence r, its
  // floor(n / r) entries from `entry_rows` (consecutive rows of the layer's row_stride); with a
  // raw window, its newest min(n, raw_window) rows from `window_rows` (oldest first, the same
  // stride) into their ring slots. With `kept_tokens` > 0 (a prompt whose first tokens' entries
  // are in place already: RestoreEntries), only the entries [floor(kept_tokens / r), floor(n / r))
  // are written, and `entry_rows` starts at the first of them. A pointer is read only where it has
  // rows to give; the layer's other rows are left as they are. NotFound, FailedPrecondition for a
  // retracted request, InvalidArgument for a layer out of range, kept_tokens outside [0, n] or a
  // null pointer that has rows to give.
  Status IngestPrompt(RequestId id, int32_t layer, const void* entry_rows, const void* window_rows,
                      StreamHandle stream, int32_t kept_tokens = 0);
  // Copies the entries of the first `tokens` tokens of every resident layer (floor(tokens / r)
  // each) from `host`, what Retract wrote of a request that reserved `host_reserved_tokens`
  // (host_bytes of it), into `id`'s pages: the resident entries of a prompt prefix that request
  // held. Raw windows are not copied. NotFound, FailedPrecondition for a retracted request;
  // InvalidArgument if `tokens` exceeds the request's tokens or host_reserved_tokens, or
  // host_bytes is short of that request's bytes. `host` may be reused when the call returns.
  Status RestoreEntries(RequestId id, const void* host, int64_t host_bytes,
                        int64_t host_reserved_tokens, int32_t tokens, StreamHandle stream);
  // Holds `child` with a device copy of `parent`'s entries and rings and its token count,
  // reserving `reserved_tokens` (>= the parent's tokens). Errors as Admit; NotFound for a parent
  // not held, FailedPrecondition for a retracted one.
  Status Fork(RequestId parent, RequestId child, int64_t reserved_tokens, StreamHandle stream);
  // Frees `id`'s memory and table row (held or retracted). NotFound if unknown.
  // REQUIRES (not checked): nothing enqueued still reads its memory.
  Status Release(RequestId id);
  // The bytes Retract writes to the caller's host buffer: RequestBytes(reserved).sum().
  StatusOr<int64_t> RetractedBytes(RequestId id) const;
  // Copies `id`'s memory to `host` (host_bytes >= RetractedBytes), waits for `stream`, then frees
  // the device memory and table row; the request keeps its tokens. NotFound, FailedPrecondition
  // if already retracted, InvalidArgument if host_bytes is short. The caller owns `host` and must
  // keep it until Resume or Release.
  Status Retract(RequestId id, void* host, int64_t host_bytes, StreamHandle stream);
  // Allocates `id`'s memory again and copies `host` (what Retract wrote) back. NotFound,
  // FailedPrecondition if not retracted, InvalidArgument if host_bytes is short,
  // ResourceExhausted as Admit. `host` may be reused when the call returns.
  Status Resume(RequestId id, const void* host, int64_t host_bytes, StreamHandle stream);

  // ---- The decode step ----

  // The step's batch: each request gains one token (the one Append writes). InvalidArgument for
  // more than max_batch rows or a repeated id; NotFound / FailedPrecondition for a request not
  // held or retracted; OutOfRange for one at its reserved tokens. Nothing changes on an error.
  Status PlanStep(std::span<const RequestId> batch, StreamHandle stream);
  // Takes back the token each request of `batch` gained in the PlanStep(batch) just before (the
  // caller's step was refused after it). The device's step table keeps that batch, which no
  // Append reads before the next PlanStep rewrites it. REQUIRES: PlanStep(batch) succeeded and
  // no call for those requests followed it.
  void CancelStep(std::span<const RequestId> batch);
  // The step's rows of `layer` (DenseAppendView): `entry_rows` [max_batch rows of the layer's
  // row_stride] is read for a resident layer only, and only for the rows whose entry completes;
  // `window_rows` (same shape) is required when raw_window > 0. InvalidArgument for a layer out
  // of range or a required pointer that is null.
  Status Append(int32_t layer, const void* entry_rows, const void* window_rows,
                StreamHandle stream);
  // Views of the step planned last. InvalidArgument for a layer out of range or, for
  // DenseEntries, not kResident; FailedPrecondition for RawWindow when raw_window is 0.
  StatusOr<DenseEntriesView> DenseEntries(int32_t layer) const;
  StatusOr<RawWindowView> RawWindow(int32_t layer) const;

  // ---- State ----

  // The request's tokens (NotFound if not held or retracted).
  StatusOr<int32_t> Tokens(RequestId id) const;
  bool IsRetracted(RequestId id) const;
  DenseMemoryUse MemoryByUse() const { return {resident_entries_, windows_, tables_.bytes()}; }
  int64_t bytes() const { return MemoryByUse().sum(); }
  int64_t budget_bytes() const { return options_.budget_bytes; }
  const DenseLayerStoreOptions& options() const { return options_; }

 private:
  // Where a resident layer's pages and every layer's ring lie in a request's allocation.
  struct Layout {
    std::vector<int64_t> page_offset;  // [num_layers] first page of a resident layer, else -1
    std::vector<int32_t> pages;        // [num_layers] pages of a resident layer, else 0
    std::vector<int64_t> ring_offset;  // [num_layers] the ring, or -1 without a raw window
    DenseMemoryUse bytes;              // entries and windows (tables 0)
  };
  struct Held {
    int64_t reserved_tokens = 0;
    int32_t tokens = 0;
    int32_t table_row = -1;       // -1 while retracted
    std::byte* memory = nullptr;  // null while retracted
    Layout layout;
  };

  DenseLayerStore(const DenseLayerStoreOptions& options, std::shared_ptr<Backend> backend);
  // The `role` ("request", "parent") `id` the store holds, else NotFound naming `call`.
  StatusOr<Held*> Find(RequestId id, const char* call, const char* role = "request");
  StatusOr<const Held*> Find(RequestId id, const char* call, const char* role = "request") const;
  // As Find, and FailedPrecondition while `id` is retracted.
  StatusOr<Held*> FindPlaced(RequestId id, const char* call, const char* role = "request");
  // InvalidArgument unless `host` (host_bytes) holds the `bytes` of request `id`.
  static Status CheckHostBuffer(const void* host, int64_t host_bytes, int64_t bytes, RequestId id,
                                const char* call);
  Status AllocateTables();
  static Layout LayoutFor(const DenseLayerStoreOptions& options, int64_t reserved_tokens);
  // Pages of `layer` in a request's page table row: enough for max_request_tokens (0 unless the
  // layer is resident).
  static int32_t PagesPerRow(const DenseLayerStoreOptions& options, int32_t layer);
  // Allocates and zeroes `held`'s memory, takes a table row and uploads it.
  Status Place(RequestId id, Held& held, StreamHandle stream);
  // Frees `held`'s memory and row. REQUIRES: it is placed.
  void Unplace(Held& held);
  Status UploadRow(const Held& held, StreamHandle stream);
  // Copies the entries of `tokens` tokens and the rings of `from` into `to` (a fork).
  Status CopyRows(const Held& from, const Held& to, int32_t tokens, StreamHandle stream);

  DenseLayerStoreOptions options_;
  std::shared_ptr<Backend> backend_;
  DeviceMemory tables_;
  // Per layer: the page table [max_requests, pages_per_row[l]] (resident layers) and the ring
  // table [max_requests] (with a raw window), in device memory.
  std::vector<std::byte**> page_table_;
  std::vector<int32_t> pages_per_row_;
  std::vector<std::byte**> ring_table_;
  // The step table: [0] batch size, [1, 1 + max_batch) table rows, then seq_len.
  int32_t* step_ = nullptr;
  std::vector<int32_t> step_host_;
  std::unordered_map<RequestId, Held> requests_;
  std::vector<int32_t> free_rows_;
  int64_t resident_entries_ = 0;
  int64_t windows_ = 0;
};

}  // namespace sparsekv
