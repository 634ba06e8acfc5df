-- Removes one holder if it is still held, and wakes waiters.
-- KEYS[1] holders: ZSET, member "<token>:<owner>", score = expiry (ms)
-- KEYS[2] waiters: ZSET of every waiter; nobody is woken when it does not exist
-- ARGV[1] the lease's member
-- ARGV[2] release channel
-- Returns 1 when the lease was held, 0 when it had expired or was gone.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(score) <= now then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[2], '1')
end
return 1
