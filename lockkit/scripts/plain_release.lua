-- Releases a lease held in the plain form of its holders key (see
-- plain_acquire.lua). Safe to run twice: the released token is remembered
-- in a key of its own for the client's retry window, so a repeat returns 1
-- as the first run did even after the key was taken again.
-- KEYS[1] holders: STRING in the plain form, else ZSET (see acquire_core.lua)
-- KEYS[2] released: STRING, present while this lease's release is remembered
-- ARGV[1] the lease's member
-- ARGV[2] grace (ms): how long the release is remembered
-- ARGV[3] "~" and the lease's token: the record it leaves
-- Returns 1 when released (now or by an earlier run of this release), 0 when
-- the lease had expired or was gone, -9 when the holders key is a sorted
-- set: the caller runs release.lua.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then
  return -9
end
if v == ARGV[1] then
  -- The record keeps the token for the next acquire for a second, as the
  -- fence key of acquire_core.lua does.
  redis.call('SET', KEYS[1], ARGV[3], 'PX', 1000)
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  return 1
end
if v == ARGV[3] or redis.call('EXISTS', KEYS[2]) == 1 then
  return 1
end
return 0
