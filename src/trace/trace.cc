#include "sparsekv/trace.h"

#include <bit>
#include <cstring>
#include <fstream>

namespace sparsekv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the trace format is little-endian; add byte swapping for this target");

constexpr char kMagic[8] = {'S', 'K', 'V', 'T', 'R', 'A', 'C', 'E'};
constexpr uint32_t kVersion = 1;
// Guards the reader's allocations against a corrupt header: 2^31 int32 values (8 GiB).
constexpr uint64_t kMaxValues = uint64_t{1} << 31;

template <typename T>
void Put(std::ofstream& out, const T* data, size_t count) {
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(sizeof(T) * count));
}
template <typename T>
bool Get(std::ifstream& in, T* data, size_t count) {
  in.read(reinterpret_cast<char*>(data), static_cast<std::streamsize>(sizeof(T) * count));
  return static_cast<bool>(in);
}

}  // namespace

void Trace::Resize(int32_t l, int32_t k, int32_t s) {
  layers = l;
  top_k = k;
  steps = s;
  seq_len.assign(static_cast<size_t>(s) * l, 0);
  positions.assign(static_cast<size_t>(s) * l * k, 0);
}

Status WriteTrace(const std::string& path, const Trace& t) {
  const size_t records = static_cast<size_t>(t.steps) * t.layers;
  if (t.layers < 1 || t.top_k < 1 || t.steps < 1 || t.seq_len.size() != records ||
      t.positions.size() != records * t.top_k) {
    return InvalidArgument("trace shape does not match its contents");
  }
  std::ofstream out(path, std::ios::binary);
  if (!out) return Unavailable("cannot write trace '" + path + "'");
  const uint32_t header[5] = {kVersion, static_cast<uint32_t>(t.layers),
                              static_cast<uint32_t>(t.top_k), static_cast<uint32_t>(t.steps),
                              static_cast<uint32_t>(t.metadata.size())};
  Put(out, kMagic, sizeof(kMagic));
  Put(out, header, 5);
  Put(out, t.metadata.data(), t.metadata.size());
  for (size_t r = 0; r < records; ++r) {
    Put(out, &t.seq_len[r], 1);
    Put(out, t.positions.data() + r * t.top_k, t.top_k);
  }
  out.close();
  if (!out) return Unavailable("cannot write trace '" + path + "'");
  return Status::Ok();
}

StatusOr<Trace> ReadTrace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Unavailable("cannot open trace '" + path + "'");
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("trace '" + path + "': " + why);
  };
  char magic[8];
  uint32_t header[5];
  if (!Get(in, magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return bad("not a trace file");
  if (!Get(in, header, 5)) return bad("truncated header");
  if (header[0] != kVersion) return bad("unsupported version " + std::to_string(header[0]));
  const uint64_t records = uint64_t{header[1]} * header[3];
  if (header[1] < 1 || header[2] < 1 || header[3] < 1 || records * (header[2] + 1) > kMaxValues ||
      header[4] > kMaxValues) {
    return bad("implausible shape in the header");
  }
  Trace t;
  t.Resize(static_cast<int32_t>(header[1]), static_cast<int32_t>(header[2]),
           static_cast<int32_t>(header[3]));
  t.metadata.resize(header[4]);
  if (!Get(in, t.metadata.data(), t.metadata.size())) return bad("truncated metadata");
  for (uint64_t r = 0; r < records; ++r) {
    if (!Get(in, &t.seq_len[r], 1) || !Get(in, t.positions.data() + r * t.top_k, t.top_k)) {
      return bad("truncated at record " + std::to_string(r));
    }
    if (t.seq_len[r] < 1) return bad("seq_len < 1 at record " + std::to_string(r));
  }
  if (in.peek() != std::ifstream::traits_type::eof()) return bad("trailing bytes after records");
  return t;
}

}  // namespace sparsekv
