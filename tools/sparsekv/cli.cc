#include "tools/sparsekv/cli.h"

#include <CLI/CLI.hpp>
#include <vector>

#include "tools/sparsekv/bench/bench_command.h"
#include "tools/sparsekv/multi_turn/multi_turn.h"
#include "tools/sparsekv/plan/plan_command.h"
#include "tools/sparsekv/pool/pool_command.h"
#include "tools/sparsekv/replay/replay_command.h"

namespace sparsekv::tools {
namespace {

// The command line as a shell would accept it, for the JSON record.
std::string Quote(std::span<const std::string> args) {
  std::string line = "sparsekv";
  for (const std::string& a : args) {
    const bool plain = !a.empty() && a.find_first_of(" \t\"'\\$`") == std::string::npos;
    line += plain ? " " + a : " '" + a + "'";
  }
  return line;
}

}  // namespace

int RunCli(std::span<const std::string> args, std::ostream& out, std::ostream& err,
           bool progress_bar) {
  CLI::App app("sparsekv: sparse-attention KV offloading (host KV pool + HBM hot cache).",
               "sparsekv");
  app.require_subcommand(1);
  app.set_version_flag("--version", SPARSEKV_VERSION);
  BenchCommand bench(app);
  PlanCommand plan(app);
  ReplayCommand replay(app);
  MultiTurnCommand multi_turn(app);
  PoolCommand pool(app);

  // A first word that names no subcommand (CLI11 would say only that one is required).
  // No subcommand, or a first word that names none: say which there are.
  std::string names;
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known = known || (!args.empty() && sub->get_name() == args[0]);
  }
  if (args.empty() || (!args[0].starts_with("-") && !known)) {
    err << "sparsekv: "
        << (args.empty() ? std::string("a subcommand is required")
                         : "unknown subcommand '" + args[0] + "'")
        << "; the subcommands are " << names << "\nRun with --help for more information.\n";
    return kExitUsage;
  }
  // CLI11 consumes its arguments from the back.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, out, err);
    return code == 0 ? kExitOk : kExitUsage;
  }
  const int code = [&] {
    if (bench.selected()) return bench.Run(Quote(args), out, err, progress_bar);
    if (plan.selected()) return plan.Run(Quote(args), out, err);
    if (replay.selected()) return replay.Run(Quote(args), out, err, progress_bar);
    if (multi_turn.selected()) return multi_turn.Run(Quote(args), out, err, progress_bar);
    if (pool.selected()) return pool.Run(out, err);
    return kExitUsage;  // unreachable: require_subcommand(1)
  }();
  // A report that did not reach its reader (a full disk, a closed pipe) is a failed run.
  out.flush();
  if (!out && code == kExitOk) {
    err << "sparsekv: cannot write the output (standard output failed)\n";
    return kExitFailure;
  }
  return code;
}

}  // namespace sparsekv::tools
