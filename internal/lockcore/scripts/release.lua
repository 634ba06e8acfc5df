-- Removes one holder if it is still held, and wakes waiters. Runs after
-- promote.lua; the hand-over (release_grant.lua) and the sections of the
-- release's options (release_hold.lua, release_coalesce.lua, release_done.lua,
-- release_park.lua), placed at the
-- lines "-- @<place>", do the rest (see releaseSource). Safe to run twice:
-- the released holder is remembered for a grace period, in the released set
-- or, when the release left the key empty, in the holders key as a plain
-- release leaves it, so a repeat returns 1 as the first run did (and the
-- next acquire takes the fast path).
-- Every release script takes the same 8 keys and 11 arguments, laid out by
-- releaseArgs (backend.go); they are named here, once, and the rest of the
-- script (the sections too) uses only the names. A boolean argument is "1"
-- for true and "" for false.
-- KEYS[1] holders_key: ZSET (see acquire_core.lua)
-- KEYS[2] waiters_key: ZSET of every waiter; nobody is woken when it does
--         not exist
-- KEYS[3] coalesce_key: STRING (release_coalesce.lua)
-- KEYS[4] released_key: ZSET of released members, scored by when they are
--         forgotten (ms)
-- KEYS[5] queue_key: ZSET of fair waiters (see acquire_core.lua)
-- KEYS[6] fence_key: STRING, the last fencing token (see acquire_core.lua)
-- KEYS[7] parked_key: ZSET of parked jobs (release_park.lua)
-- KEYS[8] plain_released_key: P{K}:d:<token>, the record of this lease's
--         release once moved out of the holders key (see plain_release.lua)
-- ARGV[1]  member          the lease's member, or "" to find the live holder
--                          by acquire id
-- ARGV[2]  aid             acquire id
-- ARGV[3]  channel         release channel
-- ARGV[4]  grace           how long the released member is remembered (ms)
-- ARGV[5]  done_label      the label to record as completed (escaped), ""
--                          for none (release_done.lua)
-- ARGV[6]  done_for        how long the completion is remembered (ms)
-- ARGV[7]  refuse_for      with member "": how long an acquire with this id
--                          stays refused when no holder has it (ms); it may
--                          still be on its way (x:<id>)
-- ARGV[8]  coalesce_for    how long a Coalesce run's success is remembered
--                          (ms), 0 for no record (release_coalesce.lua)
-- ARGV[9]  hold            HoldAtLeast (ms), 0 for none (release_hold.lua)
-- ARGV[10] reserve_parked  boolean: reserve the key for the oldest parked job
--                          (release_park.lua)
-- ARGV[11] hand_over       boolean: the hand-over a held release left for
--                          its hold's end (release_park.lua)
-- When the key is left without a live holder, the next waiter is handed it
-- if it can be (release_grant.lua, in every release script); otherwise "1"
-- on the channel wakes the waiters to try.
-- Returns 1 when released (now or by an earlier run of this release), 0 when
-- the lease had expired or was gone, {1, id} when released and the key was
-- reserved for a parked job, {2, ms} when held for ms more (release_park.lua).
local holders_key, waiters_key, coalesce_key, released_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queue_key, fence_key, parked_key, plain_released_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local member = ARGV[1]
local aid = ARGV[2]
local channel = ARGV[3]
local grace = tonumber(ARGV[4])
local done_label = ARGV[5]
local done_for = tonumber(ARGV[6])
local refuse_for = tonumber(ARGV[7])
local coalesce_for = tonumber(ARGV[8])
local hold = tonumber(ARGV[9])
local reserve_parked = ARGV[10] == '1'
local hand_over = ARGV[11] == '1'
-- after_hold: this call is the hand-over of a release held until now
-- (release_park.lua): it goes on as the release would have then.
local after_hold = false
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
promote(holders_key, fence_key)
if member == '' then
  local live = redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf')
  for _, m in ipairs(live) do
    if string.find(m, '^%d+:' .. aid .. ':') then
      member = m
      break
    end
  end
  if member == '' then
    redis.call('ZADD', holders_key, -(now + refuse_for), 'x:' .. aid)
    if redis.call('PTTL', holders_key) < refuse_for then
      redis.call('PEXPIRE', holders_key, refuse_for)
    end
    return 0
  end
end
local released = string.match(member, '^(%d+):') or '0'
local score = redis.call('ZSCORE', holders_key, member)
-- The run is over: an operator's request that it stop (cancel.lua) ends.
redis.call('ZREM', holders_key, 'c:' .. released)
if score and tonumber(score) < -now then
  return 1
end
if hand_over and score and tonumber(score) > now then
  -- A hand-over (release_park.lua) before the hold's end by this server's
  -- clock: the holder stays until then.
  return {2, tonumber(score) - now}
end
if not score or tonumber(score) <= now then
  if score then
    redis.call('ZREM', holders_key, member)
  end
  local gone = redis.call('ZSCORE', released_key, member)
  if not ((gone and tonumber(gone) > now) or redis.call('EXISTS', plain_released_key) == 1) then
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
  redis.call('ZREM', holders_key, member)
end
-- remember keeps this release in the released set for keep, so that a
-- repeat returns 1; every return of a release that leaves the key held
-- calls it (a release that leaves the key empty keeps its record in the
-- holders key instead, below).
local function remember()
  redis.call('ZREMRANGEBYSCORE', released_key, '-inf', now)
  redis.call('ZADD', released_key, now + keep, member)
  if redis.call('PTTL', released_key) < keep then
    redis.call('PEXPIRE', released_key, keep)
  end
end
-- @coalesce
local done = 0
-- @done
-- The holders key lives as long as its longest live holder or record:
-- without a live holder, only as long as its records; with none, not at all.
local top = redis.call('ZRANGE', holders_key, -1, -1, 'WITHSCORES')
if #top > 0 then
  if tonumber(top[2]) <= now then
    local bottom = redis.call('ZRANGE', holders_key, 0, 0, 'WITHSCORES')
    redis.call('PEXPIRE', holders_key, math.max(1, -tonumber(bottom[2]) - now))
  elseif redis.call('PTTL', holders_key) < done then
    redis.call('PEXPIRE', holders_key, done)
  end
end
if hold_until > 0 then
  remember()
  -- @held
  return 1
end

local waiting = redis.call('EXISTS', waiters_key) == 1
local parking = false
-- @parking
if waiting or parking then
  local unheld = redis.call('ZCOUNT', holders_key, '(' .. now, '+inf') == 0
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
if redis.call('EXISTS', holders_key) == 0 then
  local fence = math.max(tonumber(released), tonumber(redis.call('GET', fence_key) or '0'))
  if fence == tonumber(released) then
    redis.call('SET', holders_key, '~' .. released .. '.', 'PX', keep)
    redis.call('DEL', fence_key)
    return 1
  end
  leave_token(holders_key, string.format('%d', fence))
end
remember()
return 1
