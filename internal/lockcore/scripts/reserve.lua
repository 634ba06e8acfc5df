-- Turns a held lease into a reservation (a Detached holder with the same
-- token and label) that lives for a TTL. Safe to run twice: a repeat finds
-- the reservation and returns 1 as the first run did.
-- KEYS[1] holders: ZSET (see acquire_core.lua), after promote.lua
-- KEYS[2] fence: STRING, the last fencing token (see promote.lua)
-- ARGV[1] the lease's member
-- ARGV[2] the reservation's member
-- ARGV[3] ttl (ms)
-- Returns 1 when detached, 0 when the lease had expired or was gone.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
promote(KEYS[1], KEYS[2])
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
  local done = redis.call('ZSCORE', KEYS[1], ARGV[2])
  if done and tonumber(done) > now then
    return 1
  end
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
