-- Removes the live holders of a lock, all of them, those of one owner, or
-- the one with a given fencing token (an operator's release of a stuck key), tells their Lockers on the channel and
-- wakes waiters. A removed holder can no longer be renewed or released, and
-- every later acquire gets a greater fencing token. Safe to run twice: the
-- call's count is remembered for a grace period as "e:<call id>:<count>",
-- so a repeat returns what the first run removed. Each removed holder leaves
-- "x:<token>" until its lease would have ended plus the grace period, so that
-- its renewal (renew.lua, extend.lua) can tell it was released by force.
-- KEYS[1] holders: ZSET (see acquire_core.lua), after promote.lua
-- KEYS[2] waiters: ZSET of every waiter; nobody is woken when it does not exist
-- KEYS[3] fence: STRING, the last fencing token (see acquire_core.lua); raised to
--         the greatest token removed, so the next one is greater even after
--         a backward step of the server clock
-- ARGV[1] owner, "" for every holder
-- ARGV[2] release channel
-- ARGV[3] call id
-- ARGV[4] grace (ms)
-- ARGV[5] fencing token of the one holder to remove, "0" for any
-- ARGV[6] the operators' channel of the Locker prefix
-- ARGV[7] the lock's key, as the Locker names it (for the operators'
--         channel: "<length of key>:<key><notice>", the notice as on the
--         key's channel)
-- Returns the number of holders the call removed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
promote(KEYS[1], KEYS[3])
local rec = 'e:' .. ARGV[3] .. ':'
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. -now)) do
  if string.sub(m, 1, #rec) == rec then
    return tonumber(string.sub(m, #rec + 1))
  end
end
local n, top, last = 0, 0, now
local keep = tonumber(ARGV[4])
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local m, until_ = live[i], math.floor(tonumber(live[i + 1]))
  local token, owner = string.match(m, '^(%d+):[^:]*:(.*):[^:]*$')
  if token and (ARGV[1] == '' or owner == ARGV[1]) and (ARGV[5] == '0' or token == ARGV[5]) then
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZADD', KEYS[1], -(until_ + keep), 'x:' .. token)
    n = n + 1
    top = math.max(top, tonumber(token))
    last = math.max(last, until_)
  end
end
if n == 0 then
  return 0
end
if tonumber(redis.call('GET', KEYS[3]) or '0') < top then
  redis.call('SET', KEYS[3], string.format('%d', top), 'PX', 1000)
end
redis.call('ZADD', KEYS[1], -(now + keep), rec .. n)
if redis.call('PTTL', KEYS[1]) < last - now + keep then
  redis.call('PEXPIRE', KEYS[1], last - now + keep)
end
local notice = 't' .. ARGV[5]
if ARGV[5] == '0' then
  notice = 'f' .. string.format('%d', top) .. ':' .. ARGV[1]
end
redis.call('PUBLISH', ARGV[2], notice)
-- Every Locker of the prefix listens on the operators' channel, so the
-- removed holders' work is cancelled at once, watched or not.
redis.call('PUBLISH', ARGV[6], #ARGV[7] .. ':' .. ARGV[7] .. notice)
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PUBLISH', ARGV[2], '1')
end
return n
