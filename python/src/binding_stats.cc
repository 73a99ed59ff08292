// sparsekv._core: LayerStats and CacheStats.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "binding_util.h"
#include "sparsekv/manager.h"

namespace sparsekv {
namespace {

py::dict LayerStatsDict(const LayerStats& s) {
  py::dict d;
  d["hits"] = s.hits;
  d["window_hits"] = s.window_hits;
  d["misses"] = s.misses;
  d["padding"] = s.padding;
  d["duplicates"] = s.duplicates;
  d["out_of_range"] = s.out_of_range;
  d["resident_hits"] = s.resident_hits;
  d["hit_rate"] = s.hit_rate();
  return d;
}

// Binds read-only scalar fields of a stats struct and remembers their names, so that to_dict
// lists every field bound, in order.
template <typename S>
struct StatsFields {
  py::class_<S>& cls;
  std::vector<const char*>& names;

  template <typename C, typename T>
  StatsFields& operator()(const char* name, T C::*field, const char* doc) {
    cls.def_readonly(name, field, doc);
    names.push_back(name);
    return *this;
  }
};

// The fields `names` of `self` as a dict.
py::dict FieldsDict(const py::object& self, const std::vector<const char*>& names) {
  py::dict d;
  for (const char* name : names) d[name] = self.attr(name);
  return d;
}

// `cls`.to_dict: its fields `names` (which must outlive the module) as a dict.
template <typename S>
void DefToDict(py::class_<S>& cls, const std::vector<const char*>& names, const char* doc) {
  cls.def(
      "to_dict", [&names](const py::object& self) { return FieldsDict(self, names); }, doc);
}

}  // namespace

void RegisterStats(py::module_& m) {
  py::class_<LayerStats>(m, "LayerStats", "Resolve counters of one layer (or of all layers).")
      .def_readonly("hits", &LayerStats::hits, "Top-k positions found in an LRU slot.")
      .def_readonly("window_hits", &LayerStats::window_hits,
                    "Top-k positions served by the newest-token window.")
      .def_readonly("misses", &LayerStats::misses, "Top-k positions copied from the host pool.")
      .def_readonly("padding", &LayerStats::padding, "-1 entries.")
      .def_readonly("duplicates", &LayerStats::duplicates,
                    "Repeated positions within one top-k row (skipped).")
      .def_readonly("resident_hits", &LayerStats::resident_hits,
                    "Top-k positions of resident requests (hybrid residency).")
      .def_readonly("out_of_range", &LayerStats::out_of_range,
                    "Positions outside [0, seq_len) (skipped).")
      .def_property_readonly("hit_rate", &LayerStats::hit_rate,
                             "(hits + window_hits + resident_hits) / (that + misses); 0 if none.")
      .def("to_dict", &LayerStatsDict, "The counters and hit_rate as a dict.");

  py::class_<DeviceMemoryUse> device(m, "DeviceMemoryUse",
                                     "Now: the device memory a manager holds, by use, in bytes; "
                                     "the parts add up to CacheStats.device_bytes.");
  static std::vector<const char*>& device_names = *new std::vector<const char*>();
  StatsFields<DeviceMemoryUse>{device, device_names}(
      "resident_rows", &DeviceMemoryUse::resident_rows,
      "Pages of resident requests (hybrid residency).")(
      "hot_cache_rows", &DeviceMemoryUse::hot_cache_rows, "Pages of the hot-cache blocks in use.")(
      "indexer_keys", &DeviceMemoryUse::indexer_keys, "Pages of indexer keys.")(
      "free_rows", &DeviceMemoryUse::free_rows, "Pages no one holds.")(
      "replacement_state", &DeviceMemoryUse::replacement_state,
      "Every block's LRU state and page list (fixed).")(
      "tables", &DeviceMemoryUse::tables, "The page, residency and key tables (fixed).")(
      "plan", &DeviceMemoryUse::plan,
      "The plan region, miss, prefetch and residency load lists (fixed).")(
      "counters", &DeviceMemoryUse::counters, "The device statistics counters (fixed).")(
      "resident_entries", &DeviceMemoryUse::resident_entries,
      "Entries of resident layers (LayerKind.RESIDENT) of the requests on the device.")(
      "windows", &DeviceMemoryUse::windows,
      "Raw windows (CacheOptions.raw_window) of every layer of the requests on the device.");
  device.def("sum", &DeviceMemoryUse::sum, "The parts together: CacheStats.device_bytes.");
  DefToDict(device, device_names, "The parts as a dict.");

  py::class_<HostMemoryUse> host(m, "HostMemoryUse",
                                 "Now: the host pool by use, in bytes of pages; the parts add up "
                                 "to total (of the whole pool when it is shared).");
  static std::vector<const char*>& host_names = *new std::vector<const char*>();
  StatsFields<HostMemoryUse>{host, host_names}("total", &HostMemoryUse::total, "The pool's pages.")(
      "private_pages", &HostMemoryUse::private_pages,
      "Pages with one holder that is not a retained conversation.")(
      "shared_pages", &HostMemoryUse::shared_pages,
      "Pages with more than one holder (shared prefixes, forks), not only retained.")(
      "retained_pages", &HostMemoryUse::retained_pages,
      "Pages held only by this manager's retained conversations (evictable).")(
      "free_pages", &HostMemoryUse::free_pages, "Pages no one holds.")(
      "node_pool", &HostMemoryUse::node_pool, "The pool is a node pool (a shared-memory segment).")(
      "retained_entries", &HostMemoryUse::retained_entries,
      "Outside the pool (not in total): bytes of the host copies of retained conversations' "
      "resident-layer entries and raw windows (0 without resident layers).");
  host.def("sum", &HostMemoryUse::sum, "private + shared + retained + free: total.");
  DefToDict(host, host_names, "The parts as a dict.");

  py::class_<CacheStats> stats(m, "CacheStats",
                               "Statistics since creation or the last reset_stats(); fields "
                               "marked 'now' are gauges.");
  stats.def_readonly("layers", &CacheStats::layers, "A LayerStats per layer.")
      .def_readonly("total", &CacheStats::total, "The sum of layers.")
      .def_readonly("device_memory", &CacheStats::device_memory,
                    "Now: device_bytes by use (DeviceMemoryUse).")
      .def_readonly("host_memory", &CacheStats::host_memory,
                    "Now: the host pool by use (HostMemoryUse).");
  static std::vector<const char*>& stats_names = *new std::vector<const char*>();
  StatsFields<CacheStats>{stats, stats_names}(
      "bytes_host_to_device", &CacheStats::bytes_host_to_device,
      "Misses and prefetched rows * row_bytes, plus window rows loaded at ingest and resume.")(
      "bytes_device_to_host", &CacheStats::bytes_device_to_host,
      "Appended tokens * row_bytes (write-back of the newest token).")(
      "bytes_assembled", &CacheStats::bytes_assembled,
      "Assembled rows * row_bytes (device to device).")(
      "bytes_ingested", &CacheStats::bytes_ingested,
      "Prompt rows * row_bytes written into the host pool.")(
      "prefix_lookup_tokens", &CacheStats::prefix_lookup_tokens,
      "Prompt tokens of successful admit_with_prefix calls.")(
      "prefix_hit_tokens", &CacheStats::prefix_hit_tokens,
      "Of those, tokens found in the pool (not ingested).")(
      "copy_on_write_pages", &CacheStats::copy_on_write_pages,
      "Shared, partially filled pages copied before an append.")(
      "evictions", &CacheStats::evictions,
      "Retained conversations evicted (least recently used first) to make room for an "
      "admission.")("evicted_pages", &CacheStats::evicted_pages,
                    "Pages those evictions freed (not those another holder still references).")(
      "invalid_copy_entries", &CacheStats::invalid_copy_entries,
      "Copy entries skipped as out of bounds (0 unless something is wrong).")(
      "host_pages_used", &CacheStats::host_pages_used,
      "Now: host pages in use, of the whole pool.")(
      "host_pages_total", &CacheStats::host_pages_total, "Host pages of the pool.")(
      "hot_blocks_used", &CacheStats::hot_blocks_used, "Now: hot-cache blocks in use.")(
      "device_bytes", &CacheStats::device_bytes,
      "Device memory the manager holds: hot cache, replacement state, page table, plan "
      "buffers.")("pages_shared", &CacheStats::pages_shared,
                  "Now: host pages with more than one holder (whole pool).")(
      "bytes_saved", &CacheStats::bytes_saved,
      "Now: sum over pages of (holders - 1) * page_tokens * token_stride_bytes.")(
      "retained_conversations", &CacheStats::retained_conversations,
      "Now: retained conversations in the pool.")(
      "prefetch_lookups", &CacheStats::prefetch_lookups,
      "Positions prefetch_layer looked up, once per index group.")(
      "prefetch_rows", &CacheStats::prefetch_rows, "Of those, rows fetched (not resident).")(
      "prefetch_useful_rows", &CacheStats::prefetch_useful_rows,
      "Prefetched rows that a resolve hit before their slot was taken (with max_prefetch > 0).")(
      "prefetch_wasted_rows", &CacheStats::prefetch_wasted_rows,
      "Prefetched rows whose slot was taken before any resolve hit them.")(
      "prefetch_missed_rows", &CacheStats::prefetch_missed_rows,
      "Misses of the resolves that followed a prefetch of their index group: rows the prefetch "
      "did not bring.")(
      "demotions", &CacheStats::demotions,
      "Resident requests demoted to hot-cache mode to make room for an admission.")(
      "promotions", &CacheStats::promotions, "Hot-cache requests made resident by promote().")(
      "resident_requests", &CacheStats::resident_requests, "Now: requests resident in HBM.");
  stats.def("prefetch_precision", &CacheStats::prefetch_precision,
            "prefetch_useful_rows / prefetch_rows (0 with no prefetched row).");
  stats.def("prefetch_recall", &CacheStats::prefetch_recall,
            "prefetch_useful_rows / (prefetch_useful_rows + prefetch_missed_rows) (0 when both "
            "are 0).");
  stats.def(
      "to_dict",
      [](const py::object& self) {
        const auto& s = self.cast<const CacheStats&>();
        py::dict d = FieldsDict(self, stats_names);
        py::list layers;
        for (const LayerStats& l : s.layers) layers.append(LayerStatsDict(l));
        d["layers"] = layers;
        d["total"] = LayerStatsDict(s.total);
        d["device_memory"] = FieldsDict(self.attr("device_memory"), device_names);
        d["host_memory"] = FieldsDict(self.attr("host_memory"), host_names);
        return d;
      },
      "Every field as a dict (layers and total as dicts of their counters).");
}

}  // namespace sparsekv
