-- Removes the live holder of a lock that carries a label (a reservation
-- whose work no longer needs it), whoever holds it, and wakes waiters; the
-- entries of the key's parked queue that carry the label leave it (the job
-- is given up: no release is to reserve the key for it). Safe to run twice:
-- "f:<label>" is remembered for a grace period, so a repeat returns 1 as
-- the first run did (the holder's own release then finds nothing:
-- ErrNotHeld), and a parked entry removed is gone.
-- KEYS[1] holders: ZSET (see acquire_core.lua), after promote.lua
-- KEYS[2] waiters: ZSET of every waiter; nobody is woken when it does not exist
-- KEYS[3] fence: STRING, the last fencing token (see promote.lua)
-- KEYS[4] parked: ZSET of parked jobs "<hold ms>:<label>:<id>" (acquire_park.lua)
-- ARGV[1] label (escaped)
-- ARGV[2] release channel
-- ARGV[3] grace (ms)
-- Returns 1 when a holder with the label was removed (now or by an earlier
-- run), 0 when none was live.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
promote(KEYS[1], KEYS[3])
for _, p in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  if string.match(p, '^%d+:([^:]*):') == ARGV[1] then
    redis.call('ZREM', KEYS[4], p)
  end
end
local rec = 'f:' .. ARGV[1]
local suffix = ':' .. ARGV[1]
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
for _, m in ipairs(live) do
  if string.sub(m, -#suffix) == suffix and string.find(m, '^%d+:') then
    local keep = tonumber(ARGV[3])
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZADD', KEYS[1], -(now + keep), rec)
    if redis.call('PTTL', KEYS[1]) < keep then
      redis.call('PEXPIRE', KEYS[1], keep)
    end
    if redis.call('EXISTS', KEYS[2]) == 1 then
      redis.call('PUBLISH', ARGV[2], '1')
    end
    return 1
  end
end
local done = redis.call('ZSCORE', KEYS[1], rec)
if done and tonumber(done) < -now then
  return 1
end
return 0
