// What the prefill and decode processes of the multi-process tests (scale_out_test_child,
// node_pool_test_child) share: the stop flag SIGTERM sets, the requests they are given as
// "KEY:SEED", the prompt rows a seed stands for, the positions a decode step selects, and how they
// exit on an error they cannot go on from; and a decode step of the manager with the buffers it
// runs on.
#pragma once

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sparsekv/backend.h"
#include "sparsekv/control_plane.h"
#include "sparsekv/manager.h"
#include "sparsekv/status.h"
#include "sparsekv/step_schedule.h"
#include "testing/harness.h"

namespace sparsekv::tools::test_child {

// Set by OnStop (installed for SIGTERM); the children's loops end once it is.
extern volatile std::sig_atomic_t stop_requested;
extern "C" void OnStop(int);

struct Request {
  std::string key;
  uint64_t seed = 0;
};

// "KEY:SEED" each; the key may itself hold colons.
std::vector<Request> ParseRequests(const std::vector<std::string>& specs);

// The prompt rows of the request with `seed`: one [tokens][row_bytes] block per layer. Prefill
// writes them, decode's oracle expects them.
std::vector<testing::Bytes> PromptLayers(int32_t layers, int32_t tokens, int32_t row_bytes,
                                         uint64_t seed);

// `top_k` positions of a request of `len` tokens (this step's included) of which `prompt` are
// prompt rows: a run of adjacent prompt positions, a few generated positions, random positions
// anywhere, in random order, then -1 padding.
std::vector<int32_t> PickTopK(std::mt19937_64& rng, int32_t top_k, int32_t prompt, int32_t len);

// Prints "WHAT: STATUS" to stderr and exits 2 unless `s` is ok.
void Check(const Status& s, const std::string& what);

// Connects to the control plane or exits as Check does ("control plane: ...").
std::unique_ptr<ControlPlane> ConnectOrDie(const ControlPlaneOptions& options);

// A block of the backend's device memory (host memory on the CPU backend), freed on destruction.
// Not cuda_common::DeviceBuffer: it allocates through the Backend, and exits as Check does on
// failure.
class DeviceBlock {
 public:
  DeviceBlock(Backend& backend, size_t bytes);
  ~DeviceBlock() { backend_.FreeDevice(ptr_); }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  template <typename T = std::byte>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  Backend& backend_;
  void* ptr_ = nullptr;
};

// The fixed buffers of a decode process's steps, one of each per layer: the new rows
// ([max_batch, row_bytes]), the top-k and the slots ([max_batch, top_k] int32) and the assembled
// rows ([max_batch, top_k, row_bytes]).
struct StepBuffers {
  StepBuffers(Backend& backend, int32_t layers, int32_t max_batch, int32_t top_k,
              int32_t row_bytes);
  size_t stride = 0;   // bytes per row
  size_t entries = 0;  // max_batch * top_k
  std::vector<std::unique_ptr<DeviceBlock>> new_rows, topk, slots, assembled;
};

// The step schedule a decode process drives its steps through: every choice the manager's
// options allow, measured round robin for as many steps as a test runs (so that each one runs
// over the extension tiers in turn).
std::unique_ptr<StepSchedule> MakeSchedule(SparseKVCacheManager& manager);

// One decode step of `ids` (their order is the batch's) through `schedule`: PlanStep, then per
// layer a new random row per request (appended to `oracle` too) and PickTopK positions over its
// `prompt` prompt rows, the schedule's RunLayer into `buffers` (its attention assembles the rows
// once the layer's last slice is in); FinishStep; then waits for the backend. Returns each layer's
// top-k ([ids.size(), top_k]).
std::vector<std::vector<int32_t>> RunStep(SparseKVCacheManager& manager, StepSchedule& schedule,
                                          Backend& backend, testing::DenseModel& oracle,
                                          const std::vector<RequestId>& ids, int32_t prompt,
                                          std::mt19937_64& rng, StepBuffers& buffers);

}  // namespace sparsekv::tools::test_child
