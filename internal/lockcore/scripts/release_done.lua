-- The completion section of a release script (see release.lua): the lease's
-- label is recorded as completed, so that an acquire of it is refused (-2)
-- and a release does not hand the key to a waiter of it.
-- KEYS[1] holders: "done:<label>" scored -(when it is forgotten); the key
--         kept at least as long
-- ARGV[5] label to record as completed (escaped), "" for none
-- ARGV[6] how long the completion is remembered (ms)
-- It replies nothing of its own.
-- @done
if ARGV[5] ~= '' then
  done = tonumber(ARGV[6])
  redis.call('ZADD', KEYS[1], -(now + done), 'done:' .. ARGV[5])
end
