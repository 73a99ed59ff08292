#include "sparsekv/kv_footprint.h"

#include <algorithm>
#include <limits>

#include "sparsekv/host_kv_pool.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/options.h"

namespace sparsekv {

std::string_view VariantName(KVVariant variant) {
  switch (variant) {
    case KVVariant::kFullHbm:
      return "full-hbm";
    case KVVariant::kSparseKV:
      return "sparsekv";
    case KVVariant::kNoCache:
      return "no-cache";
    case KVVariant::kPageOffload:
      return "page-offload";
  }
  return "unknown";
}

StatusOr<KVVariant> ParseVariant(std::string_view name) {
  for (KVVariant v :
       {KVVariant::kFullHbm, KVVariant::kSparseKV, KVVariant::kNoCache, KVVariant::kPageOffload}) {
    if (name == VariantName(v)) return v;
  }
  return InvalidArgument("unknown variant '" + std::string(name) +
                         "' (known: full-hbm, sparsekv, no-cache, page-offload)");
}

PageOffloadPages OffloadPages(const RequestShape& s) {
  const int64_t q = std::max(1, s.offload_page_tokens);
  PageOffloadPages p;
  p.pages = static_cast<int32_t>((s.tokens + q - 1) / q);
  p.cached = static_cast<int32_t>(std::max<int64_t>(1, s.hot_slots / q));
  p.staging = std::min(s.top_k, p.pages);
  return p;
}

namespace {

// The replacement state the manager keeps by default (CacheOptions::eviction), whose position
// map is sized by the request's positions.
HotCacheReplacement ManagersReplacement(const RequestShape& s) {
  CacheOptions o;
  o.max_context = static_cast<int32_t>(std::min<int64_t>(s.tokens, INT32_MAX));
  return ReplacementOf(o);
}

}  // namespace

std::vector<LayerClass> LayerClassesOf(const ModelPreset& preset) {
  std::vector<LayerClass> classes;
  for (int32_t i = 0; i < static_cast<int32_t>(preset.layers.size()); ++i) {
    const LayerShape& l = preset.layers[i];
    const bool offloaded = l.kind == LayerKind::kOffloaded;
    LayerClass key;
    key.kind = l.kind;
    key.entry_tokens = l.kind == LayerKind::kWindowOnly ? 1 : l.entry_tokens;
    key.entry_bytes = l.row_stride;
    key.top_k = offloaded ? (l.top_k > 0 ? l.top_k : preset.top_k) : 0;
    auto c = std::find_if(classes.begin(), classes.end(), [&](const LayerClass& other) {
      return other.kind == key.kind && other.entry_tokens == key.entry_tokens &&
             other.entry_bytes == key.entry_bytes && other.top_k == key.top_k;
    });
    if (c == classes.end()) c = classes.insert(classes.end(), key);
    ++c->layers;
    c->keyed_layers += offloaded && l.indexer_keys && preset.indexer_key_bytes > 0;
    c->index_groups += offloaded && (l.index_group == -1 || l.index_group == i);
  }
  return classes;
}

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Footprint for a request with layer classes (the formulas in kv_footprint.h).
RequestFootprint ClassFootprint(KVVariant variant, const RequestShape& s) {
  const int64_t index = sizeof(int32_t);
  int64_t entries_bytes = 0, keys = 0, ring = 0, hot = 0, resident = 0, host = 0;
  int64_t offloaded_entries = 0;
  int32_t top_k = 0;
  for (const LayerClass& c : s.classes) {
    const int64_t layers = c.layers, stride = c.entry_bytes;
    const int64_t entries = c.kind == LayerKind::kWindowOnly ? 0 : s.tokens / c.entry_tokens;
    entries_bytes += layers * entries * stride;
    keys += int64_t{c.keyed_layers} * entries * s.indexer_key_bytes;
    ring += int64_t{s.raw_window} * layers * stride;
    if (c.kind == LayerKind::kOffloaded) {
      // The replacement state the manager's hot cache keeps, per index group, its position map
      // (the clock's) in entries.
      RequestShape in_entries = s;
      in_entries.tokens = entries;
      hot += layers * (int64_t{s.hot_slots} + s.window) * stride +
             HotCache::StateBytes(KVGeometry::Uniform(c.index_groups, c.entry_bytes), s.hot_slots,
                                  1, ManagersReplacement(in_entries));
      host += CeilDiv(entries, s.page_tokens) *
              HostKVPool::PageBytes(KVGeometry::Uniform(c.layers, c.entry_bytes), s.page_tokens);
      offloaded_entries = std::max(offloaded_entries, entries);
      top_k = std::max(top_k, c.top_k);
    } else if (c.kind == LayerKind::kResident) {
      const int64_t pages = CeilDiv(entries, s.resident_page_rows);
      resident += layers * (pages * s.resident_page_rows * stride + pages * index);
    }
  }
  RequestFootprint f;
  if (variant == KVVariant::kFullHbm) {
    f.hbm_bytes = entries_bytes + keys + ring + int64_t{top_k} * index;
  } else if (variant == KVVariant::kSparseKV) {
    f.hbm_bytes = hot + resident + ring + keys + CeilDiv(offloaded_entries, s.page_tokens) * index +
                  int64_t{top_k} * (index * 5 + 1);
    f.host_bytes = host;
  }
  return f;
}

}  // namespace

namespace {

// Without classes: the layers with indexer keys, the hot cache's replacement states, and the
// bytes of one request's hot-cache block (its rows and those states).
int64_t KeyedLayers(const RequestShape& s) {
  return s.keyed_layers < 0 ? s.layers : s.keyed_layers;
}
int32_t GroupCount(const RequestShape& s) { return s.index_groups > 0 ? s.index_groups : s.layers; }
int64_t HotBlockBytes(const RequestShape& s) {
  return int64_t{s.layers} * s.row_bytes * (int64_t{s.hot_slots} + s.window) +
         HotCache::StateBytesOf(GroupCount(s), s.hot_slots, ManagersReplacement(s));
}

}  // namespace

RequestFootprint Footprint(KVVariant variant, const RequestShape& s) {
  if (!s.classes.empty()) return ClassFootprint(variant, s);
  const int64_t layers = s.layers;
  const int64_t index = sizeof(int32_t);
  const int64_t indexer = s.tokens * KeyedLayers(s) * s.indexer_key_bytes;
  RequestFootprint f;
  switch (variant) {
    case KVVariant::kFullHbm:
      f.hbm_bytes = s.tokens * layers * s.row_bytes + indexer + s.top_k * index;
      break;
    case KVVariant::kSparseKV: {
      const int64_t pages = (s.tokens + s.page_tokens - 1) / s.page_tokens;
      f.hbm_bytes = HotBlockBytes(s) + indexer + pages * index + int64_t{s.top_k} * (index * 5 + 1);
      f.host_bytes =
          pages * HostKVPool::PageBytes(KVGeometry::Uniform(s.layers, s.row_bytes), s.page_tokens);
      break;
    }
    case KVVariant::kNoCache:
      f.hbm_bytes = indexer + int64_t{s.top_k} * (s.row_bytes + 2 * index);
      f.host_bytes = s.tokens * layers * s.row_bytes;
      break;
    case KVVariant::kPageOffload: {
      const PageOffloadPages p = OffloadPages(s);
      const int64_t page_bytes = int64_t{s.offload_page_tokens} * s.row_bytes;
      f.hbm_bytes = layers * ((p.cached + 1) * page_bytes + p.cached * index * 2) +
                    p.staging * (page_bytes + index * 2) + indexer + p.pages * index +
                    int64_t{s.top_k} * index * 9;
      f.host_bytes = p.pages * page_bytes * layers;
      break;
    }
  }
  return f;
}

int32_t MaxBatch(KVVariant variant, const RequestShape& shape, int64_t hbm_budget_bytes,
                 int64_t host_budget_bytes, int32_t cap) {
  const RequestFootprint f = Footprint(variant, shape);
  int64_t batch = f.hbm_bytes > 0 ? hbm_budget_bytes / f.hbm_bytes : 0;
  if (f.host_bytes > 0) batch = std::min(batch, host_budget_bytes / f.host_bytes);
  if (cap > 0) batch = std::min<int64_t>(batch, cap);
  return static_cast<int32_t>(std::clamp<int64_t>(batch, 0, std::numeric_limits<int32_t>::max()));
}

bool DependsOnMissRate(KVVariant variant) {
  return variant == KVVariant::kSparseKV || variant == KVVariant::kPageOffload;
}

std::vector<int32_t> SweepBatches(int32_t max_batch) {
  std::vector<int32_t> out;
  for (int64_t b = 1; b < max_batch; b *= 2) out.push_back(static_cast<int32_t>(b));
  if (max_batch >= 1) out.push_back(max_batch);
  return out;
}

namespace {

// The sweep up to max_batch, with `also` in it if it is within.
std::vector<int32_t> SweepWith(int32_t max_batch, int32_t also) {
  std::vector<int32_t> batches = SweepBatches(max_batch);
  if (also > 0 && also <= max_batch &&
      std::find(batches.begin(), batches.end(), also) == batches.end()) {
    batches.insert(std::upper_bound(batches.begin(), batches.end(), also), also);
  }
  return batches;
}

}  // namespace

VariantPlan PlanVariant(KVVariant variant, RequestShape shape, int64_t hbm_budget_bytes,
                        int64_t host_budget_bytes, int32_t cap, int32_t rates, int32_t steps,
                        int32_t check_steps, int32_t batch, int32_t also) {
  const int64_t context = shape.tokens;
  const int32_t points_per_batch = DependsOnMissRate(variant) ? std::max(rates, 1) : 1;
  // The headroom depends on the number of points, which depends on the batch the budget admits:
  // bound the points with the batch admitted without headroom (more headroom only lowers it).
  const int32_t upper = MaxBatch(variant, shape, hbm_budget_bytes, host_budget_bytes, cap);
  const int64_t points =
      batch > 0 ? points_per_batch : int64_t{points_per_batch} * SweepWith(upper, also).size();
  VariantPlan plan;
  plan.headroom = check_steps + points * steps;
  shape.tokens = context + plan.headroom;
  plan.max_batch = MaxBatch(variant, shape, hbm_budget_bytes, host_budget_bytes, cap);
  plan.footprint = Footprint(variant, shape);
  if (batch > 0) {
    if (batch <= plan.max_batch) plan.batches = {batch};
  } else {
    plan.batches = SweepWith(plan.max_batch, also);
  }
  return plan;
}

BudgetedHotCache PlanBudgetedHotCache(const RequestShape& shape, int64_t hbm_budget_bytes,
                                      int64_t host_budget_bytes, int32_t cap) {
  // The manager's geometry: its groups as the shape counts them (the hot cache's sizing reads
  // only their count and top-k), each of the first index_groups - 1 layers a group, the rest the
  // last one; the keys of every layer, as its key pages hold them.
  KVGeometry geometry = KVGeometry::Uniform(shape.layers, shape.row_bytes);
  const int32_t groups = GroupCount(shape);
  for (int32_t l = 0; groups < shape.layers && l < shape.layers; ++l) {
    geometry.layers[l].index_group = std::min(l, groups - 1);
  }
  BudgetedHotCache out;
  // The manager keeps the blocks and the indexer keys in its own budget.
  out.per_request_bytes = Footprint(KVVariant::kSparseKV, shape).hbm_bytes - HotBlockBytes(shape) -
                          shape.tokens * KeyedLayers(shape) * shape.indexer_key_bytes;
  // The host-capped batch, then smaller ones until the hot cache holds a block per request.
  RequestShape unbounded = shape;
  const int32_t host_batch =
      MaxBatch(KVVariant::kSparseKV, unbounded, std::numeric_limits<int64_t>::max() / 2,
               host_budget_bytes, cap);
  for (int32_t batch = host_batch; batch >= 1; --batch) {
    CacheOptions o;
    o.geometry = geometry;
    o.top_k = shape.top_k;
    o.window = shape.window;
    o.max_requests = batch;
    o.max_context = static_cast<int32_t>(shape.tokens);
    o.hybrid_residency = true;
    o.indexer_key_bytes = shape.indexer_key_bytes;
    o.hot_slots = 0;
    o.device_budget_bytes = hbm_budget_bytes - int64_t{batch} * out.per_request_bytes;
    if (o.device_budget_bytes <= 0) continue;
    const StatusOr<HotCacheShape> chosen = ChooseHotCacheShape(o);
    if (!chosen.ok()) continue;
    out.max_batch = batch;
    out.hot_slots = chosen->hot_slots;
    out.hot_cache_bytes = o.device_budget_bytes;
    return out;
  }
  return out;
}

VariantPlan PlanBudgetedVariant(RequestShape shape, int64_t hbm_budget_bytes,
                                int64_t host_budget_bytes, int32_t cap, int32_t rates,
                                int32_t steps, int32_t check_steps, int32_t batch,
                                BudgetedHotCache* budgeted, int32_t also) {
  const int64_t context = shape.tokens;
  // As PlanVariant: the headroom from the points the batch admitted without it allows.
  const int32_t upper =
      PlanBudgetedHotCache(shape, hbm_budget_bytes, host_budget_bytes, cap).max_batch;
  const int64_t points = int64_t{std::max(rates, 1)} *
                         (batch > 0 ? 1 : static_cast<int64_t>(SweepWith(upper, also).size()));
  VariantPlan plan;
  plan.headroom = check_steps + points * steps;
  shape.tokens = context + plan.headroom;
  const BudgetedHotCache b = PlanBudgetedHotCache(shape, hbm_budget_bytes, host_budget_bytes, cap);
  plan.max_batch = b.max_batch;
  plan.footprint = Footprint(KVVariant::kSparseKV, shape);
  if (b.max_batch > 0) {
    plan.footprint.hbm_bytes = b.per_request_bytes + b.hot_cache_bytes / b.max_batch;
  }
  if (batch > 0) {
    if (batch <= plan.max_batch) plan.batches = {batch};
  } else {
    plan.batches = SweepWith(plan.max_batch, also);
  }
  if (budgeted != nullptr) *budgeted = b;
  return plan;
}

StepTraffic Traffic(KVVariant variant, const RequestShape& s, int32_t batch,
                    double misses_per_step) {
  const double rows = double{1} * batch * s.layers;  // request-layers of a step
  const double row = s.row_bytes;
  const double index = sizeof(int32_t);
  const double k = s.top_k;
  StepTraffic t;
  switch (variant) {
    case KVVariant::kFullHbm:
      t.hbm_bytes = rows * (row + 2 * k * index);
      break;
    case KVVariant::kSparseKV:
      t.pcie_bytes = misses_per_step * row + rows * row;
      t.hbm_bytes =
          misses_per_step * row + rows * (row + 3 * k * index + 4.0 * s.hot_slots * index);
      break;
    case KVVariant::kNoCache:
      t.pcie_bytes = rows * (k + 1) * row;
      t.hbm_bytes = rows * (k * row + 3 * k * index);
      break;
    case KVVariant::kPageOffload: {
      const PageOffloadPages p = OffloadPages(s);
      const double page = row * s.offload_page_tokens;
      t.pcie_bytes = misses_per_step * page + rows * row;
      t.hbm_bytes = misses_per_step * page +
                    rows * (row + 9 * k * index + 4.0 * p.cached * index + 2.0 * p.staging * index);
      break;
    }
  }
  return t;
}

double StepFloorMs(const StepTraffic& traffic, const Ceilings& ceilings, double attention_ms,
                   double proxy_ms) {
  double ms = attention_ms + proxy_ms;
  if (ceilings.pcie_h2d_gbps > 0) ms += traffic.pcie_bytes / (ceilings.pcie_h2d_gbps * 1e6);
  if (ceilings.hbm_gbps > 0) ms += traffic.hbm_bytes / (ceilings.hbm_gbps * 1e6);
  return ms;
}

double StepIdealMs(const StepTraffic& traffic, const Ceilings& ceilings, double attention_ms,
                   double proxy_ms) {
  const double pcie_ms =
      ceilings.pcie_h2d_gbps > 0 ? traffic.pcie_bytes / (ceilings.pcie_h2d_gbps * 1e6) : 0;
  StepTraffic rest = traffic;
  rest.pcie_bytes = 0;
  return std::max(StepFloorMs(rest, ceilings, attention_ms, proxy_ms), pcie_ms);
}

}  // namespace sparsekv
