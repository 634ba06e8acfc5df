-- The HoldAtLeast section of a release script (see release.lua, which names
-- the arguments and keys): a holder whose token (its start, in us) plus
-- hold is later than now stays,
-- no longer renewed, until then; its release is remembered that much longer.
-- KEYS[1] holders_key: the holder's score set to when it stops being held; the
--         key kept at least until then
-- ARGV[9] hold: HoldAtLeast (ms), 0 for none
-- It replies nothing of its own: a held release returns 1 once it has
-- written its records, without waking anyone.
-- @hold
if hold > 0 and math.floor(tonumber(released) / 1000) + hold > now then
  hold_until = math.floor(tonumber(released) / 1000) + hold
  redis.call('ZADD', holders_key, hold_until, member)
  if redis.call('PTTL', holders_key) < hold_until - now then
    redis.call('PEXPIRE', holders_key, hold_until - now)
  end
  keep = hold_until - now + keep
end
