-- Reads a lock's live holders and waiters without changing anything.
-- KEYS[1] holders: ZSET, member "<token>:<owner>", score = expiry (ms)
-- KEYS[2] waiters: ZSET of every waiter, score = deadline (ms)
-- Returns {waiters, member1, ttl1 ms, member2, ttl2 ms, ...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')}
local hs = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #hs, 2 do
  out[#out + 1] = hs[i]
  out[#out + 1] = tonumber(hs[i + 1]) - now
end
return out
