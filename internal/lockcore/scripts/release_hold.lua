-- The HoldAtLeast section of a release script (see release.lua): a holder
-- whose token (its start, in us) plus ARGV[9] is later than now stays,
-- no longer renewed, until then; its release is remembered that much longer.
-- KEYS[1] holders: the holder's score set to when it stops being held; the
--         key kept at least until then
-- ARGV[9] HoldAtLeast (ms), "0" for none
-- It replies nothing of its own: a held release returns 1 once it has
-- written its records, without waking anyone.
-- @hold
local hold = tonumber(ARGV[9])
if hold > 0 and math.floor(tonumber(released) / 1000) + hold > now then
  hold_until = math.floor(tonumber(released) / 1000) + hold
  redis.call('ZADD', KEYS[1], hold_until, member)
  if redis.call('PTTL', KEYS[1]) < hold_until - now then
    redis.call('PEXPIRE', KEYS[1], hold_until - now)
  end
  keep = hold_until - now + keep
end
