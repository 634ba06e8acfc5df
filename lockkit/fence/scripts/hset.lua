-- Sets fields of the hash data_key, fenced (fence.lua names the keys and
-- the first 3 arguments, and the reply).
-- ARGV[4..] field, value, field, value, ...
-- Replies the number of fields added, as HSET.
local r = refused()
if r then
  return r
end
return applied(redis.call('HSET', data_key, unpack(ARGV, 4)))
