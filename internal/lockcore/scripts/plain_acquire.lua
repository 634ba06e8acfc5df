-- Acquires a plain lock (limit 1, no waiting, queue, epoch or other option)
-- in the plain form of its holders key: a STRING holding the one holder,
-- "<token>:<acquire id>:<owner>:<label>", that expires with it; after a
-- release it holds the last token: "~<token>." for the client's retry
-- window after a plain release (plain_release.lua), "~<token>" for a second
-- after a release in the sorted set (promote.lua). The other scripts turn the
-- plain form into the sorted set of acquire.lua first (promote.lua), and
-- acquire.lua keeps the sorted set while waiters, a queue or parked jobs
-- live, so the plain form always means: no one else is waiting. Safe to
-- run twice: a repeat finds the holder its first run added.
-- Takes 1 key and 2 arguments, laid out by plainAcquireArgs (backend.go);
-- they are named here, once.
-- KEYS[1] holders_key: STRING in the plain form, else ZSET (see
--         acquire_core.lua); and, taking the key over a plain release's
--         record, P{K}:d:<token> (the record moved; same hash slot, named
--         after holders_key)
-- ARGV[1] tail  the holder's member after its token:
--               ":<acquire id>:<owner>:<label>"
-- ARGV[2] ttl   ms
-- Returns the token when acquired, {1, token, ttl left (ms)} when an earlier
-- run of this call took it, {0, holder member, its ttl (ms), 1, 0} when held,
-- {-9} when the holders key is a sorted set: the caller runs acquire.lua.
local holders_key = KEYS[1]
local tail = ARGV[1]
local ttl = ARGV[2]
local v = redis.pcall('GET', holders_key)
if type(v) == 'table' then
  return {-9}
end
local fence = 0
if v then
  if string.byte(v) ~= 126 then
    local token = string.match(v, '^%d+')
    if v == token .. tail then
      return {1, token, redis.call('PTTL', holders_key)}
    end
    return {0, v, redis.call('PTTL', holders_key), 1, 0}
  end
  fence = tonumber(string.match(v, '%d+'))
  keep_release(holders_key, v)
end
-- A token is at least the server time in microseconds (as in acquire.lua),
-- and greater than the last one while its record lives.
local t = redis.call('TIME')
local token = string.format('%d', math.max(fence + 1, tonumber(t[1]) * 1000000 + tonumber(t[2])))
redis.call('SET', holders_key, token .. tail, 'PX', ttl)
return token
