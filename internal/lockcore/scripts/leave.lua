-- Removes a waiter that gave up, and gives back the key if a release handed
-- it to this waiter meanwhile (release_grant.lua); wakes the others when the
-- waiter was queued (fair) or the key is given back. Safe to run twice.
-- Takes 4 keys and 3 arguments, laid out by leaveArgs (backend.go); they
-- are named here, once.
-- KEYS[1] queue_key: ZSET of fair waiters
-- KEYS[2] waiters_key: ZSET of every waiter
-- KEYS[3] holders_key: ZSET (see acquire_core.lua), after promote.lua
-- KEYS[4] fence_key: STRING, the last fencing token (see promote.lua)
-- ARGV[1] wid      waiter id; it has fields (a ':') when a release may hand
--                  the waiter the key (release_grant.lua)
-- ARGV[2] channel  release channel
-- ARGV[3] aid      the waiter's acquire id
local queue_key, waiters_key, holders_key, fence_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local wid = ARGV[1]
local channel = ARGV[2]
local aid = ARGV[3]
promote(holders_key, fence_key)
redis.call('ZREM', waiters_key, wid)
local wake = redis.call('ZREM', queue_key, wid) == 1
if string.find(wid, ':', 1, true) and redis.call('EXISTS', holders_key) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf')) do
    if string.find(m, '^%d+:' .. aid .. ':') then
      redis.call('ZREM', holders_key, m)
      wake = true
    end
  end
end
if wake then
  redis.call('PUBLISH', channel, '1')
end
return 1
