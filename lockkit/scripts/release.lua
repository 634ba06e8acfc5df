-- Removes one holder if it is still held, and wakes waiters. Runs after
-- promote.lua. Safe to run
-- twice: the released holder is remembered for a grace period in a key of
-- its own, so a repeat returns 1 as the first run did while the holders key
-- goes away with its last holder (and the next acquire takes the fast path).
-- KEYS[1] holders: ZSET (see acquire_core.lua)
-- KEYS[2] waiters: ZSET of every waiter; nobody is woken when it does not exist
-- KEYS[3] cover: STRING (see acquire_coalesce.lua)
-- KEYS[4] released: ZSET of released members, scored by when they are
--         forgotten (ms)
-- KEYS[5] queue: ZSET of fair waiters (see acquire_core.lua)
-- KEYS[6] fence: STRING, the last fencing token (see acquire_core.lua)
-- KEYS[7] parked: ZSET of parked jobs (see acquire_park.lua)
-- KEYS[8] the lease's record of a plain release (see plain_release.lua)
-- ARGV[1] the lease's member, or "" to find the live holder by acquire id
-- ARGV[2] acquire id
-- ARGV[3] release channel
-- ARGV[4] grace (ms): how long the released member is remembered
-- ARGV[5] label to record as completed (escaped), "" for none
-- ARGV[6] how long the completion is remembered (ms)
-- ARGV[7] with ARGV[1] "": how long an acquire with this id stays refused
--         when no holder has it (ms); it may still be on its way (x:<id>)
-- ARGV[8] how long to remember that this holder's run succeeded (ms), "0"
--         for no record (a Coalesce lease whose run succeeded sets it)
-- ARGV[9] HoldAtLeast (ms): the holder stays, no longer renewed, until its
--         token (its start, in us) plus this, if that is later than now
-- ARGV[10] "1" to reserve the key for the oldest parked job when it is left
--          without a holder and no waiter is handed it
-- When the key is left without a live holder, the next waiter (the head of
-- the fair queue, or else the waiter seen longest ago) is handed the key if
-- it can be: its waiter id is "g<random>:<ttl ms>:<acquire id>:<label>:<owner>"
-- (a plain acquire: limit 1, no epoch or other option), and its label, if
-- any, was not completed. It becomes
-- the holder for that TTL (short: its Locker renews it at once) and is told
-- on the channel with "g<token>:<waiter id>"; otherwise "1" wakes the
-- waiters to try.
-- Returns 1 when released (now or by an earlier run of this release), 0 when
-- the lease had expired or was gone, {1, id} when released and the key was
-- reserved for the parked job id: a reservation holder for the job's hold,
-- with acquire id "r" and the released lease's token, owner "parked:<id>"
-- and the job's label, so that a repeat of this release (while it lives)
-- reports the same id.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
promote(KEYS[1], KEYS[6])
local member = ARGV[1]
if member == '' then
  local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
  for _, m in ipairs(live) do
    if string.find(m, '^%d+:' .. ARGV[2] .. ':') then
      member = m
      break
    end
  end
  if member == '' then
    local keep = tonumber(ARGV[7])
    redis.call('ZADD', KEYS[1], -(now + keep), 'x:' .. ARGV[2])
    if redis.call('PTTL', KEYS[1]) < keep then
      redis.call('PEXPIRE', KEYS[1], keep)
    end
    return 0
  end
end
local released = string.match(member, '^(%d+):') or '0'
-- released_again answers a repeat of a release that ran: 1, or {1, id} if
-- it reserved the key for a parked job and the reservation still lives.
local function released_again()
  if ARGV[10] == '1' then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
      local id = string.match(m, '^%d+:r' .. released .. ':parked:(.*):[^:]*$')
      if id then
        return {1, id}
      end
    end
  end
  return 1
end
local score = redis.call('ZSCORE', KEYS[1], member)
if score and tonumber(score) < -now then
  return 1
end
if not score or tonumber(score) <= now then
  if score then
    redis.call('ZREM', KEYS[1], member)
  end
  local gone = redis.call('ZSCORE', KEYS[4], member)
  if (gone and tonumber(gone) > now) or redis.call('EXISTS', KEYS[8]) == 1 then
    return released_again()
  end
  return 0
end
local keep = tonumber(ARGV[4])
local hold_until = 0
local hold = tonumber(ARGV[9] or '0')
if hold > 0 then
  hold_until = math.floor(tonumber(string.match(member, '^(%d+):')) / 1000) + hold
end
if hold_until > now then
  -- Held at least until hold_until: the holder stays, no longer renewed.
  redis.call('ZADD', KEYS[1], hold_until, member)
  if redis.call('PTTL', KEYS[1]) < hold_until - now then
    redis.call('PEXPIRE', KEYS[1], hold_until - now)
  end
  keep = math.max(keep, hold_until - now + keep)
else
  redis.call('ZREM', KEYS[1], member)
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
redis.call('ZADD', KEYS[4], now + keep, member)
if redis.call('PTTL', KEYS[4]) < keep then
  redis.call('PEXPIRE', KEYS[4], keep)
end
local cover = tonumber(ARGV[8])
if cover > 0 then
  local tok = tonumber(string.match(member, '^(%d+):') or '0')
  if tok > tonumber(redis.call('GET', KEYS[3]) or '0') then
    redis.call('SET', KEYS[3], string.format('%d', tok), 'PX', cover)
  end
end
local done = 0
if ARGV[5] ~= '' then
  done = tonumber(ARGV[6])
  redis.call('ZADD', KEYS[1], -(now + done), 'done:' .. ARGV[5])
end
-- The holders key lives as long as its longest live holder or record:
-- without a live holder, only as long as its records; with none, not at all.
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #top > 0 then
  if tonumber(top[2]) <= now then
    local bottom = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    redis.call('PEXPIRE', KEYS[1], math.max(1, -tonumber(bottom[2]) - now))
  elseif redis.call('PTTL', KEYS[1]) < done then
    redis.call('PEXPIRE', KEYS[1], done)
  end
end

-- take adds a holder (as acquire.lua does) and returns its token.
local function take(aid, owner, label, ttl)
  local token = string.format('%d', math.max(tonumber(redis.call('GET', KEYS[6]) or '0') + 1, nowus))
  redis.call('ZADD', KEYS[1], now + ttl, token .. ':' .. aid .. ':' .. owner .. ':' .. label)
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  redis.call('SET', KEYS[6], token, 'PX', 1000)
  return token
end

-- grant hands the unheld key to the next waiter, if it is a plain acquire.
local function grant()
  local wid
  if redis.call('EXISTS', KEYS[5]) == 1 then
    wid = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
    local seen = wid and redis.call('ZSCORE', KEYS[2], wid)
    if not seen or tonumber(seen) <= now then
      return false
    end
  else
    wid = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'LIMIT', 0, 1)[1]
  end
  if not wid then
    return false
  end
  local gttl, aid, label, owner = string.match(wid, '^g[^:]*:(%d+):([^:]+):([^:]*):(.*)$')
  if not gttl or redis.call('ZSCORE', KEYS[1], 'x:' .. aid) or
      (label ~= '' and redis.call('ZSCORE', KEYS[1], 'done:' .. label)) then
    return false
  end
  local token = take(aid, owner, label, tonumber(gttl))
  redis.call('ZREM', KEYS[2], wid)
  redis.call('ZREM', KEYS[5], wid)
  redis.call('PUBLISH', ARGV[3], 'g' .. token .. ':' .. wid)
  return true
end
-- settle leaves the last token in a holders key this release left empty,
-- as plain_release.lua does, so that a plain acquire's token is greater.
local function settle()
  if redis.call('EXISTS', KEYS[1]) == 0 then
    local fence = math.max(tonumber(released), tonumber(redis.call('GET', KEYS[6]) or '0'))
    leave_token(KEYS[1], string.format('%d', fence))
  end
  return 1
end
if hold_until > now then
  return 1
end
local waiting = redis.call('EXISTS', KEYS[2]) == 1
local parking = ARGV[10] == '1' and redis.call('EXISTS', KEYS[7]) == 1
if not waiting and not parking then
  return settle()
end
local unheld = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') == 0
if waiting then
  if unheld and grant() then
    return 1
  end
  redis.call('PUBLISH', ARGV[3], '1')
end
if parking and unheld then
  -- The oldest parked job whose label was not completed meanwhile.
  while true do
    local p = redis.call('ZPOPMIN', KEYS[7])[1]
    if not p then
      break
    end
    local hold, plabel, id = string.match(p, '^(%d+):([^:]*):(.*)$')
    if hold and not (plabel ~= '' and redis.call('ZSCORE', KEYS[1], 'done:' .. plabel)) then
      take('r' .. released, 'parked:' .. id, plabel, tonumber(hold))
      return {1, id}
    end
  end
end
return settle()
