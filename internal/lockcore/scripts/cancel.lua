-- Asks the runs holding a lock to stop (Locker.CancelRun): an operator's
-- release that keeps the key held until the run returns. Each selected live
-- holder that runs work (not a reservation: is_reservation in promote.lua)
-- gets the record "c:<token>" in holders_key, scored -(when it was
-- asked + keep): its renewals (renew.lua, extend.lua) reply 4 while it
-- lasts, so a Locker that missed the notice still cancels the run at its
-- next renewal; Inspect reports it (inspect.lua); the holder's release
-- removes it (release.lua). Nothing else changes: the holder is still
-- renewed and released by its Locker, which hands the key on then. Every
-- Locker of the prefix is told on the operators' channel,
-- "<length of lock>:<lock>c<token>" per holder asked. Safe to run twice: a
-- record already there is kept (the first request's time stands) and the
-- count is the same.
-- Takes 2 keys and 5 arguments, laid out by cancelArgs (backend.go); they
-- are named here, once.
-- KEYS[1] holders_key: ZSET (see acquire_core.lua), after promote.lua
-- KEYS[2] fence_key: STRING (see acquire_core.lua), for promote
-- ARGV[1] owner      the owner whose runs are asked, "" for every holder
-- ARGV[2] token      fencing token of the one holder to ask, "0" for any
-- ARGV[3] operators  the operators' channel of the Locker prefix
-- ARGV[4] lock       the lock's key, as the Locker names it
-- ARGV[5] keep       how long a request is remembered (ms)
-- Returns the number of live runs selected (asked by this call or before).
local holders_key, fence_key = KEYS[1], KEYS[2]
local owner = ARGV[1]
local token_text = ARGV[2]
local operators = ARGV[3]
local lock = ARGV[4]
local keep = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
promote(holders_key, fence_key)
local n = 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf')) do
  local token, o = string.match(m, '^(%d+):[^:]*:(.*):[^:]*$')
  if token and not is_reservation(m) and (owner == '' or o == owner) and (token_text == '0' or token == token_text) then
    n = n + 1
    if not redis.call('ZSCORE', holders_key, 'c:' .. token) then
      redis.call('ZADD', holders_key, -(now + keep), 'c:' .. token)
    end
    redis.call('PUBLISH', operators, #lock .. ':' .. lock .. 'c' .. token)
  end
end
return n
