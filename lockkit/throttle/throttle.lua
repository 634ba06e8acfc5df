-- Keeps a key's budget of starts: at most n in any window of one period (a
-- sliding log of the starts), reserved starts counting against it. Takes a
-- start, reserves one, or only tells when fewer than n began. Safe to run
-- twice: a start or reservation is logged under its call's id, so a repeat
-- finds it and takes nothing more.
-- KEYS[1] starts: ZSET of start ids, scored by when their work began (ms,
--         server time)
-- KEYS[2] reserved: ZSET of reserved start ids, scored by when they were
--         reserved (ms); a reservation lapses one period after that
-- ARGV[1] n
-- ARGV[2] period (ms)
-- ARGV[3] id of the start; "" to take nothing and only tell when fewer than
--         n starts began in the window (reservations, which may not begin,
--         are not counted)
-- ARGV[4] "1" to reserve the start, "0" to take it: a reserved start is
--         taken without counting again, dated now
-- Returns 0 when the start is taken or reserved (for "": when fewer than n
-- began), or how long until one would be (ms, at least 1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local id = ARGV[3]
local reserve = ARGV[4] == '1'
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - period)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - period)
local keys = KEYS
if id == '' then
  keys = {KEYS[1]}
else
  if redis.call('ZSCORE', KEYS[1], id) then
    return 0 -- a repeat of a start still in the window
  end
  if redis.call('ZSCORE', KEYS[2], id) then
    if not reserve then
      -- The reserved start counted already: it is taken, dated now.
      redis.call('ZREM', KEYS[2], id)
      redis.call('ZADD', KEYS[1], now, id)
      redis.call('PEXPIRE', KEYS[1], period)
    end
    return 0
  end
end
local count = 0
for _, k in ipairs(keys) do
  count = count + redis.call('ZCARD', k)
end
if count < n then
  if id ~= '' then
    local k = KEYS[1]
    if reserve then
      k = KEYS[2]
    end
    redis.call('ZADD', k, now, id)
    redis.call('PEXPIRE', k, period)
  end
  return 0
end
-- A slot opens when the oldest start or reservation counted leaves the
-- window.
local oldest = now
for _, k in ipairs(keys) do
  local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if first[2] and tonumber(first[2]) < oldest then
    oldest = tonumber(first[2])
  end
end
return math.max(1, oldest + period - now + 1)
