-- Deletes data_key, fenced (fence.lua names the keys and the first 3
-- arguments, and the reply); the fence stays for linger.
-- Replies 1 when data_key existed, else 0.
local r = refused()
if r then
  return r
end
return applied(redis.call('DEL', data_key))
