-- Reads a lock's live holders and waiters without changing anything.
-- Takes 3 keys and 1 argument, laid out by inspectArgs (backend.go); they
-- are named here, once.
-- KEYS[1] holders_key: ZSET (see acquire_core.lua), or STRING in the plain
--         form (see plain_acquire.lua)
-- KEYS[2] waiters_key: ZSET of every waiter, score = deadline (ms)
-- KEYS[3] parked_key: ZSET of parked jobs (see acquire_park.lua)
-- ARGV[1] cancel_keep  how long an operator's request that a run stop is
--                      remembered (ms, see cancel.lua)
-- Returns {waiters, parked jobs, {the first 20 parked entries, oldest
-- first}, member1, ttl1 ms, member2, ttl2 ms, ...}, followed, when an
-- operator asked holders to stop, by {token, ms since it asked, ...}.
local holders_key, waiters_key, parked_key = KEYS[1], KEYS[2], KEYS[3]
local cancel_keep = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {redis.call('ZCOUNT', waiters_key, '(' .. now, '+inf'), redis.call('ZCARD', parked_key),
  redis.call('ZRANGE', parked_key, 0, 19)}
local v = redis.pcall('GET', holders_key)
if type(v) ~= 'table' then
  -- The plain form (see plain_acquire.lua): one holder, or none after a
  -- release ("~<token>").
  if v and string.byte(v) ~= 126 then
    out[4] = v
    out[5] = redis.call('PTTL', holders_key)
  end
  return out
end
local hs = redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf', 'WITHSCORES')
local asked = {}
for i = 1, #hs, 2 do
  out[#out + 1] = hs[i]
  out[#out + 1] = tonumber(hs[i + 1]) - now
  local token = string.match(hs[i], '^%d+')
  local c = token and redis.call('ZSCORE', holders_key, 'c:' .. token)
  if c then
    asked[#asked + 1] = token
    asked[#asked + 1] = now + tonumber(c) + cancel_keep
  end
end
if #asked > 0 then
  out[#out + 1] = asked
end
return out
