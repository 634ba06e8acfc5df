-- Removes a waiter that gave up, and gives back the key if a release handed
-- it to this waiter meanwhile (release_grant.lua); wakes the others when the
-- waiter was queued (fair) or the key is given back. Safe to run twice.
-- KEYS[1] queue: ZSET of fair waiters
-- KEYS[2] waiters: ZSET of every waiter
-- KEYS[3] holders: ZSET (see acquire_core.lua), after promote.lua
-- KEYS[4] fence: STRING, the last fencing token (see promote.lua)
-- ARGV[1] waiter id
-- ARGV[2] release channel
-- ARGV[3] the waiter's acquire id
promote(KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[2], ARGV[1])
local wake = redis.call('ZREM', KEYS[1], ARGV[1]) == 1
if string.sub(ARGV[1], 1, 1) == 'g' and redis.call('EXISTS', KEYS[3]) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf')) do
    if string.find(m, '^%d+:' .. ARGV[3] .. ':') then
      redis.call('ZREM', KEYS[3], m)
      wake = true
    end
  end
end
if wake then
  redis.call('PUBLISH', ARGV[2], '1')
end
return 1
