-- Removes the live holders of a lock, all of them, those of one owner, or
-- the one with a given fencing token (an operator's release of a stuck key), tells their Lockers on the channel and
-- wakes waiters. A removed holder can no longer be renewed or released, and
-- every later acquire gets a greater fencing token. Safe to run twice: the
-- call's count is remembered for a grace period as "e:<call id>:<count>",
-- so a repeat returns what the first run removed. Each removed holder leaves
-- "x:<token>" until its lease would have ended plus the grace period, so that
-- its renewal (renew.lua, extend.lua) can tell it was released by force.
-- Takes 3 keys and 7 arguments, laid out by evictArgs (backend.go); they are
-- named here, once.
-- KEYS[1] holders_key: ZSET (see acquire_core.lua), after promote.lua
-- KEYS[2] waiters_key: ZSET of every waiter; nobody is woken when it does
--         not exist
-- KEYS[3] fence_key: STRING, the last fencing token (see acquire_core.lua);
--         raised to the greatest token removed, so the next one is greater
--         even after a backward step of the server clock
-- ARGV[1] owner      the owner whose holders are removed, "" for every holder
-- ARGV[2] channel    release channel
-- ARGV[3] call       call id
-- ARGV[4] grace      ms
-- ARGV[5] token      fencing token of the one holder to remove, "0" for any
-- ARGV[6] operators  the operators' channel of the Locker prefix
-- ARGV[7] lock       the lock's key, as the Locker names it (for the
--                    operators' channel: "<length of lock>:<lock><notice>",
--                    the notice as on the key's channel)
-- Returns the number of holders the call removed.
local holders_key, waiters_key, fence_key = KEYS[1], KEYS[2], KEYS[3]
local owner = ARGV[1]
local channel = ARGV[2]
local call = ARGV[3]
local grace = tonumber(ARGV[4])
local token_text = ARGV[5]
local operators = ARGV[6]
local lock = ARGV[7]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
promote(holders_key, fence_key)
local rec = 'e:' .. call .. ':'
for _, m in ipairs(redis.call('ZRANGEBYSCORE', holders_key, '-inf', '(' .. -now)) do
  if string.sub(m, 1, #rec) == rec then
    return tonumber(string.sub(m, #rec + 1))
  end
end
local n, top, last = 0, 0, now
local live = redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local m, until_ = live[i], math.floor(tonumber(live[i + 1]))
  local token, o = string.match(m, '^(%d+):[^:]*:(.*):[^:]*$')
  if token and (owner == '' or o == owner) and (token_text == '0' or token == token_text) then
    redis.call('ZREM', holders_key, m)
    redis.call('ZADD', holders_key, -(until_ + grace), 'x:' .. token)
    n = n + 1
    top = math.max(top, tonumber(token))
    last = math.max(last, until_)
  end
end
if n == 0 then
  return 0
end
if tonumber(redis.call('GET', fence_key) or '0') < top then
  redis.call('SET', fence_key, string.format('%d', top), 'PX', 1000)
end
redis.call('ZADD', holders_key, -(now + grace), rec .. n)
if redis.call('PTTL', holders_key) < last - now + grace then
  redis.call('PEXPIRE', holders_key, last - now + grace)
end
local notice = 't' .. token_text
if token_text == '0' then
  notice = 'f' .. string.format('%d', top) .. ':' .. owner
end
redis.call('PUBLISH', channel, notice)
-- Every Locker of the prefix listens on the operators' channel, so the
-- removed holders' work is cancelled at once, watched or not.
redis.call('PUBLISH', operators, #lock .. ':' .. lock .. notice)
if redis.call('EXISTS', waiters_key) == 1 then
  redis.call('PUBLISH', channel, '1')
end
return n
