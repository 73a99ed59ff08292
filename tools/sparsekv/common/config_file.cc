#include "tools/sparsekv/common/config_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sparsekv/config.h"

namespace sparsekv::tools {

bool ConfigFile::Has(std::string_view key) const {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

StatusOr<ConfigFile> ReadConfigFile(const std::string& path, const std::vector<FlagKey>& given,
                                    const CacheOptions& base) {
  const std::string prefix = "--config " + path + ": ";
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return InvalidArgument(prefix + "cannot read the file: it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(prefix + "cannot read the file: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return InvalidArgument(prefix + "cannot read the file: " + std::strerror(errno));
  ConfigFile file;
  file.path = path;
  // The keys, for the conflicts. Text that is not one JSON object is left to
  // CacheOptionsFromJson, whose message says what is wrong with it.
  const nlohmann::ordered_json parsed =
      nlohmann::ordered_json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object()) {
    for (const auto& item : parsed.items()) file.keys.push_back(item.key());
  }
  for (const FlagKey& f : given) {
    if (file.Has(f.key)) {
      return InvalidArgument(prefix + f.flag + " sets \"" + f.key +
                             "\", which the file sets too: a flag may set only what the file "
                             "leaves out; leave out " +
                             f.flag + " or edit the file");
    }
  }
  StatusOr<CacheOptions> options = CacheOptionsFromJson(text.str(), base);
  if (!options.ok()) return InvalidArgument(prefix + options.status().message());
  file.options = *options;
  return file;
}

}  // namespace sparsekv::tools
