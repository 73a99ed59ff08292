// IndexerKeyPages: where the requests' indexer keys (CacheOptions::indexer_key_bytes) live in
// the device memory the hot cache manages, and the copies that fill them.
//
// A request's keys of positions [i * keys_per_page, (i + 1) * keys_per_page) lie, key_bytes
// apart, from the first slot of its i-th key page (RequestState::key_pages, taken when it is
// placed on the device), in every layer's memory; the key table (DeviceTables) holds those
// first slots for the indexer (IndexerKeyView). Prompt keys come in per layer (Ingest), a fork's
// are copied from its parent (Copy), and each step's newest key is appended with its row
// (AppendCopy). Only keyed layers (LayerShape::indexer_keys: GLM-5.3's groups' first layers) hold
// keys; a key page still spans every layer's memory, so the other layers' part of it lies
// unused.
//
// Not thread-safe; owned by the manager.
#pragma once

#include <cstdint>

#include "manager/device_tables.h"
#include "manager/request_state.h"
#include "sparsekv/backend.h"
#include "sparsekv/hot_cache.h"
#include "sparsekv/kernel_views.h"
#include "sparsekv/options.h"

namespace sparsekv {

class IndexerKeyPages {
 public:
  // `options` must outlive it.
  IndexerKeyPages(const CacheOptions& options, Backend& backend)
      : options_(options), backend_(&backend) {}
  // Once the hot cache and the tables exist (they must outlive it): `keys_per_page` keys of each
  // layer fit a page (HotCacheShape::keys_per_page; 0: the manager keeps no keys).
  void Attach(HotCache& hot, const DeviceTables& tables, int32_t keys_per_page) {
    hot_ = &hot;
    tables_ = &tables;
    keys_per_page_ = keys_per_page;
  }

  bool enabled() const { return keys_per_page_ > 0; }
  // Whether `layer` holds keys: the manager keeps keys and the layer's indexer_keys is set.
  bool Keyed(int32_t layer) const {
    return enabled() && options_.geometry.layers[layer].indexer_keys;
  }
  // The keyed layers: each request ingests their keys before it may join a step.
  int32_t keyed_layers() const {
    int32_t n = 0;
    for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) n += Keyed(l);
    return n;
  }
  // Pages the keys of `tokens` positions take (0 without keys).
  int64_t PagesFor(int64_t tokens) const {
    return keys_per_page_ > 0 ? (tokens + keys_per_page_ - 1) / keys_per_page_ : 0;
  }
  // Where the key of `position` of `r` lies in a layer's device memory, in 4-byte words.
  int32_t Word(const RequestState& r, int32_t position) const {
    const int64_t byte =
        int64_t{r.key_pages[position / keys_per_page_]} * options_.geometry.offloaded_row_stride() +
        int64_t{position % keys_per_page_} * options_.indexer_key_bytes;
    return static_cast<int32_t>(byte / 4);
  }
  // The keys of `layer` for the step whose device batch is `batch_size` / `batch` (empty
  // without keys, for a layer out of range or one without keys).
  IndexerKeyView View(int32_t layer, const int32_t* batch_size, const BatchEntry* batch) const;

  // IngestIndexerKeys: FailedPrecondition without keys (checked before the request is looked
  // up); then, for the live request `id`, InvalidArgument for a bad layer, a layer without keys
  // or null keys, and
  // AlreadyExists for a layer ingested already; else copies `keys` ([prompt, key_bytes], the
  // request's positions [0, seq_len)) into its key pages and marks the layer ingested.
  Status CheckEnabled() const;
  Status Ingest(RequestId id, RequestState& r, int32_t layer, const void* keys,
                StreamHandle stream);
  // Copies the keys of `from`'s positions into `to`'s key pages, in every layer whose keys `from`
  // has, and marks those layers (and only those) ingested for `to`.
  Status Copy(const RequestState& from, RequestState& to, StreamHandle stream);
  // AppendToken's copy of the new keys ([max_batch, key_bytes] at `new_keys`) to the words
  // `append_key` names ([max_batch], PlanStep's), over the batch `to_window` (the copy of the
  // new rows into `shape`'s layer) covers. Keys are addressed in 4-byte words of the layer's
  // memory (Word); row_bytes is the key.
  IndexCopyView AppendCopy(const IndexCopyView& to_window, const LayerShape& shape,
                           const void* new_keys, const int32_t* append_key) const {
    const int32_t key_bytes = options_.indexer_key_bytes;
    IndexCopyView keys = to_window;
    keys.src = static_cast<const std::byte*>(new_keys);
    keys.src_stride = keys.row_bytes = key_bytes;
    keys.dst_index = append_key;
    keys.dst_stride = sizeof(int32_t);
    keys.dst_rows = (hot_->layer_rows() * shape.row_stride - key_bytes) / 4 + 1;
    return keys;
  }

 private:
  const CacheOptions& options_;
  Backend* backend_;
  HotCache* hot_ = nullptr;
  const DeviceTables* tables_ = nullptr;
  int32_t keys_per_page_ = 0;  // 0: no indexer keys
};

}  // namespace sparsekv
