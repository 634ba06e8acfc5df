-- Renews many leases of one server in one call: extend.lua's renewal for
-- each (never shortening a lease). Safe to run twice. On Redis Cluster all
-- the keys of one call are in one hash slot.
-- KEYS     per lease, its holders ZSET (or STRING in the plain form, see
--          plain_acquire.lua), followed by its epoch HASH when it
--          claimed an epoch (see acquire_core.lua)
-- ARGV[1]  the ttl (ms) of every lease that does not state its own
-- ARGV[2:] per lease, its member (which starts with a digit), preceded by
--          "!" and its own ttl when it has another, negated when it
--          claimed an epoch
-- Returns, per lease, 1 when renewed, 0 when it had expired or was gone, 2
-- when a Preempt acquire preempted it (also after its grace: its
-- "q:<token>" record, see acquire_preempt.lua), 3 when ForceRelease removed it (its
-- "x:<token>" record, see evict.lua), 4 when renewed and an operator asked
-- its run to stop (its "c:<token>" record, see cancel.lua).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local common = tonumber(ARGV[1])
local out = {}
local k = 1
local j = 2
local i = 0
while j <= #ARGV do
  local holders, meta = KEYS[k], nil
  local member, ttl = ARGV[j], common
  if string.byte(member) == 33 then
    ttl = tonumber(string.sub(member, 2))
    j = j + 1
    member = ARGV[j]
  end
  j = j + 1
  i = i + 1
  k = k + 1
  if ttl < 0 then
    ttl, meta = -ttl, KEYS[k]
    k = k + 1
  end
  local score = redis.pcall('ZSCORE', holders, member)
  if type(score) == 'table' then
    -- The plain form (see plain_acquire.lua): the STRING is the holder.
    if redis.call('GET', holders) == member then
      if redis.call('PTTL', holders) < ttl then
        redis.call('PEXPIRE', holders, ttl)
      end
      out[i] = 1
    else
      out[i] = 0
    end
  elseif not score or tonumber(score) <= now then
    out[i] = 0
    local token = string.match(member, '^%d+')
    local x = redis.call('ZSCORE', holders, 'x:' .. token)
    local q = redis.call('ZSCORE', holders, 'q:' .. token)
    if x and -tonumber(x) > now then
      out[i] = 3
    elseif q and -tonumber(q) > now then
      out[i] = 2
    end
  elseif tonumber(score) % 1 ~= 0 then
    out[i] = 2
  else
    redis.call('ZADD', holders, 'GT', now + ttl, member)
    if redis.call('PTTL', holders) < ttl then
      redis.call('PEXPIRE', holders, ttl)
    end
    if meta and redis.call('PTTL', meta) < ttl then
      redis.call('PEXPIRE', meta, ttl)
    end
    out[i] = 1
    if redis.call('ZSCORE', holders, 'c:' .. string.match(member, '^%d+')) then
      out[i] = 4
    end
  end
end
return out
