-- Acquires one holder slot of a lock, or reports why not. Safe to run twice:
-- a repeat with the same acquire id returns the lease the first run took.
-- Runs after promote.lua.
-- KEYS[1] holders: ZSET. A live holder is "<token>:<acquire id>:<owner>:<label>"
--         scored by its expiry (ms, server time). Negative scores are records
--         that outlive a holder, scored -(when they are forgotten):
--         "done:<label>" (Lease.Complete), "f:<label>" (Free), "w:" while
--         waiters, a queue or parked jobs may live (keep_sorted),
--         "x:<acquire id>" for an acquire call that failed and was cleaned up
--         (a late run of it must not take the key), "s:<label>" for a parked
--         Supersede follow-up that a newer one replaced (its next parking
--         acquire gives up and consumes it; other calls carrying the label,
--         such as a pass-on's adopt, leave it), and "S:<acquire id>" for the
--         call that consumed one (its repeat gives up too). Released holders are
--         remembered in a key of their own (release.lua), so a key whose last
--         holder left is gone and the next acquire takes the fast path.
-- KEYS[2] epoch: HASH, e = last epoch, d = keep it until (ms), a = the acquire id
--         that claimed it, n = the order of the key's latest Supersede run
--         (ARGV[19]); it lives until d, for ARGV[18] after a run with an
--         order took the key, and while leases that claimed an epoch or
--         recorded an order are renewed
-- KEYS[3] queue: ZSET of fair waiters, score = arrival (us)
-- KEYS[4] waiters: ZSET of every waiter, score = deadline (ms)
-- KEYS[5] fence: STRING, the last fencing token, kept for a second
-- KEYS[6] cover: STRING, the token (start) of the latest Coalesce run that
--         succeeded, kept for its CoverFor
-- KEYS[7] parked: ZSET of parked jobs, "<hold ms>:<label>:<id>" scored by
--         their first park (us); release.lua reserves the key for the oldest
-- KEYS[8] follow-up: HASH, p = the key's Supersede follow-up (a waiter id,
--         or the parked-queue entry of a parking call), r = the parked
--         follow-up that p replaced and a = the acquire id of the call that
--         replaced it (only its repeat is told r again), o = the order of
--         p ("0" for none), c = the
--         parked-queue entry of the key's parked Coalesce follow-up, f =
--         when a Coalesce call last folded into a follow-up (us): no run
--         that began before it covers a Coalesce call
-- ARGV[1] owner id
-- ARGV[2] ttl (ms)
-- ARGV[3] holder limit
-- ARGV[4] waiter id, "" when the caller does not wait
-- ARGV[5] "1" to queue the waiter in arrival order (fair)
-- ARGV[6] waiter ttl (ms): a waiter not seen for this long is dropped
-- ARGV[7] epoch, "0" for none
-- ARGV[8] how long to remember the epoch (ms)
-- ARGV[9] acquire id (hex; "z<hex>" for a Final Coalesce call, which
--         covers no other: not by its run, nor as the follow-up)
-- ARGV[10] label, escaped so that it holds no ':'; "" for none
-- ARGV[12] "1" to adopt: a live reservation (a holder whose acquire id
--          starts with "r") carrying the label is replaced by this holder
-- ARGV[13] Supersede: "0" off; "1" on a waiting call's first attempt (it
--          becomes the key's pending follow-up, and the one it replaces is
--          woken to give up, or, parked, is marked "s:"), and on a parking
--          call that does not wait (its entry is the follow-up); "2" on a
--          waiting call's later attempts
-- ARGV[14] release channel (to wake a replaced follow-up)
-- ARGV[15] Preempt: "1" on a waiting call's first attempt (every live
--          holder not preempted yet is preempted), otherwise "0"
-- ARGV[16] preempt grace (ms): a preempted holder expires within it; "0"
--          leaves its expiry as it is
-- ARGV[17] this call's parked-queue entry, "" when it does not park: it is
--          added (once) when the key is held, removed when the call takes it
-- ARGV[18] how long the parked queue is kept after a park (ms)
-- ARGV[19] Supersede: the call's order (its task's place in the key's order,
--          taken at enqueue), "0" for none; it applies to a waiting or
--          parking call, also on the attempts after the first, and once it
--          waits as a plain call for its own earlier delivery. A call older than the key's
--          latest run (n) or than its live follow-up (o) gives up ({-5}):
--          it neither replaces nor preempts a newer one. A call without an
--          order, or compared with a run or follow-up without one, goes by
--          arrival.
-- ARGV[11] Coalesce: "0" off; otherwise when the work was asked for (server
--          us; a time after now means now), "-1" for now (the first attempt)
-- Returns {1, token} when acquired ({1, token, '0', 1} when the call had been
--         parked: it adopted its reservation or found its parked entry),
--         {1, token, ttl left (ms)} when an earlier
--         run of this acquire took it or a release handed it over (release.lua),
--         {0, holder member, its ttl ms, holders, waiters ahead} when held,
--         {-1, last epoch} when the epoch was already used,
--         {-2} when the label was completed,
--         {-3} when this acquire call was abandoned,
--         {-5} when a Supersede call was replaced by a later one,
--         {-4, coverage, covering token, holder member, since} when a
--         Coalesce acquire is covered (1 by a success, 2 by a running
--         holder, 3 by a waiting follow-up);
--         conflicts carry since as a sixth element, for a parking
--         call the number of parked jobs ahead of it as a seventh (-1 for
--         none), and as an eighth the parked follow-up that this Supersede
--         call replaced ("" for none; a repeat of the call reports it too).
-- A Coalesce call that parks without waiting is the key's parked Coalesce
-- follow-up: while its entry stays parked, it covers later Coalesce calls.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local wid = ARGV[4]
local epoch = tonumber(ARGV[7])
local aid = ARGV[9]
local label = ARGV[10]
promote(KEYS[1], KEYS[5])

local function forget_waiter()
  if wid ~= '' then
    redis.call('ZREM', KEYS[3], wid)
    redis.call('ZREM', KEYS[4], wid)
  end
end

local function extend_key(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- keep_sorted keeps the holders in the sorted set, not the plain form of
-- plain_acquire.lua, for ms: the record "w:" says that waiters, a queue or
-- parked jobs may live that long, which a plain acquire must not pass by.
local function keep_sorted(ms)
  local s = redis.call('ZSCORE', KEYS[1], 'w:')
  if not s or tonumber(s) > -(now + ms) then
    redis.call('ZADD', KEYS[1], -(now + ms), 'w:')
  end
  extend_key(KEYS[1], ms)
end

local kept_until = 0
if epoch > 0 then
  local meta = redis.call('HMGET', KEYS[2], 'e', 'd', 'a')
  local last_epoch = tonumber(meta[1] or '0')
  kept_until = tonumber(meta[2] or '0')
  if epoch < last_epoch or (epoch == last_epoch and meta[3] ~= aid) then
    forget_waiter()
    return {-1, string.format('%d', last_epoch)}
  end
end

local since = tonumber(ARGV[11])
if since < 0 or since > nowus then
  since = nowus
end
local function covered(kind, tok, member)
  forget_waiter()
  if kind == 3 then
    -- Folded into the follow-up: remembered (f) until a run that began
    -- later succeeded.
    local f = tonumber(redis.call('HGET', KEYS[8], 'f') or '0')
    redis.call('HSET', KEYS[8], 'f', string.format('%d', math.max(f, nowus)))
    extend_key(KEYS[8], tonumber(ARGV[18]))
  end
  return {-4, kind, string.format('%d', tok), member, string.format('%d', since)}
end
-- A run covers this call only if it began after every call folded into the
-- key's follow-up: while none such succeeded, they wait for it too.
local after = since
if since > 0 then
  after = math.max(since, tonumber(redis.call('HGET', KEYS[8], 'f') or '0'))
  local c = tonumber(redis.call('GET', KEYS[6]) or '0')
  if c >= after then
    return covered(1, c, '')
  end
end

-- A free key with nobody queued (the common case) costs one EXISTS.
local existed = redis.call('EXISTS', KEYS[1]) == 1
local count = 0
local ahead = 0
local holder = false
local holder_exp = 0
-- A call that took over its reservation is the key's run, not a follow-up.
local adopted = false
-- Live holders and their expiries, in pairs.
local live = {}
local entry = ARGV[17]
local keep = tonumber(ARGV[18])
local order = tonumber(ARGV[19] or '0')
-- older tells whether this Supersede call is older than the key's latest
-- run or than its live follow-up (a parked entry, the reservation a release
-- made for it, or a waiter not expired).
local function older()
  if order == 0 or (wid == '' and entry == '') then
    return false
  end
  if order < tonumber(redis.call('HGET', KEYS[2], 'n') or '0') then
    return true
  end
  local f = redis.call('HMGET', KEYS[8], 'p', 'o')
  if not f[1] or f[1] == wid or f[1] == entry or order >= tonumber(f[2] or '0') then
    return false
  end
  if redis.call('ZSCORE', KEYS[7], f[1]) or tonumber(redis.call('ZSCORE', KEYS[4], f[1]) or '0') > now then
    return true
  end
  local pl = string.match(f[1], '^%d+:([^:]*):')
  if pl and pl ~= '' then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
      if string.find(m, '^%d+:r') and string.sub(m, -#pl - 1) == ':' .. pl then
        return true
      end
    end
  end
  return false
end
local function give_up()
  forget_waiter()
  if entry ~= '' then
    redis.call('ZREM', KEYS[7], entry)
  end
  return {-5}
end
if existed then
  -- Drop expired holders and forgotten records.
  redis.call('ZREMRANGEBYSCORE', KEYS[1], -now, now)
  if ARGV[12] == '1' and label ~= '' and not redis.call('ZSCORE', KEYS[1], 'x:' .. aid) then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
      if string.find(m, '^%d+:r') and string.sub(m, -#label - 1) == ':' .. label then
        redis.call('ZREM', KEYS[1], m)
        adopted = true
      end
    end
  end
  live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
  if redis.call('ZSCORE', KEYS[1], 'x:' .. aid) then
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
    if label ~= '' and string.sub(m, -#suffix) == suffix then
      holder, holder_exp = m, tonumber(live[i + 1])
    end
  end
  if since > 0 then
    -- A run covers calls that began before it, except a delivery of its
    -- own work: that one waits for the run's outcome.
    for i = 1, #live, 2 do
      local tok = tonumber(string.match(live[i], '^(%d+):') or '0')
      if tok >= after and (label == '' or string.sub(live[i], -#suffix) ~= suffix) and
          not string.find(live[i], '^%d+:z') then
        return covered(2, tok, live[i])
      end
    end
  end
  if label ~= '' and redis.call('ZSCORE', KEYS[1], 'done:' .. label) then
    forget_waiter()
    return {-2}
  end
  if redis.call('ZSCORE', KEYS[1], 'S:' .. aid) then
    return {-5}
  end
  if label ~= '' and entry ~= '' and redis.call('ZREM', KEYS[1], 's:' .. label) == 1 then
    -- A newer follow-up replaced this parked one: it gives up, once.
    redis.call('ZADD', KEYS[1], -(now + keep), 'S:' .. aid)
    extend_key(KEYS[1], keep)
    forget_waiter()
    return {-5}
  end
  if not adopted and older() then
    return give_up()
  end
  if not holder and count > 0 then
    holder, holder_exp = live[1], tonumber(live[2])
  end
  if ARGV[15] == '1' and wid ~= '' then
    -- A preempted holder's score gets half a millisecond: extend.lua
    -- refuses to renew it, so it expires within its TTL or the grace. Its
    -- Locker is told on the channel ("p" and the highest token preempted).
    -- A holder cut short by the grace leaves "q:<token>" until its lease
    -- would have ended plus a second, so that a renewal after the grace
    -- (its Locker missed the notice) still tells it was preempted.
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
      redis.call('PUBLISH', ARGV[14], 'p' .. string.format('%d', top))
    end
  end
end
if not existed and older() then
  return give_up()
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
  for _, w in ipairs(dead) do
    redis.call('ZREM', KEYS[3], w)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  local rank = false
  if wid ~= '' then
    rank = redis.call('ZRANK', KEYS[3], wid)
  end
  if rank then
    ahead = rank
  else
    ahead = redis.call('ZCARD', KEYS[3])
  end
end

local same = holder and label ~= '' and string.sub(holder, -#label - 1) == ':' .. label
if since > 0 and not same and not adopted then
  -- A Coalesce acquire already waiting (its waiter id starts with "y"), or
  -- parked, begins later: it covers this one. Other waiters may give up
  -- unrun. A call that adopted its reservation is the key's run: a
  -- follow-up behind it covers nothing of it.
  local ws = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now, '+inf')
  for _, w in ipairs(ws) do
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
    local r = ':parked:' .. (cid or '') .. ':' .. (cl or '')
    for i = 1, #live, 2 do
      if string.find(live[i], '^%d+:r') and string.sub(live[i], -#r) == r then
        return covered(3, 0, '')
      end
    end
  end
end
-- This call's follow-up id: its waiter id, or the entry of a parking call
-- that does not wait.
local fid = wid
if fid == '' then
  fid = entry
end
local sup = ARGV[13] or '0'
local replaced = ''
-- A call whose own earlier delivery holds the key (same) is no follow-up:
-- it neither replaces the key's follow-up nor becomes it, nor covers a
-- later Coalesce call, since the run it waits for may complete its label
-- and drop it.
if sup ~= '0' and fid ~= '' and not adopted and not (same and sup == '1') then
  -- One pending follow-up per key, the newest: "p" in the follow-up hash.
  local p = redis.call('HGET', KEYS[8], 'p')
  if sup == '1' then
    if p == fid then
      -- A repeat of the call that replaced r is told so again; a later
      -- call with the same entry (a backstop delivery) replaced no one.
      local again = redis.call('HMGET', KEYS[8], 'r', 'a')
      if again[2] == aid then
        replaced = again[1] or ''
      end
    else
      if p and redis.call('ZREM', KEYS[7], p) == 1 then
        -- A parked follow-up: marked, so that its next acquire gives up;
        -- unless it is this job's own earlier entry (parked under another
        -- id), whose place this call takes.
        local pl = string.match(p, '^%d+:([^:]*):')
        if not (pl and pl ~= '' and pl == label) then
          if pl and pl ~= '' then
            redis.call('ZADD', KEYS[1], -(now + keep), 's:' .. pl)
            extend_key(KEYS[1], keep)
          end
          replaced = p
        end
      elseif p then
        redis.call('PUBLISH', ARGV[14], '1')
      end
      redis.call('HSET', KEYS[8], 'p', fid, 'r', replaced, 'a', aid, 'o', string.format('%d', order))
    end
  elseif p ~= wid then
    forget_waiter()
    return {-5}
  end
  if wid ~= '' then
    extend_key(KEYS[8], tonumber(ARGV[6]))
  else
    extend_key(KEYS[8], keep)
  end
end
if not same and count + ahead < limit then
  -- A token is at least the server time in microseconds, so tokens keep
  -- growing after the fence key expires; the stored one orders acquires
  -- across a small backward step of the clock.
  local token = string.format('%d', math.max(tonumber(redis.call('GET', KEYS[5]) or '0') + 1, nowus))
  redis.call('ZADD', KEYS[1], now + ttl, token .. ':' .. aid .. ':' .. ARGV[1] .. ':' .. label)
  if existed then
    extend_key(KEYS[1], ttl)
  else
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  redis.call('SET', KEYS[5], token, 'PX', 1000)
  if epoch > 0 then
    kept_until = math.max(kept_until, now + tonumber(ARGV[8]))
    redis.call('HSET', KEYS[2], 'e', ARGV[7], 'd', string.format('%d', kept_until), 'a', aid)
    redis.call('PEXPIRE', KEYS[2], math.max(ttl, kept_until - now))
  end
  forget_waiter()
  if fid ~= '' and (sup ~= '0' or order > 0) then
    if sup ~= '0' and redis.call('HGET', KEYS[8], 'p') == fid then
      redis.call('HDEL', KEYS[8], 'p', 'r', 'a', 'o')
    end
    -- The run's order: an older call gives up while it runs and after.
    if order == 0 then
      redis.call('HDEL', KEYS[2], 'n')
    elseif order > tonumber(redis.call('HGET', KEYS[2], 'n') or '0') then
      redis.call('HSET', KEYS[2], 'n', string.format('%d', order))
    end
    if order > 0 then
      extend_key(KEYS[2], keep)
    end
  end
  -- A call that was parked before (its reservation adopted, or its entry
  -- still queued) says so: its task was put back once, and the runtime's
  -- late write of that may come after this run (see Lease.WasParked).
  local was_parked = adopted
  if entry ~= '' and redis.call('ZREM', KEYS[7], entry) == 1 then
    was_parked = true
  end
  if was_parked then
    return {1, token, '0', 1}
  end
  return {1, token}
end

local parked = -1
if entry ~= '' then
  redis.call('ZADD', KEYS[7], 'NX', nowus, entry)
  redis.call('PEXPIRE', KEYS[7], keep)
  keep_sorted(keep)
  parked = redis.call('ZRANK', KEYS[7], entry)
  if since > 0 and wid == '' and not same and string.sub(aid, 1, 1) ~= 'z' then
    redis.call('HSET', KEYS[8], 'c', entry)
    extend_key(KEYS[8], keep)
  end
end

if wid ~= '' then
  local wttl = tonumber(ARGV[6])
  if not (same and since > 0) then
    redis.call('ZADD', KEYS[4], now + wttl, wid)
    extend_key(KEYS[4], wttl)
  end
  if since > 0 then
    -- The folds (f) are kept while a follow-up waits.
    extend_key(KEYS[8], keep)
  end
  keep_sorted(wttl)
  if ARGV[5] == '1' then
    redis.call('ZADD', KEYS[3], 'NX', nowus, wid)
    extend_key(KEYS[3], wttl)
    ahead = redis.call('ZRANK', KEYS[3], wid)
  end
end

local s = string.format('%d', since)
if holder then
  return {0, holder, holder_exp - now, count, ahead, s, parked, replaced}
end
return {0, '', 0, count, ahead, s, parked, replaced}
