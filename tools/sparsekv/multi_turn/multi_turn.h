// The multi-turn workload: how many conversations one host pool holds with prefix sharing and
// retained conversations, against the same traffic with a private history per request.
//
// Conversations share one system prompt; each turn adds a user message to the history and
// decodes a reply, then the conversation thinks (holds its history, no device state) before the
// next turn. Some turns also fork agent branches that decode for a while and are dropped. The
// same schedule is replayed twice through a SparseKVCacheManager on the CPU backend:
//   sharing: AdmitWithPrefix (the next turn shares the retained history), Fork for branches,
//            Retain between turns;
//   private: Admit + a full ingest per turn and per branch, Retract between turns (each request
//            holds its own copy of its history, as without sharing).
// Host-pool occupancy is counted in pages and converted to bytes with the preset's bytes per
// host-pool row, so the figures hold for the model although the simulation stores tiny rows.
//
// A preset with layer kinds (DeepSeek-V4: offloaded CSA layers of entries of 4 tokens, resident
// HCA layers, window-only layers, a raw window) is simulated with all its layers, their kinds
// and cadences: prompts are ingested with PromptRows (entries and raw windows), steps run every
// layer through the step schedule (a top-k, of padding, on the CSA layers only; the others
// appended with StepRows), and the host pool's rows and pages are entries of the CSA layers. The
// manager's DenseLayerStore holds the resident entries and raw windows: on the device while a
// request decodes, and as a host copy while a conversation is retained (sharing) or retracted
// (private). Those copies are host memory too, so the host figures count them beside the pool.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace sparsekv::tools {

struct MultiTurnConfig {
  std::string preset = "deepseek-v3.2";  // KV bytes per token come from the preset
  KVRowFormat row_format = KVRowFormat::kFp8Row656;
  int32_t conversations = 64;
  int32_t turns = 6;                 // turns per conversation
  int32_t system_tokens = 2048;      // one system prompt, the same for every conversation
  int32_t user_tokens = 256;         // new prompt tokens per turn: uniform in [1/2, 3/2] of this
  int32_t reply_tokens = 192;        // decoded tokens per turn: uniform in [1/2, 3/2] of this
  int32_t think_steps = 128;         // mean decode steps between a reply and the next turn
  double branch_probability = 0.25;  // chance that a turn forks agent branches
  int32_t branches = 2;              // branches per forking turn
  int32_t branch_tokens = 128;       // tokens a branch decodes before it is dropped
  int32_t page_tokens = 64;          // host_page_tokens
  uint64_t seed = 1;
};

// One replay of the schedule. Pages are host-pool pages in use (live requests, retained
// conversations, copy-on-write spares), sampled after every decode step.
// Dense rows are the DenseLayerStore's (resident entries and raw-window rows, every layer
// together; 0 for a preset without layer kinds).
struct MultiTurnModeResult {
  int64_t steps = 0;
  int32_t peak_pages = 0;
  double mean_pages = 0;
  int64_t ingested_tokens = 0;  // prompt tokens written into the pool (prefill not shared)
  uint64_t prefix_hit_tokens = 0;
  uint64_t copy_on_write_pages = 0;
  int32_t peak_shared_pages = 0;
  // Peak, over steps, of the store's rows on the device (CacheStats::device_memory
  // resident_entries + windows, in rows).
  int64_t peak_dense_device_rows = 0;
  // Peak, over steps, of the store's rows held in host memory for conversations between turns:
  // the retained (sharing, with resident layers) or retracted (private) requests' copies, each
  // the request's store rows as measured at its admission.
  int64_t peak_dense_host_rows = 0;
  // conversations / peak_host_gb: conversations one GB of host memory holds.
  double conversations_per_host_gb = 0;
  // Peak, over steps, of (pages in use * page_bytes + dense host rows * dense_row_bytes) / 1e9;
  // pages alone without layer kinds.
  double peak_host_gb = 0;
  double mean_host_gb = 0;          // the same bytes' mean over steps
  double peak_dense_device_gb = 0;  // peak_dense_device_rows * dense_row_bytes / 1e9
  double peak_dense_host_gb = 0;    // peak_dense_host_rows * dense_row_bytes / 1e9
};

struct MultiTurnReport {
  MultiTurnConfig config;
  // Bytes of one host-pool row over the offloaded layers (preset): a token's, or with layer
  // kinds an entry's of entry_tokens tokens (KVGeometry::token_stride_bytes).
  int64_t token_bytes = 0;
  int32_t entry_tokens = 1;     // tokens per host-pool row: 1, DeepSeek-V4's 4
  int64_t page_bytes = 0;       // token_bytes * page_tokens
  bool layer_kinds = false;     // the preset has resident or window-only layers or a raw window
  int64_t dense_row_bytes = 0;  // bytes per store row (the preset's row stride), with layer kinds
  MultiTurnModeResult sharing;
  MultiTurnModeResult private_history;
};

// Bounds of the configuration (ValidateMultiTurnConfig). The simulation stores tiny rows
// (kMultiTurnSimulatedTokenBytes per row and simulated layer) and converts pages to the preset's
// bytes; its pool holds every request's longest history and may take at most
// kMultiTurnMaxPoolBytes.
inline constexpr int32_t kMultiTurnMaxConversations = 1'000'000;
inline constexpr int32_t kMultiTurnMaxTurns = 10'000;
inline constexpr int32_t kMultiTurnMaxTokens = 1 << 24;  // per option and per conversation
inline constexpr int32_t kMultiTurnMaxBranches = 64;
inline constexpr int32_t kMultiTurnMaxPageTokens = 4096;
inline constexpr int32_t kMultiTurnSimulatedTokenBytes = 16;
inline constexpr int64_t kMultiTurnMaxPoolBytes = int64_t{8} << 30;

// InvalidArgument naming the option (as spelled on the command line) if `config` is out of
// bounds, or if the pool the run needs would be larger than kMultiTurnMaxPoolBytes; the preset's
// lookup error (FindPreset) for an unknown preset or precision.
Status ValidateMultiTurnConfig(const MultiTurnConfig& config);

// Called with the replay ("sharing" or "private"), the turns started and the turns in all.
using MultiTurnProgressFn =
    std::function<void(std::string_view replay, int64_t done, int64_t total)>;

// Runs both replays. InvalidArgument for a configuration that cannot run
// (ValidateMultiTurnConfig).
StatusOr<MultiTurnReport> RunMultiTurn(const MultiTurnConfig& config,
                                       const MultiTurnProgressFn& progress = nullptr);
// The report as JSON; `summary` holds conversations_per_host_gb_multi_turn and
// conversations_per_host_gb_private (for scripts/merge_summary.py).
std::string FormatMultiTurnJson(const MultiTurnReport& report, const std::string& command);

// The `multi-turn` subcommand.
class MultiTurnCommand {
 public:
  // Adds the subcommand and its options to `parent`, which must outlive this object.
  explicit MultiTurnCommand(CLI::App& parent);
  bool selected() const;
  // Checks the options and the --json path, runs (a progress bar on `err` if `progress_bar`),
  // prints a table on `out`, writes --json. Returns an exit code (cli.h).
  int Run(const std::string& command, std::ostream& out, std::ostream& err, bool progress_bar);

 private:
  CLI::App* app_;
  MultiTurnConfig config_;
  std::string precision_ = "fp8";
  std::string json_path_;
};

}  // namespace sparsekv::tools
