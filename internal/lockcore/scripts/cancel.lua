-- Asks the runs holding a lock to stop (Locker.CancelRun): an operator's
-- release that keeps the key held until the run returns. Each selected live
-- holder that runs work (not a reservation, whose acquire id starts with
-- "r") gets the record "c:<token>" in KEYS[1], scored -(when it was asked +
-- ARGV[5]): its renewals (renew.lua, extend.lua) reply 4 while it lasts, so
-- a Locker that missed the notice still cancels the run at its next
-- renewal; Inspect reports it (inspect.lua); the holder's release removes it
-- (release.lua). Nothing else changes: the holder is still renewed and
-- released by its Locker, which hands the key on then. Every Locker of the
-- prefix is told on the operators' channel, "<length of key>:<key>c<token>"
-- per holder asked. Safe to run twice: a record already there is kept (the
-- first request's time stands) and the count is the same.
-- KEYS[1] holders: ZSET (see acquire_core.lua), after promote.lua
-- KEYS[2] fence: STRING (see acquire_core.lua), for promote
-- ARGV[1] owner, "" for every holder
-- ARGV[2] fencing token of the one holder to ask, "0" for any
-- ARGV[3] the operators' channel of the Locker prefix
-- ARGV[4] the lock's key, as the Locker names it
-- ARGV[5] how long a request is remembered (ms)
-- Returns the number of live runs selected (asked by this call or before).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
promote(KEYS[1], KEYS[2])
local n = 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  local token, aid, owner = string.match(m, '^(%d+):([^:]*):(.*):[^:]*$')
  if token and string.byte(aid) ~= 114 and (ARGV[1] == '' or owner == ARGV[1]) and (ARGV[2] == '0' or token == ARGV[2]) then
    n = n + 1
    if not redis.call('ZSCORE', KEYS[1], 'c:' .. token) then
      redis.call('ZADD', KEYS[1], -(now + tonumber(ARGV[5])), 'c:' .. token)
    end
    redis.call('PUBLISH', ARGV[3], #ARGV[4] .. ':' .. ARGV[4] .. 'c' .. token)
  end
end
return n
