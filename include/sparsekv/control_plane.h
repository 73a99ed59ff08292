// ControlPlane: the shared state of a scale-out KV pool, kept in a Redis server.
//
// Three kinds of record (docs/scale-out.md):
//   - Membership. A node (a pool server, a prefill or a decode instance) registers under a name
//     with a lease; it stays a member while it heartbeats within the lease. A name has at most
//     one live member: registering a name whose lease is live is refused, so two processes never
//     take a name from each other. Every registration gets a new *incarnation* (monotonic per
//     name), so that a restarted process is told apart from the one that died: records written
//     by an old incarnation are refused. A process whose lease lapsed (the server was unreachable
//     for longer than a lease, or restarted and lost its state) but whose memory did not change
//     rejoins under its incarnation, so records of it stay valid.
//   - Region descriptors. The opaque strings of Transport::ExportRegion, published by a member
//     under (node, region id). They live and expire with the member's lease.
//   - Request locations. Where the prompt rows of a request live (node, incarnation, region and
//     the row layout inside it), with the ownership protocol
//
//       Publish -> ready(g) -Bind-> ready(g), reader bound -Done-> ready(g), done -Release-> gone
//
//     The writer publishes a location: the record becomes ready with generation g (monotonic per
//     request key, never reused, even after a release). Readers Bind (refused unless the record
//     is ready and its node is a live member of the same incarnation) and get the location and g;
//     each binding has a lease, renewed by RenewBinding. A reader calls Done when it will read no
//     more. The writer's Release is refused while any reader's binding is live; only after a
//     successful Release may the writer reuse the region's rows. Any call naming a generation
//     other than the current one fails with FailedPrecondition ("stale generation").
//
// Safety argument: a reader reads rows only between a successful Bind and its Done; if Done
// succeeds, the binding was live until then, so Release could not have succeeded, and the node
// was the same live incarnation, so the rows were not reused (by the writer, or by a restarted
// node) while the reader read them. If Done reports an expired binding, the reader must
// discard what it read after the lease ran out (it may be stale). Leases are measured on the
// Redis server's clock, so clients need no synchronised clocks.
//
// Every transition is one Redis Lua script (atomic on the server). Every call has a deadline:
// hiredis connect and command timeouts from ControlPlaneOptions; a call that cannot reach the
// server returns Unavailable, one that gets no answer in time DeadlineExceeded, and the next call
// reconnects.
//
// Thread safety: a ControlPlane is thread-safe (calls on one object are serialised on its single
// connection). Several objects, in one process or many, may share a server and a key prefix.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sparsekv/status.h"

namespace sparsekv {

struct ControlPlaneOptions {
  // ---- Behaviour ----
  std::string host = "127.0.0.1";  // Redis server address (numeric IPv4/IPv6 or a host name)
  int port = 6379;
  // Every key this client reads or writes starts with "<key_prefix>:", so that several pools (or
  // tests) can share one Redis server without seeing each other.
  std::string key_prefix = "sparsekv";
  // Deadline to establish (or re-establish) the TCP connection.
  std::chrono::milliseconds connect_timeout{1000};
  // Deadline for one command's reply.
  std::chrono::milliseconds command_timeout{1000};
};

// A live member, as ListNodes/GetNode report it.
struct NodeInfo {
  std::string node_id;       // the name given to RegisterNode
  uint64_t incarnation = 0;  // of the registration that is live now; >= 1
  std::string address;       // free-form contact information given at registration
};

// Where a request's prompt rows live. The row of (layer, position) is at byte offset
//   base_offset + layer * layer_stride + position * row_stride
// of region `region_id` of node `node_id`, for layer < layers and position < tokens, and is
// row_bytes long. Or, for a prompt in a node pool (node_pool.h; node_pool_owner >= 0): region
// `region_id` of node `node_id` is the node pool (its descriptor is NodePoolDescriptor's), and
// the rows are the pages owner node_pool_owner sealed as node_pool_seal (the offsets and strides
// are then 0). The control plane stores these fields; it does not interpret them.
struct RequestLocation {
  std::string node_id;            // the node whose registered memory holds the rows
  uint64_t node_incarnation = 0;  // the incarnation of node_id that holds them; Bind checks it
  uint32_t region_id = 0;         // as published with PublishRegion by that node
  uint64_t base_offset = 0;
  uint64_t layer_stride = 0;
  uint64_t row_stride = 0;
  int32_t row_bytes = 0;
  int32_t layers = 0;
  int32_t tokens = 0;  // the prompt length
  // A prompt sealed in a node pool: the writer's owner and seal (HostKVPool::Seal); -1 and 0 for
  // any other location.
  int32_t node_pool_owner = -1;
  uint64_t node_pool_seal = 0;

  bool operator==(const RequestLocation&) const = default;
};

// What Bind returns: the location and the generation every later call must name.
struct Binding {
  RequestLocation location;
  uint64_t generation = 0;  // >= 1
};

class ControlPlane {
 public:
  // Connects to the server and checks that it answers. Unavailable or DeadlineExceeded if it
  // does not within the deadlines; InvalidArgument for an empty host or key prefix, a port outside
  // [1, 65535] or a non-positive timeout.
  static StatusOr<std::unique_ptr<ControlPlane>> Connect(const ControlPlaneOptions& options);
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // Every call below may also fail with Unavailable (server unreachable or connection lost),
  // DeadlineExceeded (no answer before the command deadline) or Internal (an unexpected reply);
  // then nothing can be assumed about whether it took effect, except for the read-only calls.
  // Strings are binary-safe (descriptors may hold NUL bytes).

  // ---- Membership ----
  // Makes `node_id` a member for `lease` and returns its new incarnation (previous + 1, from 1).
  // AlreadyExists if `node_id` is a live member (its lease has not run out): the message names
  // the id, the live incarnation and its address, and the live member is left as it was. Once
  // that lease has run out (or after Deregister) registering succeeds, and the old incarnation's
  // heartbeats fail with FailedPrecondition. InvalidArgument for an empty id or a lease < 1 ms.
  StatusOr<uint64_t> RegisterNode(const std::string& node_id, const std::string& address,
                                  std::chrono::milliseconds lease);
  // Makes (node_id, incarnation) a member again for `lease`, keeping the incarnation: for a
  // process that registered as `incarnation`, whose lease lapsed (Heartbeat said NotFound, e.g.
  // the server was unreachable for longer than the lease or restarted without its data) and
  // whose memory is unchanged, so that records naming it stay valid. Its regions must be
  // published again. OK (and the lease extended) if it is still the live member.
  // AlreadyExists if another incarnation of `node_id` is live; FailedPrecondition if a newer
  // incarnation has registered since (the caller was taken over and must stop serving under
  // this id). After a server restart the incarnation counter resumes from `incarnation`, so a
  // later RegisterNode still gets a larger one. InvalidArgument for an empty id, incarnation 0
  // or a lease < 1 ms.
  Status Rejoin(const std::string& node_id, uint64_t incarnation, const std::string& address,
                std::chrono::milliseconds lease);
  // Extends the lease of (node_id, incarnation) to `lease` from now. NotFound if the lease has
  // already expired (the node is no longer a member and must register again, as a new
  // incarnation); FailedPrecondition if a newer incarnation has registered since.
  Status Heartbeat(const std::string& node_id, uint64_t incarnation,
                   std::chrono::milliseconds lease);
  // Ends the membership of (node_id, incarnation) and drops its regions. NotFound if it is not a
  // member; FailedPrecondition if a newer incarnation is the member.
  Status Deregister(const std::string& node_id, uint64_t incarnation);
  // The live members, sorted by node_id.
  StatusOr<std::vector<NodeInfo>> ListNodes();
  // NotFound if `node_id` is not a live member (never registered, deregistered, lease expired).
  StatusOr<NodeInfo> GetNode(const std::string& node_id);

  // ---- Region descriptors ----
  // Publishes (or replaces) the descriptor of region `region_id` of member (node_id,
  // incarnation); it expires with the membership. NotFound / FailedPrecondition as Heartbeat.
  Status PublishRegion(const std::string& node_id, uint64_t incarnation, uint32_t region_id,
                       const std::string& descriptor);
  // The descriptor of a live member's region. NotFound if the node is not a live member or has
  // not published that region. `incarnation`, if not null, receives the member's incarnation.
  StatusOr<std::string> GetRegion(const std::string& node_id, uint32_t region_id,
                                  uint64_t* incarnation = nullptr);

  // ---- Request locations (ownership protocol) ----
  // Writer: records where request `request_key`'s rows are and makes it ready; returns its new
  // generation. FailedPrecondition if a record for the key exists (Release it first);
  // FailedPrecondition if location.node_id is not a live member of incarnation
  // location.node_incarnation; InvalidArgument for an empty key or node id, layers/tokens/
  // row_bytes < 1, or a node pool owner without a seal (or a seal without an owner).
  StatusOr<uint64_t> Publish(const std::string& request_key, const RequestLocation& location);
  // Reader: binds `reader` (a name unique among the key's readers, e.g. "<node>/<request>") to
  // the ready record for `lease`. Binding again while bound renews the lease and returns the same
  // binding. NotFound if no record exists for the key; Unavailable if the record's node is not a
  // live member of the recorded incarnation (its rows are lost: the request must be recomputed);
  // InvalidArgument for an empty key or reader or a lease < 1 ms.
  StatusOr<Binding> Bind(const std::string& request_key, const std::string& reader,
                         std::chrono::milliseconds lease);
  // The calls below that name a generation fail with FailedPrecondition ("stale generation") if
  // it is not the record's current one, including when the record of that generation has been
  // released; NotFound if the key never had a record of that generation.
  //
  // Reader: extends a live binding to `lease` from now. FailedPrecondition also for an expired
  // or unknown binding (the reader must discard what it read after expiry); Unavailable if the
  // record's node is no longer the live member of the recorded incarnation. The binding ends if
  // another incarnation of the node is live; while no incarnation is (the node's lease lapsed and
  // it may Rejoin), it is kept, so that a reader may retry until its own lease runs out. After a
  // server restart the record and its bindings are gone: NotFound or FailedPrecondition.
  Status RenewBinding(const std::string& request_key, const std::string& reader,
                      uint64_t generation, std::chrono::milliseconds lease);
  // Reader: ends its binding. OK only if the binding was live until now and the record's node is
  // still the live member of the recorded incarnation (so every row read under it was valid);
  // FailedPrecondition also for an expired or unknown binding, Unavailable if the node is gone.
  // Either way the binding has ended.
  Status Done(const std::string& request_key, const std::string& reader, uint64_t generation);
  // Writer: deletes the record, after which the rows may be reused. FailedPrecondition also while
  // any reader's binding is live (the message says how many); expired bindings do not block it.
  Status Release(const std::string& request_key, uint64_t generation);
  // The record as it is now, without binding: the location and the current generation. NotFound
  // if none exists. `live_readers`, if not null, receives the number of live bindings;
  // `done_readers` the number of Done calls of this generation (a writer that hands a request to
  // one reader releases once done_readers >= 1, so that it never releases before the reader came).
  StatusOr<Binding> Lookup(const std::string& request_key, int64_t* live_readers = nullptr,
                           int64_t* done_readers = nullptr);

 private:
  struct Connection;
  explicit ControlPlane(const ControlPlaneOptions& options);

  ControlPlaneOptions options_;
  std::unique_ptr<Connection> connection_;
};

}  // namespace sparsekv
