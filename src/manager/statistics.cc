#include "manager/statistics.h"

#include <vector>

#include "sparsekv/index_groups.h"

namespace sparsekv {

Statistics::Statistics(const CacheOptions& options, Backend& backend)
    : options_(options), layers_(options.geometry.num_layers()), memory_(backend) {}

Status Statistics::Allocate() {
  SPARSEKV_ASSIGN_OR_RETURN(counters_, memory_.Allocate<ResolveCounters>(2 * layers_));
  SPARSEKV_ASSIGN_OR_RETURN(invalid_copies_, memory_.Allocate<unsigned long long>(1));
  return Status::Ok();
}

StatusOr<CacheStats> Statistics::Read(StreamHandle stream) const {
  Backend& backend = memory_.backend();
  const int32_t layers = layers_;
  std::vector<ResolveCounters> counters(2 * layers);
  unsigned long long invalid = 0;
  SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));
  SPARSEKV_RETURN_IF_ERROR(
      backend.CopyAsync(counters.data(), counters_, sizeof(ResolveCounters) * 2 * layers, stream));
  SPARSEKV_RETURN_IF_ERROR(backend.CopyAsync(&invalid, invalid_copies_, sizeof(invalid), stream));
  SPARSEKV_RETURN_IF_ERROR(backend.Synchronize(stream));

  const IndexGroups groups(options_);
  CacheStats s;
  static_cast<HostCounters&>(s) = host_;  // bytes_host_to_device gains the copies
  for (int32_t l = 0; l < layers; ++l) {
    // A layer that shares its group's top-k copies what the group's first layer resolved.
    const ResolveCounters& c = counters[groups.Leader(l)];
    LayerStats ls{c.hits,       c.window_hits,  c.misses,       c.padding,
                  c.duplicates, c.out_of_range, c.resident_hits};
    s.layers.push_back(ls);
    s.total.hits += ls.hits;
    s.total.window_hits += ls.window_hits;
    s.total.misses += ls.misses;
    s.total.padding += ls.padding;
    s.total.duplicates += ls.duplicates;
    s.total.out_of_range += ls.out_of_range;
    s.total.resident_hits += ls.resident_hits;
    if (l % options_.layers_per_index == 0) {
      s.prefetch_useful_rows += c.prefetch_useful;
      s.prefetch_wasted_rows += c.prefetch_wasted;
      s.prefetch_missed_rows += c.prefetch_missed;
    }
    s.bytes_host_to_device += ls.misses * options_.geometry.layers[l].row_bytes;
  }
  for (int32_t l = 0; l < layers; ++l) {
    const ResolveCounters& p = counters[layers + groups.Leader(l)];
    if (groups.Leads(l)) {
      s.prefetch_lookups += p.hits + p.window_hits + p.misses + p.resident_hits;
      s.prefetch_rows += p.misses;
      s.prefetch_wasted_rows += p.prefetch_wasted;  // a prefetch took a prefetched row's slot
    }
    s.bytes_host_to_device += p.misses * options_.geometry.layers[l].row_bytes;
  }
  s.invalid_copy_entries = invalid;
  return s;
}

Status Statistics::Reset(StreamHandle stream) {
  Backend& backend = memory_.backend();
  SPARSEKV_RETURN_IF_ERROR(
      backend.MemsetAsync(counters_, 0, sizeof(ResolveCounters) * 2 * layers_, stream));
  SPARSEKV_RETURN_IF_ERROR(
      backend.MemsetAsync(invalid_copies_, 0, sizeof(unsigned long long), stream));
  host_ = {};
  return backend.Synchronize(stream);
}

}  // namespace sparsekv
