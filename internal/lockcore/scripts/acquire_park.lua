-- The Park sections of an acquire script (see acquire_core.lua, which names
-- the arguments and keys): a call with a
-- parked-queue entry that finds the key held joins the key's parked queue
-- (once); it leaves the queue when it takes the key, or finds its label
-- completed (the work is done: no release is to reserve the key for it).
-- KEYS[7] parked_key: ZSET of parked jobs, "<hold ms>:<label>:<id>" scored by
--         their first park (us); release_park.lua reserves the key for the oldest
-- KEYS[1] holders_key: "s:<label>" marks a parked KeepNewest follow-up that
--         a newer one replaced (acquire_keepnewest.lua): its next parking
--         acquire gives up and consumes it (other calls carrying the label,
--         such as a pass-on's adopt, leave it), recording "S:<acquire id>"
--         for that call, whose repeat gives up too
-- ARGV[17] entry: this call's parked-queue entry
-- ARGV[18] keep: how long the parked queue and the "S:" record are kept (ms)
-- A replaced call's reply is {-5}; a parked call's conflict reply reports
-- the number of parked jobs ahead of it.
-- @park_replaced
if redis.call('ZSCORE', holders_key, 'S:' .. aid) then
  return {-5}
end
if label ~= '' and entry ~= '' and redis.call('ZREM', holders_key, 's:' .. label) == 1 then
  -- A newer follow-up replaced this parked one: it gives up, once.
  redis.call('ZADD', holders_key, -(now + keep), 'S:' .. aid)
  extend_key(holders_key, keep)
  forget_waiter()
  return {-5}
end
-- @completed: the call whose label was completed gives its entry up
if entry ~= '' then
  redis.call('ZREM', parked_key, entry)
end
-- @unpark: the call that took the key was parked if its entry was queued
if entry ~= '' and redis.call('ZREM', parked_key, entry) == 1 then
  was_parked = true
end
-- @park: the call that did not take the key joins the parked queue
if entry ~= '' then
  redis.call('ZADD', parked_key, 'NX', nowus, entry)
  redis.call('PEXPIRE', parked_key, keep)
  keep_sorted(keep)
  parked = redis.call('ZRANK', parked_key, entry)
end
