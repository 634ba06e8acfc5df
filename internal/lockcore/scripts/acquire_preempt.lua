-- The Preempt section of an acquire script (see acquire_core.lua, which
-- names the arguments and keys): a waiting
-- call's first attempt preempts every live holder not preempted yet. A
-- preempted holder's score gets half a millisecond: extend.lua refuses to
-- renew it, so it expires within its TTL or the grace. Its Locker is told on
-- the release channel ("p" and the highest token preempted). A holder
-- cut short by the grace leaves "q:<token>" in holders_key until its lease would
-- have ended plus a second, so that a renewal after the grace (its Locker
-- missed the notice) still tells it was preempted.
-- KEYS[1] holders_key: scores and "q:" records written
-- ARGV[13] mode 'preempt' and ARGV[15] first: a waiting call's first attempt
-- ARGV[16] grace (ms): a preempted holder expires within it; "0" leaves its
--          expiry as it is
-- It replies nothing of its own: the call goes on to wait for the key.
-- @preempt
if mode == 'preempt' and first and wid ~= '' then
  local top = 0
  for i = 1, #live, 2 do
    local exp = tonumber(live[i + 1])
    if exp % 1 == 0 then
      if grace > 0 and now + grace < exp then
        redis.call('ZADD', holders_key, -(exp + 1000), 'q:' .. string.match(live[i], '^%d+'))
        extend_key(holders_key, exp + 1000 - now)
        exp = now + grace
      end
      redis.call('ZADD', holders_key, 'XX', exp + 0.5, live[i])
      if live[i] == holder then
        holder_exp = exp
      end
      top = math.max(top, tonumber(string.match(live[i], '^(%d+):')))
    end
  end
  if top > 0 then
    redis.call('PUBLISH', channel, 'p' .. string.format('%d', top))
  end
end
