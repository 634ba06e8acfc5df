-- The KeepNewest sections of an acquire script (see acquire_core.lua, which
-- names the arguments and keys): a key has one pending follow-up, the
-- newest. A later KeepNewest (or Preempt) call replaces it (a waiter is woken to give up; a parked one
-- leaves the parked queue and is marked "s:<label>" in holders_key, which its next
-- parking acquire consumes: acquire_park.lua), and a call older than the key's
-- latest run or than its live follow-up gives up: {-5}.
-- KEYS[2] epoch_key: HASH, n = the order of the key's latest KeepNewest run;
--         it is kept for keep after a run with an order took the key, and
--         while leases that recorded an order are renewed
-- KEYS[8] followup_key: HASH, p = the key's KeepNewest follow-up (a waiter id,
--         or the parked-queue entry of a parking call), r = the parked
--         follow-up that p replaced and a = the acquire id of the call that
--         replaced it (only its repeat is told r again), o = the order of p
--         ("0" for none); kept for keep (ARGV[18]) after the last attempt
--         of a waiting or parking follow-up
-- KEYS[1] holders_key ("s:" records; live reservations are read), KEYS[4]
--         waiters_key (read) and KEYS[7] parked_key (a replaced entry is
--         removed)
-- ARGV[13] mode: 'keepnewest' or 'preempt' (keepnewest below) makes the
--          call the key's pending follow-up: a waiting call on its first
--          attempt (ARGV[15] first), and a parking call that does not wait
--          (its entry is the follow-up); a waiting call's later attempts
--          give up once another call took its place, unless that call has a
--          lower order (outranks)
-- ARGV[19] order: the call's order (its task's place in the key's order, taken at
--          enqueue), "0" for none; it applies to a waiting or parking call,
--          also on the attempts after the first, and once it waits as a
--          plain call for its own earlier delivery. A call without an order,
--          or compared with a run or follow-up without one, goes by arrival.
-- This call's follow-up id: its waiter id, or the entry of a parking call
-- that does not wait.
local fid = wid
if fid == '' then
  fid = entry
end

-- older tells whether this call is older than the key's latest run or than
-- its live follow-up (a parked entry, the reservation a release made for it,
-- or a waiter not expired).
local function older()
  if order == 0 or (wid == '' and entry == '') then
    return false
  end
  if order < tonumber(redis.call('HGET', epoch_key, 'n') or '0') then
    return true
  end
  local f = redis.call('HMGET', followup_key, 'p', 'o')
  if not f[1] or f[1] == wid or f[1] == entry or order >= tonumber(f[2] or '0') then
    return false
  end
  if redis.call('ZSCORE', parked_key, f[1]) or tonumber(redis.call('ZSCORE', waiters_key, f[1]) or '0') > now then
    return true
  end
  local pl = string.match(f[1], '^%d+:([^:]*):')
  if pl and pl ~= '' then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', holders_key, '(' .. now, '+inf')) do
      if is_reservation(m) and string.sub(m, -#pl - 1) == ':' .. pl then
        return true
      end
    end
  end
  return false
end

-- outranks tells whether this waiting call, whose place another call took
-- (p, with order o; or none left: the call that took it ran), is newer by
-- order than that call: it takes the place back. Only a call that stalled
-- past its waiter ttl (older() then let an older call in) finds one.
local function outranks(p, o)
  if order == 0 then
    return false
  end
  local other = tonumber(o or '0')
  if not p then
    other = tonumber(redis.call('HGET', epoch_key, 'n') or '0')
  end
  return other > 0 and other < order
end

-- @give_way
if not took_reserved and older() then
  forget_waiter()
  if entry ~= '' then
    redis.call('ZREM', parked_key, entry)
  end
  return {-5}
end
-- @follow_up: the call becomes the key's one follow-up; a call whose own
-- earlier delivery holds the key (same) is no follow-up: it neither
-- replaces the key's follow-up nor becomes it
if keepnewest and fid ~= '' and not took_reserved and not (same and first) then
  local f = redis.call('HMGET', followup_key, 'p', 'o')
  local p = f[1]
  if not first and p ~= wid and not outranks(p, f[2]) then
    forget_waiter()
    return {-5}
  end
  if p == fid then
    -- A repeat of the call that replaced r is told so again; a later
    -- call with the same entry (a backstop delivery) replaced no one.
    local again = redis.call('HMGET', followup_key, 'r', 'a')
    if again[2] == aid then
      replaced = again[1] or ''
    end
  else
    if p and redis.call('ZREM', parked_key, p) == 1 then
      -- A parked follow-up: marked, so that its next acquire gives up;
      -- unless it is this job's own earlier entry (parked under another
      -- id), whose place this call takes.
      local pl = string.match(p, '^%d+:([^:]*):')
      if not (pl and pl ~= '' and pl == label) then
        if pl and pl ~= '' then
          redis.call('ZADD', holders_key, -(now + keep), 's:' .. pl)
          extend_key(holders_key, keep)
        end
        replaced = p
      end
    elseif p then
      redis.call('PUBLISH', channel, '1')
    end
    redis.call('HSET', followup_key, 'p', fid, 'r', replaced, 'a', aid, 'o', string.format('%d', order))
  end
  -- Kept for keep, not the waiter ttl: a waiter whose process stalled
  -- past its waiter ttl is still the follow-up unless a newer call took
  -- its place (which then runs and clears p).
  extend_key(followup_key, keep)
end
-- @took: the run's order; an older call gives up while it runs and after
if fid ~= '' and (keepnewest or order > 0) then
  if keepnewest and redis.call('HGET', followup_key, 'p') == fid then
    redis.call('HDEL', followup_key, 'p', 'r', 'a', 'o')
  end
  if order == 0 then
    redis.call('HDEL', epoch_key, 'n')
  elseif order > tonumber(redis.call('HGET', epoch_key, 'n') or '0') then
    redis.call('HSET', epoch_key, 'n', string.format('%d', order))
  end
  if order > 0 then
    extend_key(epoch_key, keep)
  end
end
