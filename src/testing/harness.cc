#include "testing/harness.h"

#include <gtest/gtest.h>

#include <cstring>

namespace sparsekv::testing {

void DenseModel::Add(RequestId id, const std::vector<Bytes>& prompt_layers, int32_t prompt_len) {
  std::vector<Bytes>& layers = history_[id];
  layers.clear();
  for (int32_t l = 0; l < geometry_.num_layers(); ++l) {
    const size_t bytes = static_cast<size_t>(prompt_len) * geometry_.layers[l].row_stride;
    layers.emplace_back(prompt_layers[l].begin(), prompt_layers[l].begin() + bytes);
  }
}

void DenseModel::Append(RequestId id, int32_t layer, const std::byte* row) {
  Bytes& h = history_.at(id)[layer];
  h.insert(h.end(), row, row + geometry_.layers[layer].row_stride);
}

int32_t DenseModel::Length(RequestId id, int32_t layer) const {
  return static_cast<int32_t>(history_.at(id)[layer].size() / geometry_.layers[layer].row_stride);
}

const std::byte* DenseModel::Row(RequestId id, int32_t layer, int32_t position) const {
  return history_.at(id)[layer].data() +
         static_cast<size_t>(position) * geometry_.layers[layer].row_stride;
}

Bytes RandomRows(std::mt19937_64& rng, int64_t rows, int32_t stride) {
  Bytes out(static_cast<size_t>(rows) * stride);
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(out.data() + i, &r, std::min<size_t>(8, out.size() - i));
  }
  return out;
}

DeviceBuffer::DeviceBuffer(Backend& backend, size_t bytes, Where where)
    : backend_(backend), where_(where), bytes_(bytes) {
  StatusOr<void*> p =
      where == Where::kHost ? backend.AllocateHost(bytes) : backend.AllocateDevice(bytes);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (p.ok()) ptr_ = *p;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ == nullptr) return;
  backend_.Synchronize(nullptr).IgnoreError();
  if (where_ == Where::kHost) {
    backend_.FreeHost(ptr_);
  } else {
    backend_.FreeDevice(ptr_);
  }
}

void DeviceBuffer::Sync() const { EXPECT_TRUE(backend_.Synchronize(nullptr).ok()); }

void DeviceBuffer::Upload(const void* src, size_t bytes, StreamHandle stream) {
  EXPECT_TRUE(backend_.CopyAsync(ptr_, src, bytes, stream).ok());
}

Bytes DeviceBuffer::Download(StreamHandle stream) const {
  Bytes out(bytes_);
  EXPECT_TRUE(backend_.CopyAsync(out.data(), ptr_, bytes_, stream).ok());
  EXPECT_TRUE(backend_.Synchronize(stream).ok());
  return out;
}

void DeviceBuffer::Fill(int value, StreamHandle stream) {
  EXPECT_TRUE(backend_.MemsetAsync(ptr_, value, bytes_, stream).ok());
}

namespace {
constexpr int kPoison = 0xA5;
}  // namespace

Bytes KeysOf(const std::byte* rows, int64_t n, LayerShape shape, int32_t key_bytes) {
  Bytes keys(static_cast<size_t>(n) * key_bytes);
  for (int64_t i = 0; i < n; ++i) {
    for (int32_t j = 0; j < key_bytes; ++j) {
      keys[i * key_bytes + j] =
          rows[i * shape.row_stride + j % shape.row_bytes] ^ std::byte(0x5C + 7 * j);
    }
  }
  return keys;
}

int CheckKeys(const DenseModel& model, SparseKVCacheManager& m, const std::vector<RequestId>& batch,
              StreamHandle stream) {
  const CacheOptions& o = m.options();
  Backend& backend = m.backend();
  int mismatches = 0;
  for (int32_t l = 0; l < o.geometry.num_layers(); ++l) {
    const IndexerKeyView v = m.IndexerKeys(l);
    if (!o.geometry.layers[l].indexer_keys) {
      if (v.keys != nullptr && ++mismatches <= 5) {
        ADD_FAILURE() << "layer " << l << " keeps no indexer keys but has a key view";
      }
      continue;
    }
    std::vector<BatchEntry> entries(batch.size());
    EXPECT_TRUE(
        backend.CopyAsync(entries.data(), v.batch, entries.size() * sizeof(BatchEntry), stream)
            .ok());
    EXPECT_TRUE(backend.Synchronize(stream).ok());
    for (size_t b = 0; b < batch.size(); ++b) {
      std::vector<int32_t> pages(static_cast<size_t>(v.pages_per_request));
      EXPECT_TRUE(backend
                      .CopyAsync(pages.data(),
                                 v.page_table + static_cast<int64_t>(entries[b].page_table_row) *
                                                    v.pages_per_request,
                                 pages.size() * sizeof(int32_t), stream)
                      .ok());
      EXPECT_TRUE(backend.Synchronize(stream).ok());
      IndexerKeyView host = v;
      host.page_table = pages.data();
      for (int32_t p = 0; p < entries[b].seq_len; ++p) {
        Bytes key(static_cast<size_t>(v.key_bytes));
        EXPECT_TRUE(backend.CopyAsync(key.data(), host.Key(0, p), key.size(), stream).ok());
        EXPECT_TRUE(backend.Synchronize(stream).ok());
        const Bytes want =
            KeysOf(model.Row(batch[b], l, p), 1, o.geometry.layers[l], o.indexer_key_bytes);
        if (key != want && ++mismatches <= 5) {
          ADD_FAILURE() << "indexer key of request " << batch[b] << " layer " << l << " position "
                        << p << " differs";
        }
      }
    }
  }
  return mismatches;
}

StepDriver::StepDriver(SparseKVCacheManager& manager, StreamHandle stream, RunMode mode)
    : m_(manager), groups_(manager.options()), stream_(stream), mode_(mode), rng_(mode.seed) {
  const CacheOptions& o = manager.options();
  const size_t rows = static_cast<size_t>(o.effective_max_batch()) * groups_.max_top_k();
  for (const LayerShape& l : o.geometry.layers) {
    Backend& b = manager.backend();
    new_rows_.push_back(std::make_unique<DeviceBuffer>(
        b, static_cast<size_t>(o.effective_max_batch()) * l.row_stride));
    topk_.push_back(std::make_unique<DeviceBuffer>(b, rows * sizeof(int32_t)));
    slots_.push_back(std::make_unique<DeviceBuffer>(b, rows * sizeof(int32_t)));
    assembled_.push_back(std::make_unique<DeviceBuffer>(b, rows * l.row_stride));
    fill_.push_back(std::make_unique<DeviceBuffer>(b, rows));
    if (o.indexer_key_bytes > 0) {
      new_keys_.push_back(std::make_unique<DeviceBuffer>(
          b, static_cast<size_t>(o.effective_max_batch()) * o.indexer_key_bytes));
    }
    if (mode.prefetch > 0) {
      prefetch_.push_back(std::make_unique<DeviceBuffer>(
          b, static_cast<size_t>(o.effective_max_batch()) * mode.prefetch * sizeof(int32_t)));
    }
  }
}

void StepDriver::UploadInputs(int32_t batch, const std::vector<Bytes>& new_rows,
                              const std::vector<std::vector<int32_t>>& topk,
                              const std::vector<int32_t>& seq_lens) {
  const CacheOptions& o = m_.options();
  for (size_t l = 0; l < prefetch_.size() && !seq_lens.empty(); ++l) {
    std::vector<int32_t> positions(static_cast<size_t>(o.effective_max_batch()) * mode_.prefetch,
                                   kPaddingPosition);
    for (int32_t b = 0; b < batch; ++b) {
      for (int32_t i = 0; i < mode_.prefetch; ++i) {
        positions[b * mode_.prefetch + i] =
            static_cast<int32_t>(rng_() % (seq_lens[b] + 4)) - 2;  // some out of range
      }
    }
    prefetch_[l]->Upload(positions.data(), positions.size() * sizeof(int32_t), stream_);
  }
  for (int32_t l = 0; l < o.geometry.num_layers(); ++l) {
    const LayerShape shape = o.geometry.layers[l];
    new_rows_[l]->Upload(new_rows[l].data(), static_cast<size_t>(batch) * shape.row_stride,
                         stream_);
    if (!new_keys_.empty()) {
      const Bytes keys = KeysOf(new_rows[l].data(), batch, shape, o.indexer_key_bytes);
      new_keys_[l]->Upload(keys.data(), keys.size(), stream_);
      // The upload reads `keys` before returning (pageable memory).
    }
    topk_[l]->Fill(0xff, stream_);  // rows past the batch: padding
    topk_[l]->Upload(topk[l].data(), topk[l].size() * sizeof(int32_t), stream_);
    slots_[l]->Fill(kPoison, stream_);
    assembled_[l]->Fill(kPoison, stream_);
    fill_[l]->Fill(kPoison, stream_);
  }
}

Status StepDriver::RunPhase() {
  const int32_t layers = m_.options().geometry.num_layers();
  for (int32_t l = 0; l < layers; ++l) {
    SPARSEKV_RETURN_IF_ERROR(m_.AppendToken(
        l, new_rows_[l]->get(), new_keys_.empty() ? nullptr : new_keys_[l]->get(), stream_));
    int32_t* slots = slots_[Leader(l)]->get<int32_t>();
    // A prefetch before the resolve (an engine would issue it during the previous step, after
    // the group's last read): the resolve must find the prefetched rows intact.
    if (mode_.prefetch > 0 && l == Leader(l)) {
      // Every other group in two parts (ResolvePrefetch + CopyPrefetch), as an engine that
      // copies on another stream calls them.
      const int32_t* positions = prefetch_[l]->get<int32_t>();
      if (groups_.Of(l) % 2 == 0) {
        SPARSEKV_RETURN_IF_ERROR(m_.PrefetchLayer(l, positions, mode_.prefetch, stream_));
      } else {
        SPARSEKV_RETURN_IF_ERROR(m_.ResolvePrefetch(l, positions, mode_.prefetch, stream_));
        SPARSEKV_RETURN_IF_ERROR(m_.CopyPrefetch(l, stream_));
      }
    }
    if (mode_.split) {
      if (l == Leader(l)) {
        SPARSEKV_RETURN_IF_ERROR(m_.ResolveLayer(l, topk_[l]->get<const int32_t>(), slots,
                                                 fill_[l]->get<uint8_t>(), stream_));
      }
      // Before the copy: what an attention over the rows with fill 0 would read.
      SPARSEKV_RETURN_IF_ERROR(m_.AssembleLayer(l, slots, assembled_[l]->get(), stream_));
      if (const int32_t rows = m_.options().copy_chunk_rows; rows > 0) {
        // By chunks, the last first (any order will do).
        for (int32_t c = (m_.batch_size() + rows - 1) / rows - 1; c >= 0; --c) {
          SPARSEKV_RETURN_IF_ERROR(m_.CopyMissChunk(l, c, stream_));
        }
      } else {
        SPARSEKV_RETURN_IF_ERROR(m_.CopyMisses(l, stream_));
      }
    } else if (l == Leader(l)) {
      SPARSEKV_RETURN_IF_ERROR(
          m_.RunLayer(l, topk_[l]->get<const int32_t>(), slots, assembled_[l]->get(), stream_));
    } else {
      SPARSEKV_RETURN_IF_ERROR(m_.CopyMisses(l, stream_));
      SPARSEKV_RETURN_IF_ERROR(m_.AssembleLayer(l, slots, assembled_[l]->get(), stream_));
    }
  }
  return m_.FinishStep(stream_);
}

std::vector<LayerResult> StepDriver::DownloadOutputs(int32_t batch) {
  const CacheOptions& o = m_.options();
  std::vector<LayerResult> out;
  const int64_t hot_rows = m_.HotLayerRows();
  for (int32_t l = 0; l < o.geometry.num_layers(); ++l) {
    const int32_t stride = o.geometry.layers[l].row_stride;
    LayerResult r;
    Bytes slots = slots_[Leader(l)]->Download(stream_);
    if (mode_.split) {
      const Bytes fill = fill_[Leader(l)]->Download(stream_);
      r.fill.assign(reinterpret_cast<const uint8_t*>(fill.data()),
                    reinterpret_cast<const uint8_t*>(fill.data()) + fill.size());
    }
    r.slots.resize(slots.size() / sizeof(int32_t));
    std::memcpy(r.slots.data(), slots.data(), slots.size());
    r.assembled = assembled_[l]->Download(stream_);
    Bytes hot(static_cast<size_t>(hot_rows) * stride);
    EXPECT_TRUE(m_.backend().CopyAsync(hot.data(), m_.HotLayer(l), hot.size(), stream_).ok());
    EXPECT_TRUE(m_.backend().Synchronize(stream_).ok());
    const int32_t top_k = groups_.LayerTopK(l);
    r.gathered.assign(static_cast<size_t>(batch) * top_k * stride, std::byte{0});
    for (int64_t i = 0; i < int64_t{batch} * top_k; ++i) {
      const int32_t s = r.slots[i];
      if (s >= 0 && s < hot_rows) {
        std::memcpy(r.gathered.data() + i * stride, hot.data() + int64_t{s} * stride, stride);
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<LayerResult> StepDriver::Step(const std::vector<RequestId>& batch,
                                          const std::vector<Bytes>& new_rows,
                                          const std::vector<std::vector<int32_t>>& topk,
                                          const std::vector<int32_t>& token_ids) {
  // No ids: the step is planned without them (an empty list would not match the batch).
  Status s =
      token_ids.empty() ? m_.PlanStep(batch, stream_) : m_.PlanStep(batch, token_ids, stream_);
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::vector<int32_t> seq_lens;
  for (RequestId id : batch) seq_lens.push_back(*m_.SequenceLength(id) + 1);
  UploadInputs(static_cast<int32_t>(batch.size()), new_rows, topk, seq_lens);
  s = RunPhase();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return DownloadOutputs(static_cast<int32_t>(batch.size()));
}

bool SameRows(const LayerResult& a, const LayerResult& b, size_t rows, LayerShape shape) {
  if (!std::equal(a.slots.begin(), a.slots.begin() + rows, b.slots.begin())) return false;
  if (a.fill.size() != b.fill.size() ||
      !std::equal(a.fill.begin(), a.fill.begin() + std::min(rows, a.fill.size()), b.fill.begin())) {
    return false;
  }
  for (size_t i = 0; i < rows; ++i) {
    const size_t at = i * shape.row_stride;
    const bool assembled_meaningful = a.fill.empty() || a.fill[i] == 0;
    if (std::memcmp(a.gathered.data() + at, b.gathered.data() + at, shape.row_bytes) != 0 ||
        (assembled_meaningful &&
         std::memcmp(a.assembled.data() + at, b.assembled.data() + at, shape.row_bytes) != 0)) {
      return false;
    }
  }
  return true;
}

int CheckLayer(const DenseModel& model, const KVGeometry& geometry, int32_t layer,
               const std::vector<RequestId>& batch, const std::vector<int32_t>& topk,
               const LayerResult& result, int32_t top_k, bool repeats_share) {
  const LayerShape shape = geometry.layers[layer];
  int mismatches = 0;
  const Bytes zero(shape.row_bytes, std::byte{0});
  for (size_t b = 0; b < batch.size(); ++b) {
    const int32_t len = model.Length(batch[b], layer);
    std::vector<bool> seen(len, false);
    for (int32_t k = 0; k < top_k; ++k) {
      const size_t i = b * top_k + k;
      const int32_t p = topk[i];
      const bool valid = p >= 0 && p < len && (repeats_share || !seen[p]);
      if (valid) seen[p] = true;
      const std::byte* assembled = result.assembled.data() + i * shape.row_stride;
      const std::byte* gathered = result.gathered.data() + i * shape.row_stride;
      if (!valid) {
        if (result.slots[i] != kNullSlot ||
            std::memcmp(assembled, zero.data(), shape.row_bytes) != 0) {
          if (++mismatches <= 5) {
            ADD_FAILURE() << "layer " << layer << " row " << b << " k " << k << " position " << p
                          << ": skipped entry got slot " << result.slots[i]
                          << " or a non-zero assembled row";
          }
        }
        continue;
      }
      const std::byte* want = model.Row(batch[b], layer, p);
      const bool check_assembled = result.fill.empty() || result.fill[i] == 0;
      if (result.slots[i] < 0 || std::memcmp(gathered, want, shape.row_bytes) != 0 ||
          (check_assembled && std::memcmp(assembled, want, shape.row_bytes) != 0)) {
        if (++mismatches <= 5) {
          ADD_FAILURE() << "layer " << layer << " row " << b << " (request " << batch[b] << ") k "
                        << k << " position " << p << " of " << len << ": slot " << result.slots[i]
                        << " holds the wrong bytes";
        }
      }
    }
  }
  return mismatches;
}

std::vector<int64_t> ObservableState(SparseKVCacheManager& m, std::span<const RequestId> ids) {
  std::vector<int64_t> v;
  v.push_back(m.batch_size());
  for (RequestId id : ids) {
    const StatusOr<int32_t> len = m.SequenceLength(id);
    v.push_back(len.ok() ? *len : -1);
    const StatusOr<std::vector<int32_t>> pages = m.HostPages(id);
    if (!pages.ok()) continue;
    for (int32_t page : *pages) {
      v.push_back(page);
      v.push_back(m.host_pool().RefCount(page));
    }
  }
  const StatusOr<CacheStats> s = m.ReadStats(nullptr);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return v;
  for (uint64_t counter :
       {s->bytes_host_to_device, s->bytes_device_to_host, s->bytes_assembled, s->bytes_ingested,
        s->copy_on_write_pages, s->evictions, s->evicted_pages, s->demotions, s->promotions,
        s->total.hits, s->total.misses, s->total.window_hits, s->invalid_copy_entries}) {
    v.push_back(static_cast<int64_t>(counter));
  }
  for (int64_t gauge :
       {int64_t{s->host_pages_used}, int64_t{s->hot_blocks_used}, int64_t{s->resident_requests},
        int64_t{s->pages_shared}, s->bytes_saved, s->device_bytes, s->device_memory.resident_rows,
        s->device_memory.hot_cache_rows, s->device_memory.free_rows,
        s->device_memory.resident_entries, s->device_memory.windows, s->host_memory.private_pages,
        s->host_memory.shared_pages, s->host_memory.free_pages}) {
    v.push_back(gauge);
  }
  return v;
}

}  // namespace sparsekv::testing
