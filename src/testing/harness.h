// Test harness shared by the manager's tests on every backend: a trivially correct dense model of
// each request's history, and a driver that runs decode steps on a manager through buffers in the
// backend's device memory.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <span>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/index_groups.h"
#include "sparsekv/manager.h"

namespace sparsekv {
// Lets GoogleTest print status codes by name.
inline void PrintTo(StatusCode code, std::ostream* os) { *os << StatusCodeName(code); }
}  // namespace sparsekv

namespace sparsekv::testing {

using Bytes = std::vector<std::byte>;

// Every row ever written, per request and layer, densely: [position][row_stride].
class DenseModel {
 public:
  explicit DenseModel(KVGeometry geometry) : geometry_(std::move(geometry)) {}

  void Add(RequestId id, const std::vector<Bytes>& prompt_layers, int32_t prompt_len);
  void Append(RequestId id, int32_t layer, const std::byte* row);
  void Remove(RequestId id) { history_.erase(id); }
  // `to` gets a copy of `from`'s history (a fork).
  void Copy(RequestId from, RequestId to) { history_[to] = history_.at(from); }
  bool Contains(RequestId id) const { return history_.contains(id); }
  int32_t Length(RequestId id, int32_t layer) const;
  const std::byte* Row(RequestId id, int32_t layer, int32_t position) const;

 private:
  KVGeometry geometry_;
  std::map<RequestId, std::vector<Bytes>> history_;  // id -> per layer [len][stride]
};

// The indexer keys the tests store for `n` KV rows ([n][row_stride]): key_bytes bytes each,
// derived from the row's meaningful bytes, so that the dense model's rows define every key
// (forked and shared histories included). [n][key_bytes].
Bytes KeysOf(const std::byte* rows, int64_t n, LayerShape shape, int32_t key_bytes);

// Random bytes for `rows` rows of `stride` bytes.
Bytes RandomRows(std::mt19937_64& rng, int64_t rows, int32_t stride);

// A block of the backend's device (or host) memory, freed on destruction. The stream-taking
// transfers are enqueued on the stream; the others synchronise.
class DeviceBuffer {
 public:
  enum class Where { kDevice, kHost };
  DeviceBuffer(Backend& backend, size_t bytes, Where where = Where::kDevice);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T = std::byte>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }

  void Upload(const void* src, size_t bytes, StreamHandle stream);
  Bytes Download(StreamHandle stream) const;
  void Fill(int value, StreamHandle stream);

  template <typename T>
  void Upload(const std::vector<T>& values) {
    ASSERT_LE(values.size() * sizeof(T), bytes_);
    Upload(values.data(), values.size() * sizeof(T), nullptr);
    Sync();
  }
  template <typename T>
  std::vector<T> Download() const {
    const Bytes bytes = Download(nullptr);
    std::vector<T> values(bytes_ / sizeof(T));
    std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
    return values;
  }
  void Fill(int value) {
    Fill(value, nullptr);
    Sync();
  }

 private:
  void Sync() const;

  Backend& backend_;
  Where where_;
  void* ptr_ = nullptr;
  size_t bytes_;
};

// What one layer of a step returned.
struct LayerResult {
  std::vector<int32_t> slots;  // [max_batch, top_k]
  Bytes assembled;             // [max_batch, top_k, stride]
  Bytes gathered;  // rows read through `slots` from the hot cache, [batch, top_k, stride]
  // Split runs only: ResolveLayer's fill mask, [max_batch, top_k]; `assembled` was then gathered
  // before the miss copy, so only its entries with fill 0 are meaningful.
  std::vector<uint8_t> fill;
};

// How a StepDriver runs a layer.
struct RunMode {
  // RunLayer (false), or ResolveLayer with a fill mask, AssembleLayer, then CopyMisses (true).
  // Layers that share their group's top-k (IndexGroups) always copy and assemble with the
  // group's slots.
  bool split = false;
  // After each layer: PrefetchLayer of this many random positions per request (0 = none).
  int32_t prefetch = 0;
  uint64_t seed = 0;  // of the prefetched positions
};

// Drives steps on one manager with fixed device buffers (the shape a captured graph needs).
class StepDriver {
 public:
  // `stream` is passed to every call.
  explicit StepDriver(SparseKVCacheManager& manager, StreamHandle stream = nullptr,
                      RunMode mode = RunMode());

  // Plans `batch` (with the appended tokens' ids if `token_ids` is not empty), then per layer:
  // uploads new_rows[layer] ([batch, stride]) and topk[layer] ([batch, the layer's top_k]),
  // appends (with keys where the layer keeps them), runs
  // (with assemble), and downloads the results. EXPECTs every call to succeed.
  std::vector<LayerResult> Step(const std::vector<RequestId>& batch,
                                const std::vector<Bytes>& new_rows,
                                const std::vector<std::vector<int32_t>>& topk,
                                const std::vector<int32_t>& token_ids = {});

  // The run phase alone (what a graph captures): append + run for every layer, finish.
  Status RunPhase();
  // Uploads a step's inputs into the fixed buffers (outside any graph); poisons the outputs.
  // With a prefetch mode, also draws the positions to prefetch (in [-2, seq_lens[b] + 2)).
  void UploadInputs(int32_t batch, const std::vector<Bytes>& new_rows,
                    const std::vector<std::vector<int32_t>>& topk,
                    const std::vector<int32_t>& seq_lens = {});
  // Downloads the outputs of the last run phase.
  std::vector<LayerResult> DownloadOutputs(int32_t batch);

  StreamHandle stream() const { return stream_; }

 private:
  // The layer whose slots `layer` uses: the first of its index group.
  int32_t Leader(int32_t layer) const { return groups_.Leader(layer); }

  SparseKVCacheManager& m_;
  const IndexGroups groups_;  // the manager's
  StreamHandle stream_;
  RunMode mode_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<DeviceBuffer>> new_rows_, topk_, slots_, assembled_, fill_;
  std::vector<std::unique_ptr<DeviceBuffer>> new_keys_;  // with indexer keys: per layer
  std::vector<std::unique_ptr<DeviceBuffer>> prefetch_;  // per layer [max_batch, prefetch]
};

// True if the first `rows` entries of a and b have the same slots and the same meaningful bytes
// (row_bytes of each row; stride padding is not compared) gathered and assembled.
bool SameRows(const LayerResult& a, const LayerResult& b, size_t rows, LayerShape shape);

// Checks one layer's result against the model: every valid entry's row (through the slot and in
// the assembled buffer) equals the model's; skipped entries are -1 with zero assembled rows.
// With `repeats_share`, a repeated position is valid too (CacheOptions::share_repeated_positions).
// With a fill mask, the assembled rows of entries with fill 1 are not checked.
// Returns the number of mismatches (0 = exact) and reports them with ADD_FAILURE.
int CheckLayer(const DenseModel& model, const KVGeometry& geometry, int32_t layer,
               const std::vector<RequestId>& batch, const std::vector<int32_t>& topk,
               const LayerResult& result, int32_t top_k, bool repeats_share = false);

// With indexer keys: checks the keys of every position of every request of the planned step
// (through SparseKVCacheManager::IndexerKeys, every keyed layer) against KeysOf the model's rows,
// and that layers without keys (LayerShape::indexer_keys false) have an empty view.
// Returns the number of mismatches (0 = exact) and reports the first ones with ADD_FAILURE.
int CheckKeys(const DenseModel& model, SparseKVCacheManager& m, const std::vector<RequestId>& batch,
              StreamHandle stream);

// Everything of `m` that a refused call must leave as it was, as one list of numbers: the step's
// batch size; each of `ids`' length, host pages and their reference counts (-1 for an unknown
// id); the host counters, the resolve counters in total, and the gauges of CacheStats (pool,
// hot cache, device and host memory by use). Synchronises the null stream (ReadStats).
std::vector<int64_t> ObservableState(SparseKVCacheManager& m, std::span<const RequestId> ids);

}  // namespace sparsekv::testing
