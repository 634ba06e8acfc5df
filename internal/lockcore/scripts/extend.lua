-- Renews or extends one holder's lease if it is still held. Safe to run twice.
-- Takes 2 keys and 4 arguments, laid out by extendArgs (backend.go); they
-- are named here, once. A boolean argument is "1" for true and "" for false.
-- KEYS[1] holders_key: ZSET, or STRING in the plain form (see
--         plain_acquire.lua)
-- KEYS[2] epoch_key: HASH (last epoch), kept as long as a lease that claimed
--         an epoch
-- ARGV[1] member  the lease's member
-- ARGV[2] ttl     ms
-- ARGV[3] epoch   boolean: the lease claimed an epoch
-- ARGV[4] renew   boolean: a renewal, which never shortens the lease (a late
--                 renewal must not undo a longer Extend); false for Extend,
--                 which sets it
-- Returns 1 when renewed, 0 when the lease had expired or was gone, 2 when
-- a Preempt acquire preempted it (its score has a fraction, see acquire_preempt.lua),
-- also after its grace (its "q:<token>" record), 3 when ForceRelease removed
-- it (its "x:<token>" record, see evict.lua), 4 when renewed and an
-- operator asked its run to stop (its "c:<token>" record, see cancel.lua).
local holders_key, epoch_key = KEYS[1], KEYS[2]
local member = ARGV[1]
local ttl = tonumber(ARGV[2])
local epoch = ARGV[3] == '1'
local renew = ARGV[4] == '1'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.pcall('ZSCORE', holders_key, member)
if type(score) == 'table' then
  -- The plain form (see plain_acquire.lua): the STRING is the holder.
  if redis.call('GET', holders_key) ~= member then
    return 0
  end
  if not renew or redis.call('PTTL', holders_key) < ttl then
    redis.call('PEXPIRE', holders_key, ttl)
  end
  return 1
end
local token = string.match(member, '^%d+')
if not score or tonumber(score) <= now then
  local x = redis.call('ZSCORE', holders_key, 'x:' .. token)
  if x and -tonumber(x) > now then
    return 3
  end
  local q = redis.call('ZSCORE', holders_key, 'q:' .. token)
  if q and -tonumber(q) > now then
    return 2
  end
  return 0
end
if tonumber(score) % 1 ~= 0 then
  return 2
end
if renew then
  redis.call('ZADD', holders_key, 'GT', now + ttl, member)
else
  redis.call('ZADD', holders_key, now + ttl, member)
end
if redis.call('PTTL', holders_key) < ttl then
  redis.call('PEXPIRE', holders_key, ttl)
end
if epoch and redis.call('PTTL', epoch_key) < ttl then
  redis.call('PEXPIRE', epoch_key, ttl)
end
if redis.call('ZSCORE', holders_key, 'c:' .. token) then
  return 4
end
return 1
