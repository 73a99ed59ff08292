// CacheOptions from JSON: sparsekv's own keys, SGLang's `--hisparse-config` and vLLM's HiSparse
// keys, and back to JSON (docs/config.md has every key, what it maps to and what is refused).
//
// Each reader starts from `base`, sets the fields its keys name and returns the result only if
// it passes ValidateOptions (options.h). A key the reader does not know, a key given twice, a
// value of the wrong type or out of range, and a peer key that sparsekv cannot honour are all
// InvalidArgument, with a message that names the key (and, for an unknown key, lists the accepted
// ones). Nothing is read from the environment or from files: the caller passes the text.
//
// Thread safety: every function is a pure function of its arguments.
#pragma once

#include <string>
#include <string_view>

#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv {

// sparsekv's own JSON: an object whose keys are the field names of CacheOptions, with the
// types of the fields (integers as JSON integers, flags as true/false), and
//   "eviction":      "lru" | "segmented_lru" | "clock"
//   "copy_strategy": "lattice" | "lattice_wide" | "warp_rows" | "bulk"
//   "geometry":      {"num_layers": N, "row_bytes": B, "row_stride": S}  (every layer alike;
//                    row_stride may be left out: row_bytes), or {"layers": [{"row_bytes": B,
//                    "row_stride": S}, ...]} (one entry per layer)
// Fields the text leaves out keep base's values; "geometry" replaces base's whole geometry.
StatusOr<CacheOptions> CacheOptionsFromJson(std::string_view json, const CacheOptions& base);

// Every field of `options`, in the form CacheOptionsFromJson reads: for any options that pass
// ValidateOptions, CacheOptionsFromJson(CacheOptionsToJson(o), CacheOptions{}) returns options
// equal to o field by field. The geometry is written in the uniform form when every layer has
// the same row, else layer by layer. Pretty-printed, fields in the order of options.h.
std::string CacheOptionsToJson(const CacheOptions& options);

// The JSON object SGLang takes as `--hisparse-config` (its parse_hisparse_config: top_k,
// device_buffer_size, host_to_device_ratio, swap_in_block_size, algorithm, backend,
// min_sparse_prompt_len, page_size). device_buffer_size becomes hot_slots and defaults, as in
// SGLang, to 2 * top_k (SGLang's top_k of 2048 when it is left out). host_to_device_ratio sizes the
// host pool as that many times the device's slots, max_requests * (hot_slots + window), in host
// rows (a slot and a row each hold an entry of the offloaded layers' cadence r), in whole host
// pages; left out, SGLang's default ratio of 2 applies if base.host_capacity_tokens is 0 and
// base's pool stands otherwise. Both engines run the model's own top-k, which base carries: a top_k
// that differs from base.top_k is refused. The config does not say the geometry, the batch or the
// context: base must. docs/config.md has what each key becomes, and why selection algorithms other
// than the model's indexer, page-granular selection and a dense path for short prompts are refused.
StatusOr<CacheOptions> CacheOptionsFromSglangHisparseConfig(std::string_view json,
                                                            const CacheOptions& base);

// vLLM's HiSparse keys, in one JSON object: those of `attention_config.hisparse_config`
// (device_buffer_size, eager_host_mirror; top_k and host_to_device_ratio of earlier releases)
// together with the HiSparseConnector's `kv_transfer_config.kv_connector_extra_config`
// (host_pool_gib). device_buffer_size becomes hot_slots and defaults to 2 * base.top_k, as in
// vLLM without speculative decoding. host_pool_gib becomes host_capacity_tokens: the host rows
// (KVGeometry::token_stride_bytes each) it holds, in whole host pages, times the offloaded
// layers' cadence r (so base.geometry must already be the model's);
// without it, host_to_device_ratio sizes the pool as for SGLang; without either, base's stands.
StatusOr<CacheOptions> CacheOptionsFromVllmHisparse(std::string_view json,
                                                    const CacheOptions& base);

}  // namespace sparsekv
