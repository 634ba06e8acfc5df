-- The completion section of a release script (see release.lua, which names
-- the arguments and keys): the lease's
-- label is recorded as completed, so that an acquire of it is refused (-2)
-- and a release does not hand the key to a waiter of it.
-- KEYS[1] holders_key: "done:<label>" scored -(when it is forgotten); the key
--         kept at least as long
-- ARGV[5] done_label: the label to record as completed (escaped), "" for none
-- ARGV[6] done_for: how long the completion is remembered (ms)
-- It replies nothing of its own.
-- @done
if done_label ~= '' then
  done = done_for
  redis.call('ZADD', holders_key, -(now + done), 'done:' .. done_label)
end
