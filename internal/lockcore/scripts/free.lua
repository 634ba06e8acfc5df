-- Removes the live holder of a lock that carries a label (a reservation
-- whose work no longer needs it), whoever holds it, and wakes waiters; the
-- entries of the key's parked queue that carry the label leave it (the job
-- is given up: no release is to reserve the key for it). Safe to run twice:
-- "f:<label>" is remembered for a grace period, so a repeat returns 1 as
-- the first run did (the holder's own release then finds nothing:
-- ErrNotHeld), and a parked entry removed is gone.
-- Takes 4 keys and 3 arguments, laid out by freeArgs (backend.go); they are
-- named here, once.
-- KEYS[1] holders_key: ZSET (see acquire_core.lua), after promote.lua
-- KEYS[2] waiters_key: ZSET of every waiter; nobody is woken when it does
--         not exist
-- KEYS[3] fence_key: STRING, the last fencing token (see promote.lua)
-- KEYS[4] parked_key: ZSET of parked jobs "<hold ms>:<label>:<id>"
--         (acquire_park.lua)
-- ARGV[1] label    escaped
-- ARGV[2] channel  release channel
-- ARGV[3] grace    how long the "f:" record is remembered (ms)
-- Returns 1 when a holder with the label was removed (now or by an earlier
-- run), 0 when none was live.
local holders_key, waiters_key, fence_key, parked_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local label = ARGV[1]
local channel = ARGV[2]
local grace = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
promote(holders_key, fence_key)
for _, p in ipairs(redis.call('ZRANGE', parked_key, 0, -1)) do
  if string.match(p, '^%d+:([^:]*):') == label then
    redis.call('ZREM', parked_key, p)
  end
end
local rec = 'f:' .. label
local suffix = ':' .. label
local live = redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf')
for _, m in ipairs(live) do
  if string.sub(m, -#suffix) == suffix and string.find(m, '^%d+:') then
    redis.call('ZREM', holders_key, m)
    redis.call('ZADD', holders_key, -(now + grace), rec)
    if redis.call('PTTL', holders_key) < grace then
      redis.call('PEXPIRE', holders_key, grace)
    end
    if redis.call('EXISTS', waiters_key) == 1 then
      redis.call('PUBLISH', channel, '1')
    end
    return 1
  end
end
local done = redis.call('ZSCORE', holders_key, rec)
if done and tonumber(done) < -now then
  return 1
end
return 0
