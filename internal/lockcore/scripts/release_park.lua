-- The parked-job section of a release script (see release.lua, which names
-- the arguments and keys): a release
-- that leaves the key without a holder, and hands it to no waiter, reserves
-- it for the oldest parked job whose label was not completed meanwhile
-- (acquire_park.lua): a reservation holder for the job's hold, with acquire
-- id "r" and the released lease's token, owner "parked:<id>" and the job's
-- label, so that a repeat of this release (while it lives) reports the same
-- id.
-- KEYS[1] holders_key: the reservation added; read for "done:" records
-- KEYS[6] fence_key: raised to the reservation's token
-- KEYS[7] parked_key: ZSET of parked jobs "<hold ms>:<label>:<id>"; the jobs
--         before the one taken (their labels completed) removed with it
-- ARGV[10] reserve_parked: reserve the key for the oldest parked job when it is left
--          without a holder and no waiter is handed it
-- A release held at least a while (release_hold.lua) frees the key at the
-- hold's end, not now: it tells its Locker so, which then hands the key
-- over (hand_over): the release's call again, going on from its record
-- as the release would have then (reserving the key for the oldest job
-- parked by then); one sent before the hold's end by this server's clock is
-- told the time left again (release.lua). A held release that go-redis sent
-- again after the hold's end (its reply lost, so no hand-over will come)
-- goes on the same way.
-- ARGV[11] hand_over: the hand-over of a held release
-- Returns {1, id} when the key was reserved for the parked job id, now or by
-- an earlier run of this release or hand-over; {2, ms} when the release is
-- held ms more.
-- @released_again
if reserve_parked then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf')) do
    local id = string.match(m, '^%d+:r' .. released .. ':parked:(.*):[^:]*$')
    if id then
      return {1, id}
    end
  end
  after_hold = hand_over or hold > 0
end
-- @held
if reserve_parked then
  return {2, hold_until - now}
end
-- @parking
parking = reserve_parked and redis.call('EXISTS', parked_key) == 1
-- @reserve
if parking and unheld then
  while true do
    local p = redis.call('ZPOPMIN', parked_key)[1]
    if not p then
      break
    end
    local phold, plabel, id = string.match(p, '^(%d+):([^:]*):(.*)$')
    if phold and not (plabel ~= '' and redis.call('ZSCORE', holders_key, 'done:' .. plabel)) then
      take(holders_key, fence_key, t, 'r' .. released, 'parked:' .. id, plabel, tonumber(phold))
      remember()
      return {1, id}
    end
  end
end
