-- Sets data_key to a value, fenced (fence.lua names the keys and the first
-- 3 arguments, and the reply).
-- ARGV[4] value
-- ARGV[5] ttl  ms; "0" for none (as SET does, the write drops a TTL
--              data_key had)
-- Replies "" when set.
local r = refused()
if r then
  return r
end
if ARGV[5] == '0' then
  redis.call('SET', data_key, ARGV[4])
else
  redis.call('SET', data_key, ARGV[4], 'PX', ARGV[5])
end
return applied('')
