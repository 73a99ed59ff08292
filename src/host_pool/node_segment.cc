#include "host_pool/node_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "host_pool/pool_state.h"
#include "sparsekv/capacity.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace sparsekv {
namespace {

constexpr uint64_t kMagic = 0x4c4f4f5045444f4eull;  // "NODEPOOL"
constexpr uint32_t kVersion = 2;                    // 2: the header's checksum
constexpr size_t kRowAlignment = size_t{2} << 20;   // 2 MB: a huge page
constexpr size_t kHeaderBytes = 4096;               // SegmentHeader, then the layer shapes

struct SegmentHeader {
  std::atomic<uint64_t> magic;  // kMagic once the segment is ready
  uint32_t version;
  int32_t layers;
  uint64_t id;
  uint64_t bytes;
  uint64_t book_offset;
  uint64_t rows_offset;
  int32_t rows;
  int32_t page_tokens;
  int32_t pages_per_owner;
  int32_t max_owners;
  int32_t max_processes;
  int32_t pad;
  uint64_t checksum;  // HeaderChecksum: a header altered after it was written is refused
  // Followed by `layers` pairs (row_bytes, row_stride) at kLayersOffset.
};
constexpr size_t kLayersOffset = 256;
static_assert(sizeof(SegmentHeader) <= kLayersOffset);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the magic is shared between processes");

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// FNV-1a over every field of the header but the magic and the checksum, and over the `layers`
// (row_bytes, row_stride) pairs at `shapes`.
uint64_t HeaderChecksum(const SegmentHeader& h, const int32_t* shapes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  const auto mix = [&hash](uint64_t v) {
    for (int i = 0; i < 8; ++i) hash = (hash ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  };
  for (uint64_t v :
       {uint64_t{h.version}, uint64_t(uint32_t(h.layers)), h.id, h.bytes, h.book_offset,
        h.rows_offset, uint64_t(uint32_t(h.rows)), uint64_t(uint32_t(h.page_tokens)),
        uint64_t(uint32_t(h.pages_per_owner)), uint64_t(uint32_t(h.max_owners)),
        uint64_t(uint32_t(h.max_processes)), uint64_t(uint32_t(h.pad))}) {
    mix(v);
  }
  for (int32_t i = 0; i < 2 * h.layers; ++i) mix(uint32_t(shapes[i]));
  return hash;
}

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

struct Offsets {
  size_t book = 0;
  size_t rows = 0;
  std::vector<size_t> layers;
  size_t bytes = 0;
};

Offsets OffsetsOf(const NodeSegment::Shape& s) {
  Offsets o;
  const size_t layer_bytes = kLayersOffset + 8 * s.geometry.layers.size();
  o.book = AlignUp(std::max(kHeaderBytes, layer_bytes), 4096);
  const pool_state::Layout book =
      pool_state::Layout::Of(s.total_pages(), s.pages_per_owner, s.max_owners, s.max_processes);
  o.rows = AlignUp(o.book + book.bytes, kRowAlignment);
  size_t at = o.rows;
  for (const LayerShape& l : s.geometry.layers) {
    o.layers.push_back(at);
    at = AlignUp(at + static_cast<size_t>(s.rows) * l.row_stride, kRowAlignment);
  }
  o.bytes = at;
  return o;
}

uint64_t RandomId() {
  std::random_device device;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{device()} << 32) ^ device();
  return id;
}

}  // namespace

size_t NodeSegment::FileBytes(const Shape& shape) { return OffsetsOf(shape).bytes; }

StatusOr<std::unique_ptr<NodeSegment>> NodeSegment::Create(const std::string& path,
                                                           const Shape& shape, bool huge_pages) {
  if (shape.geometry.layers.empty() || shape.rows <= 0 || shape.page_tokens <= 0 ||
      shape.rows % shape.page_tokens != 0 || shape.max_owners <= 0 || shape.max_processes <= 0) {
    return InvalidArgument("node pool: invalid shape");
  }
  const Offsets o = OffsetsOf(shape);
  std::string temp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 16; ++attempt) {
    temp = path + ".creating." + std::to_string(getpid()) + "." + std::to_string(RandomId());
    fd = open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) {
      return Unavailable(Errno("node pool: cannot create " + temp));
    }
  }
  if (fd < 0) return Unavailable("node pool: cannot create a temporary file next to " + path);
  std::unique_ptr<NodeSegment> s(new NodeSegment());
  s->path_ = path;
  s->temp_path_ = temp;  // unlinked by the destructor unless published
  s->fd_ = fd;
  if (ftruncate(fd, static_cast<off_t>(o.bytes)) != 0) {
    return ResourceExhausted(
        Errno("node pool: cannot size " + temp + " to " + std::to_string(o.bytes) + " bytes"));
  }
  void* p = mmap(nullptr, o.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ResourceExhausted(Errno("node pool: cannot map " + temp));
  // Every page is allocated now, so that a file system that is too small fails here and not with
  // a SIGBUS on the first write to a row: through the mapping (after the huge page advice, which
  // a tmpfs honours only for pages faulted through an advised mapping), or with posix_fallocate
  // where the kernel cannot populate a mapping.
  if (huge_pages) madvise(static_cast<std::byte*>(p) + o.rows, o.bytes - o.rows, MADV_HUGEPAGE);
  if (madvise(p, o.bytes, MADV_POPULATE_WRITE) != 0) {
    const int populate_error = errno;
    const int err = populate_error == EINVAL ? posix_fallocate(fd, 0, static_cast<off_t>(o.bytes))
                                             : populate_error;
    if (err != 0) {
      munmap(p, o.bytes);
      // A full tmpfs shows as EFAULT (the populate faulted) or ENOSPC; say what is missing.
      const std::string dir = path.substr(0, path.find_last_of('/') + 1);
      const StatusOr<int64_t> free = SystemCapacity().FreeFileSystemBytes(dir.empty() ? "." : dir);
      if (err == EFAULT || err == ENOSPC || err == ENOMEM) {
        return ResourceExhausted("node pool: " + path + " needs " + FormatBytes(o.bytes) + " of " +
                                 (dir.empty() ? "." : dir) + ", " +
                                 (free.ok() ? FormatBytes(*free) : "less") +
                                 " was free there when it was written; lower "
                                 "host_capacity_tokens or use a larger file system");
      }
      errno = err;
      return ResourceExhausted(
          Errno("node pool: cannot reserve " + std::to_string(o.bytes) + " bytes for " + path));
    }
  }
  s->base_ = static_cast<std::byte*>(p);
  s->bytes_ = o.bytes;
  auto* h = new (s->base_) SegmentHeader();
  h->version = kVersion;
  h->layers = shape.geometry.num_layers();
  h->id = RandomId();
  h->bytes = o.bytes;
  h->book_offset = o.book;
  h->rows_offset = o.rows;
  h->rows = shape.rows;
  h->page_tokens = shape.page_tokens;
  h->pages_per_owner = shape.pages_per_owner;
  h->max_owners = shape.max_owners;
  h->max_processes = shape.max_processes;
  auto* layers = reinterpret_cast<int32_t*>(s->base_ + kLayersOffset);
  for (int32_t l = 0; l < h->layers; ++l) {
    layers[2 * l] = shape.geometry.layers[l].row_bytes;
    layers[2 * l + 1] = shape.geometry.layers[l].row_stride;
  }
  h->checksum = HeaderChecksum(*h, layers);
  h->magic.store(kMagic, std::memory_order_release);
  SPARSEKV_RETURN_IF_ERROR(s->ReadHeader());
  return s;
}

Status NodeSegment::Publish() {
  if (temp_path_.empty()) return Status::Ok();
  if (link(temp_path_.c_str(), path_.c_str()) != 0) {
    if (errno == EEXIST) return AlreadyExists("node pool: " + path_ + " exists");
    return Unavailable(Errno("node pool: cannot link " + path_));
  }
  unlink(temp_path_.c_str());
  temp_path_.clear();
  return Status::Ok();
}

StatusOr<std::unique_ptr<NodeSegment>> NodeSegment::Open(const std::string& path, bool huge_pages) {
  // Non-blocking, so that a path naming a FIFO is refused below rather than waited on.
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound("node pool: no segment " + path);
    return Unavailable(Errno("node pool: cannot open " + path));
  }
  std::unique_ptr<NodeSegment> s(new NodeSegment());
  s->path_ = path;
  s->fd_ = fd;
  struct stat st {};
  if (fstat(fd, &st) != 0) return Unavailable(Errno("node pool: fstat " + path));
  if (!S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) < kHeaderBytes) {
    return FailedPrecondition("node pool: " + path + " is not a node pool segment");
  }
  void* p =
      mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ResourceExhausted(Errno("node pool: cannot map " + path));
  s->base_ = static_cast<std::byte*>(p);
  s->bytes_ = static_cast<size_t>(st.st_size);
  const auto* h = reinterpret_cast<const SegmentHeader*>(s->base_);
  if (h->magic.load(std::memory_order_acquire) != kMagic) {
    return FailedPrecondition("node pool: " + path + " is not a node pool segment");
  }
  SPARSEKV_RETURN_IF_ERROR(s->ReadHeader());
  if (huge_pages) madvise(s->rows_begin(), s->rows_bytes(), MADV_HUGEPAGE);
  return s;
}

Status NodeSegment::ReadHeader() {
  const auto* h = reinterpret_cast<const SegmentHeader*>(base_);
  if (h->version != kVersion) {
    return FailedPrecondition("node pool: " + path_ + " has version " + std::to_string(h->version) +
                              ", not " + std::to_string(kVersion));
  }
  // Every field is checked before it sizes a read: the layer count against the mapping, then the
  // checksum, then the shape.
  if (h->layers < 1 || h->bytes != bytes_ || h->book_offset > bytes_ ||
      kLayersOffset + 8 * static_cast<size_t>(h->layers) > h->book_offset) {
    return FailedPrecondition("node pool: " + path_ + " is not a valid segment");
  }
  const auto* shapes = reinterpret_cast<const int32_t*>(base_ + kLayersOffset);
  if (h->checksum != HeaderChecksum(*h, shapes)) {
    return FailedPrecondition("node pool: " + path_ + " has a corrupt header (checksum)");
  }
  id_ = h->id;
  shape_.rows = h->rows;
  shape_.page_tokens = h->page_tokens;
  shape_.pages_per_owner = h->pages_per_owner;
  shape_.max_owners = h->max_owners;
  shape_.max_processes = h->max_processes;
  shape_.geometry.layers.clear();
  bool valid = shape_.rows > 0 && shape_.page_tokens > 0 && shape_.rows % shape_.page_tokens == 0 &&
               shape_.pages_per_owner > 0 && shape_.max_owners > 0 && shape_.max_processes > 0;
  for (int32_t l = 0; l < h->layers; ++l) {
    const LayerShape layer{shapes[2 * l], shapes[2 * l + 1]};
    valid = valid && layer.row_bytes > 0 && layer.row_stride >= layer.row_bytes;
    shape_.geometry.layers.push_back(layer);
  }
  if (!valid) {
    return FailedPrecondition("node pool: " + path_ + " is not a valid segment");
  }
  const Offsets o = OffsetsOf(shape_);
  if (o.bytes != bytes_ || o.book != h->book_offset || o.rows != h->rows_offset) {
    return FailedPrecondition("node pool: " + path_ + " has an inconsistent layout");
  }
  book_offset_ = o.book;
  rows_offset_ = o.rows;
  layer_offsets_ = o.layers;
  return Status::Ok();
}

void NodeSegment::Unlink() const {
  struct stat mine {
  }, named{};
  if (fstat(fd_, &mine) == 0 && stat(path_.c_str(), &named) == 0 && mine.st_dev == named.st_dev &&
      mine.st_ino == named.st_ino) {
    unlink(path_.c_str());
  }
}

std::byte* NodeSegment::layer_base(int32_t layer) const { return base_ + layer_offsets_[layer]; }

NodeSegment::~NodeSegment() {
  if (!temp_path_.empty()) unlink(temp_path_.c_str());
  if (base_ != nullptr) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

}  // namespace sparsekv
