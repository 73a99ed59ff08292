// The exit codes of `sparsekv`, one convention for every subcommand: 0 when the run did what was
// asked, 1 when the library returned an error Status, 2 when the arguments were wrong.
#pragma once

namespace sparsekv::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the run failed: a Status from the library
inline constexpr int kExitUsage = 2;    // bad arguments

}  // namespace sparsekv::tools
