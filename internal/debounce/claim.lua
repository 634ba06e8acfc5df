-- Claims a request recorded by debounce.lua: when it is the key's newest
-- (or forced), the open burst is closed, so the next request starts a new
-- one. Safe to run twice.
-- KEYS[1] requests: HASH (see debounce.lua)
-- ARGV[1] the request's generation
-- ARGV[2] "1" to claim even when a newer request is recorded, unless that
--         newest request was claimed already
-- The hash's c is the greatest generation claimed.
-- Returns {1} when claimed, {0, newest generation, its id, its wait (ms),
-- 1 if it was claimed already else 0} when a newer request is recorded.
local s = redis.call('HMGET', KEYS[1], 'g', 'i', 'u', 'c')
if not s[1] then
  return {1}
end
local gen = tonumber(ARGV[1])
local newest_claimed = tonumber(s[4] or '0') >= tonumber(s[1])
if gen >= tonumber(s[1]) or (ARGV[2] == '1' and not newest_claimed) then
  redis.call('HDEL', KEYS[1], 'f')
  if gen > tonumber(s[4] or '0') then
    redis.call('HSET', KEYS[1], 'c', ARGV[1])
  end
  return {1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local claimed = 0
if newest_claimed then
  claimed = 1
end
return {0, s[1], s[2], math.max(tonumber(s[3]) - now, 0), claimed}
