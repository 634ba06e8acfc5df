-- Removes one holder if it is still held, and wakes waiters. Runs after
-- promote.lua; the hand-over (release_grant.lua) and the sections of the
-- release's options (release_hold.lua, release_cover.lua, release_done.lua,
-- release_park.lua), placed at the
-- lines "-- @<place>", do the rest (see releaseSource). Safe to run twice:
-- the released holder is remembered for a grace period, in the released set
-- or, when the release left the key empty, in the holders key as a plain
-- release leaves it, so a repeat returns 1 as the first run did (and the
-- next acquire takes the fast path).
-- KEYS[1] holders: ZSET (see acquire_core.lua)
-- KEYS[2] waiters: ZSET of every waiter; nobody is woken when it does not exist
-- KEYS[3] cover: STRING (release_cover.lua)
-- KEYS[4] released: ZSET of released members, scored by when they are
--         forgotten (ms)
-- KEYS[5] queue: ZSET of fair waiters (see acquire_core.lua)
-- KEYS[6] fence: STRING, the last fencing token (see acquire_core.lua)
-- KEYS[7] parked: ZSET of parked jobs (release_park.lua)
-- KEYS[8] P{K}:d:<token>: the record of this lease's release once moved out
--         of the holders key (see plain_release.lua)
-- ARGV[1] the lease's member, or "" to find the live holder by acquire id
-- ARGV[2] acquire id
-- ARGV[3] release channel
-- ARGV[4] grace (ms): how long the released member is remembered
-- ARGV[5], ARGV[6] the completion record (release_done.lua)
-- ARGV[7] with ARGV[1] "": how long an acquire with this id stays refused
--         when no holder has it (ms); it may still be on its way (x:<id>)
-- ARGV[8] the Coalesce success record (release_cover.lua)
-- ARGV[9] HoldAtLeast (release_hold.lua)
-- ARGV[10] the parked-job reservation (release_park.lua)
-- ARGV[11] "1": the hand-over a held release left for its hold's end
--          (release_park.lua), "0" otherwise
-- When the key is left without a live holder, the next waiter is handed it
-- if it can be (release_grant.lua, in every release script); otherwise "1"
-- on the channel wakes the waiters to try.
-- Returns 1 when released (now or by an earlier run of this release), 0 when
-- the lease had expired or was gone, {1, id} when released and the key was
-- reserved for a parked job, {2, ms} when held for ms more (release_park.lua).
local member, aid, channel, grace = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
-- after_hold: this call is the hand-over of a release held until now
-- (release_park.lua): it goes on as the release would have then.
local after_hold = false
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
promote(KEYS[1], KEYS[6])
if member == '' then
  local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
  for _, m in ipairs(live) do
    if string.find(m, '^%d+:' .. aid .. ':') then
      member = m
      break
    end
  end
  if member == '' then
    local keep = tonumber(ARGV[7])
    redis.call('ZADD', KEYS[1], -(now + keep), 'x:' .. aid)
    if redis.call('PTTL', KEYS[1]) < keep then
      redis.call('PEXPIRE', KEYS[1], keep)
    end
    return 0
  end
end
local released = string.match(member, '^(%d+):') or '0'
local score = redis.call('ZSCORE', KEYS[1], member)
-- The run is over: an operator's request that it stop (cancel.lua) ends.
redis.call('ZREM', KEYS[1], 'c:' .. released)
if score and tonumber(score) < -now then
  return 1
end
if ARGV[11] == '1' and score and tonumber(score) > now then
  -- A hand-over (release_park.lua) before the hold's end by this server's
  -- clock: the holder stays until then.
  return {2, tonumber(score) - now}
end
if not score or tonumber(score) <= now then
  if score then
    redis.call('ZREM', KEYS[1], member)
  end
  local gone = redis.call('ZSCORE', KEYS[4], member)
  if not ((gone and tonumber(gone) > now) or redis.call('EXISTS', KEYS[8]) == 1) then
    return 0
  end
  -- A repeat of a release that ran, or the hand-over of a held one.
  -- @released_again
  if not after_hold then
    return 1
  end
end
local keep = grace
-- hold_until, when not 0, is when a holder held at least until then stops
-- being held (release_hold.lua): it stays until then.
local hold_until = 0
-- @hold
if hold_until == 0 then
  redis.call('ZREM', KEYS[1], member)
end
-- remember keeps this release in the released set for keep, so that a
-- repeat returns 1; every return of a release that leaves the key held
-- calls it (a release that leaves the key empty keeps its record in the
-- holders key instead, below).
local function remember()
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  redis.call('ZADD', KEYS[4], now + keep, member)
  if redis.call('PTTL', KEYS[4]) < keep then
    redis.call('PEXPIRE', KEYS[4], keep)
  end
end
-- @cover
local done = 0
-- @done
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
if hold_until > 0 then
  remember()
  -- @held
  return 1
end

local waiting = redis.call('EXISTS', KEYS[2]) == 1
local parking = false
-- @parking
if waiting or parking then
  local unheld = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') == 0
  if waiting then
    -- @grant
    redis.call('PUBLISH', channel, '1')
  end
  -- @reserve
end
-- A holders key this release left empty keeps the last token, so that a
-- plain acquire's token is greater. When the last token is this lease's,
-- the key keeps "~<token>." for keep, as plain_release.lua leaves it: the
-- last token and the record of this release in one key, which promote.lua
-- and plain_acquire.lua move into P{K}:d:<token> should the key be taken
-- again meanwhile (and the fence key, raised from it by promote, goes).
if redis.call('EXISTS', KEYS[1]) == 0 then
  local fence = math.max(tonumber(released), tonumber(redis.call('GET', KEYS[6]) or '0'))
  if fence == tonumber(released) then
    redis.call('SET', KEYS[1], '~' .. released .. '.', 'PX', keep)
    redis.call('DEL', KEYS[6])
    return 1
  end
  leave_token(KEYS[1], string.format('%d', fence))
end
remember()
return 1
