-- The last part of every acquire script (see acquire_core.lua): acquires one
-- holder slot of a lock, or reports why not. Safe to run twice: a repeat with
-- the same acquire id returns the lease the first run took. It touches
-- holders_key, epoch_key (e, d, a, t), queue_key, waiters_key and fence_key
-- (named in acquire_core.lua); the sections of the call's modes, placed at the lines
-- "-- @<place>", touch the rest. The reply's first element says what the
-- others are:
--   1  acquired: {1, token}; {1, token, '0', 1} when the call had been parked
--      (it took_reserved its reservation or found its parked entry); {1, token,
--      ttl left (ms)} when an earlier run of this acquire took it or a
--      release handed it over (release_grant.lua); {1, token, '0', 0 or 1,
--      other tag} when the epoch claimed before carried another tag
--   0  held: {0, holder member, its ttl (ms), holders, waiters ahead, since,
--      parked jobs ahead of a parking call (-1 for none), the parked
--      follow-up that this KeepNewest call replaced ("" for none; a repeat of
--      the call reports it too), the limit that applied (the call's, or a
--      live holder's smaller one)}
--  -1  the epoch was already used: {-1, last epoch, other tag}
-- The other tag is the epoch tag of the key's last claim when it and this
-- call's are not empty and differ; "" otherwise.
--  -2  the label was completed: {-2} (a parking call's entry leaves the
--      parked queue: acquire_park.lua)
--  -3  this acquire call was abandoned: {-3}
--  -4  a Coalesce call is covered: {-4, coverage, covering token, holder
--      member, since} (acquire_coalesce.lua)
--  -5  a KeepNewest call was replaced by a later one, or is older than the
--      key's run or follow-up: {-5}
-- A call is admitted while the live holders (and fair waiters ahead) are
-- fewer than its limit and than the limit of every live holder (see
-- limitMark in lease.go): servers that disagree about a key's limit never
-- pass the smaller one.
promote(holders_key, fence_key)

local kept_until = 0
local other_tag = ''
if epoch > 0 then
  local meta = redis.call('HMGET', epoch_key, 'e', 'd', 'a', 't')
  local last_epoch = tonumber(meta[1] or '0')
  kept_until = tonumber(meta[2] or '0')
  if epoch_tag ~= '' and meta[4] and meta[4] ~= '' and meta[4] ~= epoch_tag then
    other_tag = meta[4]
  end
  if epoch < last_epoch or (epoch == last_epoch and meta[3] ~= aid) then
    forget_waiter()
    return {-1, string.format('%d', last_epoch), other_tag}
  end
end

-- @cover_by_success

-- A free key with nobody queued (the common case) costs one EXISTS.
existed = redis.call('EXISTS', holders_key) == 1
if existed then
  -- Drop expired holders and forgotten records.
  redis.call('ZREMRANGEBYSCORE', holders_key, -now, now)
  if take_reserved and label ~= '' and not redis.call('ZSCORE', holders_key, 'x:' .. aid) then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf')) do
      if is_reservation(m) and string.sub(m, -#label - 1) == ':' .. label then
        redis.call('ZREM', holders_key, m)
        took_reserved = true
      end
    end
  end
  live = redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf', 'WITHSCORES')
  if redis.call('ZSCORE', holders_key, 'x:' .. aid) then
    forget_waiter()
    return {-3}
  end
  count = #live / 2
  local suffix = ':' .. label
  for i = 1, #live, 2 do
    local m = live[i]
    if string.find(m, '^%d+:' .. aid .. ':') then
      return {1, string.match(m, '^(%d+):'), string.format('%d', math.floor(tonumber(live[i + 1]) - now))}
    end
    -- Holders that disagree keep the smaller limit: a live holder's limit
    -- (the "n<limit>" ending of its acquire id, 1 without one) bounds
    -- every acquire while it holds.
    limit = math.min(limit, tonumber(string.match(m, '^%d+:[^:]*n(%d+):') or '1'))
    if label ~= '' and string.sub(m, -#suffix) == suffix then
      holder, holder_exp = m, tonumber(live[i + 1])
    end
  end
  -- @cover_by_run
  if label ~= '' and redis.call('ZSCORE', holders_key, 'done:' .. label) then
    -- @completed
    forget_waiter()
    return {-2}
  end
  -- @park_replaced
end
-- @give_way
if not holder and count > 0 then
  holder, holder_exp = live[1], tonumber(live[2])
end
-- @preempt
if redis.call('EXISTS', queue_key) == 1 then
  ahead = queued_ahead()
end

same = holder and label ~= '' and string.sub(holder, -#label - 1) == ':' .. label
-- @cover_by_follow_up
-- @follow_up
if not same and count + ahead < limit then
  -- A token is at least the server time in microseconds, so tokens keep
  -- growing after the fence key expires; the stored one orders acquires
  -- across a small backward step of the clock.
  local token = string.format('%d', math.max(tonumber(redis.call('GET', fence_key) or '0') + 1, nowus))
  redis.call('ZADD', holders_key, now + ttl, token .. ':' .. aid .. ':' .. owner .. ':' .. label)
  if existed then
    extend_key(holders_key, ttl)
  else
    redis.call('PEXPIRE', holders_key, ttl)
  end
  redis.call('SET', fence_key, token, 'PX', 1000)
  if epoch > 0 then
    kept_until = math.max(kept_until, now + epoch_keep)
    redis.call('HSET', epoch_key, 'e', epoch_text, 'd', string.format('%d', kept_until), 'a', aid, 't', epoch_tag)
    redis.call('PEXPIRE', epoch_key, math.max(ttl, kept_until - now))
  end
  forget_waiter()
  -- @took
  -- A call that was parked before (its reservation took_reserved, or its entry
  -- still queued) says so: its task was put back once, and the runtime's
  -- late write of that may come after this run (see Lease.WasParked).
  local was_parked = took_reserved
  -- @unpark
  if other_tag ~= '' then
    return {1, token, '0', was_parked and 1 or 0, other_tag}
  end
  if was_parked then
    return {1, token, '0', 1}
  end
  return {1, token}
end

-- @park
-- A call whose waiter is not kept (Coalesce) says so.
local unseen = false
-- @coalesce_waits
if wid ~= '' then
  wait(unseen)
end

local s = string.format('%d', since)
if holder then
  return {0, holder, holder_exp - now, count, ahead, s, parked, replaced, limit}
end
return {0, '', 0, count, ahead, s, parked, replaced, limit}
