// NodeSegment: the file a node pool lives in (include/sparsekv/node_pool.h), mapped into this
// process: a header with the pool's shape, the bookkeeping block (pool_state.h), and the rows of
// every layer, each layer 2 MB-aligned. The file is in a tmpfs (/dev/shm: POSIX shared memory) or
// a hugetlbfs mount; every process attached to the pool maps it MAP_SHARED.
//
// A segment is created under a temporary name and linked to its path once its bookkeeping is
// initialised (Publish), so that a process opening the path never sees a half-made segment.
//
// Thread safety: the object is immutable after creation; what is inside the mapping is guarded by
// the bookkeeping's mutex.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv {

class NodeSegment {
 public:
  struct Shape {
    KVGeometry geometry;
    int32_t rows = 0;
    int32_t page_tokens = 0;
    int32_t pages_per_owner = 0;
    int32_t max_owners = 0;
    int32_t max_processes = 0;
    int32_t total_pages() const { return rows / page_tokens; }
  };

  // Creates a file next to `path` under a temporary name, sized for `shape`, maps it with every
  // page allocated (ResourceExhausted if the file system is too small, rather than a SIGBUS on
  // the first write) and writes the header with a fresh random id. The bookkeeping block is zero;
  // the caller initialises it, then calls Publish. With `huge_pages`, the rows are advised
  // MADV_HUGEPAGE before they are allocated (a tmpfs honours it when its shmem_enabled setting is
  // "advise", "within_size" or "always").
  static StatusOr<std::unique_ptr<NodeSegment>> Create(const std::string& path, const Shape& shape,
                                                       bool huge_pages);
  // The size of the file Create makes for `shape`: header, bookkeeping and rows.
  static size_t FileBytes(const Shape& shape);
  // Opens and maps the segment at `path`. NotFound if there is none; FailedPrecondition if it is
  // not a node pool segment of this version.
  static StatusOr<std::unique_ptr<NodeSegment>> Open(const std::string& path, bool huge_pages);
  ~NodeSegment();
  NodeSegment(const NodeSegment&) = delete;
  NodeSegment& operator=(const NodeSegment&) = delete;

  // Links the segment created by Create to its path: AlreadyExists if a file has that name (the
  // segment stays unpublished; Publish may be called again).
  Status Publish();
  // Removes the file name if it still names this segment (the same inode); the mapping stays.
  void Unlink() const;

  const std::string& path() const { return path_; }
  uint64_t id() const { return id_; }
  const Shape& shape() const { return shape_; }
  size_t file_bytes() const { return bytes_; }
  std::byte* book() const { return base_ + book_offset_; }
  std::byte* layer_base(int32_t layer) const;
  // The rows of every layer: one range, for registration with a backend.
  std::byte* rows_begin() const { return base_ + rows_offset_; }
  size_t rows_bytes() const { return bytes_ - rows_offset_; }

 private:
  NodeSegment() = default;
  // Reads the shape and offsets from the mapped header.
  Status ReadHeader();

  std::string path_;
  std::string temp_path_;  // Create: the name until Publish; empty after
  int fd_ = -1;
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
  uint64_t id_ = 0;
  Shape shape_;
  size_t book_offset_ = 0;
  size_t rows_offset_ = 0;
  std::vector<size_t> layer_offsets_;
};

}  // namespace sparsekv
