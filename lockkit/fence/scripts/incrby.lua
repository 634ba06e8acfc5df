-- Adds to the integer at data_key, fenced (fence.lua names the keys and the
-- first 3 arguments, and the reply). A repeat of the call adds nothing.
-- ARGV[4] n  the integer to add
-- Replies the value after the addition, as stored (exact for every int64).
local r = refused()
if r then
  return r
end
redis.call('INCRBY', data_key, ARGV[4])
return applied(redis.call('GET', data_key))
