#include "tools/sparsekv/common/output_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace sparsekv::tools {

Status CheckOutputPath(std::string_view option, const std::string& path) {
  if (path.empty()) return Status::Ok();
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  // "a": creates the file if needed and never truncates what is there.
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) {
    return InvalidArgument(std::string(option) + ": cannot open '" + path +
                           "' for writing: " + std::strerror(errno));
  }
  std::fclose(file);
  if (!existed) std::filesystem::remove(path, ec);
  return Status::Ok();
}

Status WriteOutputFile(const std::string& path, std::string_view text, std::string_view what) {
  const auto failed = [&](const char* step) {
    return Unavailable("cannot write " + std::string(what) + " to '" + path + "' (" + step + ": " +
                       std::strerror(errno) + ")");
  };
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return failed("open");
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const int write_errno = errno;
  const bool closed = std::fclose(file) == 0;
  if (!written) {
    errno = write_errno;
    return failed("write");
  }
  if (!closed) return failed("close");
  return Status::Ok();
}

}  // namespace sparsekv::tools
