-- Renews many leases of one server in one call: extend.lua's renewal for
-- each (never shortening a lease). Safe to run twice. On Redis Cluster all
-- the keys of one call are in one hash slot. Its keys and arguments are
-- laid out by renewCommand (backend.go), per lease, in the order of the
-- leases; they are named here, once.
-- KEYS     per lease: holders_key, its holders ZSET (or STRING in the plain
--          form, see plain_acquire.lua), followed by epoch_key, its epoch
--          HASH, when it claimed an epoch (see acquire_core.lua)
-- ARGV[1]  common_ttl  the ttl (ms) of every lease that does not state its
--                      own
-- ARGV[2:] per lease: own_ttl, "!<ttl ms>", only when the lease has another
--          ttl or claimed an epoch (then the ttl is negated: epoch_key
--          follows its holders_key), then member, the lease's member (which
--          starts with a digit, never "!")
-- Returns, per lease, 1 when renewed, 0 when it had expired or was gone, 2
-- when a Preempt acquire preempted it (also after its grace: its
-- "q:<token>" record, see acquire_preempt.lua), 3 when ForceRelease removed it (its
-- "x:<token>" record, see evict.lua), 4 when renewed and an operator asked
-- its run to stop (its "c:<token>" record, see cancel.lua).
local common_ttl = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
local k = 1
local j = 2
local i = 0
while j <= #ARGV do
  local holders_key, epoch_key = KEYS[k], nil
  local ttl = common_ttl
  if string.byte(ARGV[j]) == 33 then
    ttl = tonumber(string.sub(ARGV[j], 2)) -- own_ttl
    j = j + 1
  end
  local member = ARGV[j]
  j = j + 1
  i = i + 1
  k = k + 1
  if ttl < 0 then
    ttl, epoch_key = -ttl, KEYS[k]
    k = k + 1
  end
  local score = redis.pcall('ZSCORE', holders_key, member)
  if type(score) == 'table' then
    -- The plain form (see plain_acquire.lua): the STRING is the holder.
    if redis.call('GET', holders_key) == member then
      if redis.call('PTTL', holders_key) < ttl then
        redis.call('PEXPIRE', holders_key, ttl)
      end
      out[i] = 1
    else
      out[i] = 0
    end
  elseif not score or tonumber(score) <= now then
    out[i] = 0
    local token = string.match(member, '^%d+')
    local x = redis.call('ZSCORE', holders_key, 'x:' .. token)
    local q = redis.call('ZSCORE', holders_key, 'q:' .. token)
    if x and -tonumber(x) > now then
      out[i] = 3
    elseif q and -tonumber(q) > now then
      out[i] = 2
    end
  elseif tonumber(score) % 1 ~= 0 then
    out[i] = 2
  else
    redis.call('ZADD', holders_key, 'GT', now + ttl, member)
    if redis.call('PTTL', holders_key) < ttl then
      redis.call('PEXPIRE', holders_key, ttl)
    end
    if epoch_key and redis.call('PTTL', epoch_key) < ttl then
      redis.call('PEXPIRE', epoch_key, ttl)
    end
    out[i] = 1
    if redis.call('ZSCORE', holders_key, 'c:' .. string.match(member, '^%d+')) then
      out[i] = 4
    end
  end
end
return out
