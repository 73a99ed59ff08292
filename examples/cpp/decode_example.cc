// Decodes a few steps of two requests on the CPU backend through the library's step schedule and
// checks, in the attention it hands the schedule, that every slot the manager returns holds the
// row that was ingested or appended at the selected position. Prints a summary with the schedule
// chosen; exits 1 on the first mismatch or error.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "sparsekv/manager.h"
#include "sparsekv/step_schedule.h"

namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kRowBytes = 32;
constexpr int32_t kTopK = 4;
constexpr int32_t kSteps = 16;

// The KV row of (request, layer, position): bytes derived from all three, so that a row copied
// from the wrong place does not compare equal.
void FillRow(sparsekv::RequestId id, int32_t layer, int32_t position, uint8_t* row) {
  for (int32_t i = 0; i < kRowBytes; ++i) {
    row[i] = static_cast<uint8_t>(id * 131 + layer * 37 + position * 7 + i);
  }
}

bool Check(const sparsekv::Status& status, const char* what) {
  if (status.ok()) return true;
  std::fprintf(stderr, "decode_example: %s: %s\n", what, status.ToString().c_str());
  return false;
}

}  // namespace

int main() {
  using sparsekv::RequestId;
  sparsekv::CacheOptions options;
  options.geometry = sparsekv::KVGeometry::Uniform(kLayers, kRowBytes);
  options.top_k = kTopK;
  options.hot_slots = 6;
  options.window = 1;
  options.host_capacity_tokens = 256;
  options.max_requests = 2;
  options.max_batch = 2;
  options.max_context = 64;
  options.host_page_tokens = 16;
  options.copy_chunk_rows = 1;   // the schedule may feed attention one request at a time
  options.max_prefetch = kTopK;  // and prefetch the next layer's rows

  auto created = sparsekv::SparseKVCacheManager::Create(options, sparsekv::CreateCpuBackend());
  if (!Check(created.status(), "Create")) return 1;
  std::unique_ptr<sparsekv::SparseKVCacheManager> manager = std::move(*created);

  const std::vector<RequestId> batch = {7, 9};
  const std::vector<int32_t> prompt_len = {40, 25};
  for (size_t b = 0; b < batch.size(); ++b) {
    if (!Check(manager->Admit(batch[b], prompt_len[b], kSteps, nullptr), "Admit")) return 1;
    std::vector<uint8_t> prompt(static_cast<size_t>(prompt_len[b]) * kRowBytes);
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      for (int32_t p = 0; p < prompt_len[b]; ++p) {
        FillRow(batch[b], layer, p, prompt.data() + p * kRowBytes);
      }
      if (!Check(manager->IngestPrompt(batch[b], layer, prompt.data(), nullptr), "IngestPrompt")) {
        return 1;
      }
    }
  }

  // The step schedule drives the run phase: it measures the schedules these options allow
  // (serial, the cross-layer prefetch, attention in slices of one request fed as their copies
  // land, both) and keeps the fastest. The engine hands it each layer's work and its attention.
  // Two timed steps per candidate (six candidates here): the first twelve steps measure them.
  sparsekv::ScheduleOptions schedule_options;
  schedule_options.trials = 2;
  auto scheduled = sparsekv::StepSchedule::Create(*manager, schedule_options);
  if (!Check(scheduled.status(), "StepSchedule::Create")) return 1;
  std::unique_ptr<sparsekv::StepSchedule> schedule = std::move(*scheduled);

  const size_t batch_size = batch.size();
  std::vector<uint8_t> new_rows(batch_size * kRowBytes);
  std::vector<int32_t> topk(batch_size * kTopK);
  std::vector<int32_t> slots(batch_size * kTopK);
  std::vector<uint8_t> expected(kRowBytes);
  int64_t checked = 0;
  bool mismatch = false;
  // The "attention" of this example: on the CPU backend the rows are in once the schedule calls
  // it, so it checks every row its slice of the batch reads. A GPU engine enqueues its kernel on
  // `stream` instead.
  const sparsekv::AttendFn attend = [&](int32_t layer, int32_t first, int32_t rows,
                                        sparsekv::StreamHandle) {
    const std::byte* hot = manager->HotLayer(layer);
    for (int32_t b = first; b < first + rows; ++b) {
      for (int32_t k = 0; k < kTopK; ++k) {
        const size_t e = static_cast<size_t>(b) * kTopK + k;
        const int32_t position = topk[e];
        if (position < 0) {
          mismatch = mismatch || slots[e] != -1;
          continue;
        }
        FillRow(batch[b], layer, position, expected.data());
        if (slots[e] < 0 || std::memcmp(hot + static_cast<int64_t>(slots[e]) * kRowBytes,
                                        expected.data(), kRowBytes) != 0) {
          std::fprintf(stderr,
                       "decode_example: layer %d request %llu position %d: slot %d does not "
                       "hold the row appended there\n",
                       layer, static_cast<unsigned long long>(batch[b]), position, slots[e]);
          mismatch = true;
        }
        ++checked;
      }
    }
    return sparsekv::Status::Ok();
  };
  for (int32_t step = 0; step < kSteps; ++step) {
    if (!Check(schedule->PlanStep(batch, nullptr), "PlanStep")) return 1;
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      for (size_t b = 0; b < batch_size; ++b) {
        const int32_t newest = prompt_len[b] + step;  // the position this step appends
        FillRow(batch[b], layer, newest, new_rows.data() + b * kRowBytes);
        // The newest token, a recent one, and two that move through the prompt; one padding
        // entry every other step.
        int32_t* row = topk.data() + b * kTopK;
        row[0] = newest;
        row[1] = newest - 1;
        row[2] = (step * 5 + static_cast<int32_t>(b)) % (newest - 1);
        row[3] = step % 2 == 0 ? -1 : (step * 11 + 3) % (newest - 1);
        if (row[3] == row[2]) row[3] = -1;
      }
      const sparsekv::LayerWork work{new_rows.data(), nullptr, topk.data(), 0, slots.data()};
      if (!Check(schedule->RunLayer(layer, work, attend, nullptr), "RunLayer")) return 1;
      if (mismatch) return 1;
    }
    if (!Check(schedule->FinishStep(nullptr), "FinishStep")) return 1;
  }

  auto stats = manager->ReadStats(nullptr);
  if (!Check(stats.status(), "ReadStats")) return 1;
  for (size_t b = 0; b < batch_size; ++b) {
    auto length = manager->SequenceLength(batch[b]);
    if (!Check(length.status(), "SequenceLength")) return 1;
    if (*length != prompt_len[b] + kSteps) {
      std::fprintf(stderr, "decode_example: request %llu has %d tokens, expected %d\n",
                   static_cast<unsigned long long>(batch[b]), *length, prompt_len[b] + kSteps);
      return 1;
    }
    if (!Check(manager->Release(batch[b]), "Release")) return 1;
  }
  std::printf(
      "decode_example: %d steps x %d layers x %zu requests, %lld rows checked, "
      "hit rate %.2f (layer 0), schedule %s (%s): OK\n",
      kSteps, kLayers, batch_size, static_cast<long long>(checked), stats->layers[0].hit_rate(),
      schedule->choice().ToString().c_str(), schedule->reason().c_str());
  return 0;
}
