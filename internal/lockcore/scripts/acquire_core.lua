-- The first part of every acquire script. An acquire script is promote.lua,
-- this file, the files of the call's modes (acquire_coalesce.lua,
-- acquire_supersede.lua, acquire_preempt.lua, acquire_park.lua, in this
-- order) and acquire.lua, which takes the key or reports why not: scripts.go
-- builds one script per set of modes, so that a call runs no code of a mode
-- it does not have. A mode file begins with what it declares (before
-- acquire.lua), then has sections, each after a line "-- @<place>", which
-- scripts.go puts in acquire.lua at the line "-- @<place>": a place of a mode
-- the call does not have stays empty. This file reads the shared arguments
-- by name and declares what acquire.lua finds, which the sections read.
-- Every acquire script takes the same 8 keys and 20 arguments; each file's
-- header names the ones it reads.
-- KEYS[1] holders: ZSET. A live holder is "<token>:<acquire id>:<owner>:<label>"
--         scored by its expiry (ms, server time). Negative scores are records
--         that outlive a holder, scored -(when they are forgotten):
--         "done:<label>" (Lease.Complete), "f:<label>" (Free), "w:" while
--         waiters, a queue or parked jobs may live (keep_sorted),
--         "x:<acquire id>" for an acquire call that failed and was cleaned up
--         (a late run of it must not take the key), "c:<token>" while an
--         operator's request that a run stop lasts (cancel.lua), and the
--         records of the modes ("q:", "s:", "S:": see their files). Released holders are
--         remembered in a key of their own (release.lua), so a key whose last
--         holder left is gone and the next acquire takes the fast path.
-- KEYS[2] epoch: HASH, e = last epoch, d = keep it until (ms), a = the acquire
--         id that claimed it, t = its epoch tag (n: acquire_supersede.lua);
--         it lives until d,
--         and while leases that claimed an epoch are renewed
-- KEYS[3] queue: ZSET of fair waiters, score = arrival (us)
-- KEYS[4] waiters: ZSET of every waiter, score = deadline (ms)
-- KEYS[5] fence: STRING, the last fencing token, kept for a second
-- KEYS[6] cover, KEYS[7] parked, KEYS[8] follow-up: see the mode files
-- ARGV[1] owner id
-- ARGV[2] ttl (ms)
-- ARGV[3] holder limit
-- ARGV[4] waiter id, "" when the caller does not wait
-- ARGV[5] "1" to queue the waiter in arrival order (fair)
-- ARGV[6] waiter ttl (ms): a waiter not seen for this long is dropped
-- ARGV[7] epoch, "0" for none
-- ARGV[8] how long to remember the epoch (ms)
-- ARGV[9] acquire id (hex; "z<hex>" for a Final Coalesce call)
-- ARGV[10] label, escaped so that it holds no ':'; "" for none
-- ARGV[12] "1" to adopt: a live reservation (a holder whose acquire id
--          starts with "r") carrying the label is replaced by this holder
-- ARGV[14] release channel (Supersede and Preempt publish on it)
-- ARGV[17] this call's parked-queue entry, "" when it does not park
-- ARGV[18] how long the parked queue and the follow-up records are kept (ms)
-- ARGV[20] epoch tag, kept with the epoch this call claims; "" for none
-- ARGV[11], [13], [15], [16], [19]: read by the mode files
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local wid = ARGV[4]
local fair = ARGV[5] == '1'
local wttl = tonumber(ARGV[6])
local epoch = tonumber(ARGV[7])
local epoch_keep = tonumber(ARGV[8])
local aid = ARGV[9]
local label = ARGV[10]
local adopt = ARGV[12] == '1'
local channel = ARGV[14]
local entry = ARGV[17]
local keep = tonumber(ARGV[18])
local epoch_tag = ARGV[20] or ''

-- What acquire.lua finds: whether the holders key existed, its live holders
-- and their expiries in pairs, their count, the holder to report (the one
-- carrying the label, else the first) and its expiry, whether this call took
-- over its reservation (adopted: it is the key's run, not a follow-up), the
-- fair waiters ahead, and whether the call's own earlier delivery holds the
-- key (same).
local existed, live, count, holder, holder_exp = false, {}, 0, false, 0
local adopted, ahead, same = false, 0, false
-- Reported when the key is held: since (Coalesce), the parked jobs ahead of
-- a parking call (-1 for none) and the parked follow-up it replaced
-- (Supersede; "" for none).
local since, parked, replaced = 0, -1, ''

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

-- queued_ahead drops the fair waiters not seen for their waiter ttl and
-- returns how many are queued ahead of this call (all of them when it is not
-- queued).
local function queued_ahead()
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
    return rank
  end
  return redis.call('ZCARD', KEYS[3])
end

-- wait registers the waiting call for its waiter ttl (unless unseen), in the
-- fair queue too.
local function wait(unseen)
  if not unseen then
    redis.call('ZADD', KEYS[4], now + wttl, wid)
    extend_key(KEYS[4], wttl)
  end
  keep_sorted(wttl)
  if fair then
    redis.call('ZADD', KEYS[3], 'NX', nowus, wid)
    extend_key(KEYS[3], wttl)
    ahead = redis.call('ZRANK', KEYS[3], wid)
  end
end
