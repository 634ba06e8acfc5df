-- Renews many leases of one server in one call: extend.lua's renewal for
-- each (never shortening a lease). Safe to run twice. On Redis Cluster all
-- the keys of one call are in one hash slot.
-- KEYS[2i-1], KEYS[2i] lease i's holders ZSET and epoch HASH (see acquire.lua)
-- ARGV[3i-2] lease i's member
-- ARGV[3i-1] its ttl (ms)
-- ARGV[3i]   "1" when it claimed an epoch
-- Returns, per lease, 1 when renewed, 0 when it had expired or was gone, 2
-- when a Preempt acquire preempted it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS / 2 do
  local holders, meta = KEYS[2 * i - 1], KEYS[2 * i]
  local member, ttl = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1])
  local score = redis.call('ZSCORE', holders, member)
  if not score or tonumber(score) <= now then
    out[i] = 0
  elseif tonumber(score) % 1 ~= 0 then
    out[i] = 2
  else
    redis.call('ZADD', holders, 'GT', now + ttl, member)
    if redis.call('PTTL', holders) < ttl then
      redis.call('PEXPIRE', holders, ttl)
    end
    if ARGV[3 * i] == '1' and redis.call('PTTL', meta) < ttl then
      redis.call('PEXPIRE', meta, ttl)
    end
    out[i] = 1
  end
end
return out
