-- The hand-over section of every release script (see release.lua): when the
-- release left the key without a live holder, the next waiter (the head of
-- the fair queue, or else the waiter seen longest ago) is handed the key if
-- it can be: its waiter id is "g<random>:<ttl ms>:<acquire id>:<label>:<owner>"
-- (a plain acquire: limit 1, no epoch or other option), and its label, if
-- any, was not completed. It becomes the holder for that TTL (short: its
-- Locker renews it at once) and is told on the channel with
-- "g<token>:<waiter id>".
-- KEYS[1] holders: the waiter's holder added; read for its "x:" and "done:"
--         records
-- KEYS[2] waiters: the waiter removed
-- KEYS[5] queue: the waiter removed
-- KEYS[6] fence: raised to the waiter's token
-- ARGV[3] release channel
-- Returns 1 when it handed the key over; otherwise the release goes on to
-- wake the waiters.

-- take adds a holder to KEYS[1] (as acquire.lua does) at the server time t,
-- raises the fence KEYS[6] to its token, and returns the token; the grant
-- and the parked-job reservation (release_park.lua) take the key with it.
local function take(t, aid, owner, label, ttl)
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = string.format('%d', math.max(tonumber(redis.call('GET', KEYS[6]) or '0') + 1, nowus))
  redis.call('ZADD', KEYS[1], now + ttl, token .. ':' .. aid .. ':' .. owner .. ':' .. label)
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  redis.call('SET', KEYS[6], token, 'PX', 1000)
  return token
end
-- @grant
if unheld then
  local wid, seen
  if redis.call('EXISTS', KEYS[5]) == 1 then
    wid = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
    seen = wid and redis.call('ZSCORE', KEYS[2], wid)
    seen = seen and tonumber(seen) > now
  else
    wid = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'LIMIT', 0, 1)[1]
    seen = true
  end
  local gttl, gaid, glabel, gowner
  if seen and wid then
    gttl, gaid, glabel, gowner = string.match(wid, '^g[^:]*:(%d+):([^:]+):([^:]*):(.*)$')
  end
  if gttl and not redis.call('ZSCORE', KEYS[1], 'x:' .. gaid) and
      not (glabel ~= '' and redis.call('ZSCORE', KEYS[1], 'done:' .. glabel)) then
    local token = take(t, gaid, gowner, glabel, tonumber(gttl))
    redis.call('ZREM', KEYS[2], wid)
    redis.call('ZREM', KEYS[5], wid)
    redis.call('PUBLISH', channel, 'g' .. token .. ':' .. wid)
    remember()
    return 1
  end
end
