// The `pool` subcommand: a pool server. It allocates one region of host memory, registers it
// with a UCX transport, publishes the region's descriptor and its membership in the control plane
// (Redis), heartbeats its lease, and progresses the transport in wakeup mode (blocking on the
// transport's event fd, never busy polling) until SIGTERM or SIGINT, then deregisters and exits
// 0 (docs/scale-out.md). If its lease lapses it rejoins as the same incarnation. Peers read and
// write the region with one-sided operations; which bytes belong to which request is decided by the
// writers and recorded in the control plane.
//
// With --node-pool NAME it serves a node pool instead (sparsekv/node_pool.h; no transport): it
// creates the segment NAME for the geometry given (--layers, --row-bytes, --page-tokens,
// --capacity-tokens, --max-context, --max-owners, --max-processes), publishes its descriptor as
// region 0 (--config FILE: the shape from a CacheOptions file instead, docs/config.md), and every
// heartbeat reclaims the pages of attached processes that died, printing the pool's occupancy when
// it changes. On SIGTERM or SIGINT it detaches (the last process to detach removes the segment's
// file).
//
// With --metrics-port PORT it also serves Prometheus metrics at http://HOST:PORT/metrics
// (pool_metrics.h; docs/metrics.md): its heartbeat failures, rejoins and reclaimed processes and,
// for a node pool, the pool's occupancy, published at every heartbeat.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace sparsekv::tools {

class PoolCommand {
 public:
  // Adds the `pool` subcommand and its options to `parent`, which must outlive this object.
  explicit PoolCommand(CLI::App& parent);
  bool selected() const;
  // Serves until SIGTERM or SIGINT (it installs handlers for both). Returns an exit code (cli.h):
  // kExitFailure if the transport, the region (or node pool) or the control plane cannot be set
  // up, if the node
  // id is already a live member (refused at once, the live one keeps it), or if another process
  // took the id while this one's lease had lapsed (it then stops serving).
  // REQUIRES: the command line was parsed successfully and selected() is true.
  int Run(std::ostream& out, std::ostream& err);

 private:
  CLI::App* app_;
  std::string node_id_;
  std::string control_plane_ = "127.0.0.1:6379";
  std::string key_prefix_ = "sparsekv";
  int64_t region_mib_ = 256;
  std::string transports_;
  std::string net_devices_;
  int64_t lease_ms_ = 3000;
  int64_t timeout_ms_ = 2000;
  // --node-pool
  std::string node_pool_;
  std::string node_pool_dir_ = "/dev/shm";
  int32_t layers_ = 61;
  int32_t row_bytes_ = 656;
  int32_t page_tokens_ = 64;
  int64_t capacity_tokens_ = 1 << 20;
  int32_t max_context_ = 1 << 17;
  int32_t max_owners_ = 256;
  int32_t max_processes_ = 16;
  std::string config_path_;  // --config: the node pool's shape from a CacheOptions file
  // --metrics-port (-1: no metrics)
  int32_t metrics_port_ = -1;
  std::string metrics_host_ = "0.0.0.0";
};

}  // namespace sparsekv::tools
