-- The Coalesce sections of an acquire script (see acquire_core.lua). A
-- Coalesce call gives way to a run of the key that began after its work was
-- asked for: one that succeeded, one that holds the key, or a follow-up that
-- will run later (a Coalesce call that waits, or parks without waiting).
-- KEYS[6] cover: STRING, the token (start) of the latest Coalesce run that
--         succeeded, kept for its CoverFor (release_cover.lua writes it)
-- KEYS[8] follow-up: HASH, c = the parked-queue entry of the key's parked
--         Coalesce follow-up, f = when a Coalesce call last folded into a
--         follow-up (us): no run that began before it covers a Coalesce call
-- KEYS[1] holders, KEYS[4] waiters (a waiting Coalesce call's id starts
--         with "y") and KEYS[7] parked: read; a parked entry of the call's
--         own job is dropped from KEYS[7]
-- ARGV[11] since: "0" off; otherwise when the work was asked for (server us;
--          a time after now means now), "-1" for now (the first attempt)
-- ARGV[9] acquire id: "z<hex>" for a Final call, which covers no other: not
--         by its run, nor as the follow-up
-- A covered call's reply: {-4, coverage, covering token, holder member,
-- since}, coverage 1 by a success, 2 by a running holder, 3 by a follow-up.
-- A Coalesce call that parks without waiting is the key's parked Coalesce
-- follow-up: while its entry stays parked, it covers later Coalesce calls.
since = tonumber(ARGV[11])
if since < 0 or since > nowus then
  since = nowus
end
-- A run covers this call only if it began after every call folded into the
-- key's follow-up: while none such succeeded, they wait for it too.
local after = since

local function covered(kind, tok, member)
  forget_waiter()
  if kind == 3 then
    -- Folded into the follow-up: remembered (f) until a run that began
    -- later succeeded.
    local f = tonumber(redis.call('HGET', KEYS[8], 'f') or '0')
    redis.call('HSET', KEYS[8], 'f', string.format('%d', math.max(f, nowus)))
    extend_key(KEYS[8], keep)
  end
  return {-4, kind, string.format('%d', tok), member, string.format('%d', since)}
end

-- @cover_by_success: a run that succeeded covers the call
if since > 0 then
  after = math.max(since, tonumber(redis.call('HGET', KEYS[8], 'f') or '0'))
  local c = tonumber(redis.call('GET', KEYS[6]) or '0')
  if c >= after then
    return covered(1, c, '')
  end
end
-- @cover_by_run: a run covers calls that began before it, except a delivery
-- of its own work, which waits for the run's outcome
if since > 0 then
  local suffix = ':' .. label
  for i = 1, #live, 2 do
    local tok = tonumber(string.match(live[i], '^(%d+):') or '0')
    if tok >= after and (label == '' or string.sub(live[i], -#suffix) ~= suffix) and
        not string.find(live[i], '^%d+:z') then
      return covered(2, tok, live[i])
    end
  end
end
-- @cover_by_follow_up: a Coalesce acquire already waiting (its waiter id
-- starts with "y"), or parked, begins later: it covers this one. Other
-- waiters may give up unrun. A call that adopted its reservation is the
-- key's run: a follow-up behind it covers nothing of it.
if since > 0 and not same and not adopted then
  for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now, '+inf')) do
    if w ~= wid and string.sub(w, 1, 1) == 'y' then
      return covered(3, 0, '')
    end
  end
  local c = redis.call('HGET', KEYS[8], 'c')
  if c and c ~= entry and redis.call('ZSCORE', KEYS[7], c) then
    if label ~= '' and string.match(c, '^%d+:([^:]*):') == label then
      -- This job's own earlier entry (parked under another id): it is
      -- dropped, and this call takes its place.
      redis.call('ZREM', KEYS[7], c)
    else
      return covered(3, 0, '')
    end
  elseif c and c ~= entry then
    -- A release reserved the key for the parked follow-up: it begins later.
    local cl, cid = string.match(c, '^%d+:([^:]*):(.*)$')
    local rs = ':parked:' .. (cid or '') .. ':' .. (cl or '')
    for i = 1, #live, 2 do
      if string.find(live[i], '^%d+:r') and string.sub(live[i], -#rs) == rs then
        return covered(3, 0, '')
      end
    end
  end
end
-- @coalesce_waits: a call that parked without waiting becomes the key's
-- parked follow-up (c); the folds (f) are kept while a follow-up waits. A
-- call whose own earlier delivery holds the key is not kept as a waiter: it
-- covers no later call, since the run it waits for may complete its label
-- and drop it.
if since > 0 then
  if entry ~= '' and wid == '' and not same and string.sub(aid, 1, 1) ~= 'z' then
    redis.call('HSET', KEYS[8], 'c', entry)
    extend_key(KEYS[8], keep)
  end
  if wid ~= '' then
    extend_key(KEYS[8], keep)
  end
  unseen = same
end
