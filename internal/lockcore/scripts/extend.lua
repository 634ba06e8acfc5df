-- Renews or extends one holder's lease if it is still held. Safe to run twice.
-- KEYS[1] holders: ZSET, or STRING in the plain form (see plain_acquire.lua)
-- KEYS[2] epoch: HASH (last epoch), kept as long as a lease that claimed an epoch
-- ARGV[1] the lease's member
-- ARGV[2] ttl (ms)
-- ARGV[3] "1" when the lease claimed an epoch
-- ARGV[4] "1" for a renewal, which never shortens the lease (a late renewal
--         must not undo a longer Extend); "0" for Extend, which sets it
-- Returns 1 when renewed, 0 when the lease had expired or was gone, 2 when
-- a Preempt acquire preempted it (its score has a fraction, see acquire_preempt.lua),
-- also after its grace (its "q:<token>" record), 3 when ForceRelease removed
-- it (its "x:<token>" record, see evict.lua), 4 when renewed and an
-- operator asked its run to stop (its "c:<token>" record, see cancel.lua).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local score = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(score) == 'table' then
  -- The plain form (see plain_acquire.lua): the STRING is the holder.
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
  end
  if ARGV[4] ~= '1' or redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return 1
end
if not score or tonumber(score) <= now then
  local token = string.match(ARGV[1], '^%d+')
  local x = redis.call('ZSCORE', KEYS[1], 'x:' .. token)
  if x and -tonumber(x) > now then
    return 3
  end
  local q = redis.call('ZSCORE', KEYS[1], 'q:' .. token)
  if q and -tonumber(q) > now then
    return 2
  end
  return 0
end
if tonumber(score) % 1 ~= 0 then
  return 2
end
if ARGV[4] == '1' then
  redis.call('ZADD', KEYS[1], 'GT', now + ttl, ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
end
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
if ARGV[3] == '1' and redis.call('PTTL', KEYS[2]) < ttl then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
if redis.call('ZSCORE', KEYS[1], 'c:' .. string.match(ARGV[1], '^%d+')) then
  return 4
end
return 1
