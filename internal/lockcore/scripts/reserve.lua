-- Turns a held lease into a reservation (a holder with the same token and
-- label that runs nothing and is not renewed) that lives for a TTL. Safe to
-- run twice: a repeat finds the reservation and returns 1 as the first run
-- did.
-- Takes 2 keys and 3 arguments, laid out by reserveArgs (backend.go); they
-- are named here, once.
-- KEYS[1] holders_key: ZSET (see acquire_core.lua), after promote.lua
-- KEYS[2] fence_key: STRING, the last fencing token (see promote.lua)
-- ARGV[1] member           the lease's member
-- ARGV[2] reserved_member  the reservation's member
-- ARGV[3] ttl              ms
-- Returns 1 when reserved, 0 when the lease had expired or was gone.
local holders_key, fence_key = KEYS[1], KEYS[2]
local member = ARGV[1]
local reserved_member = ARGV[2]
local ttl = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
promote(holders_key, fence_key)
local score = redis.call('ZSCORE', holders_key, member)
if not score or tonumber(score) <= now then
  local done = redis.call('ZSCORE', holders_key, reserved_member)
  if done and tonumber(done) > now then
    return 1
  end
  return 0
end
redis.call('ZREM', holders_key, member)
redis.call('ZADD', holders_key, now + ttl, reserved_member)
if redis.call('PTTL', holders_key) < ttl then
  redis.call('PEXPIRE', holders_key, ttl)
end
return 1
