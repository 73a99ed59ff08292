// The capacity checks (sparsekv/capacity.h) and the machine's figures they read on Linux.
#include "sparsekv/capacity.h"

#include <sys/resource.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common/text.h"
#include "sparsekv/backend.h"

namespace sparsekv {
namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

// A small file of /proc or /sys, read with stdio (no iostreams: text.h says why).
std::optional<std::string> ReadFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "re");
  if (file == nullptr) return std::nullopt;
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file)) > 0;) text.append(buffer, n);
  std::fclose(file);
  return text;
}

// The value of "Key:   <number> [kB]" in a /proc file, in bytes when the unit is kB.
std::optional<int64_t> ProcField(const std::string& text, std::string_view key) {
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (!line.starts_with(key) || line.size() <= key.size() || line[key.size()] != ':') continue;
    const std::vector<std::string_view> words = text::Words(line.substr(key.size() + 1));
    int64_t value = 0;
    if (words.empty() || !text::ParseNumber(words[0], &value)) return std::nullopt;
    return words.size() > 1 && words[1] == "kB" ? value * 1024 : value;
  }
  return std::nullopt;
}

// What the process's cgroup (v2) still allows: memory.max less memory.current; nullopt when it
// has no limit or the files cannot be read.
std::optional<int64_t> CgroupRoom() {
  const std::optional<std::string> self = ReadFile("/proc/self/cgroup");
  if (!self) return std::nullopt;
  const size_t v2 = self->find("0::");
  if (v2 == std::string::npos) return std::nullopt;
  std::string path = self->substr(v2 + 3);
  path = path.substr(0, path.find('\n'));
  const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
  const std::optional<std::string> max = ReadFile(dir + "/memory.max");
  const std::optional<std::string> current = ReadFile(dir + "/memory.current");
  if (!max || !current) return std::nullopt;
  int64_t limit = 0, used = 0;
  const auto trimmed = [](const std::string& s) {
    return std::string_view(s).substr(0, s.find_last_not_of(" \n") + 1);
  };
  if (!text::ParseNumber(trimmed(*max), &limit) || !text::ParseNumber(trimmed(*current), &used)) {
    return std::nullopt;  // "max": no limit
  }
  return std::max<int64_t>(0, limit - used);
}

class LinuxCapacity final : public MachineCapacity {
 public:
  StatusOr<int64_t> AvailableHostBytes() const override {
    const std::optional<std::string> meminfo = ReadFile("/proc/meminfo");
    if (!meminfo) return Unavailable("cannot read /proc/meminfo");
    const std::optional<int64_t> available = ProcField(*meminfo, "MemAvailable");
    if (!available) return Unavailable("/proc/meminfo has no MemAvailable");
    const int64_t huge = ProcField(*meminfo, "HugePages_Free").value_or(0) *
                         ProcField(*meminfo, "Hugepagesize").value_or(0);
    int64_t bytes = *available + huge;
    if (const std::optional<int64_t> room = CgroupRoom()) bytes = std::min(bytes, *room);
    return bytes;
  }

  StatusOr<int64_t> AvailableAddressSpace() const override {
    rlimit limit{};
    if (getrlimit(RLIMIT_AS, &limit) != 0) return Unavailable("getrlimit(RLIMIT_AS) failed");
    if (limit.rlim_cur == RLIM_INFINITY) return kUnlimited;
    const std::optional<std::string> status = ReadFile("/proc/self/status");
    const std::optional<int64_t> mapped =
        status ? ProcField(*status, "VmSize") : std::optional<int64_t>();
    if (!mapped) return Unavailable("cannot read VmSize of /proc/self/status");
    return std::max<int64_t>(0, static_cast<int64_t>(limit.rlim_cur) - *mapped);
  }

  StatusOr<int64_t> FreeFileSystemBytes(const std::string& directory) const override {
    struct statvfs fs {};
    if (statvfs(directory.c_str(), &fs) != 0) return Unavailable("cannot statvfs " + directory);
    return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  }

  StatusOr<int64_t> FreeDeviceBytes(Backend& backend) const override {
    return backend.FreeDeviceBytes();
  }
};

Status Refuse(const AllocationNeed& need, std::string_view memory, int64_t available,
              std::string_view available_word, std::string_view remedy) {
  std::string message = std::string(need.what) + ": ";
  if (!need.sizing.empty()) message += std::string(need.sizing) + " ";
  message += "needs " + FormatBytes(need.bytes) + " of " + std::string(memory) + ", " +
             FormatBytes(available) + " " + std::string(available_word);
  if (!remedy.empty()) message += "; " + std::string(remedy);
  return ResourceExhausted(std::move(message));
}

}  // namespace

const MachineCapacity& SystemCapacity() {
  static const MachineCapacity* system = new LinuxCapacity();
  return *system;
}

Status CheckHostMemory(const AllocationNeed& need, const MachineCapacity& machine) {
  if (need.bytes < kCapacityCheckedBytes) return Status::Ok();
  if (const StatusOr<int64_t> host = machine.AvailableHostBytes();
      host.ok() && need.bytes > *host) {
    return Refuse(need, "host memory", *host, "is available", need.remedy);
  }
  if (const StatusOr<int64_t> space = machine.AvailableAddressSpace();
      space.ok() && need.bytes > *space) {
    return Refuse(need, "address space", *space, "more may be mapped by this process (ulimit -v)",
                  need.remedy);
  }
  return Status::Ok();
}

Status CheckHostMemory(const AllocationNeed& need, Backend& backend,
                       const MachineCapacity& machine) {
  const StatusOr<int64_t> reserved = backend.ReservedHostBytes();
  if (!reserved.ok()) return CheckHostMemory(need, machine);
  if (need.bytes > *reserved) {
    return Refuse(need, "the host memory " + backend.name() + " reserved", *reserved, "is left",
                  need.remedy);
  }
  return Status::Ok();
}

Status CheckSharedMemory(const AllocationNeed& need, const std::string& directory,
                         const MachineCapacity& machine) {
  if (need.bytes < kCapacityCheckedBytes) return Status::Ok();
  if (const StatusOr<int64_t> free = machine.FreeFileSystemBytes(directory);
      free.ok() && need.bytes > *free) {
    return Refuse(need, directory, *free, "is free there", need.remedy);
  }
  return CheckHostMemory(need, machine);
}

Status CheckDeviceMemory(const AllocationNeed& need, Backend& backend,
                         const MachineCapacity& machine) {
  if (need.bytes < kCapacityCheckedBytes) return Status::Ok();
  if (const StatusOr<int64_t> free = machine.FreeDeviceBytes(backend);
      free.ok() && need.bytes > *free) {
    const std::string memory = backend.kind() == BackendKind::kCpu
                                   ? "host memory (the CPU backend's device memory)"
                                   : "device memory on " + backend.name();
    return Refuse(need, memory, *free, "is free", need.remedy);
  }
  return Status::Ok();
}

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while ((value >= 1000 || value <= -1000) && unit < 6) {
    value /= 1000;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(text, sizeof(text), "%.2f %s", value, units[unit]);
  }
  return text;
}

}  // namespace sparsekv
