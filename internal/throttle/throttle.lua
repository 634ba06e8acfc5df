-- Keeps a key's budget of starts: at most n in any window of one period (a
-- sliding log of the starts), reserved starts counting against it, and a
-- line of booked turns ahead of every newcomer. Takes a start, reserves one
-- (now or, for a turn, at a booked slot), takes over an earlier try's, or
-- only tells when one would be allowed. Safe to run twice: a start or
-- reservation is logged under its call's id and a booking under its turn,
-- so a repeat finds it and takes nothing more (a repeated booking call is
-- its turn's claimant).
-- KEYS[1] starts: ZSET of start ids, scored by when their work began (ms,
--         server time)
-- KEYS[2] reserved: ZSET of reserved start ids, scored by when they were
--         reserved (ms); a reservation lapses one period after that
-- KEYS[3] bookings: ZSET of turns, scored by their booked slot (ms); a
--         booking lapses one period after its slot (no longer counted) and
--         is forgotten ARGV[6] later (its claimant, back late, no longer
--         known)
-- ARGV[1] n
-- ARGV[2] period (ms)
-- ARGV[3] id of the start; "" to take nothing and only tell when fewer than
--         n starts began in the window or are booked (reservations, which
--         may not begin, are not counted). An id "<hex>:<work>" names the
--         try of work it is for (throttle.go's ID)
-- ARGV[4] "1" to reserve the start, "0" to take it: a reserved start is
--         taken without counting again, dated now; "2" to take over the
--         start of an earlier try of the id's work, taken or reserved (the
--         newest, a taken one first), dated now and logged as the id, or
--         else take one
-- ARGV[5] turn ("" for none; with ARGV[4] "1" or "2"): booked, its
--         claimant reserves (or takes) the start when starts and
--         reservations leave room (bookings do not count against it); not
--         booked, it is booked at the next free slot when the budget is
--         spent; a start taken over ends its booking
-- ARGV[6] how long a lapsed booking is still known (ms)
-- Returns 0 when the start is taken or reserved (for "": when one would
-- be), or how long until one would be (ms, at least 1): for a turn, until
-- its slot.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local id = ARGV[3]
local reserve = ARGV[4] == '1'
local over = ARGV[4] == '2'
local turn = ARGV[5]
local known = period + tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - period)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - period)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - known)
-- The counted events in the window, sorted by time: bookings by their slot.
local function times(keys)
  local all = {}
  for _, k in ipairs(keys) do
    local z = redis.call('ZRANGEBYSCORE', k, '(' .. (now - period), '+inf', 'WITHSCORES')
    for i = 2, #z, 2 do
      all[#all + 1] = tonumber(z[i])
    end
  end
  table.sort(all)
  return all
end
-- When fewer than n of the events are in the window: once all but n-1 of
-- them left it.
local function opens(all)
  return math.max(now, all[#all - n + 1] + period + 1)
end
local keys = {KEYS[1], KEYS[2], KEYS[3]}
local slot = nil
if id == '' then
  keys = {KEYS[1], KEYS[3]}
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
  local work = over and string.match(id, '^[^:]*:(.+)$')
  if work then
    -- The earlier try's start, if still in the window, spends one start for
    -- both tries: it is the id's now, so that its give-back finds none.
    for _, k in ipairs({KEYS[1], KEYS[2]}) do
      for _, m in ipairs(redis.call('ZREVRANGEBYSCORE', k, '+inf', '(' .. (now - period))) do
        if string.match(m, '^[^:]*:(.+)$') == work then
          redis.call('ZREM', k, m)
          redis.call('ZADD', KEYS[1], now, id)
          redis.call('PEXPIRE', KEYS[1], period)
          if turn ~= '' then
            redis.call('ZREM', KEYS[3], turn)
          end
          return 0
        end
      end
    end
  end
  if turn ~= '' then
    slot = redis.call('ZSCORE', KEYS[3], turn)
    if slot then
      keys = {KEYS[1], KEYS[2]} -- a claimant: bookings are not ahead of it
      slot = tonumber(slot)
    end
  end
end
local all = times(keys)
if #all < n then
  if id ~= '' then
    local k = KEYS[1]
    if reserve then
      k = KEYS[2]
    end
    if slot then
      redis.call('ZREM', KEYS[3], turn)
    end
    redis.call('ZADD', k, now, id)
    redis.call('PEXPIRE', k, period)
  end
  return 0
end
local at = opens(all)
if slot then
  at = math.max(at, slot) -- its booking stays, until its slot at least
elseif turn ~= '' then
  -- A newcomer's turn is booked at the slot it would wait for: the next
  -- turn books a later one, as its own slot counts against it.
  redis.call('ZADD', KEYS[3], at, turn)
  local ttl = redis.call('PTTL', KEYS[3])
  redis.call('PEXPIRE', KEYS[3], math.max(ttl, at - now + known))
end
return math.max(1, at - now)
