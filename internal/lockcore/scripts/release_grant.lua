-- The hand-over section of every release script (see release.lua, which
-- names the arguments and keys): when the
-- release left the key without a live holder, the next waiter (the head of
-- the fair queue, or else the waiter seen longest ago) is handed the key if
-- it can be: its waiter id carries the hand-over's terms as its fields,
-- "<id>:<ttl ms>:<acquire id>:<label>:<owner>" (a plain acquire: limit 1,
-- no epoch or other option; the id of any other waiter has no ':'), and its
-- label, if any, was not completed. It becomes the holder for that TTL
-- (short: its Locker renews it at once) and is told on the channel with
-- "g<token>:<waiter id>". The id of a hand-over waiter of the version
-- before starts with "g" (in its <id> field): it is read the same way.
-- KEYS[1] holders_key: the waiter's holder added; read for its "x:" and "done:"
--         records
-- KEYS[2] waiters_key: the waiter removed
-- KEYS[5] queue_key: the waiter removed
-- KEYS[6] fence_key: raised to the waiter's token
-- ARGV[3] channel
-- Returns 1 when it handed the key over; otherwise the release goes on to
-- wake the waiters.

-- take adds a holder to the holders key h (as acquire.lua does) at the
-- server time t, raises the fence key to its token, and returns the token; the grant
-- and the parked-job reservation (release_park.lua) take the key with it.
local function take(h, fence, t, aid, owner, label, ttl)
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = string.format('%d', math.max(tonumber(redis.call('GET', fence) or '0') + 1, nowus))
  redis.call('ZADD', h, now + ttl, token .. ':' .. aid .. ':' .. owner .. ':' .. label)
  if redis.call('PTTL', h) < ttl then
    redis.call('PEXPIRE', h, ttl)
  end
  redis.call('SET', fence, token, 'PX', 1000)
  return token
end
-- @grant
if unheld then
  local wid, seen
  if redis.call('EXISTS', queue_key) == 1 then
    wid = redis.call('ZRANGE', queue_key, 0, 0)[1]
    seen = wid and redis.call('ZSCORE', waiters_key, wid)
    seen = seen and tonumber(seen) > now
  else
    wid = redis.call('ZRANGEBYSCORE', waiters_key, '(' .. now, '+inf', 'LIMIT', 0, 1)[1]
    seen = true
  end
  local gttl, gaid, glabel, gowner
  if seen and wid then
    gttl, gaid, glabel, gowner = string.match(wid, '^[^:]*:(%d+):([^:]+):([^:]*):(.*)$')
  end
  if gttl and not redis.call('ZSCORE', holders_key, 'x:' .. gaid) and
      not (glabel ~= '' and redis.call('ZSCORE', holders_key, 'done:' .. glabel)) then
    local token = take(holders_key, fence_key, t, gaid, gowner, glabel, tonumber(gttl))
    redis.call('ZREM', waiters_key, wid)
    redis.call('ZREM', queue_key, wid)
    redis.call('PUBLISH', channel, 'g' .. token .. ':' .. wid)
    remember()
    return 1
  end
end
