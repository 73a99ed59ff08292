#include "manager/dense_layer_store.h"

#include <algorithm>
#include <string>
#include <unordered_set>
#include <utility>

namespace sparsekv {
namespace {

std::string Num(int64_t v) { return std::to_string(v); }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

StatusOr<std::unique_ptr<DenseLayerStore>> DenseLayerStore::Create(
    const DenseLayerStoreOptions& options, std::shared_ptr<Backend> backend) {
  if (backend == nullptr) return InvalidArgument("DenseLayerStore: backend is null");
  if (options.geometry.num_layers() < 1) {
    return InvalidArgument("DenseLayerStore: geometry.layers is empty");
  }
  for (int32_t l = 0; l < options.geometry.num_layers(); ++l) {
    const LayerShape& shape = options.geometry.layers[l];
    if (shape.row_bytes < 1 || shape.row_stride < shape.row_bytes) {
      return InvalidArgument("DenseLayerStore: layer " + Num(l) + " has row_bytes " +
                             Num(shape.row_bytes) + " and row_stride " + Num(shape.row_stride) +
                             " (need 1 <= row_bytes <= row_stride)");
    }
    if (shape.kind == LayerKind::kResident && shape.entry_tokens < 1) {
      return InvalidArgument("DenseLayerStore: layer " + Num(l) + " has entry_tokens " +
                             Num(shape.entry_tokens) + " (need >= 1)");
    }
  }
  if (options.raw_window < 0) {
    return InvalidArgument("DenseLayerStore: raw_window " + Num(options.raw_window) +
                           " is negative");
  }
  if (options.page_rows < 1) {
    return InvalidArgument("DenseLayerStore: page_rows " + Num(options.page_rows) + " < 1");
  }
  if (options.max_requests < 1) {
    return InvalidArgument("DenseLayerStore: max_requests " + Num(options.max_requests) + " < 1");
  }
  if (options.max_batch < 1 || options.max_batch > options.max_requests) {
    return InvalidArgument("DenseLayerStore: max_batch " + Num(options.max_batch) +
                           " is outside [1, max_requests = " + Num(options.max_requests) + "]");
  }
  if (options.max_request_tokens < 1) {
    return InvalidArgument("DenseLayerStore: max_request_tokens " +
                           Num(options.max_request_tokens) + " < 1");
  }
  if (options.budget_bytes < 0) {
    return InvalidArgument("DenseLayerStore: budget_bytes " + Num(options.budget_bytes) +
                           " is negative");
  }
  std::unique_ptr<DenseLayerStore> store(new DenseLayerStore(options, std::move(backend)));
  SPARSEKV_RETURN_IF_ERROR(store->AllocateTables());
  return store;
}

DenseLayerStore::DenseLayerStore(const DenseLayerStoreOptions& options,
                                 std::shared_ptr<Backend> backend)
    : options_(options), backend_(std::move(backend)), tables_(*backend_) {}

DenseLayerStore::~DenseLayerStore() {
  for (auto& [id, held] : requests_) {
    if (held.memory != nullptr) backend_->FreeDevice(held.memory);
  }
}

int32_t DenseLayerStore::PagesPerRow(const DenseLayerStoreOptions& o, int32_t layer) {
  const LayerShape& shape = o.geometry.layers[layer];
  if (shape.kind != LayerKind::kResident) return 0;
  return static_cast<int32_t>(CeilDiv(o.max_request_tokens / shape.entry_tokens, o.page_rows));
}

int64_t DenseLayerStore::TableBytes(const DenseLayerStoreOptions& o) {
  const int64_t rows = o.max_requests;
  int64_t bytes = (1 + 2 * static_cast<int64_t>(o.max_batch)) * sizeof(int32_t);  // step table
  for (int32_t l = 0; l < o.geometry.num_layers(); ++l) {
    bytes += rows * PagesPerRow(o, l) * static_cast<int64_t>(sizeof(std::byte*));
    if (o.raw_window > 0) bytes += rows * static_cast<int64_t>(sizeof(std::byte*));
  }
  return bytes;
}

Status DenseLayerStore::AllocateTables() {
  const int32_t layers = options_.geometry.num_layers();
  const int64_t rows = options_.max_requests;
  const int64_t bytes = TableBytes(options_);
  pages_per_row_.assign(layers, 0);
  for (int32_t l = 0; l < layers; ++l) pages_per_row_[l] = PagesPerRow(options_, l);
  if (bytes > options_.budget_bytes) {
    return ResourceExhausted("DenseLayerStore: the tables take " + Num(bytes) +
                             " bytes, more than budget_bytes " + Num(options_.budget_bytes));
  }
  page_table_.assign(layers, nullptr);
  ring_table_.assign(layers, nullptr);
  for (int32_t l = 0; l < layers; ++l) {
    if (pages_per_row_[l] > 0) {
      SPARSEKV_ASSIGN_OR_RETURN(page_table_[l],
                                tables_.Allocate<std::byte*>(rows * pages_per_row_[l]));
    }
    if (options_.raw_window > 0) {
      SPARSEKV_ASSIGN_OR_RETURN(ring_table_[l], tables_.Allocate<std::byte*>(rows));
    }
  }
  SPARSEKV_ASSIGN_OR_RETURN(step_, tables_.Allocate<int32_t>(1 + 2 * options_.max_batch));
  step_host_.assign(1 + 2 * options_.max_batch, -1);
  step_host_[0] = 0;
  free_rows_.clear();
  for (int32_t r = options_.max_requests - 1; r >= 0; --r) free_rows_.push_back(r);
  // DeviceMemory zeroes on the null stream: the tables are ready before any stream uses them.
  return backend_->Synchronize(nullptr);
}

DenseLayerStore::Layout DenseLayerStore::LayoutFor(const DenseLayerStoreOptions& o,
                                                   int64_t reserved_tokens) {
  const int32_t layers = o.geometry.num_layers();
  Layout layout;
  layout.page_offset.assign(layers, -1);
  layout.pages.assign(layers, 0);
  layout.ring_offset.assign(layers, -1);
  int64_t offset = 0;
  for (int32_t l = 0; l < layers; ++l) {
    const LayerShape& shape = o.geometry.layers[l];
    if (shape.kind != LayerKind::kResident) continue;
    layout.pages[l] =
        static_cast<int32_t>(CeilDiv(reserved_tokens / shape.entry_tokens, o.page_rows));
    layout.page_offset[l] = offset;
    const int64_t bytes = static_cast<int64_t>(layout.pages[l]) * o.page_rows * shape.row_stride;
    offset += bytes;
    layout.bytes.resident_entries += bytes;
  }
  if (o.raw_window > 0) {
    for (int32_t l = 0; l < layers; ++l) {
      layout.ring_offset[l] = offset;
      const int64_t bytes = static_cast<int64_t>(o.raw_window) * o.geometry.layers[l].row_stride;
      offset += bytes;
      layout.bytes.windows += bytes;
    }
  }
  return layout;
}

DenseMemoryUse DenseLayerStore::RequestBytes(const DenseLayerStoreOptions& options,
                                             int64_t reserved_tokens) {
  return LayoutFor(options, reserved_tokens).bytes;
}

DenseMemoryUse DenseLayerStore::RequestBytes(int64_t reserved_tokens) const {
  return RequestBytes(options_, reserved_tokens);
}

Status DenseLayerStore::Place(RequestId id, Held& held, StreamHandle stream) {
  const int64_t need = held.layout.bytes.sum();
  if (free_rows_.empty()) {
    return ResourceExhausted("DenseLayerStore: request " + Num(static_cast<int64_t>(id)) +
                             " finds no free table row (max_requests " +
                             Num(options_.max_requests) + " held)");
  }
  const int64_t left = options_.budget_bytes - bytes();
  if (need > left) {
    return ResourceExhausted(
        "DenseLayerStore: request " + Num(static_cast<int64_t>(id)) + " needs " + Num(need) +
        " bytes of device memory (resident entries " + Num(held.layout.bytes.resident_entries) +
        ", windows " + Num(held.layout.bytes.windows) + ") for " + Num(held.reserved_tokens) +
        " tokens; " + Num(left) + " of budget_bytes " + Num(options_.budget_bytes) + " are left");
  }
  if (need > 0) {
    SPARSEKV_ASSIGN_OR_RETURN(void* memory, backend_->AllocateDevice(need));
    held.memory = static_cast<std::byte*>(memory);
    if (Status s = backend_->MemsetAsync(held.memory, 0, need, stream); !s.ok()) {
      backend_->FreeDevice(held.memory);
      held.memory = nullptr;
      return s;
    }
  }
  held.table_row = free_rows_.back();
  free_rows_.pop_back();
  resident_entries_ += held.layout.bytes.resident_entries;
  windows_ += held.layout.bytes.windows;
  if (Status s = UploadRow(held, stream); !s.ok()) {
    Unplace(held);
    return s;
  }
  return Status::Ok();
}

void DenseLayerStore::Unplace(Held& held) {
  if (held.memory != nullptr) backend_->FreeDevice(held.memory);
  held.memory = nullptr;
  free_rows_.push_back(held.table_row);
  held.table_row = -1;
  resident_entries_ -= held.layout.bytes.resident_entries;
  windows_ -= held.layout.bytes.windows;
}

// A request's row of each table: its pages (null past its reserved pages) and rings.
Status DenseLayerStore::UploadRow(const Held& held, StreamHandle stream) {
  const int64_t row = held.table_row;
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    if (pages_per_row_[l] > 0) {
      const int64_t page_bytes =
          static_cast<int64_t>(options_.page_rows) * options_.geometry.layers[l].row_stride;
      std::vector<std::byte*> pages(pages_per_row_[l], nullptr);
      for (int32_t p = 0; p < held.layout.pages[l]; ++p) {
        pages[p] = held.memory + held.layout.page_offset[l] + p * page_bytes;
      }
      SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(page_table_[l] + row * pages_per_row_[l],
                                                   pages.data(), pages.size() * sizeof(std::byte*),
                                                   stream));
    }
    if (ring_table_[l] != nullptr) {
      std::byte* ring = held.memory + held.layout.ring_offset[l];
      SPARSEKV_RETURN_IF_ERROR(
          backend_->CopyAsync(ring_table_[l] + row, &ring, sizeof(std::byte*), stream));
    }
  }
  return Status::Ok();
}

Status DenseLayerStore::Admit(RequestId id, int32_t prompt_tokens, int64_t reserved_tokens,
                              StreamHandle stream) {
  if (reserved_tokens < 1 || reserved_tokens > options_.max_request_tokens) {
    return InvalidArgument("DenseLayerStore::Admit: reserved tokens " + Num(reserved_tokens) +
                           " outside [1, max_request_tokens = " + Num(options_.max_request_tokens) +
                           "]");
  }
  if (prompt_tokens < 0 || prompt_tokens > reserved_tokens) {
    return InvalidArgument("DenseLayerStore::Admit: prompt tokens " + Num(prompt_tokens) +
                           " outside [0, reserved tokens = " + Num(reserved_tokens) + "]");
  }
  if (requests_.contains(id)) {
    return AlreadyExists("DenseLayerStore::Admit: request " + Num(static_cast<int64_t>(id)) +
                         " is already held");
  }
  Held held;
  held.reserved_tokens = reserved_tokens;
  held.tokens = prompt_tokens;
  held.layout = LayoutFor(options_, reserved_tokens);
  SPARSEKV_RETURN_IF_ERROR(Place(id, held, stream));
  requests_.emplace(id, std::move(held));
  return Status::Ok();
}

StatusOr<DenseLayerStore::Held*> DenseLayerStore::Find(RequestId id, const char* call,
                                                       const char* role) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return NotFound(std::string("DenseLayerStore::") + call + ": " + role + " " +
                    Num(static_cast<int64_t>(id)) + " is not held");
  }
  return &it->second;
}

StatusOr<const DenseLayerStore::Held*> DenseLayerStore::Find(RequestId id, const char* call,
                                                             const char* role) const {
  SPARSEKV_ASSIGN_OR_RETURN(Held * held, const_cast<DenseLayerStore*>(this)->Find(id, call, role));
  return held;
}

StatusOr<DenseLayerStore::Held*> DenseLayerStore::FindPlaced(RequestId id, const char* call,
                                                             const char* role) {
  SPARSEKV_ASSIGN_OR_RETURN(Held * held, Find(id, call, role));
  if (held->table_row < 0) {
    return FailedPrecondition(std::string("DenseLayerStore::") + call + ": " + role + " " +
                              Num(static_cast<int64_t>(id)) + " is retracted");
  }
  return held;
}

Status DenseLayerStore::CheckHostBuffer(const void* host, int64_t host_bytes, int64_t bytes,
                                        RequestId id, const char* call) {
  if (host_bytes >= bytes && (bytes == 0 || host != nullptr)) return Status::Ok();
  return InvalidArgument(std::string("DenseLayerStore::") + call + ": host buffer of " +
                         Num(host_bytes) + " bytes, request " + Num(static_cast<int64_t>(id)) +
                         " needs " + Num(bytes));
}

Status DenseLayerStore::Fork(RequestId parent, RequestId child, int64_t reserved_tokens,
                             StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(const Held* held, FindPlaced(parent, "Fork", "parent"));
  const int32_t tokens = held->tokens;
  if (reserved_tokens < tokens) {
    return InvalidArgument("DenseLayerStore::Fork: reserved tokens " + Num(reserved_tokens) +
                           " below the parent's " + Num(tokens) + " tokens");
  }
  SPARSEKV_RETURN_IF_ERROR(Admit(child, tokens, reserved_tokens, stream));
  if (Status s = CopyRows(requests_.at(parent), requests_.at(child), tokens, stream); !s.ok()) {
    (void)Release(child);
    return s;
  }
  return Status::Ok();
}

Status DenseLayerStore::CopyRows(const Held& from, const Held& to, int32_t tokens,
                                 StreamHandle stream) {
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    const LayerShape& shape = options_.geometry.layers[l];
    if (shape.kind == LayerKind::kResident) {
      // A request's pages of a layer are consecutive in its allocation: its entries are one run.
      const int64_t bytes = static_cast<int64_t>(tokens / shape.entry_tokens) * shape.row_stride;
      if (bytes > 0) {
        SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(to.memory + to.layout.page_offset[l],
                                                     from.memory + from.layout.page_offset[l],
                                                     bytes, stream));
      }
    }
  }
  if (options_.raw_window > 0) {
    // The rings of all layers are one run, the same in every request.
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(to.memory + to.layout.ring_offset[0],
                                                 from.memory + from.layout.ring_offset[0],
                                                 to.layout.bytes.windows, stream));
  }
  return Status::Ok();
}

Status DenseLayerStore::IngestPrompt(RequestId id, int32_t layer, const void* entry_rows,
                                     const void* window_rows, StreamHandle stream,
                                     int32_t kept_tokens) {
  SPARSEKV_ASSIGN_OR_RETURN(const Held* found, FindPlaced(id, "IngestPrompt"));
  const Held& held = *found;
  if (layer < 0 || layer >= options_.geometry.num_layers()) {
    return InvalidArgument("DenseLayerStore::IngestPrompt: layer " + Num(layer) + " outside [0, " +
                           Num(options_.geometry.num_layers()) + ")");
  }
  if (kept_tokens < 0 || kept_tokens > held.tokens) {
    return InvalidArgument("DenseLayerStore::IngestPrompt: kept tokens " + Num(kept_tokens) +
                           " outside [0, " + Num(held.tokens) + "] (request " +
                           Num(static_cast<int64_t>(id)) + ")");
  }
  const LayerShape& shape = options_.geometry.layers[layer];
  const int64_t stride = shape.row_stride;
  const bool resident = shape.kind == LayerKind::kResident;
  const int32_t first = resident ? kept_tokens / shape.entry_tokens : 0;
  const int32_t entries = resident ? held.tokens / shape.entry_tokens - first : 0;
  const int32_t valid = std::min(held.tokens, options_.raw_window);
  if ((entries > 0 && entry_rows == nullptr) || (valid > 0 && window_rows == nullptr)) {
    return InvalidArgument("DenseLayerStore::IngestPrompt: layer " + Num(layer) + " of request " +
                           Num(static_cast<int64_t>(id)) + " takes " + Num(entries) +
                           " entry rows and " + Num(valid) + " window rows; a pointer is null");
  }
  if (entries > 0) {
    // The layer's pages are consecutive in the request's allocation: its entries are one run.
    SPARSEKV_RETURN_IF_ERROR(
        backend_->CopyAsync(held.memory + held.layout.page_offset[layer] + first * stride,
                            entry_rows, entries * stride, stream));
  }
  if (valid > 0) {
    // Token t lies in slot t mod raw_window: the newest rows are at most two runs of the ring.
    const int32_t first = (held.tokens - valid) % options_.raw_window;
    const int32_t head = std::min(valid, options_.raw_window - first);
    std::byte* ring = held.memory + held.layout.ring_offset[layer];
    const auto* rows = static_cast<const std::byte*>(window_rows);
    SPARSEKV_RETURN_IF_ERROR(
        backend_->CopyAsync(ring + first * stride, rows, head * stride, stream));
    if (valid > head) {
      SPARSEKV_RETURN_IF_ERROR(
          backend_->CopyAsync(ring, rows + head * stride, (valid - head) * stride, stream));
    }
  }
  return Status::Ok();
}

Status DenseLayerStore::RestoreEntries(RequestId id, const void* host, int64_t host_bytes,
                                       int64_t host_reserved_tokens, int32_t tokens,
                                       StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(const Held* found, FindPlaced(id, "RestoreEntries"));
  const Held& held = *found;
  if (tokens < 0 || tokens > held.tokens || tokens > host_reserved_tokens) {
    return InvalidArgument("DenseLayerStore::RestoreEntries: " + Num(tokens) +
                           " tokens, more than request " + Num(static_cast<int64_t>(id)) + "'s " +
                           Num(held.tokens) + " or the copy's " + Num(host_reserved_tokens) +
                           " reserved");
  }
  // The copy is laid out as the allocation of the request it was taken from.
  const Layout from = LayoutFor(options_, host_reserved_tokens);
  const int64_t bytes = from.bytes.sum();
  if (host_bytes < bytes || (bytes > 0 && host == nullptr)) {
    return InvalidArgument("DenseLayerStore::RestoreEntries: host copy of " + Num(host_bytes) +
                           " bytes, a request of " + Num(host_reserved_tokens) + " tokens holds " +
                           Num(bytes));
  }
  const auto* src = static_cast<const std::byte*>(host);
  for (int32_t l = 0; l < options_.geometry.num_layers(); ++l) {
    const LayerShape& shape = options_.geometry.layers[l];
    if (shape.kind != LayerKind::kResident) continue;
    // A layer's pages are one run in either allocation.
    const int64_t run = static_cast<int64_t>(tokens / shape.entry_tokens) * shape.row_stride;
    if (run == 0) continue;
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(held.memory + held.layout.page_offset[l],
                                                 src + from.page_offset[l], run, stream));
  }
  return Status::Ok();
}

Status DenseLayerStore::Release(RequestId id) {
  SPARSEKV_ASSIGN_OR_RETURN(Held * held, Find(id, "Release"));
  if (held->table_row >= 0) Unplace(*held);
  requests_.erase(id);
  return Status::Ok();
}

StatusOr<int64_t> DenseLayerStore::RetractedBytes(RequestId id) const {
  SPARSEKV_ASSIGN_OR_RETURN(const Held* held, Find(id, "RetractedBytes"));
  return held->layout.bytes.sum();
}

Status DenseLayerStore::Retract(RequestId id, void* host, int64_t host_bytes, StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Held * found, Find(id, "Retract"));
  Held& held = *found;
  if (held.table_row < 0) {
    return FailedPrecondition("DenseLayerStore::Retract: request " + Num(static_cast<int64_t>(id)) +
                              " is already retracted");
  }
  const int64_t bytes = held.layout.bytes.sum();
  SPARSEKV_RETURN_IF_ERROR(CheckHostBuffer(host, host_bytes, bytes, id, "Retract"));
  if (bytes > 0) {
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(host, held.memory, bytes, stream));
    // The copy must have read the memory before it is freed.
    SPARSEKV_RETURN_IF_ERROR(backend_->Synchronize(stream));
  }
  Unplace(held);
  return Status::Ok();
}

Status DenseLayerStore::Resume(RequestId id, const void* host, int64_t host_bytes,
                               StreamHandle stream) {
  SPARSEKV_ASSIGN_OR_RETURN(Held * found, Find(id, "Resume"));
  Held& held = *found;
  if (held.table_row >= 0) {
    return FailedPrecondition("DenseLayerStore::Resume: request " + Num(static_cast<int64_t>(id)) +
                              " is not retracted");
  }
  const int64_t bytes = held.layout.bytes.sum();
  SPARSEKV_RETURN_IF_ERROR(CheckHostBuffer(host, host_bytes, bytes, id, "Resume"));
  SPARSEKV_RETURN_IF_ERROR(Place(id, held, stream));
  if (bytes > 0) {
    SPARSEKV_RETURN_IF_ERROR(backend_->CopyAsync(held.memory, host, bytes, stream));
  }
  return Status::Ok();
}

Status DenseLayerStore::PlanStep(std::span<const RequestId> batch, StreamHandle stream) {
  if (static_cast<int64_t>(batch.size()) > options_.max_batch) {
    return InvalidArgument("DenseLayerStore::PlanStep: " + Num(static_cast<int64_t>(batch.size())) +
                           " rows, more than max_batch " + Num(options_.max_batch));
  }
  std::unordered_set<RequestId> seen;
  for (RequestId id : batch) {
    const std::string name = "request " + Num(static_cast<int64_t>(id));
    if (!seen.insert(id).second) {
      return InvalidArgument("DenseLayerStore::PlanStep: " + name + " is in the batch twice");
    }
    auto it = requests_.find(id);
    if (it == requests_.end()) return NotFound("DenseLayerStore::PlanStep: " + name + " unknown");
    if (it->second.table_row < 0) {
      return FailedPrecondition("DenseLayerStore::PlanStep: " + name + " is retracted");
    }
    if (it->second.tokens >= it->second.reserved_tokens) {
      return OutOfRange("DenseLayerStore::PlanStep: " + name + " is at its reserved " +
                        Num(it->second.reserved_tokens) + " tokens");
    }
  }
  const int32_t max_batch = options_.max_batch;
  std::fill(step_host_.begin(), step_host_.end(), -1);
  step_host_[0] = static_cast<int32_t>(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    const Held& held = requests_.at(batch[b]);
    step_host_[1 + b] = held.table_row;
    step_host_[1 + max_batch + b] = held.tokens + 1;
  }
  SPARSEKV_RETURN_IF_ERROR(
      backend_->CopyAsync(step_, step_host_.data(), step_host_.size() * sizeof(int32_t), stream));
  for (RequestId id : batch) ++requests_.at(id).tokens;
  return Status::Ok();
}

void DenseLayerStore::CancelStep(std::span<const RequestId> batch) {
  for (RequestId id : batch) --requests_.at(id).tokens;
}

Status DenseLayerStore::Append(int32_t layer, const void* entry_rows, const void* window_rows,
                               StreamHandle stream) {
  if (layer < 0 || layer >= options_.geometry.num_layers()) {
    return InvalidArgument("DenseLayerStore::Append: layer " + Num(layer) + " outside [0, " +
                           Num(options_.geometry.num_layers()) + ")");
  }
  const LayerShape& shape = options_.geometry.layers[layer];
  const bool resident = shape.kind == LayerKind::kResident;
  if (resident && entry_rows == nullptr) {
    return InvalidArgument("DenseLayerStore::Append: layer " + Num(layer) +
                           " is resident and entry_rows is null");
  }
  if (options_.raw_window > 0 && window_rows == nullptr) {
    return InvalidArgument("DenseLayerStore::Append: raw_window is " + Num(options_.raw_window) +
                           " and window_rows is null (layer " + Num(layer) + ")");
  }
  if (!resident && options_.raw_window == 0) return Status::Ok();
  DenseAppendView view{};
  view.batch_size = step_;
  view.table_row = step_ + 1;
  view.seq_len = step_ + 1 + options_.max_batch;
  view.entry_rows = resident ? static_cast<const std::byte*>(entry_rows) : nullptr;
  view.entry_stride = shape.row_stride;
  view.window_rows = options_.raw_window > 0 ? static_cast<const std::byte*>(window_rows) : nullptr;
  view.window_stride = shape.row_stride;
  view.pages = page_table_[layer];
  view.pages_per_row = pages_per_row_[layer];
  view.page_rows = options_.page_rows;
  view.rings = ring_table_[layer];
  view.raw_window = options_.raw_window;
  view.entry_tokens = resident ? shape.entry_tokens : 1;
  view.row_bytes = shape.row_bytes;
  view.row_stride = shape.row_stride;
  view.invalid = nullptr;
  return backend_->DenseAppend(view, options_.max_batch, stream);
}

StatusOr<DenseEntriesView> DenseLayerStore::DenseEntries(int32_t layer) const {
  if (layer < 0 || layer >= options_.geometry.num_layers() ||
      options_.geometry.layers[layer].kind != LayerKind::kResident) {
    return InvalidArgument("DenseLayerStore::DenseEntries: layer " + Num(layer) +
                           " is not a resident layer");
  }
  const LayerShape& shape = options_.geometry.layers[layer];
  return DenseEntriesView{step_,
                          step_ + 1,
                          step_ + 1 + options_.max_batch,
                          page_table_[layer],
                          pages_per_row_[layer],
                          options_.page_rows,
                          shape.row_stride,
                          shape.entry_tokens};
}

StatusOr<RawWindowView> DenseLayerStore::RawWindow(int32_t layer) const {
  if (layer < 0 || layer >= options_.geometry.num_layers()) {
    return InvalidArgument("DenseLayerStore::RawWindow: layer " + Num(layer) + " outside [0, " +
                           Num(options_.geometry.num_layers()) + ")");
  }
  if (options_.raw_window == 0) {
    return FailedPrecondition("DenseLayerStore::RawWindow: raw_window is 0");
  }
  return RawWindowView{step_,
                       step_ + 1,
                       step_ + 1 + options_.max_batch,
                       ring_table_[layer],
                       options_.raw_window,
                       options_.geometry.layers[layer].row_stride};
}

StatusOr<int32_t> DenseLayerStore::Tokens(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.table_row < 0) {
    return NotFound("DenseLayerStore::Tokens: request " + Num(static_cast<int64_t>(id)) +
                    " is not held on the device");
  }
  return it->second.tokens;
}

bool DenseLayerStore::IsRetracted(RequestId id) const {
  auto it = requests_.find(id);
  return it != requests_.end() && it->second.table_row < 0;
}

}  // namespace sparsekv
