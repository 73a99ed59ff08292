// The control plane's server-side Lua scripts (control_plane.cc runs them with EVAL): each is
// one atomic step of the membership and ownership protocol (include/sparsekv/control_plane.h).
// Keys and refusal codes are described in control_plane.cc.
#pragma once

#include <string_view>

namespace sparsekv::control_plane_scripts {

constexpr std::string_view kLuaPrelude = R"lua(
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function refuse(code, message) return redis.error_reply(code .. ' ' .. message) end
-- nil if (id, incarnation) is the live member stored at key, else the refusal.
local function check_member(key, id, incarnation)
  local current = redis.call('HGET', key, 'incarnation')
  if not current then
    return refuse('NOTFOUND', 'node ' .. id .. ' is not a member (lease expired or deregistered)')
  end
  if tonumber(current) ~= tonumber(incarnation) then
    return refuse('PRECONDITION', 'node ' .. id .. ' is incarnation ' .. current ..
                  ', not ' .. incarnation .. ' (superseded by a newer registration)')
  end
  return nil
end
-- KEYS[1] the record (which exists): nil if its node is still the live member of the recorded
-- incarnation, else the refusal.
local function check_record_node(node_prefix, request, consequence)
  local node, incarnation = unpack(redis.call('HMGET', KEYS[1], 'node', 'incarnation'))
  local current = redis.call('HGET', node_prefix .. node, 'incarnation')
  if current and tonumber(current) == tonumber(incarnation) then return nil end
  return refuse('UNAVAILABLE', 'request ' .. request .. ': node ' .. node .. ' (incarnation ' ..
                incarnation .. ') that holds its rows is no longer a member; ' .. consequence)
end
-- KEYS[1] the record, KEYS[3] the generation counter: nil if `generation` is the record's
-- current one, else the refusal.
local function check_generation(generation, request)
  local current = redis.call('HGET', KEYS[1], 'generation')
  if current and tonumber(current) == tonumber(generation) then return nil end
  local last = tonumber(redis.call('GET', KEYS[3]) or '0')
  if current then
    return refuse('PRECONDITION', 'stale generation ' .. generation .. ' of request ' .. request ..
                  ' (current generation ' .. current .. ')')
  end
  if tonumber(generation) <= last then
    return refuse('PRECONDITION', 'stale generation ' .. generation .. ' of request ' .. request ..
                  ' (released)')
  end
  return refuse('NOTFOUND', 'no location record of generation ' .. generation .. ' for request ' ..
                request)
end
)lua";

// KEYS: node, incarnation counter, nodes set. ARGV: id, address, lease ms. Refused while any
// incarnation of the id is live, so that two processes never take a name from each other.
constexpr std::string_view kRegisterScript = R"lua(
local live = redis.call('HMGET', KEYS[1], 'incarnation', 'address')
if live[1] then
  return refuse('EXISTS', 'node id ' .. ARGV[1] .. ' is taken: incarnation ' .. live[1] ..
                ' (' .. (live[2] or '') .. ') is a live member; a second registration of a ' ..
                'live id is refused (pick another id, or stop the other one)')
end
local incarnation = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'incarnation', incarnation, 'address', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[1])
return incarnation
)lua";

// KEYS: node, incarnation counter, nodes set. ARGV: id, incarnation, address, lease ms. The
// counter is raised to the incarnation if it is behind (it was lost with a server restart).
constexpr std::string_view kRejoinScript = R"lua(
local live = redis.call('HMGET', KEYS[1], 'incarnation', 'address')
if live[1] then
  if tonumber(live[1]) == tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
    return 1
  end
  return refuse('EXISTS', 'node id ' .. ARGV[1] .. ' is taken: incarnation ' .. live[1] ..
                ' (' .. (live[2] or '') .. ') is a live member, not ' .. ARGV[2])
end
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if last > tonumber(ARGV[2]) then
  return refuse('PRECONDITION', 'node ' .. ARGV[1] .. ' incarnation ' .. ARGV[2] ..
                ' was superseded by incarnation ' .. last .. ' while its lease had lapsed')
end
if last < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
redis.call('HSET', KEYS[1], 'incarnation', ARGV[2], 'address', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
)lua";

// KEYS: node. ARGV: id, incarnation, lease ms.
constexpr std::string_view kHeartbeatScript = R"lua(
local refusal = check_member(KEYS[1], ARGV[1], ARGV[2])
if refusal then return refusal end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
)lua";

// KEYS: node, nodes set. ARGV: id, incarnation.
constexpr std::string_view kDeregisterScript = R"lua(
local refusal = check_member(KEYS[1], ARGV[1], ARGV[2])
if refusal then return refusal end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
)lua";

// KEYS: nodes set. ARGV: node key prefix. Returns [id, incarnation, address]... of live members.
constexpr std::string_view kListNodesScript = R"lua(
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local v = redis.call('HMGET', ARGV[1] .. id, 'incarnation', 'address')
  if v[1] then
    table.insert(out, id)
    table.insert(out, v[1])
    table.insert(out, v[2] or '')
  else
    redis.call('SREM', KEYS[1], id)
  end
end
return out
)lua";

// KEYS: node. ARGV: id, incarnation, region field, descriptor.
constexpr std::string_view kPublishRegionScript = R"lua(
local refusal = check_member(KEYS[1], ARGV[1], ARGV[2])
if refusal then return refusal end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
return 1
)lua";

// KEYS: record, readers, generation counter. ARGV: node key prefix, request, node, incarnation,
// then the record's fields as name/value pairs.
constexpr std::string_view kPublishScript = R"lua(
local existing = redis.call('HGET', KEYS[1], 'generation')
if existing then
  return refuse('PRECONDITION', 'request ' .. ARGV[2] .. ' already has a location record ' ..
                '(generation ' .. existing .. '); release it first')
end
local current = redis.call('HGET', ARGV[1] .. ARGV[3], 'incarnation')
if not current or tonumber(current) ~= tonumber(ARGV[4]) then
  return refuse('PRECONDITION', 'node ' .. ARGV[3] .. ' incarnation ' .. ARGV[4] ..
                ' is not a live member')
end
local generation = redis.call('INCR', KEYS[3])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'generation', generation, unpack(ARGV, 5))
return generation
)lua";

// The record's fields, in the order the read scripts return them (after the generation).
constexpr const char* kRecordFields[] = {"node",         "incarnation", "region",    "base",
                                         "layer_stride", "row_stride",  "row_bytes", "layers",
                                         "tokens",       "pool_owner",  "pool_seal"};
constexpr int kRecordFieldCount = sizeof(kRecordFields) / sizeof(kRecordFields[0]);

// KEYS: record, readers, generation counter. ARGV: node key prefix, request, reader, lease ms.
// Returns [generation, kRecordFields...].
constexpr std::string_view kBindScript = R"lua(
local record = redis.call('HMGET', KEYS[1], 'generation', 'node', 'incarnation', 'region', 'base',
                          'layer_stride', 'row_stride', 'row_bytes', 'layers', 'tokens',
                          'pool_owner', 'pool_seal')
if not record[1] then
  return refuse('NOTFOUND', 'no location record for request ' .. ARGV[2])
end
local refusal = check_record_node(ARGV[1], ARGV[2], 'recompute the request')
if refusal then return refusal end
redis.call('ZADD', KEYS[2], now_ms() + tonumber(ARGV[4]), ARGV[3])
return record
)lua";

// KEYS: record, readers, generation counter. ARGV: request, reader, generation, lease ms, node
// key prefix.
constexpr std::string_view kRenewBindingScript = R"lua(
local refusal = check_generation(ARGV[3], ARGV[1])
if refusal then return refusal end
refusal = check_record_node(ARGV[5], ARGV[1], 'discard what was read')
if refusal then
  -- Another incarnation's memory is not the recorded one: the binding is over. With no live
  -- incarnation (a lapsed lease) the node may rejoin as the recorded one: the binding stays.
  if redis.call('EXISTS', ARGV[5] .. redis.call('HGET', KEYS[1], 'node')) == 1 then
    redis.call('ZREM', KEYS[2], ARGV[2])
  end
  return refusal
end
local now = now_ms()
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not expiry or tonumber(expiry) <= now then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return refuse('PRECONDITION', 'reader ' .. ARGV[2] .. ' of request ' .. ARGV[1] ..
                ' is not bound (its binding expired or was never made)')
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[2])
return 1
)lua";

// KEYS: record, readers, generation counter. ARGV: request, reader, generation, node key prefix.
constexpr std::string_view kDoneScript = R"lua(
local refusal = check_generation(ARGV[3], ARGV[1])
if refusal then return refusal end
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'done', 1)
refusal = check_record_node(ARGV[4], ARGV[1], 'discard what was read')
if refusal then return refusal end
if not expiry or tonumber(expiry) <= now_ms() then
  return refuse('PRECONDITION', 'reader ' .. ARGV[2] .. ' of request ' .. ARGV[1] ..
                ' is not bound (its binding expired or was never made): discard what it read')
end
return 1
)lua";

// KEYS: record, readers, generation counter. ARGV: request, generation.
constexpr std::string_view kReleaseScript = R"lua(
local refusal = check_generation(ARGV[2], ARGV[1])
if refusal then return refusal end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms())
local bound = redis.call('ZCARD', KEYS[2])
if bound > 0 then
  return refuse('PRECONDITION', 'request ' .. ARGV[1] .. ' generation ' .. ARGV[2] .. ': ' ..
                bound .. ' reader(s) still bound')
end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
)lua";

// KEYS: record, readers. Returns [generation, kRecordFields..., live readers, done readers].
constexpr std::string_view kLookupScript = R"lua(
local record = redis.call('HMGET', KEYS[1], 'generation', 'node', 'incarnation', 'region', 'base',
                          'layer_stride', 'row_stride', 'row_bytes', 'layers', 'tokens',
                          'pool_owner', 'pool_seal')
if not record[1] then return record end
table.insert(record, redis.call('ZCOUNT', KEYS[2], '(' .. now_ms(), '+inf'))
table.insert(record, tonumber(redis.call('HGET', KEYS[1], 'done') or '0'))
return record
)lua";

}  // namespace sparsekv::control_plane_scripts
