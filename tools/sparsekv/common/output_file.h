// The files the `sparsekv` subcommands write (--json, --csv, --write-trace): checked before a
// run, so that a mistyped path fails at once instead of after the whole run, and written with
// every failure reported.
#pragma once

#include <string>
#include <string_view>

#include "sparsekv/status.h"

namespace sparsekv::tools {

// OK if `path` is empty (the option was not given) or a file there can be opened for writing;
// InvalidArgument naming `option` and the reason otherwise. Leaves an existing file as it was
// and removes the file if this check created it.
Status CheckOutputPath(std::string_view option, const std::string& path);

// Replaces the file at `path` with `text`. Unavailable naming `what` ("JSON", "CSV") and the
// path if it cannot be opened, written or closed (a full disk included).
Status WriteOutputFile(const std::string& path, std::string_view text, std::string_view what);

}  // namespace sparsekv::tools
