#include "tools/sparsekv/pool/test/test_child.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <set>

namespace sparsekv::tools::test_child {

volatile std::sig_atomic_t stop_requested = 0;
extern "C" void OnStop(int) { stop_requested = 1; }

std::vector<Request> ParseRequests(const std::vector<std::string>& specs) {
  std::vector<Request> out;
  for (const std::string& s : specs) {
    const size_t colon = s.rfind(':');
    out.push_back({s.substr(0, colon), std::stoull(s.substr(colon + 1))});
  }
  return out;
}

std::vector<testing::Bytes> PromptLayers(int32_t layers, int32_t tokens, int32_t row_bytes,
                                         uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<testing::Bytes> out;
  for (int32_t l = 0; l < layers; ++l) out.push_back(testing::RandomRows(rng, tokens, row_bytes));
  return out;
}

std::vector<int32_t> PickTopK(std::mt19937_64& rng, int32_t top_k, int32_t prompt, int32_t len) {
  std::set<int32_t> chosen;
  const int32_t start = static_cast<int32_t>(rng() % prompt);
  for (int32_t p = start; p < prompt && static_cast<int32_t>(chosen.size()) < top_k / 4; ++p) {
    chosen.insert(p);
  }
  for (int32_t i = 0; i < top_k / 8 && len > prompt; ++i) {
    chosen.insert(prompt + static_cast<int32_t>(rng() % (len - prompt)));
  }
  for (int tries = 0; tries < 4 * top_k && static_cast<int32_t>(chosen.size()) < top_k - 2;
       ++tries) {
    chosen.insert(static_cast<int32_t>(rng() % len));
  }
  std::vector<int32_t> out(chosen.begin(), chosen.end());
  std::shuffle(out.begin(), out.end(), rng);
  out.resize(static_cast<size_t>(top_k), -1);
  return out;
}

void Check(const Status& s, const std::string& what) {
  if (s.ok()) return;
  std::cerr << what << ": " << s.ToString() << std::endl;
  std::exit(2);
}

std::unique_ptr<ControlPlane> ConnectOrDie(const ControlPlaneOptions& options) {
  auto plane = ControlPlane::Connect(options);
  Check(plane.status(), "control plane");
  return std::move(plane).value();
}

DeviceBlock::DeviceBlock(Backend& backend, size_t bytes) : backend_(backend) {
  auto p = backend.AllocateDevice(bytes);
  Check(p.status(), "allocate");
  ptr_ = *p;
}

StepBuffers::StepBuffers(Backend& backend, int32_t layers, int32_t max_batch, int32_t top_k,
                         int32_t row_bytes)
    : stride(static_cast<size_t>(row_bytes)), entries(static_cast<size_t>(max_batch) * top_k) {
  for (int32_t l = 0; l < layers; ++l) {
    new_rows.push_back(std::make_unique<DeviceBlock>(backend, max_batch * stride));
    topk.push_back(std::make_unique<DeviceBlock>(backend, entries * sizeof(int32_t)));
    slots.push_back(std::make_unique<DeviceBlock>(backend, entries * sizeof(int32_t)));
    assembled.push_back(std::make_unique<DeviceBlock>(backend, entries * stride));
  }
}

std::unique_ptr<StepSchedule> MakeSchedule(SparseKVCacheManager& manager) {
  ScheduleOptions options;
  options.trials = 64;
  auto schedule = StepSchedule::Create(manager, options);
  Check(schedule.status(), "step schedule");
  return std::move(schedule).value();
}

std::vector<std::vector<int32_t>> RunStep(SparseKVCacheManager& manager, StepSchedule& schedule,
                                          Backend& backend, testing::DenseModel& oracle,
                                          const std::vector<RequestId>& ids, int32_t prompt,
                                          std::mt19937_64& rng, StepBuffers& buffers) {
  const int32_t top_k = manager.options().top_k;
  const int32_t row_bytes = static_cast<int32_t>(buffers.stride);
  const int32_t batch = static_cast<int32_t>(ids.size());
  Check(schedule.PlanStep(ids, nullptr), "plan step");
  std::vector<std::vector<int32_t>> picks(buffers.new_rows.size());
  for (size_t l = 0; l < buffers.new_rows.size(); ++l) {
    const int32_t layer = static_cast<int32_t>(l);
    const testing::Bytes rows =
        testing::RandomRows(rng, static_cast<int64_t>(ids.size()), row_bytes);
    for (size_t b = 0; b < ids.size(); ++b) {
      oracle.Append(ids[b], layer, rows.data() + b * buffers.stride);
      const std::vector<int32_t> p = PickTopK(rng, top_k, prompt, oracle.Length(ids[b], layer));
      picks[l].insert(picks[l].end(), p.begin(), p.end());
    }
    Check(backend.CopyAsync(buffers.new_rows[l]->get(), rows.data(), rows.size(), nullptr),
          "upload");
    Check(backend.CopyAsync(buffers.topk[l]->get(), picks[l].data(),
                            picks[l].size() * sizeof(int32_t), nullptr),
          "upload");
    const LayerWork work{buffers.new_rows[l]->get(), nullptr, buffers.topk[l]->get<int32_t>(), 0,
                         buffers.slots[l]->get<int32_t>()};
    // The "attention" of a test process: the layer's assembled rows, once every slice is in.
    const AttendFn attend = [&](int32_t at, int32_t first, int32_t rows, StreamHandle stream) {
      if (first + rows < batch) return Status::Ok();
      return manager.AssembleLayer(at, buffers.slots[l]->get<int32_t>(),
                                   buffers.assembled[l]->get(), stream);
    };
    Check(schedule.RunLayer(layer, work, attend, nullptr), "run layer");
  }
  Check(schedule.FinishStep(nullptr), "finish step");
  Check(backend.Synchronize(nullptr), "synchronize");
  return picks;
}

}  // namespace sparsekv::tools::test_child
