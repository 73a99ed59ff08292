#include "sparsekv/control_plane.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <mutex>
#include <string_view>
#include <vector>

#include "control_plane/control_plane_scripts.h"

namespace sparsekv {
namespace {

// Keys, all under "<prefix>:":
//   node:<id>        hash {incarnation, address, region:<n> -> descriptor}; expires with the lease
//   incarnation:<id> counter of registrations of <id>; never expires
//   nodes            set of every id that registered (pruned by ListNodes)
//   request:<key>    hash: the location record (fields kRecordFields); absent when released
//   readers:<key>    sorted set reader -> lease expiry (server clock, ms)
//   generation:<key> counter of publications of <key>; never expires
//
// Scripts report refusals as error replies whose first word is a code (kErrorCodes); every
// other error reply is unexpected. Keys derived from a record's content (its node) cannot be
// declared up front, so those scripts get the node key prefix as an argument (fine for a single
// Redis server, which is what the control plane uses).

using namespace control_plane_scripts;  // the scripts, control_plane_scripts.h

struct ReplyDeleter {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ErrorCode {
  std::string_view word;
  StatusCode code;
};
constexpr ErrorCode kErrorCodes[] = {{"NOTFOUND ", StatusCode::kNotFound},
                                     {"PRECONDITION ", StatusCode::kFailedPrecondition},
                                     {"UNAVAILABLE ", StatusCode::kUnavailable},
                                     {"EXISTS ", StatusCode::kAlreadyExists},
                                     {"INVALID ", StatusCode::kInvalidArgument}};

timeval ToTimeval(std::chrono::milliseconds ms) {
  return {static_cast<time_t>(ms.count() / 1000),
          static_cast<suseconds_t>(ms.count() % 1000 * 1000)};
}

std::string_view Text(const redisReply* reply) {
  return reply->str == nullptr ? std::string_view() : std::string_view(reply->str, reply->len);
}

template <typename T>
bool ParseInt(std::string_view text, T* value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return error == std::errc() && end == text.data() + text.size();
}

// An integer from an integer or string reply element.
template <typename T>
bool ReplyInt(const redisReply* reply, T* value) {
  if (reply->type == REDIS_REPLY_INTEGER) {
    *value = static_cast<T>(reply->integer);
    return true;
  }
  return reply->type == REDIS_REPLY_STRING && ParseInt(Text(reply), value);
}

Status Unexpected(std::string_view what) {
  return Internal("control plane: unexpected reply to " + std::string(what));
}

// The record in the first 1 + kRecordFieldCount elements of an array reply: the generation, then
// kRecordFields.
StatusOr<Binding> ParseRecord(const redisReply* reply, std::string_view what) {
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 1 + kRecordFieldCount) {
    return Unexpected(what);
  }
  redisReply* const* e = reply->element;
  Binding b;
  RequestLocation& l = b.location;
  if (e[1]->type != REDIS_REPLY_STRING) return Unexpected(what);
  l.node_id.assign(Text(e[1]));
  if (!ReplyInt(e[0], &b.generation) || !ReplyInt(e[2], &l.node_incarnation) ||
      !ReplyInt(e[3], &l.region_id) || !ReplyInt(e[4], &l.base_offset) ||
      !ReplyInt(e[5], &l.layer_stride) || !ReplyInt(e[6], &l.row_stride) ||
      !ReplyInt(e[7], &l.row_bytes) || !ReplyInt(e[8], &l.layers) || !ReplyInt(e[9], &l.tokens) ||
      !ReplyInt(e[10], &l.node_pool_owner) || !ReplyInt(e[11], &l.node_pool_seal)) {
    return Unexpected(what);
  }
  return b;
}

Status CheckLease(std::chrono::milliseconds lease) {
  return lease.count() >= 1 ? Status::Ok()
                            : InvalidArgument("control plane: lease must be >= 1 ms");
}

}  // namespace

// One hiredis connection, re-established by the first call after any transport error (after an
// error or timeout a late reply could otherwise be taken for the next command's).
struct ControlPlane::Connection {
  std::mutex mutex;
  redisContext* context = nullptr;  // guarded by mutex; null = not connected

  ~Connection() {
    if (context != nullptr) redisFree(context);
  }
};

namespace {

// True if the peer of the idle connection `fd` has closed it (no reply is pending between
// calls, so anything readable now is the end of the stream or an error).
bool PeerClosed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) != 1) return false;
  if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return true;
  char byte;
  return recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

// Runs one command on `context` (the caller holds the connection's mutex), connecting first if
// needed.
// Refusal error replies become their Status; transport errors drop the connection.
StatusOr<Reply> Run(redisContext*& context, const ControlPlaneOptions& options,
                    const std::vector<std::string_view>& args, std::string_view what) {
  const std::string server = options.host + ":" + std::to_string(options.port);
  if (context != nullptr && PeerClosed(context->fd)) {
    // The server went away since the last call (e.g. it restarted): nothing was sent on this
    // connection yet, so reconnecting first is safe, and the call reaches a restarted server.
    redisFree(context);
    context = nullptr;
  }
  if (context == nullptr) {
    context = redisConnectWithTimeout(options.host.c_str(), options.port,
                                      ToTimeval(options.connect_timeout));
    if (context == nullptr || context->err != 0) {
      const std::string reason = context == nullptr ? "out of memory" : context->errstr;
      if (context != nullptr) redisFree(context);
      context = nullptr;
      return Unavailable("control plane: cannot connect to Redis at " + server + ": " + reason);
    }
    if (redisSetTimeout(context, ToTimeval(options.command_timeout)) != REDIS_OK) {
      const std::string reason = context->errstr;
      redisFree(context);
      context = nullptr;
      return Unavailable("control plane: cannot set timeouts on " + server + ": " + reason);
    }
  }
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  errno = 0;
  Reply reply(static_cast<redisReply*>(
      redisCommandArgv(context, static_cast<int>(argv.size()), argv.data(), lengths.data())));
  const int error = errno;
  if (reply == nullptr) {
    const bool timed_out =
        context->err == REDIS_ERR_IO && (error == EAGAIN || error == EWOULDBLOCK);
    const std::string reason = context->errstr;
    redisFree(context);
    context = nullptr;
    if (timed_out) {
      return DeadlineExceeded("control plane: no reply from Redis at " + server + " within " +
                              std::to_string(options.command_timeout.count()) + " ms (" +
                              std::string(what) + ")");
    }
    return Unavailable("control plane: lost the connection to Redis at " + server + " (" +
                       std::string(what) + "): " + reason);
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string_view text = Text(reply.get());
    for (const ErrorCode& e : kErrorCodes) {
      if (text.starts_with(e.word)) {
        return Status(e.code, "control plane: " + std::string(text.substr(e.word.size())));
      }
    }
    return Internal("control plane: Redis error in " + std::string(what) + ": " +
                    std::string(text));
  }
  return reply;
}

}  // namespace

ControlPlane::ControlPlane(const ControlPlaneOptions& options)
    : options_(options), connection_(std::make_unique<Connection>()) {}

ControlPlane::~ControlPlane() = default;

StatusOr<std::unique_ptr<ControlPlane>> ControlPlane::Connect(const ControlPlaneOptions& options) {
  if (options.host.empty() || options.key_prefix.empty()) {
    return InvalidArgument("control plane: host and key_prefix must not be empty");
  }
  if (options.port < 1 || options.port > 65535) {
    return InvalidArgument("control plane: port " + std::to_string(options.port) +
                           " is outside [1, 65535]");
  }
  if (options.connect_timeout.count() < 1 || options.command_timeout.count() < 1) {
    return InvalidArgument("control plane: timeouts must be >= 1 ms");
  }
  std::unique_ptr<ControlPlane> plane(new ControlPlane(options));
  std::lock_guard lock(plane->connection_->mutex);
  SPARSEKV_ASSIGN_OR_RETURN(Reply reply,
                            Run(plane->connection_->context, options, {"PING"}, "PING"));
  if (reply->type != REDIS_REPLY_STATUS || Text(reply.get()) != "PONG") return Unexpected("PING");
  return plane;
}

namespace {

// Key builders. `p` is the prefix.
std::string NodeKey(const std::string& p, std::string_view id) {
  return p + ":node:" + std::string(id);
}
std::string NodeKeyPrefix(const std::string& p) { return p + ":node:"; }
std::string IncarnationKey(const std::string& p, std::string_view id) {
  return p + ":incarnation:" + std::string(id);
}
std::string NodesKey(const std::string& p) { return p + ":nodes"; }
std::string RecordKey(const std::string& p, std::string_view k) {
  return p + ":request:" + std::string(k);
}
std::string ReadersKey(const std::string& p, std::string_view k) {
  return p + ":readers:" + std::string(k);
}
std::string GenerationKey(const std::string& p, std::string_view k) {
  return p + ":generation:" + std::string(k);
}
std::string RegionField(uint32_t region_id) { return "region:" + std::to_string(region_id); }

std::string Script(std::string_view body) { return std::string(kLuaPrelude) + std::string(body); }

}  // namespace

StatusOr<uint64_t> ControlPlane::RegisterNode(const std::string& node_id,
                                              const std::string& address,
                                              std::chrono::milliseconds lease) {
  if (node_id.empty()) return InvalidArgument("control plane: empty node id");
  SPARSEKV_RETURN_IF_ERROR(CheckLease(lease));
  const std::string& p = options_.key_prefix;
  std::lock_guard lock(connection_->mutex);
  SPARSEKV_ASSIGN_OR_RETURN(
      Reply reply,
      Run(connection_->context, options_,
          {"EVAL", Script(kRegisterScript), "3", NodeKey(p, node_id), IncarnationKey(p, node_id),
           NodesKey(p), node_id, address, std::to_string(lease.count())},
          "RegisterNode"));
  uint64_t incarnation = 0;
  if (!ReplyInt(reply.get(), &incarnation)) return Unexpected("RegisterNode");
  return incarnation;
}

Status ControlPlane::Rejoin(const std::string& node_id, uint64_t incarnation,
                            const std::string& address, std::chrono::milliseconds lease) {
  if (node_id.empty() || incarnation == 0) {
    return InvalidArgument("control plane: Rejoin needs a node id and an incarnation >= 1");
  }
  SPARSEKV_RETURN_IF_ERROR(CheckLease(lease));
  const std::string& p = options_.key_prefix;
  std::lock_guard lock(connection_->mutex);
  return Run(connection_->context, options_,
             {"EVAL", Script(kRejoinScript), "3", NodeKey(p, node_id), IncarnationKey(p, node_id),
              NodesKey(p), node_id, std::to_string(incarnation), address,
              std::to_string(lease.count())},
             "Rejoin")
      .status();
}

Status ControlPlane::Heartbeat(const std::string& node_id, uint64_t incarnation,
                               std::chrono::milliseconds lease) {
  SPARSEKV_RETURN_IF_ERROR(CheckLease(lease));
  std::lock_guard lock(connection_->mutex);
  return Run(connection_->context, options_,
             {"EVAL", Script(kHeartbeatScript), "1", NodeKey(options_.key_prefix, node_id), node_id,
              std::to_string(incarnation), std::to_string(lease.count())},
             "Heartbeat")
      .status();
}

Status ControlPlane::Deregister(const std::string& node_id, uint64_t incarnation) {
  const std::string& p = options_.key_prefix;
  std::lock_guard lock(connection_->mutex);
  return Run(connection_->context, options_,
             {"EVAL", Script(kDeregisterScript), "2", NodeKey(p, node_id), NodesKey(p), node_id,
              std::to_string(incarnation)},
             "Deregister")
      .status();
}

StatusOr<std::vector<NodeInfo>> ControlPlane::ListNodes() {
  const std::string& p = options_.key_prefix;
  std::lock_guard lock(connection_->mutex);
  SPARSEKV_ASSIGN_OR_RETURN(
      Reply reply,
      Run(connection_->context, options_,
          {"EVAL", Script(kListNodesScript), "1", NodesKey(p), NodeKeyPrefix(p)}, "ListNodes"));
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements % 3 != 0) return Unexpected("ListNodes");
  std::vector<NodeInfo> nodes;
  for (size_t i = 0; i < reply->elements; i += 3) {
    NodeInfo node;
    node.node_id.assign(Text(reply->element[i]));
    node.address.assign(Text(reply->element[i + 2]));
    if (!ReplyInt(reply->element[i + 1], &node.incarnation)) return Unexpected("ListNodes");
    nodes.push_back(std::move(node));
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const NodeInfo& a, const NodeInfo& b) { return a.node_id < b.node_id; });
  return nodes;
}

StatusOr<NodeInfo> ControlPlane::GetNode(const std::string& node_id) {
  std::lock_guard lock(connection_->mutex);
  SPARSEKV_ASSIGN_OR_RETURN(
      Reply reply,
      Run(connection_->context, options_,
          {"HMGET", NodeKey(options_.key_prefix, node_id), "incarnation", "address"}, "GetNode"));
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) return Unexpected("GetNode");
  if (reply->element[0]->type == REDIS_REPLY_NIL) {
    return NotFound("control plane: node " + node_id +
                    " is not a member (lease expired or deregistered)");
  }
  NodeInfo node;
  node.node_id = node_id;
  node.address.assign(Text(reply->element[1]));
  if (!ReplyInt(reply->element[0], &node.incarnation)) return Unexpected("GetNode");
  return node;
}

Status ControlPlane::PublishRegion(const std::string& node_id, uint64_t incarnation,
                                   uint32_t region_id, const std::string& descriptor) {
  std::lock_guard lock(connection_->mutex);
  return Run(connection_->context, options_,
             {"EVAL", Script(kPublishRegionScript), "1", NodeKey(options_.key_prefix, node_id),
              node_id, std::to_string(incarnation), RegionField(region_id), descriptor},
             "PublishRegion")
      .status();
}

StatusOr<std::string> ControlPlane::GetRegion(const std::string& node_id, uint32_t region_id,
                                              uint64_t* incarnation) {
  std::lock_guard lock(connection_->mutex);
  SPARSEKV_ASSIGN_OR_RETURN(Reply reply, Run(connection_->context, options_,
                                             {"HMGET", NodeKey(options_.key_prefix, node_id),
                                              "incarnation", RegionField(region_id)},
                                             "GetRegion"));
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) return Unexpected("GetRegion");
  if (reply->element[0]->type == REDIS_REPLY_NIL) {
    return NotFound("control plane: node " + node_id +
                    " is not a member (lease expired or deregistered)");
  }
  if (reply->element[1]->type == REDIS_REPLY_NIL) {
    return NotFound("control plane: node " + node_id + " has not published region " +
                    std::to_string(region_id));
  }
  if (incarnation != nullptr && !ReplyInt(reply->element[0], incarnation)) {
    return Unexpected("GetRegion");
  }
  return std::string(Text(reply->element[1]));
}

StatusOr<uint64_t> ControlPlane::Publish(const std::string& request_key,
                                         const RequestLocation& location) {
  if (request_key.empty() || location.node_id.empty()) {
    return InvalidArgument("control plane: empty request key or node id");
  }
  if (location.layers < 1 || location.tokens < 1 || location.row_bytes < 1) {
    return InvalidArgument("control plane: request " + request_key +
                           ": layers, tokens and row_bytes must be >= 1");
  }
  if (location.node_pool_owner < -1 ||
      (location.node_pool_owner >= 0) != (location.node_pool_seal > 0)) {
    return InvalidArgument("control plane: request " + request_key +
                           ": a node pool location has an owner >= 0 and a seal >= 1, any other "
                           "location owner -1 and seal 0");
  }
  const std::string& p = options_.key_prefix;
  const std::string values[kRecordFieldCount] = {location.node_id,
                                                 std::to_string(location.node_incarnation),
                                                 std::to_string(location.region_id),
                                                 std::to_string(location.base_offset),
                                                 std::to_string(location.layer_stride),
                                                 std::to_string(location.row_stride),
                                                 std::to_string(location.row_bytes),
                                                 std::to_string(location.layers),
                                                 std::to_string(location.tokens),
                                                 std::to_string(location.node_pool_owner),
                                                 std::to_string(location.node_pool_seal)};
  const std::string script = Script(kPublishScript);
  const std::string record = RecordKey(p, request_key), readers = ReadersKey(p, request_key),
                    generations = GenerationKey(p, request_key), node_prefix = NodeKeyPrefix(p);
  std::vector<std::string_view> args = {"EVAL",    script,      "3",         record,
                                        readers,   generations, node_prefix, request_key,
                                        values[0], values[1]};
  for (int i = 0; i < kRecordFieldCount; ++i) {
    args.push_back(kRecordFields[i]);
    args.push_back(values[i]);
  }
  std::lock_guard lock(connection_->mutex);
  SPARSEKV_ASSIGN_OR_RETURN(Reply reply, Run(connection_->context, options_, args, "Publish"));
  uint64_t generation = 0;
  if (!ReplyInt(reply.get(), &generation)) return Unexpected("Publish");
  return generation;
}

StatusOr<Binding> ControlPlane::Bind(const std::string& request_key, const std::string& reader,
                                     std::chrono::milliseconds lease) {
  if (request_key.empty() || reader.empty()) {
    return InvalidArgument("control plane: empty request key or reader");
  }
  SPARSEKV_RETURN_IF_ERROR(CheckLease(lease));
  const std::string& p = options_.key_prefix;
  std::lock_guard lock(connection_->mutex);
  SPARSEKV_ASSIGN_OR_RETURN(
      Reply reply, Run(connection_->context, options_,
                       {"EVAL", Script(kBindScript), "3", RecordKey(p, request_key),
                        ReadersKey(p, request_key), GenerationKey(p, request_key), NodeKeyPrefix(p),
                        request_key, reader, std::to_string(lease.count())},
                       "Bind"));
  return ParseRecord(reply.get(), "Bind");
}

Status ControlPlane::RenewBinding(const std::string& request_key, const std::string& reader,
                                  uint64_t generation, std::chrono::milliseconds lease) {
  SPARSEKV_RETURN_IF_ERROR(CheckLease(lease));
  const std::string& p = options_.key_prefix;
  std::lock_guard lock(connection_->mutex);
  return Run(connection_->context, options_,
             {"EVAL", Script(kRenewBindingScript), "3", RecordKey(p, request_key),
              ReadersKey(p, request_key), GenerationKey(p, request_key), request_key, reader,
              std::to_string(generation), std::to_string(lease.count()), NodeKeyPrefix(p)},
             "RenewBinding")
      .status();
}

Status ControlPlane::Done(const std::string& request_key, const std::string& reader,
                          uint64_t generation) {
  const std::string& p = options_.key_prefix;
  std::lock_guard lock(connection_->mutex);
  return Run(connection_->context, options_,
             {"EVAL", Script(kDoneScript), "3", RecordKey(p, request_key),
              ReadersKey(p, request_key), GenerationKey(p, request_key), request_key, reader,
              std::to_string(generation), NodeKeyPrefix(p)},
             "Done")
      .status();
}

Status ControlPlane::Release(const std::string& request_key, uint64_t generation) {
  const std::string& p = options_.key_prefix;
  std::lock_guard lock(connection_->mutex);
  return Run(connection_->context, options_,
             {"EVAL", Script(kReleaseScript), "3", RecordKey(p, request_key),
              ReadersKey(p, request_key), GenerationKey(p, request_key), request_key,
              std::to_string(generation)},
             "Release")
      .status();
}

StatusOr<Binding> ControlPlane::Lookup(const std::string& request_key, int64_t* live_readers,
                                       int64_t* done_readers) {
  const std::string& p = options_.key_prefix;
  std::lock_guard lock(connection_->mutex);
  SPARSEKV_ASSIGN_OR_RETURN(Reply reply,
                            Run(connection_->context, options_,
                                {"EVAL", Script(kLookupScript), "2", RecordKey(p, request_key),
                                 ReadersKey(p, request_key)},
                                "Lookup"));
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 1) return Unexpected("Lookup");
  if (reply->element[0]->type == REDIS_REPLY_NIL) {
    return NotFound("control plane: no location record for request " + request_key);
  }
  SPARSEKV_ASSIGN_OR_RETURN(Binding binding, ParseRecord(reply.get(), "Lookup"));
  if (reply->elements != 3 + kRecordFieldCount) return Unexpected("Lookup");
  if ((live_readers != nullptr && !ReplyInt(reply->element[1 + kRecordFieldCount], live_readers)) ||
      (done_readers != nullptr && !ReplyInt(reply->element[2 + kRecordFieldCount], done_readers))) {
    return Unexpected("Lookup");
  }
  return binding;
}

}  // namespace sparsekv
