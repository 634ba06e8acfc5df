-- The Coalesce sections of an acquire script (see acquire_core.lua). A
-- Coalesce call gives way to a run of the key that began after its work was
-- asked for: one that succeeded, one that holds the key, or a follow-up that
-- will run later (a Coalesce call that waits, or parks without waiting).
-- It acts when mode is 'coalesce' or 'final' (the arguments and keys are
-- named in acquire_core.lua).
-- KEYS[6] coalesce_key: STRING, the token (start) of the latest Coalesce run
--         that succeeded, kept for its CoverFor (release_coalesce.lua writes it)
-- KEYS[8] followup_key: HASH, c = the parked-queue entry of the key's parked
--         Coalesce follow-up, w = the waiter id of the key's waiting Coalesce
--         follow-up (one while its waiter lives in waiters_key), f = when a
--         Coalesce call last folded into a follow-up (us): no run that began
--         before it covers a Coalesce call
-- KEYS[1] holders_key, KEYS[4] waiters_key and KEYS[7] parked_key: read; a
--         parked entry of the call's own job is dropped from parked_key
-- ARGV[11] since_text: when the work was asked for (server us; 0 or less,
--          or a time after now, means now)
-- ARGV[13] mode: 'final' for a final call, which covers no other: not by
--          its run (its holder's acquire id starts with "z"), nor as the
--          follow-up
-- The version before this one recorded no w: its waiting follow-up's
-- waiter id starts with "y" instead. Such a waiter is read as the follow-up
-- too, since it lives as long as a process of that version waits (a
-- rolling upgrade).
-- A covered call's reply: {-4, coverage, covering token, holder member,
-- since}, coverage 1 by a success, 2 by a running holder, 3 by a follow-up.
-- A Coalesce call that parks without waiting is the key's parked Coalesce
-- follow-up: while its entry stays parked, it covers later Coalesce calls.
if coalesce then
  since = tonumber(since_text)
  if since <= 0 or since > nowus then
    since = nowus
  end
end
-- A run covers this call only if it began after every call folded into the
-- key's follow-up: while none such succeeded, they wait for it too.
local after = since
-- The key's waiting Coalesce follow-up (followup_key's w) as read, false
-- when not read.
local follow_waiter = false

local function covered(kind, tok, member)
  forget_waiter()
  if kind == 3 then
    -- Folded into the follow-up: remembered (f) until a run that began
    -- later succeeded.
    local f = tonumber(redis.call('HGET', followup_key, 'f') or '0')
    redis.call('HSET', followup_key, 'f', string.format('%d', math.max(f, nowus)))
    extend_key(followup_key, keep)
  end
  return {-4, kind, string.format('%d', tok), member, string.format('%d', since)}
end

-- @cover_by_success: a run that succeeded covers the call
if coalesce then
  after = math.max(since, tonumber(redis.call('HGET', followup_key, 'f') or '0'))
  local c = tonumber(redis.call('GET', coalesce_key) or '0')
  if c >= after then
    return covered(1, c, '')
  end
end
-- @cover_by_run: a run covers calls that began before it, except a delivery
-- of its own work, which waits for the run's outcome
if coalesce then
  local suffix = ':' .. label
  for i = 1, #live, 2 do
    local tok = tonumber(string.match(live[i], '^(%d+):') or '0')
    if tok >= after and (label == '' or string.sub(live[i], -#suffix) ~= suffix) and
        not is_final(live[i]) then
      return covered(2, tok, live[i])
    end
  end
end
-- @cover_by_follow_up: a Coalesce acquire already waiting (followup_key's
-- w while its waiter lives), or parked, begins later: it covers this one.
-- Other waiters may give up unrun. A call that took_reserved its
-- reservation is the key's run: a follow-up behind it covers nothing of it.
if coalesce and not same and not took_reserved then
  local fu = redis.call('HMGET', followup_key, 'c', 'w')
  local c = fu[1]
  follow_waiter = fu[2]
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', waiters_key, '(' .. now, '+inf')) do
    if w ~= wid and (w == follow_waiter or string.sub(w, 1, 1) == 'y') then
      return covered(3, 0, '')
    end
  end
  if c and c ~= entry and redis.call('ZSCORE', parked_key, c) then
    if label ~= '' and string.match(c, '^%d+:([^:]*):') == label then
      -- This job's own earlier entry (parked under another id): it is
      -- dropped, and this call takes its place.
      redis.call('ZREM', parked_key, c)
    else
      return covered(3, 0, '')
    end
  elseif c and c ~= entry then
    -- A release reserved the key for the parked follow-up: it begins later.
    local cl, cid = string.match(c, '^%d+:([^:]*):(.*)$')
    local rs = ':parked:' .. (cid or '') .. ':' .. (cl or '')
    for i = 1, #live, 2 do
      if is_reservation(live[i]) and string.sub(live[i], -#rs) == rs then
        return covered(3, 0, '')
      end
    end
  end
end
-- @coalesce_waits: a call that parked without waiting becomes the key's
-- parked follow-up (c), one that waits its waiting follow-up (w); the
-- folds (f) are kept while a follow-up waits. A call whose own earlier
-- delivery holds the key is not kept as a waiter: it covers no later call,
-- since the run it waits for may complete its label and drop it.
if coalesce then
  if entry ~= '' and wid == '' and not same and not final then
    redis.call('HSET', followup_key, 'c', entry)
    extend_key(followup_key, keep)
  end
  if wid ~= '' then
    if not same and not final and follow_waiter ~= wid then
      redis.call('HSET', followup_key, 'w', wid)
    end
    extend_key(followup_key, keep)
  end
  unseen = same
end
