-- Sets fields of the hash data_key, fenced (fence.lua names the keys and
-- the first 3 arguments, and the reply).
-- ARGV[4..] field, value, field, value, ...
-- Replies the number of fields added, as HSET.
local r = refused()
if r then
  return r
end
-- In chunks of 1000 values (whole pairs, from ARGV[4]): Lua's unpack
-- returns fewer than 8000 values at once.
local added = 0
for i = 4, #ARGV, 1000 do
  added = added + redis.call('HSET', data_key, unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return applied(added)
