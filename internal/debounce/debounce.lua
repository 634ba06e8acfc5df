-- Records a request for a key's work as its newest (latest wins). Safe to
-- run twice: a repeat with the same id returns the request the first run
-- recorded, if no other request came in between.
-- KEYS[1] requests: HASH, g = the newest request's generation, i = its id,
--         u = when it is due (ms), f = when the open burst's first request
--         came (ms; absent when no burst is open: Claim closes it), c = the
--         greatest generation claimed (claim.lua)
-- ARGV[1] quiet (ms)
-- ARGV[2] maxWait (ms), "0" for none
-- ARGV[3] the request's id
-- ARGV[4] how long to remember the newest request after it is due (ms)
-- Returns {generation, wait (ms)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
local s = redis.call('HMGET', KEYS[1], 'g', 'i', 'u', 'f')
if s[1] and s[2] == ARGV[3] then
  return {s[1], math.max(tonumber(s[3]) - now, 0)}
end
-- A generation is at least the server time in microseconds, so it keeps
-- growing after the hash expired.
local gen = string.format('%d', math.max(tonumber(s[1] or '0') + 1, nowus))
local first = tonumber(s[4] or '0')
if first == 0 then
  first = now
end
local due = now + tonumber(ARGV[1])
local maxwait = tonumber(ARGV[2])
if maxwait > 0 and first + maxwait < due then
  due = math.max(first + maxwait, now)
end
redis.call('HSET', KEYS[1], 'g', gen, 'i', ARGV[3], 'u', string.format('%d', due), 'f', string.format('%d', first))
redis.call('PEXPIRE', KEYS[1], due - now + tonumber(ARGV[4]))
return {gen, due - now}
