-- The Preempt section of an acquire script (see acquire_core.lua): a waiting
-- call's first attempt preempts every live holder not preempted yet. A
-- preempted holder's score gets half a millisecond: extend.lua refuses to
-- renew it, so it expires within its TTL or the grace. Its Locker is told on
-- the release channel ARGV[14] ("p" and the highest token preempted). A holder
-- cut short by the grace leaves "q:<token>" in KEYS[1] until its lease would
-- have ended plus a second, so that a renewal after the grace (its Locker
-- missed the notice) still tells it was preempted.
-- KEYS[1] holders: scores and "q:" records written
-- ARGV[15] "1" on a waiting call's first attempt, otherwise "0"
-- ARGV[16] grace (ms): a preempted holder expires within it; "0" leaves its
--          expiry as it is
-- It replies nothing of its own: the call goes on to wait for the key.
-- @preempt
if ARGV[15] == '1' and wid ~= '' then
  local grace = tonumber(ARGV[16])
  local top = 0
  for i = 1, #live, 2 do
    local exp = tonumber(live[i + 1])
    if exp % 1 == 0 then
      if grace > 0 and now + grace < exp then
        redis.call('ZADD', KEYS[1], -(exp + 1000), 'q:' .. string.match(live[i], '^%d+'))
        extend_key(KEYS[1], exp + 1000 - now)
        exp = now + grace
      end
      redis.call('ZADD', KEYS[1], 'XX', exp + 0.5, live[i])
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
