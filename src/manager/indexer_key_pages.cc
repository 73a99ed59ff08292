#include "manager/indexer_key_pages.h"

#include <algorithm>
#include <string>

namespace sparsekv {

using manager_internal::Describe;

IndexerKeyView IndexerKeyPages::View(int32_t layer, const int32_t* batch_size,
                                     const BatchEntry* batch) const {
  if (layer < 0 || layer >= options_.geometry.num_layers() || !Keyed(layer)) return {};
  IndexerKeyView v{};
  v.batch_size = batch_size;
  v.batch = batch;
  v.keys = hot_->layer_data(layer);
  v.row_stride = options_.geometry.layers[layer].row_stride;
  v.page_table = tables_->key_table();
  v.pages_per_request = tables_->key_pages_per_owner();
  v.keys_per_page = keys_per_page_;
  v.key_bytes = options_.indexer_key_bytes;
  return v;
}

Status IndexerKeyPages::CheckEnabled() const {
  if (keys_per_page_ == 0) {
    return FailedPrecondition(
        "IngestIndexerKeys: the manager keeps no indexer keys "
        "(indexer_key_bytes = 0)");
  }
  return Status::Ok();
}

Status IndexerKeyPages::Ingest(RequestId id, RequestState& r, int32_t layer, const void* keys,
                               StreamHandle stream) {
  if (layer < 0 || layer >= options_.geometry.num_layers()) {
    return InvalidArgument("IngestIndexerKeys: layer " + std::to_string(layer) + " out of range");
  }
  if (!Keyed(layer)) {
    return InvalidArgument("IngestIndexerKeys: layer " + std::to_string(layer) +
                           " holds no indexer keys (geometry.layers[" + std::to_string(layer) +
                           "].indexer_keys is false; its group's first layer has them)");
  }
  // A prompt shorter than an entry (entry_tokens > 1) has no keys to give.
  if (keys == nullptr && r.seq_len > 0) return InvalidArgument("IngestIndexerKeys: keys is null");
  if (r.keys_ingested[layer]) {
    return AlreadyExists("IngestIndexerKeys: the keys of layer " + std::to_string(layer) + " of " +
                         Describe(id) + " were already ingested");
  }
  const int64_t stride = options_.geometry.layers[layer].row_stride;
  const int32_t key_bytes = options_.indexer_key_bytes;
  const auto* src = static_cast<const std::byte*>(keys);
  // The prompt's positions: those of a step already appended have their keys.
  const int32_t prompt = r.seq_len;
  for (int32_t first = 0, i = 0; first < prompt; first += keys_per_page_, ++i) {
    const int32_t n = std::min(keys_per_page_, prompt - first);
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(hot_->layer_data(layer) + r.key_pages[i] * stride,
                                                 src + static_cast<int64_t>(first) * key_bytes,
                                                 static_cast<size_t>(n) * key_bytes, stream));
  }
  r.keys_ingested[layer] = true;
  ++r.keys_ingested_layers;
  return Status::Ok();
}

Status IndexerKeyPages::Copy(const RequestState& from, RequestState& to, StreamHandle stream) {
  // Keyed layers are offloaded, of one stride (ValidateOptions).
  const int64_t stride = options_.geometry.offloaded_row_stride();
  const int32_t key_bytes = options_.indexer_key_bytes;
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    // A layer whose keys the parent does not have yet: the child ingests them as the parent
    // would (until then neither may join a step).
    if (!from.keys_ingested[l]) continue;
    std::byte* data = hot_->layer_data(l);
    for (int32_t first = 0, i = 0; first < from.seq_len; first += keys_per_page_, ++i) {
      const int32_t n = std::min(keys_per_page_, from.seq_len - first);
      SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(data + to.key_pages[i] * stride,
                                                   data + from.key_pages[i] * stride,
                                                   static_cast<size_t>(n) * key_bytes, stream));
    }
  }
  to.keys_ingested = from.keys_ingested;
  to.keys_ingested_layers = from.keys_ingested_layers;
  return Status::Ok();
}

}  // namespace sparsekv
