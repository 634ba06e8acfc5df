-- Releases a lease held in the plain form of its holders key (see
-- plain_acquire.lua). The holders key then keeps "~<token>." (the dot: this
-- token's lease was released here) for the client's retry window: the last
-- token, so that the next acquire's is greater, and the record of this
-- release, so that a repeat returns 1 as the first run did. The one who
-- takes the key again within the window moves the record into a key of its
-- own, P{K}:d:<token> (plain_acquire.lua, promote.lua).
-- KEYS[1] holders: STRING in the plain form, else ZSET (see acquire_core.lua)
-- KEYS[2] P{K}:d:<token>: the record once moved
-- ARGV[1] the lease's member
-- ARGV[2] grace (ms): the client's retry window
-- ARGV[3] the record: "~<token>."
-- Returns 1 when released (now or by an earlier run of this release), 0 when
-- the lease had expired or was gone, -9 when the holders key is a sorted
-- set: the caller runs release.lua.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then
  return -9
end
if v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  return 1
end
if v == ARGV[3] or redis.call('EXISTS', KEYS[2]) == 1 then
  return 1
end
return 0
