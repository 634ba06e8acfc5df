-- The first part of every acquire script. An acquire script is promote.lua,
-- this file, the files of the call's modes (acquire_coalesce.lua,
-- acquire_keepnewest.lua, acquire_preempt.lua, acquire_park.lua, in this
-- order) and acquire.lua, which takes the key or reports why not: scripts.go
-- builds one script per set of modes, so that a call runs no code of a mode
-- it does not have. A mode file begins with what it declares (before
-- acquire.lua), then has sections, each after a line "-- @<place>", which
-- scripts.go puts in acquire.lua at the line "-- @<place>": a place of a mode
-- the call does not have stays empty. This file reads the shared arguments
-- by name and declares what acquire.lua finds, which the sections read.
-- Every acquire script takes the same 8 keys and 20 arguments, laid out by
-- acquireArgs (backend.go); they are named here, once, and the rest of the
-- script (the mode files too) uses only the names. A boolean argument is
-- "1" for true and "" for false.
-- KEYS[1] holders_key: ZSET. A live holder is
--         "<token>:<acquire id>:<owner>:<label>" scored by its expiry (ms,
--         server time). Negative scores are records that outlive a holder,
--         scored -(when they are forgotten): "done:<label>"
--         (Lease.Complete), "f:<label>" (Free), "w:" while waiters, a queue
--         or parked jobs may live (keep_sorted), "x:<acquire id>" for an
--         acquire call that failed and was cleaned up (a late run of it must
--         not take the key), "c:<token>" while an operator's request that a
--         run stop lasts (cancel.lua), and the records of the modes ("q:",
--         "s:", "S:": see their files). Released holders are remembered in a
--         key of their own (release.lua), so a key whose last holder left is
--         gone and the next acquire takes the fast path.
-- KEYS[2] epoch_key: HASH, e = last epoch, d = keep it until (ms), a = the
--         acquire id that claimed it, t = its epoch tag (n:
--         acquire_keepnewest.lua); it lives until d, and while leases that
--         claimed an epoch are renewed
-- KEYS[3] queue_key: ZSET of fair waiters, score = arrival (us)
-- KEYS[4] waiters_key: ZSET of every waiter, score = deadline (ms)
-- KEYS[5] fence_key: STRING, the last fencing token, kept for a second
-- KEYS[6] coalesce_key, KEYS[7] parked_key, KEYS[8] followup_key: see the
--         mode files
-- ARGV[1]  owner         owner id
-- ARGV[2]  ttl           ms
-- ARGV[3]  limit         holder limit, lowered to that of any live holder
-- ARGV[4]  wid           waiter id, "" when the call does not wait; the id
--                        of a waiter that a release may hand the key to
--                        carries the hand-over's terms as its fields,
--                        "<id>:<ttl ms>:<acquire id>:<label>:<owner>"
--                        (release_grant.lua)
-- ARGV[5]  fair          boolean: queue the waiter in arrival order
-- ARGV[6]  wttl          waiter ttl (ms): a waiter not seen for this long is
--                        dropped
-- ARGV[7]  epoch_text    epoch, "0" for none (epoch: its number)
-- ARGV[8]  epoch_keep    how long to remember the epoch (ms)
-- ARGV[9]  aid           acquire id (hex); the id of a holder that is a
--                        reservation (AcquireOptions.Reserve) starts with
--                        "r", and that of a final Coalesce call's holder
--                        with "z", which the scripts of every version read
--                        from the holders they find (is_reservation and
--                        is_final in promote.lua); that of an acquire
--                        with a limit above 1 ends with "n<limit>", the
--                        limit its holder keeps (acquire.lua)
-- ARGV[10] label         escaped, so that it holds no ':'; "" for none
-- ARGV[11] since_text    Coalesce: when the work was asked for (server us);
--                        0 or less, or a time after now, means now
--                        (acquire_coalesce.lua)
-- ARGV[12] take_reserved boolean (TakeReservation): a live reservation
--                        (is_reservation) carrying the label is replaced
--                        by this holder
-- ARGV[13] mode          the FollowUp: 'coalesce', 'final' (a final Coalesce
--                        call, which covers no other), 'keepnewest',
--                        'preempt' (which keeps the newest too), or '' for none, also
--                        for a call that is no follow-up (it neither waits
--                        nor parks, or waits for its own earlier delivery)
-- ARGV[14] channel       release channel (KeepNewest and Preempt publish on it)
-- ARGV[15] first         boolean: the call's first attempt, not a waiting
--                        call's later one
-- ARGV[16] grace         Preempt's grace (ms, acquire_preempt.lua)
-- ARGV[17] entry         this call's parked-queue entry, "" when it does not
--                        park
-- ARGV[18] keep          how long the parked queue and the follow-up records
--                        are kept (ms)
-- ARGV[19] order         KeepNewest/Preempt order, "0" for none
--                        (acquire_keepnewest.lua)
-- ARGV[20] epoch_tag     kept with the epoch this call claims; "" for none
local holders_key, epoch_key, queue_key, waiters_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local fence_key, coalesce_key, parked_key, followup_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local wid = ARGV[4]
local fair = ARGV[5] == '1'
local wttl = tonumber(ARGV[6])
local epoch_text = ARGV[7]
local epoch = tonumber(epoch_text)
local epoch_keep = tonumber(ARGV[8])
local aid = ARGV[9]
local label = ARGV[10]
local since_text = ARGV[11]
local take_reserved = ARGV[12] == '1'
local mode = ARGV[13]
local channel = ARGV[14]
local first = ARGV[15] == '1'
local grace = tonumber(ARGV[16])
local entry = ARGV[17]
local keep = tonumber(ARGV[18])
local order = tonumber(ARGV[19])
local epoch_tag = ARGV[20]
local coalesce = mode == 'coalesce' or mode == 'final'
local final = mode == 'final'
local keepnewest = mode == 'keepnewest' or mode == 'preempt'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- What acquire.lua finds: whether the holders key existed, its live holders
-- and their expiries in pairs, their count, the holder to report (the one
-- carrying the label, else the first) and its expiry, whether this call took
-- over its reservation (took_reserved: it is the key's run, not a follow-up), the
-- fair waiters ahead, and whether the call's own earlier delivery holds the
-- key (same).
local existed, live, count, holder, holder_exp = false, {}, 0, false, 0
local took_reserved, ahead, same = false, 0, false
-- Reported when the key is held: since (Coalesce), the parked jobs ahead of
-- a parking call (-1 for none) and the parked follow-up it replaced
-- (KeepNewest; "" for none).
local since, parked, replaced = 0, -1, ''

local function forget_waiter()
  if wid ~= '' then
    redis.call('ZREM', queue_key, wid)
    redis.call('ZREM', waiters_key, wid)
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
  local s = redis.call('ZSCORE', holders_key, 'w:')
  if not s or tonumber(s) > -(now + ms) then
    redis.call('ZADD', holders_key, -(now + ms), 'w:')
  end
  extend_key(holders_key, ms)
end

-- queued_ahead drops the fair waiters not seen for their waiter ttl and
-- returns how many are queued ahead of this call (all of them when it is not
-- queued).
local function queued_ahead()
  local dead = redis.call('ZRANGEBYSCORE', waiters_key, '-inf', now)
  for _, w in ipairs(dead) do
    redis.call('ZREM', queue_key, w)
  end
  redis.call('ZREMRANGEBYSCORE', waiters_key, '-inf', now)
  local rank = false
  if wid ~= '' then
    rank = redis.call('ZRANK', queue_key, wid)
  end
  if rank then
    return rank
  end
  return redis.call('ZCARD', queue_key)
end

-- wait registers the waiting call for its waiter ttl (unless unseen), in the
-- fair queue too.
local function wait(unseen)
  if not unseen then
    redis.call('ZADD', waiters_key, now + wttl, wid)
    extend_key(waiters_key, wttl)
  end
  keep_sorted(wttl)
  if fair then
    redis.call('ZADD', queue_key, 'NX', nowus, wid)
    extend_key(queue_key, wttl)
    ahead = redis.call('ZRANK', queue_key, wid)
  end
end
