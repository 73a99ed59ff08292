#include "tools/sparsekv/replay/replay_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "sparsekv/options.h"
#include "tools/sparsekv/common/exit_codes.h"
#include "tools/sparsekv/common/output_file.h"
#include "tools/sparsekv/common/progress.h"
#include "tools/sparsekv/common/validators.h"
#include "tools/sparsekv/replay/crosslayer_prefetch.h"
#include "tools/sparsekv/replay/prefetch_predictors.h"

namespace sparsekv::tools {
namespace {

using Json = nlohmann::json;

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

std::string Format(const char* fmt, auto... args) {
  std::string text(std::snprintf(nullptr, 0, fmt, args...), '\0');
  std::snprintf(text.data(), text.size() + 1, fmt, args...);
  return text;
}

Json ToJson(const TopKGeneratorOptions& g) {
  return {{"top_k", g.top_k},
          {"reuse", g.reuse},
          {"recency", g.recency},
          {"sinks", g.sinks},
          {"early_layers", g.early_layers},
          {"early_layer_reuse", g.early_layer_reuse},
          {"seed", g.seed},
          {"locality", g.locality},
          {"zipf_exponent", g.zipf_exponent},
          {"recency_window", g.recency_window},
          {"cross_layer_overlap", g.cross_layer_overlap}};
}

Json CurveJson(const std::vector<MissCurvePoint>& curve) {
  Json out = Json::array();
  for (const MissCurvePoint& p : curve) {
    out.push_back({{"hot_slots", p.hot_slots}, {"miss_rate", p.miss_rate}});
  }
  return out;
}

// "2048:0.30" -> {2048, 0.30}; nullopt unless the whole text is SLOTS:RATE with SLOTS >= 1 and
// RATE in [0, 1].
std::optional<MissCurvePoint> ParseCurvePoint(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return std::nullopt;
  MissCurvePoint p{};
  const char* end = text.data() + colon;
  const auto [stop, error] = std::from_chars(text.data(), end, p.hot_slots);
  if (error != std::errc() || stop != end || p.hot_slots < 1) return std::nullopt;
  const std::string rate = text.substr(colon + 1);
  char* rate_end = nullptr;
  p.miss_rate = std::strtod(rate.c_str(), &rate_end);
  if (rate.empty() || *rate_end != '\0' || !(p.miss_rate >= 0 && p.miss_rate <= 1)) {
    return std::nullopt;
  }
  return p;
}

// The best policy at hot-cache size `slots`: its hit rate minus lru's when lru was replayed
// (`gain`; lru itself at 0 if none beats it), else the highest hit rate (`vs_lru` false).
struct Gain {
  std::string policy;
  double gain = 0;
  double hit_rate = 0;
  bool vs_lru = true;
};
Gain BestGain(const std::vector<PolicyResult>& results, int32_t slots) {
  const auto lru = std::find_if(results.begin(), results.end(), [&](const PolicyResult& r) {
    return r.hot_slots == slots && r.policy == "lru";
  });
  if (lru == results.end()) {
    Gain best{"", 0, -1, false};
    for (const PolicyResult& r : results) {
      if (r.hot_slots == slots && r.hit_rate > best.hit_rate)
        best = {r.policy, 0, r.hit_rate, false};
    }
    return best;
  }
  Gain best{"lru", 0, lru->hit_rate, true};
  for (const PolicyResult& r : results) {
    if (r.hot_slots == slots && r.hit_rate - lru->hit_rate > best.gain) {
      best = {r.policy, r.hit_rate - lru->hit_rate, r.hit_rate, true};
    }
  }
  return best;
}

Json ToJson(const ReplayResult& r, const Trace& trace) {
  const TraceStats& s = r.stats;
  Json hist = Json::object();
  for (size_t i = 0; i < kReuseDistanceBounds.size(); ++i) {
    hist["<=" + std::to_string(kReuseDistanceBounds[i])] = s.reuse_distance[i];
  }
  hist[">" + std::to_string(kReuseDistanceBounds.back())] = s.reuse_distance.back();
  hist["first_use"] = s.first_uses;
  Json results = Json::array();
  for (const PolicyResult& p : r.results) {
    results.push_back({{"policy", p.policy},
                       {"hot_slots", p.hot_slots},
                       {"hit_rate", p.hit_rate},
                       {"misses", p.misses},
                       {"bytes_moved", p.bytes_moved},
                       {"bytes_per_step", p.bytes_per_step},
                       {"layer_hit_rate", p.layer_hit_rate},
                       {"step_hit_rate", p.step_hit_rate}});
  }
  return {{"layers", trace.layers},
          {"steps", trace.steps},
          {"top_k", trace.top_k},
          {"mean_seq_len", s.mean_seq_len},
          {"layer_reuse", s.layer_reuse},
          {"layer_recency", s.layer_recency},
          {"layer_working_set", s.layer_working_set},
          {"reuse_distance_steps", hist},
          {"fitted_generator", ToJson(s.fitted)},
          {"results", results}};
}

std::string Table(const ReplayResult& r, const Trace& trace, const std::string& title) {
  const TraceStats& s = r.stats;
  const auto [lo, hi] = std::minmax_element(s.layer_reuse.begin(), s.layer_reuse.end());
  double ws = 0;
  for (double w : s.layer_working_set) ws += w / s.layer_working_set.size();
  std::string out = Format("\n%s: %d layers x %d steps, top-k %d, mean seq_len %.0f\n",
                           title.c_str(), trace.layers, trace.steps, trace.top_k, s.mean_seq_len);
  out += Format(
      "  reuse of the previous step's row: %.3f (layers: %.3f .. %.3f); working set "
      "over %s: %.0f positions\n",
      s.fitted.reuse, *lo, *hi, "16 steps", ws);
  uint64_t total = s.first_uses;
  for (uint64_t n : s.reuse_distance) total += n;
  out += "  reuse distance (steps):";
  for (size_t i = 0; i < s.reuse_distance.size(); ++i) {
    const std::string label = i < kReuseDistanceBounds.size()
                                  ? "<=" + std::to_string(kReuseDistanceBounds[i])
                                  : ">" + std::to_string(kReuseDistanceBounds.back());
    out += Format(" %s %.1f%%", label.c_str(),
                  100.0 * s.reuse_distance[i] / std::max<uint64_t>(1, total));
  }
  out += Format(" first %.1f%%\n", 100.0 * s.first_uses / std::max<uint64_t>(1, total));
  const TopKGeneratorOptions& f = s.fitted;
  out += Format(
      "  fitted generator: --reuse %.3f --recency %.3f --sinks %d (early layers reuse "
      "%.3f)\n",
      f.reuse, f.recency, f.sinks, f.early_layer_reuse);
  out += Format("  %9s %-14s %9s %8s %10s %9s %9s\n", "hot slots", "policy", "hit rate", "vs lru",
                "MB/step", "min layer", "max layer");
  for (const PolicyResult& p : r.results) {
    const auto lru = std::find_if(r.results.begin(), r.results.end(), [&](const PolicyResult& q) {
      return q.hot_slots == p.hot_slots && q.policy == "lru";
    });
    const auto [lmin, lmax] = std::minmax_element(p.layer_hit_rate.begin(), p.layer_hit_rate.end());
    const std::string vs_lru = lru != r.results.end() ? Format("%+8.4f", p.hit_rate - lru->hit_rate)
                                                      : Format("%8s", "-");  // lru not replayed
    out += Format("  %9d %-14s %9.4f %s %10.3f %9.4f %9.4f\n", p.hot_slots, p.policy.c_str(),
                  p.hit_rate, vs_lru.c_str(), p.bytes_per_step / 1e6, *lmin, *lmax);
  }
  return out;
}

Json PrefetchJson(const std::vector<PrefetchResult>& runs) {
  Json out = Json::array();
  for (const PrefetchResult& r : runs) {
    out.push_back({{"predictor", r.predictor},
                   {"budget", r.budget},
                   {"hot_slots", r.hot_slots},
                   {"lookups", r.lookups},
                   {"baseline_misses", r.baseline_misses},
                   {"misses", r.misses},
                   {"fetched", r.fetched},
                   {"useful", r.useful},
                   {"precision", r.precision},
                   {"recall", r.recall},
                   {"baseline_miss_rate", r.baseline_miss_rate},
                   {"net_miss_rate", r.net_miss_rate},
                   {"extra_bytes", r.extra_bytes},
                   {"net_bytes", r.net_bytes}});
  }
  return out;
}

Json CrossLayerJson(const std::vector<CrossLayerResult>& runs) {
  Json out = Json::array();
  for (const CrossLayerResult& r : runs) {
    out.push_back({{"policy", r.policy},
                   {"hot_slots", r.hot_slots},
                   {"lookups", r.lookups},
                   {"prefetched", r.prefetched},
                   {"useful", r.useful},
                   {"wasted", r.wasted},
                   {"misses", r.misses},
                   {"baseline_misses", r.baseline_misses},
                   {"covered", r.covered},
                   {"induced_misses", r.induced_misses},
                   {"precision", r.precision},
                   {"recall", r.recall},
                   {"hidden_fraction", r.hidden_fraction},
                   {"bytes", r.bytes},
                   {"baseline_bytes", r.baseline_bytes},
                   {"critical_bytes", r.critical_bytes},
                   {"layer_recall", r.layer_recall}});
  }
  return out;
}

Json ToJson(const PresetReplayShape& s, int32_t context_tokens) {
  return {{"name", s.preset},
          {"model_layers", s.model_layers},
          {"offloaded_layers", s.layers},
          {"row_sources", s.row_sources()},
          {"top_k", s.top_k},
          {"entry_tokens", s.entry_tokens},
          {"row_bytes", s.row_bytes},
          {"context_tokens", context_tokens},
          {"context_entries", s.entries(context_tokens)},
          {"manager_serves", s.manager_serves}};
}

std::string PresetLine(const PresetReplayShape& s, int32_t context_tokens, const Trace& trace) {
  return Format(
      "  preset %s: %d offloaded layers of %d (%d with their own top-k), top-k %d entries of %d "
      "token%s; history %d tokens = %d entries at the first step, + 1 token per step over %d "
      "steps; policies: %s\n",
      s.preset.c_str(), s.layers, s.model_layers, s.row_sources(), s.top_k, s.entry_tokens,
      s.entry_tokens == 1 ? "" : "s", context_tokens, s.entries(context_tokens), trace.steps,
      s.manager_serves ? "lru, slru and clock are the manager's (which serves these layers)"
                       : "the replay's own (the manager does not serve these layers yet)");
}

// The mean history of the steps the hit rates count (steps >= warmup), over all layers.
double MeanCountedHistory(const Trace& trace, int32_t warmup_steps) {
  double sum = 0;
  int64_t n = 0;
  for (int32_t step = warmup_steps; step < trace.steps; ++step) {
    for (int32_t layer = 0; layer < trace.layers; ++layer, ++n) {
      sum += trace.seq_len_at(step, layer);
    }
  }
  return n > 0 ? sum / n : 0;
}

// Uncorrelated rows: whatever a policy keeps, the next row is drawn independently of it, so a
// full cache of C slots and the one-entry window hit (C + 1) / history of it (C + window in all,
// the same memory for the window-split lru).
std::string UncorrelatedLine(const ReplayResult& r, const Trace& trace, int32_t warmup_steps) {
  const double history = MeanCountedHistory(trace, warmup_steps);
  std::string out =
      Format("  uncorrelated rows: expected hit rate (C + 1) / history at the mean history %.0f:",
             history);
  std::vector<int32_t> sizes;
  for (const PolicyResult& p : r.results) {
    if (std::find(sizes.begin(), sizes.end(), p.hot_slots) == sizes.end()) {
      sizes.push_back(p.hot_slots);
    }
  }
  for (int32_t c : sizes) out += Format(" %d: %.4f", c, std::min(1.0, (c + 1) / history));
  return out + "\n";
}

}  // namespace

ReplayCommand::ReplayCommand(CLI::App& parent) {
  app_ = parent.add_subcommand(
      "replay",
      "Replays top-k traces (a file, or the synthetic generator) through hot-cache policies on "
      "the CPU: hit rates per layer and step, bytes moved, working set, reuse distance.");
  app_->add_option("--trace", trace_path_,
                   "trace file (format: docs/planning.md) [default: "
                   "the synthetic generator]")
      ->check(CLI::ExistingFile);
  app_->add_option("--layers", layers_, "synthetic: layers")
      ->check(Between<int64_t>(1, 1000))
      ->capture_default_str();
  app_->add_option("--steps", steps_, "synthetic: decode steps")
      ->check(AtLeast<int32_t>(1))
      ->capture_default_str();
  app_->add_option("--preset", preset_,
                   "synthetic: replay this model preset's offloaded layers (DeepSeek-V4: its CSA "
                   "layers, in entries of 4 tokens) with their top-k; --context is then in tokens "
                   "(docs/workload.md)")
      ->check(CLI::IsMember(PresetNames()));
  app_->add_option("--context", context_,
                   "synthetic: history at the first step (with --preset: in tokens, at most 1M)")
      ->check(AtLeast<int32_t>(1))
      ->capture_default_str();
  app_->add_option("--top-k", generator_.top_k, "synthetic: positions per row")
      ->check(AtLeast<int32_t>(1))
      ->capture_default_str();
  app_->add_option("--reuse", generator_.reuse, "synthetic: share of the previous step's row")
      ->check(Fraction())
      ->capture_default_str();
  app_->add_option("--early-layer-reuse", generator_.early_layer_reuse,
                   "synthetic: the same for the first two layers")
      ->check(Fraction())
      ->capture_default_str();
  app_->add_option("--recency", generator_.recency, "synthetic: share from the newest 10%")
      ->check(Fraction())
      ->capture_default_str();
  app_->add_option("--sinks", generator_.sinks, "synthetic: first positions always selected")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--seed", generator_.seed, "synthetic: random seed")
      ->check(Unsigned())
      ->capture_default_str();
  app_->add_option("--miss-rate", generator_.miss_rate,
                   "synthetic: miss-rate mode with this rate (topk_generator.h; its fresh "
                   "positions are a random permutation, unpredictable by design) [default: off]")
      ->check(Fraction());
  app_->add_option("--fresh-range", generator_.fresh_range,
                   "synthetic, miss-rate mode: fresh positions from [0, N) [default: context - 1]")
      ->check(AtLeast<int32_t>(1));
  app_->add_option("--synthetic-locality", locality_,
                   "synthetic: a locality-mode preset whose lru miss rate falls with the cache "
                   "size (calibrated = glm5-published; docs/workload.md), miss-rate (the "
                   "worst case: --miss-rate, default 0.2), or uncorrelated (every row drawn "
                   "uniformly, no reuse: any cache of C slots hits (C + 1) / history) [default "
                   "with --preset: calibrated]")
      ->check(
          CLI::IsMember({"calibrated", "glm5-published", "smollm2", "miss-rate", "uncorrelated"}));
  app_->add_option("--zipf-exponent", generator_.zipf_exponent,
                   "synthetic, locality mode: popularity exponent")
      ->check(AtLeast(0.0));
  app_->add_option("--recency-window", generator_.recency_window,
                   "synthetic, locality mode: the recent source's newest positions")
      ->check(AtLeast<int32_t>(1));
  app_->add_option("--cross-layer-overlap", cross_layer_overlap_,
                   "synthetic: share of positions adjacent layers share (0: uncorrelated, the "
                   "worst case) [default: the preset's calibrated value; 0 in miss-rate mode]")
      ->check(Fraction());
  app_->add_flag("--layer-overlap", layer_overlap_,
                 "report the adjacent-layer top-k overlap |row(L) ∩ row(L+1)| / top-k");
  app_->add_flag("--fit-locality", fit_locality_,
                 "fit locality mode's reuse and Zipf exponent to the replayed lru curve (or to "
                 "--fit-target)");
  app_->add_option("--fit-target", fit_target_,
                   "fit: target lru curve as SLOTS:MISS_RATE pairs, comma-separated")
      ->delimiter(',')
      ->check(CLI::Validator(
          [](std::string& input) -> std::string {
            return ParseCurvePoint(input) ? ""
                                          : "want SLOTS:MISS_RATE, SLOTS a whole number >= 1 and "
                                            "MISS_RATE in [0, 1] (got '" +
                                                input + "')";
          },
          "SLOTS:MISS_RATE"));
  app_->add_option("--fit-context", fit_context_,
                   "fit: the candidates' context [default: --context, or the trace's first "
                   "history length]")
      ->check(AtLeast<int32_t>(1));
  app_->add_option("--hot-slots", hot_slots_,
                   "hot-cache sizes (slots per request and layer), comma-separated [default: "
                   "1, 2, 3 and 4 times top-k; with --preset 2 times top-k]")
      ->delimiter(',')
      ->check(AtLeast<int32_t>(1));
  app_->add_option("--policies", policies_, "policies, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"lru", "clock", "lfu-decay", "slru", "aging"}))
      ->capture_default_str();
  app_->add_option("--window-split", window_split_,
                   "also replay lru with this many newest tokens resident, at the same memory "
                   "(0 or 1: off) [default: top-k / 8 when --policies has lru, else off]")
      ->check(AtLeast<int32_t>(0));
  app_->add_option("--decay", options_.decay, "lfu-decay: weight of a use per step of age")
      ->check(Fraction())
      ->capture_default_str();
  app_->add_option("--protected-percent", options_.protected_percent,
                   "slru: the protected part's capacity, % of the hot slots")
      ->check(Between<int64_t>(0, 100))
      ->capture_default_str();
  app_->add_option("--aging-shift", options_.aging_shift,
                   "aging: scores decay by 1 - 2^-N per step")
      ->check(Between<int64_t>(1, 15))
      ->capture_default_str();
  app_->add_option("--warmup", options_.warmup_steps, "first steps not counted")
      ->check(AtLeast<int32_t>(0))
      ->capture_default_str();
  app_->add_option("--row-bytes", options_.row_bytes,
                   "bytes per missed row [default: 656; with --preset its fp8 entry's]")
      ->check(AtLeast<int32_t>(1));
  app_->add_option("--prefetch", prefetch_,
                   "also replay cross-step prefetch with these predictors, comma-separated "
                   "(docs/prefetch.md), on lru")
      ->delimiter(',')
      ->check(CLI::IsMember({"window-exit", "neighbours", "evicted", "dropped", "combined"}));
  app_->add_option("--prefetch-budget", prefetch_budgets_,
                   "prefetch: positions proposed per step, request and layer, comma-separated "
                   "[default: 1, 2, top-k / 16, / 8, / 4, / 2]")
      ->delimiter(',')
      ->check(AtLeast<int32_t>(1));
  app_->add_flag("--crosslayer-prefetch", crosslayer_prefetch_,
                 "also replay cross-layer speculative prefetch: layer L's top-k prefetched into "
                 "layer L + 1's cache before its resolve (docs/prefetch.md), on the manager's "
                 "policies (lru, slru, clock) where --policies has them");
  app_->add_flag("--synthetic-like", synthetic_like_,
                 "also replay the generator with the parameters fitted to the trace");
  app_->add_option("--write-trace", write_trace_path_, "write the replayed trace to PATH")
      ->option_text("PATH")
      ->check(NonEmpty());
  app_->add_option("--json", json_path_, "also write the results as JSON to PATH")
      ->option_text("PATH")
      ->check(NonEmpty());
}

bool ReplayCommand::selected() const { return app_->parsed(); }

Status ReplayCommand::CheckFlagsApply() const {
  auto given = [&](const char* name) { return *name != '\0' && app_->count(name) > 0; };
  // Names of the given flags among `names`, comma-separated.
  auto given_of = [&](std::initializer_list<const char*> names) {
    std::string list;
    for (const char* n : names) {
      if (given(n)) list += (list.empty() ? "" : ", ") + std::string(n);
    }
    return list;
  };
  if (!preset_.empty()) {
    if (!trace_path_.empty()) {
      return InvalidArgument(
          "--preset replays the synthetic generator over the preset's layers, --trace the "
          "trace's own layers: give one of them");
    }
    if (const std::string shape = given_of({"--layers", "--top-k"}); !shape.empty()) {
      return InvalidArgument(shape + ": --preset " + preset_ +
                             " sets them (its offloaded layers and their top-k); leave them out");
    }
  }
  if (locality_ == "uncorrelated") {
    if (const std::string shares = given_of({"--reuse", "--early-layer-reuse", "--recency",
                                             "--sinks", "--miss-rate", "--cross-layer-overlap"});
        !shares.empty()) {
      return InvalidArgument(shares +
                             ": --synthetic-locality uncorrelated draws every row uniformly, "
                             "with no reuse, recency, sinks or shared positions; leave them out");
    }
  }
  if (!trace_path_.empty()) {
    std::string synthetic =
        given_of({"--layers", "--steps", "--context", "--top-k", "--reuse", "--early-layer-reuse",
                  "--miss-rate", "--fresh-range", "--synthetic-locality", "--zipf-exponent",
                  "--cross-layer-overlap"});
    // The fit reads these (and the fitted generator the seed) on a trace too.
    if (!fit_locality_) {
      const std::string fit = given_of({"--recency", "--recency-window", "--sinks"});
      if (!fit.empty()) synthetic += (synthetic.empty() ? "" : ", ") + fit;
    }
    if (!fit_locality_ && !synthetic_like_ && given("--seed")) {
      synthetic += (synthetic.empty() ? "" : ", ") + std::string("--seed");
    }
    if (!synthetic.empty()) {
      return InvalidArgument(synthetic +
                             ": the synthetic generator's, which --trace replaces (the trace's "
                             "own layers, steps and rows are replayed); leave them out");
    }
  }
  const bool locality_preset =
      !locality_.empty() && locality_ != "miss-rate" && locality_ != "uncorrelated";
  const bool miss_rate_mode = given("--miss-rate") || locality_ == "miss-rate";
  if (given("--miss-rate") && locality_preset) {
    return InvalidArgument("--miss-rate selects miss-rate mode, --synthetic-locality " + locality_ +
                           " locality mode (where the miss rate is an outcome of the cache "
                           "size): give one of them (or --synthetic-locality miss-rate)");
  }
  if (given("--fresh-range") && !miss_rate_mode) {
    return InvalidArgument(
        "--fresh-range applies in miss-rate mode only: add --miss-rate RATE (or "
        "--synthetic-locality miss-rate)");
  }
  // The fit reads --recency-window (its base is locality mode's), not --zipf-exponent (fitted).
  if (const std::string locality =
          given_of({"--zipf-exponent", fit_locality_ ? "" : "--recency-window"});
      !locality.empty() && !locality_preset) {
    return InvalidArgument(locality +
                           ": locality mode's, which is off: add --synthetic-locality "
                           "calibrated (or glm5-published, smollm2)");
  }
  if (const std::string fit = given_of({"--fit-target", "--fit-context"});
      !fit.empty() && !fit_locality_) {
    return InvalidArgument(fit + ": the fit's, which is off: add --fit-locality");
  }
  if (given("--prefetch-budget") && prefetch_.empty()) {
    return InvalidArgument(
        "--prefetch-budget: the prefetch replay's, which is off: add --prefetch");
  }
  auto has_policy = [&](const char* p) {
    return std::find(policies_.begin(), policies_.end(), p) != policies_.end();
  };
  for (const auto& [flag, policy] : {std::pair{"--decay", "lfu-decay"},
                                     {"--protected-percent", "slru"},
                                     {"--aging-shift", "aging"}}) {
    if (given(flag) && !has_policy(policy)) {
      return InvalidArgument(std::string(flag) + " is " + policy +
                             "'s, which --policies leaves out");
    }
  }
  if (crosslayer_prefetch_ && !has_policy("lru") && !has_policy("slru") && !has_policy("clock")) {
    std::string asked;
    for (const std::string& p : policies_) asked += (asked.empty() ? "" : ",") + p;
    return InvalidArgument(
        "--crosslayer-prefetch replays the manager's policies (lru, slru, clock) only: add one "
        "of them to --policies (got " +
        asked + ")");
  }
  return Status::Ok();
}

Status ReplayCommand::CheckPresetApplies(const PresetReplayShape& shape) const {
  if (Status s = CheckPresetContext(shape, context_, "--context"); !s.ok()) return s;
  const int64_t last = static_cast<int64_t>(context_) + steps_ - 1;
  if (last > shape.max_context_tokens) {
    return InvalidArgument("--steps " + std::to_string(steps_) + ": the history would reach " +
                           std::to_string(last) + " tokens, beyond the " +
                           std::to_string(shape.max_context_tokens) + " that " + shape.preset +
                           " replays; lower --context or --steps");
  }
  if (!shape.manager_serves) {
    const std::string manager_paths =
        (prefetch_.empty() ? "" : "--prefetch") +
        std::string(crosslayer_prefetch_ && !prefetch_.empty() ? ", " : "") +
        (crosslayer_prefetch_ ? "--crosslayer-prefetch" : "");
    if (!manager_paths.empty()) {
      return InvalidArgument(
          manager_paths +
          ": replays the manager's prefetch paths, and the manager path does not serve " +
          shape.preset +
          "'s offloaded layers yet (it replays a row per token through a top-k on every layer: "
          "docs/deepseek-v4.md, \"The tools over DeepSeek-V4's layer kinds\"); leave them out");
    }
  }
  return Status::Ok();
}

int ReplayCommand::Run(const std::string& command, std::ostream& out, std::ostream& err,
                       bool progress_bar) {
  const auto fail = [&](const Status& s, int code) {
    err << "sparsekv replay: " << s.message() << "\n";
    return code;
  };
  // Usage errors first: an output path that cannot be written fails before the run.
  for (const auto& [option, path] :
       {std::pair{"--json", &json_path_}, {"--write-trace", &write_trace_path_}}) {
    if (Status s = CheckOutputPath(option, *path); !s.ok()) return fail(s, kExitUsage);
  }
  if (Status s = CheckFlagsApply(); !s.ok()) return fail(s, kExitUsage);
  Trace trace;
  std::optional<PresetReplayShape> shape;  // with --preset
  std::string source = trace_path_;
  if (!trace_path_.empty()) {
    StatusOr<Trace> read = ReadTrace(trace_path_);
    if (!read.ok()) return fail(read.status(), kExitFailure);
    trace = std::move(*read);
  } else {
    if (!preset_.empty()) {
      StatusOr<PresetReplayShape> found = FindPresetReplayShape(preset_);
      if (!found.ok()) return fail(found.status(), kExitUsage);
      shape = std::move(*found);
      if (Status s = CheckPresetApplies(*shape); !s.ok()) return fail(s, kExitUsage);
      generator_.top_k = shape->top_k;
      // The calibrated locality unless a mode is asked for (--miss-rate is miss-rate mode).
      if (locality_.empty() && app_->count("--miss-rate") == 0) locality_ = "calibrated";
    } else if (generator_.top_k > context_) {
      return fail(InvalidArgument("--top-k must be <= --context"), kExitUsage);
    }
    // The history at the first step, in the rows' units (entries with --preset).
    const int32_t first_history = shape ? shape->entries(context_) : context_;
    if (locality_ == "miss-rate") {
      if (generator_.miss_rate < 0) generator_.miss_rate = 0.2;
    } else if (locality_ == "uncorrelated") {
      // The four-source mode with every share 0: each row uniform over the history.
      generator_.reuse = generator_.early_layer_reuse = generator_.recency = 0;
      generator_.sinks = 0;
    } else if (!locality_.empty()) {
      const std::string name = locality_ == "calibrated" ? "glm5-published" : locality_;
      // The preset, then every generator option given explicitly on top of it.
      const TopKGeneratorOptions given = generator_;
      generator_ = *LocalityPreset(name);
      generator_.top_k = given.top_k;
      generator_.seed = given.seed;
      if (app_->count("--reuse") > 0) generator_.reuse = given.reuse;
      if (app_->count("--recency") > 0) generator_.recency = given.recency;
      if (app_->count("--sinks") > 0) generator_.sinks = given.sinks;
      if (app_->count("--zipf-exponent") > 0) generator_.zipf_exponent = given.zipf_exponent;
      if (app_->count("--recency-window") > 0) generator_.recency_window = given.recency_window;
    }
    if (cross_layer_overlap_ >= 0) generator_.cross_layer_overlap = cross_layer_overlap_;
    Json generator = ToJson(generator_);
    if (generator_.miss_rate >= 0) {
      if (generator_.fresh_range == 0) generator_.fresh_range = first_history - 1;
      if (generator_.fresh_range >= first_history ||
          generator_.top_k > generator_.fresh_range + 1) {
        return fail(InvalidArgument(std::string("--fresh-range must be in [top-k - 1, context") +
                                    (shape ? " in entries)" : ")")),
                    kExitUsage);
      }
      generator["miss_rate"] = generator_.miss_rate;
      generator["fresh_range"] = generator_.fresh_range;
    }
    if (locality_ == "uncorrelated") generator["locality_mode"] = "uncorrelated";
    Json metadata = {{"source", "synthetic"}, {"generator", generator}, {"context", context_}};
    if (shape) {
      trace = PresetTrace(*shape, generator_, steps_, context_);
      metadata["preset"] = ToJson(*shape, context_);
      source = "synthetic generator over " + shape->preset + "'s offloaded layers";
    } else {
      trace = SyntheticTrace(generator_, layers_, steps_, context_);
      source = "synthetic generator";
    }
    trace.metadata = metadata.dump();
  }
  if (!write_trace_path_.empty()) {
    if (Status s = WriteTrace(write_trace_path_, trace); !s.ok()) return fail(s, kExitFailure);
  }
  // The fit's target against the trace's top-k, before the replay: a bad one fails at once.
  std::vector<MissCurvePoint> target;
  for (const std::string& text : fit_target_) {
    const MissCurvePoint p = *ParseCurvePoint(text);  // checked when parsed
    if (p.hot_slots < trace.top_k) {
      return fail(InvalidArgument("--fit-target '" + text + "': SLOTS must be >= the top-k (" +
                                  std::to_string(trace.top_k) + ")"),
                  kExitUsage);
    }
    target.push_back(p);
  }
  ReplayOptions options = options_;
  if (shape && app_->count("--row-bytes") == 0) options.row_bytes = shape->row_bytes;
  options.hot_slots = hot_slots_;
  if (options.hot_slots.empty() && shape) {
    options.hot_slots = {2 * trace.top_k};  // as SGLang's V4 HiSparse configuration
  } else if (options.hot_slots.empty()) {
    for (int32_t m = 1; m <= 4; ++m) options.hot_slots.push_back(m * trace.top_k);
  }
  // The window-split lru is lru's variant: by default only beside lru.
  const bool lru = std::find(policies_.begin(), policies_.end(), "lru") != policies_.end();
  options.window_split = window_split_ >= 0 ? window_split_ : (lru ? trace.top_k / 8 : 0);
  options.policies.clear();
  for (const std::string& name : policies_) options.policies.push_back(*ParsePolicy(name));

  ProgressBar bar(err, progress_bar, "sparsekv replay");
  const ReplayProgressFn progress = [&](std::string_view phase, int64_t done, int64_t total) {
    bar.Update(phase, done, total);
  };
  StatusOr<ReplayResult> result = Replay(trace, options, progress);
  if (!result.ok()) return fail(result.status(), kExitUsage);
  out << Table(*result, trace, "Trace: " + source);
  if (shape) out << PresetLine(*shape, context_, trace);
  if (locality_ == "uncorrelated") out << UncorrelatedLine(*result, trace, options.warmup_steps);
  const TraceEntryCounts entries = CountTraceEntries(trace);
  out << Format(
      "  entries: %llu, padding %llu, out of [0, seq_len) %llu, repeated in a row %llu%s\n",
      static_cast<unsigned long long>(entries.entries),
      static_cast<unsigned long long>(entries.padding),
      static_cast<unsigned long long>(entries.out_of_range),
      static_cast<unsigned long long>(entries.duplicates),
      entries.out_of_range + entries.duplicates > 0
          ? " (malformed entries: every policy skips them)"
          : "");

  const int32_t reference_slots = std::find(options.hot_slots.begin(), options.hot_slots.end(),
                                            2 * trace.top_k) != options.hot_slots.end()
                                      ? 2 * trace.top_k
                                      : options.hot_slots.front();
  const Gain gain = BestGain(result->results, reference_slots);
  if (gain.vs_lru) {
    out << Format("  best policy at %d slots: %s, hit rate %+.4f vs lru\n", reference_slots,
                  gain.policy.c_str(), gain.gain);
  } else {
    out << Format("  best policy at %d slots: %s, hit rate %.4f (lru not replayed)\n",
                  reference_slots, gain.policy.c_str(), gain.hit_rate);
  }
  std::vector<MissCurvePoint> curve;
  for (const PolicyResult& p : result->results) {
    if (p.policy == "lru") curve.push_back({p.hot_slots, 1 - p.hit_rate});
  }
  if (!curve.empty()) {
    out << "  lru miss rate vs hot slots:";
    for (const MissCurvePoint& p : curve) {
      out << Format(" %d: %.2f%%", p.hot_slots, 100 * p.miss_rate);
    }
    out << "\n";
  }
  Json json = {
      {"command", command},
      {"source", source},
      {"metadata", trace.metadata},
      {"row_bytes", options.row_bytes},
      {"warmup_steps", options.warmup_steps},
      {"decay", options.decay},
      {"protected_percent", options.protected_percent},
      {"aging_shift", options.aging_shift},
      {"window_split", options.window_split},
      {"trace", ToJson(*result, trace)},
      {"summary",
       {{"replay_best_policy_hit_rate_gain", gain.vs_lru ? Json(gain.gain) : Json(nullptr)},
        {"replay_best_policy", gain.policy},
        {"replay_reference_hot_slots", reference_slots}}}};
  json["lru_miss_curve"] = CurveJson(curve);
  if (shape) json["preset"] = ToJson(*shape, context_);
  if (locality_ == "uncorrelated") {
    json["summary"]["uncorrelated_mean_history"] = MeanCountedHistory(trace, options.warmup_steps);
  }
  json["trace_entries"] = {{"entries", entries.entries},
                           {"padding", entries.padding},
                           {"out_of_range", entries.out_of_range},
                           {"duplicates", entries.duplicates}};
  if (trace_path_.empty() && generator_.locality && locality_ != "smollm2" && !locality_.empty()) {
    for (const MissCurvePoint& p : curve) {
      json["summary"]["calibrated_miss_rate_" + std::to_string(p.hot_slots)] = p.miss_rate;
    }
  }
  if (layer_overlap_) {
    const LayerOverlap overlap = MeasureLayerOverlap(trace);
    out << Format("  adjacent-layer top-k overlap: mean %.3f over %zu pairs", overlap.mean,
                  overlap.pair.size());
    if (!overlap.pair.empty()) {
      const auto [lo, hi] = std::minmax_element(overlap.pair.begin(), overlap.pair.end());
      out << Format(" (pairs: %.3f .. %.3f)", *lo, *hi);
    }
    out << "\n";
    json["layer_overlap"] = {{"pair", overlap.pair}, {"mean", overlap.mean}};
    json["summary"]["crosslayer_overlap"] = overlap.mean;
  }
  if (fit_locality_) {
    if (target.empty()) target = curve;
    if (target.empty()) return fail(InvalidArgument("--fit-locality needs lru"), kExitUsage);
    TopKGeneratorOptions base = *LocalityPreset("glm5-published");
    base.top_k = trace.top_k;
    base.seed = generator_.seed;
    if (app_->count("--recency") > 0) base.recency = generator_.recency;
    if (app_->count("--recency-window") > 0) base.recency_window = generator_.recency_window;
    if (app_->count("--sinks") > 0) base.sinks = generator_.sinks;
    base.cross_layer_overlap = 0;
    LocalityFitOptions fit;
    // The first history in the rows' units: --context, its entries with --preset, or the
    // trace's.
    fit.context = fit_context_ > 0 ? fit_context_ : trace.seq_len_at(0, 0);
    fit.context = std::max(fit.context, trace.top_k);
    fit.steps = std::max(trace.steps, options.warmup_steps + 1);
    fit.warmup_steps = options.warmup_steps;
    const LocalityFit f = FitLocality(target, base, fit);
    out << Format(
        "  fitted locality mode (context %d, %d steps): --reuse %.3f --zipf-exponent %.3f "
        "--recency %.3f --recency-window %d --sinks %d\n   ",
        fit.context, fit.steps, f.options.reuse, f.options.zipf_exponent, f.options.recency,
        f.options.recency_window, f.options.sinks);
    for (size_t i = 0; i < target.size(); ++i) {
      out << Format(" %d: %.2f%% (target %.2f%%)", target[i].hot_slots, 100 * f.curve[i].miss_rate,
                    100 * target[i].miss_rate);
    }
    out << "\n";
    json["locality_fit"] = {{"options", ToJson(f.options)}, {"context", fit.context},
                            {"steps", fit.steps},           {"target", CurveJson(target)},
                            {"curve", CurveJson(f.curve)},  {"squared_error", f.squared_error}};
  }

  if (!prefetch_.empty()) {
    PrefetchOptions prefetch{
        options.hot_slots, {}, prefetch_budgets_, options.warmup_steps, options.row_bytes};
    for (const std::string& name : prefetch_) prefetch.predictors.push_back(*ParsePredictor(name));
    if (prefetch.budgets.empty()) {
      prefetch.budgets = {1, 2};
      for (int32_t d : {16, 8, 4, 2}) {
        if (trace.top_k / d > 2) prefetch.budgets.push_back(trace.top_k / d);
      }
    }
    StatusOr<std::vector<PrefetchResult>> runs = ReplayPrefetch(trace, prefetch, progress);
    if (!runs.ok()) return fail(runs.status(), kExitUsage);
    out << PrefetchTable(*runs, options.row_bytes);
    json["prefetch"] = PrefetchJson(*runs);
    if (const PrefetchResult* best = BestPrefetch(*runs, reference_slots); best != nullptr) {
      out << Format("  best prefetch at %d slots: %s, budget %d: miss rate %.4f -> %.4f\n",
                    reference_slots, best->predictor.c_str(), best->budget,
                    best->baseline_miss_rate, best->net_miss_rate);
      json["summary"]["prefetch_precision"] = best->precision;
      json["summary"]["prefetch_recall"] = best->recall;
      json["summary"]["prefetch_best_predictor"] = best->predictor;
      json["summary"]["prefetch_best_budget"] = best->budget;
      json["summary"]["prefetch_baseline_miss_rate"] = best->baseline_miss_rate;
      json["summary"]["prefetch_net_miss_rate"] = best->net_miss_rate;
    }
  }
  if (crosslayer_prefetch_) {
    CrossLayerOptions crosslayer{
        options.hot_slots, {}, options.protected_percent, options.warmup_steps, options.row_bytes};
    for (PolicyKind kind : options.policies) {
      if (kind == PolicyKind::kLru || kind == PolicyKind::kSlru || kind == PolicyKind::kClock) {
        crosslayer.policies.push_back(kind);
      }
    }
    StatusOr<std::vector<CrossLayerResult>> runs =
        ReplayCrossLayerPrefetch(trace, crosslayer, progress);
    if (!runs.ok()) return fail(runs.status(), kExitUsage);
    out << CrossLayerTable(*runs);
    json["crosslayer_prefetch"] = CrossLayerJson(*runs);
    const auto reference = std::find_if(runs->begin(), runs->end(), [&](const CrossLayerResult& r) {
      return r.hot_slots == reference_slots && r.policy == PolicyName(crosslayer.policies[0]);
    });
    if (reference != runs->end()) {
      const CrossLayerResult& r = *reference;
      out << Format(
          "  cross-layer prefetch at %d slots (%s): precision %.4f, recall %.4f, hidden %.4f\n",
          reference_slots, r.policy.c_str(), r.precision, r.recall, r.hidden_fraction);
      Json& summary = json["summary"];
      summary["crosslayer_prefetch_policy"] = r.policy;
      summary["crosslayer_prefetch_hot_slots"] = r.hot_slots;
      summary["crosslayer_prefetch_precision"] = r.precision;
      summary["crosslayer_prefetch_recall"] = r.recall;
      summary["crosslayer_prefetch_hidden_fraction"] = r.hidden_fraction;
      summary["crosslayer_prefetch_induced_misses"] = r.induced_misses;
      summary["crosslayer_prefetch_bytes_vs_baseline"] = Ratio(r.bytes, r.baseline_bytes);
      summary["crosslayer_prefetch_critical_bytes_vs_baseline"] =
          Ratio(r.critical_bytes, r.baseline_bytes);
    }
  }
  if (synthetic_like_) {
    TopKGeneratorOptions fitted = result->stats.fitted;
    fitted.seed = generator_.seed;
    const int32_t first = trace.seq_len_at(0, 0);
    const Trace synthetic =
        SyntheticTrace(fitted, trace.layers, trace.steps, std::max(first, fitted.top_k));
    StatusOr<ReplayResult> like = Replay(synthetic, options, progress);
    if (!like.ok()) return fail(like.status(), kExitUsage);
    out << Table(*like, synthetic, "Synthetic generator with the fitted parameters");
    json["synthetic_like"] = ToJson(*like, synthetic);
  }
  if (!json_path_.empty()) {
    if (Status s = WriteOutputFile(json_path_, json.dump(2) + "\n", "JSON"); !s.ok()) {
      return fail(s, kExitFailure);
    }
  }
  return kExitOk;
}

}  // namespace sparsekv::tools
