// sparsekv: the command-line tool. Everything but the process boundary lives in cli.cc.
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "tools/sparsekv/cli.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return sparsekv::tools::RunCli(args, std::cout, std::cerr, isatty(STDERR_FILENO) == 1);
}
