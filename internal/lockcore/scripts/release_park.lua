-- The parked-job section of a release script (see release.lua): a release
-- that leaves the key without a holder, and hands it to no waiter, reserves
-- it for the oldest parked job whose label was not completed meanwhile
-- (acquire_park.lua): a reservation holder for the job's hold, with acquire
-- id "r" and the released lease's token, owner "parked:<id>" and the job's
-- label, so that a repeat of this release (while it lives) reports the same
-- id.
-- KEYS[1] holders: the reservation added; read for "done:" records
-- KEYS[6] fence: raised to the reservation's token
-- KEYS[7] parked: ZSET of parked jobs "<hold ms>:<label>:<id>"; the jobs
--         before the one taken (their labels completed) removed with it
-- ARGV[10] "1" to reserve the key for the oldest parked job when it is left
--          without a holder and no waiter is handed it
-- A release held at least a while (release_hold.lua) frees the key at the
-- hold's end, not now: it tells its Locker so, which then hands the key
-- over (ARGV[11] "1"): the release's call again, going on from its record
-- as the release would have then (reserving the key for the oldest job
-- parked by then); one sent before the hold's end by this server's clock is
-- told the time left again (release.lua). A held release that go-redis sent
-- again after the hold's end (its reply lost, so no hand-over will come)
-- goes on the same way.
-- ARGV[11] "1": the hand-over of a held release
-- Returns {1, id} when the key was reserved for the parked job id, now or by
-- an earlier run of this release or hand-over; {2, ms} when the release is
-- held ms more.
-- @released_again
if ARGV[10] == '1' then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
    local id = string.match(m, '^%d+:r' .. released .. ':parked:(.*):[^:]*$')
    if id then
      return {1, id}
    end
  end
  after_hold = ARGV[11] == '1' or tonumber(ARGV[9]) > 0
end
-- @held
if ARGV[10] == '1' then
  return {2, hold_until - now}
end
-- @parking
parking = ARGV[10] == '1' and redis.call('EXISTS', KEYS[7]) == 1
-- @reserve
if parking and unheld then
  while true do
    local p = redis.call('ZPOPMIN', KEYS[7])[1]
    if not p then
      break
    end
    local hold, plabel, id = string.match(p, '^(%d+):([^:]*):(.*)$')
    if hold and not (plabel ~= '' and redis.call('ZSCORE', KEYS[1], 'done:' .. plabel)) then
      take(t, 'r' .. released, 'parked:' .. id, plabel, tonumber(hold))
      remember()
      return {1, id}
    end
  end
end
