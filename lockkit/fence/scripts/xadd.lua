-- Appends an entry to the stream data_key with an ID that Redis picks,
-- fenced (fence.lua names the keys and the first 3 arguments, and the
-- reply). A repeat of the call appends nothing.
-- ARGV[4..] field, value, field, value, ...
-- Replies the entry's ID.
local r = refused()
if r then
  return r
end
return applied(redis.call('XADD', data_key, '*', unpack(ARGV, 4)))
