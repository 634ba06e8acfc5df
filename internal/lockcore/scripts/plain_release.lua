-- Releases a lease held in the plain form of its holders key (see
-- plain_acquire.lua). The holders key then keeps "~<token>." (the dot: this
-- token's lease was released here) for the client's retry window: the last
-- token, so that the next acquire's is greater, and the record of this
-- release, so that a repeat returns 1 as the first run did. The one who
-- takes the key again within the window moves the record into a key of its
-- own, P{K}:d:<token> (plain_acquire.lua, promote.lua).
-- Takes 2 keys and 3 arguments, laid out by plainReleaseArgs (backend.go);
-- they are named here, once.
-- KEYS[1] holders_key: STRING in the plain form, else ZSET (see
--         acquire_core.lua)
-- KEYS[2] plain_released_key: P{K}:d:<token>, the record once moved
-- ARGV[1] member  the lease's member
-- ARGV[2] grace   ms: the client's retry window
-- ARGV[3] record  "~<token>."
-- Returns 1 when released (now or by an earlier run of this release), 0 when
-- the lease had expired or was gone, -9 when the holders key is a sorted
-- set: the caller runs release.lua.
local holders_key, plain_released_key = KEYS[1], KEYS[2]
local member = ARGV[1]
local grace = ARGV[2]
local record = ARGV[3]
local v = redis.pcall('GET', holders_key)
if type(v) == 'table' then
  return -9
end
if v == member then
  redis.call('SET', holders_key, record, 'PX', grace)
  return 1
end
if v == record or redis.call('EXISTS', plain_released_key) == 1 then
  return 1
end
return 0
