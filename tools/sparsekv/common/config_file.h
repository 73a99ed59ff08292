// `--config FILE`: CacheOptions from a file in sparsekv's own JSON (sparsekv/config.h,
// docs/config.md), for the subcommands that build a cache or a pool.
//
// Precedence, the same for every subcommand: the file sets the fields it names; a flag sets a field
// the file leaves out; a field neither names keeps the subcommand's default. A flag given for a
// field the file names is refused as a conflict (the message names both), so that a run said to
// use the file never differs from it silently.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sparsekv/options.h"
#include "sparsekv/status.h"

namespace sparsekv::tools {

// A flag given on the command line and the CacheOptions key it sets ("--hot-slots", "hot_slots").
struct FlagKey {
  std::string flag;
  std::string key;
};

struct ConfigFile {
  std::string path;               // as given
  std::vector<std::string> keys;  // the file's top-level keys, in its order
  CacheOptions options;           // the file over the subcommand's base, validated
  bool Has(std::string_view key) const;
};

// Reads `path` and returns its options over `base`. `given` lists the flags given on the command
// line that set CacheOptions fields. Every error is InvalidArgument and starts with "--config
// PATH: ": the file cannot be read, is not JSON, has an unknown key, a key twice, a value of the
// wrong type (these name the key, as CacheOptionsFromJson does), or a flag of `given` sets a key
// the file names (the message names the flag and the key). The conflicts are checked before the
// options are validated, with `base` for the fields the file leaves out.
StatusOr<ConfigFile> ReadConfigFile(const std::string& path, const std::vector<FlagKey>& given,
                                    const CacheOptions& base);

}  // namespace sparsekv::tools
