// Statistics: the counters behind CacheStats, and the per-step byte accounting a replayed step
// is counted with.
//
// It owns the host counters (HostCounters, manager.h, where every formula is), the device
// counters the resolves write ([layers] ResolveCounters of the step's resolves, then [layers] of
// the prefetches; a layer sharing its group's top-k counts in the group's first layer) and the
// device counter of skipped IndexCopy entries. Read sums them into a CacheStats; the gauges of
// the pool, the hot cache and the requests are the manager's to fill.
//
// Replay accounting: a run phase the host calls counts its bytes per request of the batch as it
// goes (CountAppend, CountAssemble); FinishStep records them (RecordRunPhase), and a step whose
// run phase was replayed from a captured graph adds the recorded bytes once per request
// (CountReplayedStep).
//
// Not thread-safe; owned by the manager.
#pragma once

#include <cstdint>

#include "manager/device_memory.h"
#include "sparsekv/backend.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/manager.h"
#include "sparsekv/options.h"

namespace sparsekv {

class Statistics {
 public:
  // `options` must outlive it.
  Statistics(const CacheOptions& options, Backend& backend);
  Statistics(const Statistics&) = delete;
  Statistics& operator=(const Statistics&) = delete;
  // The device counters, zeroed on the null stream.
  Status Allocate();

  // The host counters, for every part that counts.
  HostCounters& host() { return host_; }
  // Where the resolve of `layer`'s group, or its prefetch, counts.
  ResolveCounters* resolve_counters(int32_t layer) const { return counters_ + layer; }
  ResolveCounters* prefetch_counters(int32_t layer) const { return counters_ + layers_ + layer; }
  unsigned long long* invalid_copies() const { return invalid_copies_; }

  // ---- Per step ----
  void BeginStep() { open_bytes_to_host_ = open_bytes_assembled_ = 0; }
  // AppendToken of a layer of `row_bytes` for `batch_size` requests.
  void CountAppend(size_t batch_size, int32_t row_bytes) {
    open_bytes_to_host_ += row_bytes;
    host_.bytes_device_to_host += batch_size * static_cast<uint64_t>(row_bytes);
  }
  // AssembleLayer of `top_k` rows of `row_bytes` for `batch_size` requests.
  void CountAssemble(size_t batch_size, int32_t top_k, int32_t row_bytes) {
    open_bytes_assembled_ += static_cast<uint64_t>(top_k) * row_bytes;
    host_.bytes_assembled += batch_size * static_cast<uint64_t>(top_k) * row_bytes;
  }
  // The open step's run phase is complete: its bytes per request are what a replay counts.
  void RecordRunPhase() {
    step_bytes_to_host_ = open_bytes_to_host_;
    step_bytes_assembled_ = open_bytes_assembled_;
  }
  // Whether a complete run phase was ever recorded (a replay has bytes to count).
  bool run_phase_recorded() const { return step_bytes_to_host_ != 0; }
  void CountReplayedStep(size_t batch_size) { CountReplayedStep(batch_size, batch_size); }
  // The same where only `appended` of the requests appended (the others' steps completed no
  // entry: LayerShape::entry_tokens > 1).
  void CountReplayedStep(size_t batch_size, size_t appended) {
    host_.bytes_device_to_host += appended * step_bytes_to_host_;
    host_.bytes_assembled += batch_size * step_bytes_assembled_;
  }

  // ---- Reading ----
  // The host counters and the device counters, summed per layer, in total and for the
  // prefetches (synchronising `stream`); the gauges ("now" in CacheStats) are left 0.
  StatusOr<CacheStats> Read(StreamHandle stream) const;
  // Sets every counter to 0 (the replay accounting stays), and synchronises `stream`.
  Status Reset(StreamHandle stream);

  int64_t device_bytes() const { return memory_.bytes(); }

 private:
  const CacheOptions& options_;
  const int32_t layers_;
  DeviceMemory memory_;
  ResolveCounters* counters_ = nullptr;           // [layers] resolves, then [layers] prefetches
  unsigned long long* invalid_copies_ = nullptr;  // scalar
  HostCounters host_;
  // Bytes one request of a step moves: as the open step's run phase counted them so far, and as
  // the last complete run phase recorded them.
  uint64_t open_bytes_to_host_ = 0;
  uint64_t open_bytes_assembled_ = 0;
  uint64_t step_bytes_to_host_ = 0;
  uint64_t step_bytes_assembled_ = 0;
};

}  // namespace sparsekv
