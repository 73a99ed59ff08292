// remote_read_bench: batched one-sided reads of KV rows from another process's memory over UCX,
// per transport, against a local memcpy gather of the same rows in the same run
// (docs/scale-out.md).
//
// Two processes on one machine: this one starts a copy of itself with --serve (fork + exec, so
// that no UCX state crosses the fork) that registers a --region_mib MiB region, sends its
// descriptor through a pipe and progresses its transport in wakeup mode (--server_progress busy:
// busy polling instead, to see what wakeups cost). The reader issues
// batches of --rows rows of each --row_bytes size into a registered staging buffer (packed
// densely, as the remote tier stages them) and waits for each batch before the next:
//   random   rows drawn uniformly from the whole region (distinct rows; merging rarely applies);
//   runs16   runs of 16 consecutive rows at random places (a prompt's neighbouring tokens),
//            which adjacent-row merging turns into one read per run.
// Each batch's ranges go through MergeAdjacentRanges. Warm-up, then the median of --reps batches,
// each with a fresh random row set. rows/s = rows / median batch time; GB/s counts row bytes only;
// ratio = GB/s over that of the memcpy gather of the same rows from a local region of the same
// size ("memcpy", the ceiling a remote read cannot beat). The first batch of every configuration
// is checked byte by byte against the server's pattern; wrong bytes make the exit status 1.
// Output: a table on stdout; --json PATH writes the figures, the command line and a "summary"
// object with remote_rows_per_s_{tcp,shm}_{656,1152} (random rows) for scripts/merge_summary.py.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_flags.h"
#include "sparsekv/transport.h"
#include "testing/served_region.h"

namespace sparsekv {
namespace {

using Clock = std::chrono::steady_clock;

using bench::Fail;
using bench::Flags;

template <typename T>
T ValueOrDie(StatusOr<T> result, const char* what) {
  if (!result.ok()) Fail(std::string(what) + ": " + result.status().ToString());
  return std::move(result).value();
}

using testing::PatternByte;

// Every flag and its default.
const std::map<std::string, std::string> kFlags = {{"transports", "tcp,shm"},
                                                   {"row_bytes", "656,1152"},
                                                   {"rows", "2048"},
                                                   {"region_mib", "1024"},
                                                   {"warmup", "20"},
                                                   {"reps", "200"},
                                                   {"seed", "1"},
                                                   {"json", ""},
                                                   {"serve", ""},
                                                   {"fd", "-1"},
                                                   {"patterns", "random,runs16"},
                                                   {"serve_bytes", "0"},
                                                   {"server_progress", "wakeup"}};

UcxTransportOptions TransportOptions(const std::string& transports) {
  UcxTransportOptions options;
  options.transports = transports;
  if (transports == "tcp") options.net_devices = "lo";  // loopback only
  options.operation_timeout = std::chrono::milliseconds(10000);
  return options;
}

// --serve: the region's owner. Runs until killed.
[[noreturn]] void Serve(const std::string& transports, uint64_t bytes, int fd, bool busy) {
  std::vector<std::byte> memory(bytes);
  for (uint64_t i = 0; i < bytes; ++i) memory[i] = PatternByte(i);
  auto transport = ValueOrDie(CreateUcxTransport(TransportOptions(transports)), "transport");
  const RegionHandle region =
      ValueOrDie(transport->RegisterRegion(memory.data(), bytes), "register");
  const std::string descriptor = ValueOrDie(transport->ExportRegion(region), "export");
  if (!testing::WriteDescriptor(fd, descriptor)) Fail("cannot send the descriptor");
  close(fd);
  for (;;) {
    if (busy) {
      transport->Progress().IgnoreError();
    } else {
      // UCX 1.13 over "shm" now and then misses a wakeup (seen here as batches stalled for the
      // whole timeout); a short timeout bounds such a stall at little idle cost.
      transport->WaitForEvents(std::chrono::milliseconds(10)).IgnoreError();
    }
  }
}

// The server process of one transport; killed and reaped on destruction.
class Server {
 public:
  Server(const char* self, const std::string& transports, uint64_t bytes,
         const std::string& progress) {
    int fds[2];
    if (pipe(fds) != 0) Fail("pipe");
    const std::string size = std::to_string(bytes);
    const std::string fd = std::to_string(fds[1]);
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[0]);
      execl(self, self, "--serve", transports.c_str(), "--serve_bytes", size.c_str(), "--fd",
            fd.c_str(), "--server_progress", progress.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    descriptor_ = ValueOrDie(testing::ReadDescriptor(fds[0], std::chrono::seconds(120)),
                             "the server's descriptor");
    close(fds[0]);
  }
  ~Server() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  const std::string& descriptor() const { return descriptor_; }

 private:
  pid_t pid_;
  std::string descriptor_;
};

// `rows` distinct rows (by row index) of the region, in random order, drawn as `pattern`.
std::vector<uint64_t> PickRows(std::mt19937_64& rng, const std::string& pattern, int64_t rows,
                               uint64_t region_rows) {
  const uint64_t run = pattern == "runs16" ? 16 : 1;
  std::uniform_int_distribution<uint64_t> pick(0, region_rows / run - 1);
  std::vector<uint64_t> out;
  std::vector<bool> used(region_rows / run, false);
  while (static_cast<int64_t>(out.size()) < rows) {
    const uint64_t block = pick(rng);
    if (used[block]) continue;
    used[block] = true;
    for (uint64_t i = 0; i < run && static_cast<int64_t>(out.size()) < rows; ++i) {
      out.push_back(block * run + i);
    }
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

// Ranges that stage row i of `rows` at local slot i, merged where adjacent on both sides (rows
// are first sorted so that a run of consecutive rows lands in consecutive slots).
std::vector<CopyRange> StageRanges(std::vector<uint64_t> rows, uint64_t row_bytes) {
  std::sort(rows.begin(), rows.end());
  std::vector<CopyRange> ranges;
  ranges.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    ranges.push_back({rows[i] * row_bytes, i * row_bytes, row_bytes});
  return MergeAdjacentRanges(ranges);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  std::string transport;  // "memcpy" for the local ceiling
  std::string pattern;
  int64_t row_bytes = 0;
  int64_t rows = 0;
  double mean_ranges = 0;  // reads per batch after merging
  double median_us = 0;
  double rows_per_s = 0;
  double gbps = 0;
  double ratio_to_memcpy = 0;
};

int Run(const Flags& flags, const char* self, const std::string& command) {
  // The machine's load when the run started (other processes share its cores).
  std::string load_average;
  std::getline(std::ifstream("/proc/loadavg"), load_average);
  const uint64_t region_bytes = static_cast<uint64_t>(flags.Int("region_mib")) << 20;
  const int64_t rows = flags.Int("rows");
  const int warmup = static_cast<int>(flags.Int("warmup"));
  const int reps = static_cast<int>(flags.Int("reps"));
  const std::vector<int64_t> row_sizes = flags.IntList("row_bytes");
  const std::vector<std::string> patterns = flags.StrList("patterns");
  std::mt19937_64 rng(static_cast<uint64_t>(flags.Int("seed")));
  int64_t wrong_bytes = 0;
  std::vector<Result> results;
  const int64_t max_row = *std::max_element(row_sizes.begin(), row_sizes.end());
  std::vector<std::byte> staging(static_cast<size_t>(rows * max_row));

  // warmup + reps batches of `pattern` rows of `row_bytes`, each gathered by gather(ranges, rep),
  // which returns its time in microseconds; the median as a Result labelled `label`.
  using Gather = std::function<double(const std::vector<CopyRange>&, int rep)>;
  auto measure = [&](const std::string& label, const std::string& pattern, int64_t row_bytes,
                     const Gather& gather) {
    std::vector<double> us;
    double ranges_total = 0;
    for (int rep = 0; rep < warmup + reps; ++rep) {
      const auto picked = PickRows(rng, pattern, rows, region_bytes / row_bytes);
      const auto ranges = StageRanges(picked, row_bytes);
      const double t = gather(ranges, rep);
      if (rep >= warmup) {
        us.push_back(t);
        ranges_total += static_cast<double>(ranges.size());
      }
    }
    Result r{label, pattern, row_bytes, rows, ranges_total / reps, Median(us)};
    r.rows_per_s = static_cast<double>(rows) / (r.median_us * 1e-6);
    r.gbps = r.rows_per_s * static_cast<double>(row_bytes) * 1e-9;
    return r;
  };
  auto microseconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  };

  // The ceiling: the same gathers by memcpy from a local region.
  std::map<std::pair<std::string, int64_t>, double> memcpy_gbps;
  {
    std::vector<std::byte> local(region_bytes);
    for (uint64_t i = 0; i < region_bytes; ++i) local[i] = PatternByte(i);
    for (const std::string& pattern : patterns) {
      for (int64_t row_bytes : row_sizes) {
        Result r =
            measure("memcpy", pattern, row_bytes, [&](const std::vector<CopyRange>& ranges, int) {
              const Clock::time_point start = Clock::now();
              for (const CopyRange& c : ranges) {
                std::memcpy(staging.data() + c.local_offset, local.data() + c.remote_offset,
                            c.length);
              }
              return microseconds_since(start);
            });
        r.ratio_to_memcpy = 1.0;
        memcpy_gbps[{pattern, row_bytes}] = r.gbps;
        results.push_back(r);
      }
    }
  }

  for (const std::string& transports : flags.StrList("transports")) {
    Server server(self, transports, region_bytes, flags.Str("server_progress"));
    auto client = ValueOrDie(CreateUcxTransport(TransportOptions(transports)), "transport");
    const RegionHandle local =
        ValueOrDie(client->RegisterRegion(staging.data(), staging.size()), "register staging");
    const RemoteRegion remote = ValueOrDie(client->ImportRegion(server.descriptor()), "import");
    for (const std::string& pattern : patterns) {
      for (int64_t row_bytes : row_sizes) {
        // The first batch of each configuration is checked byte by byte.
        Result r = measure(
            transports, pattern, row_bytes, [&](const std::vector<CopyRange>& ranges, int rep) {
              if (rep == 0) std::memset(staging.data(), 0, staging.size());
              const Clock::time_point start = Clock::now();
              auto transfer = ValueOrDie(client->Read(remote, local, ranges), "read");
              const Status status = transfer.Wait();
              const double t = microseconds_since(start);
              if (!status.ok()) Fail("read: " + status.ToString());
              if (rep == 0) {
                for (const CopyRange& c : ranges) {
                  for (uint64_t i = 0; i < c.length; ++i) {
                    wrong_bytes += staging[c.local_offset + i] != PatternByte(c.remote_offset + i);
                  }
                }
              }
              return t;
            });
        r.ratio_to_memcpy = r.gbps / memcpy_gbps[{pattern, row_bytes}];
        results.push_back(r);
      }
    }
    client->ReleaseRemote(remote).IgnoreError();
    client->UnregisterRegion(local).IgnoreError();
  }

  std::printf("%-8s %-7s %6s %6s %8s %12s %14s %8s %8s\n", "transport", "pattern", "row_B", "rows",
              "reads", "median_us", "rows_per_s", "GB/s", "x_memcpy");
  std::ostringstream json;
  json << "{\n  \"command\": \"" << command
       << "\",\n  \"cpus\": " << std::thread::hardware_concurrency()
       << ",\n  \"load_average_at_start\": \"" << load_average << "\""
       << ",\n  \"region_bytes\": " << region_bytes << ",\n  \"warmup\": " << warmup
       << ",\n  \"reps\": " << reps << ",\n  \"wrong_bytes\": " << wrong_bytes
       << ",\n  \"results\": [\n";
  std::ostringstream summary;
  bool first_key = true;
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::printf("%-9s %-7s %6lld %6lld %8.1f %12.1f %14.0f %8.3f %8.3f\n", r.transport.c_str(),
                r.pattern.c_str(), static_cast<long long>(r.row_bytes),
                static_cast<long long>(r.rows), r.mean_ranges, r.median_us, r.rows_per_s, r.gbps,
                r.ratio_to_memcpy);
    json << "    {\"transport\": \"" << r.transport << "\", \"pattern\": \"" << r.pattern
         << "\", \"row_bytes\": " << r.row_bytes << ", \"rows\": " << r.rows
         << ", \"reads_per_batch\": " << r.mean_ranges << ", \"median_us\": " << r.median_us
         << ", \"rows_per_s\": " << r.rows_per_s << ", \"gbps\": " << r.gbps
         << ", \"ratio_to_memcpy\": " << r.ratio_to_memcpy << "}"
         << (i + 1 < results.size() ? ",\n" : "\n");
    if (r.pattern == "random" && r.transport != "memcpy") {
      summary << (first_key ? "" : ",\n") << "    \"remote_rows_per_s_" << r.transport << "_"
              << r.row_bytes << "\": " << r.rows_per_s;
      first_key = false;
    }
  }
  json << "  ],\n  \"summary\": {\n" << summary.str() << "\n  }\n}\n";
  if (wrong_bytes > 0)
    std::fprintf(stderr, "WRONG RESULT: %lld wrong bytes\n", static_cast<long long>(wrong_bytes));
  if (!flags.Str("json").empty()) {
    std::ofstream out(flags.Str("json"));
    out << json.str();
    if (!out) Fail("cannot write " + flags.Str("json"));
  }
  return wrong_bytes == 0 ? 0 : 1;
}

}  // namespace
}  // namespace sparsekv

int main(int argc, char** argv) {
  const sparsekv::bench::Flags flags(argc, argv, sparsekv::kFlags);
  if (!flags.Str("serve").empty()) {
    sparsekv::Serve(flags.Str("serve"), static_cast<uint64_t>(flags.Int("serve_bytes")),
                    static_cast<int>(flags.Int("fd")), flags.Str("server_progress") == "busy");
  }
  std::string command;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) command += ' ';
    command += argv[i];
  }
  // /proc/self/exe: the server is this very binary, wherever it was started from.
  return sparsekv::Run(flags, "/proc/self/exe", command);
}
