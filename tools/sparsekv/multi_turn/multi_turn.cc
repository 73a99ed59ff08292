#include "tools/sparsekv/multi_turn/multi_turn.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iomanip>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "sparsekv/manager.h"
#include "sparsekv/step_schedule.h"
#include "tools/sparsekv/common/exit_codes.h"
#include "tools/sparsekv/common/output_file.h"
#include "tools/sparsekv/common/preset_flags.h"
#include "tools/sparsekv/common/preset_layers.h"
#include "tools/sparsekv/common/progress.h"
#include "tools/sparsekv/common/validators.h"

namespace sparsekv::tools {
namespace {

// What happens in one turn of one conversation; drawn once, replayed by both modes.
struct Turn {
  std::vector<int32_t> user;   // new prompt tokens
  std::vector<int32_t> reply;  // decoded tokens
  int32_t think_steps;         // before the next turn
  bool branch;                 // forks config.branches agent branches
};

struct Schedule {
  std::vector<int32_t> system;
  std::vector<std::vector<Turn>> conversations;
  std::vector<int32_t> start_step;  // staggered arrivals
  int32_t max_context = 0;
};

Schedule Draw(const MultiTurnConfig& c) {
  std::mt19937_64 rng(c.seed);
  auto ids = [&](int32_t n) {
    std::vector<int32_t> v(n);
    for (int32_t& id : v) id = static_cast<int32_t>(rng() % 100000);
    return v;
  };
  auto around = [&](int32_t mean) {
    return std::max<int32_t>(1, mean / 2 + static_cast<int32_t>(rng() % (mean + 1)));
  };
  std::exponential_distribution<double> think(1.0 / std::max(1, c.think_steps));
  std::bernoulli_distribution branch(c.branch_probability);
  Schedule s;
  s.system = ids(c.system_tokens);
  for (int32_t i = 0; i < c.conversations; ++i) {
    std::vector<Turn> turns;
    int32_t length = c.system_tokens;
    for (int32_t t = 0; t < c.turns; ++t) {
      Turn turn{ids(around(c.user_tokens)), ids(around(c.reply_tokens)),
                static_cast<int32_t>(think(rng)), branch(rng)};
      length += static_cast<int32_t>(turn.user.size() + turn.reply.size());
      s.max_context = std::max(s.max_context, length + c.branch_tokens);
      turns.push_back(std::move(turn));
    }
    s.conversations.push_back(std::move(turns));
    s.start_step.push_back(static_cast<int32_t>(think(rng)));
  }
  return s;
}

// The most requests the schedule holds at once: per conversation, its turn's (or, while it
// thinks, the retracted previous one) and the branches of every branching turn still decoding. A
// turn lasts at least its reply and a branch branch_tokens steps, so the branching turns that can
// overlap are those that start within branch_tokens reply tokens of each other.
int64_t MaxLiveRequests(const MultiTurnConfig& c, const Schedule& s) {
  int64_t total = 0;
  for (const std::vector<Turn>& turns : s.conversations) {
    int64_t overlap = 0, branching = 0, span = 0;  // over the window [first, next)
    size_t first = 0;
    for (size_t next = 0; next < turns.size(); ++next) {
      // The window's turns start within branch_tokens of turns[first]'s start.
      while (first < next && span >= c.branch_tokens) {
        branching -= turns[first].branch ? 1 : 0;
        span -= static_cast<int64_t>(turns[first].reply.size());
        ++first;
      }
      branching += turns[next].branch ? 1 : 0;
      span += static_cast<int64_t>(turns[next].reply.size());
      overlap = std::max(overlap, branching);
    }
    total += 1 + int64_t{c.branches} * overlap;
  }
  return total;
}

// Resident or window-only layers or a raw window (DeepSeek-V4).
bool HasLayerKinds(const ModelPreset& preset) {
  const KVGeometry g = preset.geometry();
  return preset.raw_window > 0 || std::any_of(g.layers.begin(), g.layers.end(), [](const auto& l) {
           return l.kind != LayerKind::kOffloaded;
         });
}

// What the replays simulate of the preset: without layer kinds one offloaded layer (the pool's
// pages hold every offloaded layer's row of the same tokens, so their count does not depend on
// the layers); with layer kinds every layer with its kind and cadence, no indexer keys and the
// options' top-k, and the preset's raw window.
struct SimulatedLayers {
  KVGeometry geometry;
  int32_t raw_window = 0;
  int32_t entry_tokens = 1;  // of the offloaded layers (one cadence: ValidateOptions)
  int32_t offloaded = 1;     // offloaded layers simulated
  bool resident = false;     // a resident layer: a retained conversation keeps a store copy
};

SimulatedLayers SimulateLayers(const ModelPreset& preset) {
  SimulatedLayers s;
  if (!HasLayerKinds(preset)) {
    s.geometry = KVGeometry::Uniform(1, kMultiTurnSimulatedTokenBytes);
    return s;
  }
  const KVGeometry model = preset.geometry();
  s.geometry = KVGeometry::Uniform(model.num_layers(), kMultiTurnSimulatedTokenBytes);
  s.raw_window = preset.raw_window;
  s.offloaded = 0;
  for (int32_t l = 0; l < model.num_layers(); ++l) {
    LayerShape& layer = s.geometry.layers[l];
    layer.kind = model.layers[l].kind;
    layer.entry_tokens = model.layers[l].entry_tokens;
    layer.indexer_keys = false;
    if (layer.kind == LayerKind::kOffloaded) {
      ++s.offloaded;
      s.entry_tokens = layer.entry_tokens;
    }
    s.resident = s.resident || layer.kind == LayerKind::kResident;
  }
  return s;
}

// Preset bytes of the simulated figures.
struct ByteScale {
  int64_t page_bytes = 0;       // per host-pool page
  int64_t dense_row_bytes = 0;  // per store row
};

// Replays the schedule through one manager, with or without sharing.
class Replay {
 public:
  Replay(const MultiTurnConfig& c, const Schedule& s, const SimulatedLayers& layers,
         ByteScale scale, bool sharing, const MultiTurnProgressFn& progress)
      : c_(c),
        s_(s),
        layers_(layers),
        scale_(scale),
        sharing_(sharing),
        progress_(progress),
        convs_(c.conversations) {}

  StatusOr<MultiTurnModeResult> Run() {
    // Sized from the schedule, so that no flag meets a limit of the manager's: at least one
    // place per conversation and branch of one forking turn, more where branches overlap.
    const int64_t live =
        std::max<int64_t>(int64_t{c_.conversations} * (1 + c_.branches), MaxLiveRequests(c_, s_));
    if (live > std::numeric_limits<int32_t>::max() / 2) {
      return InvalidArgument("the schedule holds up to " + std::to_string(live) +
                             " requests at once; lower --conversations or --branches");
    }
    const auto max_requests = static_cast<int32_t>(live);
    CacheOptions o;
    // Contents do not matter here, pages (and the store's rows) do.
    o.geometry = layers_.geometry;
    o.raw_window = layers_.raw_window;
    o.top_k = 1;
    o.hot_slots = 1;
    o.window = 1;
    o.max_requests = o.max_host_requests = o.max_batch = max_requests;
    o.host_page_tokens = c_.page_tokens;
    o.max_context = s_.max_context + c_.page_tokens;
    o.host_capacity_tokens = int64_t{max_requests} * o.max_context;
    SPARSEKV_ASSIGN_OR_RETURN(m_, SparseKVCacheManager::Create(o, CreateCpuBackend()));
    // Steps run through the library's step schedule, as an engine's would (one layer of
    // padding: serial, the only choice there is).
    SPARSEKV_ASSIGN_OR_RETURN(step_schedule_, StepSchedule::Create(*m_));
    // One buffer gives every call its rows: a prompt's entries and window, a step's rows of
    // max_batch requests.
    zero_rows_.assign(
        static_cast<size_t>(std::max(o.max_context, max_requests)) * kMultiTurnSimulatedTokenBytes,
        std::byte{0});
    topk_.assign(max_requests, -1);  // padding only: nothing is read, the pool is what counts
    slots_.assign(max_requests, 0);

    for (int32_t i = 0; i < c_.conversations; ++i) convs_[i].wake = s_.start_step[i];
    double page_sum = 0;
    int64_t peak_host_bytes = 0;
    double host_byte_sum = 0;
    int64_t step = 0;
    while (true) {
      for (int32_t i = 0; i < c_.conversations; ++i) {
        Conv& cv = convs_[i];
        if (cv.main == 0 && cv.turn < c_.turns && cv.wake <= step) {
          SPARSEKV_RETURN_IF_ERROR(StartTurn(i));
          ++turns_started_;
        }
      }
      if (progress_) {
        progress_(sharing_ ? "sharing" : "private", turns_started_,
                  int64_t{c_.conversations} * c_.turns);
      }
      if (active_.empty()) {
        int64_t next = -1;
        for (const Conv& cv : convs_) {
          if (cv.turn < c_.turns) next = next < 0 ? cv.wake : std::min(next, cv.wake);
        }
        if (next < 0) break;
        step = std::max(step + 1, next);  // idle time: every conversation is thinking
        continue;
      }
      SPARSEKV_RETURN_IF_ERROR(Step());
      ++step;
      ++result_.steps;
      const HostKVPool& pool = m_->host_pool();
      const int32_t used = pool.total_pages() - pool.free_pages();
      result_.peak_pages = std::max(result_.peak_pages, used);
      result_.peak_shared_pages = std::max(result_.peak_shared_pages, pool.shared_pages());
      page_sum += used;
      int64_t dense_host_rows = 0;
      if (layers_.raw_window > 0 || layers_.resident) {
        SPARSEKV_ASSIGN_OR_RETURN(const int64_t device_rows, DenseDeviceRows());
        result_.peak_dense_device_rows = std::max(result_.peak_dense_device_rows, device_rows);
        dense_host_rows = DenseHostRows();
        result_.peak_dense_host_rows = std::max(result_.peak_dense_host_rows, dense_host_rows);
      }
      const int64_t host_bytes =
          int64_t{used} * scale_.page_bytes + dense_host_rows * scale_.dense_row_bytes;
      peak_host_bytes = std::max(peak_host_bytes, host_bytes);
      host_byte_sum += static_cast<double>(host_bytes);
    }
    SPARSEKV_ASSIGN_OR_RETURN(const CacheStats stats, m_->ReadStats(nullptr));
    result_.mean_pages = result_.steps > 0 ? page_sum / static_cast<double>(result_.steps) : 0;
    result_.prefix_hit_tokens = stats.prefix_hit_tokens;
    result_.copy_on_write_pages = stats.copy_on_write_pages;
    result_.peak_host_gb = static_cast<double>(peak_host_bytes) / 1e9;
    result_.mean_host_gb =
        result_.steps > 0 ? host_byte_sum / static_cast<double>(result_.steps) / 1e9 : 0;
    return result_;
  }

 private:
  struct Conv {
    std::vector<int32_t> history;
    int32_t turn = 0;
    int64_t wake = 0;
    RequestId main = 0;           // the request decoding this turn; 0 while thinking
    RequestId held = 0;           // the retained (sharing) or retracted (private) previous turn
    int64_t main_dense_rows = 0;  // main's store rows, measured at its admission
    int64_t held_dense_rows = 0;  // held's
  };
  struct Active {
    int32_t conv;
    bool branch;
    int32_t decoded = 0;
  };

  Status Ingest(RequestId id, int32_t prompt_len, int32_t cached) {
    result_.ingested_tokens += prompt_len - cached;
    if (layers_.raw_window == 0 && !layers_.resident) {
      return m_->IngestPromptSuffix(id, 0, zero_rows_.data(), nullptr);
    }
    // Every layer: its entries past the prefix and the prompt's newest raw rows.
    const PromptRows rows{.entries = zero_rows_.data(),
                          .window = layers_.raw_window > 0 ? zero_rows_.data() : nullptr};
    for (int32_t l = 0; l < layers_.geometry.num_layers(); ++l) {
      SPARSEKV_RETURN_IF_ERROR(m_->IngestPromptSuffix(id, l, rows, nullptr));
    }
    return Status::Ok();
  }

  // The store's rows on the device now (resident entries and raw windows, every layer).
  StatusOr<int64_t> DenseDeviceRows() {
    SPARSEKV_ASSIGN_OR_RETURN(const CacheStats stats, m_->ReadStats(nullptr));
    return (stats.device_memory.resident_entries + stats.device_memory.windows) /
           layers_.geometry.layers[0].row_stride;
  }

  // The store's rows the manager holds in host memory for conversations between turns: a
  // retracted request's copy, or a retained conversation's (with resident layers; eviction drops
  // it).
  int64_t DenseHostRows() const {
    int64_t rows = 0;
    for (const Conv& cv : convs_) {
      if (cv.held == 0) continue;
      if (sharing_ && !(layers_.resident && m_->IsRetained(cv.held))) continue;
      rows += cv.held_dense_rows;
    }
    return rows;
  }

  Status StartTurn(int32_t i) {
    Conv& cv = convs_[i];
    const Turn& turn = s_.conversations[i][cv.turn];
    std::vector<int32_t> prompt = cv.turn == 0 ? s_.system : cv.history;
    prompt.insert(prompt.end(), turn.user.begin(), turn.user.end());
    const int32_t len = static_cast<int32_t>(prompt.size());
    const int32_t reply = static_cast<int32_t>(turn.reply.size());
    const RequestId id = next_id_++;
    const bool dense = layers_.raw_window > 0 || layers_.resident;
    int64_t dense_before = 0;
    if (dense) {
      SPARSEKV_ASSIGN_OR_RETURN(dense_before, DenseDeviceRows());
    }
    if (sharing_) {
      SPARSEKV_ASSIGN_OR_RETURN(const int32_t cached,
                                m_->AdmitWithPrefix(id, prompt, reply, nullptr));
      SPARSEKV_RETURN_IF_ERROR(Ingest(id, len, cached));
      // The new turn holds the retained pages it shares; the old conversation entry can go.
      if (cv.held != 0 && m_->IsRetained(cv.held)) SPARSEKV_RETURN_IF_ERROR(m_->Release(cv.held));
    } else {
      if (cv.held != 0) SPARSEKV_RETURN_IF_ERROR(m_->Release(cv.held));
      SPARSEKV_RETURN_IF_ERROR(m_->Admit(id, len, reply, nullptr));
      SPARSEKV_RETURN_IF_ERROR(Ingest(id, len, 0));
    }
    cv.main_dense_rows = 0;
    if (dense) {
      // The store allocates a request's rows at admission; releasing a retained conversation
      // frees host memory only.
      SPARSEKV_ASSIGN_OR_RETURN(const int64_t dense_after, DenseDeviceRows());
      cv.main_dense_rows = dense_after - dense_before;
    }
    cv.held = 0;
    cv.held_dense_rows = 0;
    cv.main = id;
    cv.history = std::move(prompt);
    active_.emplace(id, Active{i, false});
    if (!turn.branch) return Status::Ok();
    for (int32_t b = 0; b < c_.branches; ++b) {
      const RequestId child = next_id_++;
      if (sharing_) {
        SPARSEKV_RETURN_IF_ERROR(m_->Fork(id, child, c_.branch_tokens, nullptr));
      } else {
        SPARSEKV_RETURN_IF_ERROR(m_->Admit(child, len, c_.branch_tokens, nullptr));
        SPARSEKV_RETURN_IF_ERROR(Ingest(child, len, 0));
      }
      active_.emplace(child, Active{i, true});
    }
    return Status::Ok();
  }

  Status Step() {
    std::vector<RequestId> batch;
    std::vector<int32_t> ids;
    for (const auto& [id, a] : active_) {
      batch.push_back(id);
      // A branch decodes other tokens than the main line: its own ids.
      ids.push_back(a.branch ? static_cast<int32_t>((id * 7919 + a.decoded) % 100000)
                             : s_.conversations[a.conv][convs_[a.conv].turn].reply[a.decoded]);
    }
    SPARSEKV_RETURN_IF_ERROR(step_schedule_->PlanStep(batch, ids, nullptr));
    // Every layer in order: the schedule appends each, and resolves the offloaded (CSA) layers'
    // top-k, of padding only (the pool is what counts).
    const LayerWork work{.new_rows = zero_rows_.data(),
                         .topk = topk_.data(),
                         .slots = slots_.data(),
                         .window_rows = layers_.raw_window > 0 ? zero_rows_.data() : nullptr};
    for (int32_t l = 0; l < layers_.geometry.num_layers(); ++l) {
      SPARSEKV_RETURN_IF_ERROR(step_schedule_->RunLayer(
          l, work, [](int32_t, int32_t, int32_t, StreamHandle) { return Status::Ok(); }, nullptr));
    }
    SPARSEKV_RETURN_IF_ERROR(step_schedule_->FinishStep(nullptr));
    for (size_t b = 0; b < batch.size(); ++b) {
      Active& a = active_.at(batch[b]);
      ++a.decoded;
      if (a.branch) {
        if (a.decoded == c_.branch_tokens) {
          SPARSEKV_RETURN_IF_ERROR(m_->Release(batch[b]));
          active_.erase(batch[b]);
        }
        continue;
      }
      Conv& cv = convs_[a.conv];
      const Turn& turn = s_.conversations[a.conv][cv.turn];
      cv.history.push_back(ids[b]);
      if (a.decoded < static_cast<int32_t>(turn.reply.size())) continue;
      // End of the turn: hold the history without device state while the user thinks.
      if (sharing_) {
        SPARSEKV_RETURN_IF_ERROR(m_->Retain(batch[b]).status());
      } else {
        SPARSEKV_RETURN_IF_ERROR(m_->Retract(batch[b]));
      }
      cv.held = batch[b];
      cv.held_dense_rows = cv.main_dense_rows;
      cv.main = 0;
      cv.wake = result_.steps + 1 + turn.think_steps;
      ++cv.turn;
      active_.erase(batch[b]);
    }
    return Status::Ok();
  }

  const MultiTurnConfig& c_;
  const Schedule& s_;
  const SimulatedLayers& layers_;
  const ByteScale scale_;
  const bool sharing_;
  const MultiTurnProgressFn& progress_;
  std::unique_ptr<SparseKVCacheManager> m_;
  std::unique_ptr<StepSchedule> step_schedule_;  // over m_
  std::vector<Conv> convs_;
  std::map<RequestId, Active> active_;
  RequestId next_id_ = 1;
  int64_t turns_started_ = 0;
  std::vector<std::byte> zero_rows_;
  std::vector<int32_t> topk_, slots_;
  MultiTurnModeResult result_;
};

}  // namespace

Status ValidateMultiTurnConfig(const MultiTurnConfig& c) {
  const auto outside = [](int64_t v, int64_t lo, int64_t hi) { return v < lo || v > hi; };
  const auto bad = [](const std::string& option, int64_t lo, int64_t hi, int64_t got) {
    return InvalidArgument(option + " must be in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "] (got " + std::to_string(got) + ")");
  };
  for (const auto& [option, value, lo, hi] : {
           std::tuple{"--conversations", c.conversations, 1, kMultiTurnMaxConversations},
           std::tuple{"--turns", c.turns, 1, kMultiTurnMaxTurns},
           std::tuple{"--system-tokens", c.system_tokens, 0, kMultiTurnMaxTokens},
           std::tuple{"--user-tokens", c.user_tokens, 1, kMultiTurnMaxTokens},
           std::tuple{"--reply-tokens", c.reply_tokens, 1, kMultiTurnMaxTokens},
           std::tuple{"--think-steps", c.think_steps, 0, kMultiTurnMaxTokens},
           std::tuple{"--branches", c.branches, 0, kMultiTurnMaxBranches},
           std::tuple{"--branch-tokens", c.branch_tokens, 1, kMultiTurnMaxTokens},
           std::tuple{"--page-tokens", c.page_tokens, 1, kMultiTurnMaxPageTokens},
       }) {
    if (outside(value, lo, hi)) return bad(option, lo, hi, value);
  }
  if (!(c.branch_probability >= 0 && c.branch_probability <= 1)) {
    return InvalidArgument("--branch-probability must be in [0, 1]");
  }
  // The longest history a conversation can reach (a turn's message and reply are at most 3/2 of
  // their means, plus one), and the memory the simulated pool takes for all of them: checked
  // here so that a run too large fails at once rather than after the schedule is drawn.
  const int64_t longest = int64_t{c.system_tokens} +
                          int64_t{c.turns} * (c.user_tokens * 3 / 2 + c.reply_tokens * 3 / 2 + 2) +
                          c.branch_tokens + c.page_tokens;
  if (longest > kMultiTurnMaxTokens) {
    return InvalidArgument(
        "--system-tokens + --turns * (1.5 * --user-tokens + 1.5 * --reply-tokens) + "
        "--branch-tokens can reach " +
        std::to_string(longest) + " tokens, more than the " + std::to_string(kMultiTurnMaxTokens) +
        " a conversation may hold");
  }
  SPARSEKV_ASSIGN_OR_RETURN(const ModelPreset preset, FindPreset(c.preset, c.row_format));
  const SimulatedLayers layers = SimulateLayers(preset);
  const int64_t requests = int64_t{c.conversations} * (1 + c.branches);
  // A simulated row per offloaded layer and entry.
  const int64_t pool_bytes = requests * (longest / layers.entry_tokens + 1) * layers.offloaded *
                             kMultiTurnSimulatedTokenBytes;
  if (pool_bytes > kMultiTurnMaxPoolBytes) {
    return InvalidArgument(
        "the run would need a simulated pool of " + std::to_string(pool_bytes >> 20) +
        " MiB (--conversations * (1 + --branches) requests of up to " + std::to_string(longest) +
        " tokens), more than " + std::to_string(kMultiTurnMaxPoolBytes >> 20) +
        " MiB: lower --conversations, --branches, --turns or the token counts");
  }
  return Status::Ok();
}

StatusOr<MultiTurnReport> RunMultiTurn(const MultiTurnConfig& config,
                                       const MultiTurnProgressFn& progress) {
  SPARSEKV_RETURN_IF_ERROR(ValidateMultiTurnConfig(config));
  SPARSEKV_ASSIGN_OR_RETURN(const ModelPreset preset, FindPreset(config.preset, config.row_format));
  // Its workload gives every layer kind its rows (entries and windows).
  SPARSEKV_RETURN_IF_ERROR(
      CheckToolsDriveLayers(preset.geometry(), preset.raw_window, ToolLayers::kEveryKind));
  const SimulatedLayers layers = SimulateLayers(preset);
  const KVGeometry model = preset.geometry();
  MultiTurnReport report;
  report.config = config;
  report.token_bytes = model.token_stride_bytes();
  report.entry_tokens = layers.entry_tokens;
  report.page_bytes = report.token_bytes * config.page_tokens;
  report.layer_kinds = HasLayerKinds(preset);
  if (report.layer_kinds) {
    // The store's rows are counted over every layer together: one row size converts them.
    for (const LayerShape& l : model.layers) {
      if (l.row_stride != model.layers[0].row_stride) {
        return Unimplemented("--preset " + config.preset +
                             ": its layers differ in row size, and multi-turn converts the "
                             "store's rows with one");
      }
    }
    report.dense_row_bytes = model.layers[0].row_stride;
  }
  const Schedule schedule = Draw(config);
  for (bool sharing : {true, false}) {
    Replay replay(config, schedule, layers, ByteScale{report.page_bytes, report.dense_row_bytes},
                  sharing, progress);
    SPARSEKV_ASSIGN_OR_RETURN(MultiTurnModeResult r, replay.Run());
    r.peak_dense_device_gb =
        static_cast<double>(r.peak_dense_device_rows) * report.dense_row_bytes / 1e9;
    r.peak_dense_host_gb =
        static_cast<double>(r.peak_dense_host_rows) * report.dense_row_bytes / 1e9;
    r.conversations_per_host_gb = r.peak_host_gb > 0 ? config.conversations / r.peak_host_gb : 0;
    (sharing ? report.sharing : report.private_history) = r;
  }
  return report;
}

std::string FormatMultiTurnJson(const MultiTurnReport& report, const std::string& command) {
  const MultiTurnConfig& c = report.config;
  auto mode = [&](const MultiTurnModeResult& r) {
    return nlohmann::json{{"steps", r.steps},
                          {"peak_pages", r.peak_pages},
                          {"mean_pages", r.mean_pages},
                          {"peak_host_gb", r.peak_host_gb},
                          {"mean_host_gb", r.mean_host_gb},
                          {"ingested_tokens", r.ingested_tokens},
                          {"prefix_hit_tokens", r.prefix_hit_tokens},
                          {"copy_on_write_pages", r.copy_on_write_pages},
                          {"peak_shared_pages", r.peak_shared_pages},
                          {"conversations_per_host_gb", r.conversations_per_host_gb},
                          {"peak_dense_device_rows", r.peak_dense_device_rows},
                          {"peak_dense_host_rows", r.peak_dense_host_rows},
                          {"peak_dense_device_gb", r.peak_dense_device_gb},
                          {"peak_dense_host_gb", r.peak_dense_host_gb}};
  };
  nlohmann::json j;
  j["command"] = command;
  j["backend"] = "cpu (host-pool accounting; bytes from the preset)";
  j["config"] = {{"preset", c.preset},
                 {"precision", c.row_format == KVRowFormat::kBf16Row1152 ? "bf16" : "fp8"},
                 {"conversations", c.conversations},
                 {"turns", c.turns},
                 {"system_tokens", c.system_tokens},
                 {"user_tokens", c.user_tokens},
                 {"reply_tokens", c.reply_tokens},
                 {"think_steps", c.think_steps},
                 {"branch_probability", c.branch_probability},
                 {"branches", c.branches},
                 {"branch_tokens", c.branch_tokens},
                 {"page_tokens", c.page_tokens},
                 {"seed", c.seed}};
  j["token_bytes"] = report.token_bytes;
  j["entry_tokens"] = report.entry_tokens;
  j["page_bytes"] = report.page_bytes;
  j["layer_kinds"] = report.layer_kinds;
  j["dense_row_bytes"] = report.dense_row_bytes;
  j["sharing"] = mode(report.sharing);
  j["private"] = mode(report.private_history);
  j["summary"] = {
      {"conversations_per_host_gb_multi_turn", report.sharing.conversations_per_host_gb},
      {"conversations_per_host_gb_private", report.private_history.conversations_per_host_gb}};
  return j.dump(2) + "\n";
}

MultiTurnCommand::MultiTurnCommand(CLI::App& parent) {
  app_ = parent.add_subcommand(
      "multi-turn",
      "Host-pool capacity on multi-turn traffic: conversations held per GB with prefix sharing "
      "and retained conversations vs a private history per request (CPU, preset bytes).");
  MultiTurnConfig& c = config_;
  app_->add_option("--preset", c.preset, "model preset (KV bytes per token)")
      ->check(ManagerPreset())
      ->capture_default_str();
  app_->add_option("--precision", precision_, "fp8 or bf16")
      ->check(CLI::IsMember({"fp8", "bf16"}))
      ->capture_default_str();
  app_->add_option("--conversations", c.conversations, "conversations sharing the system prompt")
      ->check(Between<int64_t>(1, kMultiTurnMaxConversations))
      ->capture_default_str();
  app_->add_option("--turns", c.turns, "turns per conversation")
      ->check(Between<int64_t>(1, kMultiTurnMaxTurns))
      ->capture_default_str();
  app_->add_option("--system-tokens", c.system_tokens, "system prompt shared by all")
      ->check(Between<int64_t>(0, kMultiTurnMaxTokens))
      ->capture_default_str();
  app_->add_option("--user-tokens", c.user_tokens, "mean new prompt tokens per turn")
      ->check(Between<int64_t>(1, kMultiTurnMaxTokens))
      ->capture_default_str();
  app_->add_option("--reply-tokens", c.reply_tokens, "mean decoded tokens per turn")
      ->check(Between<int64_t>(1, kMultiTurnMaxTokens))
      ->capture_default_str();
  app_->add_option("--think-steps", c.think_steps, "mean decode steps between turns")
      ->check(Between<int64_t>(0, kMultiTurnMaxTokens))
      ->capture_default_str();
  app_->add_option("--branch-probability", c.branch_probability,
                   "chance that a turn forks agent branches")
      ->check(Fraction())
      ->capture_default_str();
  app_->add_option("--branches", c.branches, "branches per forking turn")
      ->check(Between<int64_t>(0, kMultiTurnMaxBranches))
      ->capture_default_str();
  app_->add_option("--branch-tokens", c.branch_tokens, "tokens each branch decodes")
      ->check(Between<int64_t>(1, kMultiTurnMaxTokens))
      ->capture_default_str();
  app_->add_option("--page-tokens", c.page_tokens, "host page size")
      ->check(Between<int64_t>(1, kMultiTurnMaxPageTokens))
      ->capture_default_str();
  app_->add_option("--seed", c.seed, "random seed")->check(Unsigned())->capture_default_str();
  app_->add_option("--json", json_path_, "also write the results as JSON to PATH")
      ->option_text("PATH")
      ->check(NonEmpty());
}

bool MultiTurnCommand::selected() const { return app_->parsed(); }

int MultiTurnCommand::Run(const std::string& command, std::ostream& out, std::ostream& err,
                          bool progress_bar) {
  config_.row_format = precision_ == "bf16" ? KVRowFormat::kBf16Row1152 : KVRowFormat::kFp8Row656;
  // fp8 is the preset's fp8 format: DeepSeek-V4's 584-B entries.
  if (const StatusOr<ModelPreset> p = FindPreset(config_.preset);
      precision_ != "bf16" && p.ok() && p->layers[0].format.has_value()) {
    config_.row_format = *p->layers[0].format;
  }
  // Usage errors first, before the run.
  for (const Status& s :
       {CheckOutputPath("--json", json_path_), ValidateMultiTurnConfig(config_)}) {
    if (!s.ok()) {
      err << "sparsekv multi-turn: " << s.message() << "\nRun with --help for more information.\n";
      return kExitUsage;
    }
  }
  StatusOr<MultiTurnReport> report = [&] {
    ProgressBar bar(err, progress_bar, "sparsekv multi-turn");
    return RunMultiTurn(config_, [&](std::string_view phase, int64_t done, int64_t total) {
      bar.Update(phase, done, total);
    });
  }();
  if (!report.ok()) {
    err << "sparsekv multi-turn: " << report.status().ToString() << "\n";
    return kExitFailure;
  }
  auto line = [&](const char* name, const MultiTurnModeResult& r) {
    out << std::left << std::setw(9) << name << std::right << std::fixed << std::setprecision(2)
        << std::setw(12) << r.peak_host_gb << std::setw(12) << r.mean_host_gb << std::setw(14)
        << r.ingested_tokens << std::setw(14) << r.prefix_hit_tokens << std::setw(12)
        << r.conversations_per_host_gb << "\n";
  };
  out << report->config.conversations << " conversations x " << report->config.turns << " turns, "
      << report->config.preset << " (" << report->token_bytes
      << (report->entry_tokens == 1
              ? " B/token"
              : " B per host-pool entry of " + std::to_string(report->entry_tokens) + " tokens")
      << "); host memory in GB (1e9 B)"
      << (report->layer_kinds ? ": the pool and the store copies of conversations between turns"
                              : "")
      << "\n";
  out << std::left << std::setw(9) << "mode" << std::right << std::setw(12) << "peak GB"
      << std::setw(12) << "mean GB" << std::setw(14) << "ingested" << std::setw(14) << "prefix hits"
      << std::setw(12) << "conv/GB"
      << "\n";
  line("sharing", report->sharing);
  line("private", report->private_history);
  if (report->layer_kinds) {
    // DeepSeek-V4's resident entries and raw windows (DenseLayerStore), beside the pool.
    out << "resident entries and raw windows (" << report->dense_row_bytes
        << " B rows, every layer), peak GB\n"
        << std::left << std::setw(9) << "mode" << std::right << std::setw(12) << "device"
        << std::setw(12) << "host"
        << "\n";
    for (const auto& [name, r] :
         {std::pair{"sharing", &report->sharing}, std::pair{"private", &report->private_history}}) {
      out << std::left << std::setw(9) << name << std::right << std::fixed << std::setprecision(2)
          << std::setw(12) << r->peak_dense_device_gb << std::setw(12) << r->peak_dense_host_gb
          << "\n";
    }
  }
  if (!json_path_.empty()) {
    if (Status s = WriteOutputFile(json_path_, FormatMultiTurnJson(*report, command), "JSON");
        !s.ok()) {
      err << "sparsekv multi-turn: " << s.message() << "\n";
      return kExitFailure;
    }
  }
  return kExitOk;
}

}  // namespace sparsekv::tools
