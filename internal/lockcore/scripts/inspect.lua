-- Reads a lock's live holders and waiters without changing anything.
-- KEYS[1] holders: ZSET (see acquire_core.lua), or STRING in the plain form
--         (see plain_acquire.lua)
-- KEYS[2] waiters: ZSET of every waiter, score = deadline (ms)
-- KEYS[3] parked: ZSET of parked jobs (see acquire_park.lua)
-- ARGV[1] how long an operator's request that a run stop is remembered (ms,
--         see cancel.lua); "0" when absent
-- Returns {waiters, parked jobs, {the first 20 parked entries, oldest
-- first}, member1, ttl1 ms, member2, ttl2 ms, ...}, followed, when an
-- operator asked holders to stop, by {token, ms since it asked, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf'), redis.call('ZCARD', KEYS[3]),
  redis.call('ZRANGE', KEYS[3], 0, 19)}
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'table' then
  -- The plain form (see plain_acquire.lua): one holder, or none after a
  -- release ("~<token>").
  if v and string.byte(v) ~= 126 then
    out[4] = v
    out[5] = redis.call('PTTL', KEYS[1])
  end
  return out
end
local hs = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local asked = {}
for i = 1, #hs, 2 do
  out[#out + 1] = hs[i]
  out[#out + 1] = tonumber(hs[i + 1]) - now
  local token = string.match(hs[i], '^%d+')
  local c = token and redis.call('ZSCORE', KEYS[1], 'c:' .. token)
  if c then
    asked[#asked + 1] = token
    asked[#asked + 1] = now + tonumber(c) + tonumber(ARGV[1] or '0')
  end
end
if #asked > 0 then
  out[#out + 1] = asked
end
return out
