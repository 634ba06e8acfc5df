-- Takes one start from a key's budget: at most n starts in any window of
-- one period (a sliding log of the starts). Safe to run twice: a start is
-- logged under its call's id, so a repeat of an allowed call finds it and
-- takes no second start.
-- KEYS[1] throttle: ZSET of call ids, scored by when they started (ms,
--         server time)
-- ARGV[1] n
-- ARGV[2] period (ms)
-- ARGV[3] call id
-- Returns 0 when the start is allowed, or how long until one would be (ms,
-- at least 1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local period = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - period)
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  return 0 -- a repeat of a start still in the window
end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], period)
  return 0
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.max(1, tonumber(oldest[2]) + period - now + 1)
