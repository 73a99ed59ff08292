// The `sparsekv` command line: one tool, one subcommand per job (`bench`, `plan`, `replay`,
// `pool`).
//
// RunCli parses, dispatches to the subcommand and returns the process exit code, writing only to
// the given streams, so that tests can drive it like a user would.
#pragma once

#include <ostream>
#include <span>
#include <string>

#include "tools/sparsekv/common/exit_codes.h"

namespace sparsekv::tools {

// `args` are the arguments after the program name. `progress_bar`: draw a progress bar on `err`
// during long runs (pass true only when `err` is a terminal).
int RunCli(std::span<const std::string> args, std::ostream& out, std::ostream& err,
           bool progress_bar);

}  // namespace sparsekv::tools
