// sparsekv: the command-line tool. Everything but the process boundary lives in cli.cc.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "tools/sparsekv/cli.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const int code = sparsekv::tools::RunCli(args, std::cout, std::cerr, isatty(STDERR_FILENO) == 1);
  // RunCli flushed std::cout; stdout's own buffer is flushed here, and its failure is one too.
  if (std::fflush(stdout) != 0 && code == sparsekv::tools::kExitOk) {
    std::cerr << "sparsekv: cannot write the output (standard output failed)\n";
    return sparsekv::tools::kExitFailure;
  }
  return code;
}
