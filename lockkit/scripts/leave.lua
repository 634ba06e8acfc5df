-- Removes a waiter that gave up; wakes the others if it was queued (fair).
-- KEYS[1] queue: ZSET of fair waiters
-- KEYS[2] waiters: ZSET of every waiter
-- ARGV[1] waiter id
-- ARGV[2] release channel
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('PUBLISH', ARGV[2], '1')
end
return 1
