// The model presets of FindPreset (options.h); docs/workload-shapes.md has each figure's source.
#include <algorithm>
#include <string>
#include <vector>

#include "sparsekv/options.h"

namespace sparsekv {

int32_t ModelPreset::layers_of(LayerKind kind, bool keyed) const {
  int32_t n = 0;
  for (const LayerShape& l : layers) n += l.kind == kind && (!keyed || l.indexer_keys);
  return n;
}

namespace {

// One layer of `format` that gains an entry every `entry_tokens` tokens.
LayerShape Layer(KVRowFormat format, LayerKind kind, int32_t entry_tokens, int32_t top_k,
                 int32_t index_group, bool indexer_keys) {
  LayerShape l;
  l.row_bytes = l.row_stride = KVRowBytes(format);
  l.kind = kind;
  l.entry_tokens = entry_tokens;
  l.top_k = top_k;
  l.format = format;
  l.index_group = index_group;
  l.indexer_keys = indexer_keys;
  return l;
}

// A DSA model (DeepSeek-V3.2, GLM-5): every layer sparse, a row per token, the options' top-k
// and groups, keys in every layer.
ModelPreset DsaPreset(const std::string& name, int32_t layers, KVRowFormat format,
                      double weights_per_gpu_gb) {
  ModelPreset p;
  p.name = name;
  p.num_layers = layers;
  p.row_bytes = KVRowBytes(format);
  p.indexer_key_bytes = 132;
  p.top_k = 2048;
  p.layers.assign(layers, Layer(format, LayerKind::kOffloaded, 1, 0, -1, true));
  p.weights_per_gpu_gb = weights_per_gpu_gb;
  return p;
}

// DeepSeek-V4 from its config.json's compress_ratios (one per attention layer, the MTP layer's
// last): 4 = a CSA layer (offloaded, one entry per 4 tokens, its own top-k and indexer keys), 128
// = an HCA layer (resident, one entry per 128 tokens, read whole), 0 = window-only. Every layer
// attends the newest 128 tokens (`sliding_window`), and an entry is 584 B in fp8 or 368 B in
// MXFP4 (docs/workload-shapes.md, "DeepSeek-V4: three kinds of layer", has the sources).
ModelPreset V4Preset(const std::string& name, const std::vector<int32_t>& compress_ratios,
                     int32_t top_k, KVRowFormat format, double weights_per_gpu_gb) {
  ModelPreset p;
  p.name = name;
  p.num_layers = static_cast<int32_t>(compress_ratios.size());
  p.row_bytes = KVRowBytes(format);
  p.indexer_key_bytes = 132;  // index_head_dim 128 in fp8 + an fp32 scale
  p.top_k = top_k;            // index_topk
  p.raw_window = 128;         // sliding_window
  p.weights_per_gpu_gb = weights_per_gpu_gb;
  for (int32_t i = 0; i < p.num_layers; ++i) {
    const int32_t r = compress_ratios[i];
    p.layers.push_back(r == 4     ? Layer(format, LayerKind::kOffloaded, 4, top_k, i, true)
                       : r == 128 ? Layer(format, LayerKind::kResident, 128, 0, -1, false)
                                  : Layer(format, LayerKind::kWindowOnly, 1, 0, -1, false));
  }
  return p;
}

// `head`, then `pair` `times` times, then `tail`.
std::vector<int32_t> Ratios(std::vector<int32_t> head, std::vector<int32_t> pair, int times,
                            const std::vector<int32_t>& tail) {
  for (int i = 0; i < times; ++i) head.insert(head.end(), pair.begin(), pair.end());
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

bool IsDsaFormat(KVRowFormat f) {
  return f == KVRowFormat::kFp8Row656 || f == KVRowFormat::kBf16Row1152;
}

bool IsV4Format(KVRowFormat f) {
  return f == KVRowFormat::kFp8Entry584 || f == KVRowFormat::kMxfp4Entry368;
}

}  // namespace

const std::vector<std::string>& PresetNames() {
  static const std::vector<std::string> names = {"deepseek-v3.2", "glm-5", "deepseek-v4-flash",
                                                 "deepseek-v4-pro", "glm-5.3"};
  return names;
}

StatusOr<ModelPreset> FindPreset(const std::string& name, KVRowFormat format) {
  const bool v4 = name == "deepseek-v4-flash" || name == "deepseek-v4-pro";
  if (std::find(PresetNames().begin(), PresetNames().end(), name) == PresetNames().end()) {
    std::string known;
    for (const std::string& n : PresetNames()) known += (known.empty() ? "" : ", ") + n;
    return NotFound("unknown model preset '" + name + "' (known: " + known + ")");
  }
  if (v4 ? !IsV4Format(format) : !IsDsaFormat(format)) {
    return InvalidArgument(
        "model preset '" + name + "' has no " +
        (IsKVRowFormat(format) ? std::to_string(KVRowBytes(format)) + "-B" : std::string("such")) +
        " rows (its rows: " +
        (v4 ? "584-B fp8 or 368-B MXFP4 entries" : "656-B fp8 or 1152-B bf16") + ")");
  }
  // DeepSeek-V3.2: 671B parameters in fp8 over 8 GPUs (docs/benchmark.md, "The HBM budget").
  if (name == "deepseek-v3.2") return DsaPreset(name, 61, format, 84);
  if (name == "glm-5") return DsaPreset(name, 78, format, 0);
  // compress_ratios [0, 0] + [4, 128] x 20 + [4], MTP 0: 21 CSA, 20 HCA, 3 window-only;
  // index_topk 512; 159.6 GB of weights (fp4 experts, fp8 elsewhere) over 8 GPUs.
  if (name == "deepseek-v4-flash") {
    return V4Preset(name, Ratios({0, 0}, {4, 128}, 20, {4, 0}), 512, format, 19.95);
  }
  // compress_ratios [128, 128] + [4, 128] x 29 + [4], MTP 0: 30 CSA, 31 HCA, 1 window-only;
  // index_topk 1024; 864.7 GB of weights over 8 GPUs.
  if (name == "deepseek-v4-pro") {
    return V4Preset(name, Ratios({128, 128}, {4, 128}, 29, {4, 0}), 1024, format, 108.1);
  }
  // GLM-5.3, assumed to have GLM-5.2's shape (its own config.json was not found): GLM-5's 78
  // layers with IndexShare. Only the layers indexer_types marks "full" (0, 1, 2, then every
  // fourth: 6, 10, ..., 74; 21 of them) have an indexer and keys; each other layer shares the
  // top-k of the newest full layer before it: groups {0}, {1}, {2-5}, {6-9}, ..., {74-77}.
  // 744B parameters in fp8 over 8 GPUs: 93 GB.
  ModelPreset glm = DsaPreset(name, 78, format, 93);
  for (int32_t i = 0; i < glm.num_layers; ++i) {
    glm.layers[i].index_group = i <= 2 ? i : 2 + (i - 2) / 4 * 4;
    glm.layers[i].indexer_keys = glm.layers[i].index_group == i;
  }
  return glm;
}

StatusOr<ModelPreset> FindPreset(const std::string& name) {
  const bool v4 = name == "deepseek-v4-flash" || name == "deepseek-v4-pro";
  return FindPreset(name, v4 ? KVRowFormat::kFp8Entry584 : KVRowFormat::kFp8Row656);
}

}  // namespace sparsekv
