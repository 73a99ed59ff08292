// The lender's side of the peer tier: a region of device memory shared with the other processes
// of the machine, and its descriptor.
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/process_liveness.h"
#include "common/text.h"
#include "peer/peer_layout.h"
#include "sparsekv/peer_tier.h"

namespace sparsekv {
namespace {

constexpr std::string_view kTag = "sparsekv-peer-region/1";

// A generation no other region of the machine is given (0 is never one).
uint64_t NewGeneration() {
  std::random_device random;
  uint64_t g = 0;
  while (g == 0) g = (uint64_t{random()} << 32) ^ random();
  return g;
}

}  // namespace

std::vector<int64_t> peer_layout::LayerOffsets(int32_t rows, std::span<const int32_t> strides) {
  std::vector<int64_t> offsets;
  int64_t offset = kHeaderBytes;
  for (int32_t stride : strides) {
    offsets.push_back(offset);
    offset += int64_t{rows} * stride;
  }
  offsets.push_back(offset);  // the region's size
  return offsets;
}

uint64_t peer_layout::StridesHash(std::span<const int32_t> strides) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (int32_t stride : strides) {
    hash = (hash ^ static_cast<uint32_t>(stride)) * 0x100000001b3ull;
  }
  return hash;
}

peer_layout::Header peer_layout::HeaderOf(uint64_t generation, int32_t rows,
                                          std::span<const int32_t> strides) {
  return {kMagic, generation, rows, static_cast<int64_t>(strides.size()), StridesHash(strides)};
}

std::string PeerRegionDescriptor::Serialize() const {
  std::string strides;
  for (size_t i = 0; i < row_strides.size(); ++i) {
    if (i > 0) strides += ',';
    strides += std::to_string(row_strides[i]);
  }
  return std::string(kTag) + " pid=" + std::to_string(pid) +
         " start=" + std::to_string(start_time) + " generation=" + std::to_string(generation) +
         " rows=" + std::to_string(rows) + " strides=" + strides + " handle=" + handle;
}

StatusOr<PeerRegionDescriptor> PeerRegionDescriptor::Parse(std::string_view text) {
  const auto bad = [&] {
    return InvalidArgument("not a peer region descriptor: \"" + std::string(text.substr(0, 120)) +
                           "\"");
  };
  // The handle is last and may hold spaces.
  const size_t handle_at = text.find(" handle=");
  if (handle_at == std::string_view::npos) return bad();
  const std::vector<std::string_view> words = text::Words(text.substr(0, handle_at));
  if (words.size() != 6 || words[0] != kTag) return bad();
  const auto value = [](std::string_view field, std::string_view key) -> std::string_view {
    if (field.size() <= key.size() || field.substr(0, key.size()) != key) return {};
    return field.substr(key.size());
  };
  PeerRegionDescriptor d;
  if (!text::ParseNumber(value(words[1], "pid="), &d.pid) ||
      !text::ParseNumber(value(words[2], "start="), &d.start_time) ||
      !text::ParseNumber(value(words[3], "generation="), &d.generation) ||
      !text::ParseNumber(value(words[4], "rows="), &d.rows) || d.generation == 0 || d.rows < 1 ||
      d.pid < 1) {
    return bad();
  }
  std::string_view list = value(words[5], "strides=");
  while (!list.empty()) {
    const size_t comma = list.find(',');
    int32_t stride = 0;
    if (!text::ParseNumber(list.substr(0, comma), &stride) || stride < 1) return bad();
    d.row_strides.push_back(stride);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  d.handle = std::string(text.substr(handle_at + std::strlen(" handle=")));
  if (d.row_strides.empty() || d.handle.empty()) return bad();
  return d;
}

StatusOr<std::unique_ptr<PeerRegion>> PeerRegion::Create(const KVGeometry& geometry, int32_t rows,
                                                         std::shared_ptr<Backend> backend) {
  if (geometry.layers.empty()) return InvalidArgument("PeerRegion: the geometry has no layers");
  for (const LayerShape& layer : geometry.layers) {
    if (layer.row_bytes < 1 || layer.row_stride < layer.row_bytes) {
      return InvalidArgument("PeerRegion: a layer's row_bytes < 1 or row_stride < row_bytes");
    }
  }
  if (rows < 1) return InvalidArgument("PeerRegion: rows must be >= 1");
  if (backend == nullptr) return InvalidArgument("PeerRegion: backend is null");
  std::unique_ptr<PeerRegion> region(new PeerRegion(backend, geometry));
  std::vector<int32_t> strides;
  for (const LayerShape& layer : geometry.layers) strides.push_back(layer.row_stride);
  region->layer_offset_ = peer_layout::LayerOffsets(rows, strides);
  const auto bytes = static_cast<size_t>(region->layer_offset_.back());
  SPARSEKV_ASSIGN_OR_RETURN(void* memory, backend->AllocateDevice(bytes));
  region->memory_ = static_cast<std::byte*>(memory);
  PeerRegionDescriptor& d = region->descriptor_;
  d.pid = getpid();
  d.start_time = OwnStartTime();
  d.generation = NewGeneration();
  d.rows = rows;
  d.row_strides = std::move(strides);
  SPARSEKV_ASSIGN_OR_RETURN(d.handle, backend->ExportDevice(memory));
  const peer_layout::Header header = peer_layout::HeaderOf(d.generation, rows, d.row_strides);
  SPARSEKV_RETURN_IF_ERROR(backend->MemsetAsync(memory, 0, bytes, nullptr));
  SPARSEKV_RETURN_IF_ERROR(backend->CopyAsync(memory, &header, sizeof(header), nullptr));
  SPARSEKV_RETURN_IF_ERROR(backend->Synchronize(nullptr));
  return region;
}

PeerRegion::~PeerRegion() {
  if (memory_ == nullptr) return;
  backend_->MemsetAsync(memory_, 0, sizeof(peer_layout::Header), nullptr).IgnoreError();
  backend_->Synchronize(nullptr).IgnoreError();
  backend_->FreeDevice(memory_);
}

std::byte* PeerRegion::row(int32_t layer, int32_t row) const {
  return memory_ + layer_offset_[layer] + int64_t{row} * geometry_.layers[layer].row_stride;
}

Status PeerRegion::WriteRows(int32_t layer, int32_t first_row, const void* rows, int32_t tokens,
                             StreamHandle stream) {
  if (layer < 0 || layer >= geometry_.num_layers()) {
    return InvalidArgument("PeerRegion::WriteRows: layer " + std::to_string(layer) +
                           " out of range");
  }
  if (rows == nullptr || tokens < 1) {
    return InvalidArgument("PeerRegion::WriteRows: rows is null or tokens < 1");
  }
  if (first_row < 0 || int64_t{first_row} + tokens > descriptor_.rows) {
    return OutOfRange("PeerRegion::WriteRows: rows [" + std::to_string(first_row) + ", " +
                      std::to_string(int64_t{first_row} + tokens) + ") outside the region's " +
                      std::to_string(descriptor_.rows));
  }
  return backend_->CopyAsync(row(layer, first_row), rows,
                             static_cast<size_t>(tokens) * geometry_.layers[layer].row_stride,
                             stream);
}

}  // namespace sparsekv
